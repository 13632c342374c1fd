#!/usr/bin/env bash
# scripts/dev/s4-ct.sh: branch s4-ct's device check (issue 9, point 4: CTKVR's GPU search < 40 us at every
# length). Assumes ./kvbench and tests/run_tests are built in the repo root; logs under $OUT/s4-ct/; prints a
# short summary last. Runs: three CTKVR GPU tests (the one-launch search version 3 = default, version 2 =
# KVBENCH_CTKVR_V2=1, version 1 = KVBENCH_CTKVR_FUSED=1; the staged path is unchanged on this branch);
# `kvbench bench --method ctkvr` at 16K, 128K, 1M (stages search = version 3, search_v2, search_v1,
# search_staged; its self-check of the three one-launch versions against the staged path on float16 keys;
# versions 3 and 2's phase stamps, KVBENCH_CTKVR_TRACE=1; the index build timed once,
# KVBENCH_CTKVR_BUILD_REPS=1, to stay within 60 s); the PyTorch peer at the same lengths. Each step has its own
# time limit (3 x 4 + 34 + 14 s at most; about 40 s expected).
set -u
cd "$(dirname "$0")/../.."
O="${OUT:-/tmp/out}/s4-ct"
mkdir -p "$O"
TOKENS="${S4CT_TOKENS:-16384,131072,1048576}"
git log -1 --format='commit %h' > "$O/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader > "$O/smi.txt" 2>&1
trc=0
for t in ctkvr_gpu_fused_v1_matches_cpu ctkvr_gpu_v2_matches_cpu ctkvr_gpu_matches_cpu; do # one process each
    KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN="$PWD/kvbench" timeout 4 ./tests/run_tests "$t" >> "$O/tests.log" 2>&1 || trc=1
done
echo "tests rc=$trc" >> "$O/tests.log"
KVBENCH_CTKVR_TRACE=1 KVBENCH_CTKVR_BUILD_REPS=1 timeout 34 stdbuf -oL -eL \
    ./kvbench bench --method ctkvr --tokens "$TOKENS" --csv "$O/bench.csv" --force > "$O/bench.log" 2> "$O/bench.err"
echo "bench rc=$?" >> "$O/bench.log"
if [ -z "${S4CT_NO_PEER:-}" ]; then
    timeout 14 python3 -u scripts/torch_ref/ctkvr.py --tokens "$TOKENS" --reps 20 --warmup 5 > "$O/peer.log" 2>&1
    echo "peer rc=$?" >> "$O/peer.log"
fi
rcs=$(grep -ho "^[a-z]* rc=[0-9]*" "$O/tests.log" "$O/bench.log" "$O/peer.log" 2>/dev/null | tr '\n' ' ')
echo "== s4-ct summary: $rcs| $(cat "$O/commit.txt" 2>/dev/null) | $(cat "$O/smi.txt" 2>/dev/null)"
grep -E "^ctkvr_gpu" "$O/tests.log" | cut -c1-70 | head -3 | paste -sd'|'
grep -E "ctkvr +[0-9]+ +(search|search_v2) " "$O/bench.log" | head -6
nck=$(grep -c "bench check" "$O/bench.err"); nok=$(grep "bench check" "$O/bench.err" |
    awk '{split($0, a, ": "); n = split(a[3], w, " "); if (w[1] == w[3] && w[6] == w[8]) c++} END {print c + 0}')
echo "bench check: $nok of $nck comparisons (version 3 / 1 / 2 vs staged, per length) with every set and top-k equal"
grep "bench check" "$O/bench.err" | awk '{split($0, a, ": "); n = split(a[3], w, " "); if (w[1] != w[3] || w[6] != w[8]) print}' | head -1
grep "ctkvr trace" "$O/bench.err" | awk 'NR % 5 == 3' | sed 's/ (us from the first block.s start)//' | cut -c1-190 | head -6
grep -E " search " "$O/peer.log" 2>/dev/null | head -3
