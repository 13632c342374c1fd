/* quest_stub.c: kernels/quest_gpu.h for a build without nvcc; every entry
 * point reports that this binary has no CUDA. */
#include "quest_gpu.h"

kv_status kv_quest_gpu_create(int Hq, int Hkv, int T, int D, int page, int sink, int max_pages, int half,
                              kv_quest_gpu **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D; (void)page; (void)sink; (void)max_pages; (void)half;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_quest_gpu_build(kv_quest_gpu *g, const float *k, int n) {
    (void)g; (void)k; (void)n;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_quest_gpu_append(kv_quest_gpu *g, int t, const float *key) {
    (void)g; (void)t; (void)key;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_quest_gpu_summaries(kv_quest_gpu *g, int npages, float *kmin, float *kmax) {
    (void)g; (void)npages; (void)kmin; (void)kmax;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_quest_gpu_search(kv_quest_gpu *g, const float *q, float scale, int pool, int ncand, int kp,
                              int32_t *pages, float *bound) {
    (void)g; (void)q; (void)scale; (void)pool; (void)ncand; (void)kp; (void)pages; (void)bound;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_quest_gpu_destroy(kv_quest_gpu *g) { (void)g; }

kv_status kv_quest_gpu_bench(const kv_gpu_bench_spec *s, int page, int pool, const kv_gpu_keys *K, const float *q,
                             kv_gpu_stages *out) {
    (void)s; (void)page; (void)pool; (void)K; (void)q; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}
