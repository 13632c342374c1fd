/* test_sampled.c: the example retriever (retrievers/sampled.c) against
 * brute force. frac = 1 must select exactly what a double-precision brute
 * force top-k of every key selects; frac < 1 must select the brute-force
 * top-k of the keys it reports as its sample, keep every key's membership
 * fixed as the context grows, and sample about frac of the keys. The
 * conformance test (test_core.c) covers the contract for it as for every
 * registered method. */
#include <stdlib.h>

#include "kv_test.h"

/* Brute force in double: the top-k positions of head h at step t among the
 * region's positions with allow[i] (NULL: all), larger score first, smaller
 * position among equals; returns the count. */
static int brute_topk(const kv_layer *L, int h, int t, int lo, int hi, const uint8_t *allow, int k, float scale,
                      int32_t *out, double *score) {
    int G = L->Hq / L->Hkv, D = L->D, n = 0;
    const float *q = L->q + ((size_t)h * L->T + t) * D;
    for (int i = lo; i < hi; i++) {
        const float *key = L->k + ((size_t)(h / G) * L->T + i) * D;
        double d = 0;
        for (int j = 0; j < D; j++) d += (double)q[j] * key[j];
        score[i] = allow && !allow[i] ? -INFINITY : d * scale;
        n += !allow || allow[i];
    }
    int c = k < n ? k : n;
    for (int j = 0; j < c; j++) {
        int best = -1;
        for (int i = lo; i < hi; i++)
            if (score[i] > -INFINITY && (best < 0 || score[i] > score[best])) best = i;
        out[j] = best;
        score[best] = -INFINITY;
    }
    return c;
}

static int same_set(const int32_t *a, const int32_t *b, int n) {
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int j = 0; j < n && !found; j++) found = a[i] == b[j];
        if (!found) return 0;
    }
    return 1;
}

int test_sampled_full_is_exact(void) {
    kv_layer L;
    int T = 700, P = 500, sink = 4, local = 16, k = 40;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 5, &L));
    const char *params[] = {"frac=1"};
    kv_test_driver d;
    CHECK_OK(kv_test_driver_open(&d, "sampled", params, 1, &L, P, sink, local, k));
    int32_t want[64];
    double *score = malloc((size_t)T * sizeof(double));
    for (int t = P; t < T; t += 23) {
        CHECK_OK(kv_test_driver_step(&d, t, k));
        for (int h = 0; h < L.Hq; h++) {
            int c = brute_topk(&L, h, t, sink, t + 1 - local, NULL, k, d.sh.softmax_scale, want, score);
            CHECK(d.sel.count[h] == c, "step %d head %d: %d selected, want %d", t, h, d.sel.count[h], c);
            CHECK(same_set(d.sel.idx + (size_t)h * d.sel.cap, want, c), "step %d head %d: not the exact top-%d", t, h, k);
            CHECK(d.sel.n_cand[h] == t + 1 - local - sink, "step %d: sample of %d keys, want the whole region", t,
                  d.sel.n_cand[h]);
        }
    }
    free(score);
    kv_test_driver_close(&d);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_sampled_topk_of_its_sample(void) {
    kv_layer L;
    int T = 4000, P = 3000, sink = 4, local = 16, k = 30;
    double frac = 0.25;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 6, &L));
    const char *params[] = {"frac=0.25", "seed=3"};
    kv_test_driver d;
    CHECK_OK(kv_test_driver_open(&d, "sampled", params, 2, &L, P, sink, local, k));
    uint8_t *in = calloc((size_t)T, 1), *seen = calloc((size_t)T, 1);
    double *score = malloc((size_t)T * sizeof(double));
    int32_t want[64];
    for (int t = P; t < T; t += 97) {
        CHECK_OK(kv_test_driver_step(&d, t, k));
        int lo = sink, hi = t + 1 - local;
        for (int h = 0; h < L.Hq; h++) {
            /* the sample is the same for every head, inside the region, and no key leaves or joins it later */
            uint8_t *mark = calloc((size_t)T, 1);
            const int32_t *cand = d.sel.cand + (size_t)h * d.sel.cand_cap;
            for (int j = 0; j < d.sel.n_cand[h]; j++) {
                CHECK(cand[j] >= lo && cand[j] < hi, "step %d: sampled key %d outside [%d, %d)", t, cand[j], lo, hi);
                mark[cand[j]] = 1;
            }
            for (int i = lo; i < hi; i++) {
                if (seen[i]) CHECK(mark[i] == in[i], "step %d: key %d changed membership", t, i);
                in[i] = mark[i];
                seen[i] = 1;
            }
            free(mark);
            int c = brute_topk(&L, h, t, lo, hi, in, k, d.sh.softmax_scale, want, score);
            CHECK(d.sel.count[h] == c, "step %d head %d: %d selected, want %d", t, h, d.sel.count[h], c);
            CHECK(same_set(d.sel.idx + (size_t)h * d.sel.cap, want, c),
                  "step %d head %d: not the top-%d of its sample", t, h, k);
        }
    }
    /* about frac of the keys: within 4 binomial standard deviations */
    int n = 0, m = 0;
    for (int i = 0; i < T; i++) n += seen[i], m += in[i];
    double sd = sqrt(n * frac * (1 - frac));
    CHECK(fabs(m - n * frac) <= 4 * sd, "%d of %d keys sampled, want about %.0f", m, n, n * frac);
    free(in); free(seen); free(score);
    kv_test_driver_close(&d);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}
