#!/usr/bin/env bash
# pages_compare.sh: issue 10's FreeKV GPU check in one device call (about 3 min on an H100):
# build, the FreeKV and Quest GPU tests on the pipelined group-mean selection
# (kernels/pages_pipe.cu), `kvbench bench` for freekv and quest, the same
# freekv bench on the older path (KVBENCH_PAGES_PIPE=0, kernels/pages_mean.cu)
# with 128- and 512-page scan tiles (KVBENCH_PAGES_PPT=1, 4) and without
# programmatic dependent launch (KVBENCH_PAGES_PDL=0) at 1M, the PyTorch
# peers, the GPU tests on the older path, and an ncu pass over the selection's
# kernels at 1M tokens. Logs and CSVs under $OUT; the key lines on stdout.
#   OUT=/tmp/out scripts/pages_compare.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvbench-pages}
mkdir -p "$OUT"
T0=$SECONDS
step() { echo "== [$((SECONDS - T0))s] $*"; }
L=16384,131072,1048576
step build
make -j16 kvbench tests/run_tests >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
export KVBENCH_BIN=$PWD/kvbench
step "GPU tests (pipelined path)"
KVBENCH_REQUIRE_GPU=1 timeout 60 ./tests/run_tests freekv_gpu_cosine_flags freekv_gpu_matches_cpu \
    freekv_gpu_group_mean_pages quest_gpu_summaries_match_cpu quest_gpu_retriever_matches_cpu >"$OUT/tests_pipe.log" 2>&1
tail -7 "$OUT/tests_pipe.log"
step "bench freekv,quest (pipelined path)"
timeout 60 ./kvbench bench --method freekv,quest --tokens $L --csv "$OUT/bench_pipe.csv" >"$OUT/bench_pipe.log" 2>&1
grep -E "^(freekv|quest) |copy" "$OUT/bench_pipe.log" | cut -c1-120
step "bench freekv (older path, KVBENCH_PAGES_PIPE=0)"
KVBENCH_PAGES_PIPE=0 timeout 40 ./kvbench bench --method freekv --tokens $L --csv "$OUT/bench_old.csv" \
    >"$OUT/bench_old.log" 2>&1
grep -E "^freekv " "$OUT/bench_old.log" | cut -c1-120
for v in PPT=1 PPT=4 PDL=0; do
    step "bench freekv 1M, KVBENCH_PAGES_$v"
    env KVBENCH_PAGES_$v timeout 30 ./kvbench bench --method freekv --tokens 1048576 --csv "$OUT/bench_$v.csv" \
        >"$OUT/bench_$v.log" 2>&1
    grep -E "bound_scan|pool_topk|select_spec" "$OUT/bench_$v.log" | cut -c1-120
done
for m in freekv quest; do
    step "PyTorch peer $m"
    PYTHONUNBUFFERED=1 timeout 60 python3 scripts/torch_ref/$m.py --tokens $L --csv "$OUT/torch_$m.csv" \
        >"$OUT/torch_$m.log" 2>&1
    grep -E "^$m |copy" "$OUT/torch_$m.log" | cut -c1-120
done
step "GPU tests (older path)"
KVBENCH_PAGES_PIPE=0 KVBENCH_REQUIRE_GPU=1 timeout 40 ./tests/run_tests freekv_gpu_matches_cpu \
    freekv_gpu_group_mean_pages >"$OUT/tests_old.log" 2>&1
tail -3 "$OUT/tests_old.log"
step "ncu: the selection's kernels at 1M (one repetition per stage)"
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
    -k regex:"p2_|freekv_test" --launch-count 9 ./kvbench bench --method freekv --tokens 1048576 --reps 1 --warmup 0 \
    >"$OUT/ncu.log" 2>&1
grep -E "p2_|freekv_test|duration|dram__|warps_active|grid_size|registers" "$OUT/ncu.log" | cut -c1-120 | head -80
step done
