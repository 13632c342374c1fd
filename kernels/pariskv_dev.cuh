/* pariskv_dev.cuh: what kernels/pariskv.cu (encode, tiers, collision,
 * rerank, the launchers), kernels/pariskv_bucket.cu (the multi-block
 * bucket top-k) and kernels/pariskv_cluster.cu (the long lists' final
 * top-k) share: the device state of one layer's index, the constants, the
 * score loads and tile histograms the collision kernel fuses into its
 * pass, the compaction, and the host entries of the other two files.
 * Included by those three .cu files only; the C face of the method is
 * pariskv.h. */
#ifndef KV_PARISKV_DEV_CUH
#define KV_PARISKV_DEV_CUH

#include "ops/kv_cuda.h"
#include "ops/topk.h"
#include "pariskv.h"

constexpr int PK_TILE = 4096;     /* keys per bucket top-k tile */
constexpr int PK_TH = 256;        /* threads of most kernels */
constexpr int PK_PER_TH = PK_TILE / PK_TH;
constexpr int PK_TIERS = KV_PARISKV_TIERS;

/* A step's tier targets (kv_pariskv_tier_targets), computed on the host and passed by value. */
struct pk_tt {
    double v[PK_TIERS];
    int nt;
};

struct pk_lv {
    float level[8], thr[7];
};

struct kv_pariskv_gpu {
    kv_pariskv_gpu_cfg c;
    int nc, cb, G, nh, nbins, ntiles_max, stage_tokens, kmax;
    long long Tp;
    pk_lv lv;
    kv_cuda_dev dev;
    cudaStream_t st;
    float *signs, *stage, *q, *qt, *qnorm, *csc;
    kv_bf16 *w; /* RSQ-IP weights [Hkv][Tp][B], bf16 (ops/bf16.h) */
    uint8_t *ids, *code, *wt;
    int *counts, *thist, *ghist, *toff, *teq, *thr;
    uint16_t *scores;
    int32_t *cand, *pos, *hpos; /* hpos: pinned host, the last search's key ids [rows][kk] */
    int32_t *sel;        /* device [rows][kmax]: the selected key ids (pk_stage 4) */
    kv_topk_ws tk;
    size_t merge_smax; /* pk_merge_topk_kernel's dynamic shared memory limit: the opt-in less its static arrays */
    size_t clus_smax;  /* pk_cluster_topk's dynamic shared memory limit (0: no cluster top-k on this device) */
    int clus_n;        /* blocks of its clusters (16, or 8 where 16 cannot be placed) */
    int clus_fast;     /* its bound from the warps' maxima first (KVBENCH_PK_FAST=0: off) */
    int last_lo, last_n, last_C; /* of the last search, for read_last */
    int last_k;                  /* the last launched search's k, for fetch (0: nothing launched) */
    int fused;           /* the search in 3-4 launches (pk_stage) with KVBENCH_PK_FUSED=1 at create; default six */
    int score8;          /* fused, KVBENCH_PK_SCORE8=1 and every score <= 254: collision scores stored as uint8 */
    int pdl;             /* the launches after the tier kernel programmatic dependent ones (KVBENCH_PK_PDL=0: plain;
                          * cleared if the driver refuses one) */
    unsigned *ctr;       /* [2][rows] last-tile counters (collision, select-rerank), zero between launches */
    unsigned long long *list; /* fused, long lists: [rows][tiles][kk] each tile's top-kk (~key << 32 | index) */
    kv_graph graph;      /* the search's launches (tier .. final top-k) as one CUDA graph per step shape */
    float *hcsc;         /* host: rerank scores when k > KV_GPU_TOPK_MAX */
};

namespace {

/* The 16 scores of [i0, i0+16) (uint4 loads when whole; outside [lo, end): 0xffff). */
__device__ __forceinline__ void pk_load16(const uint16_t *row, long long i0, int lo, int end, uint16_t v[16]) {
    if (i0 >= lo && i0 + 16 <= end) {
        const uint4 a = ((const uint4 *)(row + i0))[0], b = ((const uint4 *)(row + i0))[1];
        const unsigned w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 16; e++) v[e] = (uint16_t)(w[e >> 1] >> (16 * (e & 1)));
    } else
        for (int e = 0; e < 16; e++) v[e] = i0 + e >= lo && i0 + e < end ? row[i0 + e] : (uint16_t)0xffff;
}

/* The same from 8-bit scores (KVBENCH_PK_SCORE8: every score <= 254), widened. */
__device__ __forceinline__ void pk_load16(const uint8_t *row, long long i0, int lo, int end, uint16_t v[16]) {
    if (i0 >= lo && i0 + 16 <= end) {
        const uint4 a = *(const uint4 *)(row + i0);
        const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int e = 0; e < 16; e++) v[e] = (uint16_t)((w[e >> 2] >> (8 * (e & 3))) & 255u);
    } else
        for (int e = 0; e < 16; e++) v[e] = i0 + e >= lo && i0 + e < end ? row[i0 + e] : (uint16_t)0xffff;
}

/* The block's tile histogram from each thread's 16 scores (0xffff: none):
 * per-warp shared histograms sh[warps][nbins + 1] (pk_hist_smem bytes), added
 * to the row's ghist[r][.] (atomics; zeroed by the tier kernel of the search,
 * or by the caller), and written to thist[r][t][.] as suffix sums (thist[s] =
 * the tile's keys scoring >= s), so the scan reads two counts per tile. A
 * score of none adds to the warp's spare bin nbins, which nothing reads: no
 * branch a score (branched, each add took a dozen instructions, session 23). */
__host__ __device__ constexpr size_t pk_hist_smem(int nbins) { return (size_t)(PK_TH / 32) * (nbins + 1) * 4; }
__device__ void pk_tile_hist(const uint16_t v[16], int *sh, int nbins, int r, int t, int ntiles, int *thist,
                             int *ghist) {
    __shared__ int wsum[32];
    const int nw = blockDim.x >> 5, nt = blockDim.x, tid = threadIdx.x, ws = nbins + 1;
    for (int s = tid; s < nw * ws; s += nt) sh[s] = 0;
    __syncthreads();
    int *wh = sh + (tid >> 5) * ws;
#pragma unroll
    for (int e = 0; e < 16; e++) atomicAdd(&wh[min((int)v[e], nbins)], 1);
    __syncthreads();
    for (int s = tid; s < nbins; s += nt) { /* column s is this thread's: its total into row 0 */
        int c = 0;
        for (int w = 0; w < nw; w++) c += sh[w * ws + s];
        if (c) atomicAdd(&ghist[(long long)r * nbins + s], c);
        sh[s] = c;
    }
    __syncthreads();
    int *th = thist + ((long long)r * ntiles + t) * nbins, carry = 0;
    for (int k0 = 0; k0 < nbins; k0 += nt) { /* suffix sums, from the top bin down */
        const int s = nbins - 1 - (k0 + tid), c = s >= 0 ? sh[s] : 0;
        int tot;
        const int ex = kv_block_scan(c, &tot, wsum);
        if (s >= 0) th[s] = carry + ex + c;
        carry += tot;
    }
}

/* Row r's bucket threshold from its histogram ghist[r][.] (one block; as
 * kv_pariskv_bucket_topk: the highest score thr with at least C keys
 * scoring >= thr, from the histogram's suffix sums; take = C - keys above
 * it). Read through L2 (__ldcg): the histogram may come from other blocks
 * of the same launch (the fused collision kernel). Shared: hs [nbins],
 * wsum [32]. Has barriers. */
__device__ void pk_row_thr(int r, const int *ghist, int nbins, int C, int *hs, int *wsum, int *thr, int *take) {
    __shared__ int s_thr, s_take;
    const int nt = blockDim.x, tid = threadIdx.x;
    for (int s = tid; s < nbins; s += nt) hs[s] = __ldcg(ghist + (long long)r * nbins + s);
    if (tid == 0) { s_thr = 0; s_take = C; } /* replaced below: C <= the row's keys */
    __syncthreads();
    int carry = 0;
    for (int k0 = 0; k0 < nbins; k0 += nt) { /* hs[s] <- keys scoring >= s, in place (each s is one thread's) */
        const int s = nbins - 1 - (k0 + tid), c = s >= 0 ? hs[s] : 0;
        int tot;
        const int ex = kv_block_scan(c, &tot, wsum);
        if (s >= 0) hs[s] = carry + ex + c;
        carry += tot;
    }
    __syncthreads();
    for (int s = tid; s < nbins; s += nt) {
        const int above = s + 1 < nbins ? hs[s + 1] : 0;
        if (hs[s] >= C && above < C) { s_thr = s; s_take = C - above; } /* one s at most */
    }
    __syncthreads();
    *thr = s_thr;
    *take = s_take;
}

/* Row r (one block): the threshold (pk_row_thr), then each tile's output
 * offset and share of the threshold ties (a thread per tile, in chunks of
 * blockDim tiles, two counts each from the tiles' suffix sums, through L2
 * as above). */
__device__ void pk_scan_row(int r, const int *thist, const int *ghist, int nbins, int ntiles, int C, int *toff,
                            int *teq, int *thr_out, int *hs, int *wsum) {
    const int nt = blockDim.x, tid = threadIdx.x;
    int thr, take;
    pk_row_thr(r, ghist, nbins, C, hs, wsum, &thr, &take);
    if (tid == 0) thr_out[r] = thr;
    int carry_eq = 0, carry_sel = 0;
    for (int t0 = 0; t0 < ntiles; t0 += nt) {
        const int t = t0 + tid;
        int above = 0, eq = 0, tot;
        if (t < ntiles) {
            const int *tt = thist + ((long long)r * ntiles + t) * nbins;
            above = thr + 1 < nbins ? __ldcg(tt + thr + 1) : 0;
            eq = __ldcg(tt + thr) - above;
        }
        int eb = kv_block_scan(eq, &tot, wsum) + carry_eq;
        carry_eq += tot;
        int et = min(max(take - eb, 0), eq), sel = above + et;
        int sb = kv_block_scan(sel, &tot, wsum) + carry_sel;
        carry_sel += tot;
        if (t < ntiles) {
            toff[(long long)r * ntiles + t] = sb;
            teq[(long long)r * ntiles + t] = et;
        }
    }
}

/* The 16 scores of [i0, i0+16) as 8 words of two (key i0 + 2e in the low
 * half of w[e]; outside [lo, end): 0xffff). */
template <class ST>
__device__ __forceinline__ void pk_load_w(const ST *row, long long i0, int lo, int end, unsigned w[8]) {
    if constexpr (sizeof(ST) == 2)
        if (i0 >= lo && i0 + 16 <= end) {
            const uint4 a = ((const uint4 *)(row + i0))[0], b = ((const uint4 *)(row + i0))[1];
            w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
            return;
        }
    uint16_t v[16];
    pk_load16(row, i0, lo, end, v);
#pragma unroll
    for (int e = 0; e < 8; e++) w[e] = v[2 * e] | (unsigned)v[2 * e + 1] << 16;
}

/* The bucket top-k's compaction of one tile, from each thread's 16 scores
 * w (pk_load_w; positions i0 + j; 0xffff: none): the keys above thr and
 * the tile's first `take` keys at thr, in index order; emit(l, position)
 * for each, l its rank in the tile's selection. Returns the tile's
 * selection count. Two scores a word compared at once (SWAR: with both
 * halves below 0x8000, bit 15 of (half | 0x8000) - t is half >= t, and no
 * borrow crosses into the other half; none has bit 15 set): one bit a key
 * in two 16-bit masks (above thr, at thr), counted by popc, then a loop
 * over the set bits only. Unpacked to 16 scores, compared and emitted one
 * by one, the compaction ran 10.8 M warp instructions at 1M tokens,
 * issue-bound (17.6 us under ncu, session 27 call A); sm_90 has no SIMD
 * compare instruction (__vcmpgtu2 is a dozen). Has barriers (every thread
 * of the block calls it). Scores < 0x8000 (at most 6 x 128 here). */
template <class F>
__device__ __forceinline__ int pk_tile_select(const unsigned w[8], int thr, int take, long long i0, int *wsum,
                                              F emit) {
    const unsigned t1 = (unsigned)(thr + 1) * 0x10001u, t0 = (unsigned)thr * 0x10001u;
    unsigned sa = 0, sq = 0; /* bits 15 and 31 of word k at bits 2k and 16 + 2k */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const unsigned h = w[k] | 0x80008000u, ge1 = h - t1, ge0 = h - t0;
        sa |= (ge1 & ~w[k] & 0x80008000u) >> (15 - 2 * k);
        sq |= (ge0 & ~ge1 & ~w[k] & 0x80008000u) >> (15 - 2 * k);
    }
    const unsigned am = (sa & 0x5555u) | ((sa >> 15) & 0xaaaau); /* bit j: key i0 + j above thr */
    unsigned qm = (sq & 0x5555u) | ((sq >> 15) & 0xaaaau);        /* at thr */
    int tot, ex = kv_block_scan(__popc(am) | (__popc(qm) << 16), &tot, wsum); /* a tile's counts fit 16 bits */
    int ab = ex & 0xffff, eb = ex >> 16;
    if (eb >= take) qm = 0; /* no tie of this thread is taken, and eb no longer matters (min(eb, take) = take) */
    for (unsigned m = am | qm; m; m &= m - 1) {
        const int j = __ffs(m) - 1;
        if ((am >> j) & 1u) emit(ab++ + min(eb, take), i0 + j);
        else {
            if (eb < take) emit(ab + eb, i0 + j);
            eb++;
        }
    }
    return (tot & 0xffff) + min(tot >> 16, take);
}

/* The warp's 32 values (one a lane) sorted by a bitonic network of shuffles: lane i gets the i-th smallest
 * (DESC: largest). The tier kernel's centroid ranking, the cluster top-k's bound. */
template <bool DESC, class T> __device__ __forceinline__ T pk_warp_sort(T v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const T y = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool lower = !(lane & stride), asc = size == 32 || !(lane & size);
            if (lower == asc ? (DESC ? y > v : y < v) : (DESC ? y < v : y > v)) v = y;
        }
    return v;
}

/* The digit where the count from the top reaches need, from a histogram
 * h[0..nb) in shared memory (bins in ascending digit order): *d, *above
 * (keys in higher bins), *in (keys in bin d). The same in every thread;
 * every thread of the block calls it (barriers). The final top-k's
 * (pk_topk_row2, pariskv_cluster.cu). */
__device__ void pk_digit_at(const unsigned *h, int nb, unsigned need, int *wsum, unsigned *d, unsigned *above,
                            unsigned *in) {
    __shared__ unsigned s_d, s_above, s_in;
    const int tid = threadIdx.x, nt = blockDim.x, per = (nb + nt - 1) / nt, b0 = nb - 1 - tid * per;
    unsigned v = 0;
    for (int i = 0; i < per && b0 - i >= 0; i++) v += h[b0 - i];
    int tot;
    unsigned c = (unsigned)kv_block_scan((int)v, &tot, wsum);
    if (c < need && c + v >= need)
        for (int i = 0; i < per && b0 - i >= 0; i++) {
            const unsigned x = h[b0 - i];
            if (c + x >= need) { s_d = (unsigned)(b0 - i); s_above = c; s_in = x; break; }
            c += x;
        }
    __syncthreads();
    *d = s_d;
    *above = s_above;
    *in = s_in;
    __syncthreads(); /* every thread has read them before a later call writes them */
}

/* Of the m sort keys bk[0..m) (distinct: ~key << 32 | index) of the bin at
 * the kk-th key, the need smallest to out[rank]: each thread's keys ranked
 * by counting the smaller ones (m broadcast reads; m <= a few thousand). */
__device__ __forceinline__ void pk_rank_bucket(const unsigned long long *bk, int m, unsigned need,
                                               unsigned long long *out) {
    for (int e = threadIdx.x; e < m; e += blockDim.x) {
        const unsigned long long x = bk[e];
        unsigned rk = 0;
        for (int i = 0; i < m; i++) rk += bk[i] < x;
        if (rk < need) out[rk] = x;
    }
}

}  // namespace

/* ---- pariskv_bucket.cu ---- */
/* The bucket top-k of rows of scores[r*ld + i], i in [lo, end) (base = lo
 * rounded down to 16): C positions per row to cand[r*cand_ld + j]; the
 * tile histograms are built here when with_hist, else the collision kernel
 * built them; fold: each tile's compaction block finds its offset itself
 * (else a scan kernel first, through toff, teq, thr). */
kv_status pk_bucket(const uint16_t *scores, long long ld, int base, int lo, int end, int nbins, int ntiles, int R,
                    int C, int *thist, int *ghist, int *toff, int *teq, int *thr, int32_t *cand, long long cand_ld,
                    int with_hist, int fold, int *pdl, cudaStream_t st);
/* ---- pariskv_cluster.cu ---- */
/* The final top-k of R rows of C scores csc[r*ld + j] (kk <= KV_RANK_MAX), one cluster of blocks a row:
 * positions to pos[r][kk], key ids cand[r*ld + pos] to ids[r][kk]; smem from pk_cluster_smem (0: C too large
 * for it); pk_cluster_topk_attr once before. A launch refused with PDL is retried plainly (*pdl cleared). */
size_t pk_cluster_smem(int C, int ncl, size_t cmax);
kv_status pk_cluster_topk_attr(size_t optin, int ncl, size_t *cmax);
kv_status pk_cluster_topk(const float *csc, long long ld, int C, int kk, int R, int32_t *pos, const int32_t *cand,
                          int32_t *ids, int ncl, int fast, size_t smem, int *pdl, cudaStream_t st);
/* The bucket top-k alone on host arrays (pariskv.h's bucket_topk_host). */
kv_status pk_bucket_topk_host(const uint16_t *score, int R, int n, int max_score, int c, int fold, int32_t *out);

#endif
