/* pariskv_cluster.cu: ParisKV's final top-k of a long candidate list on the
 * GPU (kernels/pariskv.cu runs it after the rerank where C > PK_SMALL_C and
 * kk <= KV_RANK_MAX: the 1M-token search), one thread-block cluster per row
 * (16 blocks, non-portable, where the device places one; else 8), in
 * kv_topk_ref's order (larger score first, smaller candidate index among
 * equals). Each block holds a slice of the row's order-preserving keys
 * (kv_f2key) in shared memory. First a bound (FAST): a warp's largest key
 * is one of its own, so block q has at least qk = ceil(kk / ncl) keys at or
 * above the qk-th largest of its warps' maxima, b_q, and the row at least kk
 * keys at or above B = min_q b_q: the top kk are among the keys >= B. Each
 * block sends those to block 0 (its own list, then its slots there by one
 * remote atomic); when they are at most PK_CBKT in all, block 0 sorts them
 * (kv_sort_out) and that is the answer. Otherwise (a row whose best keys
 * crowd a few warps; all ties) the radix select: each block histograms its
 * digits, the cluster adds the histograms through distributed shared
 * memory (block b sums bins [b, b+1) * NB/ncl over the blocks, then every
 * block reads the sums), and every block finds the same digit, 12, 12 and
 * 8 bits, stopping at the first level whose bin at the kk-th key holds at
 * most PK_CBKT keys. The keys above that bin (fewer than kk) and those in
 * it go to block 0 as sort keys ~key << 32 | index, where the bin's `need`
 * smallest join the keys above; if even the whole 32-bit key leaves more
 * than PK_CBKT ties, the first `need` ties in index order are taken (each
 * block's tie count, the blocks before it, a block scan). Block 0 then
 * sorts and writes the positions and key ids (stage 4's work). One launch
 * and no grid synchronisation, where the cooperative kv_topk_launch took
 * 22.8 us at 1M tokens and one block per row reading the scores from L2
 * 57.6 us, bound by its one SM's instruction issue (session 27, call B).
 * Session 29 (H200, 1M tokens, interleaved): 16 blocks a cluster took the
 * search from 136.0 to 131.6-132.1 us (call A) and 136.9-138.0 to
 * 133.1-133.8 (call B), though the kernel alone is slower (bench stage 20.0
 * -> 21.6 us; a likely cause, not measured: in the chain the scores are in
 * L2 and twice the SMs read them); the bound took the kernel from 19.5 us
 * (ncu, call B) to 16.6-16.7 (call C; 19.3 the first of three launches)
 * and the search from 133.2-133.9 to 132.7-133.7 (call C). Tried and not
 * kept: the first digit's shared atomics aggregated per warp (match.any),
 * search 133.1-133.8 -> 139.6-140.3 us (call B). */
#include <cooperative_groups.h>

#include "pariskv_dev.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int PK_CTH = 1024;                /* threads a block */
constexpr int PK_CL = 8;                    /* blocks of a row's cluster: the portable maximum, */
constexpr int PK_CLN = 16;                  /* and the non-portable one the search asks for first */
constexpr int PK_CD = 12;                   /* bits of the first two digits (the third has 8) */
constexpr int PK_CNB = 1 << PK_CD;          /* bins of the widest digit */
constexpr int PK_CBKT = 1024;               /* keys of the kk-th key's bin block 0 ranks directly */

/* Row blockIdx.y; block rank b of the cluster holds candidates [b S, b S + n). Dynamic shared memory: S keys. */
template <int NCL, bool FAST>
__global__ void __launch_bounds__(PK_CTH) pk_cluster_topk_kernel(const float *csc, long long ld, int C, int kk,
                                                                   int32_t *pos, const int32_t *cand, int32_t *ids) {
    extern __shared__ unsigned sk[];
    __shared__ unsigned bh[PK_CNB], red[PK_CNB / PK_CL]; /* red: NB / ncl bins */
    __shared__ unsigned long long sv[KV_RANK_MAX], bk[PK_CBKT], lsv[KV_RANK_MAX], lbk[PK_CBKT];
    __shared__ unsigned s_na, s_nb, s_la, s_lb, s_ba, s_bb, s_ties, s_nf, s_bq, wmax[32];
    __shared__ int wsum[32];
    cg::cluster_group cl = cg::this_cluster();
    constexpr int ncl = NCL;
    const int b = (int)cl.block_rank(), r = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int S = (C + ncl - 1) / ncl, j0 = b * S, n = max(0, min(S, C - j0));
    kv_dep_wait();
    kv_dep_launch();
    const float *row = csc + (long long)r * ld + j0;
    unsigned tmax = 0; /* the thread's largest key (0: none; kv_f2key of a float is never 0) */
    for (int jt = tid; jt < n; jt += 4 * nt) { /* 4 loads a thread in flight */
        float x[4];
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = jt + i * nt < n ? row[jt + i * nt] : 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (jt + i * nt < n) {
                const unsigned u = kv_f2key(x[i]);
                sk[jt + i * nt] = u;
                tmax = max(tmax, u);
            }
    }
    if (tid == 0) { s_na = 0; s_nb = 0; s_la = 0; s_lb = 0; s_nf = 0; }
    if (FAST) {
        /* the bound: block q's warps' maxima are keys of distinct warps, so at least qk = ceil(kk / ncl) of its
         * keys are >= its qk-th largest warp maximum b_q, and at least kk keys of the row are >= B = min_q b_q:
         * every key of the top kk is >= B. Block 0 gathers those (at most PK_CBKT) and sorts them. */
        const unsigned wm = __reduce_max_sync(0xffffffffu, tmax);
        if ((tid & 31) == 0) wmax[tid >> 5] = wm;
        __syncthreads();
        if (tid < 32) {
            const int qk = (kk + ncl - 1) / ncl; /* <= 32: kk <= KV_RANK_MAX, ncl >= 8 */
            const unsigned v = pk_warp_sort<true>(tid < (nt >> 5) ? wmax[tid] : 0u);
            const unsigned bq = __shfl_sync(0xffffffffu, v, qk - 1);
            if (tid == 0) s_bq = bq;
        }
        cl.sync(); /* every block's b_q */
        const int lane = tid & 31;
        unsigned B = lane < ncl ? *cl.map_shared_rank(&s_bq, lane) : ~0u;
        B = __reduce_min_sync(0xffffffffu, B);
        for (int jb = 0; jb < n; jb += nt) { /* uniform trip count: warp appends */
            const int j = jb + tid;
            const unsigned u = j < n ? sk[j] : 0u;
            const bool hit = j < n && u >= B;
            const unsigned ph = kv_warp_append(hit, &s_la);
            if (hit && ph < PK_CBKT) lbk[ph] = (unsigned long long)~u << 32 | (unsigned)(j0 + j);
        }
        __syncthreads();
        if (tid < ncl) { /* the count into every block's s_nf, so none reads another's after the barrier (block 0
                          * may have left); the slots are block 0's */
            const unsigned o = atomicAdd(cl.map_shared_rank(&s_nf, tid), s_la);
            if (tid == 0) s_ba = o;
        }
        __syncthreads();
        unsigned long long *bkf = cl.map_shared_rank(bk, 0);
        if (s_ba + s_la <= PK_CBKT)
            for (int e = tid; e < (int)s_la; e += nt) bkf[s_ba + e] = lbk[e];
        cl.sync(); /* every block's keys >= B are in block 0, or counted */
        const unsigned M = s_nf;
        if (M <= PK_CBKT) { /* uniform over the cluster */
            if (b != 0) return;
            int P = 32;
            while (P < (int)M) P <<= 1;
            int32_t *o = pos + (long long)r * kk, *id = ids + (long long)r * kk;
            const int32_t *cr = cand + r * ld;
            kv_sort_out(bk, (int)M, P, [&](int q, unsigned long long v) {
                if (q < kk) {
                    o[q] = (int32_t)(unsigned)v;
                    id[q] = cr[(unsigned)v];
                }
            });
            return;
        }
        if (tid == 0) s_la = 0;
        __syncthreads();
    }
    unsigned prefix = 0, above = 0, in = 0;
    int shift = 32;
    for (int lv = 0; lv < 3; lv++) {
        const int wb = lv < 2 ? PK_CD : 8, nsh = shift - wb, nb = 1 << wb, per = nb / ncl;
        for (int e = tid; e < nb; e += nt) bh[e] = 0;
        __syncthreads();
        for (int j = tid; j < n; j += nt) {
            const unsigned u = sk[j];
            if (lv == 0 || u >> shift == prefix) atomicAdd(&bh[(u >> nsh) & (nb - 1)], 1u);
        }
        cl.sync(); /* every block's histogram is whole */
        for (int e = tid; e < per; e += nt) {
            unsigned c = 0;
#pragma unroll
            for (int q = 0; q < ncl; q++) c += cl.map_shared_rank(bh, q)[b * per + e];
            red[e] = c;
        }
        cl.sync(); /* every block's sums are whole, and nobody reads bh any more */
        for (int e = tid; e < nb; e += nt) bh[e] = cl.map_shared_rank(red, e / per)[e % per];
        __syncthreads();
        unsigned d, ab;
        pk_digit_at(bh, nb, (unsigned)kk - above, wsum, &d, &ab, &in);
        above += ab;
        prefix = prefix << wb | d;
        shift = nsh;
        if (in <= PK_CBKT || shift == 0) break; /* uniform */
    }
    /* block 0 collects the keys above the bin, then the bin's (ranked there) or its first ties: each block
     * gathers its own into lsv / lbk (appends to its own counters: a remote atomic a warp and key took the
     * kernel to 16 us under ncu, session 27 call C), takes slots in block 0's arrays by one remote atomic, and
     * copies */
    unsigned long long *sv0 = cl.map_shared_rank(sv, 0), *bk0 = cl.map_shared_rank(bk, 0);
    const bool ranked = in <= PK_CBKT;
    const unsigned need = (unsigned)kk - above;
    for (int jb = 0; jb < n; jb += nt) { /* uniform trip count: warp appends */
        const int j = jb + tid;
        const unsigned u = j < n ? sk[j] : 0u, t = u >> shift; /* shift <= 20 after level 0 */
        const bool hi = j < n && t > prefix, eq = ranked && j < n && t == prefix;
        const unsigned ph = kv_warp_append(hi, &s_la), pe = kv_warp_append(eq, &s_lb);
        const unsigned long long x = (unsigned long long)~u << 32 | (unsigned)(j0 + j);
        if (hi) lsv[ph] = x;
        if (eq) lbk[pe] = x;
    }
    __syncthreads();
    if (tid == 0) {
        s_ba = atomicAdd(cl.map_shared_rank(&s_na, 0), s_la);
        s_bb = atomicAdd(cl.map_shared_rank(&s_nb, 0), s_lb);
    }
    __syncthreads();
    for (int e = tid; e < (int)s_la; e += nt) sv0[s_ba + e] = lsv[e];
    for (int e = tid; e < (int)s_lb; e += nt) bk0[s_bb + e] = lbk[e];
    if (!ranked) { /* more than PK_CBKT keys equal the kk-th (shift 0): the first `need` in index order */
        int c = 0;
        for (int jb = 0; jb < n; jb += nt) c += __syncthreads_count(jb + tid < n && sk[jb + tid] == prefix);
        if (tid == 0) s_ties = (unsigned)c;
        cl.sync();
        unsigned carry = 0;
        for (int q = 0; q < b; q++) carry += *cl.map_shared_rank(&s_ties, q);
        for (int jb = 0; jb < n && carry < need; jb += nt) { /* uniform */
            const int j = jb + tid;
            const bool eq = j < n && sk[j] == prefix;
            int tot;
            const unsigned rk = carry + (unsigned)kv_block_scan(eq, &tot, wsum);
            if (eq && rk < need) sv0[above + rk] = (unsigned long long)~prefix << 32 | (unsigned)(j0 + j);
            carry += (unsigned)tot;
        }
    }
    cl.sync(); /* block 0 has every key; the other blocks may leave */
    if (b != 0) return;
    if (ranked) { /* the bin's need smallest sort keys join the keys above */
        pk_rank_bucket(bk, (int)s_nb, need, sv + above);
        __syncthreads();
    }
    int32_t *o = pos + (long long)r * kk, *id = ids + (long long)r * kk;
    const int32_t *cr = cand + r * ld;
    kv_sort_out(sv, kk, KV_RANK_MAX, [&](int q, unsigned long long v) {
        o[q] = (int32_t)(unsigned)v;
        id[q] = cr[(unsigned)v];
    });
}

}  // namespace

/* The kernel's static shared memory, with room for pk_digit_at's and kv_block_scan's. */
constexpr size_t PK_CSTAT = (PK_CNB + PK_CNB / PK_CL) * 4 + 2 * (KV_RANK_MAX + PK_CBKT) * 8 + 2048;

/* Dynamic shared memory of pk_cluster_topk for C candidates (0: more than cmax, pk_cluster_topk_attr's limit). */
size_t pk_cluster_smem(int C, int ncl, size_t cmax) {
    const size_t dyn = (size_t)((C + ncl - 1) / ncl) * 4;
    return dyn <= cmax ? dyn : 0;
}

/* The kernel for clusters of ncl blocks, with the bound (fast) or the radix select alone. */
typedef void (*pk_cluster_fn)(const float *, long long, int, int, int32_t *, const int32_t *, int32_t *);
static pk_cluster_fn pk_cluster_kernel(int ncl, int fast) {
    if (ncl == PK_CLN) return fast ? pk_cluster_topk_kernel<PK_CLN, true> : pk_cluster_topk_kernel<PK_CLN, false>;
    return fast ? pk_cluster_topk_kernel<PK_CL, true> : pk_cluster_topk_kernel<PK_CL, false>;
}

/* pk_cluster_topk's dynamic shared memory limit for clusters of ncl (8 or 16) blocks, the opt-in less its
 * static arrays, into *cmax; 0 where the device cannot place one such cluster (create then asks for 8; with
 * none the search takes the cooperative kv_topk_launch). */
kv_status pk_cluster_topk_attr(size_t optin, int ncl, size_t *cmax) {
    *cmax = 0;
    if (optin <= PK_CSTAT || (ncl != PK_CL && ncl != PK_CLN)) return KV_OK;
    const size_t dyn = optin - PK_CSTAT;
    for (int fast = 0; fast < 2; fast++) {
        const pk_cluster_fn fn = pk_cluster_kernel(ncl, fast);
        KV_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
        if (ncl > PK_CL && cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
            (void)cudaGetLastError(); /* no clusters of 16 here */
            return KV_OK;
        }
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = kv_launch_cfg(at, dim3(ncl, 1), dim3(PK_CTH), dyn, 0, 0, (unsigned)ncl);
        int nclus = 0;
        if (cudaOccupancyMaxActiveClusters(&nclus, fn, &cfg) != cudaSuccess) {
            (void)cudaGetLastError(); /* not supported here */
            nclus = 0;
        }
        if (nclus < 1) return KV_OK;
    }
    *cmax = dyn;
    return KV_OK;
}

/* The final top-k of R rows of C scores (csc[r*ld + j]) into pos [R][kk] and
 * ids [R][kk] = cand[r*ld + pos]: grid (ncl, R), clusters of ncl, the bound
 * first when fast, a programmatic dependent launch when *pdl. */
kv_status pk_cluster_topk(const float *csc, long long ld, int C, int kk, int R, int32_t *pos, const int32_t *cand,
                          int32_t *ids, int ncl, int fast, size_t smem, int *pdl, cudaStream_t st) {
    return kv_launch_cl(pdl, "pariskv GPU (cluster top-k)", (unsigned)ncl, pk_cluster_kernel(ncl, fast), dim3(ncl, R),
                        dim3(PK_CTH), smem, st, csc, ld, C, kk, pos, cand, ids);
}
