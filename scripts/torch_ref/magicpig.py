#!/usr/bin/env python3
"""magicpig.py: the PyTorch peer of `kvbench bench --method magicpig` (issue 5, point 6): the same
search in tensor ops on the same GPU, written the way a PyTorch user would. One Gaussian
projection P [D][K*L] (float32); keys float16 [Hkv][T][D] centred by their mean (float32 copy
kept for the weights); codes = sign bits of (keys @ P) packed per table with bit weights 2^i,
int16 [Hkv][T][L]; the query normalised and hashed the same way; collisions =
(codes == qcode).sum(-1) over the G query heads of each kv group at once (a broadcast);
candidates = nonzero(count >= min_collisions) (ascending per head, like kvbench's
compaction); log-weights as MagicPIG's released code (p = (1 - theta/pi)^K,
w = 1 - (1-p)^(L-1) (L p + 1 - p), -log(w + 1e-4), in float64). Stages and byte counts as
kvbench's (kernels/magicpig.cu), with this script's own candidate count; random float16 keys
(kvbench's are its synthetic trace, so the candidate counts differ: both are printed).

  python3 scripts/torch_ref/magicpig.py --tokens 16384,131072,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser


def main():
    ap = parser(__doc__)
    ap.add_argument("--K", type=int, default=10, help="SimHash bits per table")
    ap.add_argument("--L", type=int, default=150, help="hash tables")
    ap.add_argument("--min-collisions", type=int, default=2)
    a = ap.parse_args()
    Kb, L, minc = a.K, a.L, a.min_collisions
    b = Bench("magicpig", a, f"K={Kb},L={L},min_collisions={minc},seed=0")
    Hq, Hkv, D = a.q_heads, a.kv_heads, a.dim
    G, KL = Hq // Hkv, Kb * L
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    P = torch.randn(D, KL, device="cuda", dtype=torch.float32, generator=gen)
    pow2 = (2 ** torch.arange(Kb, device="cuda", dtype=torch.int32)).view(1, 1, 1, Kb)
    notes = []
    for T in b.tokens():
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hq, D, device="cuda", dtype=torch.float32, generator=gen)
        st = {}
        chunk = max(1, (1 << 29) // (Hkv * KL * 4))  # about 512 MB of projections at a time

        def hash_keys():
            mean = K.float().mean(dim=1, keepdim=True)  # [Hkv][1][D]
            ck = torch.empty(Hkv, T, D, device="cuda", dtype=torch.float32)
            codes = torch.empty(Hkv, T, L, device="cuda", dtype=torch.int16)
            for t0 in range(0, T, chunk):
                c = K[:, t0:t0 + chunk].float() - mean
                ck[:, t0:t0 + chunk] = c
                bits = (c @ P > 0).view(Hkv, -1, L, Kb)
                codes[:, t0:t0 + chunk] = (bits * pow2).sum(-1, dtype=torch.int32).to(torch.int16)
            st["ck"], st["kn"], st["codes"] = ck, ck.norm(dim=-1), codes

        def hash_query():
            qn = q / q.norm(dim=-1, keepdim=True)
            bits = (qn @ P > 0).view(1, Hq, L, Kb)
            st["qn"] = q.norm(dim=-1)
            st["qc"] = (bits * pow2).sum(-1, dtype=torch.int32).to(torch.int16).view(Hkv, G, 1, L)

        def collide():
            cnt = (st["codes"].unsqueeze(1) == st["qc"]).sum(-1, dtype=torch.int16)  # [Hkv][G][T]
            st["mask"] = (cnt >= minc).view(Hq, T)

        def compact():
            st["cand"] = st["mask"].nonzero()  # [n][2]: (query head, position), ascending per head

        def weights():
            h, t = st["cand"][:, 0], st["cand"][:, 1]
            g = torch.div(h, G, rounding_mode="floor")
            dot = (q[h] * st["ck"][g, t]).sum(-1)
            cs = (dot.double() / (st["qn"][h].double() * st["kn"][g, t].double())).clamp(-1, 1)
            p = (1 - torch.acos(cs) / math.pi) ** Kb
            w = 1 - (1 - p) ** (L - 1) * (L * p + 1 - p)
            st["logw"] = (-torch.log(w + 1e-4)).float()

        def search():
            hash_query()
            collide()
            compact()
            weights()

        hash_keys()
        search()
        torch.cuda.synchronize()
        ncand = st["cand"].shape[0]
        hq_b = Hq * D * 4 + D * KL * 4 + Hq * L * 2 + Hq * 4
        co_b = Hkv * T * L * 2 + Hq * L * 2 + Hq * T / 8
        cp_b = Hq * T / 8 + ncand * 4
        we_b = ncand * (4 + D * 4 + 4 + 4)
        hk_b = Hkv * T * (D * 2 + D * 4 + L * 2 + 4)
        fits = Hkv * T * L * 2 <= b.l2
        for name, fn, nbytes in (("hash_keys", hash_keys, hk_b), ("hash_query", hash_query, hq_b),
                                 ("collide", collide, co_b), ("compact", compact, cp_b), ("weights", weights, we_b),
                                 ("search", search, hq_b + co_b + cp_b + we_b)):
            b.time(T, name, fn, nbytes, fits)
        notes.append(f"{T}: {ncand / Hq:.0f} candidates per query head ({100 * ncand / (Hq * T):.2f}%)")
        del K, q, st
        torch.cuda.empty_cache()
    return b.finish(f"K={Kb} L={L} min_collisions={minc}; {'; '.join(notes)}; bytes counted as kvbench's "
                    f"(codes int16 [Hkv][T][L] here; int64 candidate pairs written where kvbench writes int32)")


if __name__ == "__main__":
    sys.exit(main())
