/* exact.c: the oracle retriever: per query head, the k highest exact
 * scores softmax_scale * <q, k_i> over the retrievable region. It is the
 * ceiling every method is measured against (recall 1.0 by construction)
 * and the cost baseline of the benchmark (exact scoring of all keys).
 * Ties are broken towards the smaller index (kernels/topk.h). The keys are
 * kept in the retriever's own [Hkv][T][D] buffer, filled by build() and
 * append(), so it sees nothing the protocol has not handed it. With
 * shape->use_gpu the buffer lives on the device instead (float16 while
 * that is lossless), one key appended per step, and a search is the fused
 * score + top-k of kernels/search.cu; its scores are bitwise those of
 * kv_scores_ref and its order kv_topk_ref's, so both paths select the
 * same indices, ties included. In `kvbench run` on the GPU the keys are the
 * oracle's device copy of the layer (shape->layer_keys, reads_layer_keys):
 * one copy of K on the device, not two (issue 12, goal 3); a search reads
 * only [sink, t + 1 - local), positions it has been handed. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/kv_gpu.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "kv_retriever.h"

typedef struct {
    kv_shape sh;
    int n;          /* keys stored: positions 0..n-1 */
    float *keys;    /* CPU: [Hkv][T][D] */
    float *scores;  /* CPU: [Hq][T] scratch: one row per head so heads run in parallel */
    kv_gpu_keys *dkeys;      /* GPU: its own keys on the device (float16 while lossless), or NULL when lent: */
    const kv_gpu_keys *lent; /* GPU: the layer's keys lent by the run (shape->layer_keys) */
    kv_gpu_search *dsearch;  /* GPU: fused scores + top-k (kernels/search.cu) */
} exact_state;

static void exact_destroy(void *st);

static const kv_param_spec exact_params[] = {{NULL}};

/* The device keys a GPU search reads: the lent layer's or its own (NULL on the CPU path). */
static const kv_gpu_keys *exact_dkeys(const exact_state *s) { return s->lent ? s->lent : s->dkeys; }

static kv_status exact_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    (void)ps;
    exact_state *s = kv_calloc(1, sizeof *s, "exact state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    if (sh->use_gpu) { /* keys live on the device only; all device memory is taken here */
        s->lent = sh->layer_keys;
        kv_status st =
            s->lent ? KV_OK : kv_gpu_keys_create(sh->num_kv_heads, sh->max_tokens, sh->head_dim, 1, &s->dkeys);
        if (st == KV_OK)
            st = kv_gpu_search_create(sh->num_q_heads, sh->num_kv_heads, sh->max_tokens, sh->head_dim, &s->dsearch);
        if (st != KV_OK) { exact_destroy(s); return st; }
        *out = s;
        return KV_OK;
    }
    s->keys = kv_malloc((size_t)sh->num_kv_heads * sh->max_tokens * sh->head_dim * sizeof(float), "exact keys");
    s->scores = kv_malloc((size_t)sh->num_q_heads * sh->max_tokens * sizeof(float), "exact scores");
    if (!s->keys || !s->scores) { free(s->keys); free(s->scores); free(s); return KV_ERR_NOMEM; }
    *out = s;
    return KV_OK;
}

static kv_status exact_build(void *st, const kv_prefill *pre) {
    exact_state *s = st;
    int D = s->sh.head_dim, T = s->sh.max_tokens;
    if (s->lent) { /* already on the device */
        s->n = pre->n;
        return KV_OK;
    }
    if (s->dkeys) {
        if (pre->half) KV_TRY(kv_gpu_keys_write_half_ld(s->dkeys, 0, pre->n, pre->k16, pre->ld));
        else KV_TRY(kv_gpu_keys_write(s->dkeys, 0, pre->n, pre->k));
        s->n = pre->n;
        return KV_OK;
    }
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        if (pre->half) kv_half_to_float_n(pre->k16 + (size_t)g * pre->ld * D, s->keys + (size_t)g * T * D, (size_t)pre->n * D);
        else memcpy(s->keys + (size_t)g * T * D, pre->k + (size_t)g * pre->n * D, (size_t)pre->n * D * sizeof(float));
    s->n = pre->n;
    return KV_OK;
}

static kv_status exact_append(void *st, int t, const float *k, const float *v, const float *q) {
    exact_state *s = st;
    (void)v; (void)q;
    int D = s->sh.head_dim, T = s->sh.max_tokens;
    if (t != s->n || t >= T) return kv_fail(KV_ERR_INTERNAL, "exact: append of position %d, expected %d", t, s->n);
    if (s->dkeys || s->lent) {
        if (s->dkeys) KV_TRY(kv_gpu_keys_write(s->dkeys, t, 1, k));
        s->n++;
        return KV_OK;
    }
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        memcpy(s->keys + ((size_t)g * T + t) * D, k + (size_t)g * D, (size_t)D * sizeof(float));
    s->n++;
    return KV_OK;
}

/* The GPU search in halves (kv_method.search_launch): an empty region launches nothing and fetches nothing. */
static kv_status exact_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    exact_state *s = st;
    (void)sel;
    int lo = s->sh.sink, hi = t + 1 - s->sh.local;
    return kv_gpu_search_launch(s->dsearch, exact_dkeys(s), q, s->sh.softmax_scale, lo, hi > lo ? hi : lo, k, mark);
}

static kv_status exact_finish(void *st, int t, int k, kv_selection *sel) {
    exact_state *s = st;
    (void)t; (void)k;
    return kv_gpu_search_fetch(s->dsearch, sel->idx, sel->cap, sel->count);
}

static kv_status exact_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    exact_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, lo = sh->sink, hi = t + 1 - sh->local;
    if (hi <= lo) return KV_OK;
    if (s->dsearch) {
        KV_TRY(exact_launch(s, t, q, k, sel, NULL));
        return exact_finish(s, t, k, sel);
    }
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
    const kv_gpu_keys *dk = exact_dkeys(s);
    size_t elem = dk ? (size_t)kv_gpu_keys_elem_bytes(dk) : sizeof(float); /* the keys it searches, lent or not */
    return (size_t)s->sh.num_kv_heads * s->n * s->sh.head_dim * elem;
}

/* kvbench bench on a GPU: the stages of one decode step over all Hq heads:
 * score (q.K, float32 scores out), top-k (of the score rows), attention
 * (softmax + PV over every token: what the oracle computes) and exact (this
 * retriever's search: fused scores + top-k), kernels/bench.cu. */
static kv_status exact_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                                 const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out) {
    (void)sh; (void)ps;
    kv_gpu_bench_out r;
    KV_TRY(kv_gpu_bench_run(spec, K, V, q, &r));
    double Hq = spec->Hq, kk = spec->k < spec->n ? spec->k : spec->n, T = spec->n;
    double kv = (double)spec->Hkv * T * spec->D * kv_gpu_keys_elem_bytes(K), sc = Hq * T * 4, qb = Hq * spec->D * 4;
    out->n = 4;
    out->stage[0] = (kv_gpu_stage){"score", r.score, kv + qb + sc};
    out->stage[1] = (kv_gpu_stage){"topk", r.topk, sc + Hq * kk * 4};
    out->stage[2] = (kv_gpu_stage){"attention", r.attn, sc + kv + qb};
    out->stage[3] = (kv_gpu_stage){"exact", r.exact, kv + qb + Hq * kk * 4};
    out->l2_bytes = r.l2_bytes;
    out->flush_bytes = r.flush_bytes;
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "score = K (Hkv*T*D*%d) + q + scores out (Hq*T*4); topk = scores in + indices out; attention = scores + "
             "V + o; exact = K + q + indices (the scores need not reach memory); exact's score launch (with the "
             "tile maxima, and with KVBENCH_SCORE_HIST=1 the top-k's histogram) takes %.1f us of its %.1f", kv_gpu_keys_elem_bytes(K),
             r.exact_scores.med_us, r.exact.med_us);
    return KV_OK;
}

static void exact_destroy(void *st) {
    exact_state *s = st;
    if (!s) return;
    kv_gpu_search_destroy(s->dsearch);
    kv_gpu_keys_destroy(s->dkeys);
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
    .has_gpu = 1,
    .prefill_half = 1,
    .reads_layer_keys = 1,
    .params = exact_params,
    .create = exact_create,
    .build = exact_build,
    .append = exact_append,
    .search = exact_search,
    .memory_bytes = exact_memory,
    .destroy = exact_destroy,
    .bench_gpu = exact_bench_gpu,
    .search_launch = exact_launch,
    .search_finish = exact_finish,
};
