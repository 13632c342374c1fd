/* pqcache_gpu.h: the C face of kernels/pqcache.cu, PQCache's CUDA path
 * (k-means with cuBLAS distance GEMMs, encoding of appended keys, ADC scan
 * with the group softmax sum and top-k: with C^M <= 4096 code tuples on the
 * tuples, never writing per-key scores; otherwise scores, then GPU top-k). Built when nvcc is found;
 * kernels/pqcache_stub.c gives the same symbols otherwise, each failing with
 * KV_NO_CUDA. Layouts are those of retrievers/pqcache.c: centroids
 * [Hkv][M][dsub][C] (transposed), codes [Hkv][T][M] (one byte per
 * sub-vector; on the device each head's row is padded to 16 bytes). */
#ifndef KV_PQCACHE_GPU_H
#define KV_PQCACHE_GPU_H

#include "kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_pq_gpu kv_pq_gpu;
/* All search-time device memory is taken here (k-means scratch in build). */
kv_status kv_pq_gpu_create(int Hq, int Hkv, int T, int D, int M, int C, kv_pq_gpu **out);
/* Lloyd's k-means of every (kv head, sub-vector) on the keys [lo, n) of the
 * host array k [Hkv][n][D]: centroid c of job (g, m) starts from key
 * lo + picks[(g*M + m)*C + c], then `iters` rounds of assignment (cuBLAS
 * GEMM + argmin) and mean update (an empty cluster keeps its centroid), then
 * the final codes. Centroids [Hkv][M][dsub][C] and codes (rows [lo, n) of
 * [Hkv][T][M]) are copied to the host arrays cent and codes when non-NULL.
 * n <= lo: centroids zero. */
kv_status kv_pq_gpu_build(kv_pq_gpu *p, const float *k, int n, int lo, int iters, const int32_t *picks, float *cent,
                          uint8_t *codes);
/* Codes of the key of position t (host [Hkv][D]) with the current
 * centroids, as kv_pq_assign computes them (bitwise the same distances);
 * codes (nullable) [Hkv][M] to host. */
kv_status kv_pq_gpu_encode(kv_pq_gpu *p, int t, const float *key, uint8_t *codes);
/* Replaces the device centroids and the code rows [lo, n) with host ones
 * (after a k-means run on the CPU: recluster). */
kv_status kv_pq_gpu_upload(kv_pq_gpu *p, const float *cent, const uint8_t *codes, int lo, int n);
/* Search of the region [lo, hi): per kv head g the top min(k, hi-lo) of the
 * group softmax sum into idx[g*ld + j] (positions), count[g]. q [Hq][D]
 * host. Ties: kv_topk_ref's order over the per-key sums (larger first, the
 * smaller position among equals). Optional host outputs for tests: agg
 * [Hkv][hi-lo] (the softmax sums; the tuple path then also writes them per
 * key, which it otherwise never does), raw [Hq][hi-lo] (scale * ADC score).
 * k <= KV_GPU_TOPK_MAX. */
kv_status kv_pq_gpu_search(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx, int ld,
                           int *count, float *agg, float *raw);
void kv_pq_gpu_destroy(kv_pq_gpu *p);
/* kvbench bench --method pqcache: k-means on the float16 keys K
 * [Hkv][>= n][D] (positions 0..n-1, picks as above), then per-stage
 * timings of one search for q [Hq][D] (host). */
kv_status kv_pq_gpu_bench(const kv_gpu_bench_spec *s, int M, int C, int iters, const int32_t *picks,
                          const kv_gpu_keys *K, const float *q, kv_gpu_stages *out);

#ifdef __cplusplus
}
#endif
#endif
