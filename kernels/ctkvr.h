/* ctkvr.h: the C face of kernels/ctkvr.cu, CTKVR's CUDA path, as one table
 * of launchers (a weak symbol outside nvcc: without nvcc &kv_ctkvr_cuda ==
 * NULL and retrievers/ctkvr.c refuses use_gpu with KV_NO_CUDA).
 *
 * Device state: the keys [Hkv][T][D] (float32), the slot queries [C][Hq][D]
 * and their norms, the lists [Hkv][C][rho] (int32, best first) and counts.
 * Scores are kv_dot_ref's (bitwise), lse in double, the ranking value
 * float(s - lse) max over the group: the C reference's numbers, up to the
 * order of the lse sum (documented ties). */
#ifndef KV_CTKVR_GPU_H
#define KV_CTKVR_GPU_H

#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int Hq, Hkv, T, D, C, rho, sink;
    float scale;
} kv_ctkvr_gpu_config;

typedef struct {
    int C, rho, cp;
    uint64_t seed;
} kv_ctkvr_bench_params;

typedef struct {
    kv_status (*create)(const kv_ctkvr_gpu_config *cfg, void **out);
    /* Keys [Hkv][n][D] (host) uploaded; slot queries cq [nc][Hq][D] (host);
     * the list of every slot over positions [sink, idx_hi). */
    kv_status (*build)(void *g, const float *k, int n, const float *cq, int nc, int idx_hi);
    /* The lists to host lidx [Hkv][C][rho], lcnt [Hkv][C]. */
    kv_status (*read_lists)(void *g, int32_t *lidx, int *lcnt);
    kv_status (*append)(void *g, int t, const float *key);
    /* One search for q [Hq][D] (host), in halves (`kvbench run` queues the launch behind the other methods',
     * kv_gpu_mark; NULL: not queued): top cp slots per kv head, their lists' union inside [sink, hi) plus every
     * position in [gen_lo, hi), rerank, top k. launch queues it and returns; fetch waits for it and writes, per
     * kv head g: idx[g*ld ..] count[g], cand[g*cand_ld ..] ncand[g] (ascending positions). dcu 1:
     * dcu_list[g*rho ..] dcu_cnt[g] = the top rho of the rerank; 2: of all of [sink, oracle_hi). */
    kv_status (*launch)(void *g, const float *q, int cp, int k, int hi, int gen_lo, int dcu, int oracle_hi,
                        kv_gpu_mark *mark);
    kv_status (*fetch)(void *g, int32_t *idx, int ld, int *count, int32_t *cand, int cand_ld, int *ncand,
                       int32_t *dcu_list, int *dcu_cnt);
    /* Writes the fetched search's DCU lists and its queries (already on the device) into slot `slot`. */
    kv_status (*dcu_commit)(void *g, int slot);
    void (*destroy)(void *g);
    /* kvbench bench --method ctkvr: lists from C evenly spaced query
     * stand-ins (the bench hands no prefill queries: the keys at those
     * positions, documented), then per-stage timings of one search. */
    kv_status (*bench)(const kv_gpu_bench_spec *s, const kv_ctkvr_bench_params *p, const kv_gpu_keys *K,
                       const float *q, kv_gpu_stages *out);
} kv_ctkvr_cuda_ops;

extern const kv_ctkvr_cuda_ops kv_ctkvr_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
