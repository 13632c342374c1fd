/* gpu_stub.c: the GPU entry points for a build without nvcc (see
 * kv_gpu.h). Each reports that this binary has no CUDA, so `--device gpu`
 * fails with a clear message and `--device auto` picks the CPU. */
#include <string.h>

#include "kv_gpu.h"

#define KV_NO_CUDA "this kvbench was built without CUDA (nvcc was not found at build time)"

int kv_gpu_compiled(void) { return 0; }

void kv_gpu_probe(kv_gpu_info *info) {
    memset(info, 0, sizeof *info);
    strcpy(info->reason, "built without CUDA");
}

kv_status kv_gpu_attn_create(int Hq, int Hkv, int T, int D, int half, const float *K, const float *V,
                             kv_gpu_attn **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D; (void)half; (void)K; (void)V;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_step(kv_gpu_attn *a, int t, const float *q, float scale, int lo, int hi, int k, float *m,
                           float *Z, float *thr, float *o_full) {
    (void)a; (void)t; (void)q; (void)scale; (void)lo; (void)hi; (void)k; (void)m; (void)Z; (void)thr; (void)o_full;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_gather(kv_gpu_attn *a, const int32_t *idx, const int *count, int cap, float *out) {
    (void)a; (void)idx; (void)count; (void)cap; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_attn_destroy(kv_gpu_attn *a) { (void)a; }
