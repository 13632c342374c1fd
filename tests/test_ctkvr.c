/* test_ctkvr.c: CTKVR (retrievers/ctkvr.c) against brute forces written
 * here: centroid positions for each choice of table 4 (hand cases); every
 * list is the top-rho of the keys by the group max of the softmax computed
 * directly; a search's candidate set is the union of the lists of the top
 * C' centroids by cosine computed directly, and its selection the top k of
 * that union by the direct ranking; with C' = all centroids and rho >= N
 * (and generated keys reranked) it equals the exact retriever; DCU replaces
 * slots in FIFO order with the step's queries and the top rho of its rerank
 * (oracle: of the whole region); gen=dense reports the keys after the build
 * as extra. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/score.h"
#include "../retrievers/query_centric.h"
#include "kv_test.h"

static const float *key_of(const kv_layer *L, int g, int t) { return L->k + ((size_t)g * L->T + t) * L->D; }
static const float *query_of(const kv_layer *L, int h, int t) { return L->q + ((size_t)h * L->T + t) * L->D; }

typedef struct { float v; int i; } pair;
static int cmp_pair(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}
static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* Direct ranking of positions set[0..n) for kv head g with the G query rows
 * q[hh] (hh < G): max over hh of float(scale*dot - lse_hh), lse in double
 * (written here without the retriever's code); sorted best first into out. */
static void rank_direct(const kv_layer *L, int g, const float *const *q, int G, float scale, const int *set, int n,
                        pair *out) {
    for (int a = 0; a < n; a++) out[a] = (pair){-INFINITY, set[a]};
    double *s = malloc((size_t)n * sizeof(double));
    for (int hh = 0; hh < G; hh++) {
        double mx = -INFINITY, z = 0;
        for (int a = 0; a < n; a++) {
            s[a] = (double)(scale * kv_dot_ref(q[hh], key_of(L, g, set[a]), L->D));
            if (s[a] > mx) mx = s[a];
        }
        for (int a = 0; a < n; a++) z += exp(s[a] - mx);
        for (int a = 0; a < n; a++) {
            float v = (float)(s[a] - (mx + log(z)));
            if (v > out[a].v) out[a].v = v;
        }
    }
    qsort(out, (size_t)n, sizeof(pair), cmp_pair);
    free(s);
}

int test_ctkvr_positions(void) {
    int32_t p[8];
    kv_ctkvr_positions(0, 10, 3, 1, p);
    CHECK(p[0] == 7 && p[1] == 8 && p[2] == 9, "final: %d %d %d", p[0], p[1], p[2]);
    kv_ctkvr_positions(1, 10, 3, 1, p);
    CHECK(p[0] == 0 && p[1] == 1 && p[2] == 2, "init: %d %d %d", p[0], p[1], p[2]);
    kv_ctkvr_positions(3, 10, 3, 1, p);
    CHECK(p[0] == 1 && p[1] == 5 && p[2] == 8, "equi: %d %d %d", p[0], p[1], p[2]);
    int32_t a[8], b[8];
    kv_ctkvr_positions(2, 20, 8, 42, a);
    kv_ctkvr_positions(2, 20, 8, 42, b);
    CHECK(!memcmp(a, b, sizeof a), "random: not deterministic");
    for (int j = 0; j < 8; j++) CHECK(a[j] >= 0 && a[j] < 20 && (j == 0 || a[j] > a[j - 1]), "random: %d at %d", a[j], j);
    kv_ctkvr_positions(2, 8, 8, 42, a); /* C = P: every position */
    for (int j = 0; j < 8; j++) CHECK(a[j] == j, "random C=P: %d at %d", a[j], j);
    return KV_TEST_PASS;
}

int test_ctkvr_lists_brute_force(void) {
    int T = 500, P = 320, sink = 4, local = 16, Hq = 4, G = 2, D = 32, C = 12, rho = 30;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, Hq, 2, D, 31, &L));
    const char *ps[] = {"C=12", "rho=30", "centroids=equi"};
    kv_test_driver dr;
    CHECK_OK(kv_test_driver_open(&dr, "ctkvr", ps, 3, &L, P, sink, local, 10));
    kv_ctkvr_view v;
    kv_ctkvr_view_of(dr.st, &v);
    CHECK(v.C == C && v.rho == rho && v.next == 0, "C %d rho %d next %d", v.C, v.rho, v.next);
    int n = P - local - sink, *set = malloc((size_t)n * sizeof(int));
    pair *pr = malloc((size_t)n * sizeof(pair));
    for (int a = 0; a < n; a++) set[a] = sink + a;
    for (int j = 0; j < C; j++) {
        CHECK(v.cpos[j] == (2 * j + 1) * P / (2 * C), "slot %d position %d", j, v.cpos[j]);
        for (int h = 0; h < Hq; h++)
            CHECK(!memcmp(v.cq + ((size_t)j * Hq + h) * D, query_of(&L, h, v.cpos[j]), (size_t)D * sizeof(float)),
                  "slot %d head %d: not the query of position %d", j, h, v.cpos[j]);
        for (int g = 0; g < 2; g++) {
            const float *qs[2] = {query_of(&L, g * G, v.cpos[j]), query_of(&L, g * G + 1, v.cpos[j])};
            rank_direct(&L, g, qs, G, dr.sh.softmax_scale, set, n, pr);
            CHECK(v.lcnt[g * C + j] == rho, "slot %d kv %d: %d entries", j, g, v.lcnt[g * C + j]);
            for (int a = 0; a < rho; a++)
                CHECK(v.lidx[((size_t)g * C + j) * rho + a] == pr[a].i, "slot %d kv %d rank %d: %d, want %d", j, g, a,
                      v.lidx[((size_t)g * C + j) * rho + a], pr[a].i);
        }
    }
    /* C=0: min(2048, P/16) */
    kv_test_driver d2;
    CHECK_OK(kv_test_driver_open(&d2, "ctkvr", NULL, 0, &L, P, sink, local, 10));
    kv_ctkvr_view_of(d2.st, &v);
    CHECK(v.C == P / 16 && v.rho == 250 && v.cpos[0] == P - P / 16, "auto: C %d rho %d first %d", v.C, v.rho, v.cpos[0]);
    kv_test_driver_close(&d2);
    free(set); free(pr);
    kv_test_driver_close(&dr);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_ctkvr_union_matches_direct(void) {
    int T = 520, P = 320, sink = 4, local = 16, Hq = 4, G = 2, D = 32, C = 16, rho = 25, k = 12, cp = 3;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, Hq, 2, D, 33, &L));
    for (int gen = 0; gen < 2; gen++) {
        const char *ps[] = {"C=16", "rho=25", "cp=3", "dcu=off", gen ? "gen=rerank" : "gen=dense"};
        kv_test_driver dr;
        CHECK_OK(kv_test_driver_open(&dr, "ctkvr", ps, 5, &L, P, sink, local, k));
        kv_ctkvr_view v;
        kv_ctkvr_view_of(dr.st, &v);
        int *set = malloc((size_t)T * sizeof(int));
        pair *pr = malloc((size_t)T * sizeof(pair));
        for (int t = P; t < T; t += 50) {
            CHECK_OK(kv_test_driver_step(&dr, t, k));
            int hi = t + 1 - local, gen_lo = P - local;
            for (int g = 0; g < 2; g++) {
                /* cosines in double, max over the group, top cp slots */
                pair cs[16];
                for (int j = 0; j < C; j++) {
                    double best = -2;
                    for (int h = g * G; h < (g + 1) * G; h++) {
                        const float *a = query_of(&L, h, t), *c = v.cq + ((size_t)j * Hq + h) * D;
                        double ab = 0, aa = 0, cc = 0;
                        for (int x = 0; x < D; x++) { ab += (double)a[x] * c[x]; aa += (double)a[x] * a[x]; cc += (double)c[x] * c[x]; }
                        double cv = ab / sqrt(aa * cc);
                        if (cv > best) best = cv;
                    }
                    cs[j] = (pair){(float)best, j};
                }
                qsort(cs, C, sizeof(pair), cmp_pair);
                CHECK(cs[cp - 1].v - cs[cp].v > 1e-5f, "near tie at the C' boundary: pick another seed");
                int member[600] = {0}, n = 0;
                for (int r = 0; r < cp; r++)
                    for (int a = 0; a < v.lcnt[g * C + cs[r].i]; a++) {
                        int i = v.lidx[((size_t)g * C + cs[r].i) * rho + a];
                        if (!member[i]) { member[i] = 1; set[n++] = i; }
                    }
                if (gen)
                    for (int i = gen_lo; i < hi; i++)
                        if (!member[i]) { member[i] = 1; set[n++] = i; }
                qsort(set, (size_t)n, sizeof(int), cmp_int);
                CHECK(dr.sel.n_cand[g] == n, "gen %d t %d kv %d: %d candidates, want %d", gen, t, g, dr.sel.n_cand[g], n);
                CHECK(!memcmp(dr.sel.cand + (size_t)g * dr.sel.cand_cap, set, (size_t)n * sizeof(int)),
                      "gen %d t %d kv %d: candidate set differs from the direct union", gen, t, g);
                const float *qs[2] = {query_of(&L, g * G, t), query_of(&L, g * G + 1, t)};
                rank_direct(&L, g, qs, G, dr.sh.softmax_scale, set, n, pr);
                int want = n < k ? n : k;
                CHECK(dr.sel.count[g] == want, "count %d want %d", dr.sel.count[g], want);
                for (int a = 0; a < want; a++)
                    CHECK(dr.sel.idx[(size_t)g * dr.sel.cap + a] == pr[a].i, "gen %d t %d kv %d rank %d: %d, want %d",
                          gen, t, g, a, dr.sel.idx[(size_t)g * dr.sel.cap + a], pr[a].i);
                /* extras: the keys after the build, with gen=dense only */
                int ne = gen ? 0 : hi - gen_lo;
                CHECK(dr.sel.n_extra[g] == ne, "gen %d: %d extra, want %d", gen, dr.sel.n_extra[g], ne);
                for (int a = 0; a < ne; a++) CHECK(dr.sel.extra[(size_t)g * dr.sel.extra_cap + a] == gen_lo + a, "extra %d", a);
            }
        }
        free(set); free(pr);
        kv_test_driver_close(&dr);
    }
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_ctkvr_all_centroids_is_exact(void) {
    int T = 480, P = 300, sink = 4, local = 16, k = 20;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 2, 2, 32, 35, &L)); /* G = 1: the group max is the head itself */
    const char *ps[] = {"C=10", "cp=10", "rho=100000", "dcu=off", "gen=rerank"};
    kv_test_driver dc, de;
    CHECK_OK(kv_test_driver_open(&dc, "ctkvr", ps, 5, &L, P, sink, local, k));
    CHECK_OK(kv_test_driver_open(&de, "exact", NULL, 0, &L, P, sink, local, k));
    for (int t = P; t < T; t += 30) {
        CHECK_OK(kv_test_driver_step(&dc, t, k));
        CHECK_OK(kv_test_driver_step(&de, t, k));
        for (int g = 0; g < 2; g++) {
            CHECK(dc.sel.n_cand[g] == t + 1 - local - sink, "t %d: union %d, want the region %d", t, dc.sel.n_cand[g],
                  t + 1 - local - sink);
            int a[64], b[64], n = dc.sel.count[g];
            CHECK(n == de.sel.count[g], "t %d kv %d: %d vs exact %d", t, g, n, de.sel.count[g]);
            memcpy(a, dc.sel.idx + (size_t)g * dc.sel.cap, (size_t)n * sizeof(int));
            memcpy(b, de.sel.idx + (size_t)g * de.sel.cap, (size_t)n * sizeof(int));
            qsort(a, (size_t)n, sizeof(int), cmp_int);
            qsort(b, (size_t)n, sizeof(int), cmp_int);
            CHECK(!memcmp(a, b, (size_t)n * sizeof(int)), "t %d kv %d: selection differs from exact", t, g);
        }
    }
    kv_test_driver_close(&dc);
    kv_test_driver_close(&de);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_ctkvr_dcu_fifo(void) {
    int T = 520, P = 320, sink = 4, local = 16, Hq = 4, G = 2, D = 32, C = 5, rho = 30, k = 10, stride = 13;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, Hq, 2, D, 37, &L));
    for (int oracle = 0; oracle < 2; oracle++) {
        const char *ps[] = {"C=5", "rho=30", "cp=2", oracle ? "dcu=oracle" : "dcu=on"};
        kv_test_driver dr;
        CHECK_OK(kv_test_driver_open(&dr, "ctkvr", ps, 4, &L, P, sink, local, k));
        kv_ctkvr_view v;
        int32_t first[5];
        kv_ctkvr_view_of(dr.st, &v);
        memcpy(first, v.cpos, sizeof first);
        int *set = malloc((size_t)T * sizeof(int)), steps = 0, tlog[64];
        pair *pr = malloc((size_t)T * sizeof(pair));
        for (int t = P; t < T; t += stride, steps++) {
            CHECK_OK(kv_test_driver_step(&dr, t, k));
            tlog[steps] = t;
            kv_ctkvr_view_of(dr.st, &v);
            int slot = steps % C;
            CHECK(v.next == (steps + 1) % C, "after %d searches next = %d", steps + 1, v.next);
            /* FIFO: slot j holds the latest search s with s % C == j, or its prefill query */
            for (int j = 0; j < C; j++) {
                int want = j <= steps ? tlog[steps - ((steps - j) % C)] : first[j];
                if (steps < C && j > steps) want = first[j];
                CHECK(v.cpos[j] == want, "after search %d (t %d) slot %d holds %d, want %d", steps, t, j, v.cpos[j], want);
            }
            for (int h = 0; h < Hq; h++)
                CHECK(!memcmp(v.cq + ((size_t)slot * Hq + h) * D, query_of(&L, h, t), (size_t)D * sizeof(float)),
                      "slot %d head %d: not the query of step %d", slot, h, t);
            int hi = t + 1 - local;
            for (int g = 0; g < 2; g++) {
                int n;
                if (oracle) { /* gen=dense: every key the method may select, [sink, P - local) */
                    n = (hi < P - local ? hi : P - local) - sink;
                    for (int a = 0; a < n; a++) set[a] = sink + a;
                } else {
                    n = dr.sel.n_cand[g];
                    memcpy(set, dr.sel.cand + (size_t)g * dr.sel.cand_cap, (size_t)n * sizeof(int));
                }
                const float *qs[2] = {query_of(&L, g * G, t), query_of(&L, g * G + 1, t)};
                rank_direct(&L, g, qs, G, dr.sh.softmax_scale, set, n, pr);
                int want = n < rho ? n : rho;
                CHECK(v.lcnt[g * C + slot] == want, "slot %d kv %d: %d keys, want %d", slot, g, v.lcnt[g * C + slot], want);
                for (int a = 0; a < want; a++)
                    CHECK(v.lidx[((size_t)g * C + slot) * rho + a] == pr[a].i, "%s t %d kv %d rank %d: %d, want %d",
                          ps[3], t, g, a, v.lidx[((size_t)g * C + slot) * rho + a], pr[a].i);
                if (!oracle) /* the selection is the head of the inserted list (same ranking) */
                    for (int a = 0; a < dr.sel.count[g]; a++)
                        CHECK(dr.sel.idx[(size_t)g * dr.sel.cap + a] == pr[a].i, "selection rank %d", a);
            }
        }
        free(set); free(pr);
        kv_test_driver_close(&dr);
    }
    kv_layer_free(&L);
    return KV_TEST_PASS;
}
