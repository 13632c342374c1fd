#!/usr/bin/env python3
"""plot_drift.py: recall@k, recall on the generated keys (the top-k
members generated after the index was built, the drift panel) and output
error per decode window, from kvbench run directories (drift.csv +
summary.json), one line per method with its p10 band (recall) / p90 band
(output error). Talks to kvbench only through its result files.

usage: scripts/plot_drift.py RESULT_DIR [RESULT_DIR ...] -o drift.png [--title T]
Several directories (e.g. one per layer or per trace) become one row of
panels each.
"""
import argparse
import csv
import json
import os
import sys


def load(run_dir):
    summ_path = os.path.join(run_dir, "summary.json")
    drift_path = os.path.join(run_dir, "drift.csv")
    for p in (summ_path, drift_path):
        if not os.path.isfile(p):
            sys.exit(f"plot_drift.py: {p}: missing (expected a kvbench run directory)")
    with open(summ_path) as f:
        summary = json.load(f)
    series = {}
    with open(drift_path, newline="") as f:
        for row in csv.DictReader(f):
            s = series.setdefault(row["method"], {k: [] for k in ("x", "r", "r10", "e", "e90", "g")})
            mid = 0.5 * (float(row["step_start"]) + float(row["step_end"]))
            s["x"].append(mid)
            s["r"].append(float(row["recall_mean"]))
            s["r10"].append(float(row["recall_p10"]))
            s["e"].append(float(row["outerr_mean"]) if row["outerr_mean"] else float("nan"))
            s["e90"].append(float(row["outerr_p90"]) if row["outerr_p90"] else float("nan"))
            g = row.get("recall_generated_keys")
            s["g"].append(float(g) if g else float("nan"))
    return summary, series


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="kvbench run directories")
    ap.add_argument("-o", "--out", required=True, help="output image (png, pdf, svg)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_drift.py: matplotlib is not installed (make pydeps installs it into .venv)")

    runs = [load(d) for d in args.runs]
    fig, axes = plt.subplots(len(runs), 3, figsize=(16, 3.6 * len(runs)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (summary, series) in enumerate(runs):
        tr, pr = summary["trace"], summary["protocol"]
        label = f'{os.path.basename(tr["path"])} {tr["layer"]}  ({tr["model"]}, P={tr["prefill_len"]})'
        for j, (method, s) in enumerate(sorted(series.items())):
            c = colors[j % len(colors)]
            ax = axes[row][0]
            ax.plot(s["x"], s["r"], color=c, label=method)
            ax.fill_between(s["x"], s["r10"], s["r"], color=c, alpha=0.15, linewidth=0)
            axes[row][1].plot(s["x"], s["g"], color=c, label=method)
            ax = axes[row][2]
            ax.plot(s["x"], s["e"], color=c, label=method)
            ax.fill_between(s["x"], s["e"], s["e90"], color=c, alpha=0.15, linewidth=0)
        a0, ag, a1 = axes[row]
        a0.set_ylabel(f'recall@{pr["k"]} (mean, band to p10)')
        a0.set_ylim(-0.02, 1.02)
        ag.set_ylabel("recall on generated keys (mean)")
        ag.set_ylim(-0.02, 1.02)
        a1.set_ylabel("output error |o-o*|/|o*| (mean, band to p90)")
        a1.set_yscale("log")
        for a in (a0, ag, a1):
            a.set_xlabel("decode position t")
            a.grid(alpha=0.3)
            a.set_title(label, fontsize=9)
        a0.legend(fontsize=8, loc="lower left")
    first = runs[0][0]
    title = args.title or (f'kvbench: recall drift, k={first["protocol"]["k"]}, sink={first["protocol"]["sink"]}, '
                           f'local={first["protocol"]["local"]}, window={first["protocol"]["window"]} steps')
    fig.suptitle(title)
    fig.tight_layout()
    tmp = args.out + ".tmp" + os.path.splitext(args.out)[1]
    fig.savefig(tmp, dpi=130)
    os.replace(tmp, args.out)
    print(f"plot_drift.py: wrote {args.out}")


if __name__ == "__main__":
    main()
