/* exact.c: the oracle retriever: per query head, the k highest exact
 * scores softmax_scale * <q, k_i> over the retrievable region. It is the
 * ceiling every method is measured against (recall 1.0 by construction)
 * and the cost baseline of the benchmark (exact scoring of all keys).
 * Ties are broken towards the smaller index (kernels/topk.h). The keys are
 * kept in the retriever's own [Hkv][T][D] buffer, filled by build() and
 * append(), so it sees nothing the protocol has not handed it. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/score.h"
#include "../kernels/topk.h"
#include "kv_retriever.h"

typedef struct {
    kv_shape sh;
    int n;          /* keys stored: positions 0..n-1 */
    float *keys;    /* [Hkv][T][D] */
    float *scores;  /* [Hq][T] scratch: one row per head so heads run in parallel */
} exact_state;

static const kv_param_spec exact_params[] = {{NULL}};

static kv_status exact_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    (void)ps;
    exact_state *s = kv_calloc(1, sizeof *s, "exact state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->keys = kv_malloc((size_t)sh->num_kv_heads * sh->max_tokens * sh->head_dim * sizeof(float), "exact keys");
    s->scores = kv_malloc((size_t)sh->num_q_heads * sh->max_tokens * sizeof(float), "exact scores");
    if (!s->keys || !s->scores) { free(s->keys); free(s->scores); free(s); return KV_ERR_NOMEM; }
    *out = s;
    return KV_OK;
}

static kv_status exact_build(void *st, const kv_prefill *pre) {
    exact_state *s = st;
    int D = s->sh.head_dim, T = s->sh.max_tokens;
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        memcpy(s->keys + (size_t)g * T * D, pre->k + (size_t)g * pre->n * D, (size_t)pre->n * D * sizeof(float));
    s->n = pre->n;
    return KV_OK;
}

static kv_status exact_append(void *st, int t, const float *k, const float *v, const float *q) {
    exact_state *s = st;
    (void)v; (void)q;
    int D = s->sh.head_dim, T = s->sh.max_tokens;
    if (t != s->n || t >= T) return kv_fail(KV_ERR_INTERNAL, "exact: append of position %d, expected %d", t, s->n);
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        memcpy(s->keys + ((size_t)g * T + t) * D, k + (size_t)g * D, (size_t)D * sizeof(float));
    s->n++;
    return KV_OK;
}

static kv_status exact_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    exact_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, lo = sh->sink, hi = t + 1 - sh->local;
    if (hi <= lo) return KV_OK;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int h = 0; h < sh->num_q_heads; h++) {
        const float *K = s->keys + ((size_t)(h / sh->group) * sh->max_tokens + lo) * D;
        float *row = s->scores + (size_t)h * sh->max_tokens;
        kv_scores_ref(q + (size_t)h * D, K, hi - lo, D, sh->softmax_scale, row);
        int c = kv_topk_ref(row, hi - lo, k, lo, sel->idx + (size_t)h * sel->cap, NULL);
        failed |= c < 0;
        sel->count[h] = c < 0 ? 0 : c;
    }
    return failed ? kv_fail(KV_ERR_NOMEM, "exact: out of host memory for top-k scratch") : KV_OK;
}

static size_t exact_memory(const void *st) {
    const exact_state *s = st;
    return (size_t)s->sh.num_kv_heads * s->n * s->sh.head_dim * sizeof(float);
}

static void exact_destroy(void *st) {
    exact_state *s = st;
    if (!s) return;
    free(s->keys);
    free(s->scores);
    free(s);
}

const kv_method kv_method_exact = {
    .abi = KV_RETRIEVER_ABI,
    .name = "exact",
    .summary = "oracle: the k highest exact scores of the retrievable region, per query head",
    .paper = "ground truth",
    .per_kv_head = 0,
    .params = exact_params,
    .create = exact_create,
    .build = exact_build,
    .append = exact_append,
    .search = exact_search,
    .memory_bytes = exact_memory,
    .destroy = exact_destroy,
};
