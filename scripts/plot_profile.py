#!/usr/bin/env python3
"""plot_profile.py: the oracle budget profile of a trace (issue 11): per drift window, the number of
retrievable-region tokens a query head needs (with sink and local) for its attention to reach mass p, for
p = 0.5, 0.8, 0.9, 0.95, 0.99: the median over steps and query heads as a line at the window's mean decode
position, the p10-p90 band around the p = 0.9 line (--bands all: around every line), and the region's size
(every token a full cache holds) dashed. One panel per trace/layer. The y axis is log above 1 token and
linear below (symlog), so "sink and local alone reach p" (0 tokens) stays on the figure. It says how sparse
a trace really is and how that changes over the generation, independent of any method.

Input: a `kvbench run` directory (its profile.csv) or a scripts/sweep.py folder (profile.csv with a trace
column); several may be given.

usage: scripts/plot_profile.py DIR... [--out FIG.png] [--mean] [--title TEXT] [--cols 3]
"""
import argparse
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvstyle  # noqa: E402


def load(dirs):
    rows = []
    for d in dirs:
        p = os.path.join(d, "profile.csv") if os.path.isdir(d) else d
        if not os.path.isfile(p):
            sys.exit(f"plot_profile.py: {p}: no such file (a kvbench run directory or a sweep folder holds "
                     f"profile.csv; runs made with --no-profile have none)")
        name = os.path.basename(os.path.normpath(d))
        for r in csv.DictReader(open(p, newline="")):
            r.setdefault("trace", name)
            rows.append(r)
    if not rows:
        sys.exit(f"plot_profile.py: {', '.join(dirs)}: no profile rows")
    return rows


def protocol(dirs):
    """(sink, local) of the first run (summary.json of a run directory, results.csv of a sweep)."""
    import json
    d = dirs[0] if os.path.isdir(dirs[0]) else os.path.dirname(dirs[0])
    if os.path.isfile(os.path.join(d, "summary.json")):
        p = json.load(open(os.path.join(d, "summary.json")))["protocol"]
        return p["sink"], p["local"]
    if os.path.isfile(os.path.join(d, "results.csv")):
        for r in csv.DictReader(open(os.path.join(d, "results.csv"))):
            return int(r["sink"]), int(r["local"])
    sys.exit(f"plot_profile.py: {d}: no summary.json or results.csv beside profile.csv to read sink and local from")


def main():
    ap = argparse.ArgumentParser(prog="plot_profile.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", default="")
    ap.add_argument("--mean", action="store_true", help="the mean over steps and heads instead of the median")
    ap.add_argument("--title", default="")
    ap.add_argument("--cols", type=int, default=3)
    ap.add_argument("--bands", default="0.9", help="p values with a p10-p90 band: a comma list, all or none")
    a = ap.parse_args()
    rows = load(a.dirs)
    sink_local = protocol(a.dirs)
    kvstyle.need_matplotlib("plot_profile.py")
    import matplotlib.pyplot as plt
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    panels = sorted({(r["trace"], r["layer"]) for r in rows}, key=lambda x: (x[0], int(x[1].lstrip("L") or 0)
                                                                             if x[1].lstrip("L").isdigit() else 0))
    ps = sorted({float(r["p"]) for r in rows})
    cmap = colormaps["viridis"]
    colour = {p: cmap(0.1 + 0.8 * i / max(1, len(ps) - 1)) for i, p in enumerate(ps)}
    ncol = min(a.cols, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig = plt.figure(figsize=(4.8 * ncol + 0.3, 3.4 * nrow + 0.9), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False)
    stat = "tokens_mean" if a.mean else "tokens_median"
    bands = set(ps) if a.bands == "all" else set() if a.bands == "none" else {float(x) for x in a.bands.split(",")}
    # the window's mean decode position: region_mean + sink + local - 1 (the region of step t is t+1-local-sink)
    pos = lambda r: float(r["region_mean"]) + float(r.get("sink") or sink_local[0]) + float(r.get("local") or
                                                                                            sink_local[1]) - 1
    for i, (trace, layer) in enumerate(panels):
        ax = axes[i // ncol][i % ncol]
        pr = [r for r in rows if (r["trace"], r["layer"]) == (trace, layer)]
        for p in ps:
            pts = sorted((pos(r), float(r[stat]), float(r["tokens_p10"]), float(r["tokens_p90"]))
                         for r in pr if float(r["p"]) == p)
            x = [q[0] for q in pts]
            if p in bands:
                ax.fill_between(x, [q[2] for q in pts], [q[3] for q in pts], color=colour[p], alpha=0.18, linewidth=0)
            ax.plot(x, [q[1] for q in pts], color=colour[p], linewidth=1.8, marker="o", markersize=3)
        reg = sorted((pos(r), float(r["region_mean"])) for r in pr if float(r["p"]) == ps[0])
        ax.plot([q[0] for q in reg], [q[1] for q in reg], color="#555555", linestyle="--", linewidth=1.2)
        ax.set_yscale("symlog", linthresh=1, linscale=0.4)
        ax.set_ylim(bottom=-0.25)  # a line at 0 tokens stays visible above the axis
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(f"{trace}, {layer}", fontsize=10)
        ax.set_xlabel("decode position (tokens; window mean)")
        if i % ncol == 0:
            ax.set_ylabel("region tokens needed")
    for j in range(len(panels), nrow * ncol):
        axes[j // ncol][j % ncol].set_visible(False)
    handles = [Line2D([], [], color=colour[p], linewidth=2, marker="o", markersize=3, label=f"mass p = {p:g}")
               for p in ps]
    handles.append(Line2D([], [], color="#555555", linestyle="--", label="retrievable region (all tokens)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3 if ncol == 1 else len(handles), frameon=False,
               fontsize=9)
    band_txt = "" if not bands else f"; band: p10-p90 of p = {', '.join(f'{b:g}' for b in sorted(bands))}"
    fig.suptitle(a.title or f"Oracle budget profile (sink {sink_local[0]}, local {sink_local[1]}):\n"
                            f"region tokens needed to reach attention mass p, "
                            f"{'mean' if a.mean else 'median'} over steps and query heads{band_txt}", fontsize=10)
    out = a.out or os.path.join(a.dirs[0] if os.path.isdir(a.dirs[0]) else os.path.dirname(a.dirs[0]), "profile.png")
    kvstyle.save(fig, out)
    print(f"plot_profile.py: wrote {out}")


if __name__ == "__main__":
    main()
