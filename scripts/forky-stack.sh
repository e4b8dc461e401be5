#!/usr/bin/env bash
# The 2026 node of the test suite: a Debian forky root filesystem (containerd 2.x, runc 1.3,
# crun 1.2x, podman 5, conmon, systemd) that the end-to-end tests run inside
# (docs/development.md, "The forky stack").
#
#   forky-stack.sh image          build it once per cache key; print its path last
#   forky-stack.sh mirror         the Debian mirror this machine's apt sources name
#   forky-stack.sh enter CMD...   run CMD inside it (pivot_root, private mount namespace)
#   forky-stack.sh boot           boot it under systemd-nspawn with systemd as PID 1, check
#                                 that systemd reaches a running state, power it off
#   forky-stack.sh test [BIN...]  run the e2e test binaries (default: every tests/e2e_*.rs)
#                                 inside it, with the repository and target dir bound in
#   forky-stack.sh all            boot, then test on both cgroup layouts (what `make test` runs)
#
# FORKY_CGROUP=host (the default) keeps the host's /sys/fs/cgroup (hybrid here);
# FORKY_CGROUP=v2 mounts cgroup2 alone there, as on a 2026 node.
#
# The mirror is the one this machine's apt sources name; the key is the resolved versions of
# every package the image holds besides the essential set, so a new upload rebuilds it and
# nothing else does. The Release file's Valid-Until is not checked (its signature is): a
# mirror pinned to a snapshot serves an expired one. Needs root.
set -euo pipefail

CACHE=${DEVGATE_FORKY_CACHE:-/var/cache/devgate-tests/forky}
KEYRING=${DEVGATE_FORKY_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
SUITE=forky
# The runtimes under test; the tools the tests run inside (cc for the test's C helpers,
# make for the install tests, iproute2/procps for the network-less pods' checks, CNI
# plugins and openssl for the real node of tests/common/k8s.rs).
PACKAGES=(containerd runc crun podman conmon systemd dbus busybox-static mount util-linux
          gcc libc6-dev make tar procps iproute2 ca-certificates containernetworking-plugins
          openssl)
# What `forky-stack.sh image` prints (and what the key covers besides the versions).
RECIPE_VERSION=3

die() { echo "forky-stack: $*" >&2; exit 1; }
log() { echo "forky-stack: $*" >&2; }

# The first Debian URI this machine's apt sources name (deb822 or one-line form).
mirror() {
    local uri
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\/.*\/debian\/?$/) { print $i; exit } }' \
            /etc/apt/sources.list | head -n1)
    fi
    [ -n "$uri" ] || die "no Debian mirror in /etc/apt/sources.list{,.d/*.sources}"
    echo "${uri%/}"
}

# An apt tree of its own for forky, so the host's apt state is never touched.
apt_tree() {
    local dir=$1 uri=$2
    mkdir -p "$dir"/etc/apt/apt.conf.d "$dir"/etc/apt/preferences.d "$dir"/var/lib/apt/lists/partial \
        "$dir"/var/cache/apt/archives/partial
    : >"$dir"/status
    echo "deb [signed-by=$KEYRING check-valid-until=no] $uri $SUITE main" >"$dir"/etc/apt/sources.list
}

apt_opts() {
    local dir=$1
    echo -o "Dir=$dir" -o "Dir::State::status=$dir/status" -o "Dir::Etc=$dir/etc/apt" \
        -o "Dir::Cache=$dir/var/cache/apt" -o "Dir::State=$dir/var/lib/apt" \
        -o APT::Install-Recommends=false -o Debug::NoLocking=true -o APT::Sandbox::User=root
}

# Every package (name version) that installing PACKAGES into an empty system brings.
resolve() {
    local dir=$1
    # shellcheck disable=SC2046
    apt-get $(apt_opts "$dir") -qq update >&2
    # shellcheck disable=SC2046
    apt-get $(apt_opts "$dir") -s install "${PACKAGES[@]}" 2>/dev/null |
        awk '$1 == "Inst" { gsub(/[()]/, "", $3); print $2, $3 }' | sort
}

image() {
    [ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, mounts)"
    [ -r "$KEYRING" ] || die "no keyring at $KEYRING (install debian-archive-keyring)"
    command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
    local uri tree versions key root
    uri=$(mirror)
    # One build at a time (two `make test` runs on one machine share the cache).
    mkdir -p "$(dirname "$CACHE")"
    exec 9>"$CACHE.lock"
    flock 9
    # The lists persist between runs, so a run with nothing new downloads only InRelease.
    tree=$CACHE-apt
    apt_tree "$tree" "$uri"
    versions=$(resolve "$tree" || true)
    if [ -z "$versions" ]; then
        # No mirror (an offline run): the image already built, if there is one, said so.
        root=$(find "$CACHE" -mindepth 2 -maxdepth 2 -name done -printf '%h/rootfs\n' 2>/dev/null | head -n1)
        [ -n "$root" ] || die "resolving ${PACKAGES[*]} against $SUITE at $uri failed, and no image is cached"
        log "resolving against $uri failed; using the cached $root, versions not checked"
        echo "$root"
        return
    fi
    for p in containerd runc crun podman conmon systemd; do
        log "$(awk -v p="$p" '$1 == p { printf "%s %s", $1, $2 }' <<<"$versions")"
    done
    key=$(printf '%s\n%s\n' "recipe $RECIPE_VERSION ${PACKAGES[*]}" "$versions" | sha256sum | cut -c1-16)
    root=$CACHE/$key/rootfs
    if [ -e "$CACHE/$key/done" ]; then
        log "cached: $root"
    else
        log "building $root (once per key) from $uri"
        mkdir -p "$CACHE"
        rm -rf "$CACHE/$key.tmp"
        mkdir -p "$CACHE/$key.tmp"
        mmdebstrap --quiet --variant=apt --keyring="$KEYRING" \
            --aptopt='APT::Install-Recommends "false"' \
            --include="$(IFS=,; echo "${PACKAGES[*]}")" \
            --customize-hook='printf "127.0.0.1 localhost\\n::1 localhost\\n" > "$1/etc/hosts"' \
            --customize-hook='chroot "$1" dpkg-query -W -f "\${Package} \${Version}\n" > "$1/.forky-versions"' \
            "$SUITE" "$CACHE/$key.tmp/rootfs" "deb [check-valid-until=no] $uri $SUITE main" >&2
        echo "$versions" >"$CACHE/$key.tmp/resolved"
        touch "$CACHE/$key.tmp/done"
        rm -rf "$CACHE/$key"
        mv "$CACHE/$key.tmp" "$CACHE/$key"
        # Older keys are older versions: keep only this one.
        find "$CACHE" -mindepth 1 -maxdepth 1 -regextype posix-extended \
            -regex '.*/[0-9a-f]{16}(\.tmp)?' ! -name "$key" -exec rm -rf {} +
    fi
    echo "$root"
}

# Paths from the host that a test inside needs at the same place: the repository, the
# target dir (the test binaries' compiled-in paths), the toolchain (the tests build the
# fake NVML with cargo).
binds() {
    local p
    for p in "$@"; do [ -e "$p" ] && printf '%s\n' "$(realpath "$p")"; done | sort -u
}

# Enter ROOT: a private mount namespace, the root bound onto itself (pivot_root needs a
# mount point), fresh /proc, /sys, /dev, /run and /tmp, then pivot_root. Never chroot: a
# remap child that enters a container's mount namespace loses a chroot's root.
enter() {
    local root=$1; shift
    local inner
    inner=$(cat <<'EOF'
set -e
root=$1; shift
mount --make-rprivate /
# The cached image stays as built: what a run writes outside its tmpfs mounts (runtimes'
# fixed dirs, the bind points) goes to an overlay's tmpfs upper layer, gone at exit.
ovl=$FORKY_OVL
mount -t tmpfs -o mode=755 tmpfs "$ovl"
mkdir "$ovl/upper" "$ovl/work" "$ovl/root"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$ovl/upper,workdir=$ovl/work" "$ovl/root"
root=$ovl/root
mount --rbind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
if [ "$FORKY_CGROUP" = v2 ]; then
    # A unified node: cgroup2 alone at /sys/fs/cgroup (on this host it has no cpu, memory
    # or pids controller; those stay bound to v1 outside).
    umount -R "$root/sys/fs/cgroup"
    mount -t cgroup2 none "$root/sys/fs/cgroup"
fi
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid tmpfs "$root/tmp"
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
# The host's device nodes (the tests' devices and spares: zero, loop-control, kmsg, ...),
# each bound in; the rest of /dev is the image's own.
for d in $(find /dev -maxdepth 2 \( -type c -o -type b \) ! -path '/dev/pts/*' ! -name ptmx ! -name console); do
    mkdir -p "$(dirname "$root$d")"; touch "$root$d"; mount --bind "$d" "$root$d"
done
mkdir -p "$root/dev/pts" "$root/dev/shm" "$root/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t mqueue mqueue "$root/dev/mqueue" 2>/dev/null || true
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
for p in $FORKY_BINDS; do
    mkdir -p "$root$p"; mount --rbind "$p" "$root$p"
done
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
cd "$root"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /
exec "$@"
EOF
)
    local ovl rc=0
    ovl=$(mktemp -d /tmp/forky-root.XXXXXX)
    FORKY_OVL=$ovl FORKY_BINDS=${FORKY_BINDS:-} FORKY_CGROUP=${FORKY_CGROUP:-host} unshare --mount --pid --fork --propagation private \
        sh -c "$inner" forky-enter "$root" env -i PATH=${FORKY_PATH:+$FORKY_PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root TERM="${TERM:-dumb}" ${CARGO_HOME:+CARGO_HOME=$CARGO_HOME} \
        ${RUSTUP_HOME:+RUSTUP_HOME=$RUSTUP_HOME} ${FORKY_ENV:-} "$@" || rc=$?
    rmdir "$ovl"
    return "$rc"
}

# A new cgroup below this shell's own on the unified hierarchy (/sys/fs/cgroup/unified on
# a hybrid host); prints nothing where there is none.
own_cgroup() {
    local base rel
    for base in /sys/fs/cgroup/unified /sys/fs/cgroup; do
        [ -e "$base/cgroup.subtree_control" ] && break
        base=
    done
    [ -n "$base" ] || return 0
    rel=$(sed -n 's/^0:://p' /proc/self/cgroup)
    mkdir -p "$base$rel/$1" 2>/dev/null && echo "$base$rel/$1"
    return 0
}

# Removes a cgroup tree, deepest first; what still holds a process stays.
remove_cgroup() {
    find "$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
}

boot() {
    local root=$1
    command -v systemd-nspawn >/dev/null || die "systemd-nspawn is not installed (apt-get install systemd-container)"
    # systemd as PID 1 on cgroup v2 (the systemd driver's node). The image stays as it is
    # (--volatile=overlay); the check is a unit bound in and pulled in by systemd.wants=.
    # It is Type=exec, so the boot finishes without it, and it reports the manager's state
    # through a file the host reads, then powers the machine off.
    local out; out=$(mktemp -d /tmp/forky-boot.XXXXXX)
    cat >"$out/forky-check.service" <<'EOF'
[Unit]
Description=devgate forky stack: report that systemd booted, then power off
[Service]
Type=exec
ExecStart=/bin/sh -c 'timeout 60 systemctl is-system-running --wait >/out/state 2>&1; cat /proc/1/comm >>/out/state; stat -fc %%T /sys/fs/cgroup >>/out/state; systemctl --version | head -n1 >>/out/state; systemctl poweroff'
EOF
    # nspawn --keep-unit makes payload/ and supervisor/ beside itself: in a cgroup of its own,
    # removed after, so that no run collides with what another left (EBUSY at the next boot).
    local cg; cg=$(own_cgroup "forky-boot-$$")
    SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 timeout 120 sh -c \
        '[ -z "$0" ] || echo $$ >"$0/cgroup.procs"; shift; exec "$@"' "$cg" _ \
        systemd-nspawn --quiet --boot --register=no \
        --keep-unit --volatile=overlay --directory="$root" --bind="$out:/out" \
        --bind-ro="$out/forky-check.service:/etc/systemd/system/forky-check.service" \
        systemd.wants=forky-check.service >"$out/console" 2>&1 || true
    [ -z "$cg" ] || remove_cgroup "$cg"
    log "boot: $(tr '\n' ' ' <"$out/state" 2>/dev/null || echo 'no report')"
    if ! grep -qx systemd "$out/state" 2>/dev/null || ! grep -qx cgroup2fs "$out/state"; then
        tail -n 20 "$out/console" >&2
        rm -rf "$out"
        die "systemd did not boot the image on cgroup v2"
    fi
    rm -rf "$out"
}

# The e2e test binaries cargo built for this tree (built here, on the host, first).
test_bins() {
    cargo test --locked --no-run --message-format=json --test 'e2e_*' 2>/dev/null |
        awk -F'"executable":"' 'NF > 1 { split($2, a, "\""); print a[1] }' | grep "/deps/e2e_" | sort -u
}

run_tests() {
    local root=$1; shift
    local repo; repo=$(cd "$(dirname "$0")/.." && pwd)
    local target=${CARGO_TARGET_DIR:-$repo/target}
    local bins=("$@")
    [ ${#bins[@]} -gt 0 ] || mapfile -t bins < <(cd "$repo" && test_bins)
    [ ${#bins[@]} -gt 0 ] || die "no e2e test binaries (cargo test --no-run failed?)"
    local cargo; cargo=$(command -v cargo)
    # The Kubernetes binaries the host pass built (scripts/k8s-binaries.sh): no Go inside.
    local k8s=${DEVGATE_K8S_CACHE:-/var/cache/devgate-tests/k8s}
    export FORKY_BINDS; FORKY_BINDS=$(binds "$repo" "$target" "${CARGO_HOME:-$HOME/.cargo}" \
        "${RUSTUP_HOME:-$HOME/.rustup}" "$k8s" | tr '\n' ' ')
    # cargo and rustc from the host's toolchain: the tests build the fake NVML with them.
    export FORKY_PATH; FORKY_PATH=$(dirname "$cargo")
    export FORKY_ENV="DEVGATE_STACK=forky CARGO=$cargo CARGO_TARGET_DIR=$target DEVGATE_K8S_CACHE=$k8s"
    # What the tests will meet: the image's runtimes, not the host's.
    enter "$root" sh -c 'echo "forky-stack: inside: $(. /etc/os-release; echo "$PRETTY_NAME");" \
        "$(runc --version | head -n1); $(crun --version | head -n1);" \
        "$(containerd --version | cut -d" " -f3); $(podman --version)"' >&2
    local failed=() b out
    # --show-output: a passing test's output too, where each skip says why.
    out=$(mktemp /tmp/forky-tests.XXXXXX)
    for b in "${bins[@]}"; do
        log "running $(basename "$b") on forky, cgroup layout ${FORKY_CGROUP:-host}"
        # shellcheck disable=SC2086
        enter "$root" sh -c 'cd "$0" && exec "$@"' "$repo" "$b" \
            ${FORKY_TEST_ARGS:---test-threads=4 --show-output} 2>&1 | tee -a "$out" ||
            failed+=("$(basename "$b")")
    done
    log "skips on forky (cgroup layout ${FORKY_CGROUP:-host}), by reason:"
    grep -h '^skipped' "$out" | sort | uniq -c >&2 || log "  none"
    rm -f "$out"
    [ ${#failed[@]} -eq 0 ] || die "failed on forky (cgroup layout ${FORKY_CGROUP:-host}): ${failed[*]}"
    log "every e2e binary passed on forky (cgroup layout ${FORKY_CGROUP:-host})"
}

cmd=${1:-}; shift || true
if [ "$(id -u)" != 0 ] && [ "$cmd" = all ]; then
    # As the host's e2e tests do for another user: a skip that says why.
    log "skipped: the forky stack needs root (CI runs as root)"
    exit 0
fi
case "$cmd" in
    image) image ;;
    mirror) mirror ;;
    enter) root=$(image); enter "$root" "$@" ;;
    boot) root=$(image); boot "$root" ;;
    test) root=$(image); run_tests "$root" "$@" ;;
    all) root=$(image); boot "$root"
         FORKY_CGROUP=host run_tests "$root"
         FORKY_CGROUP=v2 run_tests "$root" ;;
    *) die "usage: $0 image | mirror | enter CMD... | boot | test [BIN...] | all" ;;
esac
