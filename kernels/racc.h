/* racc.h: the C face of kernels/racc.cu, RACC's CUDA path: the keys on the
 * device, the compression vote (a batched score of the observation window's
 * queries against the context, masked to the resident tokens, per-query
 * softmax, summed over the window and the group) and the lag-1 retrieval
 * (scores of the group-mean previous query over the region, masked to the
 * evicted tokens, the shared top-k). One table of launchers (kv_racc_cuda;
 * absent without nvcc). */
#ifndef KV_RACC_H
#define KV_RACC_H

#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_racc_gpu kv_racc_gpu;

typedef struct {
    /* window = the observation window (queries per head in a vote). */
    kv_status (*create)(int Hq, int Hkv, int T, int D, int window, kv_racc_gpu **out);
    /* Keys of positions [t0, t0+n) from host x [Hkv][n][D]. */
    kv_status (*write_keys)(kv_racc_gpu *g, int t0, int n, const float *x);
    /* Eviction flags of positions [0, n) from host ev [Hkv][T] (1 = evicted). */
    kv_status (*set_evicted)(kv_racc_gpu *g, int n, const uint8_t *ev);
    /* Vote over positions [lo, hi) for the window queries qw (host
     * [Hkv][G][window][D], the window in position order): per query the
     * softmax of scale * <q, k> over the resident positions of [lo, hi), summed
     * in double over the G*window queries in order, to host vote [Hkv][hi-lo]
     * as float (evicted positions: -inf). */
    kv_status (*vote)(kv_racc_gpu *g, const float *qw, float scale, int lo, int hi, float *vote);
    /* Lag-1 retrieval, queued: for kv head g, the top r[g] (<= KV_GPU_TOPK_MAX,
     * and <= its evicted tokens in [lo, hi)) of scale * <qm_g, k_i> over the
     * evicted positions i of [lo, hi), in kv_topk_ref order; qm host [Hkv][D]
     * (read before it returns); its kernels between kv_gpu_mark_start and
     * kv_gpu_mark_end of mark (NULL: none). Scores bitwise kv_scores_ref's.
     * retrieve_fetch waits for it and writes head g's list to host
     * idx[g*ld + j] (nothing when nothing was queued). */
    kv_status (*retrieve_launch)(kv_racc_gpu *g, const float *qm, float scale, int lo, int hi, const int *r,
        kv_gpu_mark *mark);
    kv_status (*retrieve_fetch)(kv_racc_gpu *g, int32_t *idx, int ld);
    void (*destroy)(kv_racc_gpu *g);
    /* kvbench bench --method racc: on the float16 keys K [Hkv][>= n][D], one
     * compression vote over n tokens (half evicted beforehand: alternate
     * positions) and one retrieval of ceil(beta * n) keys, stage by stage. */
    kv_status (*bench)(const kv_gpu_bench_spec *s, int window, double beta, const kv_gpu_keys *K, const float *q,
        kv_gpu_stages *out);
} kv_racc_cuda_ops;
extern const kv_racc_cuda_ops kv_racc_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
