#!/usr/bin/env bash
# scripts/dev/s4-ct.sh: branch s4-ct's device check (issue 9, point 4: CTKVR's GPU search < 40 us at every
# length). Assumes ./kvbench and tests/run_tests are built in the repo root; logs under $OUT/s4-ct/; prints a
# short summary last. Round 1: the three CTKVR GPU tests (the one-launch search version 2 = default, version 1
# = KVBENCH_CTKVR_FUSED=1, staged), the bench at 16K and 128K with cts_search's phase stamps
# (KVBENCH_CTKVR_TRACE=1; stages search = version 2, search_v1, search_staged), the PyTorch peer at the same
# lengths. Every step has its own time limit (the whole script <= 60 s).
set -u
cd "$(dirname "$0")/../.."
O="${OUT:-/tmp/out}/s4-ct"
mkdir -p "$O"
TOKENS="${S4CT_TOKENS:-16384,131072}"
git log -1 --format='commit %h %s' > "$O/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader > "$O/smi.txt" 2>&1
KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN="$PWD/kvbench" timeout 25 ./tests/run_tests ctkvr_gpu_matches_cpu \
    ctkvr_gpu_fused_v1_matches_cpu ctkvr_gpu_staged_matches_cpu > "$O/tests.log" 2>&1
echo "tests rc=$?" >> "$O/tests.log"
KVBENCH_CTKVR_TRACE=1 timeout 30 ./kvbench bench --method ctkvr --tokens "$TOKENS" --csv "$O/bench.csv" --force \
    > "$O/bench.log" 2> "$O/bench.err"
echo "bench rc=$?" >> "$O/bench.log"
if [ -z "${S4CT_NO_PEER:-}" ]; then
    (cd scripts/torch_ref && timeout 20 python3 ctkvr.py --tokens "$TOKENS" --reps 20 --warmup 5) > "$O/peer.log" 2>&1
    echo "peer rc=$?" >> "$O/peer.log"
fi
rcs=$(grep -ho "^[a-z]* rc=[0-9]*" "$O/tests.log" "$O/bench.log" "$O/peer.log" 2>/dev/null | tr '\n' ' ')
echo "== s4-ct summary: $rcs| $(cat "$O/commit.txt" 2>/dev/null) | $(cat "$O/smi.txt" 2>/dev/null)"
grep -E "^ctkvr_gpu|passed" "$O/tests.log" | head -4
grep -E "ctkvr +[0-9]+ +(search|search_v1|search_staged) " "$O/bench.log" | head -6
grep "bench check" "$O/bench.err" | head -4
grep "ctkvr trace" "$O/bench.err" | awk 'NR % 5 == 3' | cut -c1-250 | head -2
grep -E " search " "$O/peer.log" 2>/dev/null | head -2
