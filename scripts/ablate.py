#!/usr/bin/env python3
"""ablate.py: one ablation runner for every method.

A method's ablations are a small table of named variants (parameter sets) in
scripts/ablations/<method>.toml:

    method = "pariskv"
    [[variant]]
    name = "learned centroids (prior work)"
    params = "centroids=kmeans,rotation=none,normalize=0,rerank=exact,update=1"

`scripts/ablate.py pariskv --traces datasets/real` runs `kvbench run` once per
(variant, trace, layer), each in a result directory keyed by a hash of its
full configuration (trace identity, layer, method, parameters, the extra
kvbench options, the binary), so a rerun reuses what exists and a changed
option never returns stale rows. It writes OUT/ablation.csv (one row per run)
and OUT/table.md. The standard library only (tomllib: Python >= 3.11), so it
runs with the system python3.

usage: scripts/ablate.py METHOD|TABLE.toml --traces DIR|FILE... [--layers L3,L14]
                         [--variant NAME]... [--out DIR] [--kvbench PATH] [--force]
                         [-- kvbench run options]
"""
import argparse
import csv
import glob
import hashlib
import json
import os
import subprocess
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import die, trace_layers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ["variant", "trace", "layer", "candidate_recall", "recall", "recall_prefill_keys", "recall_generated_keys",
           "mass", "output_error", "mean_selected", "mean_extra", "index_bytes_per_token", "method_metric_name",
           "method_metric", "params", "run_dir"]


def load_table(spec):
    path = spec if spec.endswith(".toml") else os.path.join(ROOT, "scripts", "ablations", spec + ".toml")
    if not os.path.isfile(path):
        have = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "scripts", "ablations", "*.toml")))
        die(f"{path}: no such ablation table (tables: {', '.join(have)})")
    try:
        with open(path, "rb") as f:
            t = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        die(f"{path}: not valid TOML: {e}")
    unknown = set(t) - {"method", "variant"}
    if unknown or not isinstance(t.get("method"), str) or not isinstance(t.get("variant"), list) or not t["variant"]:
        die(f"{path}: expected a string `method` and a list of [[variant]] tables (unknown keys: {sorted(unknown)})")
    names = set()
    for i, v in enumerate(t["variant"]):
        if set(v) - {"name", "params"} or not isinstance(v.get("name"), str) or not isinstance(v.get("params", ""), str):
            die(f"{path}: variant {i + 1}: expected `name` and `params` strings, found keys {sorted(v)}")
        if v["name"] in names:
            die(f"{path}: variant {i + 1}: the name '{v['name']}' is used twice")
        names.add(v["name"])
    return path, t["method"], t["variant"]


def run_key(trace, layer, method, params, extra, kvbench):
    st = os.stat(trace)
    ident = {"trace": os.path.abspath(trace), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "layer": layer,
             "method": method, "params": params, "extra": extra, "kvbench": os.path.abspath(kvbench),
             "kvbench_mtime_ns": os.stat(kvbench).st_mtime_ns}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="ablate.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("table", help="a method with scripts/ablations/METHOD.toml, or a .toml path")
    ap.add_argument("--traces", nargs="+", required=True, help="trace files or folders of *.h5")
    ap.add_argument("--layers", default="", help="comma-separated layers (default: every layer of each trace)")
    ap.add_argument("--variant", action="append", default=[], help="a variant's name, repeatable (default: all)")
    ap.add_argument("--out", default="", help="output folder (default results/ablation-METHOD)")
    ap.add_argument("--kvbench", default=os.path.join(ROOT, "kvbench"))
    ap.add_argument("--force", action="store_true", help="rerun runs whose results exist")
    a = ap.parse_args(argv)
    path, method, variants = load_table(a.table)
    if a.variant:
        want = a.variant
        missing = [w for w in want if w not in {v["name"] for v in variants}]
        if missing:
            die(f"--variant: {missing} not in {path}")
        variants = [v for v in variants if v["name"] in want]
    if not os.access(a.kvbench, os.X_OK):
        die(f"{a.kvbench}: not an executable (run make first, or pass --kvbench)")
    traces = []
    for t in a.traces:
        traces += sorted(glob.glob(os.path.join(t, "*.h5"))) if os.path.isdir(t) else [t]
    if not traces:
        die(f"--traces {' '.join(a.traces)}: no .h5 files")
    for t in traces:
        if not os.path.isfile(t):
            die(f"{t}: no such trace")
    out = a.out or os.path.join("results", f"ablation-{method}")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    rows = []
    jobs = [(v, t, L) for t in traces for L in (a.layers.split(",") if a.layers else trace_layers(a.kvbench, t))
            for v in variants]
    for n, (v, trace, layer) in enumerate(jobs, 1):
        params = [f"{method}.{p.strip()}" for p in v["params"].split(",") if p.strip()]
        key = run_key(trace, layer, method, params, extra, a.kvbench)
        rdir = os.path.join(out, "runs", key)
        summary = os.path.join(rdir, "summary.json")
        label = f"[{n}/{len(jobs)}] {os.path.basename(trace)} {layer} {v['name']}"
        if os.path.isfile(summary) and not a.force:
            print(f"{label}: cached ({rdir})", file=sys.stderr)
        else:
            print(f"{label}: running", file=sys.stderr)
            cmd = [a.kvbench, "run", "--trace", trace, "--layer", layer, "--method", method, "--out", rdir,
                   "--force", "--quiet"] + sum((["--param", p] for p in params), []) + extra
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                die(f"{label}: kvbench failed (exit {r.returncode}): {r.stderr.strip()}")
        with open(summary) as f:
            s = json.load(f)
        m = s["methods"][0]
        row = {c: m.get(c, "") for c in COLUMNS}
        row.update(variant=v["name"], trace=os.path.basename(trace).removesuffix(".h5"), layer=layer, run_dir=rdir)
        rows.append(row)
    with open(os.path.join(out, "ablation.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)

    def fmt(x, d=3):
        try:
            return f"{float(x):.{d}f}"
        except (TypeError, ValueError):
            return "–"
    lines = [f"Ablations of {method} ({os.path.relpath(path, ROOT)}), kvbench run options: {' '.join(extra) or 'defaults'}",
             "", "| trace | layer | variant | coarse recall | recall@k | recall, prefill keys | recall, generated keys "
             "| mass recall | output error | budget | extra/step | method metric |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mm = f"{r['method_metric_name']} {fmt(r['method_metric'])}" if r.get("method_metric_name") else "–"
        lines.append(f"| {r['trace']} | {r['layer']} | {r['variant']} | {fmt(r['candidate_recall'])} | {fmt(r['recall'])} "
                     f"| {fmt(r['recall_prefill_keys'])} | {fmt(r['recall_generated_keys'])} | {fmt(r['mass'])} "
                     f"| {fmt(r['output_error'])} | {fmt(r['mean_selected'], 1)} | {fmt(r['mean_extra'], 1)} | {mm} |")
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
