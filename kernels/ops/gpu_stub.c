/* gpu_stub.c: the GPU entry points for a build without nvcc (see
 * kv_gpu.h). Each reports that this binary has no CUDA, so `--device gpu`
 * fails with a clear message and `--device auto` picks the CPU. */
#include <string.h>

#include "kv_gpu.h"


int kv_gpu_compiled(void) { return 0; }

void kv_gpu_probe(kv_gpu_info *info) {
    memset(info, 0, sizeof *info);
    strcpy(info->reason, "built without CUDA");
}

size_t kv_gpu_mem_free(void) { return 0; }

kv_status kv_gpu_attn_create(int Hq, int Hkv, int T, int D, int half, const float *K, const float *V,
                             kv_gpu_attn **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D; (void)half; (void)K; (void)V;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_step(kv_gpu_attn *a, int t, const float *q, float scale, int lo, int hi, int k, float *m,
                           float *Z, float *thr, float *o_full, int split, int *ntop) {
    (void)a; (void)t; (void)q; (void)scale; (void)lo; (void)hi; (void)k; (void)m; (void)Z; (void)thr; (void)o_full;
    (void)split; (void)ntop;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_gather(kv_gpu_attn *a, const int32_t *idx, const int *count, int cap, float *out) {
    (void)a; (void)idx; (void)count; (void)cap; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_scores(kv_gpu_attn *a, const float **rows, int *n) {
    (void)a;
    *rows = NULL;
    *n = 0;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_attn_destroy(kv_gpu_attn *a) { (void)a; }
const kv_gpu_keys *kv_gpu_attn_keys(const kv_gpu_attn *a) { (void)a; return NULL; }

kv_status kv_gpu_attn_multi_init(kv_gpu_attn *a, const int *ks, int nk, int profile) {
    (void)a; (void)ks; (void)nk; (void)profile;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_multi(kv_gpu_attn *a, int lo, int hi, int split, const double *ptarget, float *thr, int *ntop,
                            int *budget, int *uncertain) {
    (void)a; (void)lo; (void)hi; (void)split; (void)ptarget; (void)thr; (void)ntop; (void)budget; (void)uncertain;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_row(kv_gpu_attn *a, int h, float *out) {
    (void)a; (void)h; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_diag_slots(kv_gpu_attn *a, int n_slots) {
    (void)a; (void)n_slots;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_diag(kv_gpu_attn *a, int slot, const kv_gpu_diag_in *in) {
    (void)a; (void)slot; (void)in;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_attn_times(const kv_gpu_attn *a, double *step_s, double *eval_s, double *diag_s) {
    (void)a;
    *step_s = *eval_s = *diag_s = 0;
}

kv_status kv_gpu_attn_diag_flush(kv_gpu_attn *a) {
    (void)a;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_diag_wait(kv_gpu_attn *a) {
    (void)a;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

const kv_gpu_diag_row *kv_gpu_attn_diag_take(kv_gpu_attn *a, int slot, int *t, float *metric) {
    (void)a; (void)slot; (void)t; (void)metric;
    return NULL;
}

kv_status kv_gpu_keys_create(int H, int T, int D, int half, kv_gpu_keys **out) {
    (void)H; (void)T; (void)D; (void)half;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_keys_write(kv_gpu_keys *k, int t0, int n, const float *x) {
    (void)k; (void)t0; (void)n; (void)x;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_keys_write_half(kv_gpu_keys *k, int t0, int n, const uint16_t *x) {
    (void)k; (void)t0; (void)n; (void)x;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_keys_write_half_ld(kv_gpu_keys *k, int t0, int n, const uint16_t *x, long long ld) {
    (void)k; (void)t0; (void)n; (void)x; (void)ld;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_attn_create_half(int Hq, int Hkv, int T, int D, const uint16_t *K, const uint16_t *V,
                                  kv_gpu_attn **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D; (void)K; (void)V;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

int kv_gpu_keys_elem_bytes(const kv_gpu_keys *k) { (void)k; return 4; }

void kv_gpu_keys_destroy(kv_gpu_keys *k) { (void)k; }

kv_status kv_gpu_search_create(int Hq, int Hkv, int T, int D, kv_gpu_search **out) {
    (void)Hq; (void)Hkv; (void)T; (void)D;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_search_launch(kv_gpu_search *s, const kv_gpu_keys *K, const float *q, float scale, int lo, int hi,
                               int k, kv_gpu_mark *mark) {
    (void)s; (void)K; (void)q; (void)scale; (void)lo; (void)hi; (void)k; (void)mark;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_search_fetch(kv_gpu_search *s, int32_t *idx, int ld, int *count) {
    (void)s; (void)idx; (void)ld; (void)count;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_search_destroy(kv_gpu_search *s) { (void)s; }

kv_status kv_gpu_scores_host(const float *q, const float *K, int Hq, int Hkv, int T, int D, int half, float scale,
                             int lo, int hi, float *out) {
    (void)q; (void)K; (void)Hq; (void)Hkv; (void)T; (void)D; (void)half; (void)scale; (void)lo; (void)hi; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_topk_host(const float *scores, int R, int n, int k, int base, int32_t *idx, float *val,
                           float *kth) {
    (void)scores; (void)R; (void)n; (void)k; (void)base; (void)idx; (void)val; (void)kth;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_bench_run(const kv_gpu_bench_spec *s, const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q,
                           kv_gpu_bench_out *out) {
    (void)s; (void)K; (void)V; (void)q; (void)out;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_bench_stream_create(void **out) {
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_bench_stream_destroy(void *st) { (void)st; }

kv_status kv_gpu_copy_bandwidth(size_t bytes, int reps, double *gbs) {
    (void)bytes; (void)reps;
    *gbs = 0;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

kv_status kv_gpu_upload_ints(const int32_t *x, size_t n, int32_t **out) {
    (void)x; (void)n;
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_free(void *p) { (void)p; }

int kv_gpu_host_pin(void *p, size_t bytes) {
    (void)p; (void)bytes;
    return 0;
}

void kv_gpu_host_unpin(void *p) { (void)p; }

kv_status kv_gpu_mark_create(kv_gpu_mark **out) {
    *out = NULL;
    return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

void kv_gpu_mark_destroy(kv_gpu_mark *m) { (void)m; }

void kv_gpu_mark_after(kv_gpu_mark *m, const kv_gpu_mark *prev) { (void)m; (void)prev; }

kv_status kv_gpu_mark_start(kv_gpu_mark *m, void *stream) {
    (void)stream;
    return m ? kv_fail(KV_ERR_GPU, KV_NO_CUDA) : KV_OK;
}

kv_status kv_gpu_mark_end(kv_gpu_mark *m, void *stream) {
    (void)stream;
    return m ? kv_fail(KV_ERR_GPU, KV_NO_CUDA) : KV_OK;
}

kv_status kv_gpu_mark_seconds(kv_gpu_mark *m, double *s) {
    *s = 0;
    return m ? kv_fail(KV_ERR_GPU, KV_NO_CUDA) : KV_OK;
}
