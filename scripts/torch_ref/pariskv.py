#!/usr/bin/env python3
"""pariskv.py: the PyTorch peer of `kvbench bench --method pariskv` (issue 4, point 6): the
same ParisKV search ("ParisKV: Fast and Drift-Robust KV-Cache Retrieval for Long-Context LLMs",
Qi et al., preprint 2026, secs. 4.1-4.2, app. B; retrievers/pariskv.c) written the
way a researcher prototypes it in tensor ops, timed stage by stage on the same GPU with
common.py's timer (L2 flushed before every repetition, CUDA events, median/p90).

Stages (names as kvbench's): encode (normalise, SRHT as a matmul with the normalised
Hadamard matrix, polar form per m-dim subspace, sign-pattern centroid ids, 4-bit codes by
torch.bucketize on Lloyd-Max thresholds, weights w = |k| r / alpha, per-centroid counts by
bincount); collision (centroid scores as a matmul with the sign matrix, a stable sort for
the rank, cumsum of counts for the tiers, scatter back, then gather the bonus of each
key's B ids and sum); bucket_topk (bincount histogram, reversed cumsum for the threshold,
ties at the threshold by a cumsum rank, nonzero for the compaction in index order);
rerank (gather the candidates' codes and weights, dequantise, per-subspace dot with the
rotated query, weighted sum); final_topk (torch.topk); search (all back to back). One
retrieval per kv head from the mean of its group's queries (pool=mean, the default).
beta and rho follow the released length-adaptive table, as kvbench's defaults. The
Lloyd-Max levels come from Monte-Carlo samples of |u_j| (100 iterations from quantile
starts, as the released generator). Bytes per stage are counted as kvbench counts them
(what the stage must move at least), not what these ops move. The index keeps the ids
as int64 [Hkv][B][T] (what torch.gather wants), not uint8.

  python3 scripts/torch_ref/pariskv.py --tokens 16384,262144,1048576 --csv out.csv
"""
import math
import sys

import torch

from common import Bench, parser

DEV = "cuda"  # the peer runs on the GPU; a CPU check may set pariskv.DEV = "cpu"
FRAC = (0.05, 0.15, 0.30, 0.50, 0.75, 1.0)


def adaptive(n):
    if n < 5000:
        return 0.5, 0.5
    if n < 10000:
        return 0.25, 0.3
    if n < 30000:
        return 0.2, 0.25
    return 0.1, 0.2


def lloyd_max(m, gen, samples=1 << 22, iters=100):
    u = torch.randn(samples, m, device=DEV, generator=gen)
    x = (u[:, 0] / u.norm(dim=1)).abs().sort().values
    thr = torch.quantile(x[:: max(1, samples // (1 << 20))], torch.arange(1, 8, device=DEV) / 8)
    for _ in range(iters):
        b = torch.bucketize(x, thr)
        lv = torch.zeros(8, device=DEV).scatter_add_(0, b, x) / torch.bincount(b, minlength=8).clamp_min(1)
        thr = (lv[:-1] + lv[1:]) / 2
    return lv, thr


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(DEV)


class ParisKV:
    def __init__(self, Hq, Hkv, D, m, gen):
        self.Hq, self.Hkv, self.D, self.m = Hq, Hkv, D, m
        self.dp = 1 << (D - 1).bit_length()
        self.nb = self.dp // m
        self.signs = torch.where(torch.rand(self.dp, device=DEV, generator=gen) < 0.5, -1.0, 1.0)
        self.R = self.signs[:, None] * hadamard(self.dp)  # x -> (x * signs) @ H
        self.level, self.thr = lloyd_max(m, gen)
        self.pow2 = 1 << torch.arange(m, device=DEV)
        self.cent = ((torch.arange(1 << m, device=DEV)[:, None] >> torch.arange(m, device=DEV)) & 1) * 2.0 - 1.0
        self.frac = torch.tensor(FRAC, device=DEV, dtype=torch.float64)

    def transform(self, x):  # [..., D] float -> rotated unit vectors [..., dp], norms [..., 1]
        norm = x.norm(dim=-1, keepdim=True)
        x = x / norm.clamp_min(1e-8)
        if self.dp != self.D:
            x = torch.nn.functional.pad(x, (0, self.dp - self.D))
        return x @ self.R, norm

    def encode(self, K):  # K [Hkv][T][D] float16
        Hkv, T = K.shape[0], K.shape[1]
        x, norm = self.transform(K.float())
        xb = x.view(Hkv, T, self.nb, self.m)
        r = xb.norm(dim=-1)
        au = (xb / r.clamp_min(1e-30)[..., None]).abs()
        pos = xb >= 0
        mag = torch.bucketize(au, self.thr)
        alpha = (self.level[mag] * au).sum(-1)
        self.w = (norm * r / alpha.clamp_min(1e-6)).to(torch.bfloat16)  # [Hkv][T][nb], bf16 as released
        nib = ((pos.to(torch.uint8) << 3) | mag.to(torch.uint8)).view(Hkv, T, self.dp)
        self.code = nib[..., 0::2] | (nib[..., 1::2] << 4)  # [Hkv][T][dp/2]
        ids = (pos.long() * self.pow2).sum(-1)  # [Hkv][T][nb]
        self.ids = ids.transpose(1, 2).contiguous()  # [Hkv][nb][T] int64
        off = torch.arange(Hkv * self.nb, device=DEV).view(Hkv, self.nb, 1) << self.m
        self.counts = torch.bincount((self.ids + off).view(-1), minlength=Hkv * self.nb << self.m).view(
            Hkv, self.nb, 1 << self.m)
        return self.w

    def query(self, q):  # q [Hq][D] -> rotated group means [Hkv][dp], norms [Hkv][1]
        qm = q.view(self.Hkv, self.Hq // self.Hkv, self.D).mean(1)
        self.qt, self.qn = self.transform(qm)

    def collision(self, n, rho):
        cs = self.qt.view(self.Hkv, self.nb, self.m) @ self.cent.T  # [Hkv][nb][2^m]
        order = torch.sort(cs, dim=-1, descending=True, stable=True).indices
        cnt = self.counts.gather(-1, order)
        before = (cnt.cumsum(-1) - cnt).double()
        target = torch.ceil(n * rho * self.frac)
        wsorted = (before[..., None] < target).sum(-1).to(torch.uint8)
        wt = torch.empty_like(wsorted).scatter_(-1, order, wsorted)
        self.scores = torch.gather(wt, 2, self.ids).sum(1, dtype=torch.int16)  # [Hkv][T]
        return self.scores

    def bucket_topk(self, C):
        s, nbins, H = self.scores, 6 * self.nb + 1, self.Hkv
        off = torch.arange(H, device=DEV)[:, None] * nbins
        hist = torch.bincount((s + off).view(-1), minlength=H * nbins).view(H, nbins)
        atleast = hist.flip(-1).cumsum(-1).flip(-1)  # keys with score >= s
        thr = (atleast >= C).sum(-1, keepdim=True) - 1
        above = torch.cat([atleast, torch.zeros_like(atleast[:, :1])], 1).gather(1, thr + 1)
        eq = s == thr
        sel = (s > thr) | (eq & (eq.cumsum(-1) <= C - above))
        self.cand = sel.nonzero()[:, 1].view(H, C)
        return self.cand

    def rerank(self):
        H, C = self.cand.shape
        code = torch.gather(self.code, 1, self.cand[..., None].expand(H, C, self.dp // 2))
        nib = torch.stack([code & 15, code >> 4], -1).view(H, C, self.dp)
        v = torch.where(nib >= 8, 1.0, -1.0) * self.level[(nib & 7).long()]
        w = torch.gather(self.w, 1, self.cand[..., None].expand(H, C, self.nb)).float()
        dot = (v * self.qt[:, None, :]).view(H, C, self.nb, self.m).sum(-1)
        self.est = (w * dot).sum(-1) * self.qn
        return self.est

    def final_topk(self, k):
        pos = torch.topk(self.est, min(k, self.est.shape[1]), dim=-1).indices
        return self.cand.gather(1, pos)


def main():
    ap = parser(__doc__)
    ap.add_argument("--m", type=int, default=8)
    a = ap.parse_args()
    b = Bench("pariskv", a, params=f"m={a.m},pool=mean,beta/rho adaptive")
    Hq, Hkv, D, k = a.q_heads, a.kv_heads, a.dim, a.k
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    pk = ParisKV(Hq, Hkv, D, a.m, gen)
    nb, cb = pk.nb, pk.dp // 2
    for T in b.tokens():
        K = torch.randn(Hkv, T, D, device="cuda", dtype=torch.float16, generator=gen)
        q = torch.randn(Hq, D, device="cuda", generator=gen)
        beta, rho = adaptive(T)
        C = min(T, max(math.ceil(T * beta), min(k, T)))
        kk = min(k, C)
        pk.encode(K)
        pk.query(q)
        pk.collision(T, rho)
        pk.bucket_topk(C)
        pk.rerank()
        keys, cand = Hkv * T, Hkv * C

        def search():
            pk.query(q)
            pk.collision(T, rho)
            pk.bucket_topk(C)
            pk.rerank()
            return pk.final_topk(k)

        stages = (("encode", lambda: pk.encode(K), keys * (2 * D + nb + cb + 2 * nb)),
                  ("collision", lambda: (pk.query(q), pk.collision(T, rho)), keys * (nb + 2)),
                  ("bucket_topk", lambda: pk.bucket_topk(C), keys * 2 + cand * 4),
                  ("rerank", pk.rerank, cand * (4 + cb + 2 * nb + 4)),
                  ("final_topk", lambda: pk.final_topk(k), cand * 4 + Hkv * kk * 4),
                  ("search", search, keys * nb + cand * (cb + 2 * nb) + Hkv * kk * 4))
        for name, fn, nbytes in stages:
            b.time(T, name, fn, nbytes)
        del K
        torch.cuda.empty_cache()
    return b.finish(f"as kvbench bench --method pariskv (per key and kv head: ids B={nb}, codes {cb}, weights "
                    f"{2 * nb} (bf16); C = beta*T candidates per kv head); ids held as int64 here")


if __name__ == "__main__":
    sys.exit(main())
