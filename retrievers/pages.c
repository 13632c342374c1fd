/* pages.c: page summaries, bounds, group pooling and page expansion shared
 * by Quest and FreeKV (pages.h). The code is quest.c's, moved here
 * unchanged in its arithmetic (float accumulation in channel order, the
 * softmax's sum of exp in double), so Quest's results are bitwise what they
 * were before the split. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pages.h"

kv_status kv_pages_init(kv_pages *p, const kv_shape *sh, int page, int host, const char *who) {
    memset(p, 0, sizeof *p);
    p->Hkv = sh->num_kv_heads; p->D = sh->head_dim; p->page = page; p->sink = sh->sink;
    int span = sh->max_tokens - sh->sink;
    p->max_pages = (span > 0 ? span / page : 0) + 1;
    if (!host) return KV_OK;
    size_t Hkv = (size_t)p->Hkv, D = (size_t)p->D, P = (size_t)p->max_pages;
    p->kmin = kv_malloc(Hkv * P * D * sizeof(float), who);
    p->kmax = kv_malloc(Hkv * P * D * sizeof(float), who);
    p->cmin = kv_malloc(Hkv * D * sizeof(float), who);
    p->cmax = kv_malloc(Hkv * D * sizeof(float), who);
    if (!p->kmin || !p->kmax || !p->cmin || !p->cmax) { kv_pages_free(p); return KV_ERR_NOMEM; }
    return KV_OK;
}

void kv_pages_free(kv_pages *p) {
    free(p->kmin); free(p->kmax); free(p->cmin); free(p->cmax);
    p->kmin = p->kmax = p->cmin = p->cmax = NULL;
}

/* Key of position t for kv head g into the running summary; the page is
 * written out when its last token arrives. */
static void pages_add_head(kv_pages *p, int g, int t, const float *key) {
    int D = p->D, off = (t - p->sink) % p->page, j = (t - p->sink) / p->page;
    float *mn = p->cmin + (size_t)g * D, *mx = p->cmax + (size_t)g * D;
    if (off == 0) {
        memcpy(mn, key, (size_t)D * sizeof(float));
        memcpy(mx, key, (size_t)D * sizeof(float));
    } else
        for (int i = 0; i < D; i++) {
            mn[i] = key[i] < mn[i] ? key[i] : mn[i];
            mx[i] = key[i] > mx[i] ? key[i] : mx[i];
        }
    if (off == p->page - 1) {
        memcpy(p->kmin + ((size_t)g * p->max_pages + j) * D, mn, (size_t)D * sizeof(float));
        memcpy(p->kmax + ((size_t)g * p->max_pages + j) * D, mx, (size_t)D * sizeof(float));
    }
}

void kv_pages_add(kv_pages *p, int t, const float *k, size_t head_stride) {
    if (t < p->sink) return;
    if (p->kmin)
        for (int g = 0; g < p->Hkv; g++) pages_add_head(p, g, t, k + g * head_stride);
    if ((t - p->sink) % p->page == p->page - 1) p->npages = (t - p->sink) / p->page + 1;
}

float kv_pages_bound(const float *q, const float *kmin, const float *kmax, int d) {
    float acc = 0.f;
    for (int i = 0; i < d; i++) {
        float a = q[i] * kmax[i], b = q[i] * kmin[i];
        acc += a > b ? a : b; /* not fmaxf: a library call here without -ffast-math */
    }
    return acc;
}

int kv_pages_candidates(const kv_pages *p, int hi) {
    if (hi <= p->sink) return 0;
    int n = (hi - p->sink + p->page - 1) / p->page;
    return n < p->npages ? n : p->npages;
}

void kv_pages_bounds(const kv_pages *p, int g, const float *q, int ncand, float *out) {
    size_t D = (size_t)p->D;
    const float *mn = p->kmin + (size_t)g * p->max_pages * D, *mx = p->kmax + (size_t)g * p->max_pages * D;
    for (int j = 0; j < ncand; j++) out[j] = kv_pages_bound(q, mn + (size_t)j * D, mx + (size_t)j * D, p->D);
}

void kv_pages_pool_mean(const float *bound, size_t ld, int G, int ncand, float scale, float *out) {
    for (int j = 0; j < ncand; j++) out[j] = 0.f;
    for (int r = 0; r < G; r++) {
        const float *b = bound + (size_t)r * ld;
        float m = -INFINITY;
        for (int j = 0; j < ncand; j++) m = fmaxf(m, scale * b[j]);
        double z = 0;
        for (int j = 0; j < ncand; j++) z += expf(scale * b[j] - m);
        float w = (float)(1.0 / (z * G));
        for (int j = 0; j < ncand; j++) out[j] += expf(scale * b[j] - m) * w;
    }
}

void kv_pages_pool_max(const float *bound, size_t ld, int G, int ncand, float *out) {
    for (int j = 0; j < ncand; j++) out[j] = -INFINITY;
    for (int r = 0; r < G; r++)
        for (int j = 0; j < ncand; j++) out[j] = fmaxf(out[j], bound[(size_t)r * ld + j]);
}

int kv_pages_expand(const kv_pages *p, const int32_t *pages, int np, int hi, int32_t *out) {
    int c = 0;
    for (int r = 0; r < np; r++) {
        int a = p->sink + pages[r] * p->page, b = a + p->page < hi ? a + p->page : hi;
        for (int i = a; i < b; i++) out[c++] = i;
    }
    return c;
}

int kv_pages_partial(const kv_pages *p, int hi, int32_t *out) {
    int c = 0;
    for (int i = p->sink + p->npages * p->page; i < hi; i++) out[c++] = i;
    return c;
}

size_t kv_pages_bytes(const kv_pages *p) {
    return (size_t)p->Hkv * ((size_t)p->npages + 1) * 2 * (size_t)p->D * sizeof(float);
}

kv_status kv_pages_gpu_create(const kv_pages *p, const kv_shape *sh, kv_quest_gpu **out) {
    KV_TRY(kv_gpu_table(&kv_quest_cuda));
    return kv_quest_cuda.create(sh->num_q_heads, sh->num_kv_heads, sh->max_tokens, sh->head_dim, p->page, sh->sink,
                                p->max_pages, sh->layer_keys && kv_gpu_keys_elem_bytes(sh->layer_keys) == 2, out);
}
