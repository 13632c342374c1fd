/* csattention.cu: CSAttention's CUDA path (issue 9, point 4; the CPU
 * reference and the paper's facts are in retrievers/csattention.c).
 *
 * Lists (build): per (kv head, subspace) and chunk of centroids, the partial
 * scores <c, k^(b)> of every key in [sink, n) (one thread per (centroid,
 * key), kv_dot_ref's order with __fmul_rn/__fadd_rn: bitwise the CPU's),
 * the L-th largest per row by the shared top-k (threshold mode), then one
 * block per row keeps, in position order, every key above the threshold and
 * the first (L - above) keys equal to it (kv_topk_ref's tie rule: the same
 * set as the CPU); the lists are then turned into the CPU's heaps (root =
 * weakest by (score, -index)) level by level from the bottom (Floyd's
 * construction with the nodes of one level in parallel). The heap layout
 * may differ from the CPU's, the set and the root (the unique weakest) do
 * not, so every later try-insert decides as on the CPU.
 * Try-insert (append): one thread per list, the CPU's list_try_insert, and
 * the same change in the list's by-key view (tombstone + append; a block per
 * list compacts a view whose slack is used up) and a record of it that
 * cs_bappend applies to the bit view (csattention_bits.cuh).
 * Search: per row (a query head, or a kv head with pool=mean: the group
 * mean in the CPU's head order) and subspace the nearest centroid (one warp,
 * the CPU loop's first maximum) and the weight; then the reduce-by-key in
 * one of five variants, all the CPU's additions in the CPU's subspace order
 * (bitwise): DEFAULT the bit view (csattention_bits.cuh: a bitmap, the
 * scores and a base a 1024-key chunk per list, 9 B per region key and row
 * at m = 8, alpha = 0.25; a lane adds its 32 keys' scores in registers;
 * candidates above a sampled bound, then one block per row for the top k);
 * KVBENCH_CS_REDUCE=tiled the pipelined tiled shared-memory accumulator
 * over the lists' by-key views (csattention_pipe.cuh, the default before
 * session 11: m x L x 8 B per row = 16 B per region key, through a bulk-copy
 * ring; per-tile candidates above a per-row bound, then cs_merge);
 * KVBENCH_CS_REDUCE=staged the same tiles with the entries
 * staged through registers (csattention_tile.cuh);
 * KVBENCH_CS_REDUCE=dense the dense global accumulator row
 * over the region, -inf = not gathered (missing=zero: one launch per
 * subspace adds w_b * v, first time from 0; missing=min: the union marked,
 * then per subspace a stamp launch and an add launch of w_b * (v or the
 * list's minimum = its heap root); the candidates compacted, the top k by
 * the shared top-k over the row; 3 x 4 B per region key more);
 * KVBENCH_CS_REDUCE=sort a stable radix sort of (key, subspace) pairs and
 * one sum per run into the same dense rows (csattention_sort.cuh). Only the
 * view the chosen variant reads is allocated (the bench allocates both and
 * times every variant: csattention_bench.cuh, which also checks the default
 * against the dense path at each length; KVBENCH_CS_SWEEP=1 adds every
 * tiling of the tiled kernels); the measured H100 numbers behind the default
 * are in its header and in results/gpu-cost-h100.md.
 * k-means (kmeans=gpu): every (kv head, subspace) job at once (blockIdx.y):
 * k-means++ from the host's uniforms (the CPU's kv_rng sequence), double
 * distances in the CPU's order, the running total and the walk by a block
 * reduction/scan (another order than the CPU's running sum: a pick differs
 * only when a uniform lands within rounding of a boundary); Lloyd rounds
 * with the assignment in kv_dot_ref's order (a direct kernel rather than a
 * cuBLAS GEMM: 16-dim subspaces gain little from a GEMM and its rounding
 * would break the equality with the CPU) and the centroid sums as a tree
 * in double (a coordinate may differ from the CPU's in its last bit). */
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include <cub/cub.cuh>

#include "csattention.h"
#include "ops/bench_method.cuh"
#include "ops/block_topk.cuh"
#include "ops/kv_cuda.h"

namespace {

constexpr int CS_CHUNK = 16; /* centroids whose score rows are built at once */
/* The search without KVBENCH_CS_REDUCE: 4 the bit view (csattention_bits.cuh, the default), 0 the pipelined
 * tiles (csattention_pipe.cuh, the default before session 11), 3 the staged tiles (csattention_tile.cuh). */
constexpr int CS_DEFAULT_REDUCE = 4;

__device__ __forceinline__ float cs_tof(__half h) { return __half2float(h); }
__device__ __forceinline__ float cs_tof(float f) { return f; }

template <typename TA, typename TB> __device__ __forceinline__ float cs_dot(const TA *a, const TB *b, int d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= d; i += 8)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = __fadd_rn(acc[j], __fmul_rn(cs_tof(a[i + j]), cs_tof(b[i + j])));
    for (; i < d; i++) acc[i & 7] = __fadd_rn(acc[i & 7], __fmul_rn(cs_tof(a[i]), cs_tof(b[i])));
    return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                     __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7])));
}

__device__ __forceinline__ bool cs_weaker(float sa, int ia, float sb, int ib) {
    return sa < sb || (sa == sb && ia > ib);
}

__device__ void cs_heap_down(int32_t *hi, float *hv, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cs_weaker(hv[l], hi[l], hv[w], hi[w])) w = l;
        if (r < n && cs_weaker(hv[r], hi[r], hv[w], hi[w])) w = r;
        if (w == i) return;
        float tv = hv[i]; hv[i] = hv[w]; hv[w] = tv;
        int32_t ti = hi[i]; hi[i] = hi[w]; hi[w] = ti;
        i = w;
    }
}

#include "csattention_kmeans.cuh"
#include "csattention_sort.cuh"
#include "csattention_tile.cuh"
#include "csattention_pipe.cuh"

/* S[c*ld + i] = <cent_c, K_g[lo + i] sub-vector b> for c < nc, i < n. */
template <typename TK>
__global__ void cs_list_scores(const TK *K, int T, int D, int g, int b, int ds, const float *cent, int nc, int lo, int n,
                               float *S, long long ld) {
    const int c = blockIdx.y;
    if (c >= nc) return;
    const float *cc = cent + (size_t)c * ds;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        S[(size_t)c * ld + i] = cs_dot(cc, K + ((size_t)g * T + lo + i) * D + (size_t)b * ds, ds);
}

/* One block per row: keys above thr[r], then the first (L - above) equal to it, in position order. */
__global__ void cs_list_select(const float *S, long long ld, int n, int lo, const float *thr, int L, int32_t *lidx,
                               float *lval, long long lst) {
    __shared__ int sw[32];
    const int r = blockIdx.x;
    const float t = thr[r], *row = S + (size_t)r * ld;
    int above = 0;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int i = c0 + threadIdx.x, x = i < n && row[i] > t;
        int tot;
        kv_block_scan(x, &tot, sw);
        above += tot;
    }
    const int need = L - above;
    int base = 0, eqs = 0;
    int32_t *oi = lidx + (size_t)r * lst;
    float *ov = lval + (size_t)r * lst;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int i = c0 + threadIdx.x;
        const float v = i < n ? row[i] : -INFINITY;
        const int gt = i < n && v > t, eq = i < n && v == t;
        int te;
        const int er = kv_block_scan(eq, &te, sw);
        const int take = gt || (eq && eqs + er < need);
        int tt;
        const int ex = kv_block_scan(take, &tt, sw);
        if (take) { oi[base + ex] = lo + i; ov[base + ex] = v; }
        base += tt;
        eqs += te;
    }
}

/* Floyd's heap construction, one level: every node of [first, last) of every list sifts down. */
__global__ void cs_heapify_level(int32_t *lidx, float *lval, const int *lcnt, int nlists, int L, int first, int last) {
    const long long span = last - first, total = span * nlists;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        const int li = (int)(t / span), node = first + (int)(t % span), n = lcnt[li];
        if (node < n / 2) cs_heap_down(lidx + (size_t)li * L, lval + (size_t)li * L, n, node);
    }
}

/* Try-insert key t (key [Hkv][D] on the device) into every list, into its by-key view (vidx non-NULL), and
 * record for the bit view (act non-NULL; csattention_bits.cuh's cs_bappend applies it): act[li] = -2 nothing,
 * -1 inserted, e >= 0 inserted in place of key e; nv[li] the score. */
__global__ void cs_try_insert(const float *key, int t, int D, int m, int C, int ds, int L, int nlists, const float *cent,
                              int32_t *lidx, float *lval, int *lcnt, int32_t *vidx, float *vval, int *vcnt,
                              long long VL, int *act, float *nv) {
    const int li = blockIdx.x * blockDim.x + threadIdx.x;
    if (li >= nlists) return;
    const int g = li / (m * C), b = (li / C) % m;
    const float v = cs_dot(cent + (size_t)li * ds, key + (size_t)g * D + (size_t)b * ds, ds);
    int32_t *hi = lidx + (size_t)li * L;
    float *hv = lval + (size_t)li * L;
    int n = lcnt[li];
    if (n < L) {
        hi[n] = t; hv[n] = v;
        int i = n;
        while (i > 0) {
            int p = (i - 1) / 2;
            if (!cs_weaker(hv[i], hi[i], hv[p], hi[p])) break;
            float tv = hv[i]; hv[i] = hv[p]; hv[p] = tv;
            int32_t ti = hi[i]; hi[i] = hi[p]; hi[p] = ti;
            i = p;
        }
        lcnt[li] = n + 1;
        if (vidx) cs_view_update(vidx + (size_t)li * VL, vval + (size_t)li * VL, vcnt + li, -1, t, v);
        if (act) { act[li] = -1; nv[li] = v; }
    } else if (L > 0 && cs_weaker(hv[0], hi[0], v, t)) {
        const int e = hi[0];
        hi[0] = t; hv[0] = v;
        cs_heap_down(hi, hv, L, 0);
        if (vidx) cs_view_update(vidx + (size_t)li * VL, vval + (size_t)li * VL, vcnt + li, e, t, v);
        if (act) { act[li] = e; nv[li] = v; }
    } else if (act)
        act[li] = -2;
}

/* Per row r and subspace b, a block each: jl[r*m + b], the list to gather, and wb[r*m + b], its weight. The
 * (pooled) query sub-vector goes to shared memory, thread i scores centroids i, i + CS_NEAR_TH, ... (cs_dot),
 * then the block's best by (score desc, centroid asc): the CPU loop's first maximum. A block a (row,
 * subspace) puts every centroid load of a search in flight at once: 5.1 us under ncu at 1M tokens, where a
 * warp a pair, four a block, took 7.9 (sessions 15 and 14); nothing overlaps it, the bit view's kernels wait
 * for its lists. So a thread loads its centroid (ds = CS_NEAR_DS) before the query is staged, and the two loads'
 * latencies overlap: the search 27.4 / 29.4 / 72.2 -> 25.9 / 28.2 / 70.9 us at 16K / 128K / 1M (session 36
 * call E, three interleaved rounds, H200). nu0 and thr0 (nullable) are zeroed on the way. */
constexpr int CS_NEAR_TH = 128;
constexpr int CS_NEAR_DS = 16; /* subspace dims whose centroid a thread loads before the query is staged */
__global__ void __launch_bounds__(CS_NEAR_TH) cs_nearest(const float *q, int pool, int weight, int G, int R, int D,
                                                         int m, int C, int ds, const float *cent, int *jl, float *wb,
                                                         int *nu0, unsigned *thr0) {
    __shared__ float qv[128];
    __shared__ float wv[CS_NEAR_TH / 32];
    __shared__ int wi[CS_NEAR_TH / 32];
    const int tid = threadIdx.x, lane = tid & 31, t = blockIdx.x, r = t / m, b = t % m, g = pool ? r : r / G;
    const int gt = blockIdx.x * CS_NEAR_TH + tid;
    kv_dep_launch(); /* the bit view's cs_bsamp, or without the sample cs_bits, may be scheduled (it waits) */
    const size_t cb = ((size_t)g * m + b) * C;
    const bool pre = ds == CS_NEAR_DS && C <= CS_NEAR_TH; /* the thread's centroid loaded beside the query */
    float cv[CS_NEAR_DS];
    if (pre && tid < C)
#pragma unroll
        for (int j = 0; j < CS_NEAR_DS; j += 4) *(float4 *)(cv + j) = *(const float4 *)(cent + (cb + tid) * ds + j);
    if (nu0 && gt < R) nu0[gt] = 0;
    if (thr0 && gt < R * CS_SMAX) thr0[gt] = 0;
    for (int j = tid; j < ds; j += CS_NEAR_TH) {
        if (!pool) { qv[j] = q[(size_t)r * D + b * ds + j]; continue; }
        float a = 0.f;
        for (int h = g * G; h < (g + 1) * G; h++) a = __fadd_rn(a, q[(size_t)h * D + b * ds + j]);
        qv[j] = __fdiv_rn(a, (float)G);
    }
    __syncthreads();
    int best = 0x7fffffff;
    float bv = -INFINITY;
    if (pre && tid < C) {
        bv = cs_dot(qv, cv, CS_NEAR_DS);
        best = tid;
    }
    for (int c = pre ? C : tid; c < C; c += CS_NEAR_TH) {
        const float v = cs_dot(qv, cent + (cb + c) * ds, ds);
        if (v > bv || best == 0x7fffffff) { bv = v; best = c; }
    }
    auto better = [](float ov, int ob, float v, int bi) {
        return ob != 0x7fffffff && (bi == 0x7fffffff || ov > v || (ov == v && ob < bi));
    };
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int ob = __shfl_xor_sync(0xffffffffu, best, o);
        if (better(ov, ob, bv, best)) { bv = ov; best = ob; }
    }
    if (lane == 0) { wv[tid >> 5] = bv; wi[tid >> 5] = best; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < CS_NEAR_TH / 32; w++)
            if (better(wv[w], wi[w], bv, best)) { bv = wv[w]; best = wi[w]; }
        jl[t] = (int)(cb + (best == 0x7fffffff ? 0 : best));
        wb[t] = weight ? __fsqrt_rn(cs_dot(qv, qv, ds)) : 1.f;
    }
}

#include "csattention_bits.cuh"

__global__ void cs_fill(float *S, long long ld, int lo, int hi, int R, float v) {
    const long long n = hi - lo;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n * R; t += (long long)gridDim.x * blockDim.x)
        S[(size_t)(t / n) * ld + lo + t % n] = v;
}

/* missing=zero, subspace b: S[r][i] = (S == -inf ? 0 : S) + w * v for the keys of row r's list b in [lo, hi). */
__global__ void cs_accum_zero(float *S, long long ld, const int *jl, const float *wb, int m, int b, int L,
                              const int32_t *lidx, const float *lval, const int *lcnt, int lo, int hi) {
    const int r = blockIdx.y, li = jl[r * m + b], n = lcnt[li];
    const float w = wb[r * m + b];
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int i = lidx[(size_t)li * L + e];
        if (i < lo || i >= hi) continue;
        float *p = S + (size_t)r * ld + i;
        const float s = *p;
        *p = __fadd_rn(s == -INFINITY ? 0.f : s, __fmul_rn(w, lval[(size_t)li * L + e]));
    }
}

/* missing=min: mark the union (0), or stamp subspace b's keys with their values. */
__global__ void cs_mark(float *S, long long ld, const int *jl, int m, int b, int L, const int32_t *lidx,
                        const float *lval, const int *lcnt, int lo, int hi, int *stamp, float *tmp, int epoch) {
    const int r = blockIdx.y, li = jl[r * m + b], n = lcnt[li];
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int i = lidx[(size_t)li * L + e];
        if (i < lo || i >= hi) continue;
        if (epoch < 0) S[(size_t)r * ld + i] = 0.f;
        else {
            stamp[(size_t)r * ld + i] = epoch;
            tmp[(size_t)r * ld + i] = lval[(size_t)li * L + e];
        }
    }
}

/* Union members of row r (u[r*ld ..], nu[r]): acc += w * (stamped ? v : the list minimum). */
__global__ void cs_accum_min(float *S, long long ld, const int32_t *u, const int *nu, const int *jl, const float *wb,
                             int m, int b, int L, const float *lval, const int *lcnt, const int *stamp,
                             const float *tmp, int epoch) {
    const int r = blockIdx.y, li = jl[r * m + b];
    const float w = wb[r * m + b], mn = lcnt[li] ? lval[(size_t)li * L] : 0.f; /* heap root = the minimum */
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < nu[r]; a += gridDim.x * blockDim.x) {
        const int i = u[(size_t)r * ld + a];
        const size_t o = (size_t)r * ld + i;
        S[o] = __fadd_rn(S[o], __fmul_rn(w, stamp[o] == epoch ? tmp[o] : mn));
    }
}

/* u[r] = the finite entries of S[r][lo, hi) (any order), nu[r] their count. */
__global__ void cs_compact(const float *S, long long ld, int lo, int hi, int32_t *u, int *nu) {
    const int r = blockIdx.y;
    for (int i0 = lo + blockIdx.x * blockDim.x; i0 < hi; i0 += gridDim.x * blockDim.x) {
        const int i = i0 + threadIdx.x;
        const bool take = i < hi && S[(size_t)r * ld + i] != -INFINITY;
        const int p = kv_warp_append(take, nu + r);
        if (take) u[(size_t)r * ld + p] = i;
    }
}

/* Bench stand-ins: centroid c of (g, b) = the normalised sub-vector of key pos_c. */
template <typename TK>
__global__ void cs_cent_from_keys(const TK *K, int T, int D, int m, int C, int ds, int Hkv, int n, float *cent) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= Hkv * m * C) return;
    const int g = t / (m * C), b = (t / C) % m, c = t % C;
    const int pos = (int)(((long long)(2 * c + 1) * n) / (2LL * C));
    const TK *src = K + ((size_t)g * T + pos) * D + (size_t)b * ds;
    double s = 0;
    for (int j = 0; j < ds; j++) s += (double)cs_tof(src[j]) * cs_tof(src[j]);
    const float inv = s > 0 ? (float)(1.0 / sqrt(s)) : 0.f;
    for (int j = 0; j < ds; j++) cent[(size_t)t * ds + j] = cs_tof(src[j]) * inv;
}


}  // namespace

struct kv_cs_gpu {
    kv_cs_gpu_config c;
    int ds, G, nlists, epoch;
    kv_cuda_dev dev;
    cudaStream_t st;
    const kv_dev_kv *K;   /* the bench's keys (build from the host copies otherwise) */
    float *cent, *lval, *q, *key, *S, *tmp, *wb, *LS;
    int32_t *lidx, *u, *oidx;
    int *lcnt, *stamp, *jl, *nu;
    int32_t *h_oidx;
    int *h_nu;
    int last_kk, last_pool, last_u; /* the launched search (cs_launch): its kk (0: none), pool, union wanted, */
    int last_bits, last_hi;         /* the bit view's (the union listed by cs_candidates), region end */
    float *h_q;
    kv_topk_ws tk, tkl;   /* search rows; list rows (CS_CHUNK x n) */
    int32_t *vidx;        /* the lists sorted by key, with tombstones (csattention_tile.cuh) */
    float *vval;
    int *vcnt;
    long long VL;
    float *cv;            /* per-tile candidates [Hq][cld] */
    int32_t *ci, *opos;
    float *mv;      /* cs_merge's segment winners [Hq][CS_MSEG][kcap] (values, mk keys), mctr its row counters */
    int32_t *mk;
    unsigned *mctr;
    long long cld;
    int kcap;             /* k the tiled search's candidate rows hold */
    int reduce;           /* 4 the bit view (default), 0 pipelined tiles, 1 dense global accumulator, 2 radix sort,
                             3 staged tiles (KVBENCH_CS_REDUCE=tiled|dense|sort|staged|bits) */
    int tkeys, tth;        /* the pipelined tiles' keys and threads (KVBENCH_CS_TK, KVBENCH_CS_TH) */
    unsigned *thr;        /* per row, the pipelined tiles' shared bound of the k-th best (KVBENCH_CS_THR=0: unused) */
    int use_thr;
    int nslot; /* the bound's slots a row (KVBENCH_CS_SLOTS) */
    int bulk;  /* the tiles' copies by the bulk copy engine (KVBENCH_CS_BULK=0: cp.async, ring 1024x4 only) */
    int *bnd;             /* the tiles' list ranges from cs_bounds (KVBENCH_CS_BOUNDS=0: searched per tile) */
    /* the bit view (csattention_bits.cuh; allocated for reduce 4, the default, or for the bench) */
    uint32_t *bbits;
    int *bbase, *btl, *blast, *bact;
    float *bval, *bnv;
    long long BW, NCH, BL;
    int *bcnt, *bnu;      /* per row: candidates, gathered keys (accumulating) */
    unsigned *bsmx;       /* [Hq][BW]: cs_bsamp's lane maxima, pooled over a row's blocks (cs_bpool) */
    int *btick;           /* [Hq]: cs_bsamp's blocks of the row done */
    unsigned *bcv;        /* candidates [Hq][bcap]: kv_f2key of their sums */
    int32_t *bck;
    long long bcap;
    int bsample;          /* region chunks a sample block (KVBENCH_CS_SAMPLE; 0: none, every warp bounds itself;
                             -1, unset: CS_BSMAXS chunks at most, none up to CS_BSNONE) */
    int bpdl;             /* the launches after cs_nearest programmatic dependent ones (KVBENCH_CS_PDL=0: plain) */
    int tlast;            /* the last key indexed (appends must come after it) */
    int use_bnd, ring;    /* ring: the copy ring's geometry, CS_RINGS[ring] (KVBENCH_CS_RING) */
    size_t merge_smax;    /* the most dynamic shared memory cs_merge may take */
    unsigned *skey;       /* the sort path's pairs (in, out), allocated at its first use */
    int *spay;
    void *stmp;
    size_t stmp_bytes;
    kv_topk_ws tkc;       /* candidate rows */
};

namespace {

/* The largest shared memory a pipelined kernel of ring geometry `ring` asks for (8192 keys, missing=min). */
kv_status cs_pipe_attr(void (*f)(cs_tile_args), int ring) {
    KV_CUDA_TRY(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cs_pipe_smem(8192, 1, ring)));
    KV_CUDA_TRY(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared));
    return KV_OK;
}

/* The bit-view kernels' shared memory: cs_bsamp's 16 warps need 134 KB; cs_bits's blocks share an SM, and
 * its NS instances (no sample) ask for up to `optin` bytes less CS_BSTAT for their static shared memory, to
 * spread over the SMs (cs_bits_launch; cs_bsel's 97 KB is set beside the calls). */
template <bool MIN, bool W1> kv_status cs_bits_attr(int optin) {
    KV_CUDA_TRY(cudaFuncSetAttribute(cs_bsamp<MIN, W1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)cs_bits_smem(CS_BSW)));
    void (*const ks[4])(cs_bits_args) = {cs_bits<MIN, W1, false, false>, cs_bits<MIN, W1, true, false>,
                                         cs_bits<MIN, W1, false, true>, cs_bits<MIN, W1, true, true>};
    for (int i = 0; i < 4; i++) {
        KV_CUDA_TRY(cudaFuncSetAttribute(ks[i], cudaFuncAttributePreferredSharedMemoryCarveout,
                                         (int)cudaSharedmemCarveoutMaxShared));
        if (i < 2) continue;
        cudaFuncAttributes fa;
        KV_CUDA_TRY(cudaFuncGetAttributes(&fa, ks[i]));
        if (fa.sharedSizeBytes > (size_t)CS_BSTAT)
            return kv_fail(KV_ERR_INTERNAL, "csattention GPU: cs_bits's static shared memory %zu above %d bytes",
                           fa.sharedSizeBytes, CS_BSTAT);
        KV_CUDA_TRY(cudaFuncSetAttribute(ks[i], cudaFuncAttributeMaxDynamicSharedMemorySize, optin - CS_BSTAT));
    }
    return KV_OK;
}

/* all_views: both list views (the bench times every path); else the one the chosen reduce reads. */
kv_status cs_create_go(kv_cs_gpu *g, int all_views) {
    const kv_cs_gpu_config &c = g->c;
    const char *env = getenv("KVBENCH_CS_REDUCE");
    g->reduce = !env || !*env ? CS_DEFAULT_REDUCE : !strcmp(env, "tiled") ? 0 : !strcmp(env, "dense") ? 1
              : !strcmp(env, "sort") ? 2 : !strcmp(env, "staged") ? 3 : !strcmp(env, "bits") ? 4 : -1;
    if (g->reduce < 0)
        return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_REDUCE: expected bits, tiled, dense, sort or staged, found '%s'", env);
    const bool tiles = all_views || g->reduce == 0 || g->reduce == 3, bits = all_views || g->reduce == 4;
    g->tlast = -1;
    g->ds = c.D / c.m;
    g->G = c.Hq / c.Hkv;
    g->nlists = c.Hkv * c.m * c.C;
    if (g->ds > 128) return kv_fail(KV_ERR_INPUT, "csattention GPU: subspace of %d dims (at most 128)", g->ds);
    if (c.k_max > 0 && c.k_max > KV_GPU_TOPK_MAX)
        return kv_fail(KV_ERR_INPUT, "csattention GPU: k=%d above the GPU top-k's %d", c.k_max, KV_GPU_TOPK_MAX);
    KV_TRY(kv_cuda_dev_query(&g->dev));
    KV_CUDA_TRY(kv_stream_create(&g->st));
    const size_t NL = (size_t)g->nlists, L = c.L, T = c.T, Hq = c.Hq, D = c.D;
    KV_CUDA_ALLOC(g->cent, NL * g->ds * sizeof(float), 0, "csattention centroids");
    KV_CUDA_ALLOC(g->lidx, NL * L * sizeof(int32_t), 0, "csattention list indices");
    KV_CUDA_ALLOC(g->lval, NL * L * sizeof(float), 0, "csattention list scores");
    KV_CUDA_ALLOC(g->lcnt, NL * sizeof(int), 0, "csattention list counts");
    KV_CUDA_TRY(cudaMemset(g->lcnt, 0, NL * sizeof(int)));
    KV_CUDA_ALLOC(g->q, Hq * D * sizeof(float), 0, "csattention query");
    KV_CUDA_ALLOC(g->key, (size_t)c.Hkv * D * sizeof(float), 0, "csattention appended key");
    KV_CUDA_ALLOC(g->S, Hq * T * sizeof(float), 0, "csattention sums");
    KV_CUDA_ALLOC(g->tmp, Hq * T * sizeof(float), 0, "csattention stamped scores");
    KV_CUDA_ALLOC(g->stamp, Hq * T * sizeof(int), 0, "csattention stamps");
    KV_CUDA_TRY(cudaMemset(g->stamp, 0, Hq * T * sizeof(int)));
    KV_CUDA_ALLOC(g->u, Hq * T * sizeof(int32_t), 0, "csattention union");
    KV_CUDA_ALLOC(g->nu, Hq * sizeof(int), 0, "csattention union sizes");
    KV_CUDA_ALLOC(g->jl, Hq * c.m * sizeof(int), 0, "csattention gathered lists");
    KV_CUDA_ALLOC(g->wb, Hq * c.m * sizeof(float), 0, "csattention weights");
    KV_CUDA_ALLOC(g->oidx, Hq * KV_GPU_TOPK_MAX * sizeof(int32_t), 0, "csattention top-k");
    KV_CUDA_ALLOC(g->LS, (size_t)CS_CHUNK * T * sizeof(float), 0, "csattention list score rows");
    KV_CUDA_ALLOC(g->h_oidx, Hq * KV_GPU_TOPK_MAX * sizeof(int32_t), 1, "csattention top-k (host)");
    KV_CUDA_ALLOC(g->h_nu, Hq * sizeof(int), 1, "csattention union sizes (host)");
    KV_CUDA_ALLOC(g->h_q, Hq * D * sizeof(float), 1, "csattention query (host)");
    KV_TRY(kv_topk_ws_create(&g->tk, c.Hq, c.T, &g->dev));
    KV_TRY(kv_topk_ws_create(&g->tkl, CS_CHUNK, c.T, &g->dev));
    g->VL = cs_view_ld(c.L);
    if (tiles) {
        KV_CUDA_ALLOC(g->vidx, NL * g->VL * sizeof(int32_t), 0, "csattention lists by key");
        KV_CUDA_ALLOC(g->vval, NL * g->VL * sizeof(float), 0, "csattention list scores by key");
        KV_CUDA_ALLOC(g->vcnt, NL * sizeof(int), 0, "csattention list-by-key counts");
        KV_CUDA_TRY(cudaMemset(g->vcnt, 0, NL * sizeof(int)));
    }
    const char *etk = getenv("KVBENCH_CS_TK"), *eth = getenv("KVBENCH_CS_TH");
    g->tkeys = etk ? atoi(etk) : 4096;
    g->tth = eth ? atoi(eth) : 512;
    if (g->tkeys != 2048 && g->tkeys != 4096 && g->tkeys != 8192)
        return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_TK: expected 2048, 4096 or 8192, found '%s'", etk);
    if (g->tth != 256 && g->tth != 512)
        return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_TH: expected 256 or 512, found '%s'", eth);
    const char *ering = getenv("KVBENCH_CS_RING");
    g->use_thr = kv_env_on("KVBENCH_CS_THR");
    g->use_bnd = kv_env_on("KVBENCH_CS_BOUNDS");
    g->bulk = kv_env_on("KVBENCH_CS_BULK");
    /* default ring 2048x3 (1024x4 where only that one exists: 256 threads, or the cp.async form) */
    g->ring = !ering ? (g->tth == 512 && g->bulk ? 1 : 0)
              : !strcmp(ering, "1024x4") ? 0 : !strcmp(ering, "2048x3") ? 1 : !strcmp(ering, "512x6") ? 2 : -1;
    if (g->ring < 0) return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_RING: expected 1024x4, 2048x3 or 512x6, found '%s'", ering);
    if (g->ring && g->tth != 512) return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_RING=%s needs KVBENCH_CS_TH=512", ering);
    if (!g->bulk && (g->ring || g->tth != 512))
        return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_BULK=0: expected ring 1024x4 and 512 threads");
    const char *eslot = getenv("KVBENCH_CS_SLOTS");
    g->nslot = eslot ? atoi(eslot) : CS_NSLOT;
    if (g->nslot < 1 || g->nslot > CS_SMAX)
        return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_SLOTS: expected 1 to %d, found '%s'", CS_SMAX, eslot);
    KV_CUDA_ALLOC(g->thr, Hq * CS_SMAX * sizeof(unsigned), 0, "csattention row bound slots");
    KV_CUDA_TRY(cudaMemset(g->thr, 0, Hq * CS_SMAX * sizeof(unsigned)));
    g->kcap = c.k_max > 0 && c.k_max <= CS_KCAP ? c.k_max : 1024;
    if (bits) {
        g->NCH = ((long long)T + 1023) / 1024;
        g->BW = g->NCH * 32;
        g->BL = cs_bview_ld(c.L);
        g->bcap = g->NCH * (g->kcap + CS_BTKS); /* at most k + CS_BTKS from each chunk's warp */
        const char *esam = getenv("KVBENCH_CS_SAMPLE");
        char *eend = NULL;
        const long bs = esam ? strtol(esam, &eend, 10) : -1;
        g->bsample = (int)bs;
        if (esam && (eend == esam || *eend || bs < 0 || (bs > 0 && (bs < 16 || bs > 65536))))
            return kv_fail(KV_ERR_INPUT, "KVBENCH_CS_SAMPLE: expected 0 (no sample) or 16 to 65536 region chunks a "
                                         "sample block, found '%s'", esam);
        g->bpdl = kv_env_on("KVBENCH_CS_PDL");
        KV_CUDA_ALLOC(g->bbits, NL * g->BW * sizeof(uint32_t), 0, "csattention list bitmaps");
        KV_CUDA_ALLOC(g->bbase, NL * g->NCH * sizeof(int), 0, "csattention list chunk bases");
        KV_CUDA_ALLOC(g->bval, (NL * g->BL + 4) * sizeof(float), 0, "csattention list scores (bit view)");
        KV_CUDA_ALLOC(g->btl, NL * sizeof(int), 0, "csattention bit-view tails");
        KV_CUDA_ALLOC(g->blast, NL * sizeof(int), 0, "csattention bit-view last chunks");
        KV_CUDA_ALLOC(g->bact, NL * sizeof(int), 0, "csattention try-insert records");
        KV_CUDA_ALLOC(g->bnv, NL * sizeof(float), 0, "csattention try-insert scores");
        KV_CUDA_ALLOC(g->bcnt, Hq * sizeof(int), 0, "csattention candidate counts");
        KV_CUDA_ALLOC(g->bnu, Hq * sizeof(int), 0, "csattention union counts");
        KV_CUDA_ALLOC(g->bsmx, Hq * g->BW * sizeof(unsigned), 0, "csattention sample maxima");
        KV_CUDA_ALLOC(g->btick, Hq * sizeof(int), 0, "csattention sample tickets");
        KV_CUDA_ALLOC(g->bcv, Hq * g->bcap * sizeof(unsigned), 0, "csattention candidates");
        KV_CUDA_ALLOC(g->bck, Hq * g->bcap * sizeof(int32_t), 0, "csattention candidate keys");
        KV_CUDA_TRY(cudaMemset(g->bbits, 0, NL * g->BW * sizeof(uint32_t)));
        KV_CUDA_TRY(cudaMemset(g->bbase, 0, NL * g->NCH * sizeof(int)));
        KV_CUDA_TRY(cudaMemset(g->btl, 0, NL * sizeof(int)));
        KV_CUDA_TRY(cudaMemset(g->blast, 0xff, NL * sizeof(int))); /* -1: no chunk yet */
        KV_CUDA_TRY(cudaMemset(g->bcnt, 0, Hq * sizeof(int)));
        KV_CUDA_TRY(cudaMemset(g->bnu, 0, Hq * sizeof(int)));
        KV_CUDA_TRY(cudaMemset(g->btick, 0, Hq * sizeof(int)));
        KV_TRY((cs_bits_attr<false, false>(g->dev.smem_optin)));
        KV_TRY((cs_bits_attr<false, true>(g->dev.smem_optin)));
        KV_TRY((cs_bits_attr<true, false>(g->dev.smem_optin)));
        KV_TRY((cs_bits_attr<true, true>(g->dev.smem_optin)));
        KV_CUDA_TRY(cudaFuncSetAttribute(cs_bsel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)(CS_BSELC * sizeof(unsigned long long))));
    }
    const long long nt = (c.T + 2047) / 2048; /* the smallest tile */
    g->cld = nt * g->kcap;
    KV_CUDA_ALLOC(g->cv, Hq * g->cld * sizeof(float), 0, "csattention tile candidates");
    KV_CUDA_ALLOC(g->ci, Hq * g->cld * sizeof(int32_t), 0, "csattention tile candidate keys");
    KV_CUDA_ALLOC(g->opos, Hq * (size_t)g->kcap * sizeof(int32_t), 0, "csattention candidate top-k");
    KV_CUDA_ALLOC(g->mv, Hq * (size_t)CS_MSEG * g->kcap * sizeof(float), 0, "csattention merge segments");
    KV_CUDA_ALLOC(g->mk, Hq * (size_t)CS_MSEG * g->kcap * sizeof(int32_t), 0, "csattention merge segments");
    KV_CUDA_ALLOC(g->mctr, Hq * sizeof(unsigned), 0, "csattention merge counters");
    KV_CUDA_TRY(cudaMemset(g->mctr, 0, Hq * sizeof(unsigned)));
    KV_CUDA_ALLOC(g->bnd, Hq * (size_t)c.m * (nt + 1) * sizeof(int), 0, "csattention tile ranges");
    KV_TRY(kv_topk_ws_create(&g->tkc, c.Hq, (int)g->cld, &g->dev));
    KV_CUDA_TRY(cudaFuncSetAttribute(cs_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cs_tile_smem(1)));
    KV_CUDA_TRY(cudaFuncSetAttribute(cs_tile, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     (int)cudaSharedmemCarveoutMaxShared)); /* 3 blocks of ~66 KB per SM */
    KV_TRY(cs_pipe_attr(cs_pipe<512, 1024, 4, false>, 0));
    KV_TRY(cs_pipe_attr(cs_pipe<256, 1024, 4, true>, 0));
    KV_TRY(cs_pipe_attr(cs_pipe<512, 1024, 4, true>, 0));
    KV_TRY(cs_pipe_attr(cs_pipe<512, 2048, 3, true>, 1));
    KV_TRY(cs_pipe_attr(cs_pipe<512, 512, 6, true>, 2));
    cudaFuncAttributes fa;
    KV_CUDA_TRY(cudaFuncGetAttributes(&fa, cs_merge)); /* static + dynamic shared memory <= the opt-in limit */
    g->merge_smax = (size_t)g->dev.smem_optin - fa.sharedSizeBytes;
    KV_CUDA_TRY(cudaFuncSetAttribute(cs_merge, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g->merge_smax));
    return KV_OK;
}

void cs_destroy(void *p) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    if (!g) return;
    if (g->st) cudaStreamSynchronize(g->st);
    cudaFree(g->cent); cudaFree(g->lidx); cudaFree(g->lval); cudaFree(g->lcnt); cudaFree(g->q); cudaFree(g->key);
    cudaFree(g->S); cudaFree(g->tmp); cudaFree(g->stamp); cudaFree(g->u); cudaFree(g->nu); cudaFree(g->jl);
    cudaFree(g->wb); cudaFree(g->oidx); cudaFree(g->LS); cudaFree(g->vidx); cudaFree(g->vval); cudaFree(g->vcnt);
    cudaFree(g->cv); cudaFree(g->ci); cudaFree(g->thr); cudaFree(g->bnd); cudaFree(g->opos); cudaFree(g->mv); cudaFree(g->mk); cudaFree(g->mctr); cudaFree(g->skey); cudaFree(g->spay); cudaFree(g->stmp);
    cudaFree(g->bbits); cudaFree(g->bbase); cudaFree(g->bval); cudaFree(g->btl); cudaFree(g->blast); cudaFree(g->bact);
    cudaFree(g->bnv); cudaFree(g->bcnt); cudaFree(g->bnu); cudaFree(g->bcv); cudaFree(g->bck);
    cudaFree(g->bsmx); cudaFree(g->btick);
    kv_topk_ws_destroy(&g->tkc);
    cudaFreeHost(g->h_oidx); cudaFreeHost(g->h_nu); cudaFreeHost(g->h_q);
    kv_topk_ws_destroy(&g->tk);
    kv_topk_ws_destroy(&g->tkl);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

kv_status cs_alloc(const kv_cs_gpu_config *cfg, int all_views, kv_cs_gpu **out) {
    kv_cs_gpu *g = (kv_cs_gpu *)calloc(1, sizeof *g);
    if (!g) return kv_fail(KV_ERR_NOMEM, "csattention GPU state");
    g->c = *cfg;
    kv_status s = cs_create_go(g, all_views);
    if (s != KV_OK) { cs_destroy(g); return s; }
    *out = g;
    return KV_OK;
}

kv_status cs_create(const kv_cs_gpu_config *cfg, void **out) {
    kv_cs_gpu *g = NULL;
    KV_TRY(cs_alloc(cfg, 0, &g));
    *out = g;
    return KV_OK;
}

kv_status cs_kmeans_go(kv_cs_gpu *g, const float *pts, const int *npts, int maxn, int iters, const double *draws,
                       float *cent, int *fallback, float *dpts, int *dn, double *ddraw, double *dist, int *pick,
                       int *dfb, int *asg) {
    const kv_cs_gpu_config &c = g->c;
    const int jobs = c.Hkv * c.m, C = c.C, ds = g->ds;
    KV_CUDA_TRY(cudaMemcpyAsync(dpts, pts, (size_t)jobs * maxn * ds * sizeof(float), cudaMemcpyHostToDevice, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(dn, npts, jobs * sizeof(int), cudaMemcpyHostToDevice, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(ddraw, draws, (size_t)jobs * C * sizeof(double), cudaMemcpyHostToDevice, g->st));
    KV_CUDA_TRY(cudaMemsetAsync(dfb, 0, jobs * sizeof(int), g->st));
    KV_CUDA_TRY(cudaMemsetAsync(g->cent, 0, (size_t)jobs * C * ds * sizeof(float), g->st));
    const int bx = (maxn + 255) / 256 < 256 ? (maxn + 255) / 256 : 256;
    km_first<<<(jobs + 127) / 128, 128, 0, g->st>>>(ddraw, C, dn, jobs, pick);
    KV_LAUNCH_CHECK();
    for (int k = 0; k < C; k++) { /* k-means++ */
        km_set<<<jobs, 32, 0, g->st>>>(dpts, maxn, ds, C, k, pick, g->cent);
        KV_LAUNCH_CHECK();
        if (k == C - 1) break;
        km_dist<<<dim3(bx, jobs), 256, 0, g->st>>>(dpts, maxn, dn, ds, C, k, g->cent, dist);
        KV_LAUNCH_CHECK();
        km_pick<<<jobs, 1024, 0, g->st>>>(dist, maxn, dn, ddraw, C, k, pick, dfb);
        KV_LAUNCH_CHECK();
    }
    for (int it = 0; it < iters; it++) { /* Lloyd */
        km_assign<<<dim3(bx, jobs), 256, 0, g->st>>>(dpts, maxn, dn, ds, C, g->cent, asg);
        KV_LAUNCH_CHECK();
        km_update<<<dim3(C, jobs), 256, 0, g->st>>>(dpts, maxn, dn, ds, C, asg, g->cent);
        KV_LAUNCH_CHECK();
    }
    KV_CUDA_TRY(cudaMemcpyAsync(cent, g->cent, (size_t)jobs * C * ds * sizeof(float), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(fallback, dfb, jobs * sizeof(int), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

kv_status cs_kmeans(void *p, const float *pts, const int *npts, int maxn, int iters, const double *draws, float *cent,
                    int *fallback) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    const int jobs = g->c.Hkv * g->c.m;
    if (g->ds > 128) return kv_fail(KV_ERR_INPUT, "csattention GPU k-means: %d dims per subspace (at most 128)", g->ds);
    float *dpts = NULL;
    int *dn = NULL, *pick = NULL, *dfb = NULL, *asg = NULL;
    double *ddraw = NULL, *dist = NULL;
    kv_status st = kv_cuda_alloc((void **)&dpts, (size_t)jobs * maxn * g->ds * sizeof(float), 0, "k-means points",
                                 __FILE__, __LINE__);
    if (st == KV_OK) st = kv_cuda_alloc((void **)&dn, jobs * sizeof(int), 0, "k-means counts", __FILE__, __LINE__);
    if (st == KV_OK) st = kv_cuda_alloc((void **)&pick, jobs * sizeof(int), 0, "k-means picks", __FILE__, __LINE__);
    if (st == KV_OK) st = kv_cuda_alloc((void **)&dfb, jobs * sizeof(int), 0, "k-means fallbacks", __FILE__, __LINE__);
    if (st == KV_OK)
        st = kv_cuda_alloc((void **)&asg, (size_t)jobs * maxn * sizeof(int), 0, "k-means assignment", __FILE__, __LINE__);
    if (st == KV_OK)
        st = kv_cuda_alloc((void **)&ddraw, (size_t)jobs * g->c.C * sizeof(double), 0, "k-means uniforms", __FILE__,
                           __LINE__);
    if (st == KV_OK)
        st = kv_cuda_alloc((void **)&dist, (size_t)jobs * maxn * sizeof(double), 0, "k-means distances", __FILE__,
                           __LINE__);
    if (st == KV_OK) st = cs_kmeans_go(g, pts, npts, maxn, iters, draws, cent, fallback, dpts, dn, ddraw, dist, pick,
                                       dfb, asg);
    cudaStreamSynchronize(g->st);
    cudaFree(dpts); cudaFree(dn); cudaFree(pick); cudaFree(dfb); cudaFree(asg); cudaFree(ddraw); cudaFree(dist);
    return st;
}

/* Lists of every centroid over [sink, n) of the keys K (device), centroids already on the device. */
kv_status cs_build_lists(kv_cs_gpu *g, const kv_dev_kv *K, int n) {
    const kv_cs_gpu_config &c = g->c;
    const int lo = c.sink, nk = n - lo, m = c.m, C = c.C, ds = g->ds;
    if (nk <= 0) return KV_OK;
    const int L = nk < c.L ? nk : c.L;
    float *thr;
    KV_CUDA_ALLOC(thr, CS_CHUNK * sizeof(float), 0, "csattention list thresholds");
    kv_status st = KV_OK;
    const int bx = (nk + 255) / 256 < 2048 ? (nk + 255) / 256 : 2048;
    for (int gh = 0; gh < c.Hkv && st == KV_OK; gh++)
        for (int b = 0; b < m && st == KV_OK; b++)
            for (int c0 = 0; c0 < C && st == KV_OK; c0 += CS_CHUNK) {
                const int nc = C - c0 < CS_CHUNK ? C - c0 : CS_CHUNK;
                const size_t l0 = ((size_t)gh * m + b) * C + c0;
                const float *cent = g->cent + l0 * ds;
                if (K->half)
                    cs_list_scores<__half><<<dim3(bx, nc), 256, 0, g->st>>>((const __half *)K->p, K->T, c.D, gh, b, ds,
                                                                            cent, nc, lo, nk, g->LS, c.T);
                else
                    cs_list_scores<float><<<dim3(bx, nc), 256, 0, g->st>>>((const float *)K->p, K->T, c.D, gh, b, ds,
                                                                           cent, nc, lo, nk, g->LS, c.T);
                cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) { st = kv_cuda_error(e, "cs_list_scores", __FILE__, __LINE__); break; }
                st = kv_topk_launch(&g->tkl, g->LS, c.T, 0, nk, nc, L, 0, NULL, 0, NULL, NULL, 0, thr, g->st);
                if (st != KV_OK) break;
                cs_list_select<<<nc, 1024, 0, g->st>>>(g->LS, c.T, nk, lo, thr, L, g->lidx + l0 * c.L,
                                                        g->lval + l0 * c.L, c.L);
                e = cudaGetLastError();
                if (e != cudaSuccess) st = kv_cuda_error(e, "cs_list_select", __FILE__, __LINE__);
            }
    if (st == KV_OK) {
        int *h = (int *)malloc((size_t)g->nlists * sizeof(int));
        if (!h) st = kv_fail(KV_ERR_NOMEM, "csattention list counts");
        else {
            for (int a = 0; a < g->nlists; a++) h[a] = L;
            cudaError_t e = cudaMemcpyAsync(g->lcnt, h, (size_t)g->nlists * sizeof(int), cudaMemcpyHostToDevice, g->st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
            free(h);
            if (e != cudaSuccess) st = kv_cuda_error(e, "list counts", __FILE__, __LINE__);
        }
    }
    /* the bit view, from the same position-ordered lists */
    if (st == KV_OK && g->bbits) {
        cudaError_t e = cudaMemsetAsync(g->bbits, 0, (size_t)g->nlists * g->BW * sizeof(uint32_t), g->st);
        if (e == cudaSuccess) {
            cs_bbuild<<<g->nlists, 256, 0, g->st>>>(g->lidx, g->lval, c.L, L, g->bbits, g->bbase, g->bval, g->BW, g->NCH,
                                                    g->BL, g->btl, g->blast);
            e = cudaGetLastError();
        }
        if (e != cudaSuccess) st = kv_cuda_error(e, "csattention bit view", __FILE__, __LINE__);
        g->tlast = n - 1;
    }
    /* the by-key view: the selection wrote every list in position order */
    if (st == KV_OK && g->vidx) {
        cudaError_t e = cudaMemcpy2DAsync(g->vidx, g->VL * sizeof(int32_t), g->lidx, (size_t)c.L * sizeof(int32_t),
                                          (size_t)L * sizeof(int32_t), g->nlists, cudaMemcpyDeviceToDevice, g->st);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync(g->vval, g->VL * sizeof(float), g->lval, (size_t)c.L * sizeof(float),
                                  (size_t)L * sizeof(float), g->nlists, cudaMemcpyDeviceToDevice, g->st);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(g->vcnt, g->lcnt, (size_t)g->nlists * sizeof(int), cudaMemcpyDeviceToDevice, g->st);
        if (e != cudaSuccess) st = kv_cuda_error(e, "csattention list view", __FILE__, __LINE__);
    }
    /* heaps: levels from the deepest internal one up */
    int depth = 0;
    while ((2 << depth) - 1 < L / 2) depth++;
    for (int d = depth; d >= 0 && st == KV_OK; d--) {
        const int first = (1 << d) - 1, last = (2 << d) - 1 < L / 2 ? (2 << d) - 1 : L / 2;
        if (first >= last) continue;
        const long long total = (long long)(last - first) * g->nlists;
        const int blocks = (int)((total + 255) / 256 < 65535 ? (total + 255) / 256 : 65535);
        cs_heapify_level<<<blocks, 256, 0, g->st>>>(g->lidx, g->lval, g->lcnt, g->nlists, c.L, first, last);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = kv_cuda_error(e, "cs_heapify_level", __FILE__, __LINE__);
    }
    cudaStreamSynchronize(g->st);
    cudaFree(thr);
    return st;
}

kv_status cs_build(void *p, const float *k, int n, const float *cent) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    const kv_cs_gpu_config &c = g->c;
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    KV_CUDA_TRY(cudaMemcpy(g->cent, cent, (size_t)g->nlists * g->ds * sizeof(float), cudaMemcpyHostToDevice));
    kv_gpu_keys *K = NULL;
    KV_TRY(kv_gpu_keys_create(c.Hkv, n > 0 ? n : 1, c.D, 0, &K));
    kv_status st = n > 0 ? kv_gpu_keys_write(K, 0, n, k) : KV_OK;
    if (st == KV_OK) st = cs_build_lists(g, &K->a, n);
    kv_gpu_keys_destroy(K);
    return st;
}

kv_status cs_read_index(void *p, float *cent, int32_t *lidx, float *lval, int *lcnt) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    const size_t NL = (size_t)g->nlists, L = g->c.L;
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    if (cent) KV_CUDA_TRY(cudaMemcpy(cent, g->cent, NL * g->ds * sizeof(float), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy(lidx, g->lidx, NL * L * sizeof(int32_t), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy(lval, g->lval, NL * L * sizeof(float), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy(lcnt, g->lcnt, NL * sizeof(int), cudaMemcpyDeviceToHost));
    return KV_OK;
}

kv_status cs_append(void *p, int t, const float *key) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    const kv_cs_gpu_config &c = g->c;
    KV_CUDA_TRY(cudaMemcpyAsync(g->key, key, (size_t)c.Hkv * c.D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    if (g->bbits && t <= g->tlast)
        return kv_fail(KV_ERR_INTERNAL, "csattention GPU: key %d appended after key %d (keys must arrive in order)", t,
                       g->tlast);
    cs_try_insert<<<(g->nlists + 127) / 128, 128, 0, g->st>>>(g->key, t, c.D, c.m, c.C, g->ds, c.L, g->nlists, g->cent,
                                                              g->lidx, g->lval, g->lcnt, g->vidx, g->vval, g->vcnt,
                                                              g->VL, g->bact, g->bnv);
    KV_LAUNCH_CHECK();
    if (g->vidx) {
        cs_vcompact<<<g->nlists, 256, 0, g->st>>>(g->vidx, g->vval, g->vcnt, g->VL);
        KV_LAUNCH_CHECK();
    }
    if (g->bbits) {
        cs_bappend<<<(g->nlists + 3) / 4, 128, 0, g->st>>>(g->bact, g->bnv, t, g->nlists, g->bbits, g->bbase, g->bval,
                                                          g->BW, g->NCH, g->BL, g->btl, g->blast);
        KV_LAUNCH_CHECK();
        g->tlast = t;
    }
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

#include "csattention_search.cuh"

/* The tiled path serves this search (else the dense one). */
bool cs_tiled(const kv_cs_gpu *g, int k) { return (g->reduce == 0 || g->reduce == 3) && k <= g->kcap && g->c.m <= CS_MMAX; }
/* The bit-view path serves this search. */
bool cs_bits_ok(const kv_cs_gpu *g, int k) { return g->reduce == 4 && k <= g->kcap && g->c.m <= CS_MMAX; }

kv_status cs_launch(void *p, const float *q, int pool, int missing, int weight, int hi, int k, int want_cand,
                    kv_gpu_mark *mark) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    const kv_cs_gpu_config &c = g->c;
    const int R = pool ? c.Hkv : c.Hq, lo = c.sink, n = hi - lo;
    g->last_kk = 0;
    if (n <= 0 || k <= 0) return KV_OK;
    if (k > KV_GPU_TOPK_MAX) return kv_fail(KV_ERR_INPUT, "csattention GPU: k=%d above %d", k, KV_GPU_TOPK_MAX);
    memcpy(g->h_q, q, (size_t)c.Hq * c.D * sizeof(float));
    KV_CUDA_TRY(cudaMemcpyAsync(g->q, g->h_q, (size_t)c.Hq * c.D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    const int kk = k < n ? k : n;
    KV_TRY(kv_gpu_mark_start(mark, g->st));
    const int bits = cs_bits_ok(g, k); /* the bit view lists its union after the search (cs_candidates) */
    if (bits) KV_TRY(cs_bits_launch(g, pool, missing, weight, hi, k, 0));
    else if (cs_tiled(g, k)) KV_TRY(cs_tile_launch(g, g->reduce, pool, missing, weight, hi, k, want_cand));
    else {
        if (g->reduce == 2) KV_TRY(cs_sort_launch(g, pool, missing, weight, hi));
        else KV_TRY(cs_reduce_launch(g, pool, missing, weight, hi));
        KV_TRY(kv_topk_launch(&g->tk, g->S, c.T, lo, n, R, kk, lo, NULL, 1, g->oidx, NULL, kk, NULL, g->st));
    }
    KV_TRY(kv_gpu_mark_end(mark, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(g->h_oidx, g->oidx, (size_t)R * kk * sizeof(int32_t), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(g->h_nu, g->nu, R * sizeof(int), cudaMemcpyDeviceToHost, g->st));
    g->last_kk = kk;
    g->last_pool = pool;
    g->last_u = want_cand;
    g->last_bits = bits;
    g->last_hi = hi;
    return KV_OK;
}

kv_status cs_fetch(void *p, int32_t *idx, int ld, int *count) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    const int kk = g->last_kk;
    if (kk <= 0) return KV_OK;
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    for (int h = 0; h < g->c.Hq; h++) {
        const int r = g->last_pool ? h / g->G : h, nu = g->h_nu[r], cnt = kk < nu ? kk : nu;
        memcpy(idx + (size_t)h * ld, g->h_oidx + (size_t)r * kk, (size_t)cnt * sizeof(int32_t));
        count[h] = cnt;
    }
    return KV_OK;
}

/* After fetch: the fetched search's gathered keys (its union); a diagnostic (candidate recall), so `kvbench
 * run` asks for it outside the timed search. The bit view's search only counted them: cs_blist lists them now
 * (its cursor, bnu, is zero after cs_bsel and zeroed again here); the other paths listed them as they ran.
 * cs_union lists them on the device, cs_candidates copies them to the host. */
kv_status cs_union(kv_cs_gpu *g) {
    const kv_cs_gpu_config &c = g->c;
    if (g->last_bits) {
        const int R = g->last_pool ? c.Hkv : c.Hq, nw = ((g->last_hi - 1) >> 5) - (c.sink >> 5) + 1;
        cs_blist<<<dim3(R, (nw + 255) / 256), 256, 0, g->st>>>(g->bbits, g->BW, g->jl, c.m, c.sink, g->last_hi, g->bnu,
                                                              g->u, c.T);
        KV_LAUNCH_CHECK();
        KV_CUDA_TRY(cudaMemsetAsync(g->bnu, 0, (size_t)R * sizeof(int), g->st));
    }
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

kv_status cs_candidates(void *p, int32_t *cand, int cand_ld, int *ncand) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    if (g->last_kk <= 0 || !g->last_u) return KV_OK;
    KV_TRY(cs_union(g));
    for (int h = 0; h < g->c.Hq; h++) {
        const int r = g->last_pool ? h / g->G : h, nu = g->h_nu[r];
        KV_CUDA_TRY(cudaMemcpy(cand + (size_t)h * cand_ld, g->u + (size_t)r * g->c.T, (size_t)nu * sizeof(int32_t),
                               cudaMemcpyDeviceToHost));
        ncand[h] = nu;
    }
    return KV_OK;
}

/* The same union left on the device (the run's device evaluation reads it there): R rows of u, T apart, row r
 * nu[r] long; *u NULL when the fetched search did not gather. */
kv_status cs_candidates_dev(void *p, const int32_t **u, long long *ld, int *rows, const int **counts) {
    kv_cs_gpu *g = (kv_cs_gpu *)p;
    *u = NULL;
    if (g->last_kk <= 0 || !g->last_u) return KV_OK;
    KV_TRY(cs_union(g));
    *u = g->u;
    *ld = g->c.T;
    *rows = g->last_pool ? g->c.Hkv : g->c.Hq;
    *counts = g->h_nu;
    return KV_OK;
}

#include "csattention_bench.cuh"

}  // namespace

extern "C" const kv_csattention_cuda_ops kv_csattention_cuda = {
    cs_create, cs_kmeans, cs_build, cs_read_index, cs_append, cs_launch, cs_fetch, cs_candidates,
    cs_candidates_dev, cs_destroy, cs_bench,
};
