#!/usr/bin/env python3
"""racc.py: the PyTorch peer of `kvbench bench --method racc` (issue 10): RACC's two GPU
stages as a researcher would write them in PyTorch. vote: the observation window's queries
(window x G per kv head) score the resident keys, gathered first with index_select as kvbench
compacts them (one batched matmul per kv head, the scores whole up to 1 GiB, else in chunks with an
online max and sum), softmax per query over them, summed over window and group, scattered back to
the context positions. retrieve: the group's
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
        C = max(1024, min(T, (1 << 30) // (Hkv * G * W * 4)))  # score chunk: at most 1 GiB of float32
        r = max(1, min(math.ceil(a.beta * T), T // 2, 8192))

        def vote():
            # the resident keys gathered once (kvbench compacts them too), then one score matrix per chunk of
            # them: scores, softmax over the resident keys, summed over window and group
            res = (~evicted[0]).nonzero().squeeze(1)
            Kr = K.index_select(1, res)
            n = res.numel()
            if n <= C:
                p = torch.softmax(torch.matmul(qw, Kr.transpose(1, 2)).float() * scale, dim=-1)
                votes = p.sum(1)
            else:  # two passes over chunks: row max and sum of exp, then the votes
                m = torch.full((Hkv, G * W, 1), -float("inf"), device="cuda")
                z = torch.zeros(Hkv, G * W, 1, device="cuda")
                for c0 in range(0, n, C):
                    s = torch.matmul(qw, Kr[:, c0:c0 + C].transpose(1, 2)).float() * scale
                    mn = torch.maximum(m, s.amax(-1, keepdim=True))
                    z = z * torch.exp(m - mn) + torch.exp(s - mn).sum(-1, keepdim=True)
                    m = mn
                votes = torch.cat([(torch.exp(torch.matmul(qw, Kr[:, c0:c0 + C].transpose(1, 2)).float() * scale - m)
                                    / z).sum(1) for c0 in range(0, n, C)], -1)
            out = torch.zeros(Hkv, T, device="cuda")
            out[:, res] = votes
            return out  # [Hkv][T]

        qm = q.float().mean(1, keepdim=True).half()  # [Hkv][1][D]

        def retrieve():
            s = torch.matmul(qm, K.transpose(1, 2)).float().squeeze(1) * scale
            s.masked_fill_(~evicted, -float("inf"))
            return torch.topk(s, r, dim=-1).indices

        keys = Hkv * T * D * 2
        b.time(T, "vote", vote, keys * (T - T // 2) / T + Hkv * T * 5)
        b.time(T, "retrieve", retrieve, keys + Hkv * T * 9 + Hkv * r * 8)
        del K, q, qw
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench: float16 keys, half evicted; vote = gather the resident keys, scores, softmax, sums (window={W}); "
                    f"retrieve = keys + mask + scores + top-r (beta={a.beta})")


if __name__ == "__main__":
    sys.exit(main())
