#!/usr/bin/env bash
# Model-checks the in-memory store's lock-free UUID table under loom: every
# interleaving of a reader racing an insert, a removal and a table
# replacement (babel-idem/src/store/memory/loom.rs). Prints how many
# interleavings loom explored, per test and in total.
#
# `--cfg loom` changes how every crate compiles, so this build keeps its own
# target directory and does not invalidate the main one. Only the memory
# store is under test, so no backend feature is compiled (and must not be:
# sqlx's event-listener does not build under `--cfg loom` without loom).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-$PWD/target/loom}"
export RUSTFLAGS="--cfg loom"
# Bounded at 4 preemptions per execution, which keeps the run short; the
# store-level replacement model is too large to explore unbounded in CI.
# Set LOOM_MAX_PREEMPTIONS to explore further.
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-4}"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test -p babel-idem --no-default-features --release --lib loom -- --nocapture --test-threads=1 \
    2>&1 | tee "$log"

grep -o 'loom: .* interleavings explored' "$log" | awk -F'[:]' '{ sub(/ interleavings explored/, "", $3); total += $3 } END {
    if (NR == 0) { print "loom: no model ran"; exit 1 }
    printf "loom: %d tests, %d interleavings explored in total\n", NR, total
}'
