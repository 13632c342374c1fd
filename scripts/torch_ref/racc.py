#!/usr/bin/env python3
"""racc.py: the PyTorch peer of `kvbench bench --method racc` (issue 10): RACC's two GPU
stages as a researcher would write them in PyTorch. vote: the observation window's queries
(window x G per kv head) score the context (one batched matmul per kv head, in chunks of
tokens so the [G*window][T] scores never exist whole at long contexts, as kvbench), masked
to the resident tokens, softmax per query over the context, summed over window and group
(two passes over the chunks: row max and sum of exp, then the votes). retrieve: the group's
query scores the context, resident tokens masked to -inf, torch.topk of ceil(beta*n)
(lag 1: computed one step ahead). Half the tokens are evicted (alternate positions), as
kvbench bench does.

  python3 scripts/torch_ref/racc.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    ap = parser(__doc__)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--beta", type=float, default=0.01)
    a = ap.parse_args()
    b = Bench("racc", a, f"alpha=0.6,Ln=400,window={a.window},beta={a.beta}")
    Hq, Hkv, D, W = a.q_heads, a.kv_heads, a.dim, a.window
    G, scale = Hq // Hkv, 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for T in b.tokens():
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hkv, G, D, device="cuda", dtype=torch.float16, generator=gen)
        qw = q.unsqueeze(2).expand(Hkv, G, W, D).reshape(Hkv, G * W, D).contiguous()
        evicted = (torch.arange(T, device="cuda") % 2 == 1).expand(Hkv, T)
        C = max(1024, min(T, (64 << 20) // (Hkv * G * W)))
        r = max(1, min(math.ceil(a.beta * T), T // 2, 8192))

        def vote():
            m = torch.full((Hkv, G * W, 1), -float("inf"), device="cuda")
            for c0 in range(0, T, C):
                s = torch.matmul(qw, K[:, c0:c0 + C].transpose(1, 2)).float() * scale
                s.masked_fill_(evicted[:, None, c0:c0 + C], -float("inf"))
                m = torch.maximum(m, s.amax(-1, keepdim=True))
            z = torch.zeros(Hkv, G * W, 1, device="cuda", dtype=torch.float64)
            for c0 in range(0, T, C):
                s = torch.matmul(qw, K[:, c0:c0 + C].transpose(1, 2)).float() * scale
                s.masked_fill_(evicted[:, None, c0:c0 + C], -float("inf"))
                z += torch.exp((s - m).double()).sum(-1, keepdim=True)
            out = []
            for c0 in range(0, T, C):
                s = torch.matmul(qw, K[:, c0:c0 + C].transpose(1, 2)).float() * scale
                s.masked_fill_(evicted[:, None, c0:c0 + C], -float("inf"))
                out.append((torch.exp((s - m).double()) / z).sum(1).float())
            return torch.cat(out, -1)  # [Hkv][T]

        qm = q.float().mean(1, keepdim=True).half()  # [Hkv][1][D]

        def retrieve():
            s = torch.matmul(qm, K.transpose(1, 2)).float().squeeze(1) * scale
            s.masked_fill_(~evicted, -float("inf"))
            return torch.topk(s, r, dim=-1).indices

        keys = Hkv * T * D * 2
        b.time(T, "vote", vote, 3 * keys + Hkv * T * 7)
        b.time(T, "retrieve", retrieve, keys + Hkv * T * 9 + Hkv * r * 8)
        del K, q, qw
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench: float16 keys, half evicted; vote = 3 sweeps over the keys (window={W}); "
                    f"retrieve = keys + mask + scores + top-r (beta={a.beta})")


if __name__ == "__main__":
    sys.exit(main())
