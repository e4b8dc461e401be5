#!/usr/bin/env bash
# Prestart wall time for a container with 8 GPUs on the fake NVML library, side by side:
# - "by the driver's list": the GPUs found by the driver's /proc list, asked about in as
#   many processes as the hook has CPUs, at most one per GPU (the normal path on a GPU node);
# - "enumerated": no /proc list, so NVML enumerates every GPU in one process (the fallback);
# - "excluded": the same 8 devices (same nodes, same node/sysfs/quarantine probes) classed
#   as a non-NVIDIA class through device_classes, so the GPU probes are left out.
# Needs root (mknod). Uses hyperfine when installed, else a plain loop.
#
#   benches/nvml.sh [path/to/devgate] [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/devgate}
RUNS=${2:-200}
[ -x "$BIN" ] || cargo build --release --locked
cargo build --quiet --locked --manifest-path tests/fake-nvml/Cargo.toml --target-dir target/fake-nvml --release
LIB=$PWD/target/fake-nvml/release/libfake_nvml.so

W=$(mktemp -d /tmp/devgate-bench-nvml.XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/dev" "$W/bundle" "$W/noproc"
devices=""
gpus=""
buses=(1b 3b 5e 86 af d8 19 39)
for i in 0 1 2 3 4 5 6 7; do
    mknod "$W/dev/nvidia$i" c 195 "$i"
    devices+="{\"path\":\"/dev/nvidia$i\",\"type\":\"c\",\"major\":195,\"minor\":$i},"
    gpus+="{\"uuid\":\"GPU-0000000$i-1111-2222-3333-444444444444\",\"pci_bus_id\":\"00000000:${buses[$i]^^}:00.0\",\"minor\":$i},"
    # the driver's own list, as nv-procfs.c writes it
    info="$W/proc/driver/nvidia/gpus/0000:${buses[$i]}:00.0"
    mkdir -p "$info"
    printf 'Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-0000000%s-1111-2222-3333-444444444444\nBus Location: \t 0000:%s:00.0\nDevice Minor: \t %s\n' \
        "$i" "${buses[$i]}" "$i" > "$info/information"
done
echo "{\"linux\":{\"devices\":[${devices%,}]}}" > "$W/bundle/config.json"
echo "{\"driver_version\":\"550.54.15\",\"gpus\":[${gpus%,}]}" > "$W/fake.json"
# A kernel log of realistic size with a few NVRM lines, as a file: /dev/kmsg differs per host.
for i in $(seq 1 5000); do echo "6,$i,$((i * 1000)),-;usb 1-1: some kernel chatter line number $i"; done > "$W/kmsg"
echo "4,5001,5001000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception" >> "$W/kmsg"

common="\"dev_root\":\"$W/dev\",\"state_dir\":\"$W/state\",\"quarantine_dir\":\"$W/q\",\"kmsg_path\":\"$W/kmsg\",\"nvml_library\":\"$LIB\""
echo "{$common,\"proc_root\":\"$W/proc\"}" > "$W/with.json"
echo "{$common,\"proc_root\":\"$W/noproc\"}" > "$W/enum.json"
echo "{$common,\"device_classes\":[{\"class\":\"bench-gpu\",\"major\":195,\"minors\":[0,253]}]}" > "$W/without.json"
echo "{\"ociVersion\":\"1.0.2\",\"id\":\"bench\",\"status\":\"creating\",\"pid\":1,\"bundle\":\"$W/bundle\"}" > "$W/state.json"
export FAKE_NVML_CONFIG=$W/fake.json

# Both must allow; a bench of a failing path measures the wrong thing.
for c in with enum without; do
    "$BIN" --config "$W/$c.json" hook prestart < "$W/state.json" || { echo "prestart failed ($c)" >&2; exit 1; }
done

if command -v hyperfine >/dev/null; then
    # The hook reads its state on stdin, so each run goes through sh; hyperfine measures
    # and subtracts the shell's own start-up.
    hyperfine --warmup 20 --runs "$RUNS" --shell=sh \
        -n "8 GPUs, NVML by the driver's list + XID" "$BIN --config $W/with.json hook prestart < $W/state.json" \
        -n "8 GPUs, NVML enumerated + XID" "$BIN --config $W/enum.json hook prestart < $W/state.json" \
        -n "8 GPUs, NVML step excluded" "$BIN --config $W/without.json hook prestart < $W/state.json"
else
    # Interleaved, so that load on a shared machine falls on every variant alike. The clock
    # is bash's EPOCHREALTIME: forking `date` would cost more than what is measured.
    declare -gA total=([with]=0 [enum]=0 [without]=0)
    for _ in $(seq "$RUNS"); do
        for c in with enum without; do
            start=${EPOCHREALTIME/./}
            "$BIN" --config "$W/$c.json" hook prestart < "$W/state.json"
            total[$c]=$(( total[$c] + ${EPOCHREALTIME/./} - start ))
        done
    done
    for c in with enum without; do
        case $c in with) n="NVML by the driver's list + XID";; enum) n="NVML enumerated + XID";; without) n="NVML step excluded";; esac
        echo "8 GPUs, $n: $(( total[$c] / RUNS )) us per prestart (mean of $RUNS)"
    done
    echo "driver's list over excluded: $(( (total[with] - total[without]) / RUNS )) us"
fi

# NVML init (loading the library, nvmlInit), as devgate logs it at debug level: in the
# slowest child, and in all 8 together. The children run side by side on this machine's
# cores, so the wall time init takes is between the first and the second divided by the
# cores: what "NVML init excluded" takes off the per-GPU figure.
cores=$(nproc)
[ "$cores" -le 8 ] || cores=8
slow_sum=0
all_sum=0
for _ in $(seq "$RUNS"); do
    line=$(DEVGATE_LOG=debug "$BIN" --config "$W/with.json" hook prestart < "$W/state.json" 2>&1 | grep 'NVML init' || true)
    us=$(echo "$line" | sed -n 's/.*NVML init \([0-9]*\) us (slowest.*/\1/p')
    all=$(echo "$line" | sed -n 's/.*, \([0-9]*\) us (all children).*/\1/p')
    slow_sum=$(( slow_sum + ${us:-0} ))
    all_sum=$(( all_sum + ${all:-0} ))
done
echo "NVML init: slowest child $(( slow_sum / RUNS )) us, all children $(( all_sum / RUNS )) us (means of $RUNS)"
if [ -n "${total[with]:-}" ]; then
    over=$(( (total[with] - total[without]) / RUNS ))
    echo "driver's list over excluded, NVML init excluded: $(( over - slow_sum / RUNS )) us (slowest child's init off)," \
        "$(( over - all_sum / RUNS / cores )) us (all children's init spread over $cores cores off)"
fi
