#!/usr/bin/env python3
"""method_table.py: one table of every method over several kvbench run
directories (one per trace and layer, e.g. the real traces of two models),
as Markdown on stdout and, with --csv, as CSV: model, trace, layer, method,
recall@k, recall on prefill / generated keys, candidate recall, mass recall,
output error, effective budget (selected + densely attended extra) and index
bytes per token and kv head. Talks to kvbench only through its result files
(summary.json); the standard library only.

usage: scripts/method_table.py RUN_DIR... [--layer L14] [--csv OUT.csv]
"""
import argparse
import csv
import json
import os
import sys

COLS = ["model", "trace", "layer", "method", "k", "recall", "recall_prefill_keys", "recall_generated_keys",
        "candidate_recall", "mass", "output_error", "mean_selected", "mean_extra", "index_bytes_per_token", "params"]


def rows_of(run_dir):
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"method_table.py: {path}: {e}")
    tr = s["trace"]
    trace = os.path.basename(tr["path"]).removesuffix(".h5")
    for m in s["methods"]:
        r = {c: m.get(c) for c in COLS}
        r.update(model=tr["model"], trace=trace, layer=m.get("layer", tr.get("layer")),
                 k=m.get("k", s["protocol"]["k"]))
        yield r


def fmt(x, d=3):
    return "–" if x is None else f"{x:.{d}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--layer", help="only this layer")
    ap.add_argument("--csv", help="also write every row as CSV here")
    a = ap.parse_args()
    rows = [r for d in a.runs for r in rows_of(d) if not a.layer or r["layer"] == a.layer]
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLS)
            w.writeheader()
            w.writerows(rows)
    print("| model | trace | layer | method | recall@k | recall, prefill keys | recall, generated keys | candidate recall "
          "| mass recall | output error | effective budget (selected + extra) | index B/token/kv head |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        extra = f" + {r['mean_extra']:.1f}" if r["mean_extra"] else ""
        model = r["model"].replace("-Instruct-Q4_K_M", "")
        print(f"| {model} | {r['trace'].split('-', 1)[-1]} | {r['layer']} | {r['method']} | {fmt(r['recall'])} "
              f"| {fmt(r['recall_prefill_keys'])} | {fmt(r['recall_generated_keys'])} | {fmt(r['candidate_recall'])} "
              f"| {fmt(r['mass'])} | {fmt(r['output_error'])} | {r['mean_selected']:.1f}{extra} "
              f"| {r['index_bytes_per_token']:.0f} |")


if __name__ == "__main__":
    main()
