#!/usr/bin/env bash
# A fresh clone passes its own tests: clones this checkout (its committed
# HEAD) into an empty temporary folder, with nothing beside it, and runs the
# README's `cargo test` there (every binary, even after a failure) with no
# server, no Python peer and no upstream conformance suite configured. Then checks, from the output, that every test
# binary ran (one `Running` line per test target `cargo metadata` lists) and
# that the suites which need what is not there said so with their skip lines.
#
# The clone builds in a target directory of its own, inside the temporary
# folder: a test binary keeps the path of the checkout it was built from
# (`env!("CARGO_MANIFEST_DIR")` finds the fixtures), and in a target
# directory shared with another checkout cargo reuses that checkout's binary
# whenever the clone's files are not newer than it, so the clone's tests
# would read another folder's files.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

scratch="$(mktemp -d)"
# Open to every user: the CLI's read-only test runs the built binary as
# `nobody` when the tests run as root.
chmod 755 "$scratch"
trap 'rm -rf "$scratch"' EXIT
clone="$scratch/babel-idem"
git clone --quiet "$root" "$clone"
log="$scratch/cargo-test.log"

cd "$clone"
echo "fresh clone: $clone (HEAD $(git rev-parse --short HEAD)), nothing beside it"
env -u BABEL_IDEM_REDIS_URL -u BABEL_IDEM_POSTGRES_URL -u BABEL_IDEM_AMQP_URL \
  -u BABEL_IDEM_REQUIRE_SERVERS -u BABEL_IDEM_PYTHON -u BABEL_IDEM_CONFORMANCE_DIR \
  CARGO_TARGET_DIR="$scratch/target" CARGO_TERM_COLOR=never \
  cargo test --no-fail-fast 2>&1 | tee "$log"

# The test binaries `cargo test` must run: each lib, proc-macro, bin and test
# target that has tests, by crate name.
expected="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        kinds = set(target["kind"]) & {"lib", "proc-macro", "bin", "test"}
        if kinds and target.get("test") and not target.get("required-features"):
            print(target["name"].replace("-", "_"))
' | sort)"
ran="$(sed -n -E 's/^ *Running .*\/deps\/([A-Za-z0-9_]+)-[0-9a-f]+\)$/\1/p' "$log" | sort)"
if [ "$ran" != "$expected" ]; then
  echo "fresh clone: the test binaries that ran are not the test targets:" >&2
  diff <(echo "$expected") <(echo "$ran") >&2 || true
  exit 1
fi
echo "fresh clone: all $(echo "$ran" | wc -l) test binaries ran"

# The part of the log each test binary printed.
section() {
  awk -v name="$1" '
    /^ *(Running|Doc-tests) / { inside = ($0 ~ ("/deps/" name "-[0-9a-f]+\\)$")) }
    inside
  ' "$log"
}
missing=0
expect_line() { # binary, fixed text
  if ! section "$1" | grep -q -F -- "$2"; then
    echo "fresh clone: $1 printed no line with: $2" >&2
    missing=1
  fi
}
for binary in conformance router_conformance store_memory store_sqlite envelope_python; do
  expect_line "$binary" "skipping upstream conformance: BABEL_IDEM_CONFORMANCE_DIR is unset"
done
expect_line envelope_python "BABEL_IDEM_PYTHON not set"
expect_line schema_parity "skipped: schema_parity: BABEL_IDEM_PYTHON is not set"
[ "$missing" = 0 ] || exit 1
echo "fresh clone: the suites without their servers, peer or upstream suite said so"
