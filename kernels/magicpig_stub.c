/* magicpig_stub.c: the MagicPIG GPU entry points (magicpig_gpu.h) for a
 * build without nvcc; each reports that this binary has no CUDA, so the
 * retriever's GPU path and its bench fail with a clear message. */
#include "magicpig_gpu.h"

kv_status kv_mp_gpu_create(int Hq, int Hkv, int T, int D, int K, int L, const float *proj, kv_mp_gpu **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D; (void)K; (void)L; (void)proj;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_mp_gpu_set_mean(kv_mp_gpu *m, const float *mean) {
    (void)m; (void)mean;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_mp_gpu_index(kv_mp_gpu *m, int t0, int n, const float *x, int ld) {
    (void)m; (void)t0; (void)n; (void)x; (void)ld;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_mp_gpu_search(kv_mp_gpu *m, const float *q, int lo, int hi, int minc, int32_t *idx, float *logw, int cap,
                           int *count) {
    (void)m; (void)q; (void)lo; (void)hi; (void)minc; (void)idx; (void)logw; (void)cap; (void)count;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_mp_gpu_read_index(const kv_mp_gpu *m, int lo, int hi, uint16_t *codes, float *knorm) {
    (void)m; (void)lo; (void)hi; (void)codes; (void)knorm;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_mp_gpu_counts(kv_mp_gpu *m, const float *q, int lo, int hi, int split, uint16_t *qcodes,
                           uint16_t *counts) {
    (void)m; (void)q; (void)lo; (void)hi; (void)split; (void)qcodes; (void)counts;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_mp_gpu_destroy(kv_mp_gpu *m) { (void)m; }

kv_status kv_mp_gpu_bench(const kv_gpu_bench_spec *s, int K, int L, int minc, const float *proj, const kv_gpu_keys *keys,
                          const float *q, kv_gpu_stages *out) {
    (void)s; (void)K; (void)L; (void)minc; (void)proj; (void)keys; (void)q; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}
