/* random.c: the chance floor: k distinct tokens drawn uniformly from the
 * retrievable region, one list per kv head. The draw at step t for kv head
 * g depends only on (seed, t, g) (Floyd's sampling from a generator seeded
 * with their hash), so results are reproducible whatever the stride. */
#include <stdlib.h>

#include "kv_retriever.h"

typedef struct { kv_shape sh; uint64_t seed; uint8_t *mark; } random_state;

static const kv_param_spec random_params[] = {
    {"seed", KV_PARAM_INT, KV_PARAM_SEARCH, 0, 0, 2147483647, NULL, "seed of the draw (added to the run's --seed)"},
    {NULL},
};

static kv_status random_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    random_state *s = kv_calloc(1, sizeof *s, "random state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->seed = sh->seed + (uint64_t)kv_param_int(ps, "seed");
    s->mark = kv_calloc((size_t)sh->max_tokens, 1, "random marks");
    if (!s->mark) { free(s); return KV_ERR_NOMEM; }
    *out = s;
    return KV_OK;
}

static kv_status random_build(void *st, const kv_prefill *pre) { (void)st; (void)pre; return KV_OK; }

static kv_status random_append(void *st, int t, const float *k, const float *v, const float *q) {
    (void)st; (void)t; (void)k; (void)v; (void)q;
    return KV_OK;
}

static kv_status random_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    random_state *s = st;
    (void)q;
    int lo = s->sh.sink, n = t + 1 - s->sh.local - lo;
    if (n <= 0) return KV_OK;
    if (k > n) k = n;
    for (int g = 0; g < sel->n_lists; g++) {
        kv_rng r;
        kv_rng_seed(&r, s->seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)t << 20) ^ (uint64_t)g);
        int32_t *out = sel->idx + (size_t)g * sel->cap;
        /* Floyd: for j in [n-k, n), pick x in [0, j]; take x or, if taken, j */
        for (int j = n - k, c = 0; j < n; j++, c++) {
            int x = (int)(kv_rng_uniform(&r) * (j + 1));
            if (s->mark[x]) x = j;
            s->mark[x] = 1;
            out[c] = lo + x;
        }
        for (int c = 0; c < k; c++) s->mark[out[c] - lo] = 0;
        sel->count[g] = k;
    }
    return KV_OK;
}

static size_t random_memory(const void *st) { (void)st; return 0; }

static void random_destroy(void *st) {
    random_state *s = st;
    if (s) free(s->mark);
    free(s);
}

const kv_method kv_method_random = {
    .abi = KV_RETRIEVER_ABI,
    .name = "random",
    .summary = "chance floor: k tokens drawn uniformly from the retrievable region (seeded)",
    .paper = "baseline",
    .per_kv_head = 1,
    .params = random_params,
    .create = random_create,
    .build = random_build,
    .prefill_half = 1, /* reads no prefill */
    .append = random_append,
    .search = random_search,
    .memory_bytes = random_memory,
    .destroy = random_destroy,
};
