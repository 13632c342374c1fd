#!/usr/bin/env bash
# run_traces.sh: runs kvbench over every trace (*.h5) in a folder, every
# layer of each (or the given ones), with one method list, and collects one
# summary CSV (a row per trace x layer x method) of this configuration.
#
# Resumable, and never stale: each run's directory is named by a key of its
# full configuration, <trace>-<layer>-<key>, key = the first 12 hex digits
# of the sha256 of:
#   - the trace: its real path, size in bytes and modification time (ns), so
#     a re-dumped trace is a new key;
#   - the layer and the method list as given;
#   - every extra kvbench run option after `--`, verbatim and in order
#     (--param, --k, --sink, --local, --stride, --window, --seed, --device,
#     --max-steps, ...): two spellings of one configuration (say `--k 100`
#     and the default) are two keys, which costs a rerun but never returns a
#     result of another configuration;
#   - the binary: `kvbench --version` (version and git commit); for a build
#     with uncommitted changes ("-dirty") also the sha256 of the binary.
# A run whose keyed directory holds a summary.json is skipped unless
# --force. Results of other configurations stay on disk but are not in the
# CSV; the key's material is written to OUT/keys/<trace>-<layer>-<key>.txt
# (not into the run directory, which kvbench replaces whole). summary.csv
# has every protocol option as a column (k, sink, local, stride, window,
# seed, max_steps), the key and the run directory.
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
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_traces.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[ -n "$traces" ] && [ -n "$methods" ] || { echo "run_traces.sh: --traces DIR and --method LIST are required" >&2; exit 2; }
[ -d "$traces" ] || { echo "run_traces.sh: --traces $traces: not a directory" >&2; exit 2; }
[ -x "$bin" ] || { echo "run_traces.sh: $bin: no kvbench binary (run make, or set KVBENCH_BIN)" >&2; exit 2; }
shopt -s nullglob
files=("$traces"/*.h5)
[ ${#files[@]} -gt 0 ] || { echo "run_traces.sh: no *.h5 traces in $traces" >&2; exit 2; }
mkdir -p "$out/keys"

version=$("$bin" --version)
case "$version" in
  *-dirty*) version="$version binary-sha256=$(sha256sum "$bin" | cut -d' ' -f1)" ;;
esac
extra=$(printf '%q ' "$@")
dirs=()
for f in "${files[@]}"; do
  stem=$(basename "$f" .h5)
  if [ -n "$layers" ]; then ls=${layers//,/ }; else ls=$("$bin" info "$f" | sed -n 's/^layers *[0-9]*: //p' | sed 's/([^)]*)//g'); fi
  trace_id="$(realpath "$f") $(stat -c '%s %.9Y' "$f")"
  for L in $ls; do
    config=$(printf 'trace: %s\nlayer: %s\nmethod: %s\noptions: %s\nkvbench: %s\n' "$trace_id" "$L" "$methods" "$extra" "$version")
    key=$(printf '%s' "$config" | sha256sum | cut -c1-12)
    dir="$out/$stem-$L-$key"
    dirs+=("$dir")
    if [ -f "$dir/summary.json" ] && [ -z "$force" ]; then echo "skip $dir (same configuration done)"; continue; fi
    echo "run $f $L -> $dir" >&2
    "$bin" run --trace "$f" --layer "$L" --method "$methods" --out "$dir" --force --quiet "$@"
    printf '%s\n' "$config" > "$out/keys/$stem-$L-$key.txt"
  done
done
python3 - "$out" "${dirs[@]}" <<'PY'
import csv, json, os, sys
out, dirs = sys.argv[1], sys.argv[2:]
cols = ["trace", "layer", "model", "num_tokens", "prefill_len", "k", "sink", "local", "stride", "window", "seed",
        "max_steps", "steps_evaluated", "method", "params", "device", "per_kv_head", "recall",
        "recall_p10", "recall_selected", "candidate_recall", "recall_prefill_keys", "recall_generated_keys",
        "generated_share_of_topk", "mass", "mass_p10", "output_error", "output_error_p90",
        "mean_selected", "mean_extra", "index_bytes_per_token", "build_seconds", "search_us_median", "search_us_p90",
        "cpu_threads", "load1_at_start", "git_sha", "config_key", "run_dir"]
proto = ["k", "sink", "local", "stride", "window", "seed", "max_steps", "steps_evaluated"]
rows = []
for d in dirs:
    p = os.path.join(d, "summary.json")
    s = json.load(open(p))
    host = s.get("host", {})
    load = host.get("load_average_at_start") or [None]
    for m in s["methods"]:
        r = {"trace": s["trace"]["path"], "layer": s["trace"]["layer"], "model": s["trace"]["model"],
             "num_tokens": s["trace"]["num_tokens"], "prefill_len": s["trace"]["prefill_len"],
             "cpu_threads": host.get("cpu_threads"), "load1_at_start": load[0], "git_sha": s.get("git_sha"),
             "config_key": d.rsplit("-", 1)[-1], "run_dir": d}
        r.update({c: s["protocol"][c] for c in proto})
        r.update({c: (str(m[c]).lower() if isinstance(m[c], bool) else m[c]) for c in cols if c in m})
        rows.append(r)
tmp = os.path.join(out, "summary.csv.tmp")
with open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
os.replace(tmp, os.path.join(out, "summary.csv"))
print(f"run_traces.sh: {len(rows)} rows ({len(dirs)} runs of this configuration) in {os.path.join(out, 'summary.csv')}")
PY
