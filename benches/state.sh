#!/usr/bin/env bash
# `status`, `check` and `metrics` with many records on disk: N start records and N exit
# records (default 10,000 each) made by copying one real pair under new container ids.
# Pruning would keep a real node far below this; the bench is the worst case of reading
# them all. Needs root (devgate's directories must be root's). Plain loop, mean of RUNS.
#
#   benches/state.sh [path/to/devgate] [N] [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/devgate}
N=${2:-10000}
RUNS=${3:-5}
[ -x "$BIN" ] || cargo build --release --locked

W=$(mktemp -d /tmp/devgate-bench-state.XXXXXX)
trap 'rm -rf "$W"' EXIT
chmod 0755 "$W"
mkdir -p "$W/bundle"
echo '{"linux":{"devices":[{"path":"/dev/zero","type":"c","major":1,"minor":5}]}}' > "$W/bundle/config.json"
echo "{\"state_dir\":\"$W/state\",\"quarantine_dir\":\"$W/q\",\"exits_keep\":$((N * 4))}" > "$W/config.json"
state() { echo "{\"ociVersion\":\"1.0.2\",\"id\":\"$1\",\"status\":\"creating\",\"pid\":1,\"bundle\":\"$W/bundle\"}"; }
dg() { "$BIN" --config "$W/config.json" "$@"; }

# One real admitted start that had a fault during its run: a start and an exit record.
state bench-0 | dg hook prestart >/dev/null
dg cordon 1:5 --reason "bench fault" >/dev/null
state bench-0 | dg hook poststop >/dev/null 2>&1 || true
dg uncordon 1:5 >/dev/null
start="$W/state/containers/bench-0.json"
exit_rec="$W/state/exits/bench-0.json"
[ -f "$start" ] && [ -f "$exit_rec" ] || { echo "no records were written" >&2; exit 1; }
for i in $(seq 1 "$N"); do
    sed "s/bench-0/bench-$i/g" "$start" > "$W/state/containers/bench-$i.json"
    sed "s/bench-0/bench-$i/g" "$exit_rec" > "$W/state/exits/bench-$i.json"
done
chmod 0600 "$W"/state/containers/* "$W"/state/exits/*
echo "$(find "$W/state" -type f | wc -l) files under state_dir"

for cmd in status check metrics; do
    total=0
    for _ in $(seq 1 "$RUNS"); do
        t0=$(date +%s%N)
        if [ "$cmd" = metrics ]; then set -- --textfile "$W/devgate.prom"; else set --; fi
        dg "$cmd" "$@" >/dev/null 2>&1 || true
        t1=$(date +%s%N)
        total=$((total + t1 - t0))
    done
    printf '%-8s %8.1f ms (mean of %d)\n' "$cmd" "$(echo "$total / $RUNS / 1000000" | bc -l)" "$RUNS"
done
