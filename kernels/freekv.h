/* freekv.h: the C face of kernels/freekv.cu, FreeKV's own CUDA pieces (the
 * per-kv-head cosine test, the correction in one device step, and the bench
 * hook); the page summaries, bounds, group-mean softmax and top-k over pages
 * are Quest's launchers (kernels/quest.h), which retrievers/freekv.c calls
 * directly: one copy of the page kernels serves both methods. One table of
 * launchers (kv_freekv_cuda; absent without nvcc). */
#ifndef KV_FREEKV_H
#define KV_FREEKV_H

#include "ops/kv_gpu.h"
#include "quest.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_freekv_gpu kv_freekv_gpu;

typedef struct {
    kv_status (*create)(int Hq, int Hkv, int D, kv_freekv_gpu **out);
    /* flag[g] (host [Hkv]) = (mean over the group of cos(q_h, qprev_h)) < tau,
     * in double as kv_freekv_group_cosine (bitwise its decision); q, qprev
     * host [Hq][D]. */
    kv_status (*cosine)(kv_freekv_gpu *g, const float *q, const float *qprev, double tau, int *flag);
    /* The test and the re-selection in one device step: flag as cosine, and
     * for the kv heads that fire the pool=mean pages of q over pages
     * [0, ncand) of Quest's state qg into host pages [Hkv][kp] (kv_topk_ref
     * order; the rows of heads that do not fire are unspecified). */
    kv_status (*correct)(kv_freekv_gpu *g, kv_quest_gpu *qg, const float *q, const float *qprev, double tau,
        float scale, int ncand, int kp, int *flag, int32_t *pages);
    void (*destroy)(kv_freekv_gpu *g);
    /* kvbench bench --method freekv: Quest's pool=mean stages over float16
     * summaries of K (the speculative selection, off the critical path),
     * then the cosine test and the correction (test + flagged re-selection
     * with 0, 1 or all kv heads firing) that is on the critical path. */
    kv_status (*bench)(const kv_gpu_bench_spec *s, int page, const kv_gpu_keys *K, const float *q,
        kv_gpu_stages *out);
} kv_freekv_cuda_ops;
extern const kv_freekv_cuda_ops kv_freekv_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
