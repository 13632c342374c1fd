/* pages_mean.cuh: device-side interface between kernels/quest.cu (Quest's
 * and FreeKV's launcher table) and kernels/pages_mean.cu (the group-mean
 * page selection with the top-k fused in, and the older softmax + pooling
 * kernels quest.cu falls back to; its header comment has the design).
 * Internal to kernels/. */
#ifndef KV_PAGES_MEAN_CUH
#define KV_PAGES_MEAN_CUH

#include "ops/kv_cuda.h"

#define PM_KMAX 16          /* pages per kv head the fused top-k selects at most */
#define PM_SMALL (1 << 16)  /* fewer (pages / 4) x kv heads than this: one page per thread */

/* PPT consecutive pages' summary values of one channel (16 or 4 bytes at once for 4 pages), as float. */
template <typename TS, int PPT> static __device__ __forceinline__ void pm_load_pages(const TS *p, float *o);
template <> __device__ __forceinline__ void pm_load_pages<float, 4>(const float *p, float *o) {
    float4 v = __ldg((const float4 *)p);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}
template <> __device__ __forceinline__ void pm_load_pages<__half, 4>(const __half *p, float *o) {
    uint2 v = __ldg((const uint2 *)p);
    __half2 a = *(__half2 *)&v.x, b = *(__half2 *)&v.y;
    o[0] = __low2float(a); o[1] = __high2float(a); o[2] = __low2float(b); o[3] = __high2float(b);
}
template <> __device__ __forceinline__ void pm_load_pages<float, 1>(const float *p, float *o) { o[0] = __ldg(p); }
template <> __device__ __forceinline__ void pm_load_pages<__half, 1>(const __half *p, float *o) { o[0] = __half2float(__ldg(p)); }

typedef struct {
    const void *kmin, *kmax; /* [Hkv][D][PS] channel-major summaries, __half (half = 1) or float */
    int half;
    long long PS;
    const float *q;          /* [Hq][D] */
    int Hkv, G, D, ncand, kp;
    float scale;
    float *bound;            /* [Hq][PS] out */
    float *bmax;             /* [Hq][nba] scratch */
    double *zpart;           /* [Hq][nbz] scratch */
    float *cv;               /* [Hkv][nbz * kp] scratch */
    int *cj;                 /* [Hkv][nbz * kp] scratch */
    unsigned *ctr;           /* [Hkv], zero between launches (the kernel leaves it so) */
    int32_t *pages;          /* [Hkv][kp] out, kv_topk_ref order */
} pm_args;

/* 1 when the fused path handles this group size and page count. */
int pm_supported(int G, int kp);
/* Scratch sizes for up to max_pages pages: bmax [Hq][nba], zpart [Hq][nbz],
 * cv/cj [Hkv][nbz * PM_KMAX]. */
void pm_sizes(int max_pages, int Hkv, int *nba, int *nbz);
/* which: 0 = the bound scan only, 1 = the rest (softmax sums, pooling,
 * top-k; the bounds of an earlier which = 0 launch), -1 = all. */
kv_status pm_launch(const pm_args *a, int which, cudaStream_t st);
/* The older pool=mean path: per-head softmax constants mz [Hq][2] then the
 * pooled scores pooled [Hkv][PS] from the bounds [Hq][PS]. */
kv_status pm_softmax_pool_launch(const float *bound, long long PS, int ncand, float scale, int Hq, int Hkv, float *mz,
                                 float *pooled, cudaStream_t st);

#endif
