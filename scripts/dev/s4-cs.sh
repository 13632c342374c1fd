#!/bin/bash
# scripts/dev/s4-cs.sh: the lead's combined GPU round for branch s4-cs (issue 9, point 4: CSAttention's
# pipelined tiled search, kernels/csattention_pipe.cuh). Assumes ./kvbench and tests/run_tests are built in
# the repo root. Runs the CSAttention GPU tests (every variant against the C reference), the bench at 16K,
# 128K and 1M with KVBENCH_CS_SWEEP=1 (every tiling timed and its top k checked against the dense path, on
# stderr) and the PyTorch peer; logs in $OUT/s4-cs/; a summary of at most 20 lines last. Wall: ~45-58 s.
# --summary-only: reprint the summary of logs already in $OUT/s4-cs/.
set -u
D=${OUT:-/tmp}/s4-cs
mkdir -p "$D"
export KVBENCH_BIN=$PWD/kvbench
t0=$(date +%s)
if [ "${1:-}" != --summary-only ]; then
    KVBENCH_REQUIRE_GPU=1 timeout 20 ./tests/run_tests csattention_gpu_matches_cpu csattention_gpu_dense_matches_cpu \
        csattention_gpu_sort_matches_cpu csattention_gpu_tiles_match_cpu csattention_gpu_tile_variants_match_cpu \
        csattention_gpu_kmeans_matches_cpu >"$D/tests.log" 2>&1
    echo "tests rc $?" >>"$D/tests.log"
    KVBENCH_CS_SWEEP=1 timeout 30 ./kvbench bench --method csattention --tokens 16384,131072,1048576 \
        --csv "$D/bench.csv" >"$D/bench.log" 2>"$D/sweep.log"
    echo "bench rc $?" >>"$D/bench.log"
    left=$((58 - ($(date +%s) - t0)))
    if [ "$left" -gt 5 ]; then
        timeout "$left" python3 scripts/torch_ref/csattention.py --tokens 16384,131072,1048576 \
            --csv "$D/torch.csv" >"$D/torch.log" 2>&1
        echo "torch rc $? (budget $left s)" >>"$D/torch.log"
    else
        echo "torch not run: $left s left of the 58" >"$D/torch.log"
    fi
fi
{
    echo "== s4-cs summary ($(($(date +%s) - t0)) s; logs in $D)"
    grep -E "^csattention_gpu|passed|rc " "$D/tests.log" | sed 's/  */ /g' | tr '\n' ';' | cut -c1-400
    awk '$1 == "csattention" && ($3 == "search" || ($2 == 1048576 && ($3 == "reduce_tiled" || $3 == "topk_tiled"))) {
        printf "kvbench %7s %-12s %8s us %6s\n", $2, $3, $4, $8 }' "$D/bench.log"
    grep -E "rc [1-9]" "$D/bench.log"
    echo "sweep lines that DIFFER from dense: $(grep -c DIFFERS "$D/sweep.log")"
    for n in 16384 131072 1048576; do
        echo "sweep $n best (= dense): $(grep "n=$n pipelined" "$D/sweep.log" | grep -v DIFFERS |
            sed 's/.*n=[0-9]* pipelined //; s/: tiles.*search \([0-9.]*\) us.*/ \1/' | sort -k6 -g | head -2 |
            tr '\n' ';')"
    done
    grep "n=1048576 staged" "$D/sweep.log" | sed 's/.*search \([0-9.]*\) us.*/sweep 1048576 staged: \1 us/'
    grep "n=1048576 pipelined tk=4096 th=512 ring=1024x4 bound=1 ranges=0" "$D/sweep.log" |
        sed 's/.*search \([0-9.]*\) us.*/sweep 1048576 default: \1 us/'
    awk '$1 == "csattention" && $3 == "search" { printf "torch   %7s search %8s us\n", $2, $4 }' "$D/torch.log"
    grep -E "rc [1-9]|not run" "$D/torch.log"
} | head -20
