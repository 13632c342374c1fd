#!/usr/bin/env bash
# ablate.sh: one method's ablations on every trace of a folder: one kvbench
# run per variant and trace-layer (scripts/run_traces.sh), then one Markdown
# table (coarse-stage recall, final recall, recall split by key origin, mass,
# output error, extras per step) in OUT/table.md and all rows in
# OUT/ablation.csv. Methods and what their variants test:
#   pariskv      the paper's figure 10 ladder and each design switch (as
#                scripts/ablate_pariskv.sh, which this replaces)
#   csattention  the paper's query/key distribution-shift argument
#                (centroids=keys: key-centric tables), the streaming
#                try-insert (update=0), the missing-key rule, GQA pooling, m, C, alpha
#   ctkvr        the centroid choice of its table 4 (final/init/random/equi),
#                DCU off/on/oracle (oracle: labelled upper bound), how
#                generated keys are attended (gen=dense|rerank), C'
#
# usage: scripts/ablate.sh --method M --traces DIR [--layers L14] [--out DIR] [-- kvbench run options]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
method="" traces="" layers="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --method) method=$2; shift 2 ;;
    --traces) traces=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "ablate.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[ -n "$traces" ] || { echo "ablate.sh: --traces DIR is required" >&2; exit 2; }
[ -n "$method" ] || { echo "ablate.sh: --method M is required (pariskv, csattention or ctkvr)" >&2; exit 2; }
out=${out:-results/ablation-$method}
# name|parameters (METHOD.NAME=VALUE, comma-separated)
case "$method" in
  pariskv) variants=(
  "learned centroids (prior work)|centroids=kmeans,rotation=none,normalize=0,rerank=exact,update=1"
  "learned + N|centroids=kmeans,rotation=none,normalize=1,rerank=exact,update=1"
  "learned + N + R|centroids=kmeans,rotation=srht,normalize=1,rerank=exact,update=1"
  "N + R + T (ParisKV coarse stage)|rerank=exact,update=1"
  "ParisKV (RSQ-IP rerank)|update=1"
  "ParisKV, rotation=none|rotation=none,update=1"
  "ParisKV, tiers=binary|tiers=binary,update=1"
  "ParisKV, rerank=none|rerank=none,update=1"
  "ParisKV, pool=none|pool=none,update=1"
  "ParisKV, lloyd=converged|lloyd=converged,update=1"
  "ParisKV, defaults (update=256)|"
  "beta=0.05: learned centroids|beta=0.05,centroids=kmeans,rotation=none,normalize=0,rerank=exact,update=1"
  "beta=0.05: learned + N + R|beta=0.05,centroids=kmeans,rotation=srht,normalize=1,rerank=exact,update=1"
  "beta=0.05: N + R + T|beta=0.05,rerank=exact,update=1"
  "beta=0.05: N + R + T, pool=none|beta=0.05,rerank=exact,update=1,pool=none"
  ) ;;
  csattention) variants=(
  "CSAttention (paper defaults)|"
  "key-centric tables (centroids=keys)|centroids=keys"
  "no streaming update (update=0)|update=0"
  "missing = list minimum|missing=min"
  "group-consistent (pool=mean)|pool=mean"
  "m=4|m=4"
  "m=16|m=16"
  "C=64|C=64"
  "C=200|C=200"
  "alpha=0.10|alpha=0.10"
  "alpha=0.40|alpha=0.40"
  "key-centric, no update|centroids=keys,update=0"
  ) ;;
  ctkvr) variants=(
  "CTKVR (FINAL centroids, DCU on)|"
  "INIT centroids|centroids=init"
  "RANDOM centroids|centroids=random"
  "EQUI centroids|centroids=equi"
  "DCU off|dcu=off"
  "DCU oracle (upper bound, not the paper)|dcu=oracle"
  "generated keys reranked (gen=rerank)|gen=rerank"
  "gen=rerank, DCU off|gen=rerank,dcu=off"
  "C'=2|cp=2"
  "C'=8|cp=8"
  ) ;;
  *) echo "ablate.sh: --method $method: expected pariskv, csattention or ctkvr" >&2; exit 2 ;;
esac
mkdir -p "$out"
for v in "${variants[@]}"; do
  name=${v%%|*} ps=${v#*|}
  slug=$(echo "$name" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
  args=()
  IFS=',' read -ra kv <<<"$ps"
  for x in "${kv[@]}"; do args+=(--param "$method.$x"); done
  echo "== $method: $name" >&2
  "$here/scripts/run_traces.sh" --traces "$traces" --method "$method" ${layers:+--layers "$layers"} --out "$out/$slug" \
    -- "${args[@]}" "$@" >/dev/null
  printf '%s\n' "$name" >"$out/$slug/variant.txt"
done
python3 - "$out" "${variants[@]}" <<'PY'
import csv, os, sys
out, variants = sys.argv[1], sys.argv[2:]
rows = []
for v in variants:
    name = v.split("|")[0]
    slug = "".join(c if c.isalnum() else "-" for c in name)
    while "--" in slug:
        slug = slug.replace("--", "-")
    slug = slug.strip("-")
    p = os.path.join(out, slug, "summary.csv")
    if not os.path.isfile(p):
        continue
    for r in csv.DictReader(open(p)):
        r["variant"] = name
        rows.append(r)
keys = ["variant", "trace", "layer", "candidate_recall", "recall", "recall_prefill_keys", "recall_generated_keys",
        "mass", "output_error", "mean_extra", "params"]
with open(os.path.join(out, "ablation.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
def fmt(x):
    try:
        return f"{float(x):.3f}"
    except (TypeError, ValueError):
        return "–"
with open(os.path.join(out, "table.md"), "w") as f:
    f.write("| trace | layer | variant | coarse recall | recall@100 | recall, prefill keys | recall, generated keys "
            "| mass recall | output error | extra/step |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for r in sorted(rows, key=lambda r: (r["trace"], r["layer"])):
        tr = os.path.basename(r["trace"]).removesuffix(".h5")
        f.write(f"| {tr} | {r['layer']} | {r['variant']} | {fmt(r['candidate_recall'])} | {fmt(r['recall'])} | "
                f"{fmt(r['recall_prefill_keys'])} | {fmt(r['recall_generated_keys'])} | {fmt(r['mass'])} | "
                f"{fmt(r['output_error'])} | {float(r['mean_extra']):.1f} |\n")
print(open(os.path.join(out, "table.md")).read())
PY
