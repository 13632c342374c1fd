/* pages_mean.cu: the group-mean page selection (Quest's pool=mean, which is
 * FreeKV's speculative selection; issue 10) as three launches with the page
 * top-k fused in, called by kernels/quest.cu for groups of 1, 2, 4 or 8
 * query heads and at most PM_KMAX pages per kv head (other shapes keep
 * quest.cu's bounds + softmax + pooling + shared top-k path). Since
 * session 4 this is the older path, kept for comparison under
 * KVBENCH_PAGES_PIPE=0; the default is kernels/pages_pipe.cu.
 *
 * 1. pm_bounds: one thread per 1 or 4 pages of one kv head reads each
 *    page's min/max ONCE for all the group's query heads (channel-major
 *    summaries, 2- or 8-byte loads per channel, PM_CB channels loaded into
 *    registers before any is used so that many loads are in flight per
 *    thread: the older kernel kept about one channel's loads in flight and
 *    ran at ~50% of copy bandwidth at 1M tokens), sums in channel order
 *    with products and sums rounded separately (bitwise kv_pages_bound),
 *    writes the bounds [Hq][PS] and one max of scale * bound per query head
 *    and block.
 * 2. pm_zpart: per query head and chunk of PM_CHUNK pages, m_h = the max of
 *    the block maxima, the sum of exp(scale * b - m_h) in double (fixed
 *    block tree), one partial per chunk.
 * 3. pm_pool_topk: per kv head and chunk, w_h = 1 / (G * sum of the
 *    partials in chunk order), the pooled score sum over h in head order of
 *    expf(scale * b - m_h) * w_h (as kv_pages_pool_mean: max, then the sum
 *    of exp in double, float pooling), the chunk's top kp pages by rounds of
 *    block argmax in kv_topk_ref order (larger first, earlier page among
 *    equals), and the last block of each kv head (threadfence reduction)
 *    merges the chunks' candidates into the kv head's kp pages. The pooled
 *    scores never reach memory; the top-k reads kp candidates per chunk.
 * Equal to the CPU up to CUDA's expf (within 2 ulp of glibc's) and the
 * order of the double sums, as quest.cu's path. Byte floor: the summaries
 * (2 x D x 2 B per page and kv head for float16) + q + the page ids; the
 * bounds (4 B per page and query head) go out and come back through L2. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/kv_cuda.h"
#include "pages_mean.cuh"

namespace {

constexpr int PM_TH = 128;   /* pm_bounds threads per block */
constexpr int PM_CB = 8;     /* channels loaded ahead (16 with one page per thread) */
constexpr int PM_RT = 256;   /* pm_zpart / pm_pool_topk threads per block */
constexpr int PM_PPT = 8;    /* pages per thread in pm_zpart / pm_pool_topk */
constexpr int PM_CHUNK = PM_RT * PM_PPT;

template <typename TS, int PPT> __device__ __forceinline__ void pm_load(const TS *p, float *o);
template <> __device__ __forceinline__ void pm_load<float, 4>(const float *p, float *o) {
    float4 v = __ldg((const float4 *)p);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}
template <> __device__ __forceinline__ void pm_load<__half, 4>(const __half *p, float *o) {
    uint2 v = __ldg((const uint2 *)p);
    __half2 a = *(__half2 *)&v.x, b = *(__half2 *)&v.y;
    o[0] = __low2float(a); o[1] = __high2float(a); o[2] = __low2float(b); o[3] = __high2float(b);
}
template <> __device__ __forceinline__ void pm_load<float, 1>(const float *p, float *o) { o[0] = __ldg(p); }
template <> __device__ __forceinline__ void pm_load<__half, 1>(const __half *p, float *o) { o[0] = __half2float(__ldg(p)); }

/* acc[h][p] += max(q_h[i] * mx[p], q_h[i] * mn[p]), rounded as the CPU. */
template <int GT, int PPT>
__device__ __forceinline__ void pm_acc(float (&acc)[GT][PPT], const float *sqv, int D, int i, const float *mn,
                                       const float *mx) {
#pragma unroll
    for (int h = 0; h < GT; h++) {
        const float qi = sqv[h * D + i];
#pragma unroll
        for (int p = 0; p < PPT; p++) {
            const float a = __fmul_rn(qi, mx[p]), b = __fmul_rn(qi, mn[p]);
            acc[h][p] = __fadd_rn(acc[h][p], a > b ? a : b);
        }
    }
}

template <typename TS, int GT, int PPT>
__global__ void __launch_bounds__(PM_TH) pm_bounds(const TS *kmin, const TS *kmax, long long PS, const float *q, int D,
                                                   int ncand, float scale, float *bound, float *bmax, int nba) {
    extern __shared__ float sqv[];
    const int g = blockIdx.y;
    for (int e = threadIdx.x; e < GT * D; e += blockDim.x) sqv[e] = q[(long long)g * GT * D + e];
    __syncthreads();
    const int j0 = (blockIdx.x * blockDim.x + threadIdx.x) * PPT;
    float acc[GT][PPT];
#pragma unroll
    for (int h = 0; h < GT; h++)
#pragma unroll
        for (int p = 0; p < PPT; p++) acc[h][p] = 0.f;
    if (j0 < ncand) {
        const TS *mnp = kmin + (long long)g * D * PS + j0, *mxp = kmax + (long long)g * D * PS + j0;
        constexpr int CB = PPT == 1 ? 2 * PM_CB : PM_CB; /* one page per thread: twice the channels ahead */
        int i = 0;
        for (; i + CB <= D; i += CB) {
            float mn[CB][PPT], mx[CB][PPT];
#pragma unroll
            for (int c = 0; c < CB; c++) { /* every load of the batch issued before any use */
                pm_load<TS, PPT>(mnp + (long long)(i + c) * PS, mn[c]);
                pm_load<TS, PPT>(mxp + (long long)(i + c) * PS, mx[c]);
            }
#pragma unroll
            for (int c = 0; c < CB; c++) pm_acc<GT, PPT>(acc, sqv, D, i + c, mn[c], mx[c]);
        }
        for (; i < D; i++) {
            float mn[PPT], mx[PPT];
            pm_load<TS, PPT>(mnp + (long long)i * PS, mn);
            pm_load<TS, PPT>(mxp + (long long)i * PS, mx);
            pm_acc<GT, PPT>(acc, sqv, D, i, mn, mx);
        }
    }
    pm_tile_out<GT, PPT, PM_TH>(acc, g, blockIdx.x, blockIdx.x * PM_TH * PPT, PS, ncand, scale, bound, bmax, nullptr,
                                nba);
}

/* Max of the nba block maxima of head h (every thread gets it). */
__device__ __forceinline__ float pm_head_max(const float *bmax, int nba, int h, float *sw) {
    float m = -INFINITY;
    for (int b = threadIdx.x; b < nba; b += blockDim.x) m = fmaxf(m, bmax[(long long)h * nba + b]);
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = m;
    __syncthreads();
    m = sw[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) m = fmaxf(m, sw[k]);
    __syncthreads();
    return m;
}

__global__ void __launch_bounds__(PM_RT) pm_zpart(const float *bound, long long PS, int ncand, float scale,
                                                  const float *bmax, int nba, double *zpart, int nbz) {
    __shared__ float sw[PM_RT / 32];
    __shared__ double sd[PM_RT / 32];
    const int h = blockIdx.y, j0 = blockIdx.x * PM_CHUNK;
    const float m = pm_head_max(bmax, nba, h, sw);
    double z = 0;
#pragma unroll
    for (int p = 0; p < PM_PPT; p++) {
        const int j = j0 + p * PM_RT + threadIdx.x;
        if (j < ncand) z += (double)expf(__fmul_rn(scale, bound[(long long)h * PS + j]) - m);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) z += __shfl_down_sync(0xffffffffu, z, o);
    if ((threadIdx.x & 31) == 0) sd[threadIdx.x >> 5] = z;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < PM_RT / 32; k++) t += sd[k];
        zpart[(long long)h * nbz + blockIdx.x] = t;
    }
}

struct pm_item {
    float v;
    int j; /* page; INT_MAX: none */
};
__device__ __forceinline__ bool pm_beats(pm_item a, pm_item b) { return a.v > b.v || (a.v == b.v && a.j < b.j); }
/* a comes after prev in the selection order (prev already taken). */
__device__ __forceinline__ bool pm_after(pm_item a, pm_item prev) {
    return a.j != INT_MAX && (a.v < prev.v || (a.v == prev.v && a.j > prev.j));
}

/* The block's best item (every thread gets it). */
__device__ __forceinline__ pm_item pm_block_best(pm_item b, pm_item *sw) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        pm_item x;
        x.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        x.j = __shfl_xor_sync(0xffffffffu, b.j, o);
        if (pm_beats(x, b)) b = x;
    }
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = b;
    __syncthreads();
    b = sw[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); k++)
        if (pm_beats(sw[k], b)) b = sw[k];
    __syncthreads();
    return b;
}

template <int GT>
__global__ void __launch_bounds__(PM_RT) pm_pool_topk(const float *bound, long long PS, int ncand, float scale,
                                                      const float *bmax, int nba, const double *zpart, int nbz, int kp,
                                                      float *cv, int *cj, unsigned *ctr, int32_t *pages) {
    __shared__ float sm[GT], swf[PM_RT / 32];
    __shared__ float sw_[GT];
    __shared__ pm_item sbest[PM_RT / 32];
    const int g = blockIdx.y, j0 = blockIdx.x * PM_CHUNK;
    for (int h = 0; h < GT; h++) {
        const float m = pm_head_max(bmax, nba, g * GT + h, swf);
        if (threadIdx.x == 0) {
            double z = 0;
            for (int b = 0; b < nbz; b++) z += zpart[(long long)(g * GT + h) * nbz + b];
            sm[h] = m;
            sw_[h] = (float)(1.0 / (z * GT));
        }
    }
    __syncthreads();
    pm_item it[PM_PPT];
#pragma unroll
    for (int p = 0; p < PM_PPT; p++) {
        const int j = j0 + p * PM_RT + threadIdx.x;
        it[p].v = -INFINITY;
        it[p].j = INT_MAX;
        if (j < ncand) {
            float acc = 0.f;
#pragma unroll
            for (int h = 0; h < GT; h++) {
                const float e = expf(__fmul_rn(scale, bound[(long long)(g * GT + h) * PS + j]) - sm[h]);
                acc = __fadd_rn(acc, __fmul_rn(e, sw_[h]));
            }
            it[p].v = acc;
            it[p].j = j;
        }
    }
    pm_item prev = {INFINITY, -1};
    const long long cb = ((long long)g * gridDim.x + blockIdx.x) * kp;
    for (int r = 0; r < kp; r++) {
        pm_item b = {-INFINITY, INT_MAX};
#pragma unroll
        for (int p = 0; p < PM_PPT; p++)
            if (pm_after(it[p], prev) && (b.j == INT_MAX || pm_beats(it[p], b))) b = it[p];
        b = pm_block_best(b, sbest);
        if (threadIdx.x == 0) { cv[cb + r] = b.v; cj[cb + r] = b.j; }
        prev = b;
    }
    if (!kv_arrives_last(ctr + g, gridDim.x)) return;
    /* the last block of kv head g: the kp best of the chunks' candidates */
    const int nc = gridDim.x * kp;
    const float *gv = cv + (long long)g * nc;
    const int *gj = cj + (long long)g * nc;
    prev = pm_item{INFINITY, -1};
    for (int r = 0; r < kp; r++) {
        pm_item b = {-INFINITY, INT_MAX};
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const pm_item x = {__ldcg(gv + c), __ldcg(gj + c)};
            if (pm_after(x, prev) && (b.j == INT_MAX || pm_beats(x, b))) b = x;
        }
        b = pm_block_best(b, sbest);
        if (threadIdx.x == 0) pages[(long long)g * kp + r] = b.j;
        prev = b;
    }
    if (threadIdx.x == 0) ctr[g] = 0; /* ready for the next launch */
}

/* pool = mean, per query head h: m = max_j scale*b, w = 1/(G * sum_j exp(scale*b - m)). */
__global__ void quest_softmax_stats(const float *bound, long long PS, int ncand, float scale, int G, float *mz) {
    __shared__ float sf[32];
    __shared__ double sd[32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *b = bound + (long long)h * PS;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < ncand; j += blockDim.x) m = fmaxf(m, __fmul_rn(scale, b[j]));
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) sf[w] = m;
    __syncthreads();
    m = sf[0];
    for (int i = 1; i < nw; i++) m = fmaxf(m, sf[i]);
    double z = 0;
    for (int j = threadIdx.x; j < ncand; j += blockDim.x) z += (double)expf(__fmul_rn(scale, b[j]) - m);
    for (int o = 16; o; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
    if (lane == 0) sd[w] = z;
    __syncthreads();
    if (threadIdx.x == 0) {
        z = 0;
        for (int i = 0; i < nw; i++) z += sd[i];
        mz[2 * h] = m;
        mz[2 * h + 1] = (float)(1.0 / (z * G));
    }
}

__global__ void quest_pool_mean(const float *bound, long long PS, int ncand, float scale, int G, const float *mz,
                                float *pooled) {
    const int g = blockIdx.y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < ncand; j += gridDim.x * blockDim.x) {
        float acc = 0.f;
        for (int hh = 0; hh < G; hh++) {
            int h = g * G + hh;
            float e = expf(__fmul_rn(scale, bound[(long long)h * PS + j]) - mz[2 * h]);
            acc = __fadd_rn(acc, __fmul_rn(e, mz[2 * h + 1]));
        }
        pooled[(long long)g * PS + j] = acc;
    }
}

}  // namespace

kv_status pm_softmax_pool_launch(const float *bound, long long PS, int ncand, float scale, int Hq, int Hkv, float *mz,
                                 float *pooled, cudaStream_t st) {
    const int G = Hq / Hkv;
    quest_softmax_stats<<<Hq, 1024, 0, st>>>(bound, PS, ncand, scale, G, mz);
    KV_LAUNCH_CHECK();
    const int bx = (ncand + 255) / 256;
    quest_pool_mean<<<dim3(bx < 1024 ? bx : 1024, Hkv), 256, 0, st>>>(bound, PS, ncand, scale, G, mz, pooled);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

int pm_supported(int G, int kp) { return (G == 1 || G == 2 || G == 4 || G == 8) && kp >= 1 && kp <= PM_KMAX; }

void pm_sizes(int max_pages, int Hkv, int *nba, int *nbz) {
    *nba = (max_pages + PM_TH - 1) / PM_TH; /* one page per thread at most: the largest grid */
    *nbz = (max_pages + PM_CHUNK - 1) / PM_CHUNK;
    (void)Hkv;
}

int pm_old_path(void) {
    static const int v = !kv_env_on("KVBENCH_PAGES_PIPE");
    return v;
}

kv_status pm_launch(const pm_args *a, int which, cudaStream_t st) {
    if (!pm_old_path()) return pm2_launch(a, which, st);
    if (a->flag) return kv_fail(KV_ERR_INTERNAL, "pages GPU: per-kv-head flags need the pipelined path");
    const int G = a->G, ncand = a->ncand;
    /* short contexts: one page per thread (more threads in flight); long ones: 4 (vector loads) */
    const bool small = (long long)(ncand / 4) * a->Hkv < PM_SMALL;
    const int ppt = small ? 1 : 4, nba = (ncand + PM_TH * ppt - 1) / (PM_TH * ppt),
              nbz = (ncand + PM_CHUNK - 1) / PM_CHUNK;
    if (which <= 0) {
        const size_t sm = (size_t)G * a->D * sizeof(float);
        if (sm > 48 * 1024) return kv_fail(KV_ERR_INPUT, "pages GPU: group x head_dim too large (%d x %d)", G, a->D);
        const dim3 grid(nba, a->Hkv);
#define PM_CASE(TS, GT, PPT)                                                                                        \
    pm_bounds<TS, GT, PPT><<<grid, PM_TH, sm, st>>>((const TS *)a->kmin, (const TS *)a->kmax, a->PS, a->q, a->D,  \
                                                    ncand, a->scale, a->bound, a->bmax, nba)
#define PM_G(TS, PPT)                                                                                               \
    switch (G) {                                                                                                    \
    case 1: PM_CASE(TS, 1, PPT); break;                                                                             \
    case 2: PM_CASE(TS, 2, PPT); break;                                                                             \
    case 4: PM_CASE(TS, 4, PPT); break;                                                                             \
    default: PM_CASE(TS, 8, PPT); break;                                                                            \
    }
        if (a->half) {
            if (small) { PM_G(__half, 1) } else { PM_G(__half, 4) }
        } else {
            if (small) { PM_G(float, 1) } else { PM_G(float, 4) }
        }
#undef PM_G
#undef PM_CASE
        KV_LAUNCH_CHECK();
    }
    if (which != 0) {
        pm_zpart<<<dim3(nbz, a->Hkv * G), PM_RT, 0, st>>>(a->bound, a->PS, ncand, a->scale, a->bmax, nba, a->zpart, nbz);
        KV_LAUNCH_CHECK();
        const dim3 grid(nbz, a->Hkv);
        switch (G) {
#define PM_T(GT)                                                                                                    \
    case GT:                                                                                                        \
        pm_pool_topk<GT><<<grid, PM_RT, 0, st>>>(a->bound, a->PS, ncand, a->scale, a->bmax, nba, a->zpart, nbz,    \
                                                 a->kp, a->cv, a->cj, a->ctr, a->pages);                           \
        break;
            PM_T(1) PM_T(2) PM_T(4) PM_T(8)
#undef PM_T
        default: return kv_fail(KV_ERR_INTERNAL, "pages GPU: group of %d", G);
        }
        KV_LAUNCH_CHECK();
    }
    return KV_OK;
}
