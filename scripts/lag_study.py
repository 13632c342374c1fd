#!/usr/bin/env python3
"""lag_study.py: how much does a step of query lag cost? Runs
`kvbench run --lag d` for each lag d (default 0,1,2,4,8,16,32) on one trace
layer, every method of --method in each run (the protocol scores step t's
exact attention while each method's search, append and build see the query
of t-d), and plots recall@k and output error against d, one line per method.
Writes OUT/lag<d>/ (each a kvbench run directory; an existing one is reused,
so the study resumes), OUT/lag.csv (method,params,lag,recall,recall_p10,
mass,output_error,mean_selected,method_metric) and OUT/lag.png. Talks to
kvbench only through its command line and result files.

usage: scripts/lag_study.py --trace T.h5 --method exact,quest,freekv [--layer L14]
       [--lags 0,1,2,4,8,16,32] [--out DIR] [--kvbench ./kvbench] [-- other run options]
"""
import argparse
import csv
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvstyle  # noqa: E402


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--method", required=True)
    ap.add_argument("--layer")
    ap.add_argument("--lags", default="0,1,2,4,8,16,32")
    ap.add_argument("--out", default="results/lag-study")
    ap.add_argument("--kvbench", default=os.environ.get("KVBENCH_BIN", "./kvbench"))
    ap.add_argument("--no-plot", action="store_true", help="write lag.csv only")
    a = ap.parse_args(argv)
    try:
        lags = [int(x) for x in a.lags.split(",")]
    except ValueError:
        sys.exit(f"lag_study.py: --lags {a.lags}: expected comma-separated non-negative integers")
    if any(d < 0 for d in lags):
        sys.exit(f"lag_study.py: --lags {a.lags}: a lag is negative")
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for d in lags:
        run_dir = os.path.join(a.out, f"lag{d}")
        summ = os.path.join(run_dir, "summary.json")
        if not os.path.isfile(summ):
            cmd = [a.kvbench, "run", "--trace", a.trace, "--method", a.method, "--lag", str(d), "--out", run_dir,
                   "--force", "--quiet"] + (["--layer", a.layer] if a.layer else []) + extra
            print("lag_study.py:", " ".join(cmd), file=sys.stderr)
            r = subprocess.run(cmd)
            if r.returncode != 0:
                sys.exit(f"lag_study.py: kvbench exited {r.returncode} at lag {d}")
        with open(summ) as f:
            s = json.load(f)
        if s["protocol"].get("lag", 0) != d:
            sys.exit(f"lag_study.py: {summ}: protocol.lag is {s['protocol'].get('lag')}, expected {d}")
        for m in s["methods"]:
            rows.append({"method": m["method"], "params": m["params"], "lag": d, "recall": m["recall"],
                         "recall_p10": m["recall_p10"], "mass": m["mass"], "output_error": m["output_error"],
                         "mean_selected": m["mean_selected"], "method_metric": m.get("method_metric")})
    csv_path = os.path.join(a.out, "lag.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    print(f"lag_study.py: {csv_path}")
    if a.no_plot:
        return
    kvstyle.need_matplotlib("lag_study.py")
    import matplotlib.pyplot as plt
    methods = kvstyle.method_order(list(dict.fromkeys(r["method"] for r in rows)))
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    xs = sorted(set(lags))
    pos = {d: i for i, d in enumerate(xs)}  # lag 0 on a log-like axis: evenly spaced ticks
    for m in methods:
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["lag"])
        x = [pos[r["lag"]] for r in rs]
        c, mk = kvstyle.style(m)
        ax[0].plot(x, [r["recall"] for r in rs], color=c, marker=mk, linewidth=1.8, markersize=6)
        oe = [r["output_error"] if r["output_error"] is not None else float("nan") for r in rs]
        ax[1].plot(x, oe, color=c, marker=mk, linewidth=1.8, markersize=6)
    for i, (t, yl) in enumerate((("recall@k", "mean recall@k"), ("output error", "mean relative output error"))):
        ax[i].set_xticks(range(len(xs)))
        ax[i].set_xticklabels([str(d) for d in xs])
        ax[i].set_xlabel("query lag d (steps): methods see q_{t-d}, scored against step t")
        ax[i].set_ylabel(yl)
        ax[i].set_title(t, fontsize=10)
        ax[i].grid(alpha=0.3)
    ax[1].set_yscale("log")
    s0 = json.load(open(os.path.join(a.out, f"lag{lags[0]}", "summary.json")))
    tr, pr = s0["trace"], s0["protocol"]
    fig.suptitle(f"{os.path.basename(tr['path'])} {tr['layer']}: cost of a lagged query\n"
                 f"k={pr['k']}, sink={pr['sink']}, local={pr['local']}, stride={pr['stride']}, "
                 f"{pr['steps_evaluated']} steps", fontsize=10)
    kvstyle.legend_outside(fig, methods)
    png = os.path.join(a.out, "lag.png")
    kvstyle.save(fig, png)
    print(f"lag_study.py: {png}")


if __name__ == "__main__":
    main()
