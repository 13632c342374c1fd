/* topk.cu: top-k per row on the GPU (rows = query heads, rows of 1M+ scores,
 * k up to KV_GPU_TOPK_MAX), in exactly kv_topk_ref's order (larger score
 * first, then smaller index), plus the k-th largest value; issue 2, point 8.
 *
 * Radix select on the order-preserving uint32 key of each float (kv_f2key,
 * -0 folded onto +0 so float ties stay ties): digits of 11, 11 and 10 bits
 * from the top. One cooperative launch of co-resident blocks, several per
 * row (16 rows x 1M fill the GPU): pass 0's histogram (or the one the score
 * kernel already built) tells every block of the row which top-digit bin
 * holds the k-th largest; each block copies the elements at or above that
 * bin (at most KV_TOPK_CAP, typically a few hundred) to a per-row candidate
 * buffer, reading only the tiles whose maximum (recorded by the score
 * kernel) reaches the bin when it has them. The row's last block finishes in
 * shared memory: with at most KV_RANK_MAX candidates each one's rank in
 * (key desc, index asc) order is counted directly and written to its place;
 * otherwise the remaining digits give the exact threshold, an
 * order-preserving compaction keeps key >= threshold and a bitonic sort
 * orders it. Either way ties at the threshold go to the smallest indices.
 * Only when the bin is too crowded does the row run another histogram pass
 * over its scores (its blocks meet at a software barrier, safe because the
 * launch is cooperative). If even the full 32-bit key leaves more than
 * KV_TOPK_CAP ties, the elements above the threshold are collected and the
 * last block appends the smallest-index ties by an ordered scan.
 * Histograms and counters are zeroed by the row's last block, so a call
 * needs no memset. */
#include <limits.h>

#include "kv_cuda.h"

namespace {

constexpr int TK_TH = 1024, TK_WARPS = TK_TH / 32, TK_U = 4;
constexpr int KV_RANK_MAX = 512; /* candidates ranked directly instead of refined and sorted */

struct kv_topk_params {
    const float *S;
    long long ld;
    int off, n, R, kk, base, hist0_done, want_idx, bpr;
    int32_t *oidx;
    float *oval;
    int out_ld;
    float *othr;
    unsigned *hist, *ctr, *ckey;
    int *cidx;
    const unsigned *tmax; /* tile maxima of the score kernel, or NULL */
    long long tmax_ld;
    int tshift;
};

/* What is known of a row's kk-th largest key: its top (32 - shift) bits
 * are `prefix`; `above` elements have a larger prefix, `inbin` this one. */
struct kv_rstate {
    unsigned prefix;
    int shift, above, inbin;
};

constexpr size_t kv_topk_smem() {
    return (size_t)KV_TOPK_CAP * (sizeof(unsigned) + sizeof(int)) + KV_HIST_BINS * sizeof(unsigned) +
           TK_WARPS * sizeof(int) + sizeof(kv_rstate) + 16;
}

__device__ __forceinline__ unsigned *kv_hist_row(const kv_topk_params &p, int pass, int r) {
    return p.hist + ((size_t)pass * p.R + r) * KV_HIST_BINS;
}

/* From a histogram of the next digit (nb bins) of the elements in the
 * current bin, the bin of the kk-th largest: block-wide, same result in
 * every thread. */
__device__ kv_rstate kv_find(const unsigned *h, bool global, int nb, kv_rstate st, int kk, int nshift, int *sw,
                             kv_rstate *sst) {
    const int t = threadIdx.x, d0 = nb - 1 - 2 * t, d1 = d0 - 1, bits = st.shift - nshift;
    const int c0 = d0 >= 0 ? (int)(global ? __ldcg(h + d0) : h[d0]) : 0;
    const int c1 = d1 >= 0 ? (int)(global ? __ldcg(h + d1) : h[d1]) : 0;
    int total;
    const int e = kv_block_scan(c0 + c1, &total, sw), r = kk - st.above;
    if (d0 >= 0 && e < r && r <= e + c0)
        *sst = {(st.prefix << bits) | (unsigned)d0, nshift, st.above + e, c0};
    else if (d1 >= 0 && e + c0 < r && r <= e + c0 + c1)
        *sst = {(st.prefix << bits) | (unsigned)d1, nshift, st.above + e + c0, c1};
    __syncthreads();
    const kv_rstate ns = *sst;
    __syncthreads();
    return ns;
}

/* Calls f(x, i, valid) for every i in [a, b) of row, 16-byte loads for the
 * aligned body, TK_U of them in flight per thread; warp-uniform calls, so f
 * may use warp votes. */
template <typename F>
__device__ __forceinline__ void kv_row_scan(const float *row, int a, int b, F f) {
    const int tid = threadIdx.x;
    int head = (int)(((16 - ((uintptr_t)(row + a) & 15)) & 15) / 4);
    if (head > b - a) head = b - a;
    {
        const int i = a + tid;
        const bool v = tid < head;
        f(v ? row[i] : 0.f, i, v);
    }
    const int a4 = a + head, nv = (b - a4) / 4;
    const float4 *r4 = (const float4 *)(row + a4);
    for (int base = 0; base < nv; base += TK_TH * TK_U) {
        float4 x[TK_U];
#pragma unroll
        for (int u = 0; u < TK_U; u++) {
            const int v = base + u * TK_TH + tid;
            x[u] = v < nv ? r4[v] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < TK_U; u++) {
            const int v = base + u * TK_TH + tid, i = a4 + 4 * v;
            const bool ok = v < nv;
            f(x[u].x, i, ok); f(x[u].y, i + 1, ok); f(x[u].z, i + 2, ok); f(x[u].w, i + 3, ok);
        }
    }
    {
        const int i = a4 + 4 * nv + tid;
        const bool v = i < b;
        f(v ? row[i] : 0.f, i, v);
    }
}

/* Histogram of the digit below st.shift of this block's elements whose key
 * has prefix st.prefix, added into the row's global histogram. */
__device__ void kv_hist_chunk(const float *row, int a, int b, kv_rstate st, int nshift, unsigned *shist,
                              unsigned *ghist) {
    const int nb = 1 << (st.shift - nshift);
    for (int j = threadIdx.x; j < nb; j += TK_TH) shist[j] = 0;
    __syncthreads();
    /* plain shared atomics: __match_any_sync and one add a digit was the slower (in ParisKV's one-block top-k
     * the search took 65.2-65.5 against 50.0-50.3 us at 128K, session 26 call B) */
    kv_row_scan(row, a, b, [&](float x, int i, bool valid) {
        const unsigned key = kv_f2key(x);
        if (valid && (st.shift == 32 || (key >> st.shift) == st.prefix))
            atomicAdd(&shist[(key >> nshift) & (unsigned)(nb - 1)], 1u);
    });
    __syncthreads();
    for (int j = threadIdx.x; j < nb; j += TK_TH)
        if (shist[j]) atomicAdd(&ghist[j], shist[j]);
}

/* Appends this block's elements with key >= lo (strict: > lo) to the row's candidates. */
__device__ void kv_filter_chunk(const float *row, int a, int b, unsigned lo, bool strict, unsigned *ncand,
                                unsigned *ckey, int *cidx) {
    kv_row_scan(row, a, b, [&](float x, int i, bool valid) {
        const unsigned key = kv_f2key(x);
        const bool take = valid && (strict ? key > lo : key >= lo);
        const unsigned pos = kv_warp_append(take, ncand);
        if (take && pos < KV_TOPK_CAP) { ckey[pos] = key; cidx[pos] = i; }
    });
}

/* The same from the score kernel's tile maxima: the block checks up to
 * 1024 tiles of 2^tshift scores at once (one load per thread), lists those
 * whose largest key reaches the bound (a few hundred of 4096 per 1M-token
 * row) and its warps share out the listed tiles, each read by one warp. */
__device__ void kv_filter_tiles(const kv_topk_params &p, int r, int a, int b, unsigned lo, bool strict,
                                unsigned *ncand, unsigned *ckey, int *cidx, int *tlist, int *s_ntl) {
    if (a >= b) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, x0 = p.off + a, x1 = p.off + b;
    const float *srow = p.S + (size_t)r * p.ld;
    const unsigned *tm = p.tmax + (size_t)r * p.tmax_ld;
    const int tlast = (x1 - 1) >> p.tshift;
    for (int tb = x0 >> p.tshift; tb <= tlast; tb += TK_TH) {
        if (threadIdx.x == 0) *s_ntl = 0;
        __syncthreads();
        const int tt = tb + threadIdx.x;
        bool ok = false;
        if (tt <= tlast) {
            const unsigned mx = __ldg(tm + tt);
            ok = strict ? mx > lo : mx >= lo;
        }
        const int pos = kv_warp_append(ok, s_ntl);
        if (ok) tlist[pos] = tt;
        __syncthreads();
        const int ntl = *s_ntl;
        for (int j = warp; j < ntl; j += TK_WARPS) {
            const int t = tlist[j];
            const int e0 = max(t << p.tshift, x0), e1 = min((t + 1) << p.tshift, x1);
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int x = e0 + 32 * u + lane;
                v[u] = x < e1 ? srow[x] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int x = e0 + 32 * u + lane;
                const unsigned key = kv_f2key(v[u]);
                const bool take = x < e1 && (strict ? key > lo : key >= lo);
                const unsigned pos = kv_warp_append(take, ncand);
                if (take && pos < KV_TOPK_CAP) { ckey[pos] = key; cidx[pos] = x - p.off; }
            }
        }
        __syncthreads();
    }
}

/* The blocks of one row meet here (co-resident: cooperative launch). */
__device__ void kv_row_barrier(unsigned *bar, unsigned target) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(bar, 1u);
        while (atomicAdd(bar, 0u) < target) __nanosleep(64);
        __threadfence();
    }
    __syncthreads();
}

/* Sorts k[0..P) (P a power of two) by key descending, then index ascending. */
__device__ void kv_bitonic(unsigned *k, int *ix, int P) {
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < P / 2; t += TK_TH) {
                const int lo = 2 * stride * (t / stride) + (t % stride), hi = lo + stride;
                const unsigned ka = k[lo], kb = k[hi];
                const int ia = ix[lo], ib = ix[hi];
                const bool b_first = kb > ka || (kb == ka && ib < ia);
                if (b_first == ((lo & size) == 0)) { k[lo] = kb; k[hi] = ka; ix[lo] = ib; ix[hi] = ia; }
            }
            __syncthreads();
        }
}

/* The general final stage: the remaining digits over the candidates, then
 * an order-preserving compaction and a bitonic sort. */
__device__ void kv_topk_select(const kv_topk_params &p, int r, const float *row, kv_rstate st, bool overflow, int c,
                               unsigned *skey, int *sidx, unsigned *shist, int *sw, kv_rstate *sst) {
    const int tid = threadIdx.x;
    kv_rstate cur = st;
    while (!overflow && cur.shift > 0) { /* the remaining digits, over the candidates */
        const int nshift = cur.shift == 21 ? 10 : 0, nb = 1 << (cur.shift - nshift);
        for (int j = tid; j < nb; j += TK_TH) shist[j] = 0;
        __syncthreads();
        for (int j = tid; j < c; j += TK_TH) {
            const unsigned key = skey[j];
            if ((key >> cur.shift) == cur.prefix) atomicAdd(&shist[(key >> nshift) & (unsigned)(nb - 1)], 1u);
        }
        __syncthreads();
        cur = kv_find(shist, false, nb, cur, p.kk, nshift, sw, sst);
    }
    const unsigned thr = cur.prefix;
    if (tid == 0 && p.othr) p.othr[r] = kv_key2f(thr);
    if (p.want_idx) {
        int nsel = 0;
        if (!overflow) { /* order-preserving in-place compaction of key >= thr */
            for (int base = 0; base < c; base += TK_TH) {
                const int j = base + tid;
                unsigned key = 0;
                int id = 0;
                bool keep = false;
                if (j < c) { key = skey[j]; id = sidx[j]; keep = key >= thr; }
                int tot;
                const int e = kv_block_scan(keep, &tot, sw); /* its barriers order the reads before the writes */
                if (keep) { skey[nsel + e] = key; sidx[nsel + e] = id; }
                nsel += tot;
                __syncthreads();
            }
        } else { /* [0, c) hold key > thr; append the smallest-index ties, scanning the row in order */
            const int need = p.kk - c;
            int found = 0;
            for (int base = 0; base < p.n && found < need; base += TK_TH * 4) {
                const int i0 = base + tid * 4;
                bool tie[4];
                int cnt = 0;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    tie[u] = i0 + u < p.n && kv_f2key(row[i0 + u]) == thr;
                    cnt += tie[u];
                }
                int tot;
                int e = found + kv_block_scan(cnt, &tot, sw);
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (tie[u]) {
                        if (e < need) { skey[c + e] = thr; sidx[c + e] = i0 + u; }
                        e++;
                    }
                found += tot;
            }
            nsel = p.kk;
            __syncthreads();
        }
        int P = 1;
        while (P < nsel) P <<= 1;
        for (int j = nsel + tid; j < P; j += TK_TH) { skey[j] = 0; sidx[j] = INT_MAX; }
        __syncthreads();
        kv_bitonic(skey, sidx, P);
        for (int j = tid; j < p.kk; j += TK_TH) {
            p.oidx[(size_t)r * p.out_ld + j] = sidx[j] + p.base;
            if (p.oval) p.oval[(size_t)r * p.out_ld + j] = kv_key2f(skey[j]);
        }
    }
}

/* The row's last block: exact threshold, selection, sort, output, cleanup. */
__device__ void kv_topk_final(const kv_topk_params &p, int r, const float *row, kv_rstate st, bool overflow,
                              unsigned *skey, int *sidx, unsigned *shist, int *sw, kv_rstate *sst) {
    const int tid = threadIdx.x;
    const int c = overflow ? (p.want_idx ? st.above : 0) : st.above + st.inbin;
    for (int j = tid; j < c; j += TK_TH) {
        skey[j] = __ldcg(p.ckey + (size_t)r * KV_TOPK_CAP + j);
        sidx[j] = __ldcg(p.cidx + (size_t)r * KV_TOPK_CAP + j);
    }
    __syncthreads();
    if (!overflow && c <= KV_RANK_MAX) {
        /* few candidates: each one's rank in (key desc, index asc) order directly, one pass, no sort */
        for (int j = c + tid; j < ((c + 3) & ~3); j += TK_TH) { skey[j] = 0; sidx[j] = INT_MAX; }
        __syncthreads();
        const int c4 = (c + 3) >> 2;
        for (int j = tid; j < c; j += TK_TH) {
            const unsigned kj = skey[j];
            const int ij = sidx[j];
            int rank = 0;
            for (int l = 0; l < c4; l++) {
                const uint4 kl = ((const uint4 *)skey)[l];
                const int4 il = ((const int4 *)sidx)[l];
                rank += (kl.x > kj || (kl.x == kj && il.x < ij)) + (kl.y > kj || (kl.y == kj && il.y < ij)) +
                        (kl.z > kj || (kl.z == kj && il.z < ij)) + (kl.w > kj || (kl.w == kj && il.w < ij));
            }
            if (rank < p.kk && p.want_idx) {
                p.oidx[(size_t)r * p.out_ld + rank] = ij + p.base;
                if (p.oval) p.oval[(size_t)r * p.out_ld + rank] = kv_key2f(kj);
            }
            if (rank == p.kk - 1 && p.othr) p.othr[r] = kv_key2f(kj);
        }
    } else {
        kv_topk_select(p, r, row, st, overflow, c, skey, sidx, shist, sw, sst);
    }
    const int npass = st.shift == 21 ? 1 : st.shift == 10 ? 2 : 3; /* global histograms this row used */
    for (int j = tid; j < npass * KV_HIST_BINS; j += TK_TH) kv_hist_row(p, j / KV_HIST_BINS, r)[j % KV_HIST_BINS] = 0;
    if (tid < 4) p.ctr[r * 4 + tid] = 0;
}

__global__ void __launch_bounds__(TK_TH, 1) kv_topk_kernel(const kv_topk_params p) {
    extern __shared__ __align__(16) unsigned char kv_tk_sm[];
    unsigned *skey = (unsigned *)kv_tk_sm;
    int *sidx = (int *)(skey + KV_TOPK_CAP);
    unsigned *shist = (unsigned *)(sidx + KV_TOPK_CAP);
    int *sw = (int *)(shist + KV_HIST_BINS);
    kv_rstate *sst = (kv_rstate *)(sw + TK_WARPS);
    __shared__ int s_ntl;
    for (int w = blockIdx.x; w < p.R * p.bpr; w += gridDim.x) {
        const int r = w / p.bpr, c = w % p.bpr;
        const float *row = p.S + (size_t)r * p.ld + p.off;
        const int a = (int)((long long)c * p.n / p.bpr), b = (int)((long long)(c + 1) * p.n / p.bpr);
        unsigned *ctr = p.ctr + r * 4; /* [0] candidates, [1] blocks done, [2] barrier */
        unsigned nbar = 0;
        kv_rstate st = {0u, 32, 0, p.n};
        if (!p.hist0_done) {
            kv_hist_chunk(row, a, b, st, 21, shist, kv_hist_row(p, 0, r));
            kv_row_barrier(&ctr[2], ++nbar * (unsigned)p.bpr);
        }
        st = kv_find(kv_hist_row(p, 0, r), true, KV_HIST_BINS, st, p.kk, 21, sw, sst);
        for (int pass = 1; st.above + st.inbin > KV_TOPK_CAP && st.shift > 0; pass++) {
            const int nshift = st.shift == 21 ? 10 : 0;
            kv_hist_chunk(row, a, b, st, nshift, shist, kv_hist_row(p, pass, r));
            kv_row_barrier(&ctr[2], ++nbar * (unsigned)p.bpr);
            st = kv_find(kv_hist_row(p, pass, r), true, 1 << (st.shift - nshift), st, p.kk, nshift, sw, sst);
        }
        const bool overflow = st.above + st.inbin > KV_TOPK_CAP;
        unsigned *ck = p.ckey + (size_t)r * KV_TOPK_CAP;
        int *ci = p.cidx + (size_t)r * KV_TOPK_CAP;
        if (overflow && !p.want_idx) {
        } else if (p.tmax) {
            kv_filter_tiles(p, r, a, b, overflow ? st.prefix : st.prefix << st.shift, overflow, &ctr[0], ck, ci,
                            (int *)shist, &s_ntl);
        } else {
            kv_filter_chunk(row, a, b, overflow ? st.prefix : st.prefix << st.shift, overflow, &ctr[0], ck, ci);
        }
        if (kv_arrives_last(&ctr[1], (unsigned)p.bpr)) {
            kv_topk_final(p, r, row, st, overflow, skey, sidx, shist, sw, sst);
        }
        __syncthreads();
    }
}

}  // namespace

kv_status kv_topk_ws_create(kv_topk_ws *w, int R, int T, const kv_cuda_dev *dev) {
    memset(w, 0, sizeof *w);
    w->R = R;
    w->tmax_ld = (T + 127) / 128;
    KV_CUDA_ALLOC(w->tmax, (size_t)R * w->tmax_ld * sizeof(unsigned), 0, "top-k tile maxima");
    KV_CUDA_ALLOC(w->hist, (size_t)3 * R * KV_HIST_BINS * sizeof(unsigned), 0, "top-k histograms");
    KV_CUDA_ALLOC(w->ctr, (size_t)R * 4 * sizeof(unsigned), 0, "top-k counters");
    KV_CUDA_ALLOC(w->ckey, (size_t)R * KV_TOPK_CAP * sizeof(unsigned), 0, "top-k candidates");
    KV_CUDA_ALLOC(w->cidx, (size_t)R * KV_TOPK_CAP * sizeof(int), 0, "top-k candidate indices");
    KV_CUDA_TRY(cudaMemset(w->hist, 0, (size_t)3 * R * KV_HIST_BINS * sizeof(unsigned)));
    KV_CUDA_TRY(cudaMemset(w->ctr, 0, (size_t)R * 4 * sizeof(unsigned))); /* before any kernel: kv_stream_create */
    const size_t smem = kv_topk_smem();
    KV_CUDA_TRY(cudaFuncSetAttribute(kv_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    KV_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kv_topk_kernel, TK_TH, smem));
    int coop = 0, devno = 0;
    KV_CUDA_TRY(cudaGetDevice(&devno));
    KV_CUDA_TRY(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, devno));
    if (per_sm < 1 || !coop)
        return kv_fail(KV_ERR_GPU, "GPU top-k: the device cannot run the cooperative top-k kernel (%d blocks/SM, "
                                   "cooperative launch %d)", per_sm, coop);
    w->grid_max = per_sm * dev->sm_count;
    return KV_OK;
}

void kv_topk_ws_destroy(kv_topk_ws *w) {
    cudaFree(w->hist);
    cudaFree(w->ctr);
    cudaFree(w->ckey);
    cudaFree(w->cidx);
    cudaFree(w->tmax);
    memset(w, 0, sizeof *w);
}

kv_status kv_topk_launch(kv_topk_ws *w, const float *S, long long ld, int off, int n, int R, int k, int base,
                         const kv_score_extras *x, int want_idx, int32_t *oidx, float *oval, int out_ld, float *othr,
                         cudaStream_t st) {
    const int kk = k < n ? k : n;
    if (kk <= 0 || R <= 0) return KV_OK;
    if (R > w->R) return kv_fail(KV_ERR_INTERNAL, "GPU top-k: %d rows in a workspace for %d", R, w->R);
    if (want_idx && kk > KV_GPU_TOPK_MAX)
        return kv_fail(KV_ERR_INPUT, "GPU top-k: k = %d exceeds the largest supported, %d (use --device cpu)", kk,
                       KV_GPU_TOPK_MAX);
    int bpr = (n + 8191) / 8192; /* >= 8K elements a block */
    if (bpr > w->grid_max / R) bpr = w->grid_max / R;
    if (bpr < 1) bpr = 1;
    long long grid = (long long)R * bpr;
    if (grid > w->grid_max) grid = w->grid_max; /* R > grid_max: blocks loop over rows, bpr = 1 */
    const int use_t = x && x->tshift >= 0;
    kv_topk_params p = {S, ld, off, n, R, kk, base, x ? x->hist_done : 0, want_idx, bpr, oidx, oval, out_ld, othr,
                        w->hist, w->ctr, w->ckey, w->cidx, use_t ? w->tmax : NULL, w->tmax_ld, use_t ? x->tshift : 0};
    void *args[] = {&p};
    KV_CUDA_TRY(cudaLaunchCooperativeKernel((const void *)kv_topk_kernel, dim3((unsigned)grid), dim3(TK_TH), args,
                                            kv_topk_smem(), st));
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* ---- host-array entry point (tests) ---- */
namespace {
struct kv_tk_host {
    kv_topk_ws ws;
    float *S, *val, *thr;
    int32_t *idx;
    cudaStream_t st;
};
kv_status kv_tk_host_run(kv_tk_host *h, const float *scores, int R, int n, int k, int base, int32_t *idx,
                         float *val, float *kth) {
    kv_cuda_dev dev;
    KV_TRY(kv_cuda_dev_query(&dev));
    KV_TRY(kv_topk_ws_create(&h->ws, R, n, &dev));
    const int kk = k < n ? k : n;
    KV_CUDA_ALLOC(h->S, (size_t)R * n * sizeof(float), 0, "test score rows");
    KV_CUDA_ALLOC(h->idx, (size_t)R * kk * sizeof(int32_t), 0, "test top-k indices");
    KV_CUDA_ALLOC(h->val, (size_t)R * kk * sizeof(float), 0, "test top-k values");
    KV_CUDA_ALLOC(h->thr, (size_t)R * sizeof(float), 0, "test thresholds");
    KV_CUDA_TRY(kv_stream_create(&h->st));
    KV_CUDA_TRY(cudaMemcpy(h->S, scores, (size_t)R * n * sizeof(float), cudaMemcpyHostToDevice));
    KV_TRY(kv_topk_launch(&h->ws, h->S, n, 0, n, R, k, base, NULL, idx != NULL, h->idx, h->val, kk, h->thr, h->st));
    KV_CUDA_TRY(cudaStreamSynchronize(h->st));
    if (idx) KV_CUDA_TRY(cudaMemcpy(idx, h->idx, (size_t)R * kk * sizeof(int32_t), cudaMemcpyDeviceToHost));
    if (idx && val) KV_CUDA_TRY(cudaMemcpy(val, h->val, (size_t)R * kk * sizeof(float), cudaMemcpyDeviceToHost));
    if (kth) KV_CUDA_TRY(cudaMemcpy(kth, h->thr, (size_t)R * sizeof(float), cudaMemcpyDeviceToHost));
    return KV_OK;
}
}  // namespace

extern "C" kv_status kv_gpu_topk_host(const float *scores, int R, int n, int k, int base, int32_t *idx, float *val,
                                      float *kth) {
    if (R <= 0 || n <= 0 || k <= 0) return kv_fail(KV_ERR_INPUT, "kv_gpu_topk_host: R=%d n=%d k=%d", R, n, k);
    kv_tk_host h = {};
    kv_status st = kv_tk_host_run(&h, scores, R, n, k, base, idx, val, kth);
    if (h.st) cudaStreamDestroy(h.st);
    cudaFree(h.S);
    cudaFree(h.idx);
    cudaFree(h.val);
    cudaFree(h.thr);
    kv_topk_ws_destroy(&h.ws);
    return st;
}
