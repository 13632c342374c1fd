/* pqcache.cu: PQCache's CUDA search path and bench (issue 5, point 1; the
 * CPU reference and the paper's facts are in retrievers/pqcache.c; the
 * k-means build and the encoding of appended keys are pqcache_kmeans.cu).
 *
 * Search. LUT kernel (bitwise kv_pq_lut: products and sums rounded as on the
 * CPU, __fmul_rn/__fadd_rn). When the tuples of codes are few (C^M <= 4096:
 * the default M = 2, b = 6), a key's group score depends on its tuple only,
 * and the search never materialises per-key scores: (1) a histogram of the
 * region's tuples (codes [Hkv][T][M], read once, coalesced, shared-memory
 * atomics merged into a global histogram that step 2 zeroes again); (2) one
 * block per kv head: m_h = max over present tuples and
 * Z_h = sum count * expf(s - m_h) in double (the CPU's Z up to double
 * rounding), the table agg(tuple) = sum_h expf(s_h - m_h) / Z_h in the CPU's
 * order, and the top-k threshold on the tuples: radix select over the
 * tables' order-preserving keys weighted by the counts gives K, the k-th
 * largest key score, and `take`, how many keys scoring exactly K belong to
 * the selection (equal scores, from one tuple or several, merge); (3)
 * ordered compaction, codes re-read (from L2 at 1M tokens): per block of
 * keys the keys above K are appended (fewer than k) and those equal to K
 * counted; a second launch has each block whose equal keys are among the
 * first `take` (prefix of the counts of the blocks before it) write them in
 * position order (ballot scan); (4) one block per kv head sorts the k
 * candidates by (score desc, position asc) (64-bit keys, kv_sort_out). So the
 * selection is exactly kv_topk_ref over the per-key scores agg[tuple], ties
 * included. Fused (issue 12, the default; KVBENCH_PQ_FUSED=0 at create keeps
 * the six launches above): two launches, as each dependent one costs a few
 * microseconds even in a graph: pq_hist_table (the histogram blocks, one
 * more block computing the LUT, and the last block per kv head running the
 * table and threshold) and pq_select_fused (the compaction marks ties in
 * registers, writes each block's first ties in order, and the last block
 * per kv head takes the first `take` of them and sorts), the same selection.
 * pq_select_fused is a programmatic dependent launch (session 19;
 * KVBENCH_PQ_PDL=0 at create: plain): pq_hist_table lets its blocks be
 * scheduled at once, and they wait (kv_dep_wait) before reading anything,
 * so they are resident while the table's last blocks run; with kv_sort_out
 * and the kernel held to 32 registers (two 1024-thread blocks an SM: the
 * rank placement's code had taken it to 42), the search at 1M went from
 * 73.0-75.9 to 61.9-67.8 us (H200, session 19 call C, three rounds;
 * 68.8-69.7 without PDL), at 16K from 39.7-40.0 to 36.4-36.6. Where the
 * fixed cost is (H100, session 7, %globaltimer stamps in a
 * temporary build): at 16K tokens the table's last block spent ~17 us in its
 * per-head passes and ~8.5 us in the radix threshold, at 1M ~34 and ~8 us,
 * one SM issuing 3 evaluations of each of the 4096 tuples per head (two
 * integer divisions each) and 2 expf. Now each tuple's score is computed once
 * per head and kept in registers with its expf (the same operations in the
 * same order: bitwise the same table), the digits by shifts where C is a
 * power of two, and from 262144 keys a kv head on the threshold first tries
 * the top values one at a time (pq_threshold). Search, old against new in one
 * call: 48.6-48.8 -> 40.4-40.6 us at 16K, 72.0-72.9 -> 61.9-62.4 at 256K,
 * 76.8-80.1 -> 66.2-72.5 at 1M. Tried and not kept: pq_select_fused's pass
 * loading the codes of 8 chunks before using the first (topk at 1M
 * 40.7-41.2 against 38.2-41.7 us, 128K 21.0-21.2 against 18.6-18.9).
 * Session 24 (issue 12.4, PQCache <= 40 us at 1M): Nsight Compute's
 * source counters showed both launches waiting on their code loads, one
 * 2-byte load at a time a warp, and %globaltimer stamps (a dev build) the
 * phases. Now each thread takes a run of consecutive keys (pq_run: 16-B
 * loads, several in flight; blocks start at lo rounded down to 8 keys,
 * pq_blocks); pq_select_fused copies its block's codes into shared memory
 * (cp.async) before its PDL wait, so the copies run while pq_hist_table's
 * last blocks build the tables, then classes its keys through a byte table
 * per tuple (above K, at K, below) two bits a key, and writes its ties with
 * one block scan of the runs (the runs are in position order); the table
 * loads its counts together, reduces two heads at a time by warp shuffles,
 * and the LUT block stages its operands by cp.async. Session 25: the
 * threshold's top-value round reduces 32-bit keys and counts by redux
 * (block_redux): 1M 41.0-41.2 -> 39.1-39.6 us. Tried and not kept there:
 * the table's maxima by redux of their keys (40.2-40.4 against 39.3-39.6),
 * fewer and larger selection blocks, the carveout at its maximum. The
 * numbers are in results/gpu-cost-h200.md.
 * Otherwise (C^M > 4096), two launches over tiles of keys:
 * codes laid out [Hkv][T][M] (the CPU's layout, each head's row padded to 16
 * bytes) are loaded into shared memory with 16-byte coalesced loads, scored
 * from the G lookup tables of the group held in shared memory; launch A
 * takes the max and the sum of exp per query head and tile, and the last
 * tile of each kv head (threadfence reduction) combines them into m_h and
 * 1/Z_h (Z in double); launch B re-reads the tile (L2-resident at 1M
 * tokens: 16 MB of codes) and writes agg_i = sum_h expf(s_hi - m_h) / Z_h
 * in the CPU's order. The per-key scores are bitwise the CPU's; m_h is
 * exact; Z_h differs from the CPU's double sum only by the per-tile
 * rescaling (~1e-7 relative), and CUDA's expf from glibc's by <= 2 ulp, so
 * agg matches within ~1e-6 relative; top-k per kv head over agg by
 * kv_topk_launch (kv_topk_ref's order: larger first, smaller index among
 * equals). */
#include <string.h>

#include "pqcache_dev.cuh"
#include "ops/radix_digit.cuh"


namespace {

/* ---- search ---- */

/* lut[(h*M + m)*C + c] = sum_j q_h[m*dsub + j] * cent_g[m][j][c], as kv_pq_lut: entry e = m*C + c of head h. */
template <bool LDG = true> /* false: operands in shared memory */
__device__ __forceinline__ float pq_lut_entry(const float *q, const float *cent, int h, int g, int D, int M, int dsub,
                                              int C, int e) {
    const int m = e / C, c = e % C;
    const float *qm = q + h * D + m * dsub, *cm = cent + ((long long)(g * M + m) * dsub) * C + c;
    /* operands loaded 16 at a time ahead of the sums (a cold load per term kept this launch
     * latency-bound); the products and sums are the CPU's, in its order */
    float a = 0.f;
    int j = 0;
    for (; j + 16 <= dsub; j += 16) {
        float qv[16], cv[16];
#pragma unroll
        for (int u = 0; u < 16; u++) {
            qv[u] = LDG ? __ldg(qm + j + u) : qm[j + u];
            cv[u] = LDG ? __ldg(cm + (long long)(j + u) * C) : cm[(long long)(j + u) * C];
        }
#pragma unroll
        for (int u = 0; u < 16; u++) a = __fadd_rn(a, __fmul_rn(qv[u], cv[u]));
    }
    for (; j < dsub; j++) a = __fadd_rn(a, __fmul_rn(qm[j], cm[(long long)j * C]));
    return a;
}

__global__ void pq_lut(const float *q, const float *cent, int G, int D, int M, int dsub, int C, float *lut) {
    int h = blockIdx.x, g = h / G;
    for (int e = threadIdx.x; e < M * C; e += blockDim.x)
        lut[(long long)h * M * C + e] = pq_lut_entry(q, cent, h, g, D, M, dsub, C, e);
}

struct pq_scan_args {
    const uint8_t *codes;
    long long TM;
    const float *lut;
    int G, M, C, lo, hi, KT, lut_smem;
    float scale;
    float *pm;      /* [Hq][ld] tile maxima */
    double *pz;     /* [Hq][ld] tile sums of exp(s - tile max) */
    int ld;
    unsigned *ctr;  /* [Hkv] */
    float *mz;      /* [Hq][2]: m, 1/Z */
    float *agg;     /* [Hkv][ald] */
    long long ald;
};

/* Shared memory: the group's tables (when they fit), then the tile's code
 * bytes from a 16-byte aligned start. Returns the tile's first key. */
__device__ __forceinline__ int pq_load_tile(const pq_scan_args &a, float *slut, uint8_t *scode, const float **L,
                                            int *k0, int *k1, int *a16) {
    int g = blockIdx.y;
    *k0 = a.lo + blockIdx.x * a.KT;
    *k1 = min(a.hi, *k0 + a.KT);
    const int GMC = a.G * a.M * a.C;
    const float *gl = a.lut + (long long)g * GMC;
    if (a.lut_smem) {
        for (int e = threadIdx.x; e < GMC; e += blockDim.x) slut[e] = gl[e];
        *L = slut;
    } else
        *L = gl;
    long long b0 = (long long)*k0 * a.M, b1 = (long long)*k1 * a.M;
    long long s16 = b0 & ~15LL, e16 = (b1 + 15) & ~15LL;
    const uint4 *src = (const uint4 *)(a.codes + g * a.TM + s16);
    uint4 *dst = (uint4 *)scode;
    for (int e = threadIdx.x; e < (int)((e16 - s16) >> 4); e += blockDim.x) dst[e] = __ldg(src + e);
    *a16 = (int)(b0 - s16);
    __syncthreads();
    return *k0;
}

__device__ __forceinline__ float pq_score(const float *L, const uint8_t *code, int M, int C, float scale) {
    float s = 0.f;
    for (int m = 0; m < M; m++) s = __fadd_rn(s, L[m * C + code[m]]);
    return __fmul_rn(s, scale);
}

/* Block reductions (ops/kv_cuda.h kv_block_reduce_w: a tree of five steps where a serial pass over 32 values
 * had cost ~1000 cycles a call; the table runs a dozen). The double sum's order is a tree; Z is the CPU's up to
 * double rounding either way. */
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, T *sh, Op op, T none) {
    return kv_block_reduce_w(v, sh, [&](T x) {
        for (int o = 16; o; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
        return x;
    }, none);
}

/* Two values reduced at once (sh: 64 words). */
template <class T, class Op>
__device__ __forceinline__ void block_reduce2(T &a, T &b, T *sh, Op op, T none) {
    for (int o = 16; o; o >>= 1) {
        a = op(a, __shfl_xor_sync(0xffffffffu, a, o));
        b = op(b, __shfl_xor_sync(0xffffffffu, b, o));
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) { sh[w] = a; sh[32 + w] = b; }
    __syncthreads();
    a = lane < nw ? sh[lane] : none;
    b = lane < nw ? sh[32 + lane] : none;
    for (int o = 16; o; o >>= 1) {
        a = op(a, __shfl_xor_sync(0xffffffffu, a, o));
        b = op(b, __shfl_xor_sync(0xffffffffu, b, o));
    }
}

/* Block max (sum: add) of 32-bit unsigned values by the warps' redux instructions (sh: 32 words). */
__device__ __forceinline__ unsigned block_redux(unsigned v, unsigned *sh, bool add) {
    return kv_block_reduce_w(v, sh, [&](unsigned x) {
        return add ? __reduce_add_sync(0xffffffffu, x) : __reduce_max_sync(0xffffffffu, x);
    }, 0u);
}

__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    return block_reduce(v, sh, [](double a, double b) { return a + b; }, 0.0);
}

struct fmax_op { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

__global__ void __launch_bounds__(PQ_TH) pq_scan_a(pq_scan_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float redf[32];
    __shared__ double redd[32];
    const int GMC = a.G * a.M * a.C;
    float *slut = (float *)smem;
    uint8_t *scode = smem + (a.lut_smem ? ((GMC * 4 + 15) & ~15) : 0);
    const float *L;
    int k0, k1, a16;
    pq_load_tile(a, slut, scode, &L, &k0, &k1, &a16);
    int g = blockIdx.y;
    for (int hh = 0; hh < a.G; hh++) {
        const float *Lh = L + hh * a.M * a.C;
        float mx = -INFINITY;
        for (int i = k0 + threadIdx.x; i < k1; i += blockDim.x)
            mx = fmaxf(mx, pq_score(Lh, scode + a16 + (i - k0) * a.M, a.M, a.C, a.scale));
        mx = block_reduce(mx, redf, fmax_op(), -INFINITY);
        float z = 0.f;
        for (int i = k0 + threadIdx.x; i < k1; i += blockDim.x)
            z += expf(pq_score(Lh, scode + a16 + (i - k0) * a.M, a.M, a.C, a.scale) - mx);
        double zd = block_sum_d((double)z, redd);
        if (threadIdx.x == 0) {
            int h = g * a.G + hh;
            a.pm[(long long)h * a.ld + blockIdx.x] = mx;
            a.pz[(long long)h * a.ld + blockIdx.x] = zd;
        }
    }
    /* the last tile of this kv head combines the tiles (threadfence reduction) */
    if (!kv_arrives_last(&a.ctr[g], gridDim.x)) return;
    for (int hh = 0; hh < a.G; hh++) {
        int h = g * a.G + hh;
        float mx = -INFINITY;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) mx = fmaxf(mx, __ldcg(a.pm + (long long)h * a.ld + b));
        mx = block_reduce(mx, redf, fmax_op(), -INFINITY);
        double z = 0;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
            z += __ldcg(a.pz + (long long)h * a.ld + b) * exp((double)__ldcg(a.pm + (long long)h * a.ld + b) - mx);
        z = block_sum_d(z, redd);
        if (threadIdx.x == 0) { a.mz[2 * h] = mx; a.mz[2 * h + 1] = (float)(1.0 / z); }
    }
    if (threadIdx.x == 0) a.ctr[g] = 0;
}

__global__ void __launch_bounds__(PQ_TH) pq_scan_b(pq_scan_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float smz[64];
    const int GMC = a.G * a.M * a.C;
    float *slut = (float *)smem;
    uint8_t *scode = smem + (a.lut_smem ? ((GMC * 4 + 15) & ~15) : 0);
    int g = blockIdx.y;
    if (threadIdx.x < 2 * a.G && a.G <= 32) smz[threadIdx.x] = a.mz[2 * g * a.G + threadIdx.x];
    const float *L;
    int k0, k1, a16;
    pq_load_tile(a, slut, scode, &L, &k0, &k1, &a16);
    const float *mz = a.G <= 32 ? smz : a.mz + 2 * g * a.G;
    for (int i = k0 + threadIdx.x; i < k1; i += blockDim.x) {
        const uint8_t *code = scode + a16 + (i - k0) * a.M;
        float acc = 0.f;
        for (int hh = 0; hh < a.G; hh++) {
            float s = pq_score(L + hh * a.M * a.C, code, a.M, a.C, a.scale);
            acc = __fadd_rn(acc, __fmul_rn(expf(s - mz[2 * hh]), mz[2 * hh + 1]));
        }
        a.agg[g * a.ald + (i - a.lo)] = acc;
    }
}

/* ---- ADC through a table of code tuples (C^M <= PQ_TUP_MAX: M = 2, b <= 6 by default) ----
 * A key's group score depends on its tuple of codes only, so: (1) a
 * histogram of the tuples of the region (codes read once, coalesced);
 * (2) per kv head, from the histogram and the lookup tables, m_h (max over
 * present tuples) and Z_h = sum count * expf(s - m_h) (double), then per
 * tuple agg = sum_h expf(s_h - m_h) / Z_h in the CPU's order, and the top-k
 * threshold; pq_apply (tests only) writes each key's agg as one lookup.
 * Scores per tuple are computed exactly as per key on the CPU. */

template <bool M2>
__device__ __forceinline__ int pq_tuple(const uint8_t *row, long long i, int M, int C) {
    if (M2) {
        unsigned v = __ldg((const unsigned short *)(row + 2 * i));
        return (int)(v & 0xffu) + (int)(v >> 8) * C;
    }
    int t = 0;
    for (int m = M - 1; m >= 0; m--) t = t * C + row[i * M + m];
    return t;
}

/* The tuple path's blocks of kpb keys (a multiple of 8 * blockDim.x, pq_tuple_kpb) start at lo rounded
 * down to 8 keys, so that 2-byte codes are read 16 B at a time: block b covers [k0, k1) with
 * k0 = (lo & ~7) + b * kpb, k1 = min(hi, k0 + kpb), and holds the keys of it from lo on. */
__host__ __device__ __forceinline__ int pq_blocks(int lo, int hi, int kpb) { return (hi - (lo & ~7) + kpb - 1) / kpb; }

/* This thread's run of per = kpb / blockDim.x consecutive keys of its block, [a, a + per), in batches of
 * 8 NV keys: f(j, t, in) for key a + b + j of the batch at b (j < 8 NV, a constant where unrolled), its tuple t
 * and whether it is one of the block's (lo <= key < k1; t = 0 when not), then done(b). Every thread of the
 * block makes the same calls. M = 2: a batch is NV 16-B loads, ld(c, i0) for the run's c-th 8 keys from key
 * i0 (from global memory, or where the caller staged them), issued before any is used, where one 2-byte
 * load at a time had each warp wait on it (session 24: pq_hist_table and pq_select_fused at 1M were
 * latency-bound on those loads); groups of 8 keys the whole warp holds skip the range checks. */
template <bool M2, int NV, class LD, class F, class B>
__device__ __forceinline__ void pq_run(const uint8_t *row, int k0, int k1, int lo, int per, int M, int C, LD ld, F f,
                                       B done) {
    const int a = k0 + (int)threadIdx.x * per;
    for (int b = 0; b < per; b += 8 * NV) {
        if (M2) {
            uint4 v[NV];
#pragma unroll
            for (int r = 0; r < NV; r++) {
                const int i0 = a + b + 8 * r;
                v[r] = b + 8 * r < per && i0 < k1 ? ld(b / 8 + r, i0) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int r = 0; r < NV; r++) {
                if (b + 8 * r >= per) break; /* uniform */
                const int i0 = a + b + 8 * r;
                const unsigned w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
                if (__all_sync(0xffffffffu, i0 >= lo && i0 + 8 <= k1))
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const unsigned c = (w[j >> 1] >> (16 * (j & 1))) & 0xffffu;
                        f(8 * r + j, (int)(c & 0xffu) + (int)(c >> 8) * C, true);
                    }
                else
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const unsigned c = (w[j >> 1] >> (16 * (j & 1))) & 0xffffu;
                        const bool in = i0 + j >= lo && i0 + j < k1;
                        f(8 * r + j, in ? (int)(c & 0xffu) + (int)(c >> 8) * C : 0, in);
                    }
            }
        } else
            for (int j = 0; j < 8 * NV && b + j < per; j++) {
                const int i = a + b + j;
                const bool in = i >= lo && i < k1;
                f(j, in ? pq_tuple<false>(row, i, M, C) : 0, in);
            }
        done(b);
    }
}

/* Block b's tuple histogram (pq_blocks' keys) into sh[ntup], zeroed here, and added to gh. */
template <bool M2>
__device__ __forceinline__ void pq_hist_block(const uint8_t *row, int lo, int hi, int kpb, int M, int C, int ntup,
                                              unsigned *sh, unsigned *gh) {
    for (int e = threadIdx.x; e < ntup; e += blockDim.x) sh[e] = 0;
    __syncthreads();
    const int k0 = (lo & ~7) + blockIdx.x * kpb, k1 = min(hi, k0 + kpb);
    pq_run<M2, 4>(row, k0, k1, lo, kpb / (int)blockDim.x, M, C,
                  [&](int, int i0) { return __ldg((const uint4 *)row + (i0 >> 3)); }, [&](int, int t, bool in) {
        if (in) atomicAdd(&sh[t], 1u);
    }, [](int) {});
    __syncthreads();
    for (int e = threadIdx.x; e < ntup; e += blockDim.x)
        if (sh[e]) atomicAdd(&gh[e], sh[e]);
}

template <bool M2>
__global__ void __launch_bounds__(1024) pq_hist(const uint8_t *codes, long long TM, int M, int C, int lo, int hi,
                                                 int ntup, int kpb, unsigned *gh) {
    __shared__ unsigned sh[PQ_TUP_MAX];
    const int g = blockIdx.y;
    pq_hist_block<M2>(codes + g * TM, lo, hi, kpb, M, C, ntup, sh, gh + (long long)g * ntup);
}

/* The top-kk threshold over the region's keys, found on the tuples: radix
 * select (8 bits a pass, most significant first) over the order-preserving
 * keys of the tuples' group scores, each present tuple weighted by its key
 * count. thr[0] = K, the kk-th largest key of the region; thr[1] = how many
 * keys scoring exactly K the selection takes (>= 1; kv_topk_ref takes the
 * first ones by position). The caller syncs cnt and acc first; blockDim.x
 * is a multiple of 32. Where the region's n keys are many per tuple (n >=
 * 64 ntup: 262144 keys at the default 4096 tuples), the largest
 * keys are first taken a value at a time (block max below the last one, then
 * the count of keys at it), up to 4 values: when they hold kk keys, K is the
 * last and `take` what it adds, as the radix select finds them (one value
 * suffices at 1M tokens, where a tuple holds ~256 keys); else the radix
 * select runs. */
__device__ void pq_threshold(const unsigned *cnt, const float *acc, int ntup, int n, int kk, unsigned *rh,
                             unsigned *sel, unsigned *thr) {
    __shared__ unsigned r32[32];
    if (n >= 64 * ntup) {
        /* keys are compared + 1, 0 being "none": a table entry is a sum of probabilities, a finite float >= 0,
         * whose key is below 0xff800000, so the + 1 stays in 32 bits; counts sum to n < 2^31. So the
         * reductions are 32-bit, one redux instruction a warp where 64-bit shuffles took ten (session 25) */
        unsigned lim = ~0u, above = 0;
        for (int r = 0; r < 4; r++) {
            unsigned best = 0;
            for (int t = threadIdx.x; t < ntup; t += blockDim.x) {
                const unsigned u = kv_f2key(acc[t]) + 1;
                if (cnt[t] && u < lim && u > best) best = u;
            }
            best = block_redux(best, r32, false);
            if (!best) break;
            unsigned c = 0;
            for (int t = threadIdx.x; t < ntup; t += blockDim.x)
                if (cnt[t] && kv_f2key(acc[t]) + 1 == best) c += cnt[t];
            c = block_redux(c, r32, true);
            if (above + c >= (unsigned)kk) {
                if (threadIdx.x == 0) { thr[0] = (unsigned)(best - 1); thr[1] = (unsigned)(kk - above); }
                return;
            }
            above += c;
            lim = best;
        }
    }
    unsigned prefix = 0, mask = 0, need = (unsigned)kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int e = threadIdx.x; e < 256; e += blockDim.x) rh[e] = 0;
        __syncthreads();
        /* warp-aggregated: the tuples' scores are close, so most share the top digits */
        for (int t0 = 0; t0 < ntup; t0 += blockDim.x) {
            const int t = t0 + threadIdx.x;
            unsigned u = 0, c = 0;
            if (t < ntup) { c = cnt[t]; u = kv_f2key(acc[t]); }
            const unsigned d = c && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, d);
            const unsigned sum = __reduce_add_sync(peers, c);
            if (d < 256u && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&rh[d], sum);
        }
        __syncthreads();
        if (threadIdx.x < 32) kv_radix_pick_digit(rh, need, threadIdx.x, sel);
        __syncthreads();
        prefix |= sel[0] << shift;
        mask |= 255u << shift;
        need = sel[1];
    }
    if (threadIdx.x == 0) { thr[0] = prefix; thr[1] = need; }
}

constexpr int PQ_TUP_PT = PQ_TUP_MAX / 1024; /* tuples per thread of pq_table_body (1024 threads) */

/* The tuple table of kv head g, one block: counts (the histogram is zeroed
 * for the next search as it is read), softmax constants, the per-tuple
 * table, and the top-kk threshold over the keys (pq_threshold into thr[2g],
 * thr[2g+1]). Shared: cnt, acc [PQ_TUP_MAX], sl [2048]. The histogram and
 * the tables may come from other blocks of the same launch (pq_hist_table):
 * read through L2 (__ldcg). */
__device__ void pq_table_body(int g, unsigned *gh, const float *lut, int G, int M, int C, int ntup, int n, float scale,
                              int kk, float *mz, float *tab, unsigned *thr, unsigned *cnt, float *acc, float *sl) {
    __shared__ float redf[64];
    __shared__ double redd[64];
    __shared__ unsigned rh[256], sel[2];
    const int lut_sm = G * M * C <= 2048;
    unsigned c[PQ_TUP_PT]; /* every load issued before any store (a loop storing each had them in turn: 1.6 to
                            * 5.3 us a head under the selection's copies, 1.0 to 3.1 since; session 24) */
#pragma unroll
    for (int j = 0; j < PQ_TUP_PT; j++) {
        const int t = threadIdx.x + j * blockDim.x;
        c[j] = t < ntup ? __ldcg(gh + (long long)g * ntup + t) : 0u;
    }
#pragma unroll
    for (int j = 0; j < PQ_TUP_PT; j++) {
        const int t = threadIdx.x + j * blockDim.x;
        if (t >= ntup) continue;
        cnt[t] = c[j];
        gh[(long long)g * ntup + t] = 0;
        acc[t] = 0.f;
    }
    if (lut_sm)
        for (int e = threadIdx.x; e < G * M * C; e += blockDim.x) sl[e] = __ldcg(lut + (long long)g * G * M * C + e);
    __syncthreads();
    /* each tuple's score computed once per head and kept in registers (PQ_TUP_PT a thread: the callers launch
     * 1024 threads), its expf once; the max, the sum and the table in the order of three passes over t; two
     * heads a pass, their maxima and sums reduced together (half the block barriers) */
    const int csh = (C & (C - 1)) == 0 ? __ffs(C) - 1 : -1; /* C a power of two: shifts for the tuple's digits */
    auto score = [&](const float *L, int t) {
        float s = 0.f;
        if (M == 2 && csh >= 0) /* the default shape, M = 2 and C a power of two: no loop */
            s = __fadd_rn(__fadd_rn(s, L[t & (C - 1)]), L[C + (t >> csh)]);
        else
            for (int m = 0, r = t; m < M; m++, r = csh >= 0 ? r >> csh : r / C)
                s = __fadd_rn(s, L[m * C + (csh >= 0 ? r & (C - 1) : r % C)]);
        return __fmul_rn(s, scale);
    };
    for (int h0 = 0; h0 < G; h0 += 2) {
        const bool two = h0 + 1 < G;
        const float *L0 = lut_sm ? sl + h0 * M * C : lut + (long long)(g * G + h0) * M * C, *L1 = L0 + M * C;
        float e0[PQ_TUP_PT], e1[PQ_TUP_PT];
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < PQ_TUP_PT; j++) {
            const int t = threadIdx.x + j * blockDim.x;
            e0[j] = e1[j] = 0.f;
            if (t >= ntup) continue;
            e0[j] = score(L0, t);
            if (two) e1[j] = score(L1, t);
            if (cnt[t]) { mx0 = fmaxf(mx0, e0[j]); mx1 = fmaxf(mx1, e1[j]); }
        }
        block_reduce2(mx0, mx1, redf, fmax_op(), -INFINITY);
        double z0 = 0, z1 = 0;
#pragma unroll
        for (int j = 0; j < PQ_TUP_PT; j++) {
            const int t = threadIdx.x + j * blockDim.x;
            if (t >= ntup) continue;
            e0[j] = expf(e0[j] - mx0);
            if (two) e1[j] = expf(e1[j] - mx1);
            if (cnt[t]) { z0 += (double)cnt[t] * (double)e0[j]; z1 += (double)cnt[t] * (double)e1[j]; }
        }
        block_reduce2(z0, z1, redd, [](double a, double b) { return a + b; }, 0.0);
        const float inv0 = (float)(1.0 / z0), inv1 = (float)(1.0 / z1);
#pragma unroll
        for (int j = 0; j < PQ_TUP_PT; j++) {
            const int t = threadIdx.x + j * blockDim.x;
            if (t >= ntup) continue;
            float v = __fadd_rn(acc[t], __fmul_rn(e0[j], inv0));
            if (two) v = __fadd_rn(v, __fmul_rn(e1[j], inv1));
            acc[t] = v;
        }
        if (threadIdx.x == 0) {
            const int h = g * G + h0;
            mz[2 * h] = mx0; mz[2 * h + 1] = inv0;
            if (two) { mz[2 * h + 2] = mx1; mz[2 * h + 3] = inv1; }
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < ntup; t += blockDim.x) tab[(long long)g * ntup + t] = acc[t];
    pq_threshold(cnt, acc, ntup, n, kk, rh, sel, thr + 2 * g);
}

/* One block per kv head: pq_table_body (the unfused path, KVBENCH_PQ_FUSED=0). */
__global__ void __launch_bounds__(1024) pq_table(unsigned *gh, const float *lut, int G, int M, int C, int ntup, int n,
                                                  float scale, int kk, float *mz, float *tab, unsigned *thr) {
    __shared__ unsigned cnt[PQ_TUP_MAX];
    __shared__ float acc[PQ_TUP_MAX];
    __shared__ float sl[2048];
    pq_table_body(blockIdx.x, gh, lut, G, M, C, ntup, n, scale, kk, mz, tab, thr, cnt, acc, sl);
}

/* The fused scan (one launch, grid (nbk + 1, Hkv)): blocks x < nbk build
 * the tuple histogram of their kpb keys as pq_hist; block nbk computes the
 * lookup tables of the group's G query heads (pq_lut_entry, as pq_lut); the
 * last block of the kv head to finish (threadfence reduction) then runs
 * pq_table_body. So the LUT, the histogram and the table are one graph
 * node instead of three (each dependent node costs a few microseconds). */
struct pq_fused_args {
    const uint8_t *codes;
    long long TM;
    int M, C, lo, hi, ntup, kpb, G, D, dsub, kk;
    float scale;
    unsigned *gh, *ctr, *thr;
    const float *q, *cent;
    float *lut, *mz, *tab;
};

template <bool M2>
__global__ void __launch_bounds__(1024, 2) pq_hist_table(pq_fused_args a) {
    /* [0, PQ_TUP_MAX): the block's histogram, in the last block the counts; then the per-tuple sums; in the
     * LUT block the whole 2 * PQ_TUP_MAX words hold the group's centroids and sl its queries, when they fit */
    __shared__ __align__(16) unsigned sh[2 * PQ_TUP_MAX];
    __shared__ __align__(16) float sl[2048];
    kv_dep_launch(); /* pq_select_fused's blocks may be scheduled now (PDL) */
    float *acc = (float *)(sh + PQ_TUP_MAX);
    const int g = blockIdx.y, nbk = gridDim.x - 1;
    if (blockIdx.x == nbk) {
        const int MC = a.M * a.C, DC = a.D * a.C, GD = a.G * a.D;
        if (DC <= 2 * PQ_TUP_MAX && GD <= 2048) { /* operands staged with every thread's loads in flight at once */
            float *sc = (float *)sh, *sq = sl;
            const float *cg = a.cent + (long long)g * DC, *qg = a.q + (long long)g * GD;
            if ((DC | GD) % 4 == 0) { /* by cp.async: a load-then-store loop had one load in flight a thread */
                for (int e = threadIdx.x; e < DC / 4; e += blockDim.x) kv_cp16(sc + 4 * e, cg + 4 * e);
                for (int e = threadIdx.x; e < GD / 4; e += blockDim.x) kv_cp16(sq + 4 * e, qg + 4 * e);
                kv_cp_commit();
                kv_cp_wait<0>();
            } else {
                for (int e = threadIdx.x; e < DC; e += blockDim.x) sc[e] = __ldg(cg + e);
                for (int e = threadIdx.x; e < GD; e += blockDim.x) sq[e] = __ldg(qg + e);
            }
            __syncthreads();
            for (int e = threadIdx.x; e < a.G * MC; e += blockDim.x) {
                const int hh = e / MC;
                a.lut[(long long)(g * a.G + hh) * MC + e % MC] = pq_lut_entry<false>(sq, sc, hh, 0, a.D, a.M, a.dsub, a.C, e % MC);
            }
        } else
            for (int e = threadIdx.x; e < a.G * MC; e += blockDim.x) {
                const int h = g * a.G + e / MC;
                a.lut[(long long)h * MC + e % MC] = pq_lut_entry(a.q, a.cent, h, g, a.D, a.M, a.dsub, a.C, e % MC);
            }
    } else {
        pq_hist_block<M2>(a.codes + g * a.TM, a.lo, a.hi, a.kpb, a.M, a.C, a.ntup, sh, a.gh + (long long)g * a.ntup);
    }
    if (!kv_arrives_last(&a.ctr[g], gridDim.x)) return;
    pq_table_body(g, a.gh, a.lut, a.G, a.M, a.C, a.ntup, a.hi - a.lo, a.scale, a.kk, a.mz, a.tab, a.thr, sh, acc, sl);
    if (threadIdx.x == 0) a.ctr[g] = 0;
}

template <bool M2>
__global__ void __launch_bounds__(1024) pq_apply(const uint8_t *codes, long long TM, int M, int C, int lo, int hi,
                                                  int ntup, int kpb, const float *tab, float *agg, long long ald) {
    __shared__ float st[PQ_TUP_MAX];
    const int g = blockIdx.y;
    for (int e = threadIdx.x; e < ntup; e += blockDim.x) st[e] = tab[(long long)g * ntup + e];
    __syncthreads();
    const uint8_t *row = codes + g * TM;
    float *o = agg + g * ald - lo;
    const int k0 = lo + blockIdx.x * kpb, k1 = min(hi, k0 + kpb);
#pragma unroll 4
    for (int i = k0 + threadIdx.x; i < k1; i += blockDim.x) o[i] = st[pq_tuple<M2>(row, i, M, C)];
}

/* ---- top-k through the tuples (C^M <= PQ_TUP_MAX): no per-key scores ----
 * With K and take = thr[2g], thr[2g+1] (pq_table), the selection is every
 * key scoring above K and the first `take` keys (by position) scoring K.
 * pq_select_a: per block of kpb keys, appends the keys above K to
 * cand[g][..] (fewer than kk in all; their order is irrelevant, the final
 * sort orders them) and counts its keys equal to K into ecnt[g][block].
 * pq_select_b: a block whose keys equal to K are among the first `take`
 * (prefix of ecnt over the blocks before it) writes them, in position order
 * (one pass: per-thread runs of consecutive keys, a block scan of their
 * counts), after the keys above K. pq_select_sort: the kk candidates ordered as
 * kv_topk_ref (larger score first, smaller position among equals). */
constexpr int PQ_SEL_TH = 1024;
constexpr int PQ_KPB_MAX = 64 * PQ_SEL_TH; /* keys a tuple-path block: a thread's run fits pq_select_fused's masks */
static_assert(PQ_SEL_TH * PQ_TUP_PT >= PQ_TUP_MAX, "pq_select_fused: a thread classes at most PQ_TUP_PT tuples");

__device__ __forceinline__ void pq_key_table(const float *tab, int ntup, unsigned *sk) {
    for (int e = threadIdx.x; e < ntup; e += blockDim.x) sk[e] = kv_f2key(tab[e]);
}

template <bool M2>
__global__ void __launch_bounds__(PQ_SEL_TH) pq_select_a(const uint8_t *codes, long long TM, int M, int C, int lo,
                                                        int hi, int ntup, int kpb, const float *tab,
                                                        const unsigned *thr, unsigned *nab, int32_t *cand, int kmax,
                                                        unsigned *ecnt, int eld) {
    __shared__ unsigned sk[PQ_TUP_MAX];
    __shared__ unsigned red[32];
    const int g = blockIdx.y;
    pq_key_table(tab + (long long)g * ntup, ntup, sk);
    const unsigned K = thr[2 * g];
    __syncthreads();
    const uint8_t *row = codes + g * TM;
    const int k0 = (lo & ~7) + blockIdx.x * kpb, k1 = min(hi, k0 + kpb); /* pq_blocks */
    unsigned e = 0;
#pragma unroll 4
    for (int i = k0 + (int)threadIdx.x; i < k1; i += blockDim.x) {
        if (i < lo) continue;
        unsigned u = sk[pq_tuple<M2>(row, i, M, C)];
        if (u > K) {
            unsigned j = atomicAdd(&nab[g], 1u);
            if (j < (unsigned)kmax) cand[(long long)g * kmax + j] = i;
        }
        e += u == K;
    }
    for (int o = 16; o; o >>= 1) e += __shfl_xor_sync(0xffffffffu, e, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = e;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) e += red[w];
        ecnt[(long long)g * eld + blockIdx.x] = e;
    }
}

template <bool M2>
__global__ void __launch_bounds__(PQ_SEL_TH) pq_select_b(const uint8_t *codes, long long TM, int M, int C, int lo,
                                                        int hi, int ntup, int kpb, const float *tab,
                                                        const unsigned *thr, int kk, const unsigned *ecnt, int eld,
                                                        int32_t *cand, int kmax) {
    __shared__ unsigned sk[PQ_TUP_MAX];
    __shared__ unsigned wc[32];
    const int g = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const unsigned K = thr[2 * g], take = thr[2 * g + 1];
    /* keys equal to K in the blocks before this one */
    unsigned before = 0;
    for (int b = threadIdx.x; b < (int)blockIdx.x; b += blockDim.x) before += ecnt[(long long)g * eld + b];
    for (int o = 16; o; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
    if (lane == 0) wc[w] = before;
    __syncthreads();
    before = 0;
    for (int i = 0; i < nw; i++) before += wc[i];
    const unsigned mine = ecnt[(long long)g * eld + blockIdx.x];
    if (before >= take || mine == 0) return; /* uniform over the block */
    const unsigned r = min(mine, take - before);
    int32_t *out = cand + (long long)g * kmax + (kk - take) + before;
    pq_key_table(tab + (long long)g * ntup, ntup, sk);
    __syncthreads();
    const uint8_t *row = codes + g * TM;
    const int k0 = (lo & ~7) + blockIdx.x * kpb, k1 = min(hi, k0 + kpb); /* pq_blocks */
    /* each thread a run of <= 64 consecutive keys (kpb <= 64 * blockDim.x): a
     * bit mask of those equal to K, then a block scan of the counts in
     * thread order, which is position order */
    const int per = (k1 - k0 + (int)blockDim.x - 1) / (int)blockDim.x;
    const int i0 = k0 + (int)threadIdx.x * per, i1 = min(k1, i0 + per);
    unsigned long long bits = 0;
#pragma unroll 8
    for (int i = max(lo, i0); i < i1; i++)
        bits |= (unsigned long long)(sk[pq_tuple<M2>(row, i, M, C)] == K) << (i - i0);
    const unsigned c = __popcll(bits);
    unsigned inc = c;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    if (lane == 31) wc[w] = inc;
    __syncthreads();
    unsigned pos = inc - c;
    for (int v = 0; v < w; v++) pos += wc[v];
    for (; bits && pos < r; bits &= bits - 1) out[pos++] = i0 + __ffsll((long long)bits) - 1;
}

/* One block per kv head; dynamic shared memory: P >= kk 64-bit sort keys
 * (~score key << 32 | position), ascending (kv_sort_out) = kv_topk_ref's order.
 * Zeroes nab[g] for the next search. */
__global__ void __launch_bounds__(1024) pq_select_sort(const uint8_t *codes, long long TM, int M, int C, int ntup,
                                                        const float *tab, const int32_t *cand, int kmax, int kk,
                                                        int P, unsigned *nab, int32_t *idx) {
    extern __shared__ unsigned long long sv[];
    const int g = blockIdx.x;
    const uint8_t *row = codes + g * TM;
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
        unsigned long long v = ~0ULL;
        if (j < kk) {
            const int i = cand[(long long)g * kmax + j];
            const unsigned u = kv_f2key(tab[(long long)g * ntup + pq_tuple<false>(row, i, M, C)]);
            v = (unsigned long long)~u << 32 | (unsigned)i;
        }
        sv[j] = v;
    }
    __syncthreads();
    kv_sort_out(sv, kk, P, [&](int r, unsigned long long v) { idx[(long long)g * kk + r] = (int32_t)(unsigned)v; });
    if (threadIdx.x == 0) nab[g] = 0;
}

/* The fused selection (one launch, grid (nbk, Hkv), PQ_SEL_TH threads): per
 * block of kpb keys (pq_blocks), each thread's run of per = kpb / blockDim
 * <= 64 consecutive keys is classed (pq_run; M = 2: from the codes staged
 * in shared memory before the PDL wait) into two bit masks, above K and at
 * K; the keys above K are appended to cand[g][..] (one atomic a thread that
 * holds any), and one block scan of the runs' tie counts writes the
 * block's first min(kk, its keys) ties in position order to
 * ties[g][b * kpb ..] and their count to ecnt[g][block]. The last block of
 * the kv head (threadfence reduction) takes the first `take` ties in block
 * order (exclusive prefix of ecnt), sorts the kk candidates by (score desc,
 * position asc) as pq_select_sort does, writes idx[g][..] and zeroes nab[g]
 * for the next search. Dynamic shared memory: M = 2: 2 kpb bytes (the
 * staged codes), then max(8 P, 4 ntup) bytes (the class table, then the sort
 * keys) + 4 (nbk + 1) (the prefix). Exactly the selection of pq_select_a/b +
 * pq_select_sort. */
template <bool M2>
__global__ void __launch_bounds__(PQ_SEL_TH, 2) pq_select_fused(const uint8_t *codes, long long TM, int M, int C, int lo,
                                                            int hi, int ntup, int kpb, const float *tab,
                                                            const unsigned *thr, int kk, int P, int sv_words,
                                                            unsigned *nab, int32_t *cand, int kmax, unsigned *ecnt,
                                                            int eld, int32_t *ties, long long tld, unsigned *ctr,
                                                            int32_t *idx) {
    extern __shared__ __align__(16) unsigned char sraw[];
    uint4 *stg = (uint4 *)sraw; /* M = 2: the block's codes, 16 B a thread's run of 8 keys, interleaved */
    unsigned long long *sv = (unsigned long long *)(sraw + (M2 ? 2 * kpb : 0));
    uint8_t *cls = (uint8_t *)sv; /* per tuple: 2 scores above K, 1 scores K, 0 below */
    unsigned *pre = (unsigned *)(sv + sv_words);
    __shared__ int wsum[32];
    const int g = blockIdx.y, nbk = gridDim.x, tid = threadIdx.x, nt = blockDim.x;
    const uint8_t *row = codes + g * TM;
    const int k0 = (lo & ~7) + blockIdx.x * kpb, k1 = min(hi, k0 + kpb); /* pq_blocks */
    const int per = kpb / nt, a = k0 + tid * per;
    /* the codes do not come from pq_hist_table: copied in while its last blocks run the tables (PDL) */
    if (M2) {
        for (int c = 0; c < per / 8; c++)
            if (a + 8 * c < k1) kv_cp16(stg + c * nt + tid, (const uint4 *)row + ((a >> 3) + c));
        kv_cp_commit();
    }
    kv_dep_wait(); /* pq_hist_table's tables and thresholds (PDL) */
    const unsigned K = thr[2 * g], take = thr[2 * g + 1];
    {
        float v[PQ_TUP_PT]; /* ntup <= PQ_TUP_PT * nt: the loads issued together */
#pragma unroll
        for (int j = 0; j < PQ_TUP_PT; j++) v[j] = tid + j * nt < ntup ? tab[(long long)g * ntup + tid + j * nt] : 0.f;
#pragma unroll
        for (int j = 0; j < PQ_TUP_PT; j++) {
            const unsigned u = kv_f2key(v[j]);
            if (tid + j * nt < ntup) cls[tid + j * nt] = (uint8_t)(u > K ? 2 : u == K);
        }
    }
    if (M2) kv_cp_wait<0>(); /* this thread's copies: it alone reads them */
    __syncthreads();
    /* bit j: key a + j of the thread's run scores above K (abm), or K (eqm). A batch gathers its keys'
     * classes, two bits a key at constant shifts, and only a batch holding one of the few keys at or above
     * K (fewer than kk + the ties at K in all) splits them (a warp vote and a 64-bit shift a key had cost
     * ~40 instructions, two compares ~10) */
    unsigned long long abm = 0, eqm = 0;
    unsigned cb = 0;
    pq_run<M2, 2>(row, k0, k1, lo, per, M, C, [&](int c, int) { return stg[c * nt + tid]; }, [&](int j, int t, bool in) {
        cb |= (in ? (unsigned)cls[t] : 0u) << (2 * j);
    }, [&](int b) {
        if (cb)
            for (int j = 0; j < 16; j++) {
                abm |= (unsigned long long)((cb >> (2 * j + 1)) & 1u) << (b + j);
                eqm |= (unsigned long long)((cb >> (2 * j)) & 1u) << (b + j);
            }
        cb = 0;
    });
    if (abm) { /* fewer than kk keys of the head: their order is the sort's */
        unsigned p = atomicAdd(&nab[g], (unsigned)__popcll(abm));
        for (; abm; abm &= abm - 1, p++)
            if (p < (unsigned)kmax) cand[(long long)g * kmax + p] = a + __ffsll((long long)abm) - 1;
    }
    /* the block's first min(kk, its keys) ties in position order: the threads' runs are in position order */
    int tot;
    const int cap = min(kk, k1 - k0);
    int32_t *tb = ties + g * tld + (long long)blockIdx.x * kpb;
    for (int r = kv_block_scan(__popcll(eqm), &tot, wsum); eqm && r < cap; eqm &= eqm - 1, r++)
        tb[r] = a + __ffsll((long long)eqm) - 1;
    if (tid == 0) ecnt[(long long)g * eld + blockIdx.x] = (unsigned)tot;
    if (!kv_arrives_last(&ctr[g], nbk)) return;
    /* the last block: exclusive prefix of the blocks' tie counts */
    int base = 0;
    for (int b0 = 0; b0 < nbk; b0 += nt) {
        const int b = b0 + tid;
        const int c = b < nbk ? (int)__ldcg(ecnt + (long long)g * eld + b) : 0;
        int tot;
        const int ex = kv_block_scan(c, &tot, wsum) + base;
        if (b < nbk) pre[b] = (unsigned)ex;
        base += tot;
    }
    if (tid == 0) pre[nbk] = (unsigned)base;
    const int na = kk - (int)take;
    const float *tg = tab + (long long)g * ntup;
    for (int j = tid; j < P; j += nt) {
        unsigned long long v = ~0ULL;
        if (j < na) {
            const int i = __ldcg(cand + (long long)g * kmax + j);
            v = (unsigned long long)~kv_f2key(tg[pq_tuple<M2>(row, i, M, C)]) << 32 | (unsigned)i;
        }
        sv[j] = v;
    }
    __syncthreads();
    const int lane = tid & 31;
    for (int b = tid >> 5; b < nbk; b += nt >> 5) { /* a warp per block whose ties are among the first `take` */
        const unsigned ex = pre[b];
        if (ex >= take) continue;
        const int c = (int)min(pre[b + 1] - ex, take - ex);
        const int32_t *src = ties + g * tld + (long long)b * kpb;
        for (int t = lane; t < c; t += 32) /* a tie scores K: its sort key needs no lookup */
            sv[na + ex + t] = (unsigned long long)(unsigned)~K << 32 | (unsigned)__ldcg(src + t);
    }
    __syncthreads();
    kv_sort_out(sv, kk, P, [&](int r, unsigned long long v) { idx[(long long)g * kk + r] = (int32_t)(unsigned)v; });
    if (tid == 0) { nab[g] = 0; ctr[g] = 0; }
}

__global__ void pq_raw(const uint8_t *codes, long long TM, const float *lut, int G, int M, int C, float scale, int lo,
                       int n, float *raw) {
    int h = blockIdx.y, g = h / G;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        raw[(long long)h * n + i] = pq_score(lut + (long long)h * M * C, codes + g * TM + (long long)(lo + i) * M, M, C, scale);
}

}  // namespace

namespace {

kv_status pq_create_go(kv_pq_gpu *p) {
    KV_TRY(kv_cuda_dev_query(&p->dev));
    KV_CUDA_TRY(kv_stream_create(&p->st));
    KV_TRY(kv_blas_load());
    KV_CUBLAS_TRY(cublasCreate(&p->blas));
    KV_CUBLAS_TRY(cublasSetStream(p->blas, p->st));
    KV_CUBLAS_TRY(cublasSetMathMode(p->blas, CUBLAS_PEDANTIC_MATH)); /* no TF32: float32 distances */
    const size_t Hkv = p->Hkv, Hq = p->Hq;
    int KT = PQ_TILE_BYTES / p->M > 0 ? PQ_TILE_BYTES / p->M : 1;
    p->ld = (p->T + KT - 1) / KT + 1;
    KV_CUDA_ALLOC(p->cent, Hkv * p->D * p->C * sizeof(float), 0, "pqcache centroids");
    KV_CUDA_ALLOC(p->codes, Hkv * p->TM + 16, 0, "pqcache codes");
    KV_CUDA_ALLOC(p->q, Hq * p->D * sizeof(float), 0, "pqcache queries");
    KV_CUDA_ALLOC(p->lut, Hq * p->M * p->C * sizeof(float), 0, "pqcache lookup tables");
    KV_CUDA_ALLOC(p->agg, Hkv * p->T * sizeof(float), 0, "pqcache group scores");
    KV_CUDA_ALLOC(p->pm, Hq * p->ld * sizeof(float), 0, "pqcache tile maxima");
    KV_CUDA_ALLOC(p->pz, Hq * p->ld * sizeof(double), 0, "pqcache tile sums");
    KV_CUDA_ALLOC(p->mz, Hq * 2 * sizeof(float), 0, "pqcache softmax constants");
    KV_CUDA_ALLOC(p->ctr, 2 * Hkv * sizeof(unsigned), 0, "pqcache counters");
    KV_CUDA_ALLOC(p->idx, Hkv * KV_GPU_TOPK_MAX * sizeof(int32_t), 0, "pqcache top-k indices");
    KV_CUDA_ALLOC(p->key1, Hkv * p->D * sizeof(float), 0, "pqcache appended key");
    KV_CUDA_ALLOC(p->code1, Hkv * p->M, 0, "pqcache appended codes");
    if (p->ntup) {
        KV_CUDA_ALLOC(p->tab, Hkv * p->ntup * sizeof(float), 0, "pqcache tuple table");
        KV_CUDA_ALLOC(p->bh, Hkv * p->ntup * sizeof(unsigned), 0, "pqcache tuple histogram");
        KV_CUDA_TRY(cudaMemset(p->bh, 0, Hkv * p->ntup * sizeof(unsigned))); /* pq_table zeroes it after use */
        p->eld = (p->T + 4095) / 4096 + 1; /* selection blocks hold >= 4096 keys */
        KV_CUDA_ALLOC(p->thr, Hkv * 2 * sizeof(unsigned), 0, "pqcache top-k thresholds");
        KV_CUDA_ALLOC(p->nab, Hkv * sizeof(unsigned), 0, "pqcache top-k counters");
        KV_CUDA_ALLOC(p->ecnt, Hkv * p->eld * sizeof(unsigned), 0, "pqcache top-k block counts");
        KV_CUDA_ALLOC(p->cand, Hkv * KV_GPU_TOPK_MAX * sizeof(int32_t), 0, "pqcache top-k candidates");
        KV_CUDA_TRY(cudaMemset(p->nab, 0, Hkv * sizeof(unsigned))); /* pq_select_sort zeroes it after use */
        KV_CUDA_TRY(cudaFuncSetAttribute(pq_select_sort, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)(KV_GPU_TOPK_MAX * sizeof(unsigned long long))));
        if (p->fused) { /* each block's first ties, at its keys' offset; the selection's shared memory */
            KV_CUDA_ALLOC(p->ties, Hkv * p->T * sizeof(int32_t), 0, "pqcache top-k ties");
            const size_t words = KV_GPU_TOPK_MAX > (p->ntup + 1) / 2 ? KV_GPU_TOPK_MAX : (p->ntup + 1) / 2;
            size_t sm = 2 * (size_t)PQ_KPB_MAX + words * 8 + (size_t)(p->eld + 1) * 4; /* the most staged codes */
            if (sm > (size_t)p->dev.smem_optin) sm = (size_t)p->dev.smem_optin;
            p->sel_smem = (int)sm;
            KV_CUDA_TRY(cudaFuncSetAttribute(pq_select_fused<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, p->sel_smem));
            KV_CUDA_TRY(cudaFuncSetAttribute(pq_select_fused<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, p->sel_smem));
        }
    }
    KV_CUDA_TRY(cudaMemset(p->cent, 0, Hkv * p->D * p->C * sizeof(float)));
    KV_CUDA_TRY(cudaMemset(p->codes, 0, Hkv * p->TM + 16));
    KV_CUDA_TRY(cudaMemset(p->ctr, 0, 2 * Hkv * sizeof(unsigned)));
    KV_TRY(kv_topk_ws_create(&p->tk, p->Hkv, p->T, &p->dev));
    return KV_OK;
}

int pq_tuple_kpb(const kv_pq_gpu *p, int n) {
    long long want = ((long long)n * p->Hkv + 2LL * p->dev.sm_count - 1) / (2LL * p->dev.sm_count);
    /* a multiple of 8 keys a thread of 1024 (pq_run's 16-B loads), at most 64 (pq_select_fused's tie masks) */
    return (int)(want < 8192 ? 8192 : want > PQ_KPB_MAX ? PQ_KPB_MAX : (want + 8191) / 8192 * 8192);
}

/* Tuple path, scan: histogram of the tuples, then per kv head the tuple
 * table and the top-kk threshold (fused: with the lookup tables, one
 * launch, pq_hist_table; else pq_hist + pq_table after pq_lut); want_agg:
 * also agg per key (tests). */
kv_status pq_tuple_scan(kv_pq_gpu *p, float scale, int lo, int hi, int kk, int want_agg) {
    const int n = hi - lo, M = p->M, C = p->C, kpb = pq_tuple_kpb(p, n), nb = pq_blocks(lo, hi, kpb);
    const bool m2 = M == 2;
    if (p->fused) {
        pq_fused_args a = {p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->G, p->D, p->dsub, kk, scale,
                           p->bh, p->ctr, p->thr, p->q, p->cent, p->lut, p->mz, p->tab};
        if (m2) pq_hist_table<true><<<dim3(nb + 1, p->Hkv), 1024, 0, p->st>>>(a);
        else pq_hist_table<false><<<dim3(nb + 1, p->Hkv), 1024, 0, p->st>>>(a);
        KV_LAUNCH_CHECK();
    } else {
        if (m2)
            pq_hist<true><<<dim3(nb, p->Hkv), 1024, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->bh);
        else
            pq_hist<false><<<dim3(nb, p->Hkv), 1024, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->bh);
        KV_LAUNCH_CHECK();
        pq_table<<<p->Hkv, 1024, 0, p->st>>>(p->bh, p->lut, p->G, M, C, p->ntup, n, scale, kk, p->mz, p->tab, p->thr);
        KV_LAUNCH_CHECK();
    }
    if (!want_agg) return KV_OK;
    const int ab = (n + 16383) / 16384;
    if (m2)
        pq_apply<true><<<dim3(ab, p->Hkv), 1024, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, 16384, p->tab,
                                                             p->agg, p->T);
    else
        pq_apply<false><<<dim3(ab, p->Hkv), 1024, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, 16384, p->tab,
                                                              p->agg, p->T);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* Tuple path, top-k: ordered compaction at the threshold, then the sort
 * (p->idx[g*kk + j]); fused: one launch (pq_select_fused), else three. */
kv_status pq_tuple_topk(kv_pq_gpu *p, int lo, int hi, int kk) {
    const int n = hi - lo, M = p->M, C = p->C, kpb = pq_tuple_kpb(p, n), nb = pq_blocks(lo, hi, kpb);
    const dim3 grid(nb, p->Hkv);
    if (kk > KV_GPU_TOPK_MAX) return kv_fail(KV_ERR_INPUT, "pqcache GPU: k = %d above %d", kk, KV_GPU_TOPK_MAX);
    if (kpb > PQ_KPB_MAX) return kv_fail(KV_ERR_INTERNAL, "pqcache GPU: %d keys per selection block", kpb);
    if (nb > p->eld) return kv_fail(KV_ERR_INTERNAL, "pqcache GPU: %d selection blocks > %d", nb, p->eld);
    int P = 1;
    while (P < kk) P <<= 1;
    if (p->fused) {
        const int sv_words = P > (p->ntup + 1) / 2 ? P : (p->ntup + 1) / 2;
        const size_t sm = (M == 2 ? 2 * (size_t)kpb : 0) + (size_t)sv_words * 8 + (size_t)(nb + 1) * 4;
        if (sm > (size_t)p->sel_smem)
            return kv_fail(KV_ERR_INTERNAL, "pqcache GPU: selection needs %zu bytes of shared memory", sm);
        /* a programmatic dependent launch: its blocks are resident while pq_hist_table's last blocks run the
         * tables and threshold (KVBENCH_PQ_PDL=0: plain) */
        return kv_launch(&p->pdl, "pqcache GPU", M == 2 ? pq_select_fused<true> : pq_select_fused<false>, grid,
                         dim3(PQ_SEL_TH), sm, p->st, (const uint8_t *)p->codes, p->TM, M, C, lo, hi, p->ntup, kpb,
                         (const float *)p->tab, (const unsigned *)p->thr, kk, P, sv_words, p->nab, p->cand,
                         KV_GPU_TOPK_MAX, p->ecnt, p->eld, p->ties, (long long)p->T, p->ctr + p->Hkv, p->idx);
    }
    if (M == 2) {
        pq_select_a<true><<<grid, PQ_SEL_TH, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->tab, p->thr,
                                                         p->nab, p->cand, KV_GPU_TOPK_MAX, p->ecnt, p->eld);
        KV_LAUNCH_CHECK();
        pq_select_b<true><<<grid, PQ_SEL_TH, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->tab, p->thr,
                                                         kk, p->ecnt, p->eld, p->cand, KV_GPU_TOPK_MAX);
    } else {
        pq_select_a<false><<<grid, PQ_SEL_TH, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->tab, p->thr,
                                                          p->nab, p->cand, KV_GPU_TOPK_MAX, p->ecnt, p->eld);
        KV_LAUNCH_CHECK();
        pq_select_b<false><<<grid, PQ_SEL_TH, 0, p->st>>>(p->codes, p->TM, M, C, lo, hi, p->ntup, kpb, p->tab, p->thr,
                                                          kk, p->ecnt, p->eld, p->cand, KV_GPU_TOPK_MAX);
    }
    KV_LAUNCH_CHECK();
    pq_select_sort<<<p->Hkv, P < 1024 ? (P < 32 ? 32 : P) : 1024, (size_t)P * sizeof(unsigned long long), p->st>>>(
        p->codes, p->TM, M, C, p->ntup, p->tab, p->cand, KV_GPU_TOPK_MAX, kk, P, p->nab, p->idx);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* One search on the device: LUT, scan, top-k (which = 0..2), or all (-1).
 * kk = min(k, hi - lo) results per kv head into p->idx [Hkv][kk]. want_agg:
 * the group scores per key reach p->agg (the tuple path skips them else). */
kv_status pq_search_launch(kv_pq_gpu *p, float scale, int lo, int hi, int k, int which, int want_agg) {
    const int n = hi - lo, M = p->M, C = p->C, G = p->G, kk = k < n ? k : n;
    int KT = PQ_TILE_BYTES / M > 0 ? PQ_TILE_BYTES / M : 1;
    const size_t lut_b = (size_t)G * M * C * sizeof(float);
    const int lut_smem = lut_b <= 32 * 1024;
    const size_t sm = (lut_smem ? ((lut_b + 15) & ~(size_t)15) : 0) + (size_t)KT * M + 32;
    pq_scan_args a = {p->codes, p->TM, p->lut, G, M, C, lo, hi, KT, lut_smem, scale, p->pm, p->pz, p->ld, p->ctr,
                      p->mz, p->agg, p->T};
    dim3 grid((n + KT - 1) / KT, p->Hkv);
    if (which == 0 || (which < 0 && !(p->ntup && p->fused))) { /* the fused tuple scan builds the tables itself */
        pq_lut<<<p->Hq, 128, 0, p->st>>>(p->q, p->cent, G, p->D, M, p->dsub, C, p->lut);
        KV_LAUNCH_CHECK();
    }
    if ((which < 0 || which == 1) && p->ntup) {
        KV_TRY(pq_tuple_scan(p, scale, lo, hi, kk, want_agg));
    } else if (which < 0 || which == 1) {
        if (sm > 48 * 1024) {
            KV_CUDA_TRY(cudaFuncSetAttribute(pq_scan_a, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            KV_CUDA_TRY(cudaFuncSetAttribute(pq_scan_b, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        }
        pq_scan_a<<<grid, PQ_TH, sm, p->st>>>(a);
        KV_LAUNCH_CHECK();
        pq_scan_b<<<grid, PQ_TH, sm, p->st>>>(a);
        KV_LAUNCH_CHECK();
    }
    if ((which < 0 || which == 2) && p->ntup)
        KV_TRY(pq_tuple_topk(p, lo, hi, kk));
    else if (which < 0 || which == 2)
        KV_TRY(kv_topk_launch(&p->tk, p->agg, p->T, 0, n, p->Hkv, k, lo, NULL, 1, p->idx, NULL, kk, NULL, p->st));
    return KV_OK;
}

/* The whole search (which = -1) as one CUDA graph, captured for this
 * (lo, hi, k, scale, want_agg) and replayed while they repeat (ops/kv_cuda.h
 * kv_graph_run: the same launches as pq_search_launch, so the same results;
 * at short regions the search is launch-bound). */
kv_status pq_search_graph(kv_pq_gpu *p, float scale, int lo, int hi, int k, int want_agg) {
    struct {
        int v[4];
        float scale;
    } key;
    memset(&key, 0, sizeof key);
    key.v[0] = lo; key.v[1] = hi; key.v[2] = k; key.v[3] = want_agg;
    key.scale = scale;
    return kv_graph_run(&p->graph, &key, (int)sizeof key, p->st, [&](cudaStream_t) -> kv_status {
        return pq_search_launch(p, scale, lo, hi, k, -1, want_agg); /* launches on p->st, the captured stream */
    });
}

}  // namespace

static void kv_pq_gpu_destroy(kv_pq_gpu *p) {
    if (!p) return;
    if (p->st) cudaStreamSynchronize(p->st);
    kv_graph_destroy(&p->graph);
    cudaFree(p->cent); cudaFree(p->codes); cudaFree(p->q); cudaFree(p->lut); cudaFree(p->agg); cudaFree(p->pm);
    cudaFree(p->pz); cudaFree(p->tab); cudaFree(p->bh); cudaFree(p->thr); cudaFree(p->nab); cudaFree(p->ecnt);
    cudaFree(p->cand); cudaFree(p->mz); cudaFree(p->ctr); cudaFree(p->ties); cudaFree(p->idx); cudaFree(p->key1); cudaFree(p->code1);
    kv_topk_ws_destroy(&p->tk);
    if (p->blas) cublasDestroy(p->blas);
    if (p->st) cudaStreamDestroy(p->st);
    free(p);
}

static kv_status kv_pq_gpu_create(int Hq, int Hkv, int T, int D, int M, int C, kv_pq_gpu **out) {
    *out = NULL;
    if (M < 1 || D % M || C < 1 || C > 256 || Hq % Hkv)
        return kv_fail(KV_ERR_INPUT, "pqcache GPU: bad shape (D %d, M %d, C %d)", D, M, C);
    kv_pq_gpu *p = (kv_pq_gpu *)kv_calloc(1, sizeof *p, "pqcache GPU state");
    if (!p) return KV_ERR_NOMEM;
    p->Hq = Hq; p->Hkv = Hkv; p->T = T; p->D = D; p->M = M; p->C = C; p->dsub = D / M; p->G = Hq / Hkv;
    p->TM = ((long long)T * M + 15) & ~15LL;
    long long tup = 1;
    for (int m = 0; m < M && tup <= PQ_TUP_MAX; m++) tup *= C;
    p->ntup = tup <= PQ_TUP_MAX ? (int)tup : 0;
    const char *fe = getenv("KVBENCH_PQ_FUSED"); /* 0: the unfused tuple search (6 launches), for comparison */
    p->fused = !(fe && fe[0] == '0' && !fe[1]);
    p->pdl = kv_env_on("KVBENCH_PQ_PDL");
    kv_status st = pq_create_go(p);
    if (st != KV_OK) { kv_pq_gpu_destroy(p); return st; }
    *out = p;
    return KV_OK;
}

/* Queues one search (kv_gpu_mark: `kvbench run`); its lists come back into idx (the caller's, page-locked in
 * the run) behind it; fetch waits and writes the counts. */
static kv_status kv_pq_gpu_launch_agg(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx,
                                      int ld, int want_agg, kv_gpu_mark *mark) {
    const int n = hi - lo;
    p->last_kk = -1;
    if (n <= 0) return KV_OK;
    const int kk = k < n ? k : n;
    if (kk > KV_GPU_TOPK_MAX)
        return kv_fail(KV_ERR_INPUT, "pqcache GPU: k = %d above the GPU top-k's limit %d", k, KV_GPU_TOPK_MAX);
    if (kk > ld) return kv_fail(KV_ERR_INTERNAL, "pqcache GPU: selection capacity %d < %d", ld, kk);
    KV_CUDA_TRY(cudaMemcpyAsync(p->q, q, (size_t)p->Hq * p->D * sizeof(float), cudaMemcpyHostToDevice, p->st));
    KV_TRY(kv_gpu_mark_start(mark, p->st));
    KV_TRY(pq_search_graph(p, scale, lo, hi, kk > 0 ? kk : 1, want_agg));
    KV_TRY(kv_gpu_mark_end(mark, p->st));
    if (kk > 0)
        KV_CUDA_TRY(cudaMemcpy2DAsync(idx, (size_t)ld * sizeof(int32_t), p->idx, (size_t)kk * sizeof(int32_t),
                                      (size_t)kk * sizeof(int32_t), p->Hkv, cudaMemcpyDeviceToHost, p->st));
    p->last_kk = kk;
    return KV_OK;
}

static kv_status kv_pq_gpu_launch(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx,
                                  int ld, kv_gpu_mark *mark) {
    return kv_pq_gpu_launch_agg(p, q, scale, lo, hi, k, idx, ld, 0, mark);
}

static kv_status kv_pq_gpu_fetch(kv_pq_gpu *p, int *count) {
    if (p->last_kk < 0) return KV_OK;
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    for (int g = 0; g < p->Hkv; g++) count[g] = p->last_kk;
    return KV_OK;
}

static kv_status kv_pq_gpu_search(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx,
                                      int ld, int *count, float *agg, float *raw) {
    const int n = hi - lo;
    KV_TRY(kv_pq_gpu_launch_agg(p, q, scale, lo, hi, k, idx, ld, agg != NULL, NULL));
    if (n <= 0) return KV_OK;
    if (agg)
        KV_CUDA_TRY(cudaMemcpy2DAsync(agg, (size_t)n * sizeof(float), p->agg, (size_t)p->T * sizeof(float),
                                      (size_t)n * sizeof(float), p->Hkv, cudaMemcpyDeviceToHost, p->st));
    if (raw) {
        float *draw = NULL;
        KV_CUDA_ALLOC(draw, (size_t)p->Hq * n * sizeof(float), 0, "pqcache raw scores (test)");
        pq_raw<<<dim3((n + 255) / 256, p->Hq), 256, 0, p->st>>>(p->codes, p->TM, p->lut, p->G, p->M, p->C, scale, lo,
                                                                n, draw);
        kv_status st = cudaGetLastError() == cudaSuccess ? KV_OK : KV_ERR_GPU;
        if (st == KV_OK && cudaMemcpyAsync(raw, draw, (size_t)p->Hq * n * sizeof(float), cudaMemcpyDeviceToHost,
                                           p->st) != cudaSuccess)
            st = KV_ERR_GPU;
        cudaStreamSynchronize(p->st);
        cudaFree(draw);
        if (st != KV_OK) return kv_fail(st, "pqcache GPU: raw scores failed");
    }
    return kv_pq_gpu_fetch(p, count);
}

/* ---- kvbench bench --method pqcache ---- */
namespace {

struct pq_bench_ctx {
    kv_pq_gpu *p;
    pq_build_ws w;
    kv_bench_timer tm, tb;
    cudaStream_t own; /* the state's stream while a timer's is lent to it */
};

kv_status pq_bench_go(pq_bench_ctx *c, const kv_gpu_bench_spec *s, int M, int C, int iters, const int32_t *picks,
                      const kv_gpu_keys *K, const float *q, kv_gpu_stages *out) {
    const int n = s->n;
    KV_TRY(kv_pq_gpu_create(s->Hq, s->Hkv, n, s->D, M, C, &c->p));
    kv_pq_gpu *p = c->p;
    KV_TRY(kv_bench_timer_init(&c->tm, s->reps, s->warmup, s->stream));
    KV_TRY(kv_bench_timer_init(&c->tb, 3, 1, s->stream)); /* k-means: a whole build per repetition */
    KV_CUDA_ALLOC(c->w.x, (size_t)s->Hkv * n * s->D * sizeof(float), 0, "k-means keys");
    KV_TRY(pq_alloc_ws(p, &c->w, n));
    const long long gs = (long long)K->a.T * K->a.D, xs = (long long)n * s->D;
    /* the build: float16 keys widened to float32, then k-means on them; bound to the timer's stream */
    c->own = p->st;
    p->st = c->tb.st;
    KV_CUBLAS_TRY(cublasSetStream(p->blas, p->st));
    auto build = [&]() -> kv_status {
        if (K->a.half)
            pq_to_float<__half><<<dim3(1024, s->Hkv), 256, 0, p->st>>>((const __half *)K->a.p, gs, n, s->D, c->w.x);
        else
            pq_to_float<float><<<dim3(1024, s->Hkv), 256, 0, p->st>>>((const float *)K->a.p, gs, n, s->D, c->w.x);
        KV_LAUNCH_CHECK();
        return pq_kmeans(p, &c->w, xs, 0, n, iters, picks);
    };
    kv_gpu_timing tk;
    KV_TRY(kv_bench_time(&c->tb, build, &tk));
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    p->st = c->tm.st;
    KV_CUBLAS_TRY(cublasSetStream(p->blas, p->st));
    KV_CUDA_TRY(cudaMemcpy(p->q, q, (size_t)s->Hq * s->D * sizeof(float), cudaMemcpyHostToDevice));
    KV_TRY(pq_search_launch(p, s->scale, 0, n, s->k, -1, 0)); /* real tables for the top-k stage */
    kv_gpu_timing t[4];
    for (int w = 0; w < 3; w++)
        KV_TRY(kv_bench_time(&c->tm, [&]() { return pq_search_launch(p, s->scale, 0, n, s->k, w, 0); }, &t[w]));
    KV_TRY(kv_bench_time(&c->tm, [&]() { return pq_search_graph(p, s->scale, 0, n, s->k, 0); }, &t[3]));
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    p->st = c->own;
    c->own = NULL;
    KV_CUBLAS_TRY(cublasSetStream(p->blas, p->st));
    const double N = (double)s->Hkv * n, kk = s->k < n ? s->k : n, cent = (double)s->Hkv * s->D * C * 4,
                 qb = (double)s->Hq * s->D * 4, lut = (double)s->Hq * M * C * 4, idx = s->Hkv * kk * 4,
                 tab = (double)s->Hkv * p->ntup * 4;
    out->n = 5;
    out->stage[0] = kv_gpu_stage{"kmeans", tk, N * s->D * 2 + N * M + cent};
    out->stage[1] = kv_gpu_stage{"lut", t[0], cent + qb + lut};
    if (p->ntup) { /* tuple path: two passes over the codes, no per-key scores */
        out->stage[2] = kv_gpu_stage{"adc_scan", t[1], N * M + lut + tab};
        out->stage[3] = kv_gpu_stage{"topk", t[2], N * M + tab + idx};
        out->stage[4] = kv_gpu_stage{"search", t[3], 2 * N * M + cent + qb + idx};
        snprintf(out->bytes_note, sizeof out->bytes_note,
                 "pqcache M=%d C=%d iters=%d, %d tuples: per key and kv head %d code bytes; kmeans = f16 keys once + "
                 "codes + centroids (a whole build per rep, %d reps: compute-bound, GB/s indicative); lut = "
                 "centroids + q + tables; adc_scan = codes (tuple histogram) + tables (per tuple: group score, "
                 "top-k threshold); topk = codes again (compaction; blocks holding threshold ties re-read theirs, "
                 "uncounted) + indices; search = codes twice + centroids + q + indices (no per-key scores)",
                 M, C, iters, p->ntup, M, c->tb.reps);
    } else {
        out->stage[2] = kv_gpu_stage{"adc_scan", t[1], N * M + lut + N * 4};
        out->stage[3] = kv_gpu_stage{"topk", t[2], N * 4 + idx};
        out->stage[4] = kv_gpu_stage{"search", t[3], N * M + cent + qb + idx};
        snprintf(out->bytes_note, sizeof out->bytes_note,
                 "pqcache M=%d C=%d iters=%d: per key and kv head %d code bytes; kmeans = float16 keys read once + "
                 "codes + centroids (one whole build per repetition, %d reps: compute-bound, GB/s only indicative); "
                 "lut = centroids + q + tables; adc_scan = codes + tables + group scores out (4 B/key); topk = "
                 "scores + indices; search = codes + centroids + q + indices (the group scores need not reach "
                 "memory)",
                 M, C, iters, M, c->tb.reps);
    }
    out->l2_bytes = c->tm.dev.l2_bytes;
    out->flush_bytes = c->tm.flush_n * sizeof(uint4);
    return KV_OK;
}

}  // namespace

static kv_status kv_pq_gpu_bench(const kv_gpu_bench_spec *s, int M, int C, int iters, const int32_t *picks,
                                     const kv_gpu_keys *K, const float *q, kv_gpu_stages *out) {
    memset(out, 0, sizeof *out);
    if (s->n < 1 || s->n > K->a.T || K->a.H != s->Hkv || K->a.D != s->D)
        return kv_fail(KV_ERR_INPUT, "pqcache GPU bench: inconsistent spec (n=%d)", s->n);
    pq_bench_ctx c = {};
    kv_status st = pq_bench_go(&c, s, M, C, iters, picks, K, q, out);
    if (c.p && c.own) { /* an error left a timer's stream in the state: give its own back */
        c.p->st = c.own;
        cublasSetStream(c.p->blas, c.own);
    }
    kv_pq_gpu_destroy(c.p);
    pq_build_ws_free(&c.w);
    kv_bench_timer_free(&c.tm);
    kv_bench_timer_free(&c.tb);
    return st;
}

extern "C" const kv_pqcache_cuda_ops kv_pqcache_cuda = {
    .create = kv_pq_gpu_create,
    .build = pq_gpu_build,
    .encode = pq_gpu_encode,
    .upload = pq_gpu_upload,
    .search = kv_pq_gpu_search,
    .launch = kv_pq_gpu_launch,
    .fetch = kv_pq_gpu_fetch,
    .destroy = kv_pq_gpu_destroy,
    .bench = kv_pq_gpu_bench,
};
