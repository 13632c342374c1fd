/* test_pariskv.c: the ParisKV retriever (retrievers/pariskv.c) piece by
 * piece, each against a computation written here independently: the SRHT
 * against inner products and an explicit Hadamard matrix; the Lloyd-Max
 * levels against closed-form integrals of the Beta prior; the 4-bit
 * encoder and RSQ-IP against a direct dequantisation and the true inner
 * products; the collision tiers against a hand case and an O(n^2) count;
 * the bucket top-k against a sort; the whole method against the exact
 * oracle (beta=1, rerank=exact, pool=none) and against a brute-force
 * Stage I (rerank=none); the decode update buffer. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/score.h"
#include "../retrievers/kv_retriever.h"
#include "../retrievers/pariskv_codec.h"
#include "kv_test.h"

static void fill_normal(kv_rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)kv_rng_normal(r);
}

static double dot_d(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ---- SRHT ---- */

int test_pariskv_srht_orthogonal(void) {
    /* the FWHT is the Sylvester Hadamard matrix H_ij = (-1)^popcount(i&j) / sqrt(n) */
    float e[16];
    for (int col = 0; col < 16; col++) {
        memset(e, 0, sizeof e);
        e[col] = 1;
        kv_pariskv_fwht(e, 16);
        for (int row = 0; row < 16; row++) {
            float want = (__builtin_popcount(row & col) & 1 ? -1.0f : 1.0f) / 4.0f;
            CHECK(e[row] == want, "H[%d][%d] = %g, want %g", row, col, e[row], want);
        }
    }
    /* inner products and norms preserved, D = 128 and D = 96, 80 padded to 128 */
    int dims[3] = {128, 96, 80};
    kv_rng r;
    kv_rng_seed(&r, 5);
    for (int di = 0; di < 3; di++) {
        int D = dims[di];
        kv_pariskv_codec c;
        CHECK_OK(kv_pariskv_codec_init(&c, D, 8, 1, 0, 0, 7));
        CHECK(c.dp == 128 && c.nb == 16, "D=%d: dp %d nb %d", D, c.dp, c.nb);
        float x[128], y[128], rx[128], ry[128];
        for (int trial = 0; trial < 50; trial++) {
            fill_normal(&r, x, (size_t)D);
            fill_normal(&r, y, (size_t)D);
            CHECK(kv_pariskv_transform(&c, x, rx) == 1.0f, "no normalisation: norm factor 1");
            kv_pariskv_transform(&c, y, ry);
            double nx = sqrt(dot_d(x, x, D)), ny = sqrt(dot_d(y, y, D));
            CHECK_CLOSE(dot_d(rx, ry, 128) / (nx * ny), dot_d(x, y, D) / (nx * ny), 1e-5, 0);
            CHECK_CLOSE(sqrt(dot_d(rx, rx, 128)), nx, 0, 1e-5);
        }
        /* with normalisation: a unit vector and the norm handed back */
        float nk = 0;
        kv_pariskv_codec cn;
        CHECK_OK(kv_pariskv_codec_init(&cn, D, 8, 1, 1, 0, 7));
        nk = kv_pariskv_transform(&cn, x, rx);
        CHECK_CLOSE(nk, sqrt(dot_d(x, x, D)), 0, 1e-6);
        CHECK_CLOSE(dot_d(rx, rx, 128), 1.0, 1e-5, 0);
        kv_pariskv_codec_free(&c);
        kv_pariskv_codec_free(&cn);
    }
    kv_pariskv_codec c;
    CHECK(kv_pariskv_codec_init(&c, 96, 8, 0, 1, 0, 7) == KV_OK && c.dp == 96, "no rotation: no padding");
    kv_pariskv_codec_free(&c);
    CHECK(kv_pariskv_codec_init(&c, 100, 8, 0, 1, 0, 7) == KV_ERR_INPUT, "m must divide D without rotation");
    kv_pariskv_codec_free(&c);
    return KV_TEST_PASS;
}

/* ---- Lloyd-Max: closed forms with x = sin(theta), p = m - 2:
 * J_p(th) = int_0^th cos^p = cos^(p-1) sin / p + (p-1)/p J_(p-2), J_0 = th, J_1 = sin;
 * int_0^th sin cos^p = (1 - cos^(p+1)) / (p+1); int_0^th sin^2 cos^p = J_p - J_(p+2). ---- */
static double jp(int p, double th) {
    if (p == 0) return th;
    if (p == 1) return sin(th);
    return pow(cos(th), p - 1) * sin(th) / p + (double)(p - 1) / p * jp(p - 2, th);
}
static void cf_moments(int m, double a, double b, double mom[3]) {
    int p = m - 2;
    double ta = asin(a), tb = asin(b);
    mom[0] = jp(p, tb) - jp(p, ta);
    mom[1] = (pow(cos(ta), p + 1) - pow(cos(tb), p + 1)) / (p + 1);
    mom[2] = (jp(p, tb) - jp(p + 2, tb)) - (jp(p, ta) - jp(p + 2, ta));
}
static double cf_mse(int m, const double *lv, const double *th) {
    double tot[3], mse = 0;
    cf_moments(m, 0, 1, tot);
    for (int i = 0; i < 8; i++) {
        double mom[3], a = i ? th[i - 1] : 0, b = i < 7 ? th[i] : 1;
        cf_moments(m, a, b, mom);
        mse += mom[2] - 2 * lv[i] * mom[1] + lv[i] * lv[i] * mom[0];
    }
    return mse / tot[0];
}

int test_pariskv_lloyd_max(void) {
    for (int m = 2; m <= 8; m *= 2) {
        double lv[8], th[7];
        int it = kv_pariskv_lloyd(m, 1, lv, th);
        CHECK(it > 100 && it < 1000000, "m=%d: converged in %d iterations", m, it);
        for (int i = 0; i < 8; i++) { /* centroid condition */
            double mom[3];
            cf_moments(m, i ? th[i - 1] : 0, i < 7 ? th[i] : 1, mom);
            CHECK_CLOSE(lv[i], mom[1] / mom[0], 1e-10, 0);
        }
        for (int i = 0; i < 7; i++) CHECK_CLOSE(th[i], 0.5 * (lv[i] + lv[i + 1]), 1e-12, 0); /* midpoints */
        /* the released procedure: not the fixed point, a slightly higher distortion */
        double lr[8], tr[7];
        CHECK(kv_pariskv_lloyd(m, 0, lr, tr) == 100, "released: 100 iterations");
        double d = 0;
        for (int i = 0; i < 7; i++) d = fmax(d, fabs(tr[i] - th[i]));
        CHECK(d > 1e-4, "m=%d: released %.2e from converged", m, d);
        double mc = cf_mse(m, lv, th), mr = cf_mse(m, lr, tr);
        CHECK(mc <= mr, "m=%d: converged MSE %.9g above released %.9g", m, mc, mr);
        CHECK_CLOSE(kv_pariskv_lloyd_mse(m, lv, th), mc, 1e-12, 1e-9);
    }
    /* m = 8 released values (amy-77/ParisKV polar_cache.py, METHODS.md) */
    static const double rel_thr[7] = {0.0843, 0.1698, 0.2578, 0.3499, 0.4487, 0.5585, 0.6901};
    static const double rel_lv[8] = {0.0420, 0.1266, 0.2130, 0.3025, 0.3973, 0.5001, 0.6169, 0.7633};
    double lv[8], th[7];
    kv_pariskv_lloyd(8, 0, lv, th);
    for (int i = 0; i < 7; i++) CHECK_CLOSE(th[i], rel_thr[i], 1e-3, 0);
    for (int i = 0; i < 8; i++) CHECK_CLOSE(lv[i], rel_lv[i], 1e-3, 0);
    kv_pariskv_lloyd(8, 1, lv, th); /* while the fixed point is farther than that (about 3e-3) */
    double d = 0;
    for (int i = 0; i < 7; i++) d = fmax(d, fabs(th[i] - rel_thr[i]));
    CHECK(d > 1e-3, "converged thresholds %.2e from the released ones", d);
    return KV_TEST_PASS;
}

/* ---- encoder and RSQ-IP ---- */

/* bf16 rounding (kernels/ops/bf16.h) on hand cases: exact values, round to
 * nearest with ties to even, overflow to infinity, NaN stays NaN. */
int test_pariskv_bf16_rounding(void) {
    static const struct { uint32_t in; uint16_t want; } cs[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 exact */
        {0x3f807fffu, 0x3f80}, /* below half an ulp: down */
        {0x3f808000u, 0x3f80}, /* tie, 0x3f80 even: down */
        {0x3f818000u, 0x3f82}, /* tie, 0x3f81 odd: up to even */
        {0x3f808001u, 0x3f81}, /* above half: up */
        {0xbf80c000u, 0xbf81}, /* negative, above half: away from zero */
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000}, /* signed zeros */
        {0x00018000u, 0x0002}, /* subnormal tie to even (0x0001 odd: up) */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to +inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f800001u, 0x7fc0}, /* signalling NaN: quiet NaN, not inf */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        float f;
        memcpy(&f, &cs[i].in, 4);
        kv_bf16 h = kv_bf16_from_f32(f);
        CHECK(h == cs[i].want, "case %zu: 0x%08x -> 0x%04x, want 0x%04x", i, cs[i].in, h, cs[i].want);
        uint32_t back;
        float g = kv_bf16_to_f32(h);
        memcpy(&back, &g, 4);
        CHECK(back == (uint32_t)h << 16, "case %zu: widening is not exact", i);
    }
    /* against double arithmetic: the nearest of the two bf16 neighbours, ties to the even one */
    kv_rng r;
    kv_rng_seed(&r, 5);
    for (int i = 0; i < 100000; i++) {
        float f = (float)(kv_rng_normal(&r) * exp(kv_rng_normal(&r) * 5));
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        double dl = fabs((double)f - kv_bf16_to_f32(lo)), dh = fabs((double)f - kv_bf16_to_f32(hi));
        uint16_t want = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
        CHECK(kv_bf16_from_f32(f) == want, "%.9g: 0x%04x, want 0x%04x", f, kv_bf16_from_f32(f), want);
    }
    return KV_TEST_PASS;
}

int test_pariskv_rsqip_estimate(void) {
    enum { D = 128, N = 4000 };
    kv_pariskv_codec c;
    CHECK_OK(kv_pariskv_codec_init(&c, D, 8, 1, 1, 0, 11));
    kv_rng r;
    kv_rng_seed(&r, 3);
    float k[D], q[D], kt[D], qt[D], lut[D * 16];
    kv_bf16 w[16];
    uint8_t ids[16], code[64];
    double err_ind = 0, err_cor = 0, bias = 0;
    for (int trial = 0; trial < N; trial++) {
        fill_normal(&r, k, D);
        fill_normal(&r, q, D);
        for (int j = 0; j < D; j++) k[j] *= 3; /* raw scale: the estimator multiplies |k| |q| back */
        int correlated = trial & 1;
        if (correlated) for (int j = 0; j < D; j++) q[j] = 0.5f * q[j] + k[j] / 3; /* cosine about 0.9 */
        kv_pariskv_encode(&c, k, ids, code, w, kt);
        float qn = kv_pariskv_transform(&c, q, qt);
        kv_pariskv_query_lut(&c, qt, lut);
        float est = kv_pariskv_rsqip(&c, lut, code, w, qn);
        /* the same estimate by direct dequantisation, and the stored fields from their definitions */
        double direct = 0, nk = sqrt(dot_d(k, k, D)), truth = dot_d(k, q, D);
        for (int b = 0; b < 16; b++) {
            double rb = sqrt(dot_d(kt + b * 8, kt + b * 8, 8)), alpha = 0, vq = 0;
            unsigned id = 0;
            for (int j = 0; j < 8; j++) {
                int cc = b * 8 + j, nib = (code[cc / 2] >> (4 * (cc % 2))) & 15, t = nib & 7;
                double u = kt[cc] / rb, v = (nib & 8 ? 1 : -1) * c.level[t];
                CHECK((nib & 8) == (u >= 0 ? 8 : 0), "sign bit of coordinate %d", cc);
                CHECK((t == 0 || fabs(u) > c.thr[t - 1] - 1e-6) && (t == 7 || fabs(u) <= c.thr[t] + 1e-6),
                      "bin of |u| = %g: %d", fabs(u), t);
                id |= (unsigned)(u >= 0) << j;
                alpha += c.level[t] * fabs(u);
                vq += v * qt[cc];
            }
            CHECK(ids[b] == id, "centroid id of subspace %d: %u, want %u", b, ids[b], id);
            /* bf16 (8-bit significand): within 2^-8 relative of the value, plus float32 rounding */
            CHECK_CLOSE(kv_bf16_to_f32(w[b]), nk * rb / alpha, 0, 1.0 / 256 + 1e-5);
            direct += kv_bf16_to_f32(w[b]) * vq;
        }
        direct *= qn;
        CHECK_CLOSE(est, direct, 1e-4 * nk * qn, 1e-5);
        double rel = fabs(est - truth) / (nk * qn);
        if (correlated) err_cor += fabs(est - truth) / fabs(truth);
        else err_ind += rel, bias += (est - truth) / (nk * qn);
    }
    err_ind /= N / 2; err_cor /= N / 2; bias /= N / 2;
    /* measured (seed 3, 2000 pairs each): mean |error| 0.0052 of |k||q| on
     * independent pairs, mean relative error 0.0026 on pairs with cosine
     * ~0.9, mean signed error 5e-6 of |k||q|; asserted with ~50% margin */
    CHECK(err_ind < 0.0075, "independent pairs: mean error %.4f of |k||q|", err_ind);
    CHECK(err_cor < 0.004, "correlated pairs: mean relative error %.4f", err_cor);
    CHECK(fabs(bias) < 1e-3, "bias %.2e", bias);
    kv_pariskv_codec_free(&c);
    return KV_TEST_PASS;
}

/* ---- Stage I ---- */

static int ranks_before(const float *cs, int a, int b) { return cs[a] > cs[b] || (cs[a] == cs[b] && a < b); }

int test_pariskv_collision_scores(void) {
    /* hand case, one subspace of m = 2: centroid scores 0.1 0.9 -0.5 0.4 rank 1, 3, 0, 2;
     * keys per centroid 3 2 4 1 (n = 10). rho = 1: tier targets ceil(10 f) = 1 2 3 5 8 10;
     * keys before: c1 0 (all 6 tiers), c3 2 (< 3 5 8 10: 4), c0 3 (< 5 8 10: 3), c2 6 (< 8 10: 2).
     * rho = 0.5: targets 1 1 2 3 4 5: c1 6, c3 (2 < 3,4,5) 3, c0 (3 < 4,5) 2, c2 (6) 0.
     * binary, rho = 0.5: target 5: c1, c3, c0 take 1 (before 0, 2, 3), c2 (before 6) 0. */
    float cs[4] = {0.1f, 0.9f, -0.5f, 0.4f};
    int32_t cnt[4] = {3, 2, 4, 1};
    uint8_t wt[4];
    int order[4];
    kv_pariskv_tier_weights(cs, cnt, 4, 10, 1.0, 1, wt, order);
    CHECK(order[0] == 1 && order[1] == 3 && order[2] == 0 && order[3] == 2, "rank order");
    CHECK(wt[0] == 3 && wt[1] == 6 && wt[2] == 2 && wt[3] == 4, "rho=1: %d %d %d %d", wt[0], wt[1], wt[2], wt[3]);
    kv_pariskv_tier_weights(cs, cnt, 4, 10, 0.5, 1, wt, order);
    CHECK(wt[0] == 2 && wt[1] == 6 && wt[2] == 0 && wt[3] == 3, "rho=.5: %d %d %d %d", wt[0], wt[1], wt[2], wt[3]);
    kv_pariskv_tier_weights(cs, cnt, 4, 10, 0.5, 0, wt, order);
    CHECK(wt[0] == 1 && wt[1] == 1 && wt[2] == 0 && wt[3] == 1, "binary: %d %d %d %d", wt[0], wt[1], wt[2], wt[3]);
    /* ties in the centroid scores: the smaller id ranks first; before = 0 3 5 9: 6, 3, 2, 1 */
    float tie[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    kv_pariskv_tier_weights(tie, cnt, 4, 10, 1.0, 1, wt, order);
    CHECK(order[0] == 0 && order[3] == 3 && wt[0] == 6 && wt[1] == 3 && wt[2] == 2 && wt[3] == 1,
          "ties: %d %d %d %d", wt[0], wt[1], wt[2], wt[3]);

    /* random cases against an O(n^2) count: for each key and subspace, the keys
     * whose centroid ranks strictly before its own, and the tiers whose target exceeds that */
    kv_rng r;
    kv_rng_seed(&r, 17);
    static const double frac[6] = {0.05, 0.15, 0.30, 0.50, 0.75, 1.0};
    for (int trial = 0; trial < 40; trial++) {
        int nc = 1 << (2 + trial % 4), nb = 1 + trial % 5, n = 50 + (int)(kv_rng_uniform(&r) * 250), multi = trial % 3 != 0;
        double rho = 0.05 + 0.95 * kv_rng_uniform(&r);
        uint8_t *id = malloc((size_t)n * nb);
        float *csc = malloc((size_t)nb * nc * sizeof(float));
        int32_t *count = calloc((size_t)nb * nc, sizeof(int32_t));
        uint8_t *w = malloc((size_t)nb * nc);
        int *ord = malloc((size_t)nc * sizeof(int)), mismatch = -1;
        for (int i = 0; i < n; i++)
            for (int b = 0; b < nb; b++) { /* skewed: low ids far more frequent */
                double u = kv_rng_uniform(&r);
                id[i * nb + b] = (uint8_t)(u * u * u * nc);
                count[b * nc + id[i * nb + b]]++;
            }
        for (int j = 0; j < nb * nc; j++) csc[j] = (float)(int)(kv_rng_uniform(&r) * 6) * 0.25f; /* many ties */
        for (int b = 0; b < nb; b++) kv_pariskv_tier_weights(csc + b * nc, count + b * nc, nc, n, rho, multi, w + b * nc, ord);
        for (int i = 0; i < n && mismatch < 0; i++) {
            int got = 0, want = 0;
            for (int b = 0; b < nb; b++) {
                got += w[b * nc + id[i * nb + b]];
                int before = 0;
                for (int j = 0; j < n; j++) before += ranks_before(csc + b * nc, id[j * nb + b], id[i * nb + b]);
                for (int t = 0; t < (multi ? 6 : 1); t++) want += before < ceil(n * rho * (multi ? frac[t] : 1.0));
            }
            CHECK(want <= (multi ? 6 : 1) * nb, "score range");
            if (got != want) mismatch = i;
        }
        free(id); free(csc); free(count); free(w); free(ord);
        CHECK(mismatch < 0, "trial %d (nc %d, nb %d, n %d, rho %g, multi %d): key %d differs from the brute force", trial, nc,
              nb, n, rho, multi, mismatch);
    }
    return KV_TEST_PASS;
}

typedef struct { int s; int i; } si_pair;
static int cmp_si(const void *a, const void *b) {
    const si_pair *x = a, *y = b;
    if (x->s != y->s) return y->s - x->s;
    return x->i - y->i;
}

int test_pariskv_bucket_topk(void) {
    kv_rng r;
    kv_rng_seed(&r, 23);
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(kv_rng_uniform(&r) * 2000), maxs = trial % 2 ? 96 : 6, c = (int)(kv_rng_uniform(&r) * (n + 10));
        uint16_t *s = malloc((size_t)n * sizeof *s);
        int32_t *out = malloc((size_t)n * sizeof *out);
        int *hist = malloc((size_t)(maxs + 1) * sizeof *hist);
        si_pair *p = malloc((size_t)n * sizeof *p);
        char *in = calloc((size_t)n, 1);
        for (int i = 0; i < n; i++) {
            s[i] = (uint16_t)(kv_rng_uniform(&r) * (maxs + 1));
            p[i] = (si_pair){s[i], i};
        }
        int got = kv_pariskv_bucket_topk(s, n, maxs, c, out, hist), want = c < n ? c : n, bad = 0;
        qsort(p, (size_t)n, sizeof *p, cmp_si);
        for (int j = 0; j < want; j++) in[p[j].i] = 1;
        for (int j = 0; j < got; j++) bad |= !in[out[j]] || (j && out[j] <= out[j - 1]);
        free(s); free(out); free(hist); free(p); free(in);
        CHECK(got == want, "trial %d: count %d, want %d", trial, got, want);
        CHECK(!bad, "trial %d (n %d, c %d): not the sort's top-c (ties to the smaller index) in ascending order", trial, n, c);
    }
    return KV_TEST_PASS;
}

/* ---- the whole method ---- */

/* Keys around a few directions (so scores have structure), queries near
 * random earlier keys; no values. */
static void layer_random(kv_layer *L, int Hq, int Hkv, int T, int D, uint64_t seed) {
    *L = (kv_layer){.Hq = Hq, .Hkv = Hkv, .T = T, .D = D, .q = malloc((size_t)Hq * T * D * sizeof(float)),
                    .k = malloc((size_t)Hkv * T * D * sizeof(float))};
    kv_rng r;
    kv_rng_seed(&r, seed);
    float dirs[4][256];
    for (int c = 0; c < 4; c++) fill_normal(&r, dirs[c], (size_t)D);
    for (int g = 0; g < Hkv; g++)
        for (int t = 0; t < T; t++) {
            float *k = L->k + ((size_t)g * T + t) * D;
            int c = (int)(kv_rng_uniform(&r) * 4);
            for (int d = 0; d < D; d++) k[d] = 0.7f * dirs[c][d] + (float)kv_rng_normal(&r);
        }
    for (int h = 0; h < Hq; h++)
        for (int t = 0; t < T; t++) {
            const float *kk = L->k + ((size_t)(h / (Hq / Hkv)) * T + (int)(kv_rng_uniform(&r) * (t + 1))) * D;
            float *q = L->q + ((size_t)h * T + t) * D;
            for (int d = 0; d < D; d++) q[d] = kk[d] + 0.8f * (float)kv_rng_normal(&r);
        }
}

/* The shared driver (tests/driver.c) with a NULL-terminated parameter list. */
static kv_status drv_open(kv_test_driver *d, const char *method, const char *const *params, const kv_layer *L, int P,
                          int S, int W, int k) {
    int np = 0;
    while (params && params[np]) np++;
    return kv_test_driver_open(d, method, params, np, L, P, S, W, k);
}

int test_pariskv_matches_exact(void) {
    kv_layer L;
    const int P = 600;
    layer_random(&L, 4, 2, 900, 64, 41);
    int S = 4, W = 16, k = 32;
    const char *pp[] = {"beta=1", "rerank=exact", "pool=none", "update=1", NULL};
    kv_test_driver a, e;
    CHECK_OK(drv_open(&a, "pariskv", pp, &L, P, S, W, k));
    CHECK_OK(drv_open(&e, "exact", NULL, &L, P, S, W, k));
    for (int t = P; t < L.T; t += 7) {
        CHECK_OK(kv_test_driver_step(&a, t, k));
        CHECK_OK(kv_test_driver_step(&e, t, k));
        int n = t + 1 - W - S;
        for (int h = 0; h < L.Hq; h++) {
            /* beta = 1 and update = 1: every region key is a candidate, none is extra */
            CHECK(a.sel.n_cand[h] == n && a.sel.n_extra[h / 2] == 0, "t %d head %d: %d candidates of %d, %d extra", t, h,
                  a.sel.n_cand[h], n, a.sel.n_extra[h / 2]);
            CHECK(a.sel.count[h] == k && e.sel.count[h] == k, "counts %d %d", a.sel.count[h], e.sel.count[h]);
            /* equal as sets up to ties: every index of one scores at least the other's k-th */
            const float *q = L.q + ((size_t)h * L.T + t) * L.D;
            float kth = INFINITY;
            for (int j = 0; j < k; j++)
                kth = fminf(kth, kv_dot_ref(q, L.k + ((size_t)(h / 2) * L.T + e.sel.idx[h * e.sel.cap + j]) * L.D, L.D));
            for (int j = 0; j < k; j++) {
                int i = a.sel.idx[h * a.sel.cap + j];
                float sc = kv_dot_ref(q, L.k + ((size_t)(h / 2) * L.T + i) * L.D, L.D);
                CHECK(sc >= kth, "t %d head %d: index %d scores %g below the exact k-th %g", t, h, i, sc, kth);
            }
        }
    }
    kv_test_driver_close(&a);
    kv_test_driver_close(&e);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* Stage I end to end (rerank=none: the list is the top-k by collision score,
 * smaller index among equals) against centroid ids, counts, tiers and scores
 * recomputed here from the transformed keys and the pooled query. */
int test_pariskv_stage1_brute_force(void) {
    kv_layer L;
    const int P = 500;
    layer_random(&L, 4, 2, 700, 32, 43);
    int S = 4, W = 16, k = 24, m = 4, nb = 8, nc = 16, t = 560; /* update 256: positions >= P-W are extra at t */
    const char *pp[] = {"rerank=none", "m=4", "rho=0.3", "beta=0.2", NULL};
    kv_test_driver a;
    CHECK_OK(drv_open(&a, "pariskv", pp, &L, P, S, W, k));
    CHECK_OK(kv_test_driver_step(&a, t, k));
    kv_pariskv_codec c;
    CHECK_OK(kv_pariskv_codec_init(&c, L.D, m, 1, 1, 0, a.sh.seed)); /* the method's seed: shape seed + seed=0 */
    int n = P - W - S; /* searchable: indexed [S, P-W) (the released layout never indexes the local window) */
    float xt[32];
    uint8_t *id = malloc((size_t)n * nb);
    int *score = calloc((size_t)n, sizeof(int));
    for (int g = 0; g < L.Hkv; g++) {
        for (int i = 0; i < n; i++) {
            kv_pariskv_transform(&c, L.k + ((size_t)g * L.T + S + i) * L.D, xt);
            for (int b = 0; b < nb; b++) {
                unsigned v = 0;
                for (int j = 0; j < m; j++) v |= (unsigned)(xt[b * m + j] >= 0) << j;
                id[i * nb + b] = (uint8_t)v;
            }
        }
        float qv[32], qt[32], csc[16];
        for (int d = 0; d < L.D; d++) qv[d] = (a.qr[(2 * g) * L.D + d] + a.qr[(2 * g + 1) * L.D + d]) / 2;
        kv_pariskv_transform(&c, qv, qt);
        memset(score, 0, (size_t)n * sizeof(int));
        for (int b = 0; b < nb; b++) {
            for (int s = 0; s < nc; s++) {
                float acc = 0;
                for (int j = 0; j < m; j++) acc += (s >> j) & 1 ? qt[b * m + j] : -qt[b * m + j];
                csc[s] = acc;
            }
            for (int i = 0; i < n; i++) {
                int before = 0, w = 0;
                for (int j = 0; j < n; j++) before += ranks_before(csc, id[j * nb + b], id[i * nb + b]);
                static const double frac[6] = {0.05, 0.15, 0.30, 0.50, 0.75, 1.0};
                for (int tt = 0; tt < 6; tt++) w += before < ceil(n * 0.3 * frac[tt]);
                score[i] += w;
            }
        }
        /* top-C (C = ceil(0.2 n)) by score then top-k of those by score: the top-k by (score, -index) */
        si_pair *p = malloc((size_t)n * sizeof *p);
        for (int i = 0; i < n; i++) p[i] = (si_pair){score[i], S + i};
        qsort(p, (size_t)n, sizeof *p, cmp_si);
        for (int h = 2 * g; h < 2 * g + 2; h++) {
            CHECK(a.sel.n_cand[h] == (int)ceil(n * 0.2), "candidates %d", a.sel.n_cand[h]);
            CHECK(a.sel.count[h] == k, "count %d", a.sel.count[h]);
            for (int j = 0; j < k; j++)
                CHECK(a.sel.idx[h * a.sel.cap + j] == p[j].i, "kv head %d head %d rank %d: %d, want %d (score %d)", g, h, j,
                      a.sel.idx[h * a.sel.cap + j], p[j].i, p[j].s);
        }
        free(p);
    }
    /* the region's positions not indexed yet, [P-W, t+1-W): extra */
    for (int g = 0; g < L.Hkv; g++) {
        CHECK(a.sel.n_extra[g] == t + 1 - P, "extra %d", a.sel.n_extra[g]);
        for (int j = 0; j < a.sel.n_extra[g]; j++) CHECK(a.sel.extra[g * a.sel.extra_cap + j] == P - W + j, "extra index");
    }
    free(id); free(score);
    kv_pariskv_codec_free(&c);
    kv_test_driver_close(&a);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* The index layout and the update buffer, for both layouts, against the
 * positions worked out here: released (the default) indexes [S, P-W) at
 * build and, every U decode tokens, what has left the local window, so the
 * window is never indexed and the extra tokens are the appended % U keys
 * before it; eager indexes [S, P) and folds the whole buffer. With beta = 1
 * the candidates are exactly the searchable keys, in position order. */
int test_pariskv_update_buffer(void) {
    kv_layer L;
    const int P = 200;
    layer_random(&L, 4, 2, 400, 32, 47);
    int S = 4, W = 16, k = 8, U = 32;
    size_t per_key = 2 * (4 + 16 + 2 * 4); /* 2 kv heads x (B ids + D/2 code bytes + 2B bf16 weight bytes), D=32, m=8 */
    for (int released = 1; released >= 0; released--) {
        const char *pp[] = {"update=32", "beta=1", released ? "layout=released" : "layout=eager", NULL};
        const char *name = released ? "released" : "eager";
        kv_test_driver a;
        CHECK_OK(drv_open(&a, "pariskv", pp, &L, P, S, W, k));
        int idx0 = released ? P - W : P;
        CHECK(a.m->memory_bytes(a.st) == (size_t)(idx0 - S) * per_key + 2 * 4 * 256 * 4, "%s: index bytes after build: %zu",
              name, a.m->memory_bytes(a.st));
        for (int t = P; t < L.T; t++) {
            CHECK_OK(kv_test_driver_step(&a, t, k));
            int appended = t + 1 - P, hi = t + 1 - W, n_idx = idx0 + appended / U * U;
            int want_extra = hi > n_idx ? hi - n_idx : 0, searchable = (n_idx < hi ? n_idx : hi) - S;
            if (released) CHECK(n_idx <= hi && want_extra == appended % U, "%s: layout arithmetic at %d", name, t);
            for (int g = 0; g < L.Hkv; g++) {
                CHECK(a.sel.n_extra[g] == want_extra, "%s t %d: %d extra, want %d", name, t, a.sel.n_extra[g], want_extra);
                for (int j = 0; j < want_extra; j++)
                    CHECK(a.sel.extra[g * a.sel.extra_cap + j] == n_idx + j, "%s: extra index", name);
            }
            for (int h = 0; h < L.Hq; h++) {
                CHECK(a.sel.n_cand[h] == searchable, "%s t %d: %d candidates, want %d", name, t, a.sel.n_cand[h], searchable);
                for (int j = 0; j < a.sel.n_cand[h]; j++)
                    CHECK(a.sel.cand[h * a.sel.cand_cap + j] == S + j, "%s: candidate order", name);
                CHECK(a.sel.count[h] == (searchable < k ? searchable : k), "%s t %d: %d selected", name, t, a.sel.count[h]);
                for (int j = 0; j < a.sel.count[h]; j++) {
                    int i = a.sel.idx[h * a.sel.cap + j];
                    CHECK(i >= S && i < hi && i < n_idx, "%s t %d: selected %d outside the indexed region", name, t, i);
                }
                /* pool=mean: the group's query heads share the list */
                if (h % 2) CHECK(a.sel.count[h] == a.sel.count[h - 1] &&
                                     !memcmp(a.sel.idx + h * a.sel.cap, a.sel.idx + (h - 1) * a.sel.cap, a.sel.count[h] * 4),
                                 "%s: group lists differ", name);
            }
            if (appended % U == 0) /* just folded */
                CHECK(a.m->memory_bytes(a.st) == (size_t)(n_idx - S) * per_key + 2 * 4 * 256 * 4, "%s t %d: index bytes %zu",
                      name, t, a.m->memory_bytes(a.st));
        }
        kv_test_driver_close(&a);
    }
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* Every ablation switch runs within the contract (region, budget, no
 * duplicates, candidates a superset of the list), and normalisation alone
 * leaves the selections unchanged up to rounding (RSQ-IP and the sign
 * centroids are scale-invariant per vector). */
int test_pariskv_ablation_variants(void) {
    kv_layer L;
    const int P = 400;
    layer_random(&L, 4, 2, 520, 64, 53);
    int S = 4, W = 16, k = 20;
    const char *variants[][4] = {
        {"centroids=kmeans", "kmeans_iters=5", NULL}, {"centroids=kmeans", "rotation=none", NULL},
        {"rotation=none", NULL}, {"tiers=binary", NULL}, {"rerank=none", NULL}, {"rerank=exact", NULL},
        {"pool=none", NULL}, {"lloyd=converged", NULL}, {"m=4", "update=7", NULL}, {"m=2", "beta=0.01", "rho=0.01", NULL},
        {"normalize=0", NULL}, {"normalize=1", NULL},
    };
    int nv = (int)(sizeof variants / sizeof variants[0]), same = 0, total = 0;
    int32_t *prev = malloc((size_t)L.Hq * k * sizeof(int32_t) * (L.T - P));
    for (int v = 0; v < nv; v++) {
        kv_test_driver a;
        CHECK_OK(drv_open(&a, "pariskv", variants[v], &L, P, S, W, k));
        for (int t = P; t < L.T; t++) {
            CHECK_OK(kv_test_driver_step(&a, t, k));
            int hi = t + 1 - W;
            for (int h = 0; h < L.Hq; h++) {
                const int32_t *idx = a.sel.idx + h * a.sel.cap, *cand = a.sel.cand + h * a.sel.cand_cap;
                /* the list is the top min(k, C) of the C candidates (no floor by default, as released) */
                CHECK(a.sel.count[h] == (a.sel.n_cand[h] < k ? a.sel.n_cand[h] : k) && a.sel.n_cand[h] >= 1,
                      "%s: count %d of %d candidates at %d", variants[v][0], a.sel.count[h], a.sel.n_cand[h], t);
                for (int j = 0; j < a.sel.count[h]; j++) {
                    int in_cand = 0;
                    for (int c = 0; c < a.sel.n_cand[h]; c++) in_cand |= cand[c] == idx[j];
                    CHECK(idx[j] >= S && idx[j] < hi && in_cand, "%s: index %d at step %d", variants[v][0], idx[j], t);
                    for (int j2 = 0; j2 < j; j2++) CHECK(idx[j2] != idx[j], "%s: duplicate", variants[v][0]);
                }
                int32_t *p = prev + ((size_t)(t - P) * L.Hq + h) * k;
                if (!strcmp(variants[v][0], "normalize=1"))
                    for (int j = 0; j < k; j++) {
                        int hit = 0;
                        for (int j2 = 0; j2 < k; j2++) hit |= p[j2] == idx[j];
                        same += hit;
                        total++;
                    }
                memcpy(p, idx, (size_t)k * sizeof(int32_t));
            }
        }
        kv_test_driver_close(&a);
    }
    free(prev);
    CHECK(same >= 0.98 * total, "normalize=0 and =1 share %d of %d selections", same, total);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}
