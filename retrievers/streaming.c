/* streaming.c: the recency floor (StreamingLLM-style): the k tokens just
 * before the local window, [max(S, t+1-W-k), t+1-W). Together with the
 * protocol's sink and local window this is "sink + a window of W+k
 * recent tokens", the cheapest sensible baseline; one list per kv head. */
#include <stdlib.h>

#include "kv_retriever.h"

typedef struct { kv_shape sh; } streaming_state;

static const kv_param_spec streaming_params[] = {{NULL}};

static kv_status streaming_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    (void)ps;
    streaming_state *s = kv_calloc(1, sizeof *s, "streaming state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    *out = s;
    return KV_OK;
}

static kv_status streaming_build(void *st, const kv_prefill *pre) { (void)st; (void)pre; return KV_OK; }

static kv_status streaming_append(void *st, int t, const float *k, const float *v, const float *q) {
    (void)st; (void)t; (void)k; (void)v; (void)q;
    return KV_OK;
}

static kv_status streaming_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    const streaming_state *s = st;
    (void)q;
    int hi = t + 1 - s->sh.local, lo = hi - k;
    if (lo < s->sh.sink) lo = s->sh.sink;
    for (int g = 0; g < sel->n_lists; g++) {
        int32_t *out = sel->idx + (size_t)g * sel->cap;
        int c = 0;
        for (int i = hi - 1; i >= lo; i--) out[c++] = i; /* most recent first */
        sel->count[g] = c;
    }
    return KV_OK;
}

static size_t streaming_memory(const void *st) { (void)st; return 0; }
static void streaming_destroy(void *st) { free(st); }

const kv_method kv_method_streaming = {
    .abi = KV_RETRIEVER_ABI,
    .name = "streaming",
    .summary = "recency floor: the k tokens just before the local window",
    .paper = "StreamingLLM (\"Efficient Streaming Language Models with Attention Sinks\", Xiao et al., ICLR 2024), as a "
             "budgeted window",
    .per_kv_head = 1,
    .params = streaming_params,
    .create = streaming_create,
    .build = streaming_build,
    .prefill_half = 1, /* reads no prefill */
    .append = streaming_append,
    .search = streaming_search,
    .memory_bytes = streaming_memory,
    .destroy = streaming_destroy,
};
