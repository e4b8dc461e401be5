#!/bin/sh
# Time added to `runc run` by a remap, on cgroup v1 and cgroup v2 side by side. The same
# container (busybox `true` asking for /dev/zero) is started N rounds; each round starts it
# once in each of six ways, in a random order, so that the machine's noise and any effect
# of what ran before hit all of them alike:
#   v1 / v2   this host's layout (hybrid: runc uses the v1 devices controller) / a true v2
#             node (a private mount namespace with cgroup2 at /sys/fs/cgroup: eBPF programs)
#   none      no devgate hook at all
#   gate      devgate prestart+poststop, /dev/zero healthy (the plain gate)
#   remap     devgate prestart+poststop, /dev/zero cordoned, policy remap, spare /dev/full
# Both nodes are private mount namespaces entered with nsenter, so both carry the same
# nsenter cost. devgate's state_dir is on a tmpfs (/dev/shm), as its default /run/devgate is
# on a node; STATE=disk puts it beside the bundles under /tmp instead, where every atomic
# write pays its fsyncs. Prints the median and p90 wall time of `runc run` for each, and
# remap minus gate per node, also as the median of each round's difference, and the time
# devgate itself logged (elapsed_us of the decision and stop lines), which a busy machine
# disturbs least.
# Usage: [STATE=disk] benches/remap.sh [DEVGATE_BIN] [N]
#   (root; runc, busybox-static, util-linux, coreutils)
set -eu
BIN=$(readlink -f "${1:-target/release/devgate}")
N=${2:-30}
[ -x "$BIN" ] || { echo "no devgate binary at $BIN (make build)" >&2; exit 2; }
command -v runc >/dev/null || { echo "runc is not installed" >&2; exit 2; }
BB=$(command -v busybox)
W=$(mktemp -d /tmp/devgate-bench-remap.XXXXXX)
chmod 755 "$W"
if [ "${STATE:-tmpfs}" = disk ]; then
  S=$W/state
  mkdir "$S"
else
  S=$(mktemp -d /dev/shm/devgate-bench-remap.XXXXXX)
  chmod 755 "$S"
fi
NS1= NS2=
cleanup() {
  [ -n "$NS1" ] && kill "$NS1" 2>/dev/null
  [ -n "$NS2" ] && kill "$NS2" 2>/dev/null
  rm -rf "$W" "$S"
}
trap cleanup EXIT

# The two nodes: a namespace holder each, waited for through a fifo of its own.
mkfifo "$W/ready1" "$W/ready2"
unshare --mount --propagation private sh -c 'echo ready >"$0"; exec sleep 100000' "$W/ready1" &
NS1=$!
unshare --mount --propagation private sh -c \
  'if mount -t cgroup2 none /sys/fs/cgroup; then echo ready; else echo failed; fi >"$0"
   exec sleep 100000' "$W/ready2" &
NS2=$!
r1= r2=
read -r r1 <"$W/ready1" || true
read -r r2 <"$W/ready2" || true
[ "$r1 $r2" = "ready ready" ] || { echo "the namespaces did not come up" >&2; exit 1; }
[ "$(nsenter -t "$NS2" -m stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ] ||
  { echo "the v2 node has no cgroup2 at /sys/fs/cgroup" >&2; exit 1; }

config() { # $1: name -> a devgate config with its own state and quarantine
  mkdir -p "$W/$1"
  cat >"$W/$1/config.json" <<JSON
{"state_dir": "$S/$1", "quarantine_dir": "$W/$1/quarantine", "log_file": "$S/$1/decisions.jsonl",
 "policy": {"classes": {"char": "remap"}}, "spares": {"char": ["/dev/full"]}}
JSON
}

bundle() { # $1: label, $2: config name or "" for no hooks
  b="$W/b-$1"
  mkdir -p "$b/rootfs/bin" "$b/rootfs/dev" "$b/rootfs/proc"
  cp "$BB" "$b/rootfs/bin/busybox"
  ln -s busybox "$b/rootfs/bin/true"
  hooks='{}'
  if [ -n "$2" ]; then
    c="$W/$2/config.json"
    hooks="{\"prestart\":[{\"path\":\"$BIN\",\"args\":[\"devgate\",\"--config\",\"$c\",\"hook\",\"prestart\"]}],
            \"poststop\":[{\"path\":\"$BIN\",\"args\":[\"devgate\",\"--config\",\"$c\",\"hook\",\"poststop\"]}]}"
  fi
  cat >"$b/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["true"],"env":["PATH=/bin"],"cwd":"/"},
 "root":{"path":"rootfs"},
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},
           {"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","mode=755"]}],
 "hooks":$hooks,
 "linux":{"devices":[{"path":"/dev/zero","type":"c","major":1,"minor":5,"fileMode":438,"uid":0,"gid":0}],
          "resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":1,"minor":5,"access":"rwm"}]},
          "namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"}]}}
JSON
}

for node in v1 v2; do
  config "gate-$node"
  config "remap-$node"
  "$BIN" --config "$W/remap-$node/config.json" cordon /dev/zero --reason bench >/dev/null
  bundle "none-$node" ""
  bundle "gate-$node" "gate-$node"
  bundle "remap-$node" "remap-$node"
done

now() { date +%s%N; }

start() { # $1: label, $2: round
  case $1 in *-v1) ns=$NS1 ;; *) ns=$NS2 ;; esac
  t0=$(now)
  nsenter -t "$ns" -m runc --root "$W/runc" run --bundle "$W/b-$1" "bench-$1-$2" >/dev/null 2>"$W/err" ||
    { echo "runc run failed ($1):" >&2; cat "$W/err" >&2; exit 1; }
  t1=$(now)
  echo $(( (t1 - t0) / 1000 )) >>"$W/$1.times"
}

LABELS="none-v1 gate-v1 remap-v1 none-v2 gate-v2 remap-v2"
for l in $LABELS; do : >"$W/$l.times"; done
start none-v1 warmup; start none-v2 warmup
i=0
while [ $i -lt "$N" ]; do
  for l in $(printf '%s\n' $LABELS | shuf); do start "$l" "$i"; done
  i=$((i + 1))
done

for node in v1 v2; do
  ls "$S/remap-$node/leases"/*.json >/dev/null 2>&1 &&
    { echo "a lease was left behind ($node)" >&2; exit 1; }
  grep -q "\"cgroup\": \"cgroup $node " "$S/remap-$node/containers/bench-remap-$node-0.json" ||
    { echo "the remap runs did not remap on cgroup $node" >&2; exit 1; }
done

stats() { # $1: label -> "median p90" in microseconds
  sort -n "$W/$1.times" | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.9+0.5)]; print m, p}'
}

inproc() { # $1: config name, $2: stage -> median elapsed_us devgate logged for that stage
  grep "\"stage\":\"$2\"" "$S/$1/decisions.jsonl" | sed 's/.*"elapsed_us":\([0-9]*\).*/\1/' |
    sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

paired() { # $1, $2: labels -> the median of the per-round differences $1 - $2
  paste -d ' ' "$W/$1.times" "$W/$2.times" | awk '{print $1 - $2}' | sort -n |
    awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

printf 'runc run, %s rounds, state_dir on %s (microseconds; %s)\n' "$N" "${STATE:-tmpfs}" \
  "$(runc --version | head -1)"
for node in v1 v2; do
  set -- $(stats "none-$node"); none_m=$1 none_p=$2
  set -- $(stats "gate-$node"); gate_m=$1 gate_p=$2
  set -- $(stats "remap-$node"); remap_m=$1 remap_p=$2
  printf '  %s  none  median %8s  p90 %8s\n' "$node" "$none_m" "$none_p"
  printf '  %s  gate  median %8s  p90 %8s\n' "$node" "$gate_m" "$gate_p"
  printf '  %s  remap median %8s  p90 %8s\n' "$node" "$remap_m" "$remap_p"
  printf '  %s  remap adds %s us over the plain gate (difference of medians; median of the\n' \
    "$node" $((remap_m - gate_m))
  printf '      per-round differences %s us), %s us over no hook\n' \
    "$(paired "remap-$node" "gate-$node")" $((remap_m - none_m))
  printf '      inside devgate (median elapsed_us logged): prestart gate %s remap %s, poststop gate %s remap %s\n' \
    "$(inproc "gate-$node" prestart)" "$(inproc "remap-$node" prestart)" \
    "$(inproc "gate-$node" poststop)" "$(inproc "remap-$node" poststop)"
done
