# devgate — build, test, demo, bench, install.
PREFIX  ?= /usr/local
DESTDIR ?=
CARGO   ?= cargo
BIN      = target/release/devgate

.PHONY: all build test demo bench install uninstall deb rpm clean lint

all: build

build:
	$(CARGO) build --release --locked

# Every test: unit tests, and the end-to-end tests under the real runtimes (root).
test:
	$(CARGO) test --locked -- --test-threads=4

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --locked -- -D warnings

# The main job on a fresh machine: healthy start, cordon, rejected start, uncordon.
demo: build
	./scripts/demo.sh $(BIN)

bench:
	$(CARGO) bench --locked --bench prestart

clean:
	$(CARGO) clean
