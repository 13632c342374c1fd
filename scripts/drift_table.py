#!/usr/bin/env python3
"""drift_table.py: a Markdown table of recall@k and output error per decode window, one row per
method, from a kvbench run directory's drift.csv (its windows merged into --windows equal groups,
weighted by their row counts). Talks to kvbench only through its result files.

usage: scripts/drift_table.py RUN_DIR [--windows 4] [--metric recall_mean,outerr_mean]
"""
import argparse
import csv
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="kvbench run directory")
    ap.add_argument("--windows", type=int, default=4, help="groups of decode windows (columns)")
    ap.add_argument("--metric", default="recall_mean,outerr_mean",
                    help="drift.csv columns, one cell each per group (default recall_mean,outerr_mean)")
    ap.add_argument("--layer", default=None, help="a run over several layers: which (default: the first row's)")
    ap.add_argument("--k", default=None, help="a run over several budgets: which (default: the first row's)")
    ap.add_argument("--seed", default=None, help="a run over several seeds: which (default: the first row's)")
    a = ap.parse_args()
    path = os.path.join(a.run, "drift.csv")
    if not os.path.isfile(path):
        sys.exit(f"drift_table.py: {path}: missing (expected a kvbench run directory)")
    rows = list(csv.DictReader(open(path, newline="")))
    for col in ("layer", "k", "seed"):  # drift.csv of a run over several layers/budgets/seeds (issue 11)
        if rows and col in rows[0]:
            v = getattr(a, col) or rows[0][col]
            rows = [r for r in rows if r[col] == str(v)]
    if not rows:
        sys.exit(f"drift_table.py: {path}: no rows for the chosen --layer/--k/--seed")
    metrics = a.metric.split(",")
    for m in metrics:
        if rows and m not in rows[0]:
            sys.exit(f"drift_table.py: --metric {m}: not a drift.csv column ({', '.join(rows[0])})")
    lo = min(int(r["step_start"]) for r in rows)
    hi = max(int(r["step_end"]) for r in rows)
    width = (hi - lo + a.windows - 1) // a.windows
    methods = list(dict.fromkeys(r["method"] for r in rows))
    acc = {}  # (method, group, metric) -> [sum, n]
    for r in rows:
        g = (int(r["step_start"]) - lo) // width
        for m in metrics:
            if r[m] != "":
                s = acc.setdefault((r["method"], g, m), [0.0, 0])
                s[0] += float(r[m]) * int(r["n"])
                s[1] += int(r["n"])
    heads = [f"t {lo + g * width}-{min(hi, lo + (g + 1) * width)}" for g in range(a.windows)]
    print("| method | " + " | ".join(f"{h}: {m.replace('_mean', '')}" for h in heads for m in metrics) + " |")
    print("|---" * (1 + len(heads) * len(metrics)) + "|")
    for meth in methods:
        cells = []
        for g in range(a.windows):
            for m in metrics:
                s = acc.get((meth, g, m))
                cells.append(f"{s[0] / s[1]:.3f}" if s and s[1] else "–")
        print(f"| {meth} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
