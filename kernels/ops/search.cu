/* search.cu: the exact retriever's GPU search (issue 2, point 9): for each
 * query head, the k largest exact scores over the retrievable region of
 * device-resident keys, with the indices brought to the host. Two launches:
 * the score kernel (which also records each tile's largest score while the
 * scores are in registers; with KVBENCH_SCORE_HIST=1 also the top-k's first
 * radix histogram: kv_scores_launch) and the
 * cooperative top-k, which reads back only the tiles that can hold a top-k
 * score. Because the score kernel reproduces
 * kv_scores_ref bit for bit and the top-k reproduces kv_topk_ref's order,
 * the selections equal the CPU path's exactly, ties included. All buffers
 * are allocated at create: a search allocates nothing. */
#include <string.h>

#include "kv_cuda.h"

kv_status kv_exact_launch(const kv_dev_kv *K, const float *q, int Hq, float scale, int lo, int n, float *S,
                          long long ld, kv_topk_ws *tk, int k, int32_t *idx, const kv_cuda_dev *dev, cudaStream_t st) {
    const int kk = k < n ? k : n;
    if (kk <= 0) return KV_OK;
    kv_score_extras x = {tk->hist, 0, n, tk->tmax, tk->tmax_ld, 0, -1};
    KV_TRY(kv_scores_launch(K, q, Hq, scale, lo, n, S, ld, &x, dev, st));
    return kv_topk_launch(tk, S, ld, 0, n, Hq, kk, lo, &x, 1, idx, NULL, kk, NULL, st);
}

struct kv_gpu_search {
    int Hq, Hkv, T, D;
    int kk; /* the launched search's list length, for fetch */
    kv_cuda_dev dev;
    float *q, *S, *hq;
    int32_t *idx, *hidx;
    kv_topk_ws tk;
    cudaStream_t st;
};

static kv_status kv_search_init(kv_gpu_search *s) {
    KV_TRY(kv_cuda_dev_query(&s->dev));
    char what[128];
    snprintf(what, sizeof what, "exact-search scores [%d][%d]", s->Hq, s->T);
    KV_CUDA_ALLOC(s->S, (size_t)s->Hq * s->T * sizeof(float), 0, what);
    KV_CUDA_ALLOC(s->q, (size_t)s->Hq * s->D * sizeof(float), 0, "exact-search queries");
    KV_CUDA_ALLOC(s->idx, (size_t)s->Hq * KV_GPU_TOPK_MAX * sizeof(int32_t), 0, "exact-search indices");
    KV_TRY(kv_topk_ws_create(&s->tk, s->Hq, s->T, &s->dev));
    KV_CUDA_ALLOC(s->hq, (size_t)s->Hq * s->D * sizeof(float), 1, "exact-search query staging");
    KV_CUDA_ALLOC(s->hidx, (size_t)s->Hq * KV_GPU_TOPK_MAX * sizeof(int32_t), 1, "exact-search index staging");
    KV_CUDA_TRY(kv_stream_create(&s->st));
    return KV_OK;
}

extern "C" kv_status kv_gpu_search_create(int Hq, int Hkv, int T, int D, kv_gpu_search **out) {
    *out = NULL;
    if (Hkv <= 0 || Hq <= 0 || Hq % Hkv || T <= 0 || D <= 0)
        return kv_fail(KV_ERR_INPUT, "GPU exact search: invalid shape Hq=%d Hkv=%d T=%d D=%d", Hq, Hkv, T, D);
    kv_gpu_search *s = (kv_gpu_search *)kv_calloc(1, sizeof *s, "GPU exact search");
    if (!s) return KV_ERR_NOMEM;
    s->Hq = Hq; s->Hkv = Hkv; s->T = T; s->D = D;
    kv_status st = kv_search_init(s);
    if (st != KV_OK) { kv_gpu_search_destroy(s); return st; }
    *out = s;
    return KV_OK;
}

extern "C" kv_status kv_gpu_search_launch(kv_gpu_search *s, const kv_gpu_keys *K, const float *q, float scale,
                                          int lo, int hi, int k, kv_gpu_mark *mark) {
    const int Hq = s->Hq, n = hi - lo, kk = k < n ? k : n;
    s->kk = 0;
    if (K->a.H != s->Hkv || K->a.D != s->D || hi > K->a.T || lo < 0)
        return kv_fail(KV_ERR_INTERNAL, "GPU exact search: keys [%d][%d][%d] vs search Hkv=%d D=%d, range [%d, %d)",
                       K->a.H, K->a.T, K->a.D, s->Hkv, s->D, lo, hi);
    if (kk <= 0) return KV_OK;
    if (kk > KV_GPU_TOPK_MAX)
        return kv_fail(KV_ERR_INPUT, "GPU exact search: k = %d exceeds the GPU top-k limit %d (use --device cpu)", kk,
                       KV_GPU_TOPK_MAX);
    memcpy(s->hq, q, (size_t)Hq * s->D * sizeof(float));
    KV_CUDA_TRY(cudaMemcpyAsync(s->q, s->hq, (size_t)Hq * s->D * sizeof(float), cudaMemcpyHostToDevice, s->st));
    KV_TRY(kv_gpu_mark_start(mark, s->st));
    KV_TRY(kv_exact_launch(&K->a, s->q, Hq, scale, lo, n, s->S, s->T, &s->tk, kk, s->idx, &s->dev, s->st));
    KV_TRY(kv_gpu_mark_end(mark, s->st));
    KV_CUDA_TRY(cudaMemcpyAsync(s->hidx, s->idx, (size_t)Hq * kk * sizeof(int32_t), cudaMemcpyDeviceToHost, s->st));
    s->kk = kk;
    return KV_OK;
}

extern "C" kv_status kv_gpu_search_fetch(kv_gpu_search *s, int32_t *idx, int ld, int *count) {
    const int Hq = s->Hq, kk = s->kk;
    for (int h = 0; h < Hq; h++) count[h] = 0;
    if (kk <= 0) return KV_OK;
    if (ld < kk) return kv_fail(KV_ERR_INTERNAL, "GPU exact search: list capacity %d < k %d", ld, kk);
    KV_CUDA_TRY(cudaStreamSynchronize(s->st));
    for (int h = 0; h < Hq; h++) {
        memcpy(idx + (size_t)h * ld, s->hidx + (size_t)h * kk, (size_t)kk * sizeof(int32_t));
        count[h] = kk;
    }
    return KV_OK;
}

extern "C" void kv_gpu_search_destroy(kv_gpu_search *s) {
    if (!s) return;
    if (s->st) cudaStreamSynchronize(s->st);
    cudaFree(s->S); cudaFree(s->q); cudaFree(s->idx);
    cudaFreeHost(s->hq); cudaFreeHost(s->hidx);
    kv_topk_ws_destroy(&s->tk);
    if (s->st) cudaStreamDestroy(s->st);
    free(s);
}
