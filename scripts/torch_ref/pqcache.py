#!/usr/bin/env python3
"""pqcache.py: the PyTorch peer of `kvbench bench --method pqcache` (issue 5, point 6): the
same search written the way a researcher would prototype PQCache in PyTorch: float16 keys
[Hkv][T][D] cut into M sub-vectors, per (kv head, sub-vector) Lloyd k-means batched over
the Hkv*M jobs (distances as ||c||^2 - 2 X C^T with one bmm, argmin, index_add_ sums),
codes kept as uint8 [Hkv][M][T]; search = lookup tables by einsum, ADC by gather + sum
over the sub-vectors, softmax(score*scale) per query head summed over the group,
torch.topk per kv head. Stage names and bytes as kvbench's (kmeans, lut, adc_scan, topk,
search); kmeans is timed over 3 repetitions (a whole build each).

  python3 scripts/torch_ref/pqcache.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def kmeans(x, C, iters, gen):
    """x [J][n][d] float32 -> centroids [J][C][d], codes [J][n] (int64)."""
    J, n, d = x.shape
    pick = torch.stack([torch.randperm(n, device=x.device, generator=gen)[:C] for _ in range(J)])
    cent = torch.gather(x, 1, pick.unsqueeze(-1).expand(-1, -1, d)).clone()
    off = (torch.arange(J, device=x.device) * C).unsqueeze(1)
    for it in range(iters + 1):
        dist = (cent * cent).sum(-1).unsqueeze(1) - 2 * torch.bmm(x, cent.transpose(1, 2))  # [J][n][C]
        codes = dist.argmin(-1)
        if it == iters:
            break
        flat = (codes + off).view(-1)
        sums = torch.zeros(J * C, d, device=x.device).index_add_(0, flat, x.view(-1, d))
        cnt = torch.bincount(flat, minlength=J * C).unsqueeze(-1).to(x.dtype)
        cent = torch.where(cnt > 0, sums / cnt.clamp(min=1), cent.view(J * C, d)).view(J, C, d)
    return cent, codes


def main():
    ap = parser(__doc__)
    ap.add_argument("--M", type=int, default=2)
    ap.add_argument("--b", type=int, default=6)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    b = Bench("pqcache", a, f"M={a.M},b={a.b},iters={a.iters}")
    Hq, Hkv, D, k, M, C = a.q_heads, a.kv_heads, a.dim, a.k, a.M, 1 << a.b
    G, ds, scale = Hq // Hkv, D // M, 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hkv, G, D, device="cuda", dtype=torch.float32, generator=gen)
        state = {}

        def build():
            x = K.float().view(Hkv, T, M, ds).permute(0, 2, 1, 3).reshape(Hkv * M, T, ds)
            cent, codes = kmeans(x, C, a.iters, gen)
            state["cent"] = cent.view(Hkv, M, C, ds)
            state["codes"] = codes.view(Hkv, M, T).to(torch.uint8)

        kk = min(k, T)
        N = Hkv * T
        centb, qb, lutb, idxb = Hkv * D * C * 4, Hq * D * 4, Hq * M * C * 4, Hkv * kk * 8
        a_reps, a.reps = a.reps, 3
        a_warm, a.warmup = a.warmup, 1
        b.time(T, "kmeans", build, N * D * 2 + N * M + centb)
        a.reps, a.warmup = a_reps, a_warm
        cent, codes = state["cent"], state["codes"]
        qs = q.view(Hkv, G, M, ds)

        def lut():
            return torch.einsum("hgmd,hmcd->hgmc", qs, cent)  # [Hkv][G][M][C]

        L = lut()

        def adc(L):
            idx = codes.long().unsqueeze(1).expand(Hkv, G, M, T)  # [Hkv][G][M][T]
            s = torch.gather(L, 3, idx).sum(2)  # [Hkv][G][T]
            return torch.softmax(s * scale, dim=-1).sum(1)  # [Hkv][T]

        agg = adc(L)
        b.time(T, "lut", lut, centb + qb + lutb)
        b.time(T, "adc_scan", lambda: adc(L), N * M + lutb + N * 4)
        b.time(T, "topk", lambda: torch.topk(agg, kk, dim=-1), N * 4 + idxb)
        b.time(T, "search", lambda: torch.topk(adc(lut()), kk, dim=-1), N * M + centb + qb + idxb)
        del K, q, state, cent, codes, L, agg
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench (M={M} code bytes per key and kv head; int64 indices); kmeans = 3 whole "
                    "builds (float16 keys widened to float32, then Lloyd)")


if __name__ == "__main__":
    sys.exit(main())
