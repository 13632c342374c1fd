#!/usr/bin/env python3
"""plot_pareto.py: quality against cost for every method of a sweep (issue 11), from scripts/sweep.py's
summary.csv: one column per cost (effective budget = tokens retrieved per step, selected + extra; search
time per step, median, on the device of the runs; index bytes per token), one row per trace/layer (or one
row averaged over the layers of each trace, --average, or over everything, --average all). Every
parameter point of a method (each k, each grid point) is a marker in the method's colour (scripts/kvstyle.py),
with the seed standard deviation as an error bar where a method is seeded; the method's Pareto front (the
best quality at each cost over all its parameters) is the line. Log cost axes; a cost of 0 (a method
with no index: streaming, random) cannot sit on a log axis and is left out of that panel, as the caption
says.

usage: scripts/plot_pareto.py SWEEP_DIR... [--metric recall|mass|output_error] [--costs budget,time,bytes]
                              [--average [all]] [--out FIG.png] [--title TEXT]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvstyle  # noqa: E402
import pareto  # noqa: E402


def main():
    ap = argparse.ArgumentParser(prog="plot_pareto.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep folders (or their summary.csv)")
    ap.add_argument("--metric", choices=sorted(pareto.METRICS), default="recall")
    ap.add_argument("--costs", default="budget,time,bytes", help="comma list of budget, time, bytes")
    ap.add_argument("--average", nargs="?", const="layers", choices=["layers", "all"],
                    help="one row per trace averaged over its layers (or 'all': over every trace and layer)")
    ap.add_argument("--out", default="", help="PNG path (default SWEEP_DIR/pareto-METRIC.png)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    costs = [c.strip() for c in a.costs.split(",") if c.strip()]
    bad = [c for c in costs if c not in pareto.COSTS]
    if bad or not costs:
        sys.exit(f"plot_pareto.py: --costs: expected a comma list of {', '.join(pareto.COSTS)}, found '{a.costs}'")
    rows = pareto.load(a.sweeps)
    if a.average:
        rows = pareto.average_layers(rows, across_traces=a.average == "all")
    mcol, mlabel, higher = pareto.METRICS[a.metric]
    if all(r.get(mcol) is None for r in rows):
        sys.exit(f"plot_pareto.py: no {a.metric} values in the sweep (a trace without values has no output error)")
    kvstyle.need_matplotlib("plot_pareto.py")
    import matplotlib.pyplot as plt

    def layer_key(name):  # L6 before L14
        digits = "".join(ch for ch in name if ch.isdigit())
        return (int(digits) if digits else -1, name)
    panels = sorted({(r["trace"], r["layer"]) for r in rows}, key=lambda p: (p[0], layer_key(p[1])))
    methods = kvstyle.method_order(sorted({r["method"] for r in rows}))
    fig = plt.figure(figsize=(4.6 * len(costs) + 0.4, 3.7 * len(panels) + 0.9), layout="constrained")
    axes = fig.subplots(len(panels), len(costs), squeeze=False)
    dropped = set()
    devices = sorted({r["device"] for r in rows})
    for pi, (trace, layer) in enumerate(panels):
        prow = [r for r in rows if (r["trace"], r["layer"]) == (trace, layer)]
        for ci, cost in enumerate(costs):
            ax = axes[pi][ci]
            ccol, clabel = pareto.COSTS[cost]
            for m in methods:
                mr = [r for r in prow if r["method"] == m and r.get(mcol) is not None and r.get(ccol) is not None]
                pos = [r for r in mr if r[ccol] > 0]
                if len(pos) < len(mr):
                    dropped.add((m, cost))
                if not pos:
                    continue
                color, marker = kvstyle.style(m)
                xs, ys = [r[ccol] for r in pos], [r[mcol] for r in pos]
                err = [r.get(mcol.replace("_mean", "_std")) or 0 for r in pos]
                ax.errorbar(xs, ys, yerr=err if any(err) else None, fmt=marker, color=color, markersize=4.5,
                            alpha=0.45, elinewidth=0.9, capsize=1.5, linestyle="none")
                front = pareto.front_curve(pos, ccol, mcol, higher)
                ax.plot([c for c, _ in front], [q for _, q in front], color=color, marker=marker, markersize=5.5,
                        linewidth=1.8)
            ax.set_xscale("log")
            ax.grid(True, which="major", alpha=0.3)
            ax.grid(True, which="minor", alpha=0.1)
            if a.metric == "output_error":
                ax.set_yscale("log")
            ax.set_xlabel(clabel + (f" [{'/'.join(devices)}]" if cost == "time" else ""))
            if ci == 0:
                ax.set_ylabel(mlabel)
            ax.set_title(f"{trace}, {layer}", fontsize=10)
    kvstyle.legend_outside(fig, methods)
    title = a.title or f"{pareto.METRICS[a.metric][1]} against cost: each method's points (all k and parameters; " \
                       f"error bars: std over seeds) and its Pareto front"
    if dropped:
        title += "\npoints at cost 0 (no room on a log axis) left out: " + \
            ", ".join(sorted({f"{m} ({c})" for m, c in dropped}))
    fig.suptitle(title, fontsize=10)
    out = a.out or os.path.join(a.sweeps[0] if os.path.isdir(a.sweeps[0]) else os.path.dirname(a.sweeps[0]),
                                f"pareto-{a.metric}.png")
    kvstyle.save(fig, out)
    print(f"plot_pareto.py: wrote {out}")


if __name__ == "__main__":
    main()
