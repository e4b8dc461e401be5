#!/bin/sh
# Time the runtime wrapper adds to `runc run`: the same busybox container with no devices
# started N times straight through runc and N times through devgate-runtime (the program
# beside devgate, runtime.path runc), the two interleaved so that both see the same machine.
# A third row starts a container with one healthy device through the wrapper (the gate
# runs in the wrapper), for reference.
# A fourth starts it through a C program that only execs runc: the floor of any wrapper,
# and the wrapper is set against it pair by pair too.
# Prints the median and p90 wall time of each, and the median of the paired differences
# wrapper minus runc (target: <= 1 ms). `runc run` varies by milliseconds on a busy
# machine, so the script also times the wrapper alone: M `create` calls of the no-device
# bundle with runtime.path /bin/true against M calls of /bin/true itself, in one loop each.
# Usage: benches/wrapper.sh [DEVGATE_BIN] [N]   (root; runc and busybox-static installed)
set -eu
. "$(dirname "$0")/median-ci.sh"
BIN=$(readlink -f "${1:-target/release/devgate}")
N=${2:-100}
M=${3:-500}
[ -x "$BIN" ] || { echo "no devgate binary at $BIN (make build)" >&2; exit 2; }
command -v runc >/dev/null || { echo "runc is not installed" >&2; exit 2; }
BB=$(command -v busybox)
# state_dir on a tmpfs, as /run is on a node (here /run may not be one)
BASE=/run
[ "$(stat -f -c %T /run)" = tmpfs ] || BASE=/dev/shm
W=$(mktemp -d "$BASE/devgate-bench-wrapper.XXXXXX")
chmod 755 "$W"
trap 'rm -rf "$W"' EXIT

# The wrapper as the packages install it: the devgate-runtime program beside devgate
# (statically linked; a create with devices is handed to devgate).
RT="$(dirname "$BIN")/devgate-runtime"
[ -x "$RT" ] || { echo "no devgate-runtime beside $BIN (make build)" >&2; exit 2; }
ln -s "$RT" "$W/devgate-runtime"
cat >"$W/config.json" <<JSON
{"state_dir": "$W/state", "quarantine_dir": "$W/quarantine", "runtime": {"path": "runc"}}
JSON
cat >"$W/true.json" <<JSON
{"state_dir": "$W/state", "quarantine_dir": "$W/quarantine", "runtime": {"path": "/bin/true"}}
JSON
export DEVGATE_CONFIG="$W/config.json"

bundle() { # $1: name, $2: linux.devices, $3: device rules after deny-all
  mkdir -p "$W/$1/rootfs/bin" "$W/$1/rootfs/dev" "$W/$1/rootfs/proc"
  cp "$BB" "$W/$1/rootfs/bin/busybox"
  ln -s busybox "$W/$1/rootfs/bin/true"
  cat >"$W/$1/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["true"],"env":["PATH=/bin"],"cwd":"/"},
 "root":{"path":"rootfs"},
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},
           {"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","mode=755"]}],
 "linux":{"devices":[$2],
          "resources":{"devices":[{"allow":false,"access":"rwm"}$3]},
          "namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"}]}}
JSON
}
bundle plain "" ""
bundle device '{"path":"/dev/zero","type":"c","major":1,"minor":5,"fileMode":438,"uid":0,"gid":0}' \
  ',{"allow":true,"type":"c","major":1,"minor":5,"access":"rwm"}'

# The floor of any wrapper in front of runc: a C program that only execs it, as a fourth
# case in the same rounds, so that what the wrapper adds can be set against what any
# exec-ing wrapper adds on this machine.
RUNC=$(command -v runc)
FLOOR_RUNC=
if printf '#include <unistd.h>\nint main(int c, char **v) { (void)c; execv("%s", v); return 127; }\n' "$RUNC" |
  cc -O2 -x c -o "$W/exec-runc" - 2>/dev/null; then
  FLOOR_RUNC="$W/exec-runc"
fi
now() { date +%s%N; }

once() { # $1: label, $2: runtime, $3: bundle, $4: run number
  t0=$(now)
  "$2" --root "$W/runc" run --bundle "$W/$3" "bench-$1-$4" >/dev/null 2>"$W/err" ||
    { echo "$2 run failed ($1):" >&2; cat "$W/err" >&2; exit 1; }
  t1=$(now)
  echo $(( (t1 - t0) / 1000 )) >>"$W/$1.times"
}

stats() { # $1: label -> "median p90" in microseconds
  sort -n "$W/$1.times" | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.9+0.5)]; print m, p}'
}

: >"$W/runc.times"; : >"$W/wrapper.times"; : >"$W/gated.times"; : >"$W/floor.times"
cases='runc\nwrapper\ngated\n'
[ -z "$FLOOR_RUNC" ] || cases="${cases}floor\n"
i=0
# Each round runs the three in a random order: in a fixed order the second and third
# start while the kernel is still tearing down the first's container, and the difference
# measured that as much as the wrapper.
while [ $i -lt "$N" ]; do
  for c in $(printf "$cases" | shuf); do
    case $c in
      runc) once runc runc plain $i ;;
      wrapper) once wrapper "$W/devgate-runtime" plain $i ;;
      gated) once gated "$W/devgate-runtime" device $i ;;
      floor) once floor "$FLOOR_RUNC" plain $i ;;
    esac
  done
  i=$((i + 1))
done
# the last run's record: records are pruned to a bound, so the first may be gone after many
[ -e "$W/state/containers/bench-gated-$((N - 1)).json" ] ||
  { echo "the wrapper did not gate the device container" >&2; exit 1; }
[ ! -e "$W/state/containers/bench-wrapper-0.json" ] ||
  { echo "the wrapper recorded a container with no devices" >&2; exit 1; }

paste -d' ' "$W/wrapper.times" "$W/runc.times" | awk '{print $1 - $2}' >"$W/diff.times"

loop() { # $1: program; M calls as the shim would make them, mean microseconds per call
  t0=$(now)
  i=0
  while [ $i -lt "$M" ]; do
    "$1" --root "$W/runc" --log "$W/log.json" --log-format json create --bundle "$W/plain" x
    i=$((i + 1))
  done
  t1=$(now)
  echo $(( (t1 - t0) / 1000 / M ))
}
true_us=$(loop /bin/true)
alone_us=$(DEVGATE_CONFIG="$W/true.json" loop "$W/devgate-runtime")
# The floor of any wrapper that execs the runtime: a C program that does nothing else.
floor_us=
if printf '#include <unistd.h>\nint main(int c, char **v) { (void)c; execv("/bin/true", v); return 127; }\n' |
  cc -O2 -x c -o "$W/exec-true" - 2>/dev/null; then
  floor_us=$(loop "$W/exec-true")
fi

set -- $(stats runc); runc_m=$1 runc_p=$2
set -- $(stats wrapper); wr_m=$1 wr_p=$2
set -- $(stats gated); g_m=$1 g_p=$2
printf 'runc run, %s starts each, interleaved (microseconds)\n' "$N"
printf '  %-28s median %8s  p90 %8s\n' "runc, no devices" "$runc_m" "$runc_p" \
  "devgate-runtime, no devices" "$wr_m" "$wr_p" \
  "devgate-runtime, 1 device" "$g_m" "$g_p"
# the median paired difference and its 95% confidence interval
set -- $(median_ci "$W/diff.times"); d=$1 lo=$2 hi=$3; ci="$lo..$hi"
# met only when the whole interval is within the target; over when all of it is above
if [ "$hi" -le 1000 ]; then verdict=ok; elif [ "$lo" -gt 1000 ]; then verdict=OVER
else verdict="undecided: the interval spans the target, more runs or a quieter machine"; fi
printf '  the wrapper adds %s us [95%%: %s] (median of the paired differences) to a container with no devices (target <= 1000 us: %s)\n' \
  "$d" "$ci" "$verdict"
if [ -n "$FLOOR_RUNC" ]; then
  paste -d' ' "$W/floor.times" "$W/runc.times" | awk '{print $1 - $2}' >"$W/floor-diff.times"
  paste -d' ' "$W/wrapper.times" "$W/floor.times" | awk '{print $1 - $2}' >"$W/over-floor.times"
  set -- $(median_ci "$W/floor-diff.times")
  printf '  a C program that only execs runc adds %s us [95%%: %s..%s] (the floor of any wrapper)\n' "$1" "$2" "$3"
  set -- $(median_ci "$W/over-floor.times")
  printf '  devgate-runtime adds %s us [95%%: %s..%s] over that floor\n' "$1" "$2" "$3"
fi
printf 'the wrapper alone, %s create calls each (mean microseconds per call)\n' "$M"
printf '  %-28s %8s\n' "/bin/true" "$true_us" "devgate-runtime -> /bin/true" "$alone_us"
printf '  the wrapper itself costs %s us per create of a container with no devices\n' \
  $((alone_us - true_us))
if [ -n "$floor_us" ]; then
  printf '  %-28s %8s\n' "C exec of /bin/true (floor)" "$floor_us"
  printf '  any exec-ing wrapper costs %s us here; devgate-runtime costs %s us more than that\n' \
    $((floor_us - true_us)) $((alone_us - floor_us))
fi
