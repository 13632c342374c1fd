/* quest.cu: Quest's CUDA path (issue 5, point 2; the CPU reference and the
 * paper's facts are in retrievers/quest.c).
 *
 * Page summaries are stored channel-major, kmin/kmax[g][i][j] (kv head g,
 * channel i, page j; the page axis padded to a multiple of 8), so the bound
 * scan, one thread per 4 consecutive pages (one page for short contexts,
 * for more threads in flight) summing over the channels in order, reads
 * them fully coalesced (8- or 16-byte loads) and still adds in
 * the CPU's channel order: with float32 summaries the bounds are bitwise
 * kv_quest_page_bound's (products and sums rounded as on the CPU,
 * __fmul_rn/__fadd_rn, no contraction), so pool=none and pool=max select
 * exactly what the CPU selects, ties included. pool=mean adds a per-head
 * softmax (max, then the sum of exp in double, as the CPU) and the pooled
 * sum in the CPU's head order; CUDA's expf may differ from glibc's by an
 * ulp or two, so near-equal pooled values may order differently.
 * Summary update: a tile kernel for many full pages (a block per tile of
 * pages, channels across threads, min/max in token order with the CPU's
 * comparisons, written out transposed through shared memory), a running
 * min/max for the page being filled, one small kernel per appended key that
 * writes the page out when its last token arrives. The summaries are
 * float16 when the keys are (the bench; a run on a float16 layer, through
 * kv_pages_gpu_create: 2 x D x 2 bytes per page and kv head, exact), else
 * float32 (lossless for any key). Top-k over pages: kv_topk_launch (larger first,
 * earlier page among equals); the page ids go to the host, which expands
 * them to tokens (retrievers/quest.c) with the CPU's code. */
#include <stdlib.h>
#include <string.h>

#include "ops/kv_cuda.h"
#include "pages_mean.cuh"
#include "quest.h"

namespace {

constexpr int QB_TH = 128; /* bound-scan threads per block */
constexpr int QB_SMALL = 1 << 16; /* fewer (pages / 4) x kv heads than this: one page per thread */

template <typename TS, int PPT> __device__ __forceinline__ void load_pages(const TS *p, float *o);
template <> __device__ __forceinline__ void load_pages<float, 4>(const float *p, float *o) {
    float4 v = __ldg((const float4 *)p);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}
template <> __device__ __forceinline__ void load_pages<__half, 4>(const __half *p, float *o) {
    uint2 v = __ldg((const uint2 *)p);
    __half2 a = *(__half2 *)&v.x, b = *(__half2 *)&v.y;
    o[0] = __low2float(a); o[1] = __high2float(a); o[2] = __low2float(b); o[3] = __high2float(b);
}
template <> __device__ __forceinline__ void load_pages<float, 1>(const float *p, float *o) { o[0] = __ldg(p); }
template <> __device__ __forceinline__ void load_pages<__half, 1>(const __half *p, float *o) {
    o[0] = __half2float(__ldg(p));
}

template <typename T> __device__ __forceinline__ T to_store(float v);
template <> __device__ __forceinline__ float to_store<float>(float v) { return v; }
template <> __device__ __forceinline__ __half to_store<__half>(float v) { return __float2half_rn(v); }

/* Full pages [pg0, pg1): keys of page j, head g at k[g*gs + (sink + j*page + o)*D + i]. */
template <typename TI, typename TS>
__global__ void quest_summarize(const TI *k, long long gs, int D, int page, int sink, int pg0, int pg1, int TP,
                                TS *kmin, TS *kmax, long long PS) {
    extern __shared__ float sq[];
    float *smin = sq, *smax = sq + TP * (D + 1);
    const int g = blockIdx.y, j0 = pg0 + blockIdx.x * TP, np = min(TP, pg1 - j0);
    const TI *kg = k + g * gs;
    for (int p = 0; p < np; p++) {
        const TI *kp = kg + (long long)(sink + (long long)(j0 + p) * page) * D;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            float mn = (float)kp[i], mx = mn;
#pragma unroll 4
            for (int o = 1; o < page; o++) {
                float v = (float)kp[(long long)o * D + i];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            smin[p * (D + 1) + i] = mn;
            smax[p * (D + 1) + i] = mx;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D * TP; e += blockDim.x) {
        int i = e / TP, p = e % TP;
        if (p >= np) continue;
        long long o = ((long long)g * D + i) * PS + j0 + p;
        kmin[o] = to_store<TS>(smin[p * (D + 1) + i]);
        kmax[o] = to_store<TS>(smax[p * (D + 1) + i]);
    }
}

/* The same with 16-byte loads: D / VEC threads per page, each VEC channels. */
__device__ __forceinline__ void unpack16(uint4 u, float *v, const float *) {
    v[0] = __uint_as_float(u.x); v[1] = __uint_as_float(u.y); v[2] = __uint_as_float(u.z); v[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack16(uint4 u, float *v, const __half *) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        __half2 h = *(const __half2 *)&w[e];
        v[2 * e] = __low2float(h);
        v[2 * e + 1] = __high2float(h);
    }
}

template <typename TI, typename TS>
__global__ void __launch_bounds__(256) quest_summarize_vec(const TI *k, long long gs, int D, int page, int sink,
                                                            int pg0, int pg1, int TP, TS *kmin, TS *kmax, long long PS) {
    constexpr int VEC = 16 / sizeof(TI);
    extern __shared__ float sq[];
    float *smin = sq, *smax = sq + TP * (D + 1);
    const int g = blockIdx.y, j0 = pg0 + blockIdx.x * TP, np = min(TP, pg1 - j0);
    const int tpp = D / VEC, ppp = blockDim.x / tpp, sub = threadIdx.x % tpp, pl = threadIdx.x / tpp;
    const TI *kg = k + g * gs;
    for (int p = pl; p < np; p += ppp) {
        const uint4 *kp = (const uint4 *)(kg + (long long)(sink + (long long)(j0 + p) * page) * D) + sub;
        float mn[VEC], mx[VEC], v[VEC];
        unpack16(__ldg(kp), mn, (const TI *)nullptr);
#pragma unroll
        for (int e = 0; e < VEC; e++) mx[e] = mn[e];
#pragma unroll 4
        for (int o = 1; o < page; o++) {
            unpack16(__ldg(kp + (long long)o * tpp), v, (const TI *)nullptr);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                mn[e] = v[e] < mn[e] ? v[e] : mn[e];
                mx[e] = v[e] > mx[e] ? v[e] : mx[e];
            }
        }
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            smin[p * (D + 1) + sub * VEC + e] = mn[e];
            smax[p * (D + 1) + sub * VEC + e] = mx[e];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D * TP; e += blockDim.x) {
        int i = e / TP, p = e % TP;
        if (p >= np) continue;
        long long o = ((long long)g * D + i) * PS + j0 + p;
        kmin[o] = to_store<TS>(smin[p * (D + 1) + i]);
        kmax[o] = to_store<TS>(smax[p * (D + 1) + i]);
    }
}

/* Running min/max of tokens [a, b) of the page being filled. */
template <typename TI>
__global__ void quest_tail(const TI *k, long long gs, int D, int a, int b, float *cmin, float *cmax) {
    int g = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float mn = (float)k[g * gs + (long long)a * D + i], mx = mn;
        for (int t = a + 1; t < b; t++) {
            float v = (float)k[g * gs + (long long)t * D + i];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        cmin[g * D + i] = mn;
        cmax[g * D + i] = mx;
    }
}

/* One appended key (offset off in page j); the page is written when full. */
template <typename TS>
__global__ void quest_add(const float *key, int D, int off, int page, int j, float *cmin, float *cmax, TS *kmin,
                          TS *kmax, long long PS) {
    int g = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = key[g * D + i], mn = v, mx = v;
        if (off) {
            float a = cmin[g * D + i], b = cmax[g * D + i];
            mn = v < a ? v : a;
            mx = v > b ? v : b;
        }
        cmin[g * D + i] = mn;
        cmax[g * D + i] = mx;
        if (off == page - 1) {
            kmin[((long long)g * D + i) * PS + j] = to_store<TS>(mn);
            kmax[((long long)g * D + i) * PS + j] = to_store<TS>(mx);
        }
    }
}

/* Bounds of pages [0, ncand) for the GT (or G when GT = 0) query heads of
 * kv head g; pool 2 writes the group max to pooled, else bounds. */
template <typename TS, int GT, int QB_PPT>
__global__ void __launch_bounds__(QB_TH) quest_bounds(const TS *kmin, const TS *kmax, long long PS, const float *q,
                                                       int Gr, int D, int ncand, int pool, float *bound, int write_bound,
                                                       float *pooled) {
    extern __shared__ float sqv[];
    const int G = GT ? GT : Gr, g = blockIdx.y;
    for (int e = threadIdx.x; e < G * D; e += blockDim.x) sqv[e] = q[(long long)g * G * D + e];
    __syncthreads();
    const int j0 = (blockIdx.x * blockDim.x + threadIdx.x) * QB_PPT;
    if (j0 >= ncand) return;
    const TS *mnp = kmin + (long long)g * D * PS + j0, *mxp = kmax + (long long)g * D * PS + j0;
    if constexpr (GT > 0) {
        float acc[GT ? GT : 1][QB_PPT];
#pragma unroll
        for (int h = 0; h < (GT ? GT : 1); h++)
#pragma unroll
            for (int p = 0; p < QB_PPT; p++) acc[h][p] = 0.f;
#pragma unroll 8
        for (int i = 0; i < D; i++) {
            float mn[QB_PPT], mx[QB_PPT];
            load_pages<TS, QB_PPT>(mnp + (long long)i * PS, mn);
            load_pages<TS, QB_PPT>(mxp + (long long)i * PS, mx);
#pragma unroll
            for (int h = 0; h < (GT ? GT : 1); h++) {
                float qi = sqv[h * D + i];
#pragma unroll
                for (int p = 0; p < QB_PPT; p++) {
                    float a = __fmul_rn(qi, mx[p]), b = __fmul_rn(qi, mn[p]);
                    acc[h][p] = __fadd_rn(acc[h][p], a > b ? a : b);
                }
            }
        }
        float pm[QB_PPT];
#pragma unroll
        for (int p = 0; p < QB_PPT; p++) pm[p] = -INFINITY;
#pragma unroll
        for (int h = 0; h < (GT ? GT : 1); h++)
#pragma unroll
            for (int p = 0; p < QB_PPT; p++) {
                if (j0 + p >= ncand) continue;
                if (write_bound) bound[(long long)(g * G + h) * PS + j0 + p] = acc[h][p];
                pm[p] = fmaxf(pm[p], acc[h][p]);
            }
        if (pool == 2)
#pragma unroll
            for (int p = 0; p < QB_PPT; p++)
                if (j0 + p < ncand) pooled[(long long)g * PS + j0 + p] = pm[p];
    } else { /* any group size: one head at a time (re-reads the summaries from L1/L2) */
    float pm[QB_PPT];
    for (int p = 0; p < QB_PPT; p++) pm[p] = -INFINITY;
    for (int h = 0; h < G; h++) {
        float acc[QB_PPT];
        for (int p = 0; p < QB_PPT; p++) acc[p] = 0.f;
        for (int i = 0; i < D; i++) {
            float mn[QB_PPT], mx[QB_PPT];
            load_pages<TS, QB_PPT>(mnp + (long long)i * PS, mn);
            load_pages<TS, QB_PPT>(mxp + (long long)i * PS, mx);
            float qi = sqv[h * D + i];
            for (int p = 0; p < QB_PPT; p++) {
                float a = __fmul_rn(qi, mx[p]), b = __fmul_rn(qi, mn[p]);
                acc[p] = __fadd_rn(acc[p], a > b ? a : b);
            }
        }
        for (int p = 0; p < QB_PPT; p++) {
            if (j0 + p >= ncand) continue;
            if (write_bound) bound[(long long)(g * G + h) * PS + j0 + p] = acc[p];
            pm[p] = fmaxf(pm[p], acc[p]);
        }
    }
    if (pool == 2)
        for (int p = 0; p < QB_PPT; p++)
            if (j0 + p < ncand) pooled[(long long)g * PS + j0 + p] = pm[p];
    }
}

}  // namespace

struct kv_quest_gpu {
    int Hq, Hkv, T, D, page, sink, P, half, G;
    long long PS;
    kv_cuda_dev dev;
    cudaStream_t st;
    void *kmin, *kmax;  /* [Hkv][D][PS], float or __half */
    float *cmin, *cmax; /* [Hkv][D] */
    float *q, *bound, *pooled, *mz, *key1;
    int32_t *pages;     /* [Hq][kcap] */
    int32_t *hpages;    /* [Hq][kcap] pinned host: the launched search's pages on their way back */
    int kcap;
    int last_n;         /* the launched search's page ids (lists x kp), for fetch; 0: none */
    kv_topk_ws tk;
    float *bmax, *cv;   /* pool=mean fused (pages_mean.cu): [Hq][nba] block maxima, [Hkv][nbz*PM_KMAX] candidates */
    double *zpart, *tz; /* [Hq][nbz], [Hq][nba] */
    int *cj;
    unsigned *ctr;      /* [Hkv] */
};

namespace {

kv_status quest_create_go(kv_quest_gpu *g) {
    KV_TRY(kv_cuda_dev_query(&g->dev));
    KV_CUDA_TRY(kv_stream_create(&g->st));
    const size_t Hkv = g->Hkv, Hq = g->Hq, D = g->D, es = g->half ? 2 : 4;
    KV_CUDA_ALLOC(g->kmin, Hkv * D * g->PS * es, 0, "quest page minima");
    KV_CUDA_ALLOC(g->kmax, Hkv * D * g->PS * es, 0, "quest page maxima");
    KV_CUDA_TRY(cudaMemset(g->kmin, 0, Hkv * D * g->PS * es));
    KV_CUDA_TRY(cudaMemset(g->kmax, 0, Hkv * D * g->PS * es));
    KV_CUDA_ALLOC(g->cmin, Hkv * D * sizeof(float), 0, "quest running minima");
    KV_CUDA_ALLOC(g->cmax, Hkv * D * sizeof(float), 0, "quest running maxima");
    KV_CUDA_ALLOC(g->q, Hq * D * sizeof(float), 0, "quest queries");
    KV_CUDA_ALLOC(g->bound, Hq * g->PS * sizeof(float), 0, "quest page bounds");
    KV_CUDA_ALLOC(g->pooled, Hkv * g->PS * sizeof(float), 0, "quest pooled bounds");
    KV_CUDA_ALLOC(g->mz, Hq * 2 * sizeof(float), 0, "quest softmax constants");
    KV_CUDA_ALLOC(g->key1, Hkv * D * sizeof(float), 0, "quest appended key");
    g->kcap = g->P < KV_GPU_TOPK_MAX ? g->P : KV_GPU_TOPK_MAX;
    KV_CUDA_ALLOC(g->pages, Hq * g->kcap * sizeof(int32_t), 0, "quest selected pages");
    KV_CUDA_ALLOC(g->hpages, Hq * g->kcap * sizeof(int32_t), 1, "quest selected pages (pinned host)");
    KV_TRY(kv_topk_ws_create(&g->tk, g->Hq, g->P, &g->dev));
    int nba, nbz;
    pm_sizes(g->P, g->Hkv, &nba, &nbz);
    KV_CUDA_ALLOC(g->bmax, Hq * nba * sizeof(float), 0, "quest block maxima");
    KV_CUDA_ALLOC(g->zpart, Hq * nbz * sizeof(double), 0, "quest softmax partial sums");
    KV_CUDA_ALLOC(g->tz, Hq * nba * sizeof(double), 0, "quest softmax tile sums");
    KV_CUDA_ALLOC(g->cv, Hkv * nbz * PM_KMAX * sizeof(float), 0, "quest page candidates");
    KV_CUDA_ALLOC(g->cj, Hkv * nbz * PM_KMAX * sizeof(int), 0, "quest page candidates");
    KV_CUDA_ALLOC(g->ctr, Hkv * sizeof(unsigned), 0, "quest block counters");
    KV_CUDA_TRY(cudaMemset(g->ctr, 0, Hkv * sizeof(unsigned)));
    return KV_OK;
}

template <typename TI>
kv_status quest_summarize_launch(kv_quest_gpu *g, const TI *k, long long gs, int pg0, int pg1) {
    if (pg1 <= pg0) return KV_OK;
    int TP = 6144 / g->D;
    TP = TP < 1 ? 1 : TP > 32 ? 32 : TP;
    size_t sm = (size_t)2 * TP * (g->D + 1) * sizeof(float);
    dim3 grid((pg1 - pg0 + TP - 1) / TP, g->Hkv);
    constexpr int VEC = 16 / sizeof(TI);
    const int tpp = g->D / VEC;
    if (g->D % VEC == 0 && tpp <= 256 && 256 % tpp == 0) { /* 16-byte loads */
        if (g->half)
            quest_summarize_vec<TI, __half><<<grid, 256, sm, g->st>>>(k, gs, g->D, g->page, g->sink, pg0, pg1, TP,
                                                                      (__half *)g->kmin, (__half *)g->kmax, g->PS);
        else
            quest_summarize_vec<TI, float><<<grid, 256, sm, g->st>>>(k, gs, g->D, g->page, g->sink, pg0, pg1, TP,
                                                                     (float *)g->kmin, (float *)g->kmax, g->PS);
        KV_LAUNCH_CHECK();
        return KV_OK;
    }
    if (g->half)
        quest_summarize<TI, __half><<<grid, 128, sm, g->st>>>(k, gs, g->D, g->page, g->sink, pg0, pg1, TP,
                                                              (__half *)g->kmin, (__half *)g->kmax, g->PS);
    else
        quest_summarize<TI, float><<<grid, 128, sm, g->st>>>(k, gs, g->D, g->page, g->sink, pg0, pg1, TP,
                                                             (float *)g->kmin, (float *)g->kmax, g->PS);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

template <typename TS, int QB_PPT>
kv_status quest_bounds_launch_t(kv_quest_gpu *g, int ncand, int pool, int write_bound) {
    const TS *mn = (const TS *)g->kmin, *mx = (const TS *)g->kmax;
    dim3 grid((ncand + QB_TH * QB_PPT - 1) / (QB_TH * QB_PPT), g->Hkv);
    size_t sm = (size_t)g->G * g->D * sizeof(float);
    if (sm > 48 * 1024) return kv_fail(KV_ERR_INPUT, "quest GPU: group x head_dim too large (%d x %d)", g->G, g->D);
#define QB_CASE(GT)                                                                                               \
    case GT:                                                                                                      \
        quest_bounds<TS, GT, QB_PPT><<<grid, QB_TH, sm, g->st>>>(mn, mx, g->PS, g->q, g->G, g->D, ncand, pool, g->bound, \
                                                         write_bound, g->pooled);                                 \
        break;
    switch (g->G) {
        QB_CASE(1) QB_CASE(2) QB_CASE(4) QB_CASE(8)
    default:
        quest_bounds<TS, 0, QB_PPT><<<grid, QB_TH, sm, g->st>>>(mn, mx, g->PS, g->q, g->G, g->D, ncand, pool, g->bound,
                                                        write_bound, g->pooled);
    }
#undef QB_CASE
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* Stage which: 0 = bounds (+ pooling), 1 = top-k, -1 = both. */
kv_status quest_search_launch(kv_quest_gpu *g, float scale, int pool, int ncand, int kp, int write_bound, int which) {
    if (pool == 1 && pm_supported(g->G, kp)) { /* the fused group-mean selection (pages_mean.cu) */
        const pm_args a = {g->kmin, g->kmax, g->half, g->PS, g->q, g->Hkv, g->G, g->D, ncand, kp, scale,
                           g->bound, g->bmax, g->zpart, g->tz, g->cv, g->cj, g->ctr, g->pages};
        return pm_launch(&a, which, g->st);
    }
    if (which <= 0) {
        int wb = write_bound || pool != 2;
        /* short contexts: one page per thread (more threads in flight); long ones: 4 (vector loads) */
        const bool small = (long long)(ncand / 4) * g->Hkv < QB_SMALL;
        KV_TRY(g->half ? (small ? quest_bounds_launch_t<__half, 1>(g, ncand, pool, wb)
                                : quest_bounds_launch_t<__half, 4>(g, ncand, pool, wb))
                       : (small ? quest_bounds_launch_t<float, 1>(g, ncand, pool, wb)
                                : quest_bounds_launch_t<float, 4>(g, ncand, pool, wb)));
        if (pool == 1) KV_TRY(pm_softmax_pool_launch(g->bound, g->PS, ncand, scale, g->Hq, g->Hkv, g->mz, g->pooled, g->st));
    }
    if (which != 0) {
        const float *S = pool ? g->pooled : g->bound;
        int R = pool ? g->Hkv : g->Hq;
        KV_TRY(kv_topk_launch(&g->tk, S, g->PS, 0, ncand, R, kp, 0, NULL, 1, g->pages, NULL, kp, NULL, g->st));
    }
    return KV_OK;
}

}  // namespace

static void kv_quest_gpu_destroy(kv_quest_gpu *g) {
    if (!g) return;
    if (g->st) cudaStreamSynchronize(g->st);
    cudaFree(g->kmin); cudaFree(g->kmax); cudaFree(g->cmin); cudaFree(g->cmax); cudaFree(g->q); cudaFree(g->bound);
    cudaFree(g->pooled); cudaFree(g->mz); cudaFree(g->key1); cudaFree(g->pages);
    cudaFreeHost(g->hpages);
    cudaFree(g->bmax); cudaFree(g->zpart); cudaFree(g->tz); cudaFree(g->cv); cudaFree(g->cj); cudaFree(g->ctr);
    kv_topk_ws_destroy(&g->tk);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

static kv_status kv_quest_gpu_create(int Hq, int Hkv, int T, int D, int page, int sink, int max_pages, int half,
                                         kv_quest_gpu **out) {
    *out = NULL;
    if (Hq % Hkv || page < 1 || max_pages < 1)
        return kv_fail(KV_ERR_INPUT, "quest GPU: bad shape (Hq %d Hkv %d page %d)", Hq, Hkv, page);
    kv_quest_gpu *g = (kv_quest_gpu *)kv_calloc(1, sizeof *g, "quest GPU state");
    if (!g) return KV_ERR_NOMEM;
    g->Hq = Hq; g->Hkv = Hkv; g->T = T; g->D = D; g->page = page; g->sink = sink; g->P = max_pages; g->half = half;
    g->G = Hq / Hkv;
    /* channel rows of whole 16-byte chunks (pages_pipe.cu's cp.async), plus 8 pages (KVBENCH_PAGES_PAD=N:
     * N instead, rounded up to 8) so that the row stride is no power of two: at 1M tokens, page 32, the
     * 64 KB stride between the rows a scan tile reads cost its bound scan 58.0 us against 56.7 us padded
     * (H100, session 5) */
    const char *pad = getenv("KVBENCH_PAGES_PAD");
    g->PS = (((long long)max_pages + 7) & ~7LL) + (pad ? (atoi(pad) + 7) & ~7 : 8);
    kv_status st = quest_create_go(g);
    if (st != KV_OK) { kv_quest_gpu_destroy(g); return st; }
    *out = g;
    return KV_OK;
}

namespace {
kv_status quest_build_go(kv_quest_gpu *g, const float *k, int n, float **dk) {
    if (n <= g->sink) return KV_OK;
    KV_CUDA_ALLOC(*dk, (size_t)g->Hkv * n * g->D * sizeof(float), 0, "quest prefill keys");
    KV_CUDA_TRY(cudaMemcpyAsync(*dk, k, (size_t)g->Hkv * n * g->D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    const long long gs = (long long)n * g->D;
    const int full = (n - g->sink) / g->page, a = g->sink + full * g->page;
    KV_TRY(quest_summarize_launch<float>(g, *dk, gs, 0, full));
    if (a < n) {
        quest_tail<float><<<g->Hkv, 128, 0, g->st>>>(*dk, gs, g->D, a, n, g->cmin, g->cmax);
        KV_LAUNCH_CHECK();
    }
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

/* The same from float16 bits [Hkv][ld][D] (a layer's float16 form in place): half the upload, no host copy. */
kv_status quest_build_half_go(kv_quest_gpu *g, const uint16_t *k, int n, long long ld, __half **dk) {
    if (n <= g->sink) return KV_OK;
    const size_t row = (size_t)n * g->D * sizeof(__half);
    KV_CUDA_ALLOC(*dk, (size_t)g->Hkv * row, 0, "quest prefill keys (float16)");
    KV_CUDA_TRY(cudaMemcpy2DAsync(*dk, row, k, (size_t)ld * g->D * sizeof(__half), row, g->Hkv, cudaMemcpyHostToDevice,
                                  g->st));
    const long long gs = (long long)n * g->D;
    const int full = (n - g->sink) / g->page, a = g->sink + full * g->page;
    KV_TRY(quest_summarize_launch<__half>(g, *dk, gs, 0, full));
    if (a < n) {
        quest_tail<__half><<<g->Hkv, 128, 0, g->st>>>(*dk, gs, g->D, a, n, g->cmin, g->cmax);
        KV_LAUNCH_CHECK();
    }
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}
}  // namespace

static kv_status kv_quest_gpu_build(kv_quest_gpu *g, const float *k, int n) {
    float *dk = NULL;
    kv_status st = quest_build_go(g, k, n, &dk);
    cudaStreamSynchronize(g->st);
    cudaFree(dk);
    return st;
}

static kv_status kv_quest_gpu_build_half(kv_quest_gpu *g, const uint16_t *k, int n, long long ld) {
    __half *dk = NULL;
    kv_status st = quest_build_half_go(g, k, n, ld, &dk);
    cudaStreamSynchronize(g->st);
    cudaFree(dk);
    return st;
}

static kv_status kv_quest_gpu_append(kv_quest_gpu *g, int t, const float *key) {
    if (t < g->sink) return KV_OK;
    const int off = (t - g->sink) % g->page, j = (t - g->sink) / g->page;
    if (j >= g->P) return kv_fail(KV_ERR_INTERNAL, "quest GPU: page %d beyond %d", j, g->P);
    KV_CUDA_TRY(cudaMemcpyAsync(g->key1, key, (size_t)g->Hkv * g->D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    if (g->half)
        quest_add<__half><<<g->Hkv, 128, 0, g->st>>>(g->key1, g->D, off, g->page, j, g->cmin, g->cmax,
                                                     (__half *)g->kmin, (__half *)g->kmax, g->PS);
    else
        quest_add<float><<<g->Hkv, 128, 0, g->st>>>(g->key1, g->D, off, g->page, j, g->cmin, g->cmax,
                                                    (float *)g->kmin, (float *)g->kmax, g->PS);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

static kv_status kv_quest_gpu_summaries(kv_quest_gpu *g, int npages, float *kmin, float *kmax) {
    if (npages <= 0) return KV_OK;
    const size_t es = g->half ? 2 : 4, row = (size_t)npages * es;
    const size_t nrow = (size_t)g->Hkv * g->D;
    unsigned char *a = (unsigned char *)kv_malloc(nrow * row, "quest summaries copy"),
                  *b = (unsigned char *)kv_malloc(nrow * row, "quest summaries copy");
    kv_status st = (a && b) ? KV_OK : KV_ERR_NOMEM;
    if (st == KV_OK &&
        (cudaStreamSynchronize(g->st) != cudaSuccess ||
         cudaMemcpy2D(a, row, g->kmin, (size_t)g->PS * es, row, nrow, cudaMemcpyDeviceToHost) != cudaSuccess ||
         cudaMemcpy2D(b, row, g->kmax, (size_t)g->PS * es, row, nrow, cudaMemcpyDeviceToHost) != cudaSuccess))
        st = kv_fail(KV_ERR_GPU, "quest GPU: copying the summaries back failed");
    for (size_t r = 0; r < nrow && st == KV_OK; r++) {
        size_t hg = r / g->D, i = r % g->D;
        for (int j = 0; j < npages; j++) {
            float vn, vx;
            if (g->half) {
                vn = kv_half_to_float(((uint16_t *)a)[r * npages + j]);
                vx = kv_half_to_float(((uint16_t *)b)[r * npages + j]);
            } else {
                vn = ((float *)a)[r * npages + j];
                vx = ((float *)b)[r * npages + j];
            }
            kmin[(hg * npages + j) * g->D + i] = vn;
            kmax[(hg * npages + j) * g->D + i] = vx;
        }
    }
    free(a);
    free(b);
    return st;
}

/* Queues one search (kv_gpu_mark: `kvbench run`); its page ids come back into pinned memory, read by fetch. */
static kv_status kv_quest_gpu_launch_b(kv_quest_gpu *g, const float *q, float scale, int pool, int ncand, int kp,
                                       int write_bound, kv_gpu_mark *mark) {
    g->last_n = 0;
    if (ncand <= 0 || kp <= 0) return KV_OK;
    if (kp > ncand || kp > g->kcap || ncand > g->P)
        return kv_fail(KV_ERR_INPUT, "quest GPU: %d pages of %d candidates (at most %d)", kp, ncand, g->kcap);
    KV_CUDA_TRY(cudaMemcpyAsync(g->q, q, (size_t)g->Hq * g->D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    KV_TRY(kv_gpu_mark_start(mark, g->st));
    KV_TRY(quest_search_launch(g, scale, pool, ncand, kp, write_bound, -1));
    KV_TRY(kv_gpu_mark_end(mark, g->st));
    const int R = pool ? g->Hkv : g->Hq;
    KV_CUDA_TRY(cudaMemcpyAsync(g->hpages, g->pages, (size_t)R * kp * sizeof(int32_t), cudaMemcpyDeviceToHost, g->st));
    g->last_n = R * kp;
    return KV_OK;
}

static kv_status kv_quest_gpu_launch(kv_quest_gpu *g, const float *q, float scale, int pool, int ncand, int kp,
                                     kv_gpu_mark *mark) {
    return kv_quest_gpu_launch_b(g, q, scale, pool, ncand, kp, 0, mark);
}

static kv_status kv_quest_gpu_fetch(kv_quest_gpu *g, int32_t *pages) {
    if (g->last_n <= 0) return KV_OK;
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    memcpy(pages, g->hpages, (size_t)g->last_n * sizeof(int32_t));
    return KV_OK;
}

static kv_status kv_quest_gpu_search(kv_quest_gpu *g, const float *q, float scale, int pool, int ncand, int kp,
                                         int32_t *pages, float *bound) {
    KV_TRY(kv_quest_gpu_launch_b(g, q, scale, pool, ncand, kp, bound != NULL, NULL));
    if (bound && g->last_n > 0)
        KV_CUDA_TRY(cudaMemcpy2DAsync(bound, (size_t)ncand * sizeof(float), g->bound, (size_t)g->PS * sizeof(float),
                                      (size_t)ncand * sizeof(float), g->Hq, cudaMemcpyDeviceToHost, g->st));
    return kv_quest_gpu_fetch(g, pages);
}

/* ---- kvbench bench --method quest ---- */
namespace {
struct quest_bench_ctx {
    kv_quest_gpu *g;
    kv_bench_timer tm;
    cudaStream_t own;
};

kv_status quest_bench_go(quest_bench_ctx *c, const kv_gpu_bench_spec *s, int page, int pool, const kv_gpu_keys *K,
                         const float *q, kv_quest_bench_hook hook, void *ctx, kv_gpu_stages *out) {
    const int n = s->n, np = n / page;
    if (np < 1) return kv_fail(KV_ERR_INPUT, "quest GPU bench: %d tokens make no page of %d", n, page);
    int kp = s->k / page;
    kp = kp < 1 ? 1 : kp > np ? np : kp;
    KV_TRY(kv_quest_gpu_create(s->Hq, s->Hkv, n, s->D, page, 0, np, K->a.half, &c->g));
    kv_quest_gpu *g = c->g;
    KV_TRY(kv_bench_timer_init(&c->tm, s->reps, s->warmup, s->stream));
    c->own = g->st;
    g->st = c->tm.st;
    const long long gs = (long long)K->a.T * K->a.D;
    auto summ = [&]() -> kv_status {
        return K->a.half ? quest_summarize_launch<__half>(g, (const __half *)K->a.p, gs, 0, np)
                         : quest_summarize_launch<float>(g, (const float *)K->a.p, gs, 0, np);
    };
    kv_gpu_timing t[4];
    KV_TRY(kv_bench_time(&c->tm, summ, &t[0]));
    KV_CUDA_TRY(cudaMemcpy(g->q, q, (size_t)s->Hq * s->D * sizeof(float), cudaMemcpyHostToDevice));
    KV_TRY(quest_search_launch(g, s->scale, pool, np, kp, 0, -1));
    KV_TRY(kv_bench_time(&c->tm, [&]() { return quest_search_launch(g, s->scale, pool, np, kp, 0, 0); }, &t[1]));
    KV_TRY(kv_bench_time(&c->tm, [&]() { return quest_search_launch(g, s->scale, pool, np, kp, 0, 1); }, &t[2]));
    KV_TRY(kv_bench_time(&c->tm, [&]() { return quest_search_launch(g, s->scale, pool, np, kp, 0, -1); }, &t[3]));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    kv_status hs = KV_OK; /* the hook's stages go after these four */
    g->st = c->own;
    c->own = NULL;
    const double es = K->a.half ? 2 : 4, summ_b = (double)s->Hkv * np * 2 * s->D * es,
                 keys = (double)s->Hkv * np * page * s->D * es, qb = (double)s->Hq * s->D * 4;
    const int R = pool ? s->Hkv : s->Hq, fused = pool == 1 && pm_supported(g->G, kp);
    /* fused pool=mean: the scan writes per-query-head bounds, pool_topk reads them and writes page ids */
    const double sc = (double)(fused ? s->Hq : R) * np * 4, pg = (double)R * kp * 4;
    out->n = 4;
    out->stage[0] = kv_gpu_stage{"summary", t[0], keys + summ_b};
    out->stage[1] = kv_gpu_stage{"bound_scan", t[1], summ_b + qb + sc};
    out->stage[2] = kv_gpu_stage{fused ? "pool_topk" : "topk", t[2], sc + pg};
    out->stage[3] = kv_gpu_stage{"search", t[3], summ_b + qb + pg};
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "quest page=%d pool=%s, %d pages of %d: per page and kv head 2 x D x %.0f B of min/max (float%s "
             "summaries of float16 keys); summary = keys in + min/max out; bound_scan = min/max + q + %s bounds out "
             "(4 B/page/row); %s = bounds + page ids; search = min/max + q + page ids (bounds need not reach "
             "memory); token expansion on the host",
             page, pool == 0 ? "none" : pool == 1 ? "mean" : "max", kp, np, es, K->a.half ? "16" : "32",
             pool && !fused ? "pooled" : "per-query-head",
             fused ? "pool_topk (fused softmax sums, group mean and page top-k, kernels/pages_mean.cu)" : "topk");
    out->l2_bytes = c->tm.dev.l2_bytes;
    out->flush_bytes = c->tm.flush_n * sizeof(uint4);
    if (hook) { /* the hook's launches on the timer's stream, as the stages above */
        c->own = g->st;
        g->st = c->tm.st;
        hs = hook(ctx, g, &c->tm, np, kp, out);
        KV_CUDA_TRY(cudaStreamSynchronize(g->st));
        g->st = c->own;
        c->own = NULL;
    }
    return hs;
}
}  // namespace

static kv_status kv_quest_gpu_bench_with(const kv_gpu_bench_spec *s, int page, int pool, const kv_gpu_keys *K,
                                         const float *q, kv_quest_bench_hook hook, void *ctx, kv_gpu_stages *out) {
    memset(out, 0, sizeof *out);
    if (s->n < 1 || s->n > K->a.T || K->a.H != s->Hkv || K->a.D != s->D)
        return kv_fail(KV_ERR_INPUT, "quest GPU bench: inconsistent spec (n=%d)", s->n);
    quest_bench_ctx c = {};
    kv_status st = quest_bench_go(&c, s, page, pool, K, q, hook, ctx, out);
    if (c.g && c.own) c.g->st = c.own;
    kv_quest_gpu_destroy(c.g);
    kv_bench_timer_free(&c.tm);
    return st;
}

static kv_status kv_quest_gpu_bench(const kv_gpu_bench_spec *s, int page, int pool, const kv_gpu_keys *K,
                                    const float *q, kv_gpu_stages *out) {
    return kv_quest_gpu_bench_with(s, page, pool, K, q, NULL, NULL, out);
}

/* FreeKV's correction: pool=mean pages of the flagged kv heads only, all on the device. */
static int kv_quest_gpu_flagged_ok(const kv_quest_gpu *g, int kp) { return pm_supported(g->G, kp) && !pm_old_path(); }

static kv_status kv_quest_gpu_select_flagged(kv_quest_gpu *g, const float *qd, float scale, int ncand, int kp,
                                             const int *flag, void *st, int32_t *pages) {
    if (ncand <= 0 || kp <= 0) return KV_OK;
    if (kp > ncand || ncand > g->P || !kv_quest_gpu_flagged_ok(g, kp))
        return kv_fail(KV_ERR_INPUT, "quest GPU: flagged selection of %d pages of %d (group %d) needs the pipelined "
                       "pool=mean path", kp, ncand, g->G);
    cudaStream_t s = st ? (cudaStream_t)st : g->st;
    const pm_args a = {g->kmin, g->kmax, g->half, g->PS, qd, g->Hkv, g->G, g->D, ncand, kp, scale,
                       g->bound, g->bmax, g->zpart, g->tz, g->cv, g->cj, g->ctr, g->pages, flag};
    KV_TRY(pm2_launch(&a, -1, s));
    if (pages)
        KV_CUDA_TRY(cudaMemcpyAsync(pages, g->pages, (size_t)g->Hkv * kp * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    return KV_OK;
}

extern "C" const kv_quest_cuda_ops kv_quest_cuda = {
    .create = kv_quest_gpu_create,
    .build = kv_quest_gpu_build,
    .append = kv_quest_gpu_append,
    .summaries = kv_quest_gpu_summaries,
    .search = kv_quest_gpu_search,
    .launch = kv_quest_gpu_launch,
    .fetch = kv_quest_gpu_fetch,
    .select_flagged = kv_quest_gpu_select_flagged,
    .flagged_ok = kv_quest_gpu_flagged_ok,
    .bench_with = kv_quest_gpu_bench_with,
    .destroy = kv_quest_gpu_destroy,
    .bench = kv_quest_gpu_bench,
    .build_half = kv_quest_gpu_build_half,
};
