#!/usr/bin/env bash
# run_traces.sh: runs kvbench over every trace (*.h5) in a folder, every
# layer of each (or the given ones), with one method list, and collects one
# summary CSV (a row per trace x layer x method). Resumable: a run whose
# result directory exists is skipped unless --force.
#
# usage: scripts/run_traces.sh --traces DIR --method exact,streaming [--layers L3,L14] [--out DIR]
#                              [--force] [-- extra kvbench run options, e.g. --k 100 --stride 4]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVBENCH_BIN:-$here/kvbench}
traces="" methods="" layers="" out="results/batch" force=""
while [ $# -gt 0 ]; do
  case "$1" in
    --traces) traces=$2; shift 2 ;;
    --method) methods=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --force) force=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run_traces.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[ -n "$traces" ] && [ -n "$methods" ] || { echo "run_traces.sh: --traces DIR and --method LIST are required" >&2; exit 2; }
[ -d "$traces" ] || { echo "run_traces.sh: --traces $traces: not a directory" >&2; exit 2; }
shopt -s nullglob
files=("$traces"/*.h5)
[ ${#files[@]} -gt 0 ] || { echo "run_traces.sh: no *.h5 traces in $traces" >&2; exit 2; }
mkdir -p "$out"
for f in "${files[@]}"; do
  stem=$(basename "$f" .h5)
  if [ -n "$layers" ]; then ls=${layers//,/ }; else ls=$("$bin" info "$f" | sed -n 's/^layers *[0-9]*: //p' | sed 's/([^)]*)//g'); fi
  for L in $ls; do
    dir="$out/$stem-$L"
    if [ -d "$dir" ] && [ -z "$force" ]; then echo "skip $dir (exists)"; continue; fi
    echo "run $f $L" >&2
    "$bin" run --trace "$f" --layer "$L" --method "$methods" --out "$dir" --force --quiet "$@"
  done
done
python3 - "$out" <<'PY'
import csv, json, os, sys
out = sys.argv[1]
cols = ["trace", "layer", "model", "num_tokens", "prefill_len", "k", "method", "params", "device", "recall",
        "recall_p10", "recall_selected", "candidate_recall", "recall_prefill_keys", "recall_generated_keys",
        "generated_share_of_topk", "mass", "mass_p10", "output_error", "output_error_p90",
        "mean_selected", "mean_extra", "index_bytes_per_token", "build_seconds", "search_us_median", "search_us_p90"]
rows = []
for d in sorted(os.listdir(out)):
    p = os.path.join(out, d, "summary.json")
    if not os.path.isfile(p):
        continue
    s = json.load(open(p))
    for m in s["methods"]:
        r = {"trace": s["trace"]["path"], "layer": s["trace"]["layer"], "model": s["trace"]["model"],
             "num_tokens": s["trace"]["num_tokens"], "prefill_len": s["trace"]["prefill_len"], "k": s["protocol"]["k"]}
        r.update({c: m.get(c) for c in cols if c in m})
        rows.append(r)
tmp = os.path.join(out, "summary.csv.tmp")
with open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
os.replace(tmp, os.path.join(out, "summary.csv"))
print(f"run_traces.sh: {len(rows)} rows in {os.path.join(out, 'summary.csv')}")
PY
