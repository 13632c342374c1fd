/* pqcache_stub.c: kernels/pqcache_gpu.h for a build without nvcc; every
 * entry point reports that this binary has no CUDA. */
#include "pqcache_gpu.h"

kv_status kv_pq_gpu_create(int Hq, int Hkv, int T, int D, int M, int C, kv_pq_gpu **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D; (void)M; (void)C;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pq_gpu_build(kv_pq_gpu *p, const float *k, int n, int lo, int iters, const int32_t *picks, float *cent,
                          uint8_t *codes) {
    (void)p; (void)k; (void)n; (void)lo; (void)iters; (void)picks; (void)cent; (void)codes;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pq_gpu_encode(kv_pq_gpu *p, int t, const float *key, uint8_t *codes) {
    (void)p; (void)t; (void)key; (void)codes;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pq_gpu_upload(kv_pq_gpu *p, const float *cent, const uint8_t *codes, int lo, int n) {
    (void)p; (void)cent; (void)codes; (void)lo; (void)n;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pq_gpu_search(kv_pq_gpu *p, const float *q, float scale, int lo, int hi, int k, int32_t *idx, int ld,
                           int *count, float *agg, float *raw) {
    (void)p; (void)q; (void)scale; (void)lo; (void)hi; (void)k; (void)idx; (void)ld; (void)count; (void)agg; (void)raw;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_pq_gpu_destroy(kv_pq_gpu *p) { (void)p; }

kv_status kv_pq_gpu_bench(const kv_gpu_bench_spec *s, int M, int C, int iters, const int32_t *picks,
                          const kv_gpu_keys *K, const float *q, kv_gpu_stages *out) {
    (void)s; (void)M; (void)C; (void)iters; (void)picks; (void)K; (void)q; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}
