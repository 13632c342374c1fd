/* pqcache_dev.cuh: what kernels/pqcache.cu (search, bench) and
 * kernels/pqcache_kmeans.cu (k-means build, encoding of appended keys) share:
 * the device state of one layer's index, the k-means workspace, the
 * constants and the host functions one file calls in the other. Included by
 * those two .cu files only; the C face of the method is pqcache.h. */
#ifndef KV_PQCACHE_DEV_CUH
#define KV_PQCACHE_DEV_CUH

#include "ops/kv_blas.cuh"
#include "ops/kv_cuda.h"
#include "pqcache.h"

#define KV_CUBLAS_TRY(call)                                                                          \
    do {                                                                                             \
        cublasStatus_t kv_b_ = (call);                                                               \
        if (kv_b_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return kv_fail(KV_ERR_GPU, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, (int)kv_b_); \
    } while (0)


constexpr int PQ_TH = 256;          /* threads of the scan kernels */
constexpr int PQ_TILE_BYTES = 8192; /* code bytes per scan tile */
constexpr int PQ_CHUNK = 1 << 18;   /* keys per k-means GEMM chunk */
constexpr int PQ_UPD = 8192;        /* keys per update block at most */
constexpr int PQ_TUP_MAX = 4096;    /* most code tuples the tuple path handles (C^M) */

struct kv_pq_gpu {
    int Hq, Hkv, T, D, M, C, dsub, G, ld;
    long long TM;
    kv_cuda_dev dev;
    cudaStream_t st;
    int last_kk;      /* the launched search's list length, for fetch (-1: nothing launched) */
    cublasHandle_t blas;
    float *cent, *q, *lut, *agg, *pm, *mz, *key1, *tab;
    double *pz;
    unsigned *bh;     /* tuple histogram [Hkv][ntup], zero between searches */
    int ntup;         /* C^M when <= PQ_TUP_MAX (the tuple-table scan), else 0 */
    unsigned *thr;    /* tuple path: [Hkv][2] threshold key, keys taken at it */
    unsigned *nab;    /* tuple path: [Hkv] keys above the threshold, zero between searches */
    unsigned *ecnt;   /* tuple path: [Hkv][eld] keys at the threshold per selection block */
    int eld;
    int32_t *cand;    /* tuple path: [Hkv][KV_GPU_TOPK_MAX] unordered selection */
    int fused;        /* tuple path in two launches (pq_hist_table, pq_select_fused); KVBENCH_PQ_FUSED=0: six */
    int pdl;          /* pq_select_fused a programmatic dependent launch (KVBENCH_PQ_PDL=0: plain; cleared if the
                       * driver refuses one) */
    int32_t *ties;    /* fused tuple path: [Hkv][T] each selection block's first ties, at its keys' offset */
    int sel_smem;     /* fused tuple path: pq_select_fused's dynamic shared memory limit (bytes) */
    uint8_t *codes, *code1;
    unsigned *ctr;    /* [2][Hkv] last-block counters (scan, selection), zero between launches */
    int32_t *idx;
    kv_topk_ws tk;
    kv_graph graph;   /* the whole search's launches as one CUDA graph per (lo, hi, k, scale) */
};

/* k-means scratch of one build (pqcache_kmeans.cu). */
struct pq_build_ws {
    float *x, *S, *cn;
    double *sum;
    int *cnt;
    int32_t *pick;
};

/* Keys [H][>= n][D] (head stride gs) widened to float32 x [H][n][D]. */
template <typename TI>
__global__ void pq_to_float(const TI *k, long long gs, int n, int D, float *x) {
    int g = blockIdx.y;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < (long long)n * D;
         e += (long long)gridDim.x * blockDim.x)
        x[(long long)g * n * D + e] = (float)k[g * gs + e];
}

/* cent[(gm*dsub + j)*C + c] = x[g][lo + pick[gm*C + c]][m*dsub + j] */

/* ---- pqcache_kmeans.cu ---- */
void pq_build_ws_free(pq_build_ws *w);
kv_status pq_alloc_ws(kv_pq_gpu *p, pq_build_ws *w, int cnt);
/* Lloyd from picks on keys [lo, lo+cnt) of w->x (head stride xs), then the final codes. */
kv_status pq_kmeans(kv_pq_gpu *p, pq_build_ws *w, long long xs, int lo, int cnt, int iters, const int32_t *picks);
/* The launchers build, encode and upload of pqcache.h's table. */
kv_status pq_gpu_build(kv_pq_gpu *p, const kv_host_rows *k, int n, int lo, int iters, const int32_t *picks, float *cent,
                       uint8_t *codes);
kv_status pq_gpu_encode(kv_pq_gpu *p, int t, const float *key, uint8_t *codes);
kv_status pq_gpu_upload(kv_pq_gpu *p, const float *cent, const uint8_t *codes, int lo, int n);

#endif
