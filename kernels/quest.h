/* quest.h: the C face of kernels/quest.cu, Quest's CUDA path (page
 * summaries, the bound scan with pool none|mean|max, GPU top-k over pages),
 * as one table of launchers (kv_quest_cuda; absent without nvcc). Page j of a kv head covers
 * positions [sink + j*page, sink + (j+1)*page), as in retrievers/quest.c. */
#ifndef KV_QUEST_H
#define KV_QUEST_H

#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_quest_gpu kv_quest_gpu;
/* Called by bench_with after its stages, with g's summaries built and its
 * launches on the timer's stream (timer: a kv_bench_timer, kernels/ops/kv_cuda.h);
 * np pages, kp selected per kv head; appends its stages to out. */
typedef kv_status (*kv_quest_bench_hook)(void *ctx, kv_quest_gpu *g, void *timer, int np, int kp,
                                         kv_gpu_stages *out);

/* The launchers: one table, defined by kernels/quest.cu; in a build
 * without nvcc the table is absent (&kv_quest_cuda == NULL, see
 * KV_GPU_TABLE in ops/kv_gpu.h) and the retriever stays on the CPU. */
typedef struct {

    /* max_pages pages at most per kv head; all search-time device memory here.
     * half = 1 stores the page min/max as float16 (exact only for float16 keys:
     * the bench, and the retrievers on a float16 layer), 0 as float32. */
    kv_status (*create)(int Hq, int Hkv, int T, int D, int page, int sink, int max_pages, int half,
        kv_quest_gpu **out);
    /* Summaries of the prefill keys k [Hkv][n][D] (host): full pages written,
     * the tokens of the partial last page kept as a running min/max. */
    kv_status (*build)(kv_quest_gpu *g, const float *k, int n);
    /* Key of position t (host [Hkv][D]); t >= sink, positions in order. */
    kv_status (*append)(kv_quest_gpu *g, int t, const float *key);
    /* Page min/max of pages [0, npages) to host [Hkv][npages][D] each. */
    kv_status (*summaries)(kv_quest_gpu *g, int npages, float *kmin, float *kmax);
    /* Bounds of pages [0, ncand) for q [Hq][D] (host); pool 0 none, 1 mean, 2
     * max; the top kp pages per list (Hq lists for none, Hkv for mean/max) in
     * kv_topk_ref order to host pages[l*kp + j]. bound (nullable): host
     * [Hq][ncand] of the raw bounds. 1 <= kp <= min(ncand, KV_GPU_TOPK_MAX). */
    kv_status (*search)(kv_quest_gpu *g, const float *q, float scale, int pool, int ncand, int kp,
        int32_t *pages, float *bound);
    /* The same without bounds, in halves (kvbench run, kv_gpu_mark): launch queues the search, fetch waits for
     * it and writes pages. */
    kv_status (*launch)(kv_quest_gpu *g, const float *q, float scale, int pool, int ncand, int kp, kv_gpu_mark *mark);
    kv_status (*fetch)(kv_quest_gpu *g, int32_t *pages);
    /* pool=mean selection with device queries qd [Hq][D] of only the kv heads
     * whose device flag[g] != 0 (FreeKV's correction without a host round
     * trip), on stream st (NULL: the state's), no sync; pages (host, nullable)
     * gets the [Hkv][kp] page ids by an async copy on st, valid for the
     * flagged kv heads. Groups of 1, 2, 4, 8, kp <= 16, the pipelined path
     * (see flagged_ok); else an error. */
    kv_status (*select_flagged)(kv_quest_gpu *g, const float *qd, float scale, int ncand, int kp, const int *flag,
        void *st, int32_t *pages);
    /* 1 when select_flagged handles kp pages per kv head for this state. */
    int (*flagged_ok)(const kv_quest_gpu *g, int kp);
    /* bench (below), then hook (nullable) while the state lives (FreeKV's correction stages). */
    kv_status (*bench_with)(const kv_gpu_bench_spec *s, int page, int pool, const kv_gpu_keys *K, const float *q,
        kv_quest_bench_hook hook, void *ctx, kv_gpu_stages *out);
    void (*destroy)(kv_quest_gpu *g);
    /* kvbench bench --method quest: summaries of the float16 keys K
     * [Hkv][>= n][D] (sink 0, float16 min/max), then per-stage timings. */
    kv_status (*bench)(const kv_gpu_bench_spec *s, int page, int pool, const kv_gpu_keys *K, const float *q,
        kv_gpu_stages *out);
    /* build from float16 bits [Hkv][ld][D] (rows [0, n) of each head; a layer's float16 form in place). */
    kv_status (*build_half)(kv_quest_gpu *g, const uint16_t *k, int n, long long ld);
} kv_quest_cuda_ops;
extern const kv_quest_cuda_ops kv_quest_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
