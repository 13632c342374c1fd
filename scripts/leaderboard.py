#!/usr/bin/env python3
"""leaderboard.py: one-number summaries per method from a sweep (issue 11), as a Markdown table.

Per method, over all its parameter points and budgets (its Pareto front: the best quality reached at each
effective budget by any of its parameter settings), on the sweep's rows averaged over layers and traces:
- recall AUC: the mean of recall@k over log effective budget in [--budget-min, --budget-max] (default 16 ..
  1024 tokens; the area under the front on a log axis divided by log(1024/16)); 0 below a method's smallest
  measured budget, its best value above its largest;
- budget to recall 0.9 and to output error 0.05: the smallest effective budget at which the front reaches
  the target, log-linearly interpolated between measured points, or "not reached";
- the same two at equal time: the search time per step (median, microseconds) at which the recall-vs-time and
  error-vs-time fronts reach the targets, from the runs' own timings; the device column says where they were
  measured (the README compares methods on GPU time: use a sweep run with [protocol] device = "gpu").
Seeded methods enter with their mean over seeds. Standard library only.

usage: scripts/leaderboard.py SWEEP_DIR... [--budget-min 16] [--budget-max 1024] [--recall 0.9]
                              [--error 0.05] [--out TABLE.md]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pareto  # noqa: E402


def fmt(x, unit="", digits=0):
    if x is None:
        return "not reached"
    return f"{x:.{digits}f}{unit}"


def board(rows, lo, hi, r_target, e_target):
    out = []
    for m in sorted({r["method"] for r in rows}):
        mr = [r for r in rows if r["method"] == m]
        rec_b = pareto.front_curve(mr, "budget_effective_mean", "recall_mean", True)
        err_b = pareto.front_curve(mr, "budget_effective_mean", "output_error_mean", False)
        rec_t = pareto.front_curve(mr, "search_us_median_mean", "recall_mean", True)
        err_t = pareto.front_curve(mr, "search_us_median_mean", "output_error_mean", False)
        out.append({
            "method": m, "points": len(mr), "params": len({r["params"] for r in mr}),
            "auc": pareto.auc_log(rec_b, lo, hi) if rec_b else None,
            "best": max((q for _, q in rec_b), default=None),
            "b_rec": pareto.cost_to_reach(rec_b, r_target, True),
            "b_err": pareto.cost_to_reach(err_b, e_target, False) if err_b else None,
            "t_rec": pareto.cost_to_reach(rec_t, r_target, True),
            "t_err": pareto.cost_to_reach(err_t, e_target, False) if err_t else None,
            "device": "/".join(sorted({r["device"] for r in mr})),
        })
    out.sort(key=lambda o: -(o["auc"] or 0))
    return out


def main():
    ap = argparse.ArgumentParser(prog="leaderboard.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--budget-min", type=float, default=16)
    ap.add_argument("--budget-max", type=float, default=1024)
    ap.add_argument("--recall", type=float, default=0.9)
    ap.add_argument("--error", type=float, default=0.05)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not 0 < a.budget_min < a.budget_max:
        sys.exit("leaderboard.py: expected 0 < --budget-min < --budget-max")
    raw = pareto.load(a.sweeps)
    rows = pareto.average_layers(raw, across_traces=True)
    panels = sorted({(r["trace"], r["layer"]) for r in raw})
    b = board(rows, a.budget_min, a.budget_max, a.recall, a.error)
    lo, hi = f"{a.budget_min:g}", f"{a.budget_max:g}"
    lines = [f"Leaderboard: {len(panels)} trace/layer panel(s) ({', '.join(f'{t} {l}' for t, l in panels[:6])}"
             f"{', ...' if len(panels) > 6 else ''}), averaged; each method's Pareto front over its parameters.",
             "",
             f"| method | recall AUC, budget {lo}-{hi} (log) | best recall | budget to recall {a.recall:g} "
             f"| budget to error {a.error:g} | µs/step to recall {a.recall:g} | µs/step to error {a.error:g} "
             f"| timed on | points |",
             "|---|---|---|---|---|---|---|---|---|"]
    for o in b:
        lines.append(f"| {o['method']} | {fmt(o['auc'], digits=3)} | {fmt(o['best'], digits=3)} | {fmt(o['b_rec'])} "
                     f"| {fmt(o['b_err'])} | {fmt(o['t_rec'], digits=1)} | {fmt(o['t_err'], digits=1)} "
                     f"| {o['device']} | {o['points']} ({o['params']} param set{'s' if o['params'] > 1 else ''}) |")
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
