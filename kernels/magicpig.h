/* magicpig.h: the C face of kernels/magicpig.cu, the CUDA path of the
 * MagicPIG retriever as one table of launchers (kv_magicpig_cuda; absent
 * without nvcc) (retrievers/magicpig.c; issue 5, point 3). A
 * device-resident index (centred keys, key norms, hash codes) with the
 * same numbers as the C reference: every projection and norm is summed in
 * float over the dims in the reference's order without fused multiply-add,
 * so codes and norms are bitwise the CPU's. */
#ifndef KV_MAGICPIG_H
#define KV_MAGICPIG_H

#include "ops/kv_common.h"
#include "ops/kv_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_mp_gpu kv_mp_gpu;

/* The launchers: one table, defined by kernels/magicpig.cu; in a build
 * without nvcc the table is absent (&kv_magicpig_cuda == NULL, see
 * KV_GPU_TABLE in ops/kv_gpu.h) and the retriever stays on the CPU. */
typedef struct {

    /* An index for Hq query heads over Hkv kv heads, positions 0..T-1 of D
     * dims, K bits x L tables; proj [D][K*L] (host) is uploaded; the centre is
     * zero until set. All device memory is taken here. */
    kv_status (*create)(int Hq, int Hkv, int T, int D, int K, int L, const float *proj, kv_mp_gpu **out);
    /* The centre subtracted from every key indexed from now on: mean [Hkv][D] (host). */
    kv_status (*set_mean)(kv_mp_gpu *m, const float *mean);
    /* Centres, measures and hashes positions [t0, t0+n) of every kv head from
     * host keys x[(g*ld + i)*D + j], i in [0, n) (ld: tokens per head in x). */
    kv_status (*index)(kv_mp_gpu *m, int t0, int n, const float *x, int ld);
    /* One search, in halves (`kvbench run` queues the launch behind the other methods', kv_gpu_mark; NULL: not
     * queued): queries q [Hq][D] (host); per query head h the positions i in [lo, hi) whose code equals the
     * query's in >= minc tables, ascending. launch queues it and returns; fetch waits for it and writes at most
     * cap of them: idx[h*cap + j], logw[h*cap + j] (the reference's kv_mp_logw of the cosine of q_h and the
     * centred key), count[h] (host); entries past count[h] may be overwritten (one copy per array, as wide as
     * the longest list). */
    kv_status (*launch)(kv_mp_gpu *m, const float *q, int lo, int hi, int minc, kv_gpu_mark *mark);
    kv_status (*fetch)(kv_mp_gpu *m, int32_t *idx, float *logw, int cap, int *count);
    /* For tests: codes of positions [lo, hi) to codes[(g*L + l)*(hi-lo) + i - lo]
     * and key norms to knorm[g*(hi-lo) + i - lo] (either nullable); the query
     * codes [Hq][L] of q (host) and the collision counts [Hq][hi-lo] of the
     * kernel the search runs, with its tables split over `split` groups of
     * threads per block (1 or 4; 0: as a search of this length would). */
    kv_status (*read_index)(const kv_mp_gpu *m, int lo, int hi, uint16_t *codes, float *knorm);
    kv_status (*counts)(kv_mp_gpu *m, const float *q, int lo, int hi, int split, uint16_t *qcodes,
        uint16_t *counts);
    void (*destroy)(kv_mp_gpu *m);

    /* kvbench bench --method magicpig: builds the index of keys K (float16,
     * [Hkv][>= n][D], all n positions, centre = their mean) and times the
     * stages hash_keys, hash_query, collide, compact, weights and search (the
     * last four in one) for queries q [Hq][D] (host). */
    kv_status (*bench)(const kv_gpu_bench_spec *s, int K, int L, int minc, const float *proj, const kv_gpu_keys *keys,
        const float *q, kv_gpu_stages *out);
} kv_magicpig_cuda_ops;
extern const kv_magicpig_cuda_ops kv_magicpig_cuda KV_GPU_TABLE;

#ifdef __cplusplus
}
#endif
#endif
