/* score.h: exact attention scores, C reference. The oracle (cli/) and the
 * exact retriever call the same function, so their scores are bitwise
 * equal and the oracle's recall of itself is exactly 1. */
#ifndef KV_SCORE_H
#define KV_SCORE_H

#include "kv_common.h"

/* A hot C loop also built for AVX2, picked at load time (GCC's
 * target_clones): the same operations in the same order (ISO C never
 * contracts a multiply and an add into an FMA, and the avx2 target has
 * none), so every result keeps its bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__CUDACC__)
#define KV_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KV_CLONES
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Dot product with 8 float partial sums in a fixed order (deterministic,
 * vectorisable without -ffast-math). */
float kv_dot_ref(const float *a, const float *b, int d);
/* out[i] = scale * <q, K[i]> for i in [0, n); K is [n][d]. */
void kv_scores_ref(const float *q, const float *K, int n, int d, float scale, float *out);
/* acc[j] += w * v[j] for j in [0, d), in double: the attention outputs of
 * the oracle and the protocol (one multiply and one add per element). */
void kv_acc_row(double *acc, double w, const float *v, int d);

#ifdef __cplusplus
}
#endif
#endif
