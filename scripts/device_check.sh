#!/usr/bin/env bash
# device_check.sh: everything the GPU path needs checked on a GPU machine,
# in one call (issue 2, point 9): build, the GPU tests (required to pass),
# kvbench bench and the PyTorch peer at the same lengths, a GPU-vs-CPU
# `kvbench run` on a synthetic trace, then the full test suite, then the GPU
# tests under compute-sanitizer (memcheck with leak check, and racecheck:
# every kernel file uses shared memory); full logs under $OUT, and a short
# side-by-side table printed LAST.
#   OUT=/tmp/out scripts/device_check.sh   (TOKENS=..., METHODS=... to change the lengths, methods;
#                                           SANITIZER=0 skips compute-sanitizer, SAN_TIMEOUT=s per tool,
#                                           SAN_TESTS="name ..." the tests it runs;
#                                           RUNCMP=0 skips the GPU-vs-CPU run, SUITE=0 the full suite)
# RUNLOOP=1 adds, right after the build, issue 12's run-loop measurement: the
# 7-method 4096-step `kvbench run --device gpu` on a 131072-token synth trace
# with its phase breakdown (--verbose), each method's in-run search time
# against `kvbench bench` at 131072, the four seed methods outside that set
# (csattention, ctkvr, freekv, racc) each alone on the same trace, the round trip of a synchronous search
# beyond its kernels (scripts/roundtrip.cu), the device evaluation against the host
# one (KVBENCH_HOST_EVAL=1), host RSS in both layer forms, and the bit-for-bit GPU golden check
# (tests/golden/run-gpu, written first from BASE_BIN when that is given: a
# kvbench binary of main built before the issue-12 work). RUNLOOP=only does
# the build and that section and stops; RUNLOOP=quick the same without the
# loading, evaluation and memory measurements (the run, the ratios, the round
# trip, the goldens).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvbench-device-check}
TOKENS=${TOKENS:-16384,131072,262144,1048576}
METHODS=${METHODS:-exact,pariskv,pqcache,quest,magicpig}
mkdir -p "$OUT"
T0=$SECONDS
step() { echo "== [$((SECONDS - T0))s] $*"; }

step "device"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv; echo "cpus: $(nproc)"; } 2>&1 | tee "$OUT/bench.log"

step "build"
if ! make -j16 all tests/run_tests >"$OUT/build.log" 2>&1; then tail -40 "$OUT/build.log"; exit 1; fi
tail -2 "$OUT/build.log"

if [ "${RUNLOOP:-0}" != 0 ]; then
    step "issue 12: run loop at GPU speed (131072 tokens, 4096 decode steps, 7 methods); log in $OUT/runloop.log"
    {
        TR128=/tmp/kvb-runloop-128k.h5
        RL_METHODS=exact,pariskv,pqcache,quest,magicpig,streaming,random
        t0=$SECONDS
        [ -f $TR128 ] || ./kvbench synth --out $TR128 --tokens 131072 --prefill 126976 --force
        echo "synth: $((SECONDS - t0)) s, $(du -m $TR128 | cut -f1) MB"
        /usr/bin/time -f "run: %e s wall, %U s user, %S s sys, %M KB max RSS" timeout 400 \
            ./kvbench run --trace $TR128 --method $RL_METHODS --device gpu --out /tmp/kvb-runloop --force --quiet --verbose
        # the same with every search synchronous, as before the queued searches (session 20)
        KVBENCH_RUN_QUEUE=0 /usr/bin/time -f "run, KVBENCH_RUN_QUEUE=0: %e s wall" timeout 400 \
            ./kvbench run --trace $TR128 --method $RL_METHODS --device gpu --out /tmp/kvb-runloop-sync --force --quiet
        /usr/bin/time -f "load + 1 step: %e s wall, %M KB max RSS" timeout 120 \
            ./kvbench run --trace $TR128 --method exact --max-steps 1 --device gpu --out /tmp/kvb-runloop1 --force --quiet
        rm -f /tmp/kvb-runloop-bench.csv
        for m in exact pariskv pqcache quest magicpig; do
            timeout 120 ./kvbench bench --method $m --tokens 131072 --csv /tmp/kvb-rl-$m.csv --force >/dev/null 2>&1
            if [ -s /tmp/kvb-runloop-bench.csv ]; then tail -n +2 /tmp/kvb-rl-$m.csv; else cat /tmp/kvb-rl-$m.csv; fi \
                >>/tmp/kvb-runloop-bench.csv
        done
        python3 - /tmp/kvb-runloop-bench.csv /tmp/kvb-runloop/summary.json /tmp/kvb-runloop-sync/summary.json <<'EOF'
import csv, json, sys
bench = {}
try:
    for r in csv.DictReader(open(sys.argv[1])):
        if r["stage"] in ("exact", "search") and int(r["tokens"]) == 131072:
            bench[r["method"]] = float(r["median_us"])
except OSError:
    pass
for path in sys.argv[2:]:
    try:
        s = json.load(open(path))
    except OSError:
        continue
    print(f"{path}: wall {s['wall_seconds']:.1f} s (goal <= 10); phases: " +
          ", ".join(f"{k} {v:.2f}" for k, v in s.get("phase_seconds", {}).items() if not isinstance(v, bool)))
    print(f"{'method':<10} {'device':<6} {'timer':<6} {'append_s':>8} {'diag_s':>7} {'run_us_med':>10} "
          f"{'run_total_s':>11} {'bench_us':>9} {'run/bench':>9}")
    for m in s["methods"]:
        b = bench.get(m["method"])
        r = m["search_us_median"]
        ratio = (f"{r / b:>8.2f}x" + (" OVER 1.3" if r / b > 1.3 else "")) if b else ""
        print(f"{m['method']:<10} {m['device']:<6} {m.get('search_timer', '?'):<6} "
              f"{m.get('append_seconds_total', float('nan')):>8.2f} "
              f"{m.get('diagnostics_seconds_total', float('nan')):>7.2f} {r:>10.1f} "
              f"{m.get('search_seconds_total', float('nan')):>11.2f} {(b or float('nan')):>9.1f} {ratio}")
EOF
        # the seed methods outside goal 1's set, each alone on the same trace: wall, device diagnostics, in-run
        # search against the bench stage it times (CTKVR's with its centroid update, RACC's retrieval)
        for m in csattention ctkvr freekv racc; do
            /usr/bin/time -f "run $m alone: %e s wall, %M KB max RSS" timeout 200 ./kvbench run --trace $TR128 \
                --method $m --device gpu --out /tmp/kvb-runloop-$m --force --quiet --verbose 2>&1 |
                grep -E "wall|oracle:" | sed "s/^oracle:/$m oracle:/"
            timeout 120 ./kvbench bench --method $m --tokens 131072 --csv /tmp/kvb-rl-$m.csv --force >/dev/null 2>&1
        done
        python3 - <<'EOF2'
import csv, json
stage = {"csattention": "search", "ctkvr": "search_dcu", "freekv": None, "racc": "retrieve"}
print(f"{'method':<12} {'wall_s':>6} {'timer':<6} {'run_us_med':>10} {'search_s':>8} {'diag_s':>6} {'bench stage':<11} "
      f"{'bench_us':>8} {'run/bench':>9}")
for m, sg in stage.items():
    try:
        s = json.load(open(f"/tmp/kvb-runloop-{m}/summary.json"))
        b = {r["stage"]: float(r["median_us"]) for r in csv.DictReader(open(f"/tmp/kvb-rl-{m}.csv"))}
    except OSError:
        print(m, "missing"); continue
    r = s["methods"][0]
    bu = b.get(sg) if sg else None
    print(f"{m:<12} {s['wall_seconds']:>6.2f} {r.get('search_timer', '?'):<6} {r['search_us_median']:>10.1f} "
          f"{r['search_seconds_total']:>8.2f} {r['diagnostics_seconds_total']:>6.2f} {sg or '-':<11} "
          f"{bu or float('nan'):>8.1f} {(r['search_us_median'] / bu if bu else float('nan')):>8.2f}x")
EOF2
        # what a host-synchronous search costs beyond its kernels on this machine (the floor under goal 1's ratios)
        nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/kvb-roundtrip scripts/roundtrip.cu && /tmp/kvb-roundtrip
        if [ -n "${BASE_BIN:-}" ]; then
            python3 scripts/golden_run.py make "$BASE_BIN" tests/golden/run-gpu --device gpu &&
                tar -C tests/golden -czf "$OUT/golden-run-gpu.tgz" run-gpu # to commit as tests/golden/run-gpu
        fi
        KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench ./tests/run_tests run_golden_gpu run_golden_cpu \
            run_queued_equals_sync_gpu
        [ "${RUNLOOP}" = quick ] && exit 0 # the subshell: the section ends here
        # trace loading (issue 12 goal 2): the library path against the parallel one, uncompressed and gzip
        TRGZ=/tmp/kvb-runloop-128k-gz.h5
        t0=$SECONDS; ./kvbench synth --out $TRGZ --tokens 131072 --prefill 126976 --gzip 4 --force >/dev/null
        echo "synth gzip: $((SECONDS - t0)) s, $(du -m $TRGZ | cut -f1) MB"
        for r in 1 2 3; do for t in $TR128 $TRGZ; do for L in library parallel; do
            KVBENCH_LOADER=$L KVBENCH_LOADER_VERBOSE=1 ./kvbench run --trace $t --method streaming --max-steps 1 \
                --out /tmp/kvb-load --force --quiet 2>&1 | grep -i loaded | sed "s|^|$L $(basename $t): |"
        done; done; done
        KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench ./tests/run_tests run_memory_preflight_gpu
        # the device evaluation against the host one (KVBENCH_HOST_EVAL=1, every score to the host) on the demo
        # trace, several budgets with the profile, then one budget without: the same files byte for byte
        for cfg in "--k 16,64,200 --stride 9" "--k 100 --no-profile --stride 11"; do
            for e in 0 1; do
                KVBENCH_HOST_EVAL=$e ./kvbench run --trace datasets/demo.h5 --method $RL_METHODS $cfg --device gpu \
                    --out /tmp/kvb-eval$e --force --quiet >/dev/null 2>&1
            done
            r=""
            for f in steps.csv drift.csv profile.csv; do
                cmp -s /tmp/kvb-eval0/$f /tmp/kvb-eval1/$f && r="$r $f=same" || r="$r $f=DIFFERS"
            done
            echo "demo $cfg: device vs host evaluation:$r"
        done
        # host memory of a GPU run against the layer's float16 bytes, in the float16 and the float32 layer form
        for form in f16 f32; do
            KVBENCH_LAYER=$form /usr/bin/time -f "RSS ($form layer form, exact,quest, 16 steps): %M KB" ./kvbench run \
                --trace $TR128 --method exact,quest --device gpu --stride 64 --max-steps 16 --out /tmp/kvb-rss \
                --force --quiet 2>&1 | grep RSS
        done
        echo "the layer's float16 bytes: $((2 * (16 + 2 * 8) * 131072 * 128)) (16 q / 8 kv heads, D 128, with values)"
    } 2>&1 | tee "$OUT/runloop.log"
    case ${RUNLOOP} in only | quick) exit 0 ;; esac
fi

step "GPU tests (KVBENCH_REQUIRE_GPU=1)"
timeout 180 make --no-print-directory test-gpu 2>&1 | tee "$OUT/tests.log" | grep -v '^KVBENCH'
GPU_TESTS=$?

step "kvbench bench, then the PyTorch peer, per method"
echo "method,device,tokens,q_heads,kv_heads,dim,k,stage,median_us,p90_us,bytes,gbps,pct_copy,copy_gbps,fits_l2,reps,params" |
    tee "$OUT/bench_kvbench.csv" >"$OUT/bench_torch.csv"
for m in ${METHODS//,/ }; do
    timeout 200 ./kvbench bench --method "$m" --tokens "$TOKENS" --csv /tmp/kvb-bench-$m.csv 2>&1 | tee -a "$OUT/bench.log"
    tail -n +2 /tmp/kvb-bench-$m.csv >>"$OUT/bench_kvbench.csv" 2>/dev/null
    if [ -f scripts/torch_ref/$m.py ]; then
        PYTHONUNBUFFERED=1 timeout 200 python3 scripts/torch_ref/$m.py --tokens "$TOKENS" --csv /tmp/kvb-torch-$m.csv 2>&1 |
            tee -a "$OUT/bench.log"
        tail -n +2 /tmp/kvb-torch-$m.csv >>"$OUT/bench_torch.csv" 2>/dev/null
    fi
done

# The flush before every timed repetition has to leave a stage's inputs out of L2 even when they fit there
# (session 21: the evict-first loads it used until then did not). Evidence, not a timing: Nsight Compute reads
# the DRAM bytes of Quest's bound scan at 128K (33.6 MB of float16 summaries, less than the L2), with
# application replay (no memory save and restore).
step "L2 flush check: DRAM bytes of Quest's bound scan at 131072 tokens (its summaries: 33.6 MB)"
if command -v ncu >/dev/null && [ "${FLUSHCHECK:-1}" != 0 ]; then
    timeout 120 ncu --replay-mode application --cache-control none --clock-control none --kernel-name regex:quest_bounds \
        --csv --page raw --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
        ./kvbench bench --method quest --tokens 131072 --reps 10 --warmup 1 >/tmp/kvb-ncu-flush.csv 2>/dev/null
    python3 - /tmp/kvb-ncu-flush.csv <<'EOF2'
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if h is None:
    sys.exit("ncu wrote no rows")
hd, data = rows[h], rows[h + 2:]
col = lambda m: statistics.median(float(r[hd.index(m)].replace(",", "")) for r in data)
mb = col("dram__bytes_read.sum") / 1e6
print(f"quest_bounds at 131072, {len(data)} launches: {mb:.1f} MB from DRAM (median), L2 hit "
      f"{col('lts__t_sector_hit_rate.pct'):.1f}%, {col('gpu__time_duration.sum') / 1e3:.1f} us under ncu: "
      + ("the flush evicts it" if mb > 30 else "IN L2: the flush does not evict it"))
EOF2
else echo "skipped (no ncu, or FLUSHCHECK=0)"; fi

# Each method's selectable other paths, at the largest length, beside its default's row in bench_kvbench.csv
# (what the defaults were chosen against; CTKVR's bench times its versions itself: search_v2, search_v1,
# search_staged). VARIANTS=0 skips.
step "kvbench bench of the other paths (the environment variable that selects each), at the largest length"
LAST=${TOKENS##*,}
[ "${VARIANTS:-1}" = 0 ] && echo "skipped (VARIANTS=0)" || for v in \
    pariskv:KVBENCH_CUDA_GRAPHS=0 pqcache:KVBENCH_CUDA_GRAPHS=0 pariskv:KVBENCH_PK_FUSED=1 pqcache:KVBENCH_PQ_FUSED=0 \
    csattention:KVBENCH_CS_REDUCE=tiled csattention:KVBENCH_CS_REDUCE=staged csattention:KVBENCH_CS_SAMPLE=0 \
    csattention:KVBENCH_CS_SAMPLE=256 csattention:KVBENCH_CS_SAMPLE=128 \
    csattention:KVBENCH_CS_PDL=0 ctkvr:KVBENCH_CTKVR_TRACE=1 ctkvr:KVBENCH_CTKVR_DIST=0 \
    freekv:KVBENCH_PAGES_PIPE=0 freekv:KVBENCH_PAGES_FUSE=0 freekv:KVBENCH_PAGES_FUSE=1 freekv:KVBENCH_PAGES_RSCAN=0 \
    freekv:KVBENCH_PAGES_RSCAN=1 racc:KVBENCH_RACC_VOTE=fused; do
    m=${v%%:*}; e=${v#*:}
    case ",$METHODS," in *",$m,"*)
        echo "-- $m with $e" | tee -a "$OUT/bench_variants.log"
        env "$e" timeout 200 ./kvbench bench --method "$m" --tokens "$LAST" 2>&1 | tee -a "$OUT/bench_variants.log" |
            grep -E "^method|search|select_spec|vote|sweep|trace" | head -20
        # the method's GPU tests on that path too (they run the path the environment selects)
        env "$e" KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench timeout 120 ./tests/run_tests \
            $(./tests/run_tests --list | grep "^${m}_gpu") 2>&1 | tail -1 | sed "s/^/   tests with $e: /" ;;
    esac
done

step "kvbench run: GPU vs CPU on a synthetic trace (32K tokens, stride 64)"
TR=/tmp/kvb-check-32k.h5
[ "${RUNCMP:-1}" = 0 ] && echo "skipped (RUNCMP=0)" || {
    ./kvbench synth --out $TR --tokens 32768 --prefill 16384 &&
    timeout 60 ./kvbench run --trace $TR --method $METHODS,streaming --stride 64 --device gpu --out /tmp/kvb-run-gpu --force &&
    timeout 150 ./kvbench run --trace $TR --method $METHODS,streaming --stride 64 --device cpu --out /tmp/kvb-run-cpu --force &&
    python3 - <<'EOF'
import json
g, c = (json.load(open(f"/tmp/kvb-run-{d}/summary.json")) for d in ("gpu", "cpu"))
keys = ["recall", "recall_p10", "recall_selected", "candidate_recall", "recall_prefill_keys", "recall_generated_keys",
        "mass", "mass_p10", "output_error", "output_error_p90", "mean_selected", "mean_extra"]
worst = 0.0
print(f"{'method':<10} {'ran on':<7} {'recall gpu':>10} {'recall cpu':>10} {'max |gpu-cpu|':>14} {'worst metric':<22} "
      f"{'search_us gpu':>13} {'cpu':>9}")
for mg, mc in zip(g["methods"], c["methods"]):
    diffs = [(abs(mg[k] - mc[k]), k) for k in keys if mg.get(k) is not None and mc.get(k) is not None]
    d, k = max(diffs)
    worst = max(worst, d)
    print(f"{mg['method']:<10} {mg['device']:<7} {mg['recall']:>10.6f} {mc['recall']:>10.6f} {d:>14.3g} {k:<22} "
          f"{mg['search_us_median']:>13.1f} {mc['search_us_median']:>9.1f}")
print(f"largest |gpu - cpu| over the metrics: {worst:.3g} ({'MATCH' if worst <= 1e-5 else 'DIFFERS'}); "
      f"wall {g['wall_seconds']:.1f} s gpu vs {c['wall_seconds']:.1f} s cpu")
EOF
} 2>&1 | tee "$OUT/run_compare.log"

step "summary"
python3 - "$OUT/bench_kvbench.csv" "$OUT/bench_torch.csv" <<'EOF' | tee "$OUT/summary.txt"
import csv, sys
def load(p):
    try:
        return {(r["method"], int(r["tokens"]), r["stage"]): r for r in csv.DictReader(open(p))}
    except OSError:
        return {}
kv, th = load(sys.argv[1]), load(sys.argv[2])
order = {}  # methods and their stages in the order kvbench printed them
for m, _, stage in kv:
    if stage not in order.setdefault(m, []):
        order[m].append(stage)
print(f"{'method':<9} {'tokens':>8} {'stage':<10} | {'kvbench_us':>10} {'GB/s':>6} {'%copy':>6} | {'torch_us':>9} "
      f"{'GB/s':>6} {'%copy':>6} | {'speedup':>7}")
for key in sorted(kv, key=lambda x: (list(order).index(x[0]), x[1], order[x[0]].index(x[2]))):
    a, b = kv[key], th.get(key)
    line = (f"{key[0]:<9} {key[1]:>8} {key[2]:<10} | {float(a['median_us']):>10.1f} {float(a['gbps']):>6.0f} "
            f"{float(a['pct_copy']):>5.1f}%")
    if b:
        line += (f" | {float(b['median_us']):>9.1f} {float(b['gbps']):>6.0f} {float(b['pct_copy']):>5.1f}% | "
                 f"{float(b['median_us']) / float(a['median_us']):>6.2f}x")
    print(line)
if kv:
    c = next(iter(kv.values()))
    print(f"copy bandwidth: kvbench {float(c['copy_gbps']):.0f} GB/s" +
          (f", torch {float(next(iter(th.values()))['copy_gbps']):.0f} GB/s" if th else ""))
EOF
step "full test suite"
# appended to tests.log: at most 8 files come back from $OUT
echo "== full suite" >>"$OUT/tests.log"
if [ "${SUITE:-1}" = 0 ]; then echo "skipped (SUITE=0)" >/tmp/kvb-tests-all.log; rc=0; else
KVBENCH_BIN=$PWD/kvbench timeout ${SUITE_TIMEOUT:-200} ./tests/run_tests >/tmp/kvb-tests-all.log 2>&1
rc=$?; fi
cat /tmp/kvb-tests-all.log >>"$OUT/tests.log"
echo "full suite: exit $rc ($(tail -1 /tmp/kvb-tests-all.log))"; grep -E -A3 'FAIL' /tmp/kvb-tests-all.log | head -30

SAN_RESULT="skipped (SANITIZER=0)"
if [ "${SANITIZER:-1}" != 0 ]; then
    step "GPU tests under compute-sanitizer (memcheck, racecheck); log in $OUT/sanitizer.log"
    SAN=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    # every GPU test but gpu_oom_is_an_error, whose deliberate failed cudaMalloc is an API error to the sanitizer
    # (SAN_TESTS="name ..." to check fewer)
    SAN_TESTS=${SAN_TESTS:-$(./tests/run_tests --list | grep -E '^(gpu_|[a-z]+_gpu_)' | grep -v '^gpu_oom_is_an_error$' | tr '\n' ' ')}
    SAN_RESULT=""
    : >"$OUT/sanitizer.log"
    for tool in memcheck racecheck; do
        extra=""
        [ $tool = memcheck ] && extra="--leak-check full"
        echo "== $tool: $SAN_TESTS" >>"$OUT/sanitizer.log"
        # shellcheck disable=SC2086
        KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench timeout "${SAN_TIMEOUT:-300}" \
            "$SAN" --tool $tool $extra --error-exitcode 99 ./tests/run_tests $SAN_TESTS >>"$OUT/sanitizer.log" 2>&1
        rc=$?
        errs=$(grep -E '^=+ (ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY)' "$OUT/sanitizer.log" | tail -1)
        case $rc in
            0) r="clean" ;; 99) r="ERRORS" ;; 124) r="TIMEOUT after ${SAN_TIMEOUT:-300} s" ;; *) r="exit $rc" ;;
        esac
        echo "$tool: $r ($errs; $(grep -E 'passed,' "$OUT/sanitizer.log" | tail -1))"
        SAN_RESULT="$SAN_RESULT $tool=$r"
    done
fi

step "short table: the whole search per method (appended to $OUT/summary.txt, after the per-stage rows)"
python3 - "$OUT/bench_kvbench.csv" "$OUT/bench_torch.csv" <<'EOF' | tee -a "$OUT/summary.txt"
import csv, sys
rows = {}
for who, p in (("kv", sys.argv[1]), ("th", sys.argv[2])):
    try:
        for r in csv.DictReader(open(p)):
            if r["stage"] in ("exact", "search"):
                rows.setdefault((r["method"], int(r["tokens"])), {})[who] = r
    except OSError:
        pass
ex = {t: float(v["kv"]["median_us"]) for (m, t), v in rows.items() if m == "exact" and "kv" in v}
print(f"{'method':<9} {'tokens':>8} {'kvbench_us':>10} {'%copy':>6} {'torch_us':>9} {'speedup':>7} {'vs exact':>8}")
for (m, t), v in rows.items():
    if "kv" not in v:
        continue
    k = float(v["kv"]["median_us"])
    th = f"{float(v['th']['median_us']):>9.1f} {float(v['th']['median_us']) / k:>6.2f}x" if "th" in v else f"{'':>9} {'':>7}"
    vs = f"{100 * k / ex[t]:>7.1f}%" if t in ex else ""
    print(f"{m:<9} {t:>8} {k:>10.1f} {float(v['kv']['pct_copy']):>5.1f}% {th} {vs}")
EOF
echo "GPU tests: $([ $GPU_TESTS = 0 ] && echo PASS || echo FAIL) ($(grep -E 'passed,' "$OUT/tests.log" | head -1)); compute-sanitizer:$SAN_RESULT; total $((SECONDS - T0)) s"
