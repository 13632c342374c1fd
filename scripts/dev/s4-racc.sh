#!/usr/bin/env bash
# scripts/dev/s4-racc.sh: branch s4-racc's device check for the lead's combined call (<= ~60 s; ./kvbench and
# tests/run_tests already built in the repo root). RACC's GPU tests (the vote through the tiled and fused
# kernels; the retriever against the CPU), kvbench bench for racc with the default tiled vote, the PyTorch peer,
# then (if time is left) the bench with the two-sweep kernel (KVBENCH_RACC_VOTE=fused). Logs in $OUT/s4-racc/;
# a <= 20-line summary printed last.
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}/s4-racc
mkdir -p "$O"
T0=$SECONDS
export KVBENCH_BIN=$PWD/kvbench
L=16384,131072,1048576
KVBENCH_REQUIRE_GPU=1 timeout 30 ./tests/run_tests racc_gpu_vote_matches_cpu racc_gpu_matches_cpu >"$O/tests.log" 2>&1
echo "rc=$? wall=$((SECONDS - T0))s" >>"$O/tests.log"
timeout 20 ./kvbench bench --method racc --tokens $L --csv "$O/bench.csv" --force >"$O/bench.log" 2>&1
PYTHONUNBUFFERED=1 timeout 20 python3 scripts/torch_ref/racc.py --tokens $L --csv "$O/torch_racc.csv" \
    >"$O/torch_racc.log" 2>&1
if [ $((SECONDS - T0)) -lt 50 ]; then
    KVBENCH_RACC_VOTE=fused timeout 15 ./kvbench bench --method racc --tokens $L --csv "$O/bench_fused.csv" \
        --force >"$O/bench_fused.log" 2>&1
fi
python3 - "$O" "$((SECONDS - T0))" <<'PY'
import csv, os, sys
o, wall = sys.argv[1], sys.argv[2]
def rows(f):
    p = os.path.join(o, f)
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
t = open(os.path.join(o, "tests.log")).read().splitlines()
print(f"s4-racc ({wall} s): tests: " + "; ".join(l.split()[0] + " " + l.split()[1] for l in t
      if l.split() and l.split()[0].startswith("racc_gpu")) + " | " + (t[-2] if len(t) > 1 else ""))
tr = {(r["tokens"], r["stage"]): r for r in rows("torch_racc.csv")}
b = rows("bench.csv")
if b: print(f"copy {b[0]['copy_gbps']} GB/s; us (pct of copy) [torch us, speedup]")
for f, name in (("bench.csv", "tiled (default)"), ("bench_fused.csv", "fused")):
    r = rows(f)
    if not r:
        print(f"racc {name}: not run / failed")
        continue
    for n in ("16384", "131072", "1048576"):
        s = []
        for x in r:
            if x["tokens"] != n: continue
            k = (n, x["stage"])
            us = float(x["median_us"])
            peer = f" [{float(tr[k]['median_us']):.1f}, {float(tr[k]['median_us']) / us:.2f}x]" if k in tr else ""
            s.append(f"{x['stage']} {us:.1f} ({x['pct_copy']}%){peer}")
        if s: print(f"racc {name} {n}: " + ", ".join(s))
for f in ("bench.log", "torch_racc.log", "bench_fused.log"):
    p = os.path.join(o, f)
    err = [l for l in open(p) if "rror" in l or "fail" in l] if os.path.exists(p) else []
    if err: print(f"{f}: {err[0].strip()[:150]}")
PY
