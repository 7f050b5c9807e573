#!/usr/bin/env bash
# The guard's three paths beside the Go SDK's `idempotency.Wrap` + its
# `InMemoryStore`, measured in one run on the machine that runs it, printed side by side.
#
#   BABEL_IDEM_GO_SDK=/path/to/babelqueue-go bash benches/go_side_by_side.sh
#
# Paths (both sides: 100,000 envelopes made by the SDK's own constructor,
# or BABEL_IDEM_GUARD_IDS of them, and a handler that reads only the last
# byte of the message id):
#   bare handler call          the handler alone, cycling over the 100,000
#   duplicate                  the guard over a store holding those 100,000 ids
#   first delivery             1,000,000 fresh UUID ids into a new store
# Within one process each side times 12 slices of 1,000,000 deliveries of
# the bare call and of the duplicate, and 5 slices of the first delivery
# (1,000,000 fresh ids into a new store each), every slice through a func
# value (Go) or a `&dyn Fn` (benches/guard.rs), and followed by a probe: a
# few milliseconds of independent adds, whose rate falls while another
# hardware thread shares the core, which slows both sides' duplicates too.
# The duplicate path over 100,000 ids also reads memory beyond the caches,
# and its cost moves from one process to the next, so the two sides run in
# alternating rounds, fresh processes each (BABEL_IDEM_SIDE_BY_SIDE_ROUNDS,
# default 3): a line per round, then two tables over every slice of every
# round: the medians of the slices whose probe ran at 90% or more of that
# side's full rate (the core was the process's own), and the medians of
# all slices.
#
# Both sides first run the duplicate path for BABEL_IDEM_GUARD_WARMUP_SECS
# (default 8) in the process that then times it, so that neither side is
# timed cold while the other is warm.
#
# Both sides run pinned to one CPU (BABEL_IDEM_SIDE_BY_SIDE_CPU, default 0;
# `none` leaves them unpinned), so that CPUs of different speeds do not
# favour one side.
#
# The Go benchmark is written to a temporary directory outside the repo and
# deleted afterwards; no Go SDK code is copied. Not part of CI: without `go`
# or the SDK it says what is missing and exits 0.
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
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	babelqueue "github.com/babelqueue/babelqueue-go"
	"github.com/babelqueue/babelqueue-go/idempotency"
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
		fresh = envelopes(deliveries)
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

const (
	deliveries          = 1000000
	comparisonSlices    = 12
	firstDeliverySlices = 5
)

var probeSink uint64

// coreWidthProbe mirrors core_width_probe in benches/guard.rs: fixed work
// that keeps the core's execution units busy, in operations per ns. It
// slows down while another hardware thread shares the core.
func coreWidthProbe() float64 {
	const steps = 2000000
	lanes := [8]uint64{1, 2, 3, 4, 5, 6, 7, 8}
	start := time.Now()
	for step := uint64(0); step < steps; step++ {
		for i := range lanes {
			lanes[i] = (lanes[i] + step) ^ (lanes[i] >> 3)
		}
	}
	elapsed := time.Since(start)
	for _, lane := range lanes {
		probeSink ^= lane
	}
	return float64(steps*8*3) / float64(elapsed.Nanoseconds())
}

// probedSlices times count slices of body (ns per delivery), each followed
// by the probe, in the layout benches/guard.rs prints: ns@width.
func probedSlices(count int, body func() time.Duration) string {
	out := make([]string, 0, count)
	for s := 0; s < count; s++ {
		ns := float64(body().Nanoseconds()) / deliveries
		out = append(out, fmt.Sprintf("%.2f@%.2f", ns, coreWidthProbe()))
	}
	return strings.Join(out, " ")
}

// overWorkingSet delivers the working set in turn to h, called through a
// func value (as Wrap calls the handler).
func overWorkingSet(h babelqueue.Handler) string {
	ctx := context.Background()
	return probedSlices(comparisonSlices, func() time.Duration {
		start := time.Now()
		for i := 0; i < deliveries; i++ {
			_ = h(ctx, working[i%workingSet])
		}
		return time.Since(start)
	})
}

func TestSideBySide(t *testing.T) {
	prepare()
	bare := overWorkingSet(handler)
	duplicate := overWorkingSet(remembered)
	ctx := context.Background()
	first := probedSlices(firstDeliverySlices, func() time.Duration {
		h := idempotency.Wrap(idempotency.NewInMemoryStore(), handler)
		start := time.Now()
		for _, env := range fresh {
			_ = h(ctx, env)
		}
		return time.Since(start)
	})
	fmt.Printf("Go comparison, ns per delivery @ the core-width probe after it, slice by slice:\n")
	fmt.Printf("  bare handler call  %s\n  duplicate  %s\n  first delivery  %s\n\n", bare, duplicate, first)
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
    echo "go_side_by_side: cannot pin to CPU $cpu (BABEL_IDEM_SIDE_BY_SIDE_CPU); it has $(nproc)"
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

# Each side's block of slices ("  label  ns@width ns@width ..." lines under
# a "Go comparison" heading), as "path ns width" lines; path is bare,
# duplicate or first.
slices() {
    sed -n '/^Go comparison/,/^$/p' | awk -F'  +' '
        $2 == "bare handler call" { path = "bare" }
        $2 == "duplicate" { path = "duplicate" }
        $2 == "first delivery" { path = "first" }
        path != "" && $3 != "" {
            n = split($3, slice, " ")
            for (i = 1; i <= n; i++) { split(slice[i], part, "@"); print path, part[1], part[2] }
            path = ""
        }'
}
# The median of the figures on stdin, one per line.
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
# The median ns of one path's slices on stdin.
median_of() {
    awk -v path="$1" '$1 == path { print $2 }' | median
}

for round in $(seq 1 "$rounds"); do
    go_out=$(cd "$work" && "${pinned[@]}" "$work/side_by_side.test" -test.run '^TestSideBySide$' 2>&1) || {
        echo "$go_out"
        echo "go_side_by_side: the Go benchmark failed"
        exit 1
    }
    rust_out=$(cd "$repo" && "${pinned[@]}" cargo bench --bench guard -- 'delivery/(bare handler call|duplicate, &InMemoryStore)$' 2>&1) || {
        echo "$rust_out"
        echo "go_side_by_side: cargo bench --bench guard failed"
        exit 1
    }
    echo "$go_out" | slices >"$work/go_round"
    echo "$rust_out" | slices >"$work/rust_round"
    for side in go rust; do
        for path in bare duplicate first; do
            if [[ -z $(median_of "$path" <"$work/${side}_round") ]]; then
                [[ $side == go ]] && echo "$go_out" || echo "$rust_out"
                echo "go_side_by_side: round $round: no $path slices from the $side side in the output above"
                exit 1
            fi
        done
        cat "$work/${side}_round" >>"$work/${side}_slices"
    done
    echo "== round $round ($(date -u +%H:%M:%S) UTC), medians of its slices, ns per delivery:" \
        "Go bare $(median_of bare <"$work/go_round"), duplicate $(median_of duplicate <"$work/go_round"), first $(median_of first <"$work/go_round");" \
        "babel-idem bare $(median_of bare <"$work/rust_round"), duplicate $(median_of duplicate <"$work/rust_round"), first $(median_of first <"$work/rust_round")"
done
echo "== load after the run: $(uptime)"

# Two tables from every slice of every round: the medians over the slices
# taken while the core was the process's own (its probe at least 90% of
# that side's full rate, the 90th percentile of its probes over the run),
# and the medians over all slices.
#
# A slice timed while another hardware thread shared the core is slower on
# both sides; the first table sets beside each other only slices for which
# each side had the core to itself.
#
# Portable awk (mawk has no sort of its own): sorting is left to sort.
for side in go rust; do
    full=$(awk '{ print $3 }' "$work/${side}_slices" | sort -g |
        awk '{ v[NR] = $1 } END { print v[int(0.9 * (NR - 1)) + 1] }')
    awk -v side="$side" -v full="$full" \
        '{ print side, $1, $2, ($3 >= 0.9 * full ? "quiet" : "shared") }' "$work/${side}_slices"
done >"$work/classified"
for side in go rust; do
    awk -v side="$side" '$1 == side { n++; if ($4 == "quiet") q++ }
        END { printf "== %s: %d of %d slices with the core its own\n", side == "go" ? "Go" : "babel-idem", q, n }' "$work/classified"
done

# One table: the medians of the slices that $1 (quiet or all) takes.
table() {
    local which=$1 side path figures="" counts=""
    for side in go rust; do
        for path in bare duplicate first; do
            local taken
            taken=$(awk -v which="$which" -v side="$side" -v path="$path" \
                '$1 == side && $2 == path && (which == "all" || $4 == "quiet") { print $3 }' "$work/classified")
            local count
            count=$(printf '%s' "$taken" | grep -c . || true)
            if ((count < 3)); then
                echo "(too few slices for this table: $count of the $side side's $path)"
                return
            fi
            figures+=" $(printf '%s\n' "$taken" | median)"
            counts+=" $count"
        done
    done
    # shellcheck disable=SC2086 # figures and counts are lists of numbers
    echo $figures $counts | awk -v ids="$BABEL_IDEM_GUARD_IDS" '{
        gb = $1; gd = $2; gf = $3; rb = $4; rd = $5; rf = $6
        printf "| path (Go, babel-idem slices) | Go SDK Wrap + InMemoryStore | babel-idem guard + InMemoryStore | babel-idem / Go | Go over bare | babel-idem over bare | over-bare ratio |\n"
        printf "|---|---|---|---|---|---|---|\n"
        printf "| bare handler call (%d, %d) | %.1f ns | %.1f ns | %.2fx | | | |\n", $7, $10, gb, rb, rb / gb
        row("duplicate, " ids " remembered ids (" $8 ", " $11 ")", gd, rd)
        row("first delivery, fresh UUIDs (" $9 ", " $12 ")", gf, rf)
    }
    function row(label, g, r) {
        printf "| %s | %.1f ns | %.1f ns | %.2fx | %.1f ns | %.1f ns | %.2fx |\n", label, g, r, r / g, g - gb, r - rb, (r - rb) / (g - gb)
    }'
}

echo
echo "Medians over the slices taken while the core was the process's own:"
echo
table quiet
echo
echo "Medians over all slices of the $rounds rounds:"
echo
table all
