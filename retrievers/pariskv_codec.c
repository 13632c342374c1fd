/* pariskv_codec.c: the data-independent parts of ParisKV (pariskv_codec.h):
 * the Lloyd-Max magnitude quantiser (paper appendix B.1.2), the SRHT
 * rotation and the 4-bit key encoder (sections 4.1.1-4.1.3), the RSQ-IP
 * estimator (B.2.2), the collision tier weights and the bucket top-k
 * (B.2.1). The RSQ-IP weights are stored as bf16 (rounded to nearest even
 * from the float32 value; kernels/ops/bf16.h), as the released code stores
 * them; the estimator widens them exactly and accumulates in float32. The retriever itself (index, decode updates, search) is
 * pariskv.c.
 *
 * Quadrature: the density of X = |u_j| is proportional to
 * (1-x^2)^((m-3)/2) on [0, 1], singular at x = 1 for m = 2. With
 * x = sin(theta) every integral becomes int cos^(m-2)(theta) g(sin theta)
 * dtheta, smooth for m >= 2, integrated here with 4 panels of 16-point
 * Gauss-Legendre per interval (exact to rounding for these trigonometric
 * polynomials). The test checks the result with closed forms instead. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pariskv_codec.h"

#define GL_N 16
#define GL_PANELS 4

typedef struct { double x[GL_N], w[GL_N]; } gl_rule;

/* Gauss-Legendre nodes and weights on [-1, 1] (Newton on P_n). */
static void gl_init(gl_rule *g) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < (GL_N + 1) / 2; i++) {
        double z = cos(pi * (i + 0.75) / (GL_N + 0.5)), dp = 0;
        for (int it = 0; it < 100; it++) {
            double p0 = 1, p1 = 0;
            for (int j = 1; j <= GL_N; j++) {
                double p2 = p1;
                p1 = p0;
                p0 = ((2.0 * j - 1) * z * p1 - (j - 1.0) * p2) / j;
            }
            dp = GL_N * (z * p0 - p1) / (z * z - 1);
            double dz = p0 / dp;
            z -= dz;
            if (fabs(dz) < 1e-16) break;
        }
        g->x[i] = -z; g->x[GL_N - 1 - i] = z;
        g->w[i] = g->w[GL_N - 1 - i] = 2 / ((1 - z * z) * dp * dp);
    }
}

/* Moments 0, 1, 2 of the (unnormalised) density over [a, b] in x. */
static void moments(const gl_rule *g, int m, double a, double b, double mom[3]) {
    double ta = asin(a < 0 ? 0 : a > 1 ? 1 : a), tb = asin(b < 0 ? 0 : b > 1 ? 1 : b), h = (tb - ta) / GL_PANELS;
    mom[0] = mom[1] = mom[2] = 0;
    for (int p = 0; p < GL_PANELS; p++) {
        double c0 = ta + (p + 0.5) * h;
        for (int i = 0; i < GL_N; i++) {
            double th = c0 + 0.5 * h * g->x[i], wt = 0.5 * h * g->w[i], c = cos(th), s = sin(th), f = 1;
            for (int e = 0; e < m - 2; e++) f *= c;
            mom[0] += wt * f;
            mom[1] += wt * f * s;
            mom[2] += wt * f * s * s;
        }
    }
}

int kv_pariskv_lloyd(int m, int converged, double level[KV_PARISKV_LEVELS], double thr[KV_PARISKV_LEVELS - 1]) {
    enum { L = KV_PARISKV_LEVELS };
    gl_rule g;
    gl_init(&g);
    double mom[3], total, edge[L + 1];
    moments(&g, m, 0, 1, mom);
    total = mom[0];
    edge[0] = 0; edge[L] = 1;
    for (int i = 1; i < L; i++) { /* quantile start: mass(0, x) = i/L of the total, by bisection */
        double lo = 0, hi = 1;
        for (int it = 0; it < 100; it++) {
            double mid = 0.5 * (lo + hi);
            moments(&g, m, 0, mid, mom);
            if (mom[0] < total * i / L) lo = mid; else hi = mid;
        }
        edge[i] = 0.5 * (lo + hi);
    }
    /* the released loop: centres <- conditional means of the bins, then
     * thresholds <- midpoints of the centres; it stops after 100 iterations
     * or when no threshold moves by 1e-9 (keeping the previous thresholds) */
    int max_it = converged ? 1000000 : 100, it;
    double tol = converged ? 1e-14 : 1e-9;
    for (it = 0; it < max_it; it++) {
        double next[L + 1], delta = 0;
        for (int i = 0; i < L; i++) {
            moments(&g, m, edge[i], edge[i + 1], mom);
            level[i] = mom[0] > 0 ? mom[1] / mom[0] : 0.5 * (edge[i] + edge[i + 1]);
        }
        for (int i = 1; i < L; i++) {
            next[i] = 0.5 * (level[i - 1] + level[i]);
            delta = fmax(delta, fabs(next[i] - edge[i]));
        }
        if (delta < tol) break;
        for (int i = 1; i < L; i++) edge[i] = next[i];
    }
    for (int i = 1; i < L; i++) thr[i - 1] = edge[i];
    return it;
}

double kv_pariskv_lloyd_mse(int m, const double level[KV_PARISKV_LEVELS], const double thr[KV_PARISKV_LEVELS - 1]) {
    gl_rule g;
    gl_init(&g);
    double mom[3], total, mse = 0;
    moments(&g, m, 0, 1, mom);
    total = mom[0];
    for (int i = 0; i < KV_PARISKV_LEVELS; i++) {
        double a = i ? thr[i - 1] : 0, b = i < KV_PARISKV_LEVELS - 1 ? thr[i] : 1, c = level[i];
        moments(&g, m, a, b, mom);
        mse += mom[2] - 2 * c * mom[1] + c * c * mom[0];
    }
    return mse / total;
}

kv_status kv_pariskv_codec_init(kv_pariskv_codec *c, int d, int m, int rotate, int normalize, int lloyd_converged,
                                uint64_t seed) {
    memset(c, 0, sizeof *c);
    int dp = d;
    if (rotate) for (dp = 1; dp < d; dp *= 2) {}
    if (m < 2 || m > KV_PARISKV_MAX_M || dp % m)
        return kv_fail(KV_ERR_INPUT, "pariskv: subspace dimension m=%d must be in [2, %d] and divide the %s dimension %d",
                       m, KV_PARISKV_MAX_M, rotate ? "padded (power-of-two)" : "head", dp);
    c->d = d; c->dp = dp; c->m = m; c->nb = dp / m; c->code_bytes = (dp + 1) / 2;
    c->rotate = rotate; c->normalize = normalize;
    if (rotate) {
        c->signs = kv_malloc((size_t)dp * sizeof(float), "pariskv SRHT signs");
        if (!c->signs) return KV_ERR_NOMEM;
        kv_rng r;
        kv_rng_seed(&r, seed);
        for (int j = 0; j < dp; j++) c->signs[j] = (kv_rng_u64(&r) >> 63) ? -1.0f : 1.0f;
    }
    double lv[KV_PARISKV_LEVELS], th[KV_PARISKV_LEVELS - 1];
    kv_pariskv_lloyd(m, lloyd_converged, lv, th);
    for (int i = 0; i < KV_PARISKV_LEVELS; i++) c->level[i] = (float)lv[i];
    for (int i = 0; i < KV_PARISKV_LEVELS - 1; i++) c->thr[i] = (float)th[i];
    return KV_OK;
}

void kv_pariskv_codec_free(kv_pariskv_codec *c) {
    free(c->signs);
    c->signs = NULL;
}

void kv_pariskv_fwht(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int j = 0; j < n; j++) x[j] *= s;
}

float kv_pariskv_transform(const kv_pariskv_codec *c, const float *x, float *out) {
    double ss = 0;
    for (int j = 0; j < c->d; j++) ss += (double)x[j] * x[j];
    float norm = (float)sqrt(ss), inv = c->normalize ? 1.0f / fmaxf(norm, 1e-8f) : 1.0f;
    for (int j = 0; j < c->d; j++) out[j] = x[j] * inv;
    for (int j = c->d; j < c->dp; j++) out[j] = 0;
    if (c->rotate) {
        for (int j = 0; j < c->dp; j++) out[j] *= c->signs[j];
        kv_pariskv_fwht(out, c->dp);
    }
    return c->normalize ? norm : 1.0f;
}

void kv_pariskv_encode(const kv_pariskv_codec *c, const float *k, uint8_t *ids, uint8_t *code, kv_bf16 *w, float *xt) {
    float nk = kv_pariskv_transform(c, k, xt);
    memset(code, 0, (size_t)c->code_bytes);
    for (int b = 0; b < c->nb; b++) {
        const float *x = xt + b * c->m;
        float ss = 0, alpha = 0;
        for (int j = 0; j < c->m; j++) ss += x[j] * x[j];
        float r = sqrtf(ss), inv = r > 0 ? 1.0f / r : 0.0f;
        unsigned id = 0;
        for (int j = 0; j < c->m; j++) {
            int cc = b * c->m + j, pos = x[j] >= 0, t = 0;
            float au = fabsf(x[j] * inv);
            while (t < KV_PARISKV_LEVELS - 1 && c->thr[t] < au) t++; /* torch.bucketize(right=False) */
            id |= (unsigned)pos << j;
            code[cc >> 1] |= (uint8_t)(((pos << 3) | t) << ((cc & 1) * 4));
            alpha += c->level[t] * au;
        }
        ids[b] = (uint8_t)id;
        w[b] = kv_bf16_from_f32(nk * r / fmaxf(alpha, 1e-6f));
    }
}

void kv_pariskv_query_lut(const kv_pariskv_codec *c, const float *qt, float *lut) {
    for (int cc = 0; cc < c->dp; cc++)
        for (int nib = 0; nib < 16; nib++)
            lut[cc * 16 + nib] = (nib & 8 ? qt[cc] : -qt[cc]) * c->level[nib & 7];
}

float kv_pariskv_rsqip(const kv_pariskv_codec *c, const float *lut, const uint8_t *code, const kv_bf16 *w, float qnorm) {
    float acc = 0;
    for (int b = 0, cc = 0; b < c->nb; b++) {
        float dot = 0;
        for (int j = 0; j < c->m; j++, cc++) dot += lut[cc * 16 + ((code[cc >> 1] >> ((cc & 1) * 4)) & 15)];
        acc += kv_bf16_to_f32(w[b]) * dot;
    }
    return qnorm * acc;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void kv_pariskv_tier_weights(const float *cscore, const int32_t *count, int nc, int n, double rho, int multi,
                             uint8_t *wt, int *order) {
    uint64_t key[1 << KV_PARISKV_MAX_M];
    for (int c = 0; c < nc; c++) { /* sort key: score descending (order-preserving bits, inverted), then id */
        float s = cscore[c] == 0 ? 0.0f : cscore[c];
        uint32_t u;
        memcpy(&u, &s, sizeof u);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        key[c] = ((uint64_t)~u << 32) | (uint32_t)c;
    }
    qsort(key, (size_t)nc, sizeof key[0], cmp_u64);
    for (int r = 0; r < nc; r++) order[r] = (int)(key[r] & 0xffffffffu);
    double target[KV_PARISKV_TIERS];
    const int nt = kv_pariskv_tier_targets(n, rho, multi, target); /* as the released code */
    long before = 0;
    for (int r = 0; r < nc; r++) {
        int c = order[r], w = 0;
        for (int t = 0; t < nt; t++) w += (double)before < target[t];
        wt[c] = (uint8_t)w;
        before += count[c];
    }
}

int kv_pariskv_bucket_topk(const uint16_t *score, int n, int max_score, int c, int32_t *out, int *hist) {
    if (c > n) c = n;
    if (c <= 0) return 0;
    memset(hist, 0, (size_t)(max_score + 1) * sizeof *hist);
    for (int i = 0; i < n; i++) hist[score[i]]++;
    int thr = max_score, above = 0;
    while (above + hist[thr] < c) above += hist[thr--];
    int take = c - above, j = 0;
    for (int i = 0; i < n && j < c; i++) {
        int s = score[i];
        if (s > thr) out[j++] = i;
        else if (s == thr && take > 0) { out[j++] = i; take--; }
    }
    return c;
}

void kv_pariskv_adaptive_ratios(int n, double *beta, double *rho) {
    if (n < 5000) { *beta = 0.5; *rho = 0.5; }
    else if (n < 10000) { *beta = 0.25; *rho = 0.3; }
    else if (n < 30000) { *beta = 0.2; *rho = 0.25; }
    else { *beta = 0.1; *rho = 0.2; }
}

int kv_pariskv_candidates(int n, double beta, int k, int floor_k) {
    int C = (int)ceil((double)n * beta), kn = k < n ? k : n;
    if (C < 1) C = 1;
    if (floor_k && C < kn) C = kn;
    return C > n ? n : C;
}

kv_pariskv_gpu_cfg kv_pariskv_gpu_config(const kv_pariskv_codec *cx, const kv_shape *sh, int pool_mean, int update) {
    return (kv_pariskv_gpu_cfg){.Hq = sh->num_q_heads, .Hkv = sh->num_kv_heads, .T = sh->max_tokens,
                                .D = sh->head_dim, .dp = cx->dp, .m = cx->m, .nb = cx->nb,
                                .rows = pool_mean ? sh->num_kv_heads : sh->num_q_heads, .max_update = update,
                                .signs = cx->signs, .level = cx->level, .thr = cx->thr};
}
