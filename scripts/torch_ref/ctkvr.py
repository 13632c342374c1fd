#!/usr/bin/env python3
"""ctkvr.py: the PyTorch peer of `kvbench bench --method ctkvr` (issue 9, point 4): CTKVR's
decode as a researcher would write it in PyTorch. Index as kvbench's bench builds it: C
slot queries = the keys at C evenly spaced positions (the bench has no prefill queries;
C = min(2048, n/16)), per slot and kv head the top rho keys (rho = 2.5 k) by the group
max of the log-softmax of the slot's scores. Search: cosine of the query to every slot
(max over the group), torch.topk C' slots, gather their lists, torch.unique (sorted
dedup), rerank = scores of the union keys, group max of log-softmax, torch.topk k.
Stage names as kvbench's (build, recall, gather, rerank, search).

  python3 scripts/torch_ref/ctkvr.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    ap = parser(__doc__)
    ap.add_argument("--C", type=int, default=0, help="slots (0: min(2048, n/16))")
    ap.add_argument("--cp", type=int, default=4)
    ap.add_argument("--rho", type=int, default=0, help="keys per list (0: ceil(2.5 k))")
    a = ap.parse_args()
    b = Bench("ctkvr", a, f"C={a.C},cp={a.cp},rho={a.rho}")
    Hq, Hkv, D, k = a.q_heads, a.kv_heads, a.dim, a.k
    G, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    rho = a.rho or math.ceil(2.5 * k)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        C = a.C or max(1, min(2048, T // 16))
        cp = min(a.cp, C)
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen)
        pos = ((2 * torch.arange(C, device="cuda") + 1) * T) // (2 * C)
        cq = K[:, pos].unsqueeze(2).expand(Hkv, C, G, D).transpose(1, 2).contiguous()  # [Hkv][G][C][D]

        def build():
            out = torch.empty(Hkv, C, rho, dtype=torch.int64, device="cuda")
            for g in range(Hkv):
                for c0 in range(0, C, 64):
                    s = torch.matmul(cq[g, :, c0:c0 + 64], K[g].T).float() * scale  # [G][c][T]
                    r = torch.log_softmax(s, dim=-1).amax(0)  # [c][T]
                    out[g, c0:c0 + 64] = torch.topk(r, min(rho, T), dim=-1).indices
            return out

        lists = build()
        cqn = torch.nn.functional.normalize(cq.float(), dim=-1)

        def recall():
            qn = torch.nn.functional.normalize(q.float(), dim=-1)  # [Hkv][G][D]
            cos = torch.einsum("hgd,hgcd->hgc", qn, cqn).amax(1)  # [Hkv][C]
            return torch.topk(cos, cp, dim=-1).indices  # [Hkv][cp]

        top = recall()

        def gather(top):
            sel = torch.gather(lists, 1, top.unsqueeze(-1).expand(Hkv, cp, rho)).view(Hkv, -1)
            return [torch.unique(sel[g]) for g in range(Hkv)]

        U = gather(top)

        def rerank(U):
            out = []
            for g in range(Hkv):
                s = torch.matmul(q[g], K[g, U[g]].T).float() * scale  # [G][u]
                r = torch.log_softmax(s, dim=-1).amax(0)
                out.append(U[g][torch.topk(r, min(k, r.numel())).indices])
            return out

        u = sum(x.numel() for x in U) / Hkv
        reps, warm = a.reps, a.warmup
        a.reps, a.warmup = min(3, reps), 0  # the build is long: 3 runs, as kvbench bench
        b.time(T, "build", build, C * Hkv * (T * D * 2 + rho * 8))
        a.reps, a.warmup = reps, warm
        b.time(T, "recall", recall, Hkv * G * C * D * 4 + Hkv * cp * 8)
        b.time(T, "gather", lambda: gather(top), Hkv * cp * rho * 8 + Hkv * u * 8)
        b.time(T, "rerank", lambda: rerank(U), Hkv * u * (D * 2 + 8) + Hkv * k * 8)
        b.time(T, "search", lambda: rerank(gather(recall())), Hkv * G * C * D * 4 + Hkv * cp * rho * 8 +
               Hkv * u * D * 2 + Hkv * k * 8)
        del K, q, cq, cqn, lists
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench: slot queries float32 (normalised), lists int64 (torch's index type), "
                    f"float16 keys; C'={a.cp} rho={rho}; union dedup by torch.unique per kv head")


if __name__ == "__main__":
    sys.exit(main())
