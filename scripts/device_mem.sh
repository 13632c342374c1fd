#!/usr/bin/env bash
# device_mem.sh: issue 12 goals 2 and 3 on the lent GPU machine in one call
# (branch s4-mem; to fold into device_check.sh's RUNLOOP section). Logs under
# $OUT. SYNTH_BIN: a kvbench binary that can run `synth` while this one is
# built (a CPU-only build of the same commit; the traces are the same bytes),
# so the 8.6 GB 1M-token trace is written during the build and the tests.
#  1. build; the GPU tests that touch loading and memory;
#  2. trace loading, 128K tokens (16/8 heads, D 128, float16, 1.07 GB):
#     uncompressed and gzip 4, the library path against the parallel one,
#     interleaved, 3 repetitions (library once: ~5 s a gzip load);
#  3. host RSS of a 1M-token GPU run (exact,quest, --stride 64, 16 steps)
#     against the layer's float16 bytes (goal: at most 1.3x);
#  4. the largest context that fits, from the preflight's formula, for the
#     machine's free GPU memory and MemAvailable.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvb-mem}
mkdir -p "$OUT"
T0=$SECONDS
step() { echo "== [$((SECONDS - T0))s] $*"; }
TR=/tmp/kvb-128k.h5 TRGZ=/tmp/kvb-128k-gz.h5 TR1M=/tmp/kvb-1m.h5

step "device"
nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
grep -E "MemTotal|MemAvailable" /proc/meminfo
echo "cpus $(nproc); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null); load $(cat /proc/loadavg)"

SYN=${SYNTH_BIN:-}
if [ -n "$SYN" ] && "$SYN" list >/dev/null 2>&1; then
    ( s=$SECONDS; "$SYN" synth --out $TR1M --tokens 1048576 --prefill 1040384 --force >"$OUT/synth1m.log" 2>&1
      echo "rc=$? $((SECONDS - s)) s" >>"$OUT/synth1m.log"; touch /tmp/kvb-1m.done ) &
    ( s=$SECONDS; "$SYN" synth --out $TR --tokens 131072 --prefill 126976 --force >"$OUT/synth128.log" 2>&1
      "$SYN" synth --out $TRGZ --tokens 131072 --prefill 126976 --gzip 4 --force >>"$OUT/synth128.log" 2>&1
      echo "rc=$? $((SECONDS - s)) s" >>"$OUT/synth128.log"; touch /tmp/kvb-128k.done ) &
else
    echo "SYNTH_BIN unusable: the traces are written after the build"
    SYN=
fi

step "build"
if ! make -j16 kvbench tests/run_tests >"$OUT/build.log" 2>&1; then tail -40 "$OUT/build.log"; exit 1; fi
if [ -z "$SYN" ]; then
    ./kvbench synth --out $TR --tokens 131072 --prefill 126976 --force >/dev/null && \
        ./kvbench synth --out $TRGZ --tokens 131072 --prefill 126976 --gzip 4 --force >/dev/null; touch /tmp/kvb-128k.done
    (./kvbench synth --out $TR1M --tokens 1048576 --prefill 1040384 --force >"$OUT/synth1m.log" 2>&1; touch /tmp/kvb-1m.done) &
fi

step "GPU tests"
FREE=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
AVAIL=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
KVBENCH_FIT_GPU_BYTES=$((FREE * 1048576)) KVBENCH_FIT_HOST_BYTES=$((AVAIL * 1024)) KVBENCH_REQUIRE_GPU=1 \
    KVBENCH_BIN=$PWD/kvbench timeout 90 ./tests/run_tests run_memory_preflight_gpu run_layer_form_invariant_gpu \
    gpu_oracle_matches_cpu gpu_exact_matches_cpu quest_gpu_retriever_matches_cpu quest_gpu_summaries_match_cpu \
    gpu_oracle_multi_k_profile_matches_cpu gpu_oracle_nonfinite_scores loader_float16_form run_memory_largest_context \
    2>&1 | tee "$OUT/tests.log" | tail -16

step "loading (128K tokens, 16/8 heads, D 128, float16)"
while [ ! -f /tmp/kvb-128k.done ]; do sleep 1; done
cat "$OUT/synth128.log" 2>/dev/null | tail -1
ls -l $TR $TRGZ
for r in 1 2 3; do
    for t in $TR $TRGZ; do
        for L in library parallel; do
            [ $L = library ] && [ $r -gt 1 ] && continue
            KVBENCH_LOADER=$L KVBENCH_LOADER_VERBOSE=1 timeout 60 ./kvbench run --trace $t --method streaming --max-steps 1 \
                --out /tmp/kvb-load --force --quiet 2>&1 | grep -i loaded | sed "s|^kvbench: /tmp/||; s|^|$L r$r |"
        done
    done
done 2>&1 | tee "$OUT/loading.log"
echo "-- the float32 form (the CPU path's), parallel:" | tee -a "$OUT/loading.log"
for t in $TR $TRGZ; do
    KVBENCH_LAYER=f32 KVBENCH_LOADER_VERBOSE=1 timeout 60 ./kvbench run --trace $t --method streaming --max-steps 1 \
        --out /tmp/kvb-load --force --quiet 2>&1 | grep -i loaded | sed "s|^kvbench: /tmp/||"
done 2>&1 | tee -a "$OUT/loading.log"

step "1M tokens: host RSS of a GPU run against the layer's float16 bytes"
while [ ! -f /tmp/kvb-1m.done ]; do sleep 1; done
cat "$OUT/synth1m.log" | tail -2
ls -l $TR1M
KVBENCH_LOADER_VERBOSE=1 KVBENCH_MEM_VERBOSE=1 /usr/bin/time -f "1M run: %e s wall, %M KB max RSS" timeout 120 \
    ./kvbench run --trace $TR1M --device gpu --method exact,quest --stride 64 --max-steps 16 --out /tmp/kvb-1m-out \
    --force --quiet --verbose 2>&1 | grep -v "^search " | tee "$OUT/rss1m.log"
python3 - "$OUT/rss1m.log" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"(\d+) KB max RSS", t)
f16 = 2 * (16 + 8 + 8) * 1048576 * 128
if m:
    rss = int(m.group(1)) * 1024
    print(f"RSS {rss / 1e9:.2f} GB / layer float16 {f16 / 1e9:.2f} GB = {rss / f16:.3f}x (goal <= 1.3)")
EOF
step "done"
