#!/usr/bin/env bash
# devgate's NVML path against a real NVIDIA GPU: doctor, status and check, then one
# container's hooks run standalone on /dev/nvidia0 (allowed), the same GPU cordoned
# (rejected), and the hook's time over 20 starts. Optional: the project never needs a GPU
# (tests use the fake NVML). Run as root on a GPU machine, after `make build`:
#   scripts/gpu-check.sh [BIN_DIR (target/release)] [OUT_DIR ($OUT or /tmp/gpu-check)]
# Everything goes to OUT_DIR/gpu-check.log; what devgate read of the GPU to OUT_DIR/*.json
# (tests/fixtures/nvml-real/ keeps one such run).
set -u
bin=$(cd "${1:-target/release}" && pwd)
out=${2:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
w=$(mktemp -d /tmp/devgate-gpu-check.XXXXXX)
trap 'kill "${pid:-0}" 2>/dev/null; rm -rf "$w"' EXIT
say() { echo; echo "== $*"; }

say the machine
uname -r
nvidia-smi -L || { echo "no nvidia-smi: not a GPU machine"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid,persistence_mode,pcie.link.gen.current,pcie.link.gen.max,ecc.errors.uncorrected.volatile.total --format=csv
ls -l /dev/nvidia* 2>&1
lib=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}')
[ -n "$lib" ] || lib=$(ls /usr/local/nvidia/lib64/libnvidia-ml.so.1 \
    /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2>/dev/null | head -n1)
echo "NVML: ${lib:-not found}"
[ -n "$lib" ] || exit 1

mkdir -p "$w/q" "$w/log" "$w/state" "$w/pods" "$w/podlogs"
chmod 700 "$w" "$w/q" "$w/log" "$w/state"
cat >"$w/config.json" <<EOF
{
  "state_dir": "$w/state",
  "quarantine_dir": "$w/q",
  "log_file": "$w/log/decisions.jsonl",
  "nvml_library": "$lib",
  "kubelet_pods_dir": "$w/pods",
  "kubelet_pod_logs_dir": "$w/podlogs",
  "policy": { "default": "reject", "classes": {}, "on_unknown": "allow" }
}
EOF
dg() { "$bin/devgate" --config "$w/config.json" "$@"; }

say doctor
dg doctor
say status
dg status
dg status --json >"$out/status.json"
say check
dg check; echo "check exit: $?"

# A bundle naming GPU 0, as containerd's CRI writes one for a device-plugin GPU, and a
# process standing in for the container (the hooks read its pid).
major=$(stat -c '%t' /dev/nvidia0); minor=$(stat -c '%T' /dev/nvidia0)
mkdir -p "$w/bundle/rootfs"
cat >"$w/bundle/config.json" <<EOF
{
  "ociVersion": "1.0.2",
  "process": { "args": ["sleep", "1"], "cwd": "/", "env": ["NVIDIA_VISIBLE_DEVICES=0"] },
  "root": { "path": "rootfs" },
  "linux": {
    "devices": [ { "path": "/dev/nvidia0", "type": "c", "major": $((16#$major)), "minor": $((16#$minor)) } ],
    "resources": { "devices": [ { "allow": false, "access": "rwm" },
      { "allow": true, "type": "c", "major": $((16#$major)), "minor": $((16#$minor)), "access": "rw" } ] }
  }
}
EOF
sleep 600 & pid=$!
hook() { # ID STATUS: the hook front, as the shipped hook files run it
    printf '{"ociVersion":"1.0.2","id":"%s","status":"%s","pid":%s,"bundle":"%s"}' \
        "$1" "$2" "$pid" "$w/bundle" |
        "$bin/devgate-hook" --config "$w/config.json" hook auto
    echo "hook $1 $2: exit $?"
}

say a healthy GPU: the start is allowed, and stops clean
hook gpucheck-1 creating
dg explain gpucheck-1
dg explain gpucheck-1 --json >"$out/explain-allowed.json"
hook gpucheck-1 stopped
dg explain gpucheck-1

say the same GPU cordoned: the start is rejected with one line
dg cordon /dev/nvidia0 --reason "gpu-check"
hook gpucheck-2 creating
dg explain gpucheck-2 --json >"$out/explain-rejected.json"
dg uncordon /dev/nvidia0

say 20 starts and stops, timed
start=$(date +%s%N)
for i in $(seq 1 20); do
    hook "t-$i" creating >/dev/null
    hook "t-$i" stopped >/dev/null
done
end=$(date +%s%N)
echo "20 prestart+poststop pairs on a real GPU: $(((end - start) / 20000)) us a pair"
start=$(date +%s%N)
for i in $(seq 1 20); do /bin/true </dev/null; /bin/true </dev/null; done
end=$(date +%s%N)
echo "20 /bin/true pairs: $(((end - start) / 20000)) us a pair"
say decisions
tail -n 3 "$w/log/decisions.jsonl"
