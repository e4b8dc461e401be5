#!/usr/bin/env bash
# Checks the packages `make deb` and `make rpm` built, then proves the .deb on this machine
# (root): install, podman through the installed hook files, upgrade keeps an edited config,
# remove keeps it, purge removes it. .ci/run calls this after `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "check-packages: $*" >&2; exit 1; }

# Under pipefail a failed ls (no package built) would end the script here, silently.
deb=$(ls target/debian/devgate_*.deb 2>/dev/null | tail -1 || true)
rpm=$(ls target/generate-rpm/devgate-*.rpm 2>/dev/null | tail -1 || true)
[ -n "$deb" ] || fail "no .deb under target/debian (make deb)"
[ -n "$rpm" ] || fail "no .rpm under target/generate-rpm (make rpm)"

files="/usr/bin/devgate
/usr/bin/devgate-runtime
/usr/bin/devgate-hook
/usr/bin/devgate-agent
/usr/lib/systemd/system/devgate-agent.service
/usr/share/containers/oci/hooks.d/devgate.json
/etc/devgate/config.json
/etc/containerd/devgate-base-spec.json
/usr/share/devgate/containerd/config.toml
/usr/share/devgate/containerd/config-v3.toml
/usr/share/devgate/containerd/containerd-runtime-wrapper.toml
/usr/share/devgate/containerd/containerd-runtime-wrapper-v3.toml
/usr/share/devgate/crio/10-devgate-runtime.conf
/usr/share/devgate/podman/devgate-runtime.conf"
# The documentation: README.md, SECURITY.md and every page under docs/ (a new page must be
# added to both packages' assets in Cargo.toml).
for f in README.md SECURITY.md docs/*.md; do
    files="$files
/usr/share/doc/devgate/$f"
done
confs="/etc/containerd/devgate-base-spec.json
/etc/devgate/config.json"

# The listing is read once into a variable: `dpkg-deb -c | grep -q` under pipefail fails
# when grep stops reading early and dpkg-deb dies of SIGPIPE.
deb_list=$(dpkg-deb -c "$deb")
deb_files=$(awk '{print $6}' <<<"$deb_list" | sed 's#^\.##')
for f in $files; do grep -qx "$f" <<<"$deb_files" || fail "$deb lacks $f"; done
ctl=$(mktemp -d); dpkg-deb -e "$deb" "$ctl"
[ "$(sort "$ctl/conffiles")" = "$confs" ] || fail "$deb conffiles: $(cat "$ctl/conffiles")"
rm -rf "$ctl"

if command -v rpm >/dev/null; then
    rpm_files=$(rpm -qpl "$rpm")
    for f in $files; do grep -qx "$f" <<<"$rpm_files" || fail "$rpm lacks $f"; done
    [ "$(rpm -qpc "$rpm" | sort)" = "$confs" ] || fail "$rpm config files: $(rpm -qpc "$rpm")"
else
    fail "rpm is not installed: scripts/install-test-deps.sh installs it (apt-get install rpm)"
fi

trap 'dpkg --purge devgate >/dev/null 2>&1 || true' EXIT
dpkg --purge devgate >/dev/null 2>&1 || true
dpkg -i "$deb"
[ -d /var/lib/devgate/quarantine ] || fail "postinst did not create /var/lib/devgate/quarantine"
[ -d /var/lib/devgate/log ] || fail "postinst did not create /var/lib/devgate/log"
/usr/bin/devgate version
[ -f /usr/bin/devgate-runtime ] && [ ! -L /usr/bin/devgate-runtime ] \
    || fail "no program /usr/bin/devgate-runtime"
/usr/bin/devgate-runtime features >/dev/null || fail "devgate-runtime features failed"
[ -f /usr/bin/devgate-hook ] && [ ! -L /usr/bin/devgate-hook ] || fail "no program /usr/bin/devgate-hook"
# The hook files run the front; every command it does not run itself goes to devgate.
[ "$(/usr/bin/devgate-hook version)" = "$(/usr/bin/devgate version)" ] || fail "devgate-hook version failed"
grep -q '"path": "/usr/bin/devgate-hook"' /usr/share/containers/oci/hooks.d/devgate.json \
    || fail "the installed hook file does not run /usr/bin/devgate-hook"
# The node agent ships, but nothing starts a cluster client unasked: its unit is not enabled.
[ -f /usr/bin/devgate-agent ] && [ -x /usr/bin/devgate-agent ] || fail "no program /usr/bin/devgate-agent"
! ls /etc/systemd/system/*.wants/devgate-agent.service >/dev/null 2>&1 \
    || fail "the package enabled devgate-agent.service"
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    [ "$(systemctl is-enabled devgate-agent.service 2>/dev/null || true)" != enabled ] \
        || fail "devgate-agent.service is enabled"
    ! systemctl is-active --quiet devgate-agent.service || fail "devgate-agent.service was started"
fi
DEVGATE_TEST_INSTALLED=1 cargo test --locked --test e2e_podman podman_with_installed_package_files \
    -- --exact --nocapture

# Upgrade (reinstall) keeps an operator's edited config; remove keeps it; purge removes it.
echo '{"policy":{"default":"warn"}}' > /etc/devgate/config.json
dpkg -i --force-confold "$deb"
grep -q '"warn"' /etc/devgate/config.json || fail "reinstall replaced the edited config"
dpkg -r devgate
[ ! -e /usr/bin/devgate ] || fail "remove left /usr/bin/devgate"
[ ! -e /usr/bin/devgate-runtime ] || fail "remove left /usr/bin/devgate-runtime"
[ ! -e /usr/bin/devgate-hook ] || fail "remove left /usr/bin/devgate-hook"
[ ! -e /usr/bin/devgate-agent ] || fail "remove left /usr/bin/devgate-agent"
[ ! -e /usr/lib/systemd/system/devgate-agent.service ] || fail "remove left devgate-agent.service"
[ ! -e /usr/share/containers/oci/hooks.d/devgate.json ] || fail "remove left the hooks"
grep -q '"warn"' /etc/devgate/config.json || fail "remove did not keep the config"
dpkg --purge devgate
[ ! -e /etc/devgate/config.json ] || fail "purge left /etc/devgate/config.json"
[ ! -e /var/lib/devgate ] || fail "purge left /var/lib/devgate"
echo "check-packages: ok ($deb, $rpm)"
