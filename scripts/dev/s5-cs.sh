#!/usr/bin/env bash
# s5-cs.sh: CSAttention's decode search on the device (issue 9, point 4): the GPU-equals-CPU tests, the bench
# rows at 16K/128K/1M for the default pipelined tiles (8-slot row bound) and the previous single bound
# (KVBENCH_CS_SLOTS=1; the staged tiles are in scripts/device_check.sh), the variant sweep at 1M (KVBENCH_CS_SWEEP=1: every tile/ring/bound knob timed against the dense path), and with NCU=1 an ncu
# source-level profile of cs_pipe and cs_merge at 1M (per-SASS-line instruction counts: the hot spots). Logs to
# $OUT/s5-cs/; a short summary last. Assumes ./kvbench and tests/run_tests are built (H100).
set -u
D="${OUT:-/tmp/out}/s5-cs"; mkdir -p "$D"
T=16384,131072,1048576
KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench timeout 120 ./tests/run_tests \
    $(./tests/run_tests --list | grep csattention) >"$D/tests.log" 2>&1; echo "tests rc=$?" >>"$D/tests.log"
timeout 120 ./kvbench bench --method csattention --tokens $T --csv "$D/bench_new.csv" >"$D/bench_new.log" 2>&1
KVBENCH_CS_SLOTS=1 timeout 60 ./kvbench bench --method csattention --tokens $T --csv "$D/bench_slots1.csv" \
    >"$D/bench_slots1.log" 2>&1
KVBENCH_CS_SWEEP=1 timeout 90 ./kvbench bench --method csattention --tokens 1048576 --reps 5 >"$D/sweep.log" 2>&1
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then # NCU=1: off by default (wall time)
    timeout 200 ncu --clock-control none --section SourceCounters --section SpeedOfLight --page source --csv \
        -k regex:'cs_pipe|cs_merge' --launch-count 2 ./kvbench bench --method csattention --tokens 1048576 \
        --reps 1 --warmup 0 >"$D/ncu-src.csv" 2>"$D/ncu.err"
fi
{
    echo "== s5-cs summary ($(git rev-parse --short HEAD 2>/dev/null)) =="
    tail -n 3 "$D/tests.log"
    for f in new slots1; do echo "-- bench $f (search rows):"; grep -E "  search  " "$D/bench_$f.log" | head -n 3; done
    echo "-- sweep (1M):"; grep -E "cs sweep|difference" "$D/sweep.log" | cut -c1-160 | tail -n 6
    echo "-- ncu: $(wc -l <"$D/ncu-src.csv" 2>/dev/null) lines in ncu-src.csv"
} | head -n 25
