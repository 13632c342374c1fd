#!/usr/bin/env bash
# scripts/dev/s4-fk.sh: branch s4-fk's device check for the lead's combined call (<= ~60 s; ./kvbench and
# tests/run_tests already built in the repo root). FreeKV/Quest GPU tests on the pipelined group-mean path
# (kernels/pages_pipe.cu), kvbench bench for freekv and quest, the freekv bench at 1M on the older path
# (KVBENCH_PAGES_PIPE=0), the PyTorch FreeKV peer, then (if time is left) the 1M freekv bench with the
# softmax sums in their own launch (KVBENCH_PAGES_FUSE=0: the tail before the fused pool) and without PDL. Logs in $OUT/s4-fk/; a <= 20-line summary printed last.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}/s4-fk
mkdir -p "$O"
T0=$SECONDS
export KVBENCH_BIN=$PWD/kvbench
L=16384,131072,1048576
KVBENCH_REQUIRE_GPU=1 timeout 40 ./tests/run_tests freekv_gpu_cosine_flags freekv_gpu_matches_cpu \
    freekv_gpu_group_mean_pages quest_gpu_summaries_match_cpu quest_gpu_retriever_matches_cpu >"$O/tests.log" 2>&1
echo "rc=$? wall=$((SECONDS - T0))s" >>"$O/tests.log"
timeout 25 ./kvbench bench --method freekv,quest --tokens $L --csv "$O/bench.csv" --force >"$O/bench.log" 2>&1
KVBENCH_PAGES_PIPE=0 timeout 12 ./kvbench bench --method freekv --tokens 1048576 --csv "$O/bench_old.csv" --force \
    >"$O/bench_old.log" 2>&1
PYTHONUNBUFFERED=1 timeout 25 python3 scripts/torch_ref/freekv.py --tokens $L --csv "$O/torch_freekv.csv" \
    >"$O/torch_freekv.log" 2>&1
for v in FUSE=0 PDL=0; do
    [ $((SECONDS - T0)) -lt 48 ] || break
    env KVBENCH_PAGES_$v timeout 10 ./kvbench bench --method freekv --tokens 1048576 --csv "$O/bench_$v.csv" \
        --force >"$O/bench_$v.log" 2>&1
done
python3 - "$O" "$((SECONDS - T0))" <<'PY'
import csv, os, sys
o, wall = sys.argv[1], sys.argv[2]
def rows(f):
    p = os.path.join(o, f)
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
t = open(os.path.join(o, "tests.log")).read().splitlines()
print(f"s4-fk ({wall} s): tests: " + "; ".join(l.split()[0] + " " + l.split()[1] for l in t
      if l.split() and l.split()[0].startswith(("freekv_gpu", "quest_gpu"))) + " | " + (t[-2] if len(t) > 1 else ""))
b, tr = rows("bench.csv"), {(r["tokens"], r["stage"]): r for r in rows("torch_freekv.csv")}
if b: print(f"copy {b[0]['copy_gbps']} GB/s; us (pct of copy vs the stage's byte floor) [torch us]")
for n in ("16384", "131072", "1048576"):
    s = [f"{r['stage']} {float(r['median_us']):.1f} ({r['pct_copy']}%)" + (
         f" [{float(tr[(n, r['stage'])]['median_us']):.1f}]" if (n, r["stage"]) in tr else "")
         for r in b if r["method"] == "freekv" and r["tokens"] == n and r["stage"] != "summary"]
    print(f"freekv {n}: " + ", ".join(s))
print("quest: " + ", ".join(f"{r['tokens']} {r['stage']} {float(r['median_us']):.1f} ({r['pct_copy']}%)"
      for r in b if r["method"] == "quest" and r["stage"] == "search"))
for f, name in (("bench_old.csv", "older path"), ("bench_FUSE=0.csv", "FUSE=0"), ("bench_PDL=0.csv", "PDL=0")):
    r = rows(f)
    print(f"freekv 1M {name}: " + (", ".join(f"{x['stage']} {float(x['median_us']):.1f} ({x['pct_copy']}%)"
          for x in r if x["stage"] in ("bound_scan", "pool_topk", "select_spec")) or "not run / failed"))
for f in ("bench.log", "bench_old.log", "torch_freekv.log"):
    err = [l for l in open(os.path.join(o, f)) if "rror" in l or "fail" in l] if os.path.exists(os.path.join(o, f)) else []
    if err: print(f"{f}: {err[0].strip()[:150]}")
PY
