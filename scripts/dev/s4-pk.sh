#!/usr/bin/env bash
# scripts/dev/s4-pk.sh: issue 12 goal 4 on a GPU machine (ParisKV and PQCache search launches fused), for the
# lead's combined device call. Assumes ./kvbench and tests/run_tests are built in the repo root. Runs the
# ParisKV/PQCache GPU tests (fused path, then the unfused one via KVBENCH_PK_FUSED=0 KVBENCH_PQ_FUSED=0),
# `kvbench bench --method pariskv,pqcache,exact` at 16K/128K/1M (fused), the same for pariskv,pqcache
# unfused, the 8-bit-score variant (KVBENCH_PK_SCORE8=1: its test and bench rows), and the PyTorch peers
# with what time is left (their code is unchanged); logs in $OUT/s4-pk/, a short summary printed last. ~60 s.
set -u
cd "$(dirname "$0")/../.."
D=${OUT:-/tmp/out}/s4-pk
mkdir -p "$D"
T0=$SECONDS
left() { local l=$((${1} - (SECONDS - T0))); [ "$l" -lt 1 ] && l=1; echo "$l"; }
export KVBENCH_BIN=$PWD/kvbench KVBENCH_REQUIRE_GPU=1 KVBENCH_PK_FUSED=1 # the fused ParisKV path is opt-in (kernels/pariskv.cu)
TOK=16384,131072,1048576
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >"$D/device.txt" 2>&1
git log -1 --format='commit %H' >>"$D/device.txt" 2>/dev/null
timeout "$(left 16)" ./tests/run_tests pariskv_gpu_encode_matches_cpu pariskv_gpu_search_matches_cpu \
    pariskv_gpu_bucket_topk pariskv_gpu_retriever_matches_cpu pqcache_gpu_adc_matches_cpu \
    pqcache_gpu_retriever_matches_cpu pqcache_gpu_tuple_topk_matches_ref >"$D/tests.log" 2>&1
echo "tests rc=$?" >>"$D/tests.log"
timeout "$(left 38)" ./kvbench bench --method pariskv,pqcache,exact --tokens $TOK >"$D/bench.log" 2>&1
echo "bench rc=$?" >>"$D/bench.log"
KVBENCH_PK_FUSED=0 KVBENCH_PQ_FUSED=0 timeout "$(left 46)" ./kvbench bench --method pariskv,pqcache --tokens $TOK \
    --reps 20 --warmup 5 >"$D/bench_unfused.log" 2>&1
echo "bench rc=$?" >>"$D/bench_unfused.log"
# 8-bit collision scores (fused ParisKV, KVBENCH_PK_SCORE8=1): its test, then its bench rows
KVBENCH_PK_SCORE8=1 timeout "$(left 50)" ./tests/run_tests pariskv_gpu_search_matches_cpu >"$D/tests_score8.log" 2>&1
echo "tests rc=$?" >>"$D/tests_score8.log"
KVBENCH_PK_SCORE8=1 timeout "$(left 55)" ./kvbench bench --method pariskv --tokens $TOK --reps 20 --warmup 5 \
    >"$D/bench_score8.log" 2>&1
echo "bench rc=$?" >>"$D/bench_score8.log"
KVBENCH_PK_FUSED=0 KVBENCH_PQ_FUSED=0 timeout "$(left 58)" ./tests/run_tests pariskv_gpu_search_matches_cpu \
    pqcache_gpu_tuple_topk_matches_ref >"$D/tests_unfused.log" 2>&1
echo "tests rc=$?" >>"$D/tests_unfused.log"
for m in pariskv pqcache; do
    timeout "$(left 60)" python3 scripts/torch_ref/$m.py --tokens $TOK >"$D/torch_$m.log" 2>&1
    echo "torch rc=$?" >>"$D/torch_$m.log"
done
{
    echo "s4-pk ($((SECONDS - T0)) s): $(head -1 "$D/device.txt")"
    echo "tests fused: $(grep -cE ' ok ' "$D/tests.log") ok; $(grep -E 'passed|rc=' "$D/tests.log" | tr '\n' ' ')"
    echo "tests unfused: $(grep -E 'passed|rc=' "$D/tests_unfused.log" | tr '\n' ' ')"
    echo "tests score8: $(grep -E 'passed|rc=' "$D/tests_score8.log" | tr '\n' ' ')"
    echo "median us (method tokens stage): fused bench | unfused bench (--reps 20)"
    for t in 16384 131072 1048576; do
        a=$(awk -v t=$t '$2==t && (($1=="pariskv"||$1=="pqcache") && $3=="search" || $1=="exact" && $3=="exact") {printf "%s %s  ", $1, $4}' "$D/bench.log")
        b=$(awk -v t=$t '$2==t && $3=="search" {printf "%s %s  ", $1, $4}' "$D/bench_unfused.log")
        c=$(awk -v t=$t '$2==t && $3=="search" {printf "%s-s8 %s", $1, $4}' "$D/bench_score8.log")
        echo "  $t: $a| $b| $c"
    done
    for t in 16384 1048576; do
        echo "fused stages $t: $(awk -v t=$t '($1=="pariskv"||$1=="pqcache") && $2==t && $3!="encode" && $3!="kmeans" {printf "%s %s %s, ", $1, $3, $4}' "$D/bench.log")"
    done
    echo "torch search: $(grep -hE ' search ' "$D"/torch_*.log | awk '{printf "%s %s %s; ", $1, $2, $4}')"
} | tee "$D/summary.txt" | head -20
