/* score_ref.c: C reference of the exact score row (see score.h). */
#include "score.h"

float kv_dot_ref(const float *a, const float *b, int d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= d; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < d; i++) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void kv_scores_ref(const float *q, const float *K, int n, int d, float scale, float *out) {
    for (int i = 0; i < n; i++) out[i] = scale * kv_dot_ref(q, K + (size_t)i * d, d);
}
