"""common.py: what the PyTorch peers of `kvbench bench` share (scripts/torch_ref/<method>.py):
the command line (same shapes and defaults as kvbench bench), the timing (CUDA events
around each stage, warm-up, median and p90 over repetitions, a read of 3x the L2
before every repetition so nothing is served from L2), the copy bandwidth (a
device-to-device copy, read + write) and the CSV rows, in kvbench bench's columns so
scripts/device_check.sh can put the two side by side.
"""
import argparse
import csv
import os
import statistics
import sys

import torch

CSV_HEADER = ["method", "device", "tokens", "q_heads", "kv_heads", "dim", "k", "stage", "median_us", "p90_us",
              "bytes", "gbps", "pct_copy", "copy_gbps", "fits_l2", "reps", "params", "cpu_threads", "load1"]


def percentile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo = int(pos)
    if lo + 1 >= len(v):
        return v[-1]
    return v[lo] + (pos - lo) * (v[lo + 1] - v[lo])


def copy_bandwidth(nbytes=1 << 30, reps=20):
    a = torch.full((nbytes,), 0x5A, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for e0, e1 in ev:
        e0.record()
        b.copy_(a)
        e1.record()
    torch.cuda.synchronize()
    ms = statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)
    del a, b
    return 2 * nbytes / (ms * 1e-3) / 1e9


def parser(doc):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--tokens", default="16384,131072,1048576")
    ap.add_argument("--q-heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv")
    return ap


class Bench:
    """One peer's session: flush buffer, copy bandwidth, the printed table and the CSV rows."""

    def __init__(self, method, args, params=""):
        if not torch.cuda.is_available():
            print(f"torch_ref/{method}: no CUDA device visible to PyTorch", file=sys.stderr)
            sys.exit(2)
        self.method, self.a, self.params = method, args, params
        props = torch.cuda.get_device_properties(0)
        self.l2 = getattr(props, "L2_cache_size", 50 << 20)
        self.flush_buf = torch.full((max(3 * self.l2, 128 << 20) // 4,), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
        self.copy = copy_bandwidth()
        self.rows = []
        print(f"torch {torch.__version__} on {props.name}: {method} peer, Hq={args.q_heads} Hkv={args.kv_heads} "
              f"D={args.dim} k={args.k}; {args.reps} reps after {args.warmup} warm-up", file=sys.stderr)
        print(f"torch {method} peer on {props.name}")
        print(f"copy bandwidth (device-to-device copy, read + write): {self.copy:.0f} GB/s")
        print(f"{'method':<10} {'tokens':>9}  {'stage':<11} {'median_us':>11} {'p90_us':>11} {'MB':>10} {'GB/s':>8} "
              f"{'%copy':>7}")

    def flush(self):
        self.flush_buf.sum()  # a read of 3x L2; one value written

    def time(self, tokens, stage, fn, nbytes, fits_l2=False):
        """Times fn() (launches on the current stream) and records the row."""
        a = self.a
        for _ in range(a.warmup):
            self.flush()
            fn()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
        for e0, e1 in ev:
            self.flush()
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        us = [1e3 * e0.elapsed_time(e1) for e0, e1 in ev]
        med, p90 = percentile(us, 0.5), percentile(us, 0.9)
        gbs = nbytes / (med * 1e-6) / 1e9
        print(f"{self.method:<10} {tokens:>9}  {stage:<11} {med:>11.1f} {p90:>11.1f} {nbytes / 1e6:>10.1f} {gbs:>8.0f} "
              f"{100 * gbs / self.copy:>6.1f}%", flush=True)
        self.rows.append([self.method, "gpu", tokens, a.q_heads, a.kv_heads, a.dim, a.k, stage, f"{med:.3f}",
                          f"{p90:.3f}", int(nbytes), f"{gbs:.2f}", f"{100 * gbs / self.copy:.2f}", f"{self.copy:.1f}",
                          int(fits_l2), a.reps, self.params, torch.get_num_threads(), f"{os.getloadavg()[0]:.2f}"])
        return med

    def tokens(self):
        return [int(x) for x in self.a.tokens.split(",")]

    def finish(self, bytes_note):
        print(f"bytes: {bytes_note}; every timed repetition follows a read of a "
              f"{self.flush_buf.numel() * 4 / 1e6:.0f} MB buffer (L2 is {self.l2 / 1e6:.0f} MB)")
        if self.a.csv:
            with open(self.a.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(CSV_HEADER)
                w.writerows(self.rows)
        return 0
