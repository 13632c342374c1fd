#!/usr/bin/env bash
# profile_kernels.sh: a per-kernel breakdown of `kvbench bench` under Nsight
# Compute (ncu), for finding where a method's search time goes: each launch's
# duration, DRAM bytes, grid and block, registers, shared memory and occupancy,
# as CSV under $OUT (one file per method and length), plus the plain bench
# rows of the same method for the stage names. Clocks are left alone
# (--clock-control none), as the device notes ask. ncu replays every launch,
# and a method's index build comes first (hundreds of launches: k-means,
# list builds), so give one or two specs a call and select the search's
# kernels with NCU_ARGS (e.g. NCU_ARGS='-k regex:ctf_|cts_' or
# '--launch-skip 400'); NCU_TIMEOUT (default 150 s) bounds each spec.
#   OUT=/tmp/prof SPECS="ctkvr:16384" NCU_ARGS='-k regex:cts_' scripts/profile_kernels.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvbench-profile}
SPECS=${SPECS:-csattention:1048576 ctkvr:16384 ctkvr:1048576 freekv:1048576 racc:131072 pariskv:16384 pariskv:1048576 pqcache:1048576 exact:1048576}
mkdir -p "$OUT"
[ -x ./kvbench ] || make -j"$(nproc)" all >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
M=$M,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__occupancy_limit_registers
for spec in $SPECS; do
    m=${spec%:*}; t=${spec#*:}
    timeout 120 ./kvbench bench --method "$m" --tokens "$t" >"$OUT/bench-$m-$t.log" 2>&1
    timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --launch-count "${LAUNCHES:-3000}" ${NCU_ARGS:-} --csv --metrics "$M" \
        ./kvbench bench --method "$m" --tokens "$t" --reps 3 --warmup 1 >"$OUT/ncu-$m-$t.csv" 2>"$OUT/ncu-$m-$t.err"
    echo "$m $t: rc $? $(grep -c '"gpu__time_duration.sum"' "$OUT/ncu-$m-$t.csv") kernel launches"
done
