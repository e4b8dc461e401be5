#!/usr/bin/env bash
# devgate's whole story under the real runc, on a machine without a GPU:
#   a. a container on GPU 0 starts;
#   b. the driver logs XID 79 for GPU 0, and the next start is rejected with the line
#      kubelet shows;
#   c. with the class policy `remap` and GPU 1 held back as a spare, the same container
#      starts on the spare;
#   d. during that run GPU 1 reports uncorrectable ECC errors, and at stop the termination
#      message and the exit record carry DeviceFault/...;
#   e. `devgate explain` and `devgate status` show all of it.
#
# The GPUs are the project's fake NVML library (tests/fake-nvml) and two char nodes 195:0
# and 195:1 in a demo dev directory; the kernel log is a file in kmsg format. devgate finds
# them through its ordinary config keys (nvml_library, kmsg_path, dev_root) and runs exactly
# as on a node. Every step is checked: the demo stops with "demo: FAILED" when one does not
# do what it says. Everything lives in a temp dir; no configuration of the node's own
# (devgate's, runc's, the runtimes') is read or changed.
#
# Usage: scripts/demo.sh [DEVGATE_BINARY] [TARGET_DIR]   (root; `make demo` passes both)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(readlink -f "${1:-target/release/devgate}")
TARGET_DIR=${2:-${CARGO_TARGET_DIR:-target}}

die() { printf '\ndemo: FAILED: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (runc needs it): sudo make demo"
[ -x "$BIN" ] || die "no devgate binary at $BIN (make build)"

need=()
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
    echo "demo: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The fake NVML, built like the tests build it (a small cdylib; seconds once cached).
cargo build --quiet --locked --manifest-path tests/fake-nvml/Cargo.toml \
    --target-dir "$TARGET_DIR/fake-nvml" || die "cannot build the fake NVML (tests/fake-nvml)"
NVML=$(readlink -f "$TARGET_DIR/fake-nvml/debug/libfake_nvml.so")

work=$(mktemp -d /tmp/devgate-demo.XXXXXX)
runner=
cleanup() {
    [ -z "$runner" ] || kill "$runner" 2>/dev/null || true
    for id in train-a train-b train-c; do
        runc --root "$work/runc" delete --force "$id" >/dev/null 2>&1 || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"

# --- the node: two GPUs, their NVML view, the kernel log, devgate's config --------------
mkdir -p "$work/dev" "$work/bundle/rootfs/bin" "$work/bundle/rootfs/dev" \
    "$work/bundle/rootfs/proc" "$work/bundle/rootfs/out"
mknod -m 666 "$work/dev/nvidia0" c 195 0
mknod -m 666 "$work/dev/nvidia1" c 195 1
: > "$work/kmsg"
uuid0=GPU-00000000-1111-2222-3333-444444444444
uuid1=GPU-00000001-1111-2222-3333-444444444444
# GPU N at PCI bus 0x1b / 0x3b; `ecc1` is GPU 1's volatile uncorrectable ECC count.
nvml_state() {
    cat > "$work/nvml.json.tmp" <<JSON
{"driver_version": "550.54.15", "gpus": [
 {"uuid": "$uuid0", "pci_bus_id": "00000000:1B:00.0", "minor": 0, "volatile_uncorrectable_ecc": 0,
  "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
  "retired_pages_pending": false, "throttle_reasons": 1,
  "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16}},
 {"uuid": "$uuid1", "pci_bus_id": "00000000:3B:00.0", "minor": 1, "volatile_uncorrectable_ecc": $1,
  "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
  "retired_pages_pending": false, "throttle_reasons": 1,
  "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16}}]}
JSON
    mv "$work/nvml.json.tmp" "$work/nvml.json"
}
nvml_state 0

# $1: the class policy for GPUs; remap also holds GPU 1 back as a spare.
devgate_config() {
    local spares='{}'
    [ "$1" != remap ] || spares="{\"nvidia-gpu\": [\"$work/dev/nvidia1\"]}"
    cat > "$work/devgate.json" <<JSON
{
  "state_dir": "$work/state",
  "quarantine_dir": "$work/quarantine",
  "log_file": "$work/decisions.jsonl",
  "dev_root": "$work/dev",
  "nvml_library": "$NVML",
  "kmsg_path": "$work/kmsg",
  "kubelet_pods_dir": "$work/kubelet/pods",
  "policy": { "default": "reject", "classes": { "nvidia-gpu": "$1" }, "on_unknown": "allow" },
  "spares": $spares
}
JSON
}
devgate_config reject

# The hook runc runs: devgate, with a copy of its stderr kept for the demo (runc shows a
# hook's stderr only when the hook fails). FAKE_NVML_CONFIG is the fake library's own
# input; runc gives a hook only the environment its entry names.
cat > "$work/devgate-hook" <<SH
#!/bin/sh
"$BIN" --config "$work/devgate.json" hook "\$1" 2> "$work/hook.err.\$\$"
rc=\$?
cat "$work/hook.err.\$\$" >> "$work/hook-stderr.log"
cat "$work/hook.err.\$\$" >&2
rm -f "$work/hook.err.\$\$"
exit \$rc
SH
chmod 755 "$work/devgate-hook"

# --- the container: a training job on /dev/nvidia0, like a pod kubelet started ----------
cp /bin/busybox "$work/bundle/rootfs/bin/"
for a in sh echo ls cat sleep test; do ln -s busybox "$work/bundle/rootfs/bin/$a"; done
term="$work/kubelet/pods/pod-uid-1/containers/trainer/termination-log"
mkdir -p "$(dirname "$term")"
: > "$term"
( cd "$work/bundle" && runc spec )
python3 - "$work/bundle/config.json" "$work/devgate-hook" "$work/nvml.json" "$term" <<'PY'
import json, sys
path, hook, nvml, term = sys.argv[1:]
s = json.load(open(path))
s["process"]["terminal"] = False
# The job says which device its /dev/nvidia0 is, then works until told how the run ends.
s["process"]["args"] = ["sh", "-c",
    'set -- $(ls -l /dev/nvidia0); echo "container: my /dev/nvidia0 is device $5$6"; '
    'while [ ! -s /out/end ]; do sleep 0.1; done; '
    'if [ "$(cat /out/end)" = fault ]; then '
    'echo "app: CUDA error: uncorrectable ECC error encountered" > /dev/termination-log; exit 1; fi']
s["linux"]["devices"] = [
    {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666, "uid": 0, "gid": 0}]
s["linux"]["resources"]["devices"].append(
    {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"})
s["mounts"].append({"destination": "/dev/termination-log", "type": "bind", "source": term,
                    "options": ["rbind", "rprivate", "rw"]})
# containerd's CRI annotations: which pod and container kubelet's termination file is for
s["annotations"] = {"io.kubernetes.cri.sandbox-uid": "pod-uid-1",
                    "io.kubernetes.cri.container-name": "trainer"}
entry = lambda stage: {"path": hook, "args": ["devgate-hook", stage],
                       "env": ["FAKE_NVML_CONFIG=" + nvml], "timeout": 30}
s["hooks"] = {"prestart": [entry("prestart")], "poststop": [entry("poststop")]}
json.dump(s, open(path, "w"), indent=2)
PY

dg() { FAKE_NVML_CONFIG="$work/nvml.json" "$BIN" --config "$work/devgate.json" "$@"; }
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
step() { printf '\n%s%s%s\n' "$bold" "$*" "$plain"; }
show() { sed 's/^/    /'; }
# The container starts in the background; its output goes to $work/ID.out.
start() {
    : > "$work/bundle/rootfs/out/end"
    : > "$work/hook-stderr.log"
    runc --root "$work/runc" run --bundle "$work/bundle" "$1" > "$work/$1.out" 2>&1 &
    runner=$!
}
# Waits (bounded) for the container to report in, or for runc to give up.
await_container() {
    for _ in $(seq 300); do
        grep -q '^container:' "$work/$1.out" && return 0
        kill -0 "$runner" 2>/dev/null || return 1
        sleep 0.1
    done
    die "$1 did not start within 30 s: $(cat "$work/$1.out")"
}
# Tells the job how its run ends and waits for runc (and so for poststop) to finish.
finish() {
    echo "$2" > "$work/bundle/rootfs/out/end"
    local rc=0
    wait "$runner" || rc=$?
    runner=
    return $rc
}
last_action() {
    python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["container_id"] == sys.argv[2] and json.loads(l)["stage"] != "poststop"][-1]["action"])' \
        "$work/decisions.jsonl" "$1" 2>/dev/null
}

echo "demo: $("$BIN" version 2>/dev/null | head -1), $(runc --version | head -1), fake NVML with 2 GPUs, all under $work"

# a. ---------------------------------------------------------------------------------------
step "a. A training job on GPU 0 (/dev/nvidia0) starts: devgate asks NVML and the kernel log about the GPU and lets it start."
start train-a
await_container train-a || die "a: the container did not start: $(cat "$work/train-a.out")"
finish train-a ok || die "a: the job failed: $(cat "$work/train-a.out")"
show < "$work/train-a.out"
grep -qx 'container: my /dev/nvidia0 is device 195,0' "$work/train-a.out" || die "a: the job did not run on 195:0"
[ "$(last_action train-a)" = allow ] || die "a: devgate's decision was not allow"

# b. ---------------------------------------------------------------------------------------
step "b. The driver logs XID 79 (fallen off the bus) for GPU 0; the next start is rejected, and this is the line kubelet shows:"
echo "3,1001,5000000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=4242, name=python, GPU has fallen off the bus." >> "$work/kmsg"
start train-b
if await_container train-b; then die "b: the job started on a GPU that fell off the bus"; fi
finish train-b ok && die "b: runc run succeeded although devgate rejected the start"
# runc's error quotes the hook's stderr; the devgate line is its last part.
line=$(sed -n 's/.*stderr: \(devgate: rejected .*\)\\n"$/\1/p' "$work/train-b.out" | sed 's/\\"/"/g')
grep -q "^devgate: rejected /dev/nvidia0 (host $work/dev/nvidia0, 195:0): xid: xid 79 (GPU has fallen off the bus) on 0000:1b:00 .*; policy reject$" <<<"$line" \
    || die "b: runc's error has no devgate reject line for XID 79: $(cat "$work/train-b.out")"
echo "$line" | show
[ "$(last_action train-b)" = reject ] || die "b: devgate's decision was not reject"

# c. ---------------------------------------------------------------------------------------
step "c. With the class policy remap and GPU 1 held back as a spare, the same job starts on the spare:"
devgate_config remap
start train-c
await_container train-c || die "c: the job did not start: $(cat "$work/train-c.out")"
grep 'devgate: remapped' "$work/hook-stderr.log" | show
show < "$work/train-c.out"
grep -qF "devgate: remapped /dev/nvidia0 (host $work/dev/nvidia0, 195:0) -> $work/dev/nvidia1 (195:1): xid: xid 79" "$work/hook-stderr.log" \
    || die "c: devgate did not say it remapped: $(cat "$work/hook-stderr.log")"
grep -qx 'container: my /dev/nvidia0 is device 195,1' "$work/train-c.out" || die "c: the job's /dev/nvidia0 is not the spare"
[ "$(last_action train-c)" = remap ] || die "c: devgate's decision was not remap"

# d. ---------------------------------------------------------------------------------------
step "d. During the run GPU 1 reports 2 uncorrectable ECC errors and the job dies; at stop the termination message and the exit record carry the fault:"
nvml_state 2
rc=0; finish train-c fault || rc=$?
[ "$rc" = 1 ] || die "d: the job's exit status is $rc, not 1: $(cat "$work/train-c.out")"
echo "termination message (what kubectl describe pod shows):" | show
show < "$term" | show
exit_record="$work/state/exits/train-c.json"
[ -f "$exit_record" ] || die "d: no exit record at $exit_record"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("exit record: faults " + ", ".join(f["code"] for f in r["faults"]))' "$exit_record" | show
grep -q "^devgate: DeviceFault/ECCUncorrectable on /dev/nvidia0 ($uuid1): 2 new volatile uncorrectable ECC errors" "$term" \
    || die "d: the termination message does not carry the fault"
grep -q '^app: CUDA error' "$term" || die "d: the app's own message was not kept"
grep -q '"DeviceFault/ECCUncorrectable"' "$exit_record" || die "d: the exit record does not carry the fault"

# e. ---------------------------------------------------------------------------------------
step "e. devgate explain and devgate status show all of it, for the operator:"
explain_b=$(dg explain train-b) || die "e: devgate explain train-b failed"
explain_c=$(dg explain train-c) || die "e: devgate explain train-c failed"
status=$(dg status) || true # exits 0 whatever the health; a non-zero status shows below
printf '$ devgate explain train-b\n%s\n$ devgate explain train-c\n%s\n$ devgate status\n%s\n' \
    "$explain_b" "$explain_c" "$status" | show
grep -q 'xid 79' <<<"$explain_b" || die "e: explain train-b does not name the XID"
grep -qF "remapped /dev/nvidia0 (195:0) -> $work/dev/nvidia1 (195:1)" <<<"$explain_c" || die "e: explain train-c does not show the remap"
grep -q 'DeviceFault/ECCUncorrectable' <<<"$explain_c" || die "e: explain train-c does not show the fault"
grep -q 'xid 79' <<<"$status" || die "e: status does not show GPU 0's XID"
grep -qi 'ecc' <<<"$status" || die "e: status does not show GPU 1's ECC errors"

printf '\ndemo: ok, every step did what it said\n'
