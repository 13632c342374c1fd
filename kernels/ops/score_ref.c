/* score_ref.c: C reference of the exact score row and the output accumulation (see score.h). All
 * its functions are also built for AVX2 (target_clones, picked at load time;
 * issue 12: the score rows were a tenth of a CPU run): the 8 partial sums
 * are then one 256-bit register instead of two 128-bit ones, each lane
 * doing the same multiply and add in the same order (ISO C never contracts
 * them into an FMA, and the avx2 target has none), so every score keeps
 * its bits. */
#include "score.h"


static inline float dot8(const float *a, const float *b, int d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= d; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < d; i++) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

KV_CLONES float kv_dot_ref(const float *a, const float *b, int d) { return dot8(a, b, d); }

KV_CLONES void kv_scores_ref(const float *q, const float *K, int n, int d, float scale, float *out) {
    for (int i = 0; i < n; i++) out[i] = scale * dot8(q, K + (size_t)i * d, d);
}

/* The oracle's output is T*D of these a step and the protocol's output
 * error a fifth of a CPU run (issue 12), hence the AVX2 clone. */
KV_CLONES void kv_acc_row(double *restrict acc, double w, const float *restrict v, int d) {
    for (int j = 0; j < d; j++) acc[j] += w * v[j];
}
