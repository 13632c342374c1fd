/* block_topk.cuh: the top k of a short array in shared memory by one
 * thread block, in kv_topk_ref's order (larger first, ties to the smaller
 * position), for kernels that select inside a block what the shared
 * top-k (topk.cu) would select over a global row: CTKVR's fused rerank
 * (kernels/ctkvr_fused.cuh) and CSAttention's per-tile candidates
 * (kernels/csattention_tile.cuh). A radix select of the kk-th largest
 * order-preserving key (kv_f2key: -0 == +0) in 4 digits of 8 bits with a
 * 257-bin shared histogram, an ordered collection (block scans) of the keys
 * above it and of the first ties in position order, then each selected
 * one's rank counted directly (kk^2 compares shared by up to 32 lanes per
 * selected one: meant for kk of a few hundred). */
#ifndef KV_BLOCK_TOPK_CUH
#define KV_BLOCK_TOPK_CUH

#include "kv_cuda.h"

/* Warp 0 of a radix select (call from its 32 lanes): the bin of 256 (counts hist, larger bins first) that
 * holds the rem-th largest; *bin, *above = the count in the bins above it, *exact = that bin completes rem.
 * Lane l sums bins 255 - 8l down to 248 - 8l, one warp scan, then the lane whose range holds it walks its 8. */
static __device__ __forceinline__ void kv_pick_bin(const unsigned *hist, int rem, unsigned *bin, int *above,
                                                   int *exact) {
    const int lane = threadIdx.x & 31;
    int cnt = 0;
    for (int b = 0; b < 8; b++) cnt += hist[255 - 8 * lane - b];
    int incl = cnt;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    const int excl = incl - cnt;
    if (excl < rem && incl >= rem) {
        int c = excl;
        for (int b = 0; b < 8; b++) {
            const int bi = 255 - 8 * lane - b, h = (int)hist[bi];
            if (c + h >= rem) { *bin = (unsigned)bi; *above = c; *exact = c + h == rem; break; }
            c += h;
        }
    }
}

/* out[0..kk) = the positions of the kk best of val[0..n) (kk <= n), kv_topk_ref order (ranked = false:
 * the same set in position order). sel: kk ints of
 * shared scratch (not val), hist: 257 unsigned. Radix select of the kk-th key, 8 bits a pass (warp-
 * aggregated histogram increments: __match_any_sync), stopping early once the chosen bin holds exactly
 * the ones still needed; then each thread collects its contiguous segment's keys above the threshold
 * and the first ties (position order, one pair of block scans), and each selected one's rank is counted. */
static __device__ __noinline__ void kv_block_topk(const float *val, int n, int kk, int32_t *out, int *sel,
                                                  unsigned *hist, int *sw, bool ranked = true) {
    __shared__ unsigned s_bin;
    __shared__ int s_above, s_exact;
    if (kk <= 0) return;
    const int tid = threadIdx.x, lane = tid & 31, bd = blockDim.x;
    unsigned prefix = 0, pmask = 0;
    int rem = kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 257; i += bd) hist[i] = 0;
        __syncthreads();
        for (int i0 = 0; i0 < n; i0 += bd) {
            const int i = i0 + tid;
            unsigned bin = 256;
            if (i < n) {
                const unsigned key = kv_f2key(val[i]);
                if ((key & pmask) == prefix) bin = (key >> shift) & 255u;
            }
            const unsigned grp = __match_any_sync(0xffffffffu, bin);
            if (lane == __ffs(grp) - 1 && bin < 256) atomicAdd(&hist[bin], (unsigned)__popc(grp));
        }
        __syncthreads();
        if (tid < 32) kv_pick_bin(hist, rem, &s_bin, &s_above, &s_exact);
        __syncthreads();
        prefix |= s_bin << shift;
        pmask |= 255u << shift;
        rem -= s_above;
        const int exact = s_exact;
        __syncthreads();
        if (exact) break; /* every key of the bin is taken: no ties to break */
    }
    /* masked key > prefix: kk - rem of them; == prefix: the first rem in position order */
    const int per = (n + bd - 1) / bd, a0 = tid * per, a1 = a0 + per < n ? a0 + per : n;
    int ngt = 0, neq = 0;
    for (int i = a0; i < a1; i++) {
        const unsigned key = kv_f2key(val[i]) & pmask;
        ngt += key > prefix;
        neq += key == prefix;
    }
    int tg, te;
    const int eg = kv_block_scan(ngt, &tg, sw), ee = kv_block_scan(neq, &te, sw);
    int o = eg + (ee < rem ? ee : rem);
    for (int i = a0, eqs = ee; i < a1; i++) {
        const unsigned key = kv_f2key(val[i]) & pmask;
        if (key > prefix) sel[o++] = i;
        else if (key == prefix && eqs++ < rem) sel[o++] = i;
    }
    __syncthreads();
    if (!ranked) { /* the selection in position order */
        for (int j = tid; j < kk; j += bd) out[j] = sel[j];
        __syncthreads();
        return;
    }
    /* each selected one's rank: P lanes (a power of 2, adjacent) count over a 1/P share each, then add by
     * shuffles; the loop's trip count is the same in every thread (the shuffles need whole warps) */
    int P = 1;
    while (P < 32 && 2 * P * kk <= bd) P <<= 1;
    for (int t0 = 0; t0 < kk * P; t0 += bd) {
        const int t = t0 + tid, j = t / P, part = t % P;
        int r = 0, p = 0;
        if (j < kk) {
            p = sel[j];
            const unsigned kj = kv_f2key(val[p]);
            for (int j2 = part; j2 < kk; j2 += P) {
                const int p2 = sel[j2];
                const unsigned k2 = kv_f2key(val[p2]);
                r += k2 > kj || (k2 == kj && p2 < p);
            }
        }
        for (int m = 1; m < P; m <<= 1) r += __shfl_xor_sync(0xffffffffu, r, m);
        if (j < kk && part == 0) out[r] = p;
    }
    __syncthreads();
}
#endif
