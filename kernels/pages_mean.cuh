/* pages_mean.cuh: device-side interface between kernels/quest.cu (Quest's
 * and FreeKV's launcher table) and the group-mean page selection with the
 * top-k fused in: kernels/pages_pipe.cu (the default: pipelined bound scan,
 * latency-trimmed pooling and top-k, per-kv-head flags for the correction)
 * and kernels/pages_mean.cu (the older path, KVBENCH_PAGES_PIPE=0, and the
 * softmax + pooling kernels quest.cu falls back to for other shapes); their
 * header comments have the designs. Internal to kernels/. */
#ifndef KV_PAGES_MEAN_CUH
#define KV_PAGES_MEAN_CUH

#include "ops/kv_cuda.h"

#define PM_KMAX 16          /* pages per kv head the fused top-k selects at most */
#define PM_SMALL (1 << 16)  /* fewer (pages / 4) x kv heads than this: one page per thread */

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
    double *tz;              /* [Hq][nba] scratch: per scan tile, the sum of exp(scale * b - the tile's max) */
    float *cv;               /* [Hkv][nbz * kp] scratch */
    int *cj;                 /* [Hkv][nbz * kp] scratch */
    unsigned *ctr;           /* [Hkv], zero between launches (the kernel leaves it so) */
    int32_t *pages;          /* [Hkv][kp] out, kv_topk_ref order */
    const int *flag;         /* device [Hkv] or NULL: only kv heads with flag != 0 are selected (pages_pipe.cu) */
} pm_args;

/* 1 when the fused path handles this group size and page count. */
int pm_supported(int G, int kp);
/* Scratch sizes for up to max_pages pages: bmax and tz [Hq][nba], zpart [Hq][nbz],
 * cv/cj [Hkv][nbz * PM_KMAX]. */
void pm_sizes(int max_pages, int Hkv, int *nba, int *nbz);
/* which: 0 = the bound scan only, 1 = the rest (softmax sums, pooling,
 * top-k; the bounds of an earlier which = 0 launch), -1 = all. The
 * pipelined path (pm2_launch) unless KVBENCH_PAGES_PIPE=0 (then a non-NULL
 * flag is an error); PS must be a multiple of 8 for it. */
kv_status pm_launch(const pm_args *a, int which, cudaStream_t st);
kv_status pm2_launch(const pm_args *a, int which, cudaStream_t st);
/* 1 when KVBENCH_PAGES_PIPE=0 picked the older path (read once). */
int pm_old_path(void);
/* The older pool=mean path: per-head softmax constants mz [Hq][2] then the
 * pooled scores pooled [Hkv][PS] from the bounds [Hq][PS]. */
kv_status pm_softmax_pool_launch(const float *bound, long long PS, int ncand, float scale, int Hq, int Hkv, float *mz,
                                 float *pooled, cudaStream_t st);

#ifdef __CUDACC__
/* A scan block's output: its threads' bounds (pages before ncand), the tile's max of scale * bound per query
 * head, and (tz non-NULL) the tile's softmax partial against that max (the pool rescales it to the head's: no
 * barrier there). PPT consecutive pages a thread from j0 + t * PPT, NT threads a block. The scans of
 * pages_pipe.cu and pages_mean.cu share it. */
template <int GT, int PPT, int NT>
__device__ __forceinline__ void pm_tile_out(const float (&acc)[GT][PPT], int g, int tile, int j0, long long PS,
                                            int ncand, float scale, float *bound, float *tmax, double *tz, int ntile) {
    __shared__ float swm[GT][NT / 32];
    __shared__ float stm[GT];
    __shared__ double swz[GT][NT / 32];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, jt = j0 + t * PPT;
#pragma unroll
    for (int h = 0; h < GT; h++) {
        float m = -INFINITY;
#pragma unroll
        for (int p = 0; p < PPT; p++)
            if (jt + p < ncand) {
                bound[(long long)(g * GT + h) * PS + jt + p] = acc[h][p];
                m = fmaxf(m, __fmul_rn(scale, acc[h][p]));
            }
#pragma unroll
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) swm[h][w] = m;
    }
    __syncthreads();
    if (t < GT) {
        float m = swm[t][0];
#pragma unroll
        for (int k = 1; k < NT / 32; k++) m = fmaxf(m, swm[t][k]);
        tmax[(long long)(g * GT + t) * ntile + tile] = m;
        stm[t] = m;
    }
    if (!tz) return;
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GT; h++) {
        double z = 0;
#pragma unroll
        for (int p = 0; p < PPT; p++)
            if (jt + p < ncand) z += (double)expf(__fmul_rn(scale, acc[h][p]) - stm[h]);
#pragma unroll
        for (int o = 16; o; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
        if (lane == 0) swz[h][w] = z;
    }
    __syncthreads();
    if (t < GT) {
        double z = swz[t][0];
#pragma unroll
        for (int k = 1; k < NT / 32; k++) z += swz[t][k];
        tz[(long long)(g * GT + t) * ntile + tile] = z;
    }
}
#endif

#endif
