#!/usr/bin/env bash
# test_run_traces.sh: scripts/run_traces.sh never returns a result of another
# configuration (issue 16, point 3). On a tiny synthetic trace: a repeated
# call skips; changing the method list, --k, a protocol option, or the trace
# file runs again and the CSV holds only the new configuration; every
# protocol option is a column with the value the run used. Run by the test
# runner (test run_traces_keyed_by_config) with KVBENCH_BIN and a scratch
# directory: tests/test_run_traces.sh SCRATCH_DIR. Exit 0 pass, 1 fail.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVBENCH_BIN:-$root/kvbench}
tmp=${1:?usage: test_run_traces.sh SCRATCH_DIR}
rt=$root/scripts/run_traces.sh
fail() { echo "    test_run_traces.sh: $*" >&2; exit 1; }
rm -rf "$tmp" && mkdir -p "$tmp/traces"
"$bin" synth --out "$tmp/traces/tiny.h5" --tokens 160 --prefill 120 --q-heads 4 --kv-heads 2 --dim 16 --seed 3 \
  >/dev/null 2>&1 || fail "kvbench synth failed"
export KVBENCH_BIN=$bin
run() { "$rt" --traces "$tmp/traces" --out "$tmp/out" "$@" 2>"$tmp/err" >"$tmp/log" || { cat "$tmp/err" >&2; fail "run_traces.sh $* failed"; }; }
col() { # col NAME: the set of values of column NAME in summary.csv, sorted, space-separated
  python3 -c "import csv,sys; print(' '.join(sorted({r[sys.argv[2]] for r in csv.DictReader(open(sys.argv[1]))})))" \
    "$tmp/out/summary.csv" "$1"
}
nrows() { python3 -c "import csv,sys; print(sum(1 for _ in csv.DictReader(open(sys.argv[1]))))" "$tmp/out/summary.csv"; }

run --method exact,streaming -- --device cpu --k 8 --local 8 --stride 4
grep -q '^run_traces.sh: 2 rows' "$tmp/log" || fail "first call: want 2 rows, log: $(cat "$tmp/log")"
[ "$(grep -c '^skip' "$tmp/log" || true)" = 0 ] || fail "first call skipped a run"
[ "$(col k) $(col local) $(col stride) $(col sink) $(col window) $(col seed)" = "8 8 4 4 128 0" ] \
  || fail "protocol columns: k=$(col k) local=$(col local) stride=$(col stride) sink=$(col sink) window=$(col window) seed=$(col seed)"
first=$(col run_dir)

run --method exact,streaming -- --device cpu --k 8 --local 8 --stride 4
grep -q '^skip .*same configuration' "$tmp/log" || fail "identical call did not skip: $(cat "$tmp/log")"
[ "$(col run_dir)" = "$first" ] || fail "identical call used another directory"

run --method exact,random -- --device cpu --k 8 --local 8 --stride 4
grep -q '^skip' "$tmp/log" && fail "a new method list was skipped (stale result)"
[ "$(col method)" = "exact random" ] || fail "new method list: CSV methods are '$(col method)', want 'exact random'"

run --method exact,random -- --device cpu --k 6 --local 8 --stride 4
grep -q '^skip' "$tmp/log" && fail "a new --k was skipped (stale result)"
[ "$(col k)" = 6 ] || fail "new --k: CSV k is '$(col k)', want 6"

run --method exact,random -- --device cpu --k 6 --local 8 --stride 4 --sink 2 --window 16 --seed 5
grep -q '^skip' "$tmp/log" && fail "new protocol options were skipped (stale result)"
[ "$(col sink) $(col window) $(col seed)" = "2 16 5" ] || fail "sink/window/seed columns: $(col sink) $(col window) $(col seed)"
[ "$(nrows)" = 2 ] || fail "CSV of one configuration has $(nrows) rows, want 2"

touch -d '2001-01-01' "$tmp/traces/tiny.h5" # the same name, another file as far as the key knows
run --method exact,random -- --device cpu --k 6 --local 8 --stride 4 --sink 2 --window 16 --seed 5
grep -q '^skip' "$tmp/log" && fail "a changed trace file was skipped (stale result)"

run --method exact,random --force -- --device cpu --k 6 --local 8 --stride 4 --sink 2 --window 16 --seed 5
grep -q '^skip' "$tmp/log" && fail "--force skipped a run"
n=$(ls -d "$tmp"/out/tiny-L0-* | wc -l)
[ "$n" = 5 ] || fail "want 5 keyed run directories (one per configuration), found $n"
exit 0
