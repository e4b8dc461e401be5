#!/bin/bash
# The performance gate of issue 9, measured side by side in one run. Every case is run N
# times, as N pairs (devgate, /bin/true) interleaved in one random order (so drift and
# neighbours' load hit every case alike), with devgate's state_dir, quarantine and log_file
# on tmpfs (/run, as on a node). Cases:
#   runc8-gate / runc8-true   `runc run` of busybox `true` with 8 devices, devgate
#                             prestart+poststop hooks vs /bin/true hooks
#   runc0-gate / runc0-true   the same with no devices
#   pre8-gate / pre8-true     the prestart hook alone, 8 devices, vs /bin/true, same stdin
# Each ratio is 1 + the median of the pairs' differences over the median /bin/true time,
# with a 95% confidence interval. Then 100 prestarts (8 devices) started at once, for
# p99/p50 on this machine's cores.
# Wall clock on a shared machine is noisy; the instruction counts (callgrind) printed beside
# each ratio are the stable measure.
# Hook lifetimes: while the interleaved runs go, `perf record` takes the kernel's sched
# fork/exec/exit and signal events; each `runc run`'s hooks are the processes its runc
# forks that exec the hook program, and a hook's lifetime (its fork by runc -> the SIGCHLD
# its exit sends runc) is what it adds to `runc run`, as runc waits for each hook
# (benches/hook-trace.awk). Per runc case: the medians of the runs' hook time (both hooks),
# prestart, poststop and the hooks' teardown (exit -> SIGCHLD); per pair of cases, 1 + the
# median paired difference of hook time (devgate minus /bin/true, same pair) over the
# median traced `runc run` of the /bin/true case, with a 95% interval: far narrower than
# the whole-run ratio, which runc's own jitter swamps. Skipped, with a line saying why,
# where perf is missing or cannot record the tracepoints.
# HOOK_BIN=PATH (default: DEVGATE_BIN): the program the devgate cases run as their hook
# (bundles' prestart/poststop, the standalone and concurrent prestarts, the instruction
# counts), called as `PATH --config CFG hook prestart|poststop`, e.g. a devgate-hook front.
# Usage: [HOOK_BIN=PATH] benches/gate.sh [DEVGATE_BIN] [N]
#        (root; runc, busybox-static, valgrind; perf for the hook lifetimes)
set -eu
. "$(dirname "$0")/median-ci.sh"
BIN=$(readlink -f "${1:-target/release/devgate}")
N=${2:-80}
[ -x "$BIN" ] || { echo "no devgate binary at $BIN (make build)" >&2; exit 2; }
HOOK=$(readlink -f "${HOOK_BIN:-$BIN}")
[ -x "$HOOK" ] || { echo "no hook program at ${HOOK_BIN:-}" >&2; exit 2; }
for c in runc busybox shuf valgrind; do
  command -v $c >/dev/null || { echo "$c is not installed" >&2; exit 2; }
done
TRUE=/bin/true
# state_dir on tmpfs as on a node: /run where it is one, else /dev/shm. On another
# filesystem record pruning lists the directory on every call (the count of a tmpfs
# directory comes from its size), which would measure a node devgate is not made for.
BASE=/run
[ "$(stat -f -c %T /run)" = tmpfs ] || BASE=/dev/shm
[ "$(stat -f -c %T "$BASE")" = tmpfs ] || { echo "neither /run nor /dev/shm is a tmpfs" >&2; exit 2; }
W=$(mktemp -d "$BASE/devgate-bench-gate.XXXXXX")
chmod 755 "$W"
PERF_PID=
stop_trace() { # stops a running perf record and waits for it to write perf.data
  [ -n "$PERF_PID" ] || return 0
  kill -INT "$PERF_PID" 2>/dev/null || true
  wait "$PERF_PID" 2>/dev/null || true
  PERF_PID=
}
trap 'stop_trace; rm -rf "$W"' EXIT

mkdir -p "$W/rootfs/bin" "$W/rootfs/dev" "$W/rootfs/proc"
cp "$(command -v busybox)" "$W/rootfs/bin/busybox"
ln -s busybox "$W/rootfs/bin/true"
cat >"$W/config.json" <<JSON
{"state_dir": "$W/state", "quarantine_dir": "$W/quarantine", "log_file": "$W/devgate.log"}
JSON

DEVS8='/dev/null c 1 3
/dev/zero c 1 5
/dev/full c 1 7
/dev/random c 1 8
/dev/urandom c 1 9
/dev/tty c 5 0
/dev/ptmx c 5 2
/dev/kmsg c 1 11'

ARG0=$(basename "$HOOK")
bundle() { # $1: name, $2: 8 or 0 devices, $3: hook binary (devgate or true)
  local b="$W/$1" devs="" rules='{"allow":false,"access":"rwm"}' hooks
  mkdir -p "$b"
  if [ "$2" = 8 ]; then
    while read -r p t ma mi; do
      devs="$devs${devs:+,}{\"path\":\"$p\",\"type\":\"$t\",\"major\":$ma,\"minor\":$mi,\"fileMode\":438,\"uid\":0,\"gid\":0}"
      rules="$rules,{\"allow\":true,\"type\":\"$t\",\"major\":$ma,\"minor\":$mi,\"access\":\"rwm\"}"
    done <<<"$DEVS8"
  fi
  if [ "$3" = devgate ]; then
    hooks="{\"prestart\":[{\"path\":\"$HOOK\",\"args\":[\"$ARG0\",\"--config\",\"$W/config.json\",\"hook\",\"prestart\"]}],
            \"poststop\":[{\"path\":\"$HOOK\",\"args\":[\"$ARG0\",\"--config\",\"$W/config.json\",\"hook\",\"poststop\"]}]}"
  else
    hooks="{\"prestart\":[{\"path\":\"$TRUE\",\"args\":[\"true\"]}],\"poststop\":[{\"path\":\"$TRUE\",\"args\":[\"true\"]}]}"
  fi
  cat >"$b/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["true"],"env":["PATH=/bin"],"cwd":"/"},
 "root":{"path":"$W/rootfs"},
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},
           {"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","mode=755"]}],
 "hooks":$hooks,
 "linux":{"devices":[$devs],"resources":{"devices":[$rules]},
          "namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"}]}}
JSON
}
bundle runc8-gate 8 devgate
bundle runc8-true 8 true
bundle runc0-gate 0 devgate
bundle runc0-true 0 true
# The standalone prestart reads the state runc would give it; the bundle is the 8-device one.
printf '{"ociVersion":"1.0.2","id":"bench-pre","status":"creating","pid":%s,"bundle":"%s"}' \
  $$ "$W/runc8-gate" >"$W/state.json"

run_case() { # $1: case
  case $1 in
    runc*) runc --root "$W/runc" run --bundle "$W/$1" "b-$1-$RANDOM$RANDOM" </dev/null >/dev/null 2>"$W/err" ;;
    pre8-gate) "$HOOK" --config "$W/config.json" hook prestart <"$W/state.json" 2>"$W/err" ;;
    pre8-true) "$TRUE" <"$W/state.json" ;;
  esac || { echo "$1 failed:" >&2; cat "$W/err" >&2; exit 1; }
}

CASES="runc8-gate runc8-true runc0-gate runc0-true pre8-gate pre8-true"
PAIRS="runc8 runc0 pre8"
for c in $CASES; do run_case "$c"; : >"$W/$c.times"; done # warm caches, check each works
for p in $PAIRS; do : >"$W/$p.diffs"; done
# Runs go in pairs, devgate and /bin/true back to back in a random order of the two, the
# pairs themselves in a random order: a pair sees one moment of the machine, so the
# difference within it is far steadier than either time (`runc run` alone varies by
# +-30% here). The ratio is 1 + median difference / median /bin/true time.
for p in $PAIRS; do for _ in $(seq "$N"); do echo "$p"; done; done | shuf >"$W/order"
timed() { # $1: case; appends its time, prints it
  local t0 t1
  t0=$EPOCHREALTIME
  run_case "$1"
  t1=$EPOCHREALTIME
  echo $(( ${t1/./} - ${t0/./} )) | tee -a "$W/$1.times"
}

# The kernel's sched and signal events over the same runs, for the hook lifetimes
# (hook-trace.awk). perf starts with its events off and answers "ack" on its control FIFO
# once they are on, so the first run is recorded; it runs until stop_trace's SIGINT (perf
# sets its own handler, so the SIGINT bash ignores in background jobs does not stop it).
# Prints why where it cannot. Run in this shell, not in $(...), which would wait for perf
# to close its output.
EVENTS=sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit,signal:signal_generate
start_trace() {
  local ack="" i why
  command -v perf >/dev/null || { echo "perf is not installed"; return 1; }
  mkfifo "$W/perf.ctl" "$W/perf.ack"
  perf record -q -B -N -D -1 --control "fifo:$W/perf.ctl,$W/perf.ack" -e "$EVENTS" -a \
    -o "$W/perf.data" >/dev/null 2>"$W/perf.err" &
  PERF_PID=$!
  exec 7<>"$W/perf.ctl" 8<>"$W/perf.ack" # read-write: opening never blocks on a FIFO
  echo enable >&7
  for i in $(seq 30); do
    read -r -t 1 -u 8 ack && break
    kill -0 "$PERF_PID" 2>/dev/null || break
  done
  exec 7>&- 8<&- # the runs (and their hooks) do not inherit them
  [ "$ack" = ack ] && return 0
  stop_trace
  # perf's reason is on its "Error:" line where it has one (e.g. no permission on tracefs)
  why=$(sed -n 's/^Error:[[:space:]]*//p' "$W/perf.err" | grep -m1 .) ||
    why=$(grep -m1 . "$W/perf.err") || why="no answer from perf in 30 s"
  echo "perf cannot record the sched and signal tracepoints: $why"
  return 1
}
start_trace >"$W/trace.skip" || true
: >"$W/runc.seq" # "PAIR CASE" of each runc run, in the order they run
k=0
while read -r -u 3 p; do
  k=$((k + 1))
  if [ $((RANDOM % 2)) = 0 ]; then g=$(timed "$p-gate"); t=$(timed "$p-true"); two="gate true"
  else t=$(timed "$p-true"); g=$(timed "$p-gate"); two="true gate"; fi
  echo $((g - t)) >>"$W/$p.diffs"
  case $p in runc*) for s in $two; do echo "$k $p-$s"; done >>"$W/runc.seq" ;; esac
done 3<"$W/order"
stop_trace

# median, then the spread as p10..p90, in microseconds
stats() { sort -n "$W/$1.times" | awk '{a[NR]=$1} END {
  printf "%d %d %d", a[int((NR+1)/2)], a[int(NR*0.1+0.5)], a[int(NR*0.9+0.5)]}'; }
# instructions of one process (and none of its children), counted by callgrind
insns() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 <"$W/state.json" |
  sed -n 's/.*Collected : //p'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
# "RATIO [LO, HI]": 1 + the median paired difference over the median /bin/true time, with
# the median difference's 95% confidence interval (median_ci).
pair_ratio() { # $1: pair
  local t; t=$(stats "$1-true" | cut -d' ' -f1)
  set -- $(median_ci "$W/$1.diffs")
  awk -v t="$t" -v m="$1" -v l="$2" -v h="$3" 'BEGIN {
    printf "%.3f [%.3f, %.3f] (median difference %d us)", 1+m/t, 1+l/t, 1+h/t, m}'
}

POST="$W/post.json"
printf '{"ociVersion":"1.0.2","id":"bench-pre","status":"stopped","bundle":"%s"}' "$W/runc8-gate" >"$POST"
i_pre=$(insns "$HOOK" --config "$W/config.json" hook prestart)
i_post=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$HOOK" --config "$W/config.json" \
  hook poststop <"$POST" 2>&1 | sed -n 's/.*Collected : //p')
i_true=$(insns "$TRUE")

echo "devgate gate bench: $N runs of each case, interleaved in random order; times in us"
echo "state_dir, quarantine and log on tmpfs ($W); machine: $(nproc) cores"
[ "$HOOK" = "$BIN" ] || echo "hooks of the devgate cases run $HOOK (HOOK_BIN)"
printf '%-11s %8s %8s %8s\n' case median p10 p90
for c in $CASES; do set -- $(stats "$c"); printf '%-11s %8s %8s %8s\n' "$c" "$1" "$2" "$3"; done
med() { stats "$1" | cut -d' ' -f1; }
echo
printf 'runc run, 8 devices, devgate/true hooks: %s (goal <= 1.03)\n' "$(pair_ratio runc8)"
printf '  hooks: prestart %s + poststop %s instructions vs 2 x %s\n' "$i_pre" "$i_post" "$i_true"
printf 'runc run, no devices, devgate/true hooks: %s (goal <= 1.02)\n' "$(pair_ratio runc0)"
printf 'prestart alone, 8 devices, devgate/true:  %s (goal <= 2)\n' "$(pair_ratio pre8)"
printf '  instructions %s vs %s (%s)\n' "$i_pre" "$i_true" "$(ratio "$i_pre" "$i_true")"
printf '  (ratios of the medians, less steady: runc8 %s, runc0 %s, pre8 %s)\n' \
  "$(ratio "$(med runc8-gate)" "$(med runc8-true)")" "$(ratio "$(med runc0-gate)" "$(med runc0-true)")" \
  "$(ratio "$(med pre8-gate)" "$(med pre8-true)")"

# Hook lifetimes from the trace of the same runs (see the header): per runc case the
# medians in us, then per pair of cases the ratio from the paired hook-time differences.
col_median() { cut -d' ' -f"$2" "$1" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# "RATIO [LO, HI] (...)" as pair_ratio, of the hook time devgate adds over the traced
# `runc run` with /bin/true hooks
hook_ratio() { # $1: pair
  local t; t=$(col_median "$W/$1-true.hooks" 1)
  set -- $(median_ci "$W/$1.hdiffs")
  awk -v t="$t" -v m="$1" -v l="$2" -v h="$3" 'BEGIN {
    printf "%.4f [%.4f, %.4f] (median hook-time difference %d us [%d, %d])", 1+m/t, 1+l/t, 1+h/t, m, l, h}'
}
hook_lifetimes() {
  local c p f
  [ -s "$W/trace.skip" ] && { echo "hook lifetimes: skipped, $(cat "$W/trace.skip")"; return; }
  perf script -i "$W/perf.data" -F comm,pid,tid,time,event,trace 2>/dev/null |
    awk -v root=$$ -v runc="$(command -v runc)" -v hook="$HOOK" -v truebin="$TRUE" \
      -f "$(dirname "$0")/hook-trace.awk" "$W/runc.seq" - >"$W/hooks.runs"
  if grep -q '^error:' "$W/hooks.runs"; then
    echo "hook lifetimes: skipped, the trace does not match the runs: $(sed -n 's/^error: //p' "$W/hooks.runs")"
    return
  fi
  echo "hook lifetimes inside runc, from a trace of the same runs (fork by runc -> SIGCHLD to runc); medians in us"
  echo "(hooks: both per run; teardown: both hooks' exit -> SIGCHLD, inside their lifetimes)"
  printf '%-11s %5s %8s %8s %8s %8s %8s\n' case runs "runc run" hooks prestart poststop teardown
  for c in runc8-gate runc8-true runc0-gate runc0-true; do
    awk -v c="$c" '$2 == c {print $3, $4 + $5, $4, $5, $6}' "$W/hooks.runs" >"$W/$c.hooks"
    printf '%-11s %5s' "$c" "$(wc -l <"$W/$c.hooks")"
    for f in 1 2 3 4 5; do printf ' %8s' "$(col_median "$W/$c.hooks" $f)"; done
    echo
  done
  for p in runc8 runc0; do # devgate minus /bin/true hook time within each pair
    awk -v g="$p-gate" -v t="$p-true" '$2 == g {h[$1] += $4 + $5} $2 == t {h[$1] -= $4 + $5} END {
      for (k in h) print h[k]}' "$W/hooks.runs" >"$W/$p.hdiffs"
  done
  printf 'runc run, 8 devices, by hook time:  %s (goal <= 1.03)\n' "$(hook_ratio runc8)"
  printf 'runc run, no devices, by hook time: %s (goal <= 1.02)\n' "$(hook_ratio runc0)"
}
echo
hook_lifetimes

# 100 prestarts at once: each one's own wall time. Every subshell first waits on a FIFO
# that opens only once all 100 exist, so they start together rather than as fast as bash
# can fork them (which is what an earlier version of this measured).
: >"$W/conc.times"
for i in $(seq 100); do
  sed "s/bench-pre/bench-c$i/" "$W/state.json" >"$W/state-$i.json"
done
mkfifo "$W/go"
for i in $(seq 100); do
  (: <"$W/go"
   t0=$EPOCHREALTIME
   "$HOOK" --config "$W/config.json" hook prestart <"$W/state-$i.json" 2>/dev/null
   t1=$EPOCHREALTIME
   echo $(( (${t1/./} - ${t0/./}) )) >>"$W/conc.times") &
done
sleep 1 # by now every subshell waits in open(2) on the FIFO
exec 4>"$W/go"
exec 4>&-
wait
sort -n "$W/conc.times" | awk -v cores="$(nproc)" '{a[NR]=$1} END {
  p50=a[int((NR+1)/2)]; p99=a[int(NR*0.99+0.5)];
  printf "100 concurrent prestarts on %d cores: p50 %d us, p99 %d us, p99/p50 %.2f (goal <= 3)\n",
    cores, p50, p99, p99/p50}'
