# devgate — build, test, demo, bench, install.
PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
DESTDIR    ?=
CARGO      ?= cargo
# cargo builds under CARGO_TARGET_DIR when it is set, else ./target.
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
BIN         = $(TARGET_DIR)/release/devgate

BINDIR      = $(PREFIX)/bin
HOOKSDIR    = $(PREFIX)/share/containers/oci/hooks.d
CONFIG      = $(SYSCONFDIR)/devgate/config.json
BASESPEC    = $(SYSCONFDIR)/containerd/devgate-base-spec.json
STATEDIR    = /var/lib/devgate/quarantine
# devgate reads /etc/devgate/config.json by default; any other place is named in the hooks.
CONFIG_ARG  = $(if $(filter /etc,$(SYSCONFDIR)),,--config $(CONFIG))
GEN        ?= target/install

.PHONY: all build test test-forky test-deps test-k8s k8s-binaries demo bench bench-kmsg bench-nvml bench-remap bench-wrapper bench-state bench-pcie install uninstall deb rpm clean lint fuzz bench-gate

all: build

# The hook's programs, then the node agent (agent/, docs/cluster.md) in a cargo run of its
# own: one run for both would unify the two crates' dependency features, and the hook
# would be built with whatever the agent's Kubernetes client turns on. (Until the agent's
# crate is in the tree, only the first.)
build:
	$(CARGO) build --release --locked
	$(build-agent)

build-agent = $(if $(wildcard agent/Cargo.toml),$(CARGO) build --release --locked -p devgate-agent)

# Every test: unit tests, and the end-to-end tests under the real runtimes (root), then
# the end-to-end tests again on the 2026 stack (Debian forky: containerd 2, runc 1.3,
# crun 1.2x, podman 5), and a boot of that image under systemd (docs/development.md). On a
# fresh Debian/Ubuntu machine it first installs the runtimes and tools the tests use.
test: test-deps k8s-binaries
	$(CARGO) build --locked -p devgate-agent
	$(CARGO) test --locked -p devgate-agent
	$(CARGO) test --locked -- --test-threads=4
	$(MAKE) test-forky

# The real node's Kubernetes binaries, both releases under tests/k8s (scripts/k8s-binaries.sh):
# built once per pin under /var/cache/devgate-tests/k8s (minutes), found at once after.
k8s-binaries:
	./scripts/k8s-binaries.sh build all

# Only the real-node tests (tests/e2e_kubelet.rs, e2e_dra.rs, e2e_cluster.rs), on this machine's runtimes, then on forky's.
# DEVGATE_K8S_KEEP=1 leaves each node up and prints how to reach it (docs/development.md).
test-k8s: test-deps k8s-binaries
	$(CARGO) build --locked -p devgate-agent
	$(CARGO) test --locked --test e2e_kubelet --test e2e_dra --test e2e_cluster -- --nocapture
	./scripts/forky-stack.sh test $$($(CARGO) test --locked --no-run --message-format=json --test e2e_kubelet --test e2e_dra --test e2e_cluster 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep /deps/e2e_)

# The e2e suite inside the forky image (scripts/forky-stack.sh; built once per package
# versions under /var/cache/devgate-tests), and systemd 262 booting it as PID 1.
test-forky:
	./scripts/forky-stack.sh all

test-deps:
	./scripts/install-test-deps.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# Every fuzz target under fuzz/ for FUZZ_SECONDS each; needs cargo-fuzz (docs/development.md).
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./scripts/fuzz.sh

# The whole story on a machine without a GPU (root): an XID rejects a start, remap moves
# the container to a spare, a fault during a run becomes its exit reason.
demo: build
	./scripts/demo.sh $(BIN) $(TARGET_DIR)

bench:
	$(CARGO) bench --locked --bench prestart

# The kernel log scan: 60,000 records from a file and the node's /dev/kmsg (root), each
# beside its read-only floor (benches/kmsg.rs; KMSG_INJECT=N adds N user-facility lines).
bench-kmsg:
	$(CARGO) bench --locked --bench kmsg

# Time a remap adds to `runc run` (root).
bench-remap: build
	./benches/remap.sh $(BIN)

# Time the runtime wrapper adds to `runc run` of a container with no devices (root).
bench-wrapper: build
	./benches/wrapper.sh $(BIN)
# The issue-9 gate: runc run and the standalone prestart, devgate vs /bin/true hooks,
# interleaved in random order, with callgrind instruction counts and the hooks' lifetimes
# inside runc from a perf sched trace (benches/gate.sh). The hooks are what the hook files
# run, the static front devgate-hook beside $(BIN); HOOK_BIN=path runs another program.
bench-gate: build
	HOOK_BIN=$(or $(HOOK_BIN),$(dir $(BIN))devgate-hook) ./benches/gate.sh $(BIN)

# 8 GPUs on the fake NVML, with and without the NVML/XID step (root).
bench-nvml: build
	./benches/nvml.sh $(BIN)

# 8 GPUs with and without the pcie probe's sysfs reads and baselines (benches/pcie.sh);
# BASE=path/to/older/devgate measures that build beside this one in the same run.
bench-pcie: build
	./benches/pcie.sh $(BIN) $(or $(RUNS),200) $(BASE)

# status, check and metrics with 10,000 start and 10,000 exit records on disk (root).
bench-state: build
	./benches/state.sh $(BIN)

# A config file is installed only where none exists; one that differs (the operator's) is
# kept and the new version is put beside it as FILE.new.
define install-conf
	@if [ ! -e "$(2)" ]; then install -D -m 0644 "$(1)" "$(2)" && echo "installed $(2)"; \
	elif cmp -s "$(1)" "$(2)"; then echo "unchanged $(2)"; \
	else install -m 0644 "$(1)" "$(2).new" && echo "kept $(2); the new default is $(2).new"; fi
endef

# BIN=path installs an already built binary (tests do); otherwise the release build.
install:
ifeq ($(origin BIN),file)
	$(CARGO) build --release --locked
	$(build-agent)
endif
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(BIN) $(CONFIG_ARG) hooks-config --runtime podman --prefix $(PREFIX) --out $(GEN)/hooks.d
	$(BIN) $(CONFIG_ARG) hooks-config --runtime containerd --prefix $(PREFIX) --out $(GEN)
	install -D -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/devgate
	@# the runtime wrapper: the static program beside BIN, else a link (devgate runs the
	@# same wrapper when started by that name)
	if [ -f $(dir $(BIN))devgate-runtime ]; then \
		install -m 0755 $(dir $(BIN))devgate-runtime $(DESTDIR)$(BINDIR)/devgate-runtime; \
	else ln -sfn devgate $(DESTDIR)$(BINDIR)/devgate-runtime; fi
	@# the hook front the hook files run: the static program beside BIN, else a link
	if [ -f $(dir $(BIN))devgate-hook ]; then \
		install -m 0755 $(dir $(BIN))devgate-hook $(DESTDIR)$(BINDIR)/devgate-hook; \
	else ln -sfn devgate $(DESTDIR)$(BINDIR)/devgate-hook; fi
	@# the node agent, where it was built beside BIN (docs/cluster.md); never started here
	if [ -f $(dir $(BIN))devgate-agent ]; then \
		install -m 0755 $(dir $(BIN))devgate-agent $(DESTDIR)$(BINDIR)/devgate-agent; fi
	install -d -m 0755 $(DESTDIR)$(HOOKSDIR)
	install -m 0644 $(GEN)/hooks.d/devgate.json $(DESTDIR)$(HOOKSDIR)/
	$(call install-conf,packaging/config.json,$(DESTDIR)$(CONFIG))
	$(call install-conf,$(GEN)/devgate-base-spec.json,$(DESTDIR)$(BASESPEC))
	install -d -m 0755 $(DESTDIR)$(STATEDIR)

# Leaves the config, the containerd base spec if changed, and the quarantine ledger.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/devgate $(DESTDIR)$(BINDIR)/devgate-runtime $(DESTDIR)$(BINDIR)/devgate-hook
	rm -f $(DESTDIR)$(BINDIR)/devgate-agent
	rm -f $(DESTDIR)$(HOOKSDIR)/devgate.json
	@if [ -e $(GEN)/devgate-base-spec.json ] && cmp -s $(GEN)/devgate-base-spec.json $(DESTDIR)$(BASESPEC); then \
		rm -f $(DESTDIR)$(BASESPEC); else [ ! -e $(DESTDIR)$(BASESPEC) ] || echo "kept $(DESTDIR)$(BASESPEC)"; fi
	@echo "kept $(DESTDIR)$(CONFIG) and $(DESTDIR)$(STATEDIR) (operator data)"

# Packages land under target/: target/debian/*.deb, target/generate-rpm/*.rpm.
# Without its packager each stops with one line saying how to install it.
need-packager = $(if $(shell $(CARGO) $(1) --version 2>/dev/null),,$(error $(2) is not installed; install it with: cargo install --locked $(2)@$(3)))

deb:
	$(call need-packager,deb,cargo-deb,3.8.0)
	$(build-agent)
	$(CARGO) deb --locked

rpm:
	$(call need-packager,generate-rpm,cargo-generate-rpm,0.21.1)
	$(CARGO) build --release --locked
	$(build-agent)
	$(CARGO) generate-rpm

clean:
	$(CARGO) clean
