#!/usr/bin/env bash
# scripts/dev/s4-loop.sh: the device checks of branch s4-loop (issue 12 goal 1 and the GPU half of goal 6: the
# GPU oracle's thresholds and budget profile and the protocol's diagnostics evaluated on the device). For the
# lead's combined device call; assumes ./kvbench and tests/run_tests are built in the repo root. Logs in
# $OUT/s4-loop/, a short summary last. Stages in this order (environment, 1 = on): RL_TESTS=1 the GPU tests;
# RL_RUN=1 the 7-method 4096-step run on a 131072-token synth trace with its phases and the in-run / bench search
# ratios (RL_BENCH=1 also runs `kvbench bench` of the five searching methods at 131072; otherwise the ratio is
# against the bench values measured last session, named so); RL_EQ=1 the device evaluation against the host
# evaluation of the same binary (KVBENCH_HOST_EVAL=1: every score copied to the host and sorted there, the protocol
# on the host, i.e. the path before this branch) on the demo trace, bit for bit: the golden configuration
# (scripts/golden_run.py; against BASE_BIN, a kvbench of 21e04c7 + 9d51ffe aadf90a 61341f7, when given and it
# runs) and two more runs comparing steps.csv, drift.csv and profile.csv; writes $OUT/s4-loop/golden-run-gpu.tgz
# (the reference it compared with, for tests/golden/run-gpu). A method whose build fails on the device is dropped
# from the runs and named (runm).
set -u -o pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/kvbench-dev}/s4-loop
W=/tmp/s4-loop-work # the bulky outputs (result directories) stay here; $O gets logs, summaries and the tarball
mkdir -p "$O" "$W"
T0=$SECONDS
S=$O/summary.txt
: >"$S"
: >"$O/runloop.log"
: >"$O/eq.log"
say() { echo "$*" | tee -a "$S"; }
# runm LOG METHODS ARGS...: kvbench run with METHODS; a method whose build fails (another branch's kernel on this
# device) is dropped and the run repeated, at most 3 times; the methods that ran are left in $MOK
runm() {
    local log=$1 ms=$2 m
    shift 2
    for _ in 1 2 3 4; do
        MOK=$ms
        "$@" --method "$ms" >>"$log" 2>&1 && return 0
        m=$(tail -3 "$log" | sed -n 's/.*method \([a-z0-9_]*\): build failed.*/\1/p' | tail -1)
        [ -n "$m" ] || return 1
        say "  (method $m failed to build on this device: dropped; $(tail -1 "$log" | cut -c1-120))"
        ms=$(echo ",$ms," | sed "s/,$m,/,/; s/^,//; s/,$//")
    done
    return 1
}

if [ "${RL_TESTS:-1}" = 1 ]; then
    KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench timeout 150 ./tests/run_tests gpu_oracle_multi_k_profile_matches_cpu \
        gpu_oracle_profile_long_regions gpu_protocol_diag_matches_host gpu_oracle_matches_cpu run_memory_preflight_gpu \
        >"$O/tests.log" 2>&1
    say "[$((SECONDS - T0))s] GPU tests: $(tail -1 "$O/tests.log")"
    grep -E "FAIL|failed:|check failed" "$O/tests.log" | head -4 | tee -a "$S"
fi

if [ "${RL_RUN:-1}" = 1 ]; then
    TR=/tmp/kvb-runloop-128k.h5
    [ -f $TR ] || ./kvbench synth --out $TR --tokens 131072 --prefill 126976 --force >>"$O/runloop.log" 2>&1
    rm -rf "$W/rl"
    runm "$O/runloop.log" exact,pariskv,pqcache,quest,magicpig,streaming,random /usr/bin/time \
        -f "run: %e s wall, %U s user, %S s sys, %M KB max RSS" timeout 300 ./kvbench run --trace $TR --device gpu \
        --out "$W/rl" --force --quiet --verbose
    say "[$((SECONDS - T0))s] 128K run ($MOK): $(grep '^run:' "$O/runloop.log" | tail -1)"
    grep -E "^phases|^oracle:" "$O/runloop.log" | tail -2 | cut -c1-230 | tee -a "$S"
    if [ "${RL_BENCH:-0}" = 1 ]; then
        for m in exact pariskv pqcache quest magicpig; do
            timeout 60 ./kvbench bench --method $m --tokens 131072 --csv "$W/bench-$m.csv" --force >/dev/null 2>&1
        done
    fi
    cp "$W/rl/summary.json" "$O/rl-summary.json" 2>/dev/null
    [ -f "$W/rl/summary.json" ] && python3 - "$W/rl/summary.json" "$W" <<'EOF' | tee -a "$S"
import csv, glob, json, sys
s = json.load(open(sys.argv[1]))
bench, src = {}, "this call's kvbench bench"
for p in glob.glob(sys.argv[2] + "/bench-*.csv"):
    for r in csv.DictReader(open(p)):
        if r["stage"] in ("exact", "search") and int(r["tokens"]) == 131072:
            bench[r["method"]] = float(r["median_us"])
if not bench:  # last session's device_check.sh RUNLOOP=1 (H100), as the brief of this branch states them
    bench, src = {"exact": 127.8, "pariskv": 82.6, "pqcache": 58.4, "quest": 33.6, "magicpig": 141.8}, "last session's bench"
print(f"wall {s['wall_seconds']:.1f} s; in-run search median (host timer) vs {src} at 131072:")
print("  " + ", ".join(f"{m['method']} {m['search_us_median']:.1f}/{bench[m['method']]:.1f} "
                       f"({m['search_us_median'] / bench[m['method']]:.2f}x)" for m in s["methods"] if m["method"] in bench))
EOF
fi
if [ "${RL_EQ:-1}" = 1 ]; then
    REF=$W/golden-ref
    rm -rf "$REF"
    : >"$O/golden.log"
    ref=""
    if [ -n "${BASE_BIN:-}" ] && python3 scripts/golden_run.py make "$BASE_BIN" "$REF" --device gpu >>"$O/golden.log" 2>&1; then
        ref=BASE_BIN
    elif KVBENCH_HOST_EVAL=1 python3 scripts/golden_run.py make ./kvbench "$REF" --device gpu >>"$O/golden.log" 2>&1; then
        ref=KVBENCH_HOST_EVAL=1
    fi
    if [ -n "$ref" ]; then
        python3 scripts/golden_run.py check ./kvbench "$REF" --device gpu >>"$O/golden.log" 2>&1
        rc=$?
        say "[$((SECONDS - T0))s] golden config, device eval vs $ref: rc $rc $(tail -1 "$O/golden.log" | cut -c1-110)"
        rm -rf "$W/run-gpu" && cp -r "$REF" "$W/run-gpu" && tar -C "$W" -czf "$O/golden-run-gpu.tgz" run-gpu
    else
        say "[$((SECONDS - T0))s] golden config: no reference could be made (${BASE_BIN:+BASE_BIN and }KVBENCH_HOST_EVAL=1): $(grep -m1 'build failed' "$O/golden.log" | cut -c1-150)"
    fi
    # steps.csv, drift.csv and profile.csv of two more demo runs (the profile on, several budgets; one budget
    # without the profile: the oracle's other path), host evaluation vs device
    for cfg in "--k 16,64,200 --stride 9" "--k 100 --no-profile --stride 11"; do
        rm -rf "$W/eq0" "$W/eq1"
        runm "$O/eq.log" exact,pariskv,quest,pqcache,magicpig,streaming,random ./kvbench run --trace datasets/demo.h5 \
            $cfg --device gpu --out "$W/eq0" --force --quiet
        KVBENCH_HOST_EVAL=1 ./kvbench run --trace datasets/demo.h5 --method "$MOK" $cfg --device gpu --out "$W/eq1" \
            --force --quiet >>"$O/eq.log" 2>&1
        r=""
        for f in steps.csv drift.csv profile.csv; do
            [ -f "$W/eq1/$f" ] || continue
            cmp -s "$W/eq0/$f" "$W/eq1/$f" && r="$r $f=same" || r="$r $f=DIFFERS"
        done
        say "[$((SECONDS - T0))s] demo $cfg ($MOK): device vs host eval:$r ($(cat "$W/eq0/steps.csv" 2>/dev/null | wc -l) step rows)"
    done
fi

say "[$((SECONDS - T0))s] done"
echo "---- summary ($S)"
cat "$S" | tail -20
