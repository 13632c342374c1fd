#!/bin/bash
# s4-fk device run (untracked helper script; not part of the branch)
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el build; make -j16 kvbench tests/run_tests >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
export KVBENCH_BIN=$PWD/kvbench
el tests_new
KVBENCH_REQUIRE_GPU=1 timeout 50 ./tests/run_tests freekv_gpu_cosine_flags freekv_gpu_matches_cpu freekv_gpu_group_mean_pages quest_gpu_summaries_match_cpu quest_gpu_retriever_matches_cpu >$OUT/tests_new.log 2>&1; tail -7 $OUT/tests_new.log
el bench_new
timeout 35 ./kvbench bench --method freekv,quest --tokens 16384,131072,1048576 --csv $OUT/bench_new.csv >$OUT/bench_new.log 2>&1; grep -E "^(freekv|quest) " $OUT/bench_new.log | cut -c1-110
el bench_old
KVBENCH_PAGES_PIPE=0 timeout 25 ./kvbench bench --method freekv --tokens 16384,131072,1048576 --csv $OUT/bench_old.csv >$OUT/bench_old.log 2>&1; grep -E "^freekv " $OUT/bench_old.log | cut -c1-110
for p in 1 4; do el ppt$p; KVBENCH_PAGES_PPT=$p timeout 15 ./kvbench bench --method freekv --tokens 1048576 --csv $OUT/bench_ppt$p.csv >$OUT/bench_ppt$p.log 2>&1; grep -E "bound_scan|select_spec" $OUT/bench_ppt$p.log | cut -c1-110; done
el torch
PYTHONUNBUFFERED=1 timeout 35 python3 scripts/torch_ref/freekv.py --tokens 16384,131072,1048576 --csv $OUT/torch_freekv.csv >$OUT/torch_freekv.log 2>&1; tail -12 $OUT/torch_freekv.log | cut -c1-110
PYTHONUNBUFFERED=1 timeout 35 python3 scripts/torch_ref/quest.py --tokens 16384,131072,1048576 --csv $OUT/torch_quest.csv >$OUT/torch_quest.log 2>&1; tail -14 $OUT/torch_quest.log | cut -c1-110
el tests_old
KVBENCH_PAGES_PIPE=0 KVBENCH_REQUIRE_GPU=1 timeout 25 ./tests/run_tests freekv_gpu_matches_cpu freekv_gpu_group_mean_pages >$OUT/tests_old.log 2>&1; tail -3 $OUT/tests_old.log
el ncu
timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread -k regex:"p2_|freekv_test" --launch-count 9 ./kvbench bench --method freekv --tokens 1048576 --reps 1 --warmup 0 >$OUT/ncu.log 2>&1; grep -E "p2_|freekv_test|duration|dram__|warps_active|grid_size|registers" $OUT/ncu.log | cut -c1-120 | head -80
el done
