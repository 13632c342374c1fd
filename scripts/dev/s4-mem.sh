#!/usr/bin/env bash
# scripts/dev/s4-mem.sh: branch s4-mem's part of the lead's combined GPU call
# (issue 12 goals 2 and 3), <= 60 s. Assumes ./kvbench and tests/run_tests
# are built in the repo root. Logs in $OUT/s4-mem/; a summary of <= 20 lines
# last. The full version with the 1M-token trace (too long for 60 s: the
# synth alone) is scripts/device_mem.sh.
#  1. the GPU tests that touch loading and memory: the float16 form against
#     the float32 form on the GPU bit for bit (run_layer_form_invariant_gpu),
#     the device preflight, the oracle/exact/quest GPU-equals-CPU tests;
#  2. trace loading of a 131072-token trace (the RUNLOOP's, when it is there),
#     parallel loader, float16 form (the GPU path's) x3 and float32 form x1;
#  3. host RSS of GPU runs on it against the layer's float16 bytes, with the
#     float16 form (default) and the float32 form (KVBENCH_LAYER=f32).
set -u -o pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/kvb-dev}/s4-mem
mkdir -p "$O"
T0=$SECONDS
TR=/tmp/kvb-runloop-128k.h5 TRGZ=/tmp/kvb-runloop-128k-gz.h5
[ -f $TR ] || { t=$SECONDS; ./kvbench synth --out $TR --tokens 131072 --prefill 126976 --force >/dev/null 2>&1
                echo "synth $TR: $((SECONDS - t)) s" >"$O/synth.log"; }

FREE=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1)
AVAIL=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
KVBENCH_FIT_GPU_BYTES=$((${FREE:-0} * 1048576)) KVBENCH_FIT_HOST_BYTES=$((${AVAIL:-0} * 1024)) KVBENCH_REQUIRE_GPU=1 \
    KVBENCH_BIN=$PWD/kvbench timeout 40 ./tests/run_tests run_layer_form_invariant_gpu run_memory_preflight_gpu \
    gpu_oracle_matches_cpu gpu_exact_matches_cpu quest_gpu_retriever_matches_cpu loader_float16_form \
    run_memory_largest_context >"$O/tests.log" 2>&1
echo "tests rc=$? at $((SECONDS - T0)) s" >>"$O/tests.log"

load() { # label trace env...
    local l=$1 t=$2; shift 2
    env "$@" KVBENCH_LOADER_VERBOSE=1 timeout 20 ./kvbench run --trace $t --method streaming --max-steps 1 \
        --out /tmp/kvb-s4mem-load --force --quiet 2>&1 | grep -o "loaded in .*" | sed "s|^|$l $(basename $t) |"
}
{
    for r in 1 2 3; do
        for t in $TR $TRGZ; do [ -f $t ] && load "f16 r$r" $t KVBENCH_LAYER=f16; done
    done
    for t in $TR $TRGZ; do [ -f $t ] && load "f32" $t KVBENCH_LAYER=f32; done
} >"$O/loading.log" 2>&1

rss() { # label env...
    local l=$1; shift
    env "$@" /usr/bin/time -f "$l: %e s wall, %M KB max RSS, exit %x" timeout 25 ./kvbench run --trace $TR \
        --device gpu --method exact,quest --stride 64 --max-steps 16 --out /tmp/kvb-s4mem-rss --force --quiet 2>&1 |
        grep -E "max RSS|kvbench:"
}
{ rss "float16 form" X=1; rss "float32 form" KVBENCH_LAYER=f32; } >"$O/rss.log" 2>&1
echo "total $((SECONDS - T0)) s" >>"$O/rss.log"

echo "== s4-mem summary (issue 12 goals 2, 3), $(date -u +%H:%M) UTC, $((SECONDS - T0)) s"
grep -E "FAIL|passed|rc=" "$O/tests.log" | grep -v "^ *tests/" | tail -4
grep -E "^    fit " "$O/tests.log" | sed -E 's/^    fit //; s/ \(exact,[^)]*\)//' | cut -c1-150 | head -4
python3 - "$O/loading.log" "$O/rss.log" <<'EOF'
import re, sys, statistics as st
runs = {}
for l in open(sys.argv[1]):
    m = re.match(r"(f16|f32)\S* ?(?:r\d )?(\S+) loaded in ([0-9.]+) s \((\d+) MB/s", l)
    if m:
        runs.setdefault((m.group(1), m.group(2)), []).append((float(m.group(3)), int(m.group(4))))
for (form, t), v in sorted(runs.items()):
    print(f"load {t} as {form}: median {st.median(x[0] for x in v):.3f} s ({st.median(x[1] for x in v)} MB/s), "
          f"range {min(x[1] for x in v)}-{max(x[1] for x in v)} MB/s, n={len(v)}")
f16 = 2 * (16 + 8 + 8) * 131072 * 128
for l in open(sys.argv[2]):
    m = re.search(r"^(.*): ([0-9.]+) s wall, (\d+) KB max RSS, exit (\d+)", l)
    if m:
        rss = int(m.group(3)) * 1024
        print(f"RSS {m.group(1)} (exact,quest --device gpu, 16 steps): {rss / 1e9:.2f} GB = {rss / f16:.2f}x the layer's "
              f"float16 {f16 / 1e9:.2f} GB ({m.group(2)} s, exit {m.group(4)})")
EOF
