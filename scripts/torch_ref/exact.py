#!/usr/bin/env python3
"""exact.py: the PyTorch peer of `kvbench bench --method exact` (issue 2, point 9): the
same shapes on the same GPU, written the way a PyTorch user would: float16 K and V laid
out [Hkv][T][D], the queries of a kv group batched against its keys (torch.matmul, one
batched GEMM; the softmax scale folded into q beforehand), torch.topk(k) on the [Hq][T]
scores, and torch.softmax + P @ V. Timing as kvbench's (common.py). GB/s is over the
bytes each stage must move (its scores are float16, 2 bytes, where kvbench keeps
float32).

  python3 scripts/torch_ref/exact.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    a = parser(__doc__).parse_args()
    b = Bench("exact", a)
    Hq, Hkv, D, k = a.q_heads, a.kv_heads, a.dim, a.k
    G = Hq // Hkv
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        V = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = (torch.randn(Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen) / math.sqrt(D)).contiguous()
        kk = min(k, T)
        Kt = K.transpose(1, 2)
        s = torch.matmul(q, Kt)  # [Hkv][G][T], float16
        kvb, sc, qb = Hkv * T * D * 2, Hq * T * 2, Hq * D * 2
        stages = (("score", lambda: torch.matmul(q, Kt), kvb + qb + sc),
                  ("topk", lambda: torch.topk(s.view(Hq, T), kk, dim=-1), sc + Hq * kk * 8),
                  ("attention", lambda: torch.matmul(torch.softmax(s, dim=-1), V), sc + kvb + Hq * D * 2),
                  ("exact", lambda: torch.topk(torch.matmul(q, Kt).view(Hq, T), kk, dim=-1), kvb + qb + Hq * kk * 8))
        for name, fn, nbytes in stages:
            b.time(T, name, fn, nbytes, kvb <= b.l2)
        del K, V, q, Kt, s
        torch.cuda.empty_cache()
    return b.finish("as kvbench bench, with float16 scores (2 bytes) and int64 indices")


if __name__ == "__main__":
    sys.exit(main())
