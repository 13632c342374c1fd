/* pariskv.h: the C face of kernels/pariskv.cu, pariskv_bucket.cu and
 * pariskv_cluster.cu, the CUDA path of the ParisKV retriever
 * (retrievers/pariskv.c), as one table of launchers (kv_pariskv_cuda;
 * absent without nvcc), and the tier targets the C reference shares with
 * it. A kv_pariskv_gpu holds one layer's index on the device (centroid
 * ids, 4-bit codes, bf16 weights, per-centroid counts) and the scratch of
 * one search; every device allocation happens in create. */
#ifndef KV_PARISKV_H
#define KV_PARISKV_H

#include <math.h>

#include "ops/bf16.h"
#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_PARISKV_TIERS 6

/* The tiers of a step, as the released fused collision kernel: walking the
 * centroids in rank order, one belongs to tier t while the keys of those
 * ranked before it are below target[t] = ceil(n * rho * f_t), in double in
 * that order, f = .05 .15 .30 .50 .75 1 (multi; else one tier, f = 1).
 * Returns the number of tiers. The C reference (pariskv_codec.c) and the
 * GPU's tier kernel both take their targets from here. */
static inline int kv_pariskv_tier_targets(int n, double rho, int multi, double target[KV_PARISKV_TIERS]) {
    static const double frac[KV_PARISKV_TIERS] = {0.05, 0.15, 0.30, 0.50, 0.75, 1.0};
    const int nt = multi ? KV_PARISKV_TIERS : 1;
    for (int t = 0; t < nt; t++) target[t] = ceil((double)n * rho * (multi ? frac[t] : 1.0));
    return nt;
}

typedef struct kv_pariskv_gpu kv_pariskv_gpu;

/* The layer and codec (normalise + SRHT, analytic sign centroids, the
 * default codec of pariskv.c). dp (power of two, >= 32) = nb * m, m in
 * {2, 4, 8}; signs [dp], level [8], thr [7] as kv_pariskv_codec. rows = Hkv
 * (pool=mean: one retrieval per kv head from the mean of its group's
 * queries) or Hq (pool=none). max_update: most keys one encode_host call
 * uploads at once (larger calls are chunked). */
typedef struct {
    int Hq, Hkv, T, D, dp, m, nb, rows, max_update;
    const float *signs, *level, *thr;
} kv_pariskv_gpu_cfg;

/* One search step: searchable keys [lo, end), indexed keys [lo, n_idx)
 * (the indexed keys in [end, n_idx) are taken out of the counts), collision
 * fraction rho, multi (6 tiers) or binary tiers, C candidates per row, top k.
 * Out (host): out[r*k + j], j < min(k, C), the selected positions of row r;
 * cand[r*cand_ld + j], j < min(C, cand_ld), its candidates in ascending
 * position order. */
typedef struct {
    int lo, end, n_idx, C, k, multi;
    double rho;
} kv_pariskv_gpu_step;

/* The launchers: one table, defined by kernels/pariskv.cu; in a build
 * without nvcc the table is absent (&kv_pariskv_cuda == NULL, see
 * KV_GPU_TABLE in ops/kv_gpu.h) and the retriever stays on the CPU. */
typedef struct {
    /* Every device allocation happens here. */
    kv_status (*create)(const kv_pariskv_gpu_cfg *cfg, kv_pariskv_gpu **out);
    void (*destroy)(kv_pariskv_gpu *p);

    /* Encodes positions [a, b) of every kv head into the index and adds them
     * to the centroid counts; the key of (g, i) is host float32 at
     * src + g * gstride + (i - a) * D. */
    kv_status (*encode_host)(kv_pariskv_gpu *p, int a, int b, const float *src, size_t gstride);

    /* One search step of s (above) for q [Hq][D] host; cand may be NULL (then only out is copied back). */
    kv_status (*search)(kv_pariskv_gpu *p, const float *q, const kv_pariskv_gpu_step *s, int32_t *out,
        int32_t *cand, int cand_ld);
    /* The same in halves (kvbench run, kv_gpu_mark): launch queues the search, fetch waits for it and copies. */
    kv_status (*launch)(kv_pariskv_gpu *p, const float *q, const kv_pariskv_gpu_step *s, kv_gpu_mark *mark);
    kv_status (*fetch)(kv_pariskv_gpu *p, int32_t *out, int32_t *cand, int cand_ld);
    /* The last search's candidates, as search's cand (kvbench run copies them after the timed search). */
    kv_status (*candidates)(kv_pariskv_gpu *p, int32_t *cand, int cand_ld);
    /* The same lists where they are: row r at *cand + r * *ld on the device, until the next search. */
    void (*candidates_dev)(const kv_pariskv_gpu *p, const int32_t **cand, long long *ld);

    /* Test hooks: the index of positions [a, b) of kv head g in the CPU's
     * token-major layout (ids [n][nb], code [n][dp/2], w [n][nb]); counts
     * [Hkv][nb][2^m] (each nullable), and the last search's collision scores
     * (scores[r*(end-lo) + i - lo]) and rerank scores (csc[r*C + j]). */
    kv_status (*read_index)(kv_pariskv_gpu *p, int g, int a, int b, uint8_t *ids, uint8_t *code, kv_bf16 *w,
        int32_t *counts);
    kv_status (*read_last)(kv_pariskv_gpu *p, uint16_t *scores, float *csc);

    /* The bucket top-k alone on host arrays: rows of score[r*n + i] in
     * [0, max_score], max_score < 4096, out[r*c + j] exactly kv_pariskv_bucket_topk's;
     * fold 1: each tile's compaction finds its own offset, 0: a scan kernel first
     * (the search folds where the compaction's grid is one wave). */
    kv_status (*bucket_topk_host)(const uint16_t *score, int R, int n, int max_score, int c, int fold, int32_t *out);

    /* kvbench bench --method pariskv: builds the index of positions [0, n) from
     * K (device, [Hkv][>= n][D]), timing the encode, then each stage of one
     * search of q ([Hq][D] host) over [0, n) with (beta, rho, multi); see
     * kv_retriever.h's bench_gpu. */
    kv_status (*bench)(const kv_pariskv_gpu_cfg *cfg, const kv_gpu_bench_spec *spec, const kv_gpu_keys *K,
        const float *q, double beta, double rho, int multi, kv_gpu_stages *out);
} kv_pariskv_cuda_ops;
extern const kv_pariskv_cuda_ops kv_pariskv_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
