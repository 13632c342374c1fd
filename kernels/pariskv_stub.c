/* pariskv_stub.c: the entry points of kernels/pariskv.cu (pariskv_gpu.h)
 * for a build without nvcc: each reports that this binary has no CUDA, so
 * the ParisKV retriever stays on its CPU path. */
#include <stddef.h>

#include "pariskv_gpu.h"

kv_status kv_pariskv_gpu_create(const kv_pariskv_gpu_cfg *cfg, kv_pariskv_gpu **out) {
    (void)cfg;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_pariskv_gpu_destroy(kv_pariskv_gpu *p) { (void)p; }

kv_status kv_pariskv_gpu_encode_host(kv_pariskv_gpu *p, int a, int b, const float *src, size_t gstride) {
    (void)p; (void)a; (void)b; (void)src; (void)gstride;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pariskv_gpu_search(kv_pariskv_gpu *p, const float *q, const kv_pariskv_gpu_step *s, int32_t *out,
                                int32_t *cand, int cand_ld) {
    (void)p; (void)q; (void)s; (void)out; (void)cand; (void)cand_ld;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pariskv_gpu_read_index(kv_pariskv_gpu *p, int g, int a, int b, uint8_t *ids, uint8_t *code, float *w,
                                    int32_t *counts) {
    (void)p; (void)g; (void)a; (void)b; (void)ids; (void)code; (void)w; (void)counts;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pariskv_gpu_read_last(kv_pariskv_gpu *p, uint16_t *scores, float *csc) {
    (void)p; (void)scores; (void)csc;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pariskv_gpu_bucket_topk_host(const uint16_t *score, int R, int n, int max_score, int c, int32_t *out) {
    (void)score; (void)R; (void)n; (void)max_score; (void)c; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_pariskv_gpu_bench(const kv_pariskv_gpu_cfg *cfg, const kv_gpu_bench_spec *spec, const kv_gpu_keys *K,
                               const float *q, double beta, double rho, int multi, kv_gpu_stages *out) {
    (void)cfg; (void)spec; (void)K; (void)q; (void)beta; (void)rho; (void)multi; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}
