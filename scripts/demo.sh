#!/usr/bin/env bash
# devgate's main job on a fresh machine: a container with devices starts, an operator
# cordons one of them, the next start is rejected with devgate's reason in runc's error,
# and after uncordon it starts again. Everything lives in a temp dir; nothing on the
# node's own devgate config or runtimes is touched.
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/devgate}")
[ "$(id -u)" = 0 ] || { echo "demo: run as root (runc needs it)" >&2; exit 1; }

need=()
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
    echo "demo: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/devgate-demo.XXXXXX)
trap 'runc --root "$work/runc" delete --force demo >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
chmod 755 "$work"
mkdir -p "$work/bundle/rootfs/bin" "$work/bundle/rootfs/dev" "$work/bundle/rootfs/proc"
cp /bin/busybox "$work/bundle/rootfs/bin/"
for a in sh echo head od; do ln -s busybox "$work/bundle/rootfs/bin/$a"; done

cat > "$work/devgate.json" <<JSON
{
  "state_dir": "$work/state",
  "quarantine_dir": "$work/quarantine",
  "log_file": "$work/decisions.jsonl",
  "policy": { "default": "reject", "on_unknown": "allow" }
}
JSON

( cd "$work/bundle" && runc spec )
python3 - "$work/bundle/config.json" "$BIN" "$work/devgate.json" <<'PY'
import json, sys
path, binary, cfg = sys.argv[1:]
s = json.load(open(path))
s["process"]["terminal"] = False
s["process"]["args"] = ["sh", "-c", "echo 'container: hello, /dev/zero gives' $(head -c 4 /dev/zero | od -An -tx1)"]
s["linux"]["devices"] = [
    {"path": "/dev/zero", "type": "c", "major": 1, "minor": 5, "fileMode": 0o666, "uid": 0, "gid": 0},
    {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666, "uid": 0, "gid": 0},
]
s["linux"]["resources"]["devices"] += [
    {"allow": True, "type": "c", "major": 1, "minor": 5, "access": "rwm"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
]
hook = lambda stage: {"path": binary, "args": ["devgate", "--config", cfg, "hook", stage], "timeout": 10}
s["hooks"] = {"prestart": [hook("prestart")], "poststop": [hook("poststop")]}
json.dump(s, open(path, "w"), indent=2)
PY

dg() { "$BIN" --config "$work/devgate.json" "$@"; }
run() { runc --root "$work/runc" run --bundle "$work/bundle" demo; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. a container given /dev/zero and /dev/null starts (devgate checks both at prestart)"
run

step "2. the operator cordons /dev/zero"
dg cordon /dev/zero --reason "xid 79 seen"
dg status

step "3. the next start is rejected; this is the line kubelet shows in kubectl describe pod"
if run; then echo "demo: the container started although its device was cordoned" >&2; exit 1; fi

step "4. what devgate decided, for the operator"
dg explain demo

step "5. uncordon, and it starts again"
dg uncordon /dev/zero
run

step "decision log ($work/decisions.jsonl), one JSON line per decision"
cut -c1-200 "$work/decisions.jsonl"
echo
echo "demo: done"
