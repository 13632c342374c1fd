#!/usr/bin/env python3
"""bench_table.py: Markdown tables from `kvbench bench --csv` and a PyTorch peer's CSV
(scripts/torch_ref/*.py), side by side: per method, one row per (tokens, stage) with
kvbench's median µs, GB/s and % of the copy bandwidth, the peer's µs and the speedup.
Talks to kvbench only through its CSV files.

usage: scripts/bench_table.py KVBENCH.csv [TORCH.csv] [--method pariskv] [--stages search,exact]
"""
import argparse
import csv
import sys


def load(path):
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[(r["method"], int(r["tokens"]), r["stage"])] = r
    return rows


def fmt_tokens(t):
    return f"{t >> 20}M" if t % (1 << 20) == 0 else f"{t >> 10}K" if t % 1024 == 0 else str(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kvbench_csv")
    ap.add_argument("torch_csv", nargs="?")
    ap.add_argument("--method", help="only these methods (comma-separated)")
    ap.add_argument("--stages", help="only these stages (comma-separated)")
    a = ap.parse_args()
    kv = load(a.kvbench_csv)
    th = load(a.torch_csv) if a.torch_csv else {}
    methods = list(dict.fromkeys(m for m, _, _ in kv))
    if a.method:
        methods = [m for m in methods if m in a.method.split(",")]
    keep = set(a.stages.split(",")) if a.stages else None
    for m in methods:
        stages = list(dict.fromkeys(s for mm, _, s in kv if mm == m))
        tokens = sorted({t for mm, t, _ in kv if mm == m})
        print(f"| {m}: tokens | stage | kvbench µs (p90) | GB/s | % copy | torch µs | speedup |")
        print("|---|---|---|---|---|---|---|")
        for t in tokens:
            for s in stages:
                if keep and s not in keep:
                    continue
                r = kv.get((m, t, s))
                if not r:
                    continue
                p = th.get((m, t, s))
                med = float(r["median_us"])
                peer = f"{float(p['median_us']):.1f} | {float(p['median_us']) / med:.2f}×" if p else "– | –"
                print(f"| {fmt_tokens(t)} | {s} | {med:.1f} ({float(r['p90_us']):.1f}) | {float(r['gbps']):.0f} | "
                      f"{float(r['pct_copy']):.1f}% | {peer} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
