/* test_baselines.c: the published baselines (PQCache, Quest, MagicPIG)
 * piece by piece against brute forces written here: PQ codes are the
 * nearest centroids, k-means lowers the quantisation error, ADC is the sum
 * of the sub-lookups; Quest's page bound bounds every key of its page, the
 * selected pages are the top pages by bound (for each pooling) and the
 * partial page is reported as extra; SimHash collision counts equal a count
 * over explicitly computed sign bits, the importance weight matches the
 * formula on hand cases, and MagicPIG returns exactly the keys with enough
 * collisions. The conformance suite (test_protocol.c) covers budget,
 * region, duplicates, determinism and causality at default parameters;
 * baselines_param_variants repeats the contract checks at other settings. */
#include <stdlib.h>
#include <string.h>

#include "../datasets/kv_trace.h"
#include "../kernels/ops/score.h"
#include "../retrievers/baselines.h"
#include "kv_test.h"

/* ---- a small driver: one method over one in-memory layer ---- */


static const float *key_of(const kv_layer *L, int g, int t) { return L->k + ((size_t)g * L->T + t) * L->D; }
static const float *query_of(const kv_layer *L, int h, int t) { return L->q + ((size_t)h * L->T + t) * L->D; }

static void fill_normal(kv_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)kv_rng_normal(r);
}

/* ---- PQCache ---- */

/* Squared distance of x to every centroid (transposed [d][C]) in double;
 * returns the nearest, *gap = distance of `code` minus the nearest's. */
static int brute_nearest(const float *x, const float *cent, int C, int d, int code, double *gap, double *best_d) {
    int best = 0;
    double bd = 0, cd = 0;
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int j = 0; j < d; j++) {
            double e = (double)x[j] - cent[(size_t)j * C + c];
            s += e * e;
        }
        if (c == 0 || s < bd) { bd = s; best = c; }
        if (c == code) cd = s;
    }
    *gap = cd - bd;
    *best_d = bd;
    return best;
}

/* every code names the nearest centroid (a different one only on a tie within rounding) */
#define CHECK_NEAREST(x, cent, C, d, code, what, ...)                                                   \
    do {                                                                                                \
        double gap_, bd_;                                                                               \
        int nb_ = brute_nearest((x), (cent), (C), (d), (code), &gap_, &bd_);                            \
        CHECK(nb_ == (code) || gap_ <= 1e-6 * bd_ + 1e-9, what ": code %d, nearest %d (gap %g)", __VA_ARGS__, \
              (int)(code), nb_, gap_);                                                                  \
    } while (0)

int test_pqcache_codes_are_nearest(void) {
    /* the k-means routine on random points */
    int n = 400, d = 16, C = 32;
    float *x = malloc((size_t)n * d * sizeof(float)), *cent = malloc((size_t)d * C * sizeof(float));
    uint8_t *codes = malloc((size_t)n);
    kv_rng r;
    kv_rng_seed(&r, 5);
    fill_normal(&r, x, (size_t)n * d, 1.f);
    CHECK_OK(kv_pq_kmeans(x, n, d, d, C, 4, 7, 0, cent, codes, 1));
    for (int i = 0; i < n; i++) CHECK_NEAREST(x + (size_t)i * d, cent, C, d, codes[i], "point %d", i);
    free(x); free(cent); free(codes);

    /* the method: prefill keys and decode keys encoded with the prefill centroids */
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(700, 400, 4, 2, 32, 3, &L));
    const char *ps[] = {"M=4", "b=5", "iters=3"};
    kv_test_driver dr;
    CHECK_OK(kv_test_driver_open(&dr, "pqcache", ps, 3, &L, 400, 4, 16, 24));
    kv_pq_view v;
    kv_pqcache_view(dr.st, &v);
    CHECK(v.M == 4 && v.C == 32 && v.dsub == 8, "view M %d C %d dsub %d", v.M, v.C, v.dsub);
    size_t csz = (size_t)2 * v.M * v.dsub * v.C * sizeof(float);
    float *c0 = malloc(csz);
    memcpy(c0, v.cent, csz);
    CHECK_OK(kv_test_driver_step(&dr, 690, 24));
    kv_pqcache_view(dr.st, &v);
    CHECK(v.n == 691, "positions seen %d", v.n);
    CHECK(memcmp(c0, v.cent, csz) == 0, "centroids changed during decode without recluster");
    for (int g = 0; g < 2; g++)
        for (int t = 4; t < v.n; t++)
            for (int m = 0; m < v.M; m++)
                CHECK_NEAREST(key_of(&L, g, t) + m * v.dsub, v.cent + ((size_t)g * v.M + m) * v.dsub * v.C, v.C, v.dsub,
                              v.codes[((size_t)g * L.T + t) * v.M + m], "kv head %d position %d sub %d", g, t, m);
    kv_test_driver_close(&dr);

    /* recluster=100: the centroids move after 100 appended keys and every code follows them */
    const char *pr[] = {"M=4", "b=5", "iters=3", "recluster=100"};
    CHECK_OK(kv_test_driver_open(&dr, "pqcache", pr, 4, &L, 400, 4, 16, 24));
    CHECK_OK(kv_test_driver_step(&dr, 498, 24)); /* 99 appended */
    kv_pqcache_view(dr.st, &v);
    CHECK(memcmp(c0, v.cent, csz) == 0, "same seed and data: the prefill centroids must match");
    CHECK_OK(kv_test_driver_step(&dr, 499, 24)); /* the 100th */
    kv_pqcache_view(dr.st, &v);
    CHECK(memcmp(c0, v.cent, csz) != 0, "recluster=100 left the centroids unchanged after 100 appends");
    for (int g = 0; g < 2; g++)
        for (int t = 4; t < v.n; t++)
            for (int m = 0; m < v.M; m++)
                CHECK_NEAREST(key_of(&L, g, t) + m * v.dsub, v.cent + ((size_t)g * v.M + m) * v.dsub * v.C, v.C, v.dsub,
                              v.codes[((size_t)g * L.T + t) * v.M + m], "reclustered: kv head %d position %d sub %d",
                              g, t, m);
    kv_test_driver_close(&dr);
    free(c0);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

static double quant_error(const float *x, int n, int d, const float *cent, int C, const uint8_t *codes) {
    double e = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) {
            double df = (double)x[(size_t)i * d + j] - cent[(size_t)j * C + codes[i]];
            e += df * df;
        }
    return e / n;
}

int test_pqcache_kmeans_lowers_error(void) {
    /* a mixture of 12 clusters; iters = it reproduces the first `it` rounds of the same run */
    int n = 2000, d = 8, C = 16, nc = 12;
    float *x = malloc((size_t)n * d * sizeof(float)), *mu = malloc((size_t)nc * d * sizeof(float)),
          *cent = malloc((size_t)d * C * sizeof(float));
    uint8_t *codes = malloc((size_t)n);
    kv_rng r;
    kv_rng_seed(&r, 17);
    fill_normal(&r, mu, (size_t)nc * d, 2.f);
    for (int i = 0; i < n; i++) {
        int c = (int)(kv_rng_uniform(&r) * nc);
        for (int j = 0; j < d; j++) x[(size_t)i * d + j] = mu[(size_t)c * d + j] + 0.5f * (float)kv_rng_normal(&r);
    }
    double err[11];
    for (int it = 0; it <= 10; it++) {
        CHECK_OK(kv_pq_kmeans(x, n, d, d, C, it, 99, 0, cent, codes, 1));
        err[it] = quant_error(x, n, d, cent, C, codes);
        if (it) CHECK(err[it] <= err[it - 1] * (1 + 1e-6), "error rose at iteration %d: %g -> %g", it, err[it - 1], err[it]);
    }
    CHECK(err[10] < 0.8 * err[0], "k-means lowered the error only from %g to %g", err[0], err[10]);
    /* a warm start from converged centroids changes (almost) nothing */
    CHECK_OK(kv_pq_kmeans(x, n, d, d, C, 3, 0, 1, cent, codes, 1));
    CHECK(quant_error(x, n, d, cent, C, codes) <= err[10] * (1 + 1e-6), "warm start raised the error");
    free(x); free(mu); free(cent); free(codes);
    return KV_TEST_PASS;
}

int test_pqcache_adc_matches_direct(void) {
    int M = 4, ds = 8, C = 64, D = M * ds, n = 500;
    float *cent = malloc((size_t)M * ds * C * sizeof(float)), q[32], lut[4 * 64], *adc = malloc((size_t)n * sizeof(float));
    uint8_t *codes = malloc((size_t)n * M);
    kv_rng r;
    kv_rng_seed(&r, 23);
    fill_normal(&r, cent, (size_t)M * ds * C, 1.f);
    fill_normal(&r, q, (size_t)D, 1.f);
    for (int i = 0; i < n * M; i++) codes[i] = (uint8_t)(kv_rng_u64(&r) % (uint64_t)C);
    kv_pq_lut(q, cent, M, C, ds, lut);
    kv_pq_adc(lut, codes, M, n, M, C, adc);
    for (int i = 0; i < n; i++) {
        double s = 0, a = 0;
        for (int m = 0; m < M; m++)
            for (int j = 0; j < ds; j++) {
                double p = (double)q[m * ds + j] * cent[((size_t)m * ds + j) * C + codes[(size_t)i * M + m]];
                s += p;
                a += fabs(p);
            }
        CHECK(fabs(adc[i] - s) <= 1e-5 * a + 1e-6, "key %d: adc %.9g, direct %.9g", i, adc[i], s);
    }
    free(cent); free(adc); free(codes);

    /* the search: top-k of softmax(ADC * scale) summed over the group, per kv head */
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(700, 400, 4, 2, 32, 8, &L));
    const char *ps[] = {"M=4", "b=4", "iters=3"};
    kv_test_driver dr;
    int k = 24, sink = 4, local = 16;
    CHECK_OK(kv_test_driver_open(&dr, "pqcache", ps, 3, &L, 400, sink, local, k));
    double *agg = malloc((size_t)L.T * sizeof(double)), *sc = malloc((size_t)L.T * sizeof(double));
    for (int t = 450; t < 700; t += 83) {
        CHECK_OK(kv_test_driver_step(&dr, t, k));
        kv_pq_view v;
        kv_pqcache_view(dr.st, &v);
        int lo = sink, hi = t + 1 - local, nr = hi - lo;
        for (int g = 0; g < 2; g++) {
            for (int i = 0; i < nr; i++) agg[i] = 0;
            for (int h = 2 * g; h < 2 * g + 2; h++) {
                double mx = -1e300, z = 0;
                for (int i = 0; i < nr; i++) {
                    double s = 0;
                    for (int m = 0; m < v.M; m++) {
                        int c = v.codes[((size_t)g * L.T + lo + i) * v.M + m];
                        for (int j = 0; j < v.dsub; j++)
                            s += (double)query_of(&L, h, t)[m * v.dsub + j] *
                                 v.cent[(((size_t)g * v.M + m) * v.dsub + j) * v.C + c];
                    }
                    sc[i] = s * dr.sh.softmax_scale;
                    if (sc[i] > mx) mx = sc[i];
                }
                for (int i = 0; i < nr; i++) z += exp(sc[i] - mx);
                for (int i = 0; i < nr; i++) agg[i] += exp(sc[i] - mx) / z;
            }
            /* the k-th largest group score */
            memcpy(sc, agg, (size_t)nr * sizeof(double));
            for (int a = 0; a < k; a++)
                for (int b = a + 1; b < nr; b++)
                    if (sc[b] > sc[a]) { double tmp = sc[a]; sc[a] = sc[b]; sc[b] = tmp; }
            double kth = sc[k - 1];
            CHECK(dr.sel.count[g] == k, "step %d kv head %d: %d selected", t, g, dr.sel.count[g]);
            for (int j = 0; j < k; j++) {
                int i = dr.sel.idx[(size_t)g * dr.sel.cap + j];
                CHECK(i >= lo && i < hi, "index %d outside the region", i);
                CHECK(agg[i - lo] >= kth * (1 - 1e-4), "step %d kv head %d: index %d scores %g below the k-th %g", t,
                      g, i, agg[i - lo], kth);
            }
        }
    }
    free(agg); free(sc);
    kv_test_driver_close(&dr);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* ---- Quest ---- */

int test_quest_bound_is_upper_bound(void) {
    int D = 32, page = 16, npages = 300, nq = 20;
    float *K = malloc((size_t)npages * page * D * sizeof(float)), mn[32], mx[32], q[32], off[32];
    kv_rng r;
    kv_rng_seed(&r, 31);
    for (int p = 0; p < npages; p++) { /* pages with their own offset, as keys come in runs */
        fill_normal(&r, off, D, 1.f);
        for (int i = 0; i < page; i++)
            for (int j = 0; j < D; j++) K[((size_t)p * page + i) * D + j] = off[j] + 0.5f * (float)kv_rng_normal(&r);
    }
    int tight = 0;
    for (int s = 0; s < nq; s++) {
        fill_normal(&r, q, D, 1.f);
        for (int p = 0; p < npages; p++) {
            const float *Kp = K + (size_t)p * page * D;
            for (int j = 0; j < D; j++) mn[j] = mx[j] = Kp[j];
            for (int i = 1; i < page; i++)
                for (int j = 0; j < D; j++) {
                    float x = Kp[(size_t)i * D + j];
                    mn[j] = x < mn[j] ? x : mn[j];
                    mx[j] = x > mx[j] ? x : mx[j];
                }
            float b = kv_quest_page_bound(q, mn, mx, D);
            double bd = 0, ab = 0;
            for (int j = 0; j < D; j++) {
                double u = (double)q[j] * mx[j], w = (double)q[j] * mn[j];
                bd += u > w ? u : w;
                ab += fabs(u) + fabs(w);
            }
            CHECK(fabs(b - bd) <= 1e-5 * ab, "page %d: bound %.9g, formula in double %.9g", p, b, bd);
            double best = -1e300;
            for (int i = 0; i < page; i++) {
                double sc = 0;
                for (int j = 0; j < D; j++) sc += (double)q[j] * Kp[(size_t)i * D + j];
                CHECK(sc <= b + 1e-5 * ab, "query %d page %d key %d: score %.9g above the bound %.9g", s, p, i, sc, b);
                best = sc > best ? sc : best;
            }
            tight += b - best < 1e-5 * ab; /* bound attained: only when one key holds every extreme */
        }
    }
    /* a page of one key: the bound is the key's score */
    fill_normal(&r, q, D, 1.f);
    double sc = 0;
    for (int j = 0; j < D; j++) sc += (double)q[j] * K[j];
    CHECK_CLOSE(kv_quest_page_bound(q, K, K, D), sc, 1e-5, 1e-5);
    (void)tight;
    free(K);
    return KV_TEST_PASS;
}

/* Quest's pooled page scores computed here in double: bounds from page
 * min/max computed here from the layer's keys. */
static void quest_brute_scores(const kv_layer *L, int g, int t, int sink, int page, int ncand, int pool, int G,
                               float scale, double *score /* [ncand] */, double *bound /* [G][ncand] */) {
    int D = L->D;
    for (int hh = 0; hh < G; hh++) {
        const float *q = query_of(L, g * G + hh, t);
        for (int p = 0; p < ncand; p++) {
            double b = 0;
            for (int j = 0; j < D; j++) {
                float mn = key_of(L, g, sink + p * page)[j], mx = mn;
                for (int i = 1; i < page; i++) {
                    float x = key_of(L, g, sink + p * page + i)[j];
                    mn = x < mn ? x : mn;
                    mx = x > mx ? x : mx;
                }
                double u = (double)q[j] * mx, w = (double)q[j] * mn;
                b += u > w ? u : w;
            }
            bound[(size_t)hh * ncand + p] = b;
        }
    }
    for (int p = 0; p < ncand; p++) score[p] = pool == 2 ? -1e300 : 0;
    for (int hh = 0; hh < G; hh++) {
        const double *b = bound + (size_t)hh * ncand;
        if (pool == 2) {
            for (int p = 0; p < ncand; p++) score[p] = b[p] > score[p] ? b[p] : score[p];
        } else if (pool == 1) {
            double m = -1e300, z = 0;
            for (int p = 0; p < ncand; p++) m = scale * b[p] > m ? scale * b[p] : m;
            for (int p = 0; p < ncand; p++) z += exp(scale * b[p] - m);
            for (int p = 0; p < ncand; p++) score[p] += exp(scale * b[p] - m) / z / G;
        }
    }
}

int test_quest_selects_top_pages(void) {
    kv_layer L;
    int T = 1200, P = 900, sink = 4, local = 16, page = 16, k = 72, G = 2; /* k/page = 4 pages */
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 41, &L));
    const char *pools[] = {"pool=none", "pool=mean", "pool=max"};
    double *score = malloc((size_t)T * sizeof(double)), *bound = malloc((size_t)G * T * sizeof(double)),
           *sorted = malloc((size_t)T * sizeof(double));
    int *chosen = malloc((size_t)T * sizeof(int));
    for (int pool = 0; pool < 3; pool++) {
        kv_test_driver dr;
        CHECK_OK(kv_test_driver_open(&dr, "quest", &pools[pool], 1, &L, P, sink, local, k));
        for (int t = P; t < T; t += 37) {
            CHECK_OK(kv_test_driver_step(&dr, t, k));
            int hi = t + 1 - local, npages = (t + 1 - sink) / page;
            int ncand = (hi - sink + page - 1) / page < npages ? (hi - sink + page - 1) / page : npages;
            int kp = k / page;
            kv_quest_view v;
            kv_quest_view_of(dr.st, &v);
            CHECK(v.npages == npages, "step %d: %d pages summarised, want %d", t, v.npages, npages);
            for (int g = 0; g < 2; g++) {
                /* the index holds the exact min/max of each full page */
                for (int p = 0; p < npages; p += 7)
                    for (int j = 0; j < L.D; j++) {
                        float mn = key_of(&L, g, sink + p * page)[j], mx = mn;
                        for (int i = 1; i < page; i++) {
                            float x = key_of(&L, g, sink + p * page + i)[j];
                            mn = x < mn ? x : mn;
                            mx = x > mx ? x : mx;
                        }
                        CHECK(v.kmin[((size_t)g * v.max_pages + p) * L.D + j] == mn &&
                                  v.kmax[((size_t)g * v.max_pages + p) * L.D + j] == mx,
                              "kv head %d page %d channel %d: min/max differ", g, p, j);
                    }
                quest_brute_scores(&L, g, t, sink, page, ncand, pool, G, dr.sh.softmax_scale, score, bound);
                for (int hh = 0; hh < G; hh++) {
                    int h = g * G + hh;
                    const double *s = pool == 0 ? bound + (size_t)hh * ncand : score;
                    /* the pages the list holds, each with all its tokens in the region */
                    const int32_t *idx = dr.sel.idx + (size_t)h * dr.sel.cap;
                    int c = dr.sel.count[h], np = 0;
                    CHECK(c <= k, "step %d head %d: %d tokens above k=%d", t, h, c, k);
                    for (int j = 0; j < c;) {
                        int p = (idx[j] - sink) / page, a = sink + p * page, b = a + page < hi ? a + page : hi;
                        CHECK(p >= 0 && p < ncand, "step %d head %d: token %d in page %d, not a candidate", t, h,
                              idx[j], p);
                        for (int i = a; i < b; i++, j++)
                            CHECK(j < c && idx[j] == i, "step %d head %d: page %d not listed whole", t, h, p);
                        chosen[np++] = p;
                    }
                    CHECK(np == kp, "step %d head %d: %d pages, want %d", t, h, np, kp);
                    /* brute force: the kp-th largest score; every chosen page reaches it, none beyond it is missed */
                    memcpy(sorted, s, (size_t)ncand * sizeof(double));
                    for (int a = 0; a < kp; a++)
                        for (int b = a + 1; b < ncand; b++)
                            if (sorted[b] > sorted[a]) { double tmp = sorted[a]; sorted[a] = sorted[b]; sorted[b] = tmp; }
                    double kth = sorted[kp - 1], tol = 1e-5 * (fabs(kth) + 1e-3);
                    for (int a = 0; a < np; a++)
                        CHECK(s[chosen[a]] >= kth - tol, "%s step %d head %d: page %d (%.9g) is below the %d-th (%.9g)",
                              pools[pool], t, h, chosen[a], s[chosen[a]], kp, kth);
                    for (int a = 1; a < np; a++)
                        CHECK(s[chosen[a]] <= s[chosen[a - 1]] + tol, "pages not in score order");
                    /* pooled: every head of the group holds the same list */
                    if (pool && hh)
                        CHECK(dr.sel.count[h] == dr.sel.count[h - 1] &&
                                  !memcmp(idx, dr.sel.idx + (size_t)(h - 1) * dr.sel.cap, (size_t)c * sizeof(int32_t)),
                              "%s: heads %d and %d of a group differ", pools[pool], h - 1, h);
                }
                CHECK(dr.sel.n_extra[g] == 0, "local >= page: no partial page in the region, found %d extra",
                      dr.sel.n_extra[g]);
            }
        }
        kv_test_driver_close(&dr);
    }
    free(score); free(bound); free(sorted); free(chosen);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_quest_partial_page_is_extra(void) {
    kv_layer L;
    int T = 700, P = 400, sink = 4, local = 5, page = 16, k = 48;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 43, &L));
    kv_test_driver dr;
    CHECK_OK(kv_test_driver_open(&dr, "quest", NULL, 0, &L, P, sink, local, k));
    int seen = 0;
    for (int t = P; t < P + 48; t++) {
        CHECK_OK(kv_test_driver_step(&dr, t, k));
        int hi = t + 1 - local, pstart = sink + (t + 1 - sink) / page * page;
        int want = hi > pstart ? hi - pstart : 0;
        seen += want > 0;
        for (int g = 0; g < 2; g++) {
            CHECK(dr.sel.n_extra[g] == want, "step %d kv head %d: %d extra, want %d ([%d, %d))", t, g,
                  dr.sel.n_extra[g], want, pstart, hi);
            for (int j = 0; j < want; j++)
                CHECK(dr.sel.extra[(size_t)g * dr.sel.extra_cap + j] == pstart + j, "step %d: extra %d is %d", t, j,
                      dr.sel.extra[(size_t)g * dr.sel.extra_cap + j]);
        }
        for (int h = 0; h < 4; h++)
            for (int j = 0; j < dr.sel.count[h]; j++) {
                int i = dr.sel.idx[(size_t)h * dr.sel.cap + j];
                CHECK(i >= sink && i < hi && i < pstart, "step %d head %d: selected %d (region [%d, %d), partial from %d)",
                      t, h, i, sink, hi, pstart);
            }
    }
    CHECK(seen > 0, "no step had a partial page in the region");
    kv_test_driver_close(&dr);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* ---- MagicPIG ---- */

/* Sign bits of x's projections, each a float sum over the dims in order. */
static void explicit_bits(const float *x, const float *proj, int D, int KL, uint8_t *bits) {
    for (int b = 0; b < KL; b++) {
        float acc = 0.f;
        for (int j = 0; j < D; j++) acc += x[j] * proj[(size_t)j * KL + b];
        bits[b] = acc > 0.f;
    }
}

/* Tables (of L, K bits each) where two explicit bit strings agree on every bit. */
static int explicit_collisions(const uint8_t *kb, const uint8_t *qb, int L, int K) {
    int n = 0;
    for (int l = 0; l < L; l++) {
        int same = 1;
        for (int b = 0; b < K; b++) same &= kb[l * K + b] == qb[l * K + b];
        n += same;
    }
    return n;
}

int test_magicpig_collisions_match_sign_bits(void) {
    int D = 24, K = 6, L = 40, KL = K * L, n = 300;
    float *proj = malloc((size_t)D * KL * sizeof(float)), *proj2 = malloc((size_t)D * KL * sizeof(float));
    float *X = malloc((size_t)n * D * sizeof(float)), q[24], acc[240];
    uint16_t *codes = malloc((size_t)L * n * sizeof(uint16_t)), qc[40], cnt[300];
    uint8_t *kb = malloc((size_t)KL), qb[240];
    kv_mp_projection(7, D, K, L, proj);
    kv_mp_projection(7, D, K, L, proj2);
    CHECK(!memcmp(proj, proj2, (size_t)D * KL * sizeof(float)), "projection not a function of its seed");
    kv_rng r;
    kv_rng_seed(&r, 8);
    fill_normal(&r, q, D, 1.f);
    for (int i = 0; i < n; i++) /* keys from parallel to q to unrelated: collision counts over the whole range */
        for (int j = 0; j < D; j++)
            X[(size_t)i * D + j] = (float)(n - i) / n * q[j] + 0.3f * i / n * (float)kv_rng_normal(&r);
    for (int i = 0; i < n; i++) kv_mp_hash(X + (size_t)i * D, proj, D, K, L, acc, codes + i, n);
    kv_mp_hash(q, proj, D, K, L, acc, qc, 1);
    kv_mp_collisions(codes, n, 0, n, qc, L, cnt);
    explicit_bits(q, proj, D, KL, qb);
    int lo_c = L, hi_c = 0;
    for (int i = 0; i < n; i++) {
        explicit_bits(X + (size_t)i * D, proj, D, KL, kb);
        int want = explicit_collisions(kb, qb, L, K);
        for (int l = 0; l < L; l++) {
            /* the packed code holds bit l*K+b at position b */
            unsigned code = 0;
            for (int b = 0; b < K; b++) code |= (unsigned)kb[l * K + b] << b;
            CHECK(codes[(size_t)l * n + i] == code, "key %d table %d: code %u, bits give %u", i, l,
                  codes[(size_t)l * n + i], code);
        }
        CHECK(cnt[i] == want, "key %d: %d collisions counted, %d from the sign bits", i, cnt[i], want);
        lo_c = want < lo_c ? want : lo_c;
        hi_c = want > hi_c ? want : hi_c;
    }
    CHECK(lo_c <= 2 && hi_c == L, "collision counts span only [%d, %d]", lo_c, hi_c);
    /* a sub-range [lo, hi) counts the same keys */
    kv_mp_collisions(codes, n, 100, 180, qc, L, cnt);
    for (int i = 100; i < 180; i++) {
        explicit_bits(X + (size_t)i * D, proj, D, KL, kb);
        int want = explicit_collisions(kb, qb, L, K);
        CHECK(cnt[i - 100] == want, "range: key %d: %d, want %d", i, cnt[i - 100], want);
    }
    free(proj); free(proj2); free(X); free(codes); free(kb);
    return KV_TEST_PASS;
}

int test_magicpig_weight_hand_cases(void) {
    /* K = 10, L = 150 (the defaults). cos = 1: p = 1, w = 1. cos = -1: p = 0, w = 0. */
    CHECK_CLOSE(kv_mp_logw(1.0, 10, 150), -log(1.0001), 1e-9, 1e-6);
    CHECK_CLOSE(kv_mp_logw(-1.0, 10, 150), -log(1e-4), 1e-6, 1e-6);
    CHECK_CLOSE(kv_mp_logw(-1.0, 10, 150), 9.210340372, 1e-6, 1e-6);
    /* cos = 0: theta = pi/2, p = 2^-10 */
    double p = 1.0 / 1024, w = 1 - pow(1 - p, 149) * (150 * p + 1 - p);
    CHECK_CLOSE(kv_mp_logw(0.0, 10, 150), -log(w + 1e-4), 1e-6, 1e-6);
    CHECK_CLOSE(kv_mp_logw(0.0, 10, 150), 4.6270403229, 1e-6, 1e-6);
    /* cos = 0.5: theta = pi/3, p = (2/3)^10 = 0.0173415299 */
    p = pow(2.0 / 3.0, 10);
    CHECK_CLOSE(p, 0.0173415299, 1e-9, 0);
    w = 1 - pow(1 - p, 149) * (150 * p + 1 - p);
    CHECK_CLOSE(kv_mp_logw(0.5, 10, 150), -log(w + 1e-4), 1e-6, 1e-6);
    CHECK_CLOSE(kv_mp_logw(0.5, 10, 150), 0.3069996086, 1e-6, 1e-6);
    /* small K, L: K = 2, L = 3, cos = 0: p = 1/4, w = 1 - (3/4)^2 * (3/4 + 3/4) = 0.15625 */
    CHECK_CLOSE(kv_mp_logw(0.0, 2, 3), -log(0.15625 + 1e-4), 1e-6, 1e-6);
    /* out-of-range cosines (rounding) are clamped */
    CHECK_CLOSE(kv_mp_logw(1.0000001, 10, 150), kv_mp_logw(1.0, 10, 150), 0, 0);
    /* the weight falls (log-weight rises) as the angle opens */
    for (double c = 0.95; c > -0.95; c -= 0.1)
        CHECK(kv_mp_logw(c - 0.1, 10, 150) >= kv_mp_logw(c, 10, 150), "log-weight not monotone at cos %g", c);
    return KV_TEST_PASS;
}

int test_magicpig_returns_colliding_keys(void) {
    kv_layer L;
    int T = 900, P = 600, sink = 4, local = 16, D = 32, minc = 3;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, D, 47, &L));
    const char *ps[] = {"K=6", "L=30", "min_collisions=3"};
    kv_test_driver dr;
    CHECK_OK(kv_test_driver_open(&dr, "magicpig", ps, 3, &L, P, sink, local, 24));
    kv_mp_view v;
    kv_magicpig_view(dr.st, &v);
    int K = v.K, NT = v.L, KL = K * NT;
    /* the centre is the mean of the prefill keys [sink, P) */
    for (int g = 0; g < 2; g++)
        for (int j = 0; j < D; j++) {
            double m = 0;
            for (int t = sink; t < P; t++) m += key_of(&L, g, t)[j];
            CHECK_CLOSE(v.mean[g * D + j], m / (P - sink), 1e-5, 1e-5);
        }
    float c[32], qn[32];
    uint8_t bits[180];
    uint16_t qc[30];
    int any_in = 0, any_out = 0;
    for (int t = P; t < T; t += 149) {
        CHECK_OK(kv_test_driver_step(&dr, t, 24));
        kv_magicpig_view(dr.st, &v);
        int hi = t + 1 - local;
        for (int h = 0; h < 4; h++) {
            int g = h / 2;
            const float *q = query_of(&L, h, t);
            float qq = sqrtf(kv_dot_ref(q, q, D));
            for (int j = 0; j < D; j++) qn[j] = q[j] / qq;
            explicit_bits(qn, v.proj, D, KL, bits);
            for (int l = 0; l < NT; l++) {
                qc[l] = 0;
                for (int b = 0; b < K; b++) qc[l] |= (uint16_t)(bits[l * K + b] << b);
            }
            const int32_t *idx = dr.sel.idx + (size_t)h * dr.sel.cap;
            const float *lw = dr.sel.logw + (size_t)h * dr.sel.cap;
            int j = 0;
            for (int i = sink; i < hi; i++) {
                /* the key's code: sign bits of the centred key, computed here */
                for (int d = 0; d < D; d++) c[d] = key_of(&L, g, i)[d] - v.mean[g * D + d];
                explicit_bits(c, v.proj, D, KL, bits);
                int coll = 0;
                for (int l = 0; l < NT; l++) {
                    uint16_t code = 0;
                    for (int b = 0; b < K; b++) code |= (uint16_t)(bits[l * K + b] << b);
                    CHECK(v.codes[((size_t)g * NT + l) * T + i] == code, "kv head %d position %d table %d: code", g, i, l);
                    coll += code == qc[l];
                }
                if (coll < minc) {
                    any_out = 1;
                    CHECK(j >= dr.sel.count[h] || idx[j] != i, "step %d head %d: key %d has %d < %d collisions", t, h,
                          i, coll, minc);
                    continue;
                }
                any_in = 1;
                CHECK(j < dr.sel.count[h] && idx[j] == i, "step %d head %d: key %d (%d collisions) not returned", t,
                      h, i, coll);
                double dot = 0, kn = 0, qn2 = 0;
                for (int d = 0; d < D; d++) {
                    dot += (double)q[d] * c[d];
                    kn += (double)c[d] * c[d];
                    qn2 += (double)q[d] * q[d];
                }
                double cs = dot / sqrt(kn * qn2), p = pow(1 - acos(cs) / 3.14159265358979323846, K);
                double w = 1 - pow(1 - p, NT - 1) * (NT * p + 1 - p);
                CHECK_CLOSE(lw[j], -log(w + 1e-4), 1e-4, 1e-4);
                j++;
            }
            CHECK(j == dr.sel.count[h], "step %d head %d: %d returned, %d qualify", t, h, dr.sel.count[h], j);
        }
    }
    CHECK(any_in && any_out, "degenerate case: returned some %d, left out some %d", any_in, any_out);
    kv_test_driver_close(&dr);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* ---- the protocol's contract at non-default settings ---- */

int test_baselines_param_variants(void) {
    struct { const char *method; const char *params[4]; int np, local, P; } cases[] = {
        {"quest", {"pool=mean"}, 1, 16, 400},
        {"quest", {"pool=max", "page=8"}, 2, 16, 400},
        {"quest", {"page=32"}, 1, 5, 400},   /* partial pages in the region */
        {"quest", {"page=7", "pool=mean"}, 2, 3, 400},
        {"pqcache", {"M=8", "b=3", "recluster=50"}, 3, 16, 400},
        {"pqcache", {"M=1", "b=8", "iters=0"}, 3, 1, 400},
        {"magicpig", {"K=8", "L=40", "min_collisions=1"}, 3, 16, 400},
        /* a prefill shorter than the sink: nothing indexed at build */
        {"pqcache", {"recluster=64"}, 1, 16, 3},
        {"quest", {"pool=max"}, 1, 16, 3},
        {"magicpig", {"min_collisions=1"}, 1, 16, 3},
    };
    int T = 700, sink = 4, k = 40;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, 400, 4, 2, 32, 53, &L));
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        kv_test_driver a, b;
        int local = cases[ci].local, P = cases[ci].P;
        CHECK_OK(kv_test_driver_open(&a, cases[ci].method, cases[ci].params, cases[ci].np, &L, P, sink, local, k));
        CHECK_OK(kv_test_driver_open(&b, cases[ci].method, cases[ci].params, cases[ci].np, &L, P, sink, local, k));
        int nonempty = 0;
        for (int t = P; t < T; t += 13) {
            CHECK_OK(kv_test_driver_step(&a, t, k));
            CHECK_OK(kv_test_driver_step(&b, t, k));
            int hi = t + 1 - local;
            if (hi <= sink) continue;
            for (int l = 0; l < a.sel.n_lists; l++) {
                int c = a.sel.count[l];
                nonempty += c > 0;
                CHECK(a.m->variable_budget || c <= k, "case %zu step %d: %d > k", ci, t, c);
                CHECK(c == b.sel.count[l] && !memcmp(a.sel.idx + (size_t)l * a.sel.cap, b.sel.idx + (size_t)l * b.sel.cap,
                                                     (size_t)c * sizeof(int32_t)),
                      "case %zu step %d list %d: two runs differ", ci, t, l);
                for (int j = 0; j < c; j++) {
                    int i = a.sel.idx[(size_t)l * a.sel.cap + j];
                    CHECK(i >= sink && i < hi, "case %zu step %d: index %d outside [%d, %d)", ci, t, i, sink, hi);
                    for (int j2 = 0; j2 < j; j2++)
                        CHECK(a.sel.idx[(size_t)l * a.sel.cap + j2] != i, "case %zu step %d: %d twice", ci, t, i);
                }
            }
            for (int g = 0; g < 2; g++)
                for (int j = 0; j < a.sel.n_extra[g]; j++) {
                    int i = a.sel.extra[(size_t)g * a.sel.extra_cap + j];
                    CHECK(i >= 0 && i <= t, "case %zu step %d: extra %d", ci, t, i);
                }
        }
        CHECK(nonempty, "case %zu (%s): never selected anything", ci, cases[ci].method);
        CHECK(a.m->memory_bytes(a.st) > 0, "case %zu: memory_bytes is 0", ci);
        kv_test_driver_close(&a);
        kv_test_driver_close(&b);
    }
    /* a bad M is refused with the reason */
    kv_shape sh = {.num_q_heads = 4, .num_kv_heads = 2, .head_dim = 32, .group = 2, .max_tokens = 10,
                   .prefill_len = 5, .softmax_scale = 1, .sink = 1, .local = 1};
    kv_param_set ps;
    const kv_method *m = kv_method_find("pqcache");
    kv_params_init(&ps, m->params);
    CHECK_OK(kv_params_set(&ps, "pqcache", "M=3"));
    void *st = NULL;
    CHECK(m->create(&sh, &ps, &st) == KV_ERR_INPUT && strstr(kv_last_error(), "divide"), "M=3 with D=32: %s",
          kv_last_error());
    kv_layer_free(&L);
    return KV_TEST_PASS;
}
