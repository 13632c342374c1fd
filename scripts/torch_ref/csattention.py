#!/usr/bin/env python3
"""csattention.py: the PyTorch peer of `kvbench bench --method csattention` (issue 9, point 4):
CSAttention's decode as a researcher would write it in PyTorch. Index as kvbench's bench
builds it: per kv head and subspace (m of D/m dims) C unit centroids = normalised key
sub-vectors at evenly spaced positions (the bench has no queries), the top-L keys of each
centroid by <c, k^(b)> (torch.topk, L = alpha * n) as (int32 index, float32 score) lists.
Search: per query head (pool none) or group mean (pool mean) the nearest centroid per
subspace (one bmm), gather the m lists, sum by key with scatter_add into a dense row
(missing = zero, the paper's sum), torch.topk. Stage names as kvbench's (build_lists,
reduce_dense, topk_dense: kvbench's dense-accumulator variant, which this is; search, beside kvbench's
default tiled search).

  python3 scripts/torch_ref/csattention.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    ap = parser(__doc__)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--C", type=int, default=128)
    ap.add_argument("--alpha", type=float, default=0.25)
    ap.add_argument("--pool", choices=["none", "mean"], default="none")
    a = ap.parse_args()
    b = Bench("csattention", a, f"m={a.m},C={a.C},alpha={a.alpha},pool={a.pool}")
    Hq, Hkv, D, k, m, C = a.q_heads, a.kv_heads, a.dim, a.k, a.m, a.C
    G, ds = Hq // Hkv, D // a.m
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        L = max(1, min(T, math.ceil(a.alpha * T)))
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hq, D, device="cuda", dtype=torch.float32, generator=gen)
        Kb = K.view(Hkv, T, m, ds).permute(0, 2, 1, 3)  # [Hkv][m][T][ds]
        pos = ((2 * torch.arange(C, device="cuda") + 1) * T) // (2 * C)
        cent = torch.nn.functional.normalize(Kb[:, :, pos].float(), dim=-1)  # [Hkv][m][C][ds]

        def build():
            idx = torch.empty(Hkv, m, C, L, dtype=torch.int32, device="cuda")
            val = torch.empty(Hkv, m, C, L, dtype=torch.float32, device="cuda")
            for g in range(Hkv):
                for s in range(m):
                    sc = cent[g, s] @ Kb[g, s].float().T  # [C][T]
                    v, i = torch.topk(sc, L, dim=-1)
                    idx[g, s], val[g, s] = i.int(), v
            return idx, val

        idx, val = build()
        R = Hq if a.pool == "none" else Hkv
        kv_of_row = torch.arange(R, device="cuda") // (G if a.pool == "none" else 1)

        def reduce():
            qv = q if a.pool == "none" else q.view(Hkv, G, D).mean(1)
            qb = qv.view(R, m, ds)
            c = cent[kv_of_row]  # [R][m][C][ds]
            j = torch.einsum("rmd,rmcd->rmc", qb, c).argmax(-1)  # [R][m]
            li = idx[kv_of_row.unsqueeze(1), torch.arange(m, device="cuda"), j]  # [R][m][L]
            lv = val[kv_of_row.unsqueeze(1), torch.arange(m, device="cuda"), j]
            acc = torch.full((R, T), float("-inf"), device="cuda")
            hit = torch.zeros(R, T, device="cuda")
            hit.scatter_(1, li.view(R, -1).long(), 1.0)
            acc = torch.where(hit > 0, torch.zeros_like(acc), acc)
            acc.scatter_add_(1, li.view(R, -1).long(), lv.view(R, -1))
            return acc

        acc = reduce()
        lists = R * m * L * 8
        reps, warm = a.reps, a.warmup
        a.reps, a.warmup = min(3, reps), 0  # the build is long: 3 runs, as kvbench bench
        b.time(T, "build_lists", build, Hkv * m * (T * ds * 2 + C * T * 4 * 2 + C * L * 8))
        a.reps, a.warmup = reps, warm
        b.time(T, "reduce_dense", reduce, lists + 3 * R * T * 4)
        b.time(T, "topk_dense", lambda: torch.topk(acc, min(k, T), dim=-1), R * T * 4 + R * k * 8)
        b.time(T, "search", lambda: torch.topk(reduce(), min(k, T), dim=-1), lists + R * k * 8)
        del K, q, Kb, cent, idx, val, acc
        torch.cuda.empty_cache()
    return b.finish("as kvbench bench: lists of int32 index + float32 score (8 B per entry), dense float32 "
                    f"accumulator per row; m={m} C={C} alpha={a.alpha} pool={a.pool}, missing=zero")


if __name__ == "__main__":
    sys.exit(main())
