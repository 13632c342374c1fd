/* sampled.c: the sampled-keys floor, and the worked example of "Adding a
 * method" in the README (copy this file to start a new retriever). Per
 * query head, the k highest exact scores among a seeded uniform sample of
 * the keys: key i is in the sample iff u(seed, i) < frac, with u a hash of
 * the position alone, so a key's membership never changes as the context
 * grows and appended keys join at the same rate. It answers the question
 * every index must beat: what does scanning a fraction frac of the keys
 * exactly buy? (Recall@k is about frac whenever frac * n >= k.) The sample
 * is reported as the candidate set, so the protocol prints its candidate
 * recall. CPU only: it needs no GPU path to be a useful floor. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "kv_retriever.h"

typedef struct {
    kv_shape sh;
    double frac;
    uint64_t seed;
    int n;          /* keys stored: positions 0..n-1 */
    float *keys;    /* [Hkv][T][D] */
    uint8_t *in;    /* [T] 1: the position is in the sample */
    int32_t *pos;   /* [T] scratch: sampled positions of the region */
    float *scores;  /* [T] scratch: their scores for one head */
} sampled_state;

/* Parameters are data: `kvbench list`, --param validation and results all read this table. */
static const kv_param_spec sampled_params[] = {
    {"frac", KV_PARAM_FLOAT, KV_PARAM_BUILD, 0.1, 0.0, 1.0, NULL, "fraction of the keys in the sample (1: exact)"},
    {"seed", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 2147483647, NULL, "seed of the sample (added to the run's --seed)"},
    {NULL},
};

/* u(seed, i) in [0, 1): the sample membership of position i. */
static int sampled_member(uint64_t seed, int i, double frac) {
    kv_rng r;
    kv_rng_seed(&r, seed * 0x9e3779b97f4a7c15ULL + (uint64_t)i);
    return kv_rng_uniform(&r) < frac;
}

static void sampled_destroy(void *st) {
    sampled_state *s = st;
    if (!s) return;
    free(s->keys); free(s->in); free(s->pos); free(s->scores);
    free(s);
}

static kv_status sampled_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    sampled_state *s = kv_calloc(1, sizeof *s, "sampled state");
    if (!s) return KV_ERR_NOMEM;
    size_t T = (size_t)sh->max_tokens;
    s->sh = *sh;
    s->frac = kv_param(ps, "frac");
    s->seed = sh->seed + (uint64_t)kv_param_int(ps, "seed");
    s->keys = kv_malloc((size_t)sh->num_kv_heads * T * sh->head_dim * sizeof(float), "sampled keys");
    s->in = kv_malloc(T, "sampled membership");
    s->pos = kv_malloc(T * sizeof(int32_t), "sampled positions");
    s->scores = kv_malloc(T * sizeof(float), "sampled scores");
    if (!s->keys || !s->in || !s->pos || !s->scores) { sampled_destroy(s); return KV_ERR_NOMEM; }
    *out = s;
    return KV_OK;
}

/* Stores position t's key ([Hkv][D]) and decides its membership once. */
static void sampled_store(sampled_state *s, int t, const float *k, size_t head_stride) {
    int D = s->sh.head_dim;
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        memcpy(s->keys + ((size_t)g * s->sh.max_tokens + t) * D, k + (size_t)g * head_stride, (size_t)D * sizeof(float));
    s->in[t] = (uint8_t)sampled_member(s->seed, t, s->frac);
}

static kv_status sampled_build(void *st, const kv_prefill *pre) {
    sampled_state *s = st;
    for (int t = 0; t < pre->n; t++) sampled_store(s, t, pre->k + (size_t)t * s->sh.head_dim, (size_t)pre->n * s->sh.head_dim);
    s->n = pre->n;
    return KV_OK;
}

static kv_status sampled_append(void *st, int t, const float *k, const float *v, const float *q) {
    sampled_state *s = st;
    (void)v; (void)q;
    if (t != s->n || t >= s->sh.max_tokens) return kv_fail(KV_ERR_INTERNAL, "sampled: append of position %d, expected %d", t, s->n);
    sampled_store(s, t, k, (size_t)s->sh.head_dim);
    s->n++;
    return KV_OK;
}

/* The retrievable region is [sink, t+1-local): never a future key, never the
 * sink or the local window (the protocol attends those densely). */
static kv_status sampled_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    sampled_state *s = st;
    const kv_shape *sh = &s->sh;
    int lo = sh->sink, hi = t + 1 - sh->local, D = sh->head_dim, m = 0;
    for (int i = lo; i < hi; i++)
        if (s->in[i]) s->pos[m++] = i;
    for (int h = 0; h < sh->num_q_heads; h++) {
        const float *K = s->keys + (size_t)(h / sh->group) * sh->max_tokens * D;
        for (int j = 0; j < m; j++) kv_scores_ref(q + (size_t)h * D, K + (size_t)s->pos[j] * D, 1, D, sh->softmax_scale, s->scores + j);
        int32_t *idx = sel->idx + (size_t)h * sel->cap;
        int c = kv_topk_ref(s->scores, m, k, 0, idx, NULL);
        for (int j = 0; j < c; j++) idx[j] = s->pos[idx[j]];
        sel->count[h] = c;
        int nc = m < sel->cand_cap ? m : sel->cand_cap;
        memcpy(sel->cand + (size_t)h * sel->cand_cap, s->pos, (size_t)nc * sizeof(int32_t));
        sel->n_cand[h] = nc;
    }
    return KV_OK;
}

/* Index bytes: the membership flags (the keys are the KV cache itself). */
static size_t sampled_memory(const void *st) { return (size_t)((const sampled_state *)st)->sh.max_tokens; }

const kv_method kv_method_sampled = {
    .abi = KV_RETRIEVER_ABI,
    .name = "sampled",
    .summary = "sampled-keys floor: exact top-k over a seeded uniform sample of frac of the keys",
    .paper = "baseline (the README's worked example of adding a method)",
    .per_kv_head = 0,
    .params = sampled_params,
    .create = sampled_create,
    .build = sampled_build,
    .prefill_reads = KV_PREFILL_K, /* build() reads pre->k only */
    .append = sampled_append,
    .search = sampled_search,
    .memory_bytes = sampled_memory,
    .destroy = sampled_destroy,
};
