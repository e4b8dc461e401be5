#!/usr/bin/env bash
# Prestart wall time for a container with 8 GPUs on the fake NVML library, with and without
# the pcie probe's work: "with" points sysfs_root at a tree where each GPU is an NVIDIA PCI
# function under a root port, both with link widths and the three AER files, so the probe
# reads the widths and AER counters of 16 functions and the stored baselines and the gate
# moves them; "without" points sysfs_root at an empty tree, where the same probe finds no
# function. Same devices, same NVML and XID work. Needs root (mknod). Uses hyperfine when
# installed, else a plain loop. Beside the wall clock it prints, where valgrind and strace
# are installed, the hook process's instructions (callgrind) and how many files under the
# sysfs tree and the baselines one prestart opens (every process, NVML children included).
# BASE, a second devgate binary (an older build), is measured the same way in the same run,
# interleaved with BIN.
#
#   benches/pcie.sh [path/to/devgate] [runs] [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/devgate}
RUNS=${2:-200}
BASE=${3:-}
[ -x "$BIN" ] || cargo build --release --locked
cargo build --quiet --locked --manifest-path tests/fake-nvml/Cargo.toml --target-dir target/fake-nvml --release
LIB=$PWD/target/fake-nvml/release/libfake_nvml.so

W=$(mktemp -d /tmp/devgate-bench-pcie.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
mkdir -p "$W/dev" "$W/bundle" "$W/sys/bus/pci/devices" "$W/empty-sys"
devices=""
gpus=""
buses=(1b 3b 5e 86 af d8 19 39)
aer() { # dir
    printf 'RxErr 0\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 0\n' > "$1/aer_dev_correctable"
    printf 'Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nTOTAL_ERR_NONFATAL 0\n' > "$1/aer_dev_nonfatal"
    printf 'Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nTOTAL_ERR_FATAL 0\n' > "$1/aer_dev_fatal"
}
for i in 0 1 2 3 4 5 6 7; do
    mknod "$W/dev/nvidia$i" c 195 "$i"
    devices+="{\"path\":\"/dev/nvidia$i\",\"type\":\"c\",\"major\":195,\"minor\":$i},"
    gpus+="{\"uuid\":\"GPU-0000000$i-1111-2222-3333-444444444444\",\"pci_bus_id\":\"00000000:${buses[$i]^^}:00.0\",\"minor\":$i},"
    port="$W/sys/devices/pci0000:00/0000:00:0$i.0"
    fn="$port/0000:${buses[$i]}:00.0"
    mkdir -p "$fn"
    ln -s ../../../bus/pci "$port/subsystem"
    ln -s ../../../../bus/pci "$fn/subsystem"
    ln -s "../../../devices/pci0000:00/0000:00:0$i.0/0000:${buses[$i]}:00.0" "$W/sys/bus/pci/devices/0000:${buses[$i]}:00.0"
    echo 0x10de > "$fn/vendor"
    echo 2.5 GT/s PCIe > "$fn/current_link_speed"; echo 32.0 GT/s PCIe > "$fn/max_link_speed"
    echo 16 > "$fn/current_link_width"; echo 16 > "$fn/max_link_width"; echo 16 > "$port/max_link_width"
    aer "$fn"; aer "$port"
done
echo "{\"linux\":{\"devices\":[${devices%,}]}}" > "$W/bundle/config.json"
echo "{\"driver_version\":\"550.54.15\",\"gpus\":[${gpus%,}]}" > "$W/fake.json"
echo "4,1,1000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15" > "$W/kmsg"

common="\"dev_root\":\"$W/dev\",\"state_dir\":\"$W/state\",\"quarantine_dir\":\"$W/q\",\"kmsg_path\":\"$W/kmsg\",\"nvml_library\":\"$LIB\",\"proc_root\":\"$W/proc\""
echo "{$common,\"sysfs_root\":\"$W/sys\"}" > "$W/with.json"
echo "{$common,\"sysfs_root\":\"$W/empty-sys\"}" > "$W/without.json"
echo "{\"ociVersion\":\"1.0.2\",\"id\":\"bench\",\"status\":\"creating\",\"pid\":1,\"bundle\":\"$W/bundle\"}" > "$W/state.json"
export FAKE_NVML_CONFIG=$W/fake.json

bins=("$BIN")
[ -z "$BASE" ] || bins+=("$BASE")
# Both must allow without a word; a bench of a failing path measures the wrong thing.
for b in "${bins[@]}"; do
    for c in with without; do
        out=$("$b" --config "$W/$c.json" hook prestart < "$W/state.json" 2>&1) || { echo "prestart failed ($b, $c): $out" >&2; exit 1; }
        [ -z "$out" ] || { echo "prestart said something ($b, $c): $out" >&2; exit 1; }
    done
done
[ "$(ls "$W/state/pcie" | wc -l)" = 16 ] || { echo "expected 16 baselines" >&2; exit 1; }

# Steady state: the baselines exist and do not move.
for b in "${bins[@]}"; do
    echo "$b:"
    if command -v valgrind >/dev/null; then
        for c in with without; do
            rm -f "$W"/cg.*
            # NVML's query processes are forked, and valgrind follows them: the hook is the
            # first pid.
            valgrind --tool=callgrind --callgrind-out-file=/dev/null --log-file="$W/cg.%p" \
                "$b" --config "$W/$c.json" hook prestart < "$W/state.json"
            first=$(ls "$W"/cg.* | sort -t. -k2 -n | head -1)
            echo "  $c pcie: $(sed -n 's/.*Collected : //p' "$first") instructions (hook process)"
        done
    fi
    if command -v strace >/dev/null; then
        strace -f -qq -e trace=openat,readlink,readlinkat -o "$W/trace" \
            "$b" --config "$W/with.json" hook prestart < "$W/state.json"
        opens() { grep 'openat(' "$W/trace" | grep -c "$1" || true; }
        echo "  with pcie, files opened: $(opens "$W/sys/") under sysfs ($(opens '/aer_dev_') AER counter files, $(opens '/vendor"') vendor), $(opens "$W/state/pcie/") baselines; $(grep -c 'readlink' "$W/trace" | tr -d ' ') readlinks in all"
    fi
done

if command -v hyperfine >/dev/null; then
    args=()
    for b in "${bins[@]}"; do
        args+=(-n "$b: 8 GPUs, pcie probe on 16 functions" "$b --config $W/with.json hook prestart < $W/state.json"
               -n "$b: 8 GPUs, no PCI function found" "$b --config $W/without.json hook prestart < $W/state.json")
    done
    hyperfine --warmup 20 --runs "$RUNS" --shell=sh "${args[@]}"
else
    # Interleaved, so that load from elsewhere falls on every case alike; each run's time
    # is kept, for the median and the p10-p90 spread (a mean takes every neighbour's spike).
    for _ in $(seq "$RUNS"); do
        for i in "${!bins[@]}"; do
            for c in with without; do
                t0=$EPOCHREALTIME
                "${bins[$i]}" --config "$W/$c.json" hook prestart < "$W/state.json"
                t1=$EPOCHREALTIME
                echo $(( ${t1/./} - ${t0/./} )) >> "$W/times.$i.$c"
            done
        done
    done
    stats() { sort -n "$1" | awk '{a[NR]=$1} END {printf "%d %d %d", a[int((NR+1)/2)], a[int(NR*0.1+0.5)], a[int(NR*0.9+0.5)]}'; }
    for i in "${!bins[@]}"; do
        for c in with without; do
            set -- $(stats "$W/times.$i.$c")
            echo "${bins[$i]}: $c pcie: median $1 us (p10 $2, p90 $3) of $RUNS, interleaved"
            eval "med_$c=$1"
        done
        echo "${bins[$i]}: ratio of medians with/without: $(awk -v a="$med_with" -v b="$med_without" 'BEGIN {printf "%.3f", a / b}')"
    done
fi
