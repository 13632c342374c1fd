/* synth.c: seeded synthetic kvtraces with the structure real attention
 * has, for tests and scale benchmarks (never for reported results).
 *
 * Per layer and kv head, keys before RoPE are k_s = a_s * mu_{c(s)} +
 * 0.3 * b + 0.5 * noise: topic clusters mu_c (the topic c(s) follows a
 * sticky Markov chain, so keys come in runs), a shared component b that
 * RoPE turns into locality (recent keys score higher), heavy hitters (1%
 * of keys with a_s = 1.4 instead of 0.8), and sink tokens 0..3 whose key
 * is 1.2 * sigma with sigma a component every query carries (the
 * attention sink). A query recalls the topic of a random earlier position
 * (long-range retrieval) or the current one. Decode-time shift: from P on,
 * half of the topics come from a second set of centres never seen in the
 * prefill, and all centres drift with t, so an index built at prefill goes
 * stale. Needles: the query that recalls position r also carries 5 times
 * the post-RoPE noise of key r, so attention peaks on that very token (as
 * retrieval heads do), not only on its topic; key noise is drawn from a
 * generator seeded by (seed, layer, kv head, position), so it can be
 * regenerated for any earlier position without storing the keys. Values
 * are a per-head mean plus a topic mean plus noise (a zero-mean V would
 * make |o| vanish under flat attention and relative output errors blow up). RoPE (theta 10000) is applied to q and k. Rows are generated in
 * order with O(H*D + clusters*D) state plus one int per position (the
 * topic history), so T = 1M streams in bounded memory. The noise is an
 * Irwin-Hall approximation of a Gaussian (four 16-bit uniforms): cheap,
 * and the shape of the noise is not what the benchmark studies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_trace.h"

#define SYNTH_TOPICS 32 /* per set; two sets: prefill topics and decode topics */
#define SYNTH_SINKS 4

struct kv_synth {
    kv_synth_spec sp;
    int layer, next_t, topic;
    kv_rng rng;
    float *mu;     /* [Hkv][2*TOPICS][D] */
    float *drift;  /* [Hkv][2*TOPICS][D] */
    float *base;   /* [Hkv][D] */
    float *sigma;  /* [Hkv][D] */
    float *hoff;   /* [Hq][D] per-head query offset */
    float *vmean;  /* [Hkv][2*TOPICS][D] value means */
    int *history;  /* [T] topic of each position */
    float *inv_freq; /* [D/2] */
    float *tmp;    /* [D] */
    float *needle; /* [D] */
};

static inline float fast_normal(kv_rng *r) {
    uint64_t u = kv_rng_u64(r);
    float s = (float)(u & 0xffff) + (float)((u >> 16) & 0xffff) + (float)((u >> 32) & 0xffff) + (float)(u >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* The noise of key (g, t) before RoPE, regenerated on demand. */
static void key_noise(const kv_synth *s, int g, int t, float *out) {
    kv_rng r;
    kv_rng_seed(&r, (s->sp.seed * 1000003ULL + (uint64_t)s->layer) * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)g << 40) ^
                        (uint64_t)t);
    for (int d = 0; d < s->sp.dim; d++) out[d] = 0.5f * fast_normal(&r);
}

static void fill_normal(kv_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * fast_normal(r);
}

kv_status kv_synth_create(const kv_synth_spec *sp, int layer, kv_synth **out) {
    kv_synth *s = kv_calloc(1, sizeof *s, "synth state");
    if (!s) return KV_ERR_NOMEM;
    s->sp = *sp;
    s->layer = layer;
    int D = sp->dim, Hkv = sp->kv_heads, Hq = sp->q_heads, C = 2 * SYNTH_TOPICS;
    size_t nc = (size_t)Hkv * C * D;
    s->mu = kv_malloc(nc * sizeof(float), "synth centres");
    s->drift = kv_malloc(nc * sizeof(float), "synth drift");
    s->vmean = kv_malloc(nc * sizeof(float), "synth value means");
    s->base = kv_malloc((size_t)Hkv * D * sizeof(float), "synth base");
    s->sigma = kv_malloc((size_t)Hkv * D * sizeof(float), "synth sink");
    s->hoff = kv_malloc((size_t)Hq * D * sizeof(float), "synth head offsets");
    s->history = kv_malloc((size_t)sp->tokens * sizeof(int), "synth topic history");
    s->inv_freq = kv_malloc((size_t)(D / 2 + 1) * sizeof(float), "synth rope");
    s->tmp = kv_malloc((size_t)D * sizeof(float), "synth scratch");
    s->needle = kv_malloc((size_t)D * sizeof(float), "synth needle");
    if (!s->needle || !s->mu || !s->drift || !s->vmean || !s->base || !s->sigma || !s->hoff || !s->history || !s->inv_freq ||
        !s->tmp) {
        kv_synth_destroy(s);
        return KV_ERR_NOMEM;
    }
    kv_rng_seed(&s->rng, sp->seed * 1000003ULL + (uint64_t)layer);
    fill_normal(&s->rng, s->mu, nc, 1.0f);
    fill_normal(&s->rng, s->drift, nc, 1.0f);
    fill_normal(&s->rng, s->vmean, nc, 1.0f);
    fill_normal(&s->rng, s->base, (size_t)Hkv * D, 1.0f);
    fill_normal(&s->rng, s->sigma, (size_t)Hkv * D, 1.0f);
    fill_normal(&s->rng, s->hoff, (size_t)Hq * D, 0.3f);
    for (int i = 0; i < D / 2; i++) s->inv_freq[i] = powf(10000.f, -2.f * (float)i / (float)D);
    *out = s;
    return KV_OK;
}

void kv_synth_destroy(kv_synth *s) {
    if (!s) return;
    free(s->mu); free(s->drift); free(s->vmean); free(s->base); free(s->sigma); free(s->hoff);
    free(s->history); free(s->inv_freq); free(s->tmp); free(s->needle);
    free(s);
}

static void rope(const kv_synth *s, float *x, int t) {
    int D = s->sp.dim;
    for (int i = 0; i < D / 2; i++) {
        float a = (float)t * s->inv_freq[i], c = cosf(a), sn = sinf(a);
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * c - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * c;
    }
}

/* Centre of topic c for kv head g at position t, drifting during decode. */
static void centre(const kv_synth *s, int g, int c, int t, float *out) {
    int D = s->sp.dim, C = 2 * SYNTH_TOPICS;
    const float *mu = s->mu + ((size_t)g * C + c) * D, *dr = s->drift + ((size_t)g * C + c) * D;
    float w = t >= s->sp.prefill ? 0.8f * (float)(t - s->sp.prefill) / (float)(s->sp.tokens + 1) : 0.f;
    for (int d = 0; d < D; d++) out[d] = mu[d] + w * dr[d];
}

void kv_synth_rows(kv_synth *s, int t0, int n, float *q, float *k, float *v) {
    const kv_synth_spec *sp = &s->sp;
    int D = sp->dim, Hkv = sp->kv_heads, Hq = sp->q_heads, G = Hq / Hkv, C = 2 * SYNTH_TOPICS;
    kv_rng *r = &s->rng;
    for (int j = 0; j < n; j++) {
        int t = t0 + j;
        /* topic chain: sticky runs; decode draws half its new topics from the second set */
        if (t == 0 || kv_rng_uniform(r) < 0.05) {
            int fresh = t >= sp->prefill && kv_rng_uniform(r) < 0.5;
            s->topic = (fresh ? SYNTH_TOPICS : 0) + (int)(kv_rng_uniform(r) * SYNTH_TOPICS);
        }
        s->history[t] = s->topic;
        int heavy = kv_rng_uniform(r) < 0.01, sink = t < SYNTH_SINKS;
        int recall_t = t > 0 && kv_rng_uniform(r) < 0.6 ? (int)(kv_rng_uniform(r) * t) : t;
        int qtopic = s->history[recall_t];
        for (int g = 0; g < Hkv; g++) {
            float *kk = k + ((size_t)g * n + j) * D;
            const float *b = s->base + (size_t)g * D, *sg = s->sigma + (size_t)g * D;
            centre(s, g, s->topic, t, s->tmp);
            key_noise(s, g, t, s->needle);
            float a = heavy ? 1.4f : 0.8f;
            for (int d = 0; d < D; d++)
                kk[d] = sink ? 1.2f * sg[d] + 0.2f * s->needle[d] : a * s->tmp[d] + 0.3f * b[d] + s->needle[d];
            rope(s, kk, t);
            if (v) {
                float *vv = v + ((size_t)g * n + j) * D;
                const float *vm = s->vmean + ((size_t)g * C + s->topic) * D;
                for (int d = 0; d < D; d++) vv[d] = b[d] + 0.5f * vm[d] + fast_normal(r); /* shared mean: o is not ~0 */
            }
            if (!q) continue;
            centre(s, g, qtopic, t, s->tmp);
            int needle = recall_t != t && recall_t >= SYNTH_SINKS;
            if (needle) { /* post-RoPE noise of key recall_t */
                key_noise(s, g, recall_t, s->needle);
                rope(s, s->needle, recall_t);
            }
            for (int hh = 0; hh < G; hh++) {
                int h = g * G + hh;
                float *qq = q + ((size_t)h * n + j) * D;
                const float *ho = s->hoff + (size_t)h * D;
                for (int d = 0; d < D; d++)
                    qq[d] = 0.5f * s->tmp[d] + 0.5f * sg[d] + 0.3f * b[d] + ho[d] + 0.3f * fast_normal(r);
                rope(s, qq, t);
                if (needle)
                    for (int d = 0; d < D; d++) qq[d] += 5.0f * s->needle[d];
            }
        }
    }
    s->next_t = t0 + n;
}

kv_status kv_synth_write(const char *path, const kv_synth_spec *sp) {
    char desc[256];
    snprintf(desc, sizeof desc, "kvbench synth: seed=%llu tokens=%d prefill=%d (synthetic: not for reported results)",
             (unsigned long long)sp->seed, sp->tokens, sp->prefill);
    kv_trace_spec ts = {
        .model = "kvbench-synth", .description = desc, .rope = "applied", .head_dim = sp->dim,
        .num_q_heads = sp->q_heads, .num_kv_heads = sp->kv_heads, .num_tokens = sp->tokens,
        .prefill_len = sp->prefill, .softmax_scale = 1.0f / sqrtf((float)sp->dim), .half = sp->half, .gzip = sp->gzip,
        .shuffle = sp->shuffle, .fletcher32 = sp->fletcher32, .contiguous = sp->contiguous,
        .chunk_tokens = sp->chunk_tokens > 0 ? sp->chunk_tokens : 4096,
    };
    kv_trace_writer *w;
    KV_TRY(kv_trace_writer_open(path, &ts, &w));
    int block = 4096, D = sp->dim;
    float *q = kv_malloc((size_t)sp->q_heads * block * D * sizeof(float), "synth block q");
    float *k = kv_malloc((size_t)sp->kv_heads * block * D * sizeof(float), "synth block k");
    float *v = kv_malloc((size_t)sp->kv_heads * block * D * sizeof(float), "synth block v");
    int *tok = kv_malloc((size_t)sp->tokens * sizeof(int), "synth tokens");
    kv_status st = (!q || !k || !v || !tok) ? KV_ERR_NOMEM : KV_OK;
    for (int L = 0; L < sp->layers && st == KV_OK; L++) {
        kv_synth *s;
        st = kv_synth_create(sp, L, &s);
        if (st == KV_OK) st = kv_trace_writer_layer(w, L, sp->with_v);
        for (int t0 = 0; t0 < sp->tokens && st == KV_OK; t0 += block) {
            int n = sp->tokens - t0 < block ? sp->tokens - t0 : block;
            kv_synth_rows(s, t0, n, q, k, sp->with_v ? v : NULL);
            st = kv_trace_writer_rows(w, t0, n, q, k, sp->with_v ? v : NULL);
        }
        if (st == KV_OK && L == 0) /* token ids: the topic of each position, handy when plotting */
            for (int t = 0; t < sp->tokens; t++) tok[t] = s->history[t];
        kv_synth_destroy(s);
    }
    if (st == KV_OK) st = kv_trace_writer_tokens(w, tok);
    free(q); free(k); free(v); free(tok);
    kv_status cst = kv_trace_writer_close(w, st == KV_OK);
    return st != KV_OK ? st : cst;
}
