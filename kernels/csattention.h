/* csattention.h: the C face of kernels/csattention.cu, CSAttention's CUDA
 * path, as one table of launchers. The table is a weak symbol outside nvcc:
 * a build without nvcc leaves it undefined, &kv_csattention_cuda == NULL,
 * and retrievers/csattention.c refuses use_gpu with KV_NO_CUDA.
 *
 * Device state per retriever: centroids [Hkv][m][C][ds] (float32, unit),
 * lists [Hkv][m][C][L] of (int32 index, float32 score) kept as the same
 * weakest-at-root heaps as the C reference (so the try-insert is the same
 * operation), the keys are not kept. Scores are kv_dot_ref's (8 partial
 * sums in a fixed order) so lists and sums are bitwise the CPU's given the
 * same centroids. */
#ifndef KV_CSATTENTION_GPU_H
#define KV_CSATTENTION_GPU_H

#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int Hq, Hkv, T, D, m, C, L, sink;
    int k_max;   /* largest k a search will ask for (0: checked at search) */
} kv_cs_gpu_config;

typedef struct {
    int m, C, iters, pool, missing, weight;
    double alpha;
    uint64_t seed;
} kv_cs_bench_params;

typedef struct {
    /* All device memory for a layer of cfg's shape. */
    kv_status (*create)(const kv_cs_gpu_config *cfg, void **out);
    /* Cosine k-means of every (kv head, subspace) job j = g*m + b on the
     * device: pts [jobs][maxn][ds] unit points (host, npts[j] of them),
     * draws [jobs][C] the job's uniforms in kv_rng order (first: the first
     * centre; then one per k-means++ round), `iters` Lloyd rounds; the
     * distances, the assignment and the sums follow kv_cs_kmeans's
     * arithmetic (double distances in the CPU's order, kv_dot_ref's
     * assignment), only the k-means++ running total and the centroid sums
     * are added in another order (a tree in double). Centroids to host cent
     * [jobs][C][ds] (and kept on the device); fallback[j] = 1 when a round
     * found every point at distance 0 (the CPU then draws again: rerun the
     * job there). */
    kv_status (*kmeans)(void *g, const float *pts, const int *npts, int maxn, int iters, const double *draws,
                        float *cent, int *fallback);
    /* The lists from the prefill keys (host [Hkv][n][D]) and the centroids
     * (host [Hkv][m][C][ds], the C reference's k-means: the cuBLAS k-means
     * of the issue is not written yet): every centroid's top-L over
     * positions [sink, n) (threshold by the shared top-k, ties at the
     * threshold to the smaller positions, as kv_topk_ref), as heaps. */
    kv_status (*build)(void *g, const float *k, int n, const float *cent);
    /* Host copies of the index (the view): cent (nullable) [Hkv][m][C][ds], lidx/lval
     * [Hkv][m][C][L], lcnt [Hkv][m][C]. */
    kv_status (*read_index)(void *g, float *cent, int32_t *lidx, float *lval, int *lcnt);
    /* Try-insert key t (host [Hkv][D]) into every list. */
    kv_status (*append)(void *g, int t, const float *key);
    /* One search, in three parts (`kvbench run` queues the launch behind the other methods', kv_gpu_mark; NULL:
     * not queued): queries q [Hq][D] (host); region [sink, hi); pool 0 none / 1 mean; missing 0 zero / 1 min;
     * weight 0 one / 1 qnorm; want_cand: list the gathered keys on the device. launch queues it and returns;
     * fetch waits for it and writes, per query head h, idx[h*ld ..] (count[h] entries, kv_topk_ref order of
     * the sums); candidates then copies the fetched search's distinct gathered keys to cand[h*cand_ld ..]
     * (ncand[h], any order; nothing when they were not listed), a diagnostic the run copies outside the
     * search's timed part. */
    kv_status (*launch)(void *g, const float *q, int pool, int missing, int weight, int hi, int k, int want_cand,
                        kv_gpu_mark *mark);
    kv_status (*fetch)(void *g, int32_t *idx, int ld, int *count);
    kv_status (*candidates)(void *g, int32_t *cand, int cand_ld, int *ncand);
    /* Or leaves them on the device: *rows lists (Hq, or Hkv with pool), list r at *u + r * *ld, (*counts)[r]
     * long (host; valid until the next search); *u NULL when they were not listed. */
    kv_status (*candidates_dev)(void *g, const int32_t **u, long long *ld, int *rows, const int **counts);
    void (*destroy)(void *g);
    /* kvbench bench --method csattention: lists over the float16 keys K
     * [Hkv][>= n][D] with C centroids per subspace taken as normalised key
     * sub-vectors at evenly spaced positions (the bench hands no queries and
     * the search's cost does not depend on the centroids' values), then
     * per-stage timings of one search. */
    kv_status (*bench)(const kv_gpu_bench_spec *s, const kv_cs_bench_params *p, const kv_gpu_keys *K, const float *q,
                       kv_gpu_stages *out);
} kv_csattention_cuda_ops;

extern const kv_csattention_cuda_ops kv_csattention_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
