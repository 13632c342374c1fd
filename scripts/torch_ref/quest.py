#!/usr/bin/env python3
"""quest.py: the PyTorch peer of `kvbench bench --method quest` (issue 5, point 6): Quest
as a researcher would write it in PyTorch: float16 keys [Hkv][T][D] viewed as pages
[Hkv][P][page][D], page min/max by amin/amax (float16); the page bound
sum_i max(q_i*max_i, q_i*min_i) computed without the [P][D] intermediate as
relu(q) @ max^T - relu(-q) @ min^T (equal, since max >= min: q_i >= 0 picks max_i), one
batched matmul pair per group; pool none (per query head, default), mean (softmax over
pages averaged over the group) or max; torch.topk over pages, expansion to token ids.
Stage names and bytes as kvbench's (summary, bound_scan, topk, search).

  python3 scripts/torch_ref/quest.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    ap = parser(__doc__)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--pool", choices=["none", "mean", "max"], default="none")
    a = ap.parse_args()
    b = Bench("quest", a, f"page={a.page},pool={a.pool}")
    Hq, Hkv, D, k, pg = a.q_heads, a.kv_heads, a.dim, a.k, a.page
    G, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        P = T // pg
        kp = max(1, min(k // pg, P))
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen)
        Kp = K[:, :P * pg].view(Hkv, P, pg, D)

        def summary():
            return Kp.amin(2), Kp.amax(2)  # [Hkv][P][D] each

        kmin, kmax = summary()
        qpos, qneg = q.clamp(min=0), q.clamp(max=0)

        def bounds():
            s = torch.matmul(qpos, kmax.transpose(1, 2)) + torch.matmul(qneg, kmin.transpose(1, 2))  # [Hkv][G][P]
            s = s.float()
            if a.pool == "mean":
                return torch.softmax(s * scale, dim=-1).mean(1)  # [Hkv][P]
            if a.pool == "max":
                return s.amax(1)
            return s.view(Hq, P)

        B = bounds()
        ar = torch.arange(pg, device="cuda")

        def select(B):
            pages = torch.topk(B, kp, dim=-1).indices  # [R][kp]
            return (pages.unsqueeze(-1) * pg + ar).flatten(1)  # token ids [R][kp*page]

        R = Hq if a.pool == "none" else Hkv
        summ = Hkv * P * 2 * D * 2
        b.time(T, "summary", summary, Hkv * P * pg * D * 2 + summ)
        b.time(T, "bound_scan", bounds, summ + Hq * D * 2 + R * P * 4)
        b.time(T, "topk", lambda: torch.topk(B, kp, dim=-1), R * P * 4 + R * kp * 8)
        b.time(T, "search", lambda: select(bounds()), summ + Hq * D * 2 + R * kp * 8)
        del K, q, Kp, kmin, kmax, B
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench: float16 min/max, 2 x D x 2 B per page and kv head, page={pg}, pool={a.pool}; "
                    "int64 page ids; search includes the expansion to token ids")


if __name__ == "__main__":
    sys.exit(main())
