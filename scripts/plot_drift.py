#!/usr/bin/env python3
"""plot_drift.py: recall@k, recall on the generated keys (the top-k
members generated after the index was built, the drift panel) and output
error per decode window, from kvbench run directories (drift.csv +
summary.json), one line per method with its p10 band (recall) / p90 band
(output error). Talks to kvbench only through its result files.

usage: scripts/plot_drift.py RESULT_DIR [RESULT_DIR ...] -o drift.png [--title T]
Several directories (e.g. one per layer or per trace) become one row of
panels each. Each method has one colour and marker in every figure
(scripts/kvstyle.py); one legend below the panels. A window's point sits
at the middle of the decode positions it covers (the last window ends at
the end of the trace). A run of a trace without values (V) has no output
error: its panel says so. --title replaces the first title line; the
protocol line (k, sink, local, window) is always printed under it.
Interpreter: any python3 with matplotlib; without it the script re-runs
itself with the project's .venv/bin/python (make pydeps).
"""
import argparse
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvstyle  # noqa: E402

ME = "plot_drift.py"


def fail(msg):
    sys.exit(f"{ME}: {msg}")


def num(x):
    return float(x) if x not in (None, "") else math.nan


SELECT = {}  # --layer/--k/--seed: which rows of a run over several layers, budgets or seeds (issue 11)


def load(run_dir):
    summ_path = os.path.join(run_dir, "summary.json")
    drift_path = os.path.join(run_dir, "drift.csv")
    for p in (summ_path, drift_path):
        if not os.path.isfile(p):
            fail(f"{p}: missing (expected a kvbench run directory)")
    try:
        with open(summ_path) as f:
            summary = json.load(f)
        tr, pr = summary["trace"], summary["protocol"]
        T = int(tr["num_tokens"])
        for key in ("k", "sink", "local", "window"):
            pr[key]
    except (ValueError, KeyError, TypeError) as e:
        fail(f"{summ_path}: not a kvbench summary ({type(e).__name__}: {e})")
    series = {}
    # a run over several layers/budgets/seeds: one (layer, k, seed) per figure, by default the summary's first
    # layer, its largest k (protocol.k) and its --seed; drift.csv files before issue 11 have no such columns
    want = {"layer": SELECT.get("layer") or tr.get("layer"), "k": str(SELECT.get("k") or pr["k"]),
            "seed": str(SELECT.get("seed") if SELECT.get("seed") is not None else pr.get("seed", 0))}
    pr["k"] = int(want["k"])
    tr["layer"] = want["layer"]
    with open(drift_path, newline="") as f:
        for row in csv.DictReader(f):
            if any(c in row and row[c] != v for c, v in want.items()):
                continue
            s = series.setdefault(row["method"], {k: [] for k in ("x", "r", "r10", "e", "e90", "g")})
            lo, hi = float(row["step_start"]), min(float(row["step_end"]), T)  # the last window ends at T
            s["x"].append(0.5 * (lo + hi - 1))
            s["r"].append(num(row["recall_mean"]))
            s["r10"].append(num(row["recall_p10"]))
            s["e"].append(num(row["outerr_mean"]))
            s["e90"].append(num(row["outerr_p90"]))
            s["g"].append(num(row.get("recall_generated_keys")))
    if not series:
        fail(f"{drift_path}: no rows (the run evaluated no decode step, or none has layer {want['layer']}, "
             f"k {want['k']}, seed {want['seed']})")
    return summary, series


def finite(v):
    return [x for x in v if not math.isnan(x)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="kvbench run directories")
    ap.add_argument("-o", "--out", required=True, help="output image (png, pdf, svg)")
    ap.add_argument("--title", default=None, help="first title line (the protocol line is kept)")
    ap.add_argument("--layer", default=None, help="a run over several layers: the layer to draw (default: its first)")
    ap.add_argument("--k", type=int, default=None, help="a run over several budgets: the k to draw (default: the largest)")
    ap.add_argument("--seed", type=int, default=None, help="a run over several seeds: the seed to draw (default: --seed)")
    args = ap.parse_args()
    SELECT.update(layer=args.layer, k=args.k, seed=args.seed)
    runs = [load(d) for d in args.runs]  # input errors before matplotlib is looked for
    kvstyle.need_matplotlib(ME)
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(16, 3.9 * len(runs) + 1.0), layout="constrained")
    rows = fig.subfigures(len(runs), 1, squeeze=False)[:, 0]
    methods = set()
    for row, (summary, series) in zip(rows, runs):
        tr, pr = summary["trace"], summary["protocol"]
        row.suptitle(f'{os.path.basename(tr["path"])}  {tr["layer"]}   ({tr["model"]}, '
                     f'T={tr["num_tokens"]}, P={tr["prefill_len"]})', fontsize=10)
        a0, ag, a1 = row.subplots(1, 3)
        have_err = False
        for method in kvstyle.method_order(series):
            s = series[method]
            methods.add(method)
            c, mk = kvstyle.style(method)
            every = max(1, len(s["x"]) // 8)
            kw = dict(color=c, marker=mk, markevery=every, markersize=5, linewidth=1.6)
            a0.plot(s["x"], s["r"], **kw)
            a0.fill_between(s["x"], s["r10"], s["r"], color=c, alpha=0.12, linewidth=0)
            ag.plot(s["x"], s["g"], **kw)
            if any(x > 0 for x in finite(s["e"])):
                have_err = True
                a1.plot(s["x"], s["e"], **kw)
                a1.fill_between(s["x"], s["e"], s["e90"], color=c, alpha=0.12, linewidth=0)
        a0.set_title(f'recall@{pr["k"]} (mean; band to p10)', fontsize=10)
        ag.set_title("recall on generated keys (mean)", fontsize=10)
        a1.set_title("output error |o-o*|/|o*| (mean; band to p90)", fontsize=10)
        for a in (a0, ag):
            a.set_ylim(-0.02, 1.02)
        if have_err:
            a1.set_yscale("log")
        else:
            a1.set_yticks([])
            a1.text(0.5, 0.5, "no output error:\nthe trace has no values (V)", ha="center", va="center",
                    transform=a1.transAxes, fontsize=10, color="#555555")
        T = int(tr["num_tokens"])
        for a in (a0, ag, a1):
            a.set_xlabel("decode position t")
            a.set_xlim(int(tr["prefill_len"]), T)
            a.grid(alpha=0.3)
    first = runs[0][0]["protocol"]
    proto = (f'k={first["k"]}, sink={first["sink"]}, local={first["local"]}, window={first["window"]} decode steps'
             f'{", stride " + str(first["stride"]) if first.get("stride", 1) != 1 else ""}')
    if any((s["protocol"]["k"], s["protocol"]["sink"], s["protocol"]["local"], s["protocol"]["window"]) !=
           (first["k"], first["sink"], first["local"], first["window"]) for s, _ in runs):
        proto += " (first row; the rows differ)"
    fig.suptitle(f'{args.title or "kvbench: recall drift per decode window"}\n{proto}', fontsize=12)
    kvstyle.legend_outside(fig, methods)
    kvstyle.save(fig, args.out)
    print(f"{ME}: wrote {args.out}")


if __name__ == "__main__":
    main()
