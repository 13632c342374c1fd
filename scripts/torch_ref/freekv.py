#!/usr/bin/env python3
"""freekv.py: the PyTorch peer of `kvbench bench --method freekv` (issue 10): FreeKV's
selection as a researcher would write it in PyTorch, stage by stage as kvbench reports it:
Quest's pages (float16 min/max by amin/amax), the bound relu(q) @ max^T - relu(-q) @ min^T,
the group-consistent page score (softmax over pages per query head, averaged over the
group), torch.topk over pages and the expansion to token ids (select_spec: the speculative
selection with q_{t-1}, off the critical path), and the correction test on it: the cosine
of q_t and q_{t-1} per query head, averaged over the group, compared with tau
(cosine_test). A corrected head adds one select_spec to the critical path.

  python3 scripts/torch_ref/freekv.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    ap = parser(__doc__)
    ap.add_argument("--page", type=int, default=32)
    ap.add_argument("--tau", type=float, default=0.9)
    a = ap.parse_args()
    b = Bench("freekv", a, f"page={a.page},tau={a.tau},correct=1")
    Hq, Hkv, D, k, pg = a.q_heads, a.kv_heads, a.dim, a.k, a.page
    G, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        P = T // pg
        kp = max(1, min(k // pg, P))
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen)
        qprev = (0.9 * q.float() + 0.4 * torch.randn(Hkv, G, D, device="cuda", generator=gen)).half()
        Kp = K[:, :P * pg].view(Hkv, P, pg, D)

        def summary():
            return Kp.amin(2), Kp.amax(2)

        kmin, kmax = summary()
        ar = torch.arange(pg, device="cuda")

        def select(qq):
            s = torch.matmul(qq.clamp(min=0), kmax.transpose(1, 2)) + torch.matmul(qq.clamp(max=0), kmin.transpose(1, 2))
            pooled = torch.softmax(s.float() * scale, dim=-1).mean(1)  # [Hkv][P]
            pages = torch.topk(pooled, kp, dim=-1).indices
            return (pages.unsqueeze(-1) * pg + ar).flatten(1)

        def cosine_test():
            c = torch.nn.functional.cosine_similarity(q.double(), qprev.double(), dim=-1)  # [Hkv][G]
            return c.mean(1) < a.tau  # [Hkv] correction flags

        summ = Hkv * P * 2 * D * 2
        b.time(T, "summary", summary, Hkv * P * pg * D * 2 + summ)
        b.time(T, "select_spec", lambda: select(qprev), summ + Hq * D * 2 + Hkv * kp * 8)
        b.time(T, "cosine_test", cosine_test, 2 * Hq * D * 2 + Hkv)
        del K, q, qprev, Kp, kmin, kmax
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench: float16 min/max, page={pg}, group-mean page softmax; select_spec off the "
                    "critical path, cosine_test on it (plus select_spec when a head is corrected)")


if __name__ == "__main__":
    sys.exit(main())
