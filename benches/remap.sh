#!/bin/sh
# Time added to `runc run` by a remap: the same container (busybox `true` asking for
# /dev/zero) started N times in each of three ways:
#   none   no devgate hook at all
#   gate   devgate prestart+poststop, /dev/zero healthy (the plain gate)
#   remap  devgate prestart+poststop, /dev/zero cordoned, policy remap, spare /dev/full
# Prints the median and p90 wall time of `runc run` for each, and remap minus gate.
# Usage: benches/remap.sh [DEVGATE_BIN] [N]   (root; runc and busybox-static installed)
set -eu
BIN=$(readlink -f "${1:-target/release/devgate}")
N=${2:-30}
[ -x "$BIN" ] || { echo "no devgate binary at $BIN (make build)" >&2; exit 2; }
command -v runc >/dev/null || { echo "runc is not installed" >&2; exit 2; }
BB=$(command -v busybox)
W=$(mktemp -d /tmp/devgate-bench-remap.XXXXXX)
chmod 755 "$W"
trap 'rm -rf "$W"' EXIT

mkdir -p "$W/b/rootfs/bin" "$W/b/rootfs/dev" "$W/b/rootfs/proc"
cp "$BB" "$W/b/rootfs/bin/busybox"
ln -s busybox "$W/b/rootfs/bin/true"

cat >"$W/config.json" <<JSON
{"state_dir": "$W/state", "quarantine_dir": "$W/quarantine",
 "policy": {"classes": {"char": "remap"}}, "spares": {"char": ["/dev/full"]}}
JSON

spec() { # $1: with hooks (1/0)
  hooks='{}'
  if [ "$1" = 1 ]; then
    hooks="{\"prestart\":[{\"path\":\"$BIN\",\"args\":[\"devgate\",\"--config\",\"$W/config.json\",\"hook\",\"prestart\"]}],
            \"poststop\":[{\"path\":\"$BIN\",\"args\":[\"devgate\",\"--config\",\"$W/config.json\",\"hook\",\"poststop\"]}]}"
  fi
  cat >"$W/b/config.json" <<JSON
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

now() { date +%s%N; }

run_n() { # $1: label
  : >"$W/$1.times"
  i=0
  while [ $i -lt "$N" ]; do
    t0=$(now)
    runc --root "$W/runc" run --bundle "$W/b" "bench-$1-$i" >/dev/null 2>"$W/err" ||
      { echo "runc run failed ($1):" >&2; cat "$W/err" >&2; exit 1; }
    t1=$(now)
    echo $(( (t1 - t0) / 1000 )) >>"$W/$1.times"
    i=$((i + 1))
  done
}

stats() { # $1: label -> "median p90" in microseconds
  sort -n "$W/$1.times" | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.9+0.5)]; print m, p}'
}

spec 0; run_n none
spec 1; run_n gate
"$BIN" --config "$W/config.json" cordon /dev/zero --reason bench >/dev/null
run_n remap
ls "$W/state/leases"/*.json >/dev/null 2>&1 && { echo "a lease was left behind" >&2; exit 1; }
grep -c '"action":"remap"' "$W/state/containers/bench-remap-0.json" >/dev/null ||
  { echo "the remap runs did not remap" >&2; exit 1; }

set -- $(stats none); none_m=$1 none_p=$2
set -- $(stats gate); gate_m=$1 gate_p=$2
set -- $(stats remap); remap_m=$1 remap_p=$2
printf 'runc run, %s starts each (microseconds)\n' "$N"
printf '  %-6s median %8s  p90 %8s\n' none "$none_m" "$none_p" gate "$gate_m" "$gate_p" remap "$remap_m" "$remap_p"
printf '  remap adds %s us over the plain gate (median), %s us over no hook\n' \
  $((remap_m - gate_m)) $((remap_m - none_m))
