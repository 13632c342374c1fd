#!/usr/bin/env python3
"""evidence_figures.py: redraws a drift figure from the committed evidence
(results/evidence/) instead of the run directories, which are not
committed: each DRIFT_CSV (a run's drift.csv, saved as
drift/<stem>-<trace>-<layer>.csv) is paired with its row in SUMMARY_CSV
(a run_traces.sh summary.csv: trace, layer, model, num_tokens,
prefill_len, k, and sink/local/window when the CSV has those columns,
else --sink/--local; the window is read off the drift CSV), a minimal run
directory is written to a temporary folder, and scripts/plot_drift.py
draws it, so the figure is the one plot_drift.py draws from the runs.

usage: scripts/evidence_figures.py --summary results/evidence/real-methods.csv \\
         results/evidence/drift/real-methods-long-gen-L14.csv results/evidence/drift/real-methods-long-input-L14.csv \\
         -o results/figures/drift_methods_L14.png [--sink 4 --local 64] [--title T]
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

ME = "evidence_figures.py"


def suffixes(trace):
    """The trace's file stem and each of its '-'-separated tails: qwen2.5-0.5b-long-gen, 0.5b-long-gen, long-gen, gen."""
    parts = os.path.basename(trace).rsplit(".", 1)[0].split("-")
    return ["-".join(parts[i:]) for i in range(len(parts))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drift", nargs="+", help="drift CSVs named <stem>-<trace>-<layer>.csv")
    ap.add_argument("--summary", required=True, help="the run_traces.sh summary.csv of those runs")
    ap.add_argument("--sink", type=int, default=4, help="protocol sink when the CSV has no sink column (default 4)")
    ap.add_argument("--local", type=int, default=64, help="protocol local window when the CSV has none (default 64)")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    rows = list(csv.DictReader(open(args.summary)))
    tmp = tempfile.mkdtemp(prefix="kvbench-evidence-")
    try:
        dirs = []
        for path in args.drift:
            base = os.path.splitext(os.path.basename(path))[0]
            match = [r for r in rows if any(base.endswith("-" + tail + "-" + r["layer"]) for tail in suffixes(r["trace"]))]
            if not match:
                sys.exit(f"{ME}: {path}: no row of {args.summary} has its trace and layer")
            r = match[0]
            drift = list(csv.DictReader(open(path)))
            if not drift:
                sys.exit(f"{ME}: {path}: no rows")
            window = int(drift[0]["step_end"]) - int(drift[0]["step_start"])
            d = os.path.join(tmp, base)
            os.makedirs(d)
            shutil.copy(path, os.path.join(d, "drift.csv"))
            summary = {"trace": {"path": r["trace"], "layer": r["layer"], "model": r["model"],
                                 "num_tokens": int(r["num_tokens"]), "prefill_len": int(r["prefill_len"])},
                       "protocol": {"k": int(r["k"]), "sink": int(r.get("sink") or args.sink),
                                    "local": int(r.get("local") or args.local), "window": window,
                                    "stride": int(r.get("stride") or 1)}}
            json.dump(summary, open(os.path.join(d, "summary.json"), "w"))
            dirs.append(d)
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_drift.py"), *dirs,
               "-o", args.out] + (["--title", args.title] if args.title else [])
        sys.exit(subprocess.call(cmd))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
