#!/usr/bin/env bash
# Installs what `make test` (and `make demo`) need on a Debian/Ubuntu machine, then exits:
# the runtimes the end-to-end tests run real containers under, and their helpers.
# `make test` and .ci/run both call it. Installing needs root; with everything already
# installed it does nothing and needs nothing.
set -euo pipefail

# runc, crun: the OCI runtimes; busybox-static: every test container's rootfs;
# podman, containerd (ctr, shim): the runtimes whose shipped configuration is tested;
# protobuf-compiler: protoc, which builds k8s-cri (the CRI tests' typed client);
# make, tar, git: the install, podman-import and clone-and-demo tests;
# rpm: reading the .rpm in the package check; mmdebstrap, systemd-container: the forky
# stack's image and its systemd boot (scripts/forky-stack.sh); containernetworking-plugins,
# openssl: the real node's pod network and service-account key (tests/common/k8s.rs).
packages=(runc crun busybox-static podman containerd protobuf-compiler
          make tar git rpm mmdebstrap systemd-container containernetworking-plugins openssl)

die() { echo "install-test-deps: $*" >&2; exit 1; }

command -v dpkg-query >/dev/null && command -v apt-get >/dev/null ||
    die "no dpkg/apt-get here; install these packages yourself: ${packages[*]}"

need=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "needs root to install ${need[*]} (run it, or make test, as root)"
    echo "install-test-deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || die "cargo is not installed (https://rustup.rs)"
# Go builds the real node's Kubernetes binaries (scripts/k8s-binaries.sh); test infrastructure
# only. The project's machines have it; elsewhere install Go 1.26 or later.
command -v go >/dev/null || [ -n "$(ls /var/cache/devgate-tests/k8s/*/done 2>/dev/null)" ] ||
    die "go is not installed (https://go.dev/doc/install): the real-node tests build Kubernetes with it"
