/* pqcache.h: the C face of PQCache's CUDA path, one table of launchers
 * (kv_pqcache_cuda; absent without nvcc): k-means with cuBLAS distance GEMMs
 * and the encoding of appended keys (kernels/pqcache_kmeans.cu), the ADC scan
 * with the group softmax sum and top-k (kernels/pqcache.cu: with C^M <= 4096
 * code tuples on the tuples, never writing per-key scores; otherwise scores,
 * then GPU top-k). Layouts are those of retrievers/pqcache.c: centroids
 * [Hkv][M][dsub][C] (transposed), codes [Hkv][T][M] (one byte per
 * sub-vector; on the device each head's row is padded to 16 bytes). */
#ifndef KV_PQCACHE_H
#define KV_PQCACHE_H

#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_pq_gpu kv_pq_gpu;

/* The launchers: one table, defined by kernels/pqcache.cu; in a build
 * without nvcc the table is absent (&kv_pqcache_cuda == NULL, see
 * KV_GPU_TABLE in ops/kv_gpu.h) and the retriever stays on the CPU. */
typedef struct {

    /* All search-time device memory is taken here (k-means scratch in build). */
    kv_status (*create)(int Hq, int Hkv, int T, int D, int M, int C, kv_pq_gpu **out);
    /* Lloyd's k-means of every (kv head, sub-vector) on the keys [lo, n) of the
     * host rows k (float32 or float16, kv_common.h; all n rows are uploaded): centroid c of job (g, m) starts from key
     * lo + picks[(g*M + m)*C + c], then `iters` rounds of assignment (cuBLAS
     * GEMM + argmin) and mean update (an empty cluster keeps its centroid), then
     * the final codes. Centroids [Hkv][M][dsub][C] and codes (rows [lo, n) of
     * [Hkv][T][M]) are copied to the host arrays cent and codes when non-NULL.
     * n <= lo: centroids zero. */
    kv_status (*build)(kv_pq_gpu *p, const kv_host_rows *k, int n, int lo, int iters, const int32_t *picks, float *cent,
        uint8_t *codes);
    /* Codes of the key of position t (host [Hkv][D]) with the current
     * centroids, as kv_pq_assign computes them (bitwise the same distances);
     * codes (nullable) [Hkv][M] to host. */
    kv_status (*encode)(kv_pq_gpu *p, int t, const float *key, uint8_t *codes);
    /* Replaces the device centroids and the code rows [lo, n) with host ones
     * (after a k-means run on the CPU: recluster). */
    kv_status (*upload)(kv_pq_gpu *p, const float *cent, const uint8_t *codes, int lo, int n);
    /* Search of the region [lo, hi): per kv head g the top min(k, hi-lo) of the
     * group softmax sum into idx[g*ld + j] (positions), count[g]. q [Hq][D]
     * host. Ties: kv_topk_ref's order over the per-key sums (larger first, the
     * smaller position among equals). Optional host outputs for tests: agg
     * [Hkv][hi-lo] (the softmax sums; the tuple path then also writes them per
     * key, which it otherwise never does), raw [Hq][hi-lo] (scale * ADC score).
     * k <= KV_GPU_TOPK_MAX. */
    kv_status (*search)(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx, int ld,
        int *count, float *agg, float *raw);
    /* The same without the test outputs, in halves (kvbench run, kv_gpu_mark): launch queues the search and the
     * copy of its lists into idx (read them after fetch), fetch waits for it and writes count. */
    kv_status (*launch)(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx, int ld,
        kv_gpu_mark *mark);
    kv_status (*fetch)(kv_pq_gpu *p, int *count);
    void (*destroy)(kv_pq_gpu *p);
    /* kvbench bench --method pqcache: k-means on the float16 keys K
     * [Hkv][>= n][D] (positions 0..n-1, picks as above), then per-stage
     * timings of one search for q [Hq][D] (host). */
    kv_status (*bench)(const kv_gpu_bench_spec *s, int M, int C, int iters, const int32_t *picks,
        const kv_gpu_keys *K, const float *q, kv_gpu_stages *out);
} kv_pqcache_cuda_ops;
extern const kv_pqcache_cuda_ops kv_pqcache_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
