#!/usr/bin/env bash
# The guard's three paths beside the Go SDK's `idempotency.Wrap` + its
# `InMemoryStore`, measured in one run on this machine, printed side by side.
#
#   BABEL_IDEM_GO_SDK=/path/to/babelqueue-go bash benches/go_side_by_side.sh
#
# Paths (both sides: 100,000 envelopes made by the SDK's own constructor,
# or BABEL_IDEM_GUARD_IDS of them, and a handler that reads only the last
# byte of the message id):
#   bare handler call          the handler alone, cycling over the 100,000
#   duplicate                  the guard over a store holding those 100,000 ids
#   first delivery             1,000,000 fresh UUID ids into a new store
# Within one process each figure is the median of 5 runs of 1,000,000
# deliveries (Go: `-benchtime 1000000x -count 5`; Rust: the same loop in
# benches/guard.rs). The duplicate path over 100,000 ids reads memory beyond
# the caches, and its cost moves by a third from one process to the next on
# either side (over the bare call, 72 to 165 ns for ours and 41 to 74 for
# Go's, on one machine in one session), so the two sides run in
# alternating rounds, fresh processes each (BABEL_IDEM_SIDE_BY_SIDE_ROUNDS,
# default 3): a row per round, then the medians over the rounds.
#
# Both sides first run the duplicate path for BABEL_IDEM_GUARD_WARMUP_SECS
# (default 8) in the process that then times it. A fresh process's
# duplicate at 100,000 ids took 62 to 130 ns on an Intel Xeon guest and
# fell to 47 to 52 after 8 seconds of running in 6 of 8 runs (Go's from
# about 69 to 60 over 6 seconds), where a sleep did not do it; without the warm-up the Rust side,
# timed after its criterion runs, was warm and the Go side was not.
#
# Both sides run pinned to one CPU (BABEL_IDEM_SIDE_BY_SIDE_CPU, default 0;
# `none` leaves them unpinned): on a machine whose CPUs run at different
# speeds, a process that the scheduler happened to place on the slower one
# was a third slower (seen on a 2-vCPU AMD EPYC guest), whichever side it was.
#
# The Go benchmark is written to a temporary directory outside the repo and
# deleted afterwards; no Go SDK code is copied. Not part of CI: without `go`
# or the SDK it says what is missing and exits 0.
#
# What it measured, machine by machine, and what was tried: go_side_by_side.md.
set -euo pipefail

get_it="get Go with 'apt-get install -y golang-go' and the SDK with 'git clone https://github.com/BabelQueue/babelqueue-go /path/to/babelqueue-go', then set BABEL_IDEM_GO_SDK=/path/to/babelqueue-go"
if ! command -v go >/dev/null 2>&1; then
    echo "go_side_by_side: skipped, 'go' is not on PATH ($get_it)"
    exit 0
fi
sdk=${BABEL_IDEM_GO_SDK:-}
if [[ -z $sdk || ! -f $sdk/idempotency/idempotency.go ]]; then
    echo "go_side_by_side: skipped, BABEL_IDEM_GO_SDK does not name a babelqueue-go checkout ($get_it)"
    exit 0
fi
sdk=$(cd "$sdk" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/babel-idem-go-side-by-side.XXXXXX")
trap 'rm -rf "$work"' EXIT

cat >"$work/go.mod" <<EOF
module babelidem.invalid/sidebyside

go 1.19

require github.com/babelqueue/babelqueue-go v0.0.0

replace github.com/babelqueue/babelqueue-go => $sdk
EOF

cat >"$work/side_by_side_test.go" <<'EOF'
package sidebyside

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	babelqueue "github.com/babelqueue/babelqueue-go"
	"github.com/babelqueue/babelqueue-go/idempotency"
)

const (
	freshIDs = 1000000
)

var sink byte

// workingSet is BABEL_IDEM_GUARD_IDS, which the script checked and set.
var workingSet, _ = strconv.Atoi(os.Getenv("BABEL_IDEM_GUARD_IDS"))

// warmUpSecs is BABEL_IDEM_GUARD_WARMUP_SECS, likewise: both sides run the
// duplicate path this long before their first timed run.
var warmUpSecs, _ = strconv.Atoi(os.Getenv("BABEL_IDEM_GUARD_WARMUP_SECS"))

// handler mirrors benches/guard.rs: it reads only the last byte of the id.
func handler(_ context.Context, env babelqueue.Envelope) error {
	sink = env.Meta.ID[len(env.Meta.ID)-1]
	return nil
}

func envelopes(n int) []babelqueue.Envelope {
	out := make([]babelqueue.Envelope, n)
	for i := range out {
		env, err := babelqueue.Make("urn:babel:orders:created", map[string]any{"order_id": 1})
		if err != nil {
			panic(err)
		}
		out[i] = env
	}
	return out
}

var (
	setup      sync.Once
	working    []babelqueue.Envelope
	fresh      []babelqueue.Envelope
	remembered babelqueue.Handler
)

func prepare() {
	setup.Do(func() {
		working = envelopes(workingSet)
		fresh = envelopes(freshIDs)
		remembered = idempotency.Wrap(idempotency.NewInMemoryStore(), handler)
		for _, env := range working {
			_ = remembered(context.Background(), env)
		}
		ctx := context.Background()
		for start := time.Now(); time.Since(start) < time.Duration(warmUpSecs)*time.Second; {
			for _, env := range working {
				_ = remembered(ctx, env)
			}
		}
	})
}

// overWorkingSet delivers the 100,000 in turn to h, called through a func
// value (as Wrap calls the handler).
func overWorkingSet(b *testing.B, h babelqueue.Handler) {
	prepare()
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = h(ctx, working[i%workingSet])
	}
}

func BenchmarkBare(b *testing.B) { overWorkingSet(b, handler) }

func BenchmarkDuplicate(b *testing.B) {
	prepare() // before `remembered` is read
	overWorkingSet(b, remembered)
}

func BenchmarkFirstDelivery(b *testing.B) {
	prepare()
	ctx := context.Background()
	var h babelqueue.Handler
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%freshIDs == 0 {
			b.StopTimer()
			h = idempotency.Wrap(idempotency.NewInMemoryStore(), handler)
			b.StartTimer()
		}
		_ = h(ctx, fresh[i%freshIDs])
	}
}
EOF

export BABEL_IDEM_GUARD_IDS=${BABEL_IDEM_GUARD_IDS:-100000}
if ! [[ $BABEL_IDEM_GUARD_IDS =~ ^[1-9][0-9]*$ ]]; then
    echo "go_side_by_side: BABEL_IDEM_GUARD_IDS must be a count of ids above 0, not '$BABEL_IDEM_GUARD_IDS'"
    exit 2
fi
rounds=${BABEL_IDEM_SIDE_BY_SIDE_ROUNDS:-3}
export BABEL_IDEM_GUARD_WARMUP_SECS=${BABEL_IDEM_GUARD_WARMUP_SECS:-8}
if ! [[ $BABEL_IDEM_GUARD_WARMUP_SECS =~ ^[0-9]+$ ]]; then
    echo "go_side_by_side: BABEL_IDEM_GUARD_WARMUP_SECS must be a whole number of seconds, not '$BABEL_IDEM_GUARD_WARMUP_SECS'"
    exit 2
fi
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "go_side_by_side: BABEL_IDEM_SIDE_BY_SIDE_ROUNDS must be a positive integer, not '$rounds'"
    exit 2
fi

cpu=${BABEL_IDEM_SIDE_BY_SIDE_CPU:-0}
pinned=()
if [[ $cpu == none ]]; then
    where="unpinned"
elif ! [[ $cpu =~ ^[0-9]+$ ]]; then
    echo "go_side_by_side: BABEL_IDEM_SIDE_BY_SIDE_CPU must be a CPU number or 'none', not '$cpu'"
    exit 2
elif ! command -v taskset >/dev/null 2>&1; then
    where="unpinned: no taskset (util-linux)"
elif ! taskset -c "$cpu" true 2>/dev/null; then
    echo "go_side_by_side: cannot pin to CPU $cpu (BABEL_IDEM_SIDE_BY_SIDE_CPU); this machine has $(nproc)"
    exit 2
else
    pinned=(taskset -c "$cpu")
    where="both pinned to CPU $cpu"
fi

echo "== load before the run: $(uptime)"
echo "== Go $(go version | awk '{print $3}'), SDK at $sdk ($(git -C "$sdk" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')); $rounds alternating rounds; $BABEL_IDEM_GUARD_IDS remembered ids; ${BABEL_IDEM_GUARD_WARMUP_SECS} s of warm-up on each side; $where"
# Built once, before the first round, so no round measures a compile.
(cd "$work" && GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local go test -c -o "$work/side_by_side.test" >/dev/null) || {
    echo "go_side_by_side: the Go benchmark did not build"
    exit 1
}
(cd "$repo" && cargo bench --bench guard --no-run >/dev/null 2>&1) || {
    echo "go_side_by_side: cargo bench --bench guard did not build"
    exit 1
}

# The median of the figures on stdin, one per line.
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
# The median of one Go benchmark's five ns/op figures in $go_out.
go_median() {
    echo "$go_out" | awk -v name="Benchmark$1" '$1 ~ "^"name"(-[0-9]+)?$" { print $3 }' | median
}
# A figure of the guard bench's "Go comparison" block in $rust_out.
rust_figure() {
    echo "$rust_out" | sed -n '/^Go comparison/,/^$/p' | awk -F'  +' -v label="$1" '$2 == label { print $3 }'
}

figures="go_bare go_dup go_first rs_bare rs_dup rs_first"
declare -A all
for round in $(seq 1 "$rounds"); do
    go_out=$(cd "$work" && "${pinned[@]}" "$work/side_by_side.test" -test.run '^$' -test.bench . \
        -test.benchtime 1000000x -test.count 5 2>&1) || {
        echo "$go_out"
        echo "go_side_by_side: the Go benchmark failed"
        exit 1
    }
    rust_out=$(cd "$repo" && "${pinned[@]}" cargo bench --bench guard -- 'delivery/(bare handler call|duplicate, &InMemoryStore)$' 2>&1) || {
        echo "$rust_out"
        echo "go_side_by_side: cargo bench --bench guard failed"
        exit 1
    }
    go_bare=$(go_median Bare)
    go_dup=$(go_median Duplicate)
    go_first=$(go_median FirstDelivery)
    rs_bare=$(rust_figure "bare handler call")
    rs_dup=$(rust_figure "duplicate")
    rs_first=$(rust_figure "first delivery")
    for figure in $figures; do
        if [[ -z ${!figure} ]]; then
            echo "$go_out"
            echo "$rust_out"
            echo "go_side_by_side: round $round: could not read $figure from the output above"
            exit 1
        fi
        all[$figure]+="${!figure}"$'\n'
    done
    echo "== round $round ($(date -u +%H:%M:%S) UTC), ns per delivery: Go bare $go_bare, duplicate $go_dup, first $go_first; babel-idem bare $rs_bare, duplicate $rs_dup, first $rs_first"
done
echo "== load after the run: $(uptime)"

for figure in $figures; do
    declare "$figure=$(printf '%s' "${all[$figure]}" | median)"
done

echo
echo "Medians over $rounds rounds:"
echo
awk -v gb="$go_bare" -v gd="$go_dup" -v gf="$go_first" \
    -v rb="$rs_bare" -v rd="$rs_dup" -v rf="$rs_first" -v ids="$BABEL_IDEM_GUARD_IDS" 'BEGIN {
    printf "| path | Go SDK Wrap + InMemoryStore | babel-idem guard + InMemoryStore | babel-idem / Go | Go over bare | babel-idem over bare | over-bare ratio |\n"
    printf "|---|---|---|---|---|---|---|\n"
    printf "| bare handler call | %.1f ns | %.1f ns | %.2fx | | | |\n", gb, rb, rb / gb
    row("duplicate, " ids " remembered ids", gd, rd)
    row("first delivery, fresh UUIDs", gf, rf)
}
function row(path, g, r) {
    printf "| %s | %.1f ns | %.1f ns | %.2fx | %.1f ns | %.1f ns | %.2fx |\n", path, g, r, r / g, g - gb, r - rb, (r - rb) / (g - gb)
}'
