#!/usr/bin/env python3
"""bench_torch.py: the PyTorch peer of `kvbench bench --method exact` (issue 2,
point 9): the same shapes on the same GPU, written the way a PyTorch user
would: float16 K and V laid out [Hkv][T][D], the queries of a kv group
batched against its keys (torch.matmul, one batched GEMM; the softmax scale
folded into q beforehand), torch.topk(k) on the [Hq][T] scores, and
torch.softmax + P @ V. Stages and timing mirror kvbench's: CUDA events
around each stage, warm-up, median and p90 over repetitions, and before
every repetition a read of a buffer of 3x the L2 size so nothing is served
from L2. GB/s is over the bytes each stage must move (its scores are
float16, 2 bytes, where kvbench keeps float32), and % of the copy bandwidth
measured here with a device-to-device copy, read + write.

  python3 scripts/bench_torch.py --tokens 16384,131072,1048576 --csv out.csv
"""
import argparse
import csv
import math
import statistics
import sys

import torch


def percentile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo = int(pos)
    if lo + 1 >= len(v):
        return v[-1]
    return v[lo] + (pos - lo) * (v[lo + 1] - v[lo])


def timed(fn, flush, reps, warmup):
    for _ in range(warmup):
        flush()
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for e0, e1 in ev:
        flush()
        e0.record()
        fn()
        e1.record()
    torch.cuda.synchronize()
    us = [1e3 * e0.elapsed_time(e1) for e0, e1 in ev]
    return percentile(us, 0.5), percentile(us, 0.9)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="16384,131072,1048576")
    ap.add_argument("--q-heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_torch: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    Hq, Hkv, D, k = a.q_heads, a.kv_heads, a.dim, a.k
    G = Hq // Hkv
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    flush_buf = torch.full((max(3 * l2, 128 << 20) // 4,), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
    flush = lambda: flush_buf.sum()  # noqa: E731 (a read of 3x L2; one value written)
    copy = copy_bandwidth()
    print(f"torch {torch.__version__} on {props.name}: Hq={Hq} Hkv={Hkv} D={D} k={k}, float16 K and V; "
          f"{a.reps} reps after {a.warmup} warm-up", file=sys.stderr)
    print(f"torch peer on {props.name}")
    print(f"copy bandwidth (device-to-device copy, read + write): {copy:.0f} GB/s")
    print(f"{'tokens':>9}  {'stage':<9} {'median_us':>11} {'p90_us':>11} {'MB':>10} {'GB/s':>8} {'%copy':>7}")
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in [int(x) for x in a.tokens.split(",")]:
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        V = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = (torch.randn(Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen) / math.sqrt(D)).contiguous()
        kk = min(k, T)
        Kt = K.transpose(1, 2)
        s = torch.matmul(q, Kt)  # [Hkv][G][T], float16

        def score():
            return torch.matmul(q, Kt)

        def topk():
            return torch.topk(s.view(Hq, T), kk, dim=-1)

        def attention():
            return torch.matmul(torch.softmax(s, dim=-1), V)

        def exact():
            return torch.topk(torch.matmul(q, Kt).view(Hq, T), kk, dim=-1)

        kvb, sc, qb = Hkv * T * D * 2, Hq * T * 2, Hq * D * 2
        must = {"score": kvb + qb + sc, "topk": sc + Hq * kk * 8, "attention": sc + kvb + Hq * D * 2,
                "exact": kvb + qb + Hq * kk * 8}
        for name, fn in (("score", score), ("topk", topk), ("attention", attention), ("exact", exact)):
            med, p90 = timed(fn, flush, a.reps, a.warmup)
            gbs = must[name] / (med * 1e-6) / 1e9
            print(f"{T:>9}  {name:<9} {med:>11.1f} {p90:>11.1f} {must[name] / 1e6:>10.1f} {gbs:>8.0f} "
                  f"{100 * gbs / copy:>6.1f}%", flush=True)
            rows.append(["torch", "gpu", T, Hq, Hkv, D, k, name, f"{med:.3f}", f"{p90:.3f}", must[name], f"{gbs:.2f}",
                         f"{100 * gbs / copy:.2f}", f"{copy:.1f}", int(kvb <= l2), a.reps])
        del K, V, q, Kt, s
        torch.cuda.empty_cache()
    print("bytes: as kvbench bench, with float16 scores (2 bytes) and int64 indices; every timed repetition follows "
          f"a read of a {flush_buf.numel() * 4 / 1e6:.0f} MB buffer (L2 is {l2 / 1e6:.0f} MB)")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["method", "device", "tokens", "q_heads", "kv_heads", "dim", "k", "stage", "median_us", "p90_us",
                        "bytes", "gbps", "pct_copy", "copy_gbps", "fits_l2", "reps"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
