#!/usr/bin/env bash
# Runs every fuzz target under fuzz/ for FUZZ_SECONDS seconds each (default 60), starting
# from the checked-in seeds (fuzz/seeds/<target>/) and what earlier runs kept
# (fuzz/corpus/<target>/, not checked in). Stops at the first crash or hang; libFuzzer
# leaves the input under fuzz/artifacts/<target>/. docs/development.md, "Fuzzing".
#
# cargo-fuzz needs nightly-only flags (-Zsanitizer=address, sanitizer coverage); on the
# stable toolchain RUSTC_BOOTSTRAP=1 lets rustc accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${FUZZ_SECONDS:-60}
export RUSTC_BOOTSTRAP=1
# Fuzz builds use other flags than devgate's own: keep them out of its target dir.
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}}
[ -n "$CARGO_TARGET_DIR" ] || unset CARGO_TARGET_DIR
targets=${FUZZ_TARGETS:-$(cargo fuzz list)}
cargo fuzz build -O
for t in $targets; do
    # A target without checked-in seeds starts from nothing rather than failing.
    mkdir -p "corpus/$t" "seeds/$t"
    echo "== fuzz $t for ${seconds}s"
    # -timeout: one input taking longer is a hang; -rss_limit_mb: a bounded-memory check.
    cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
