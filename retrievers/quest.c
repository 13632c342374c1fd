/* quest.c: Quest (Tang et al., "Quest: Query-Aware Sparsity for Efficient
 * Long-Context LLM Inference", ICML 2024; code github mit-han-lab/Quest;
 * described as a baseline in "FreeKV: Boosting KV Cache Retrieval for
 * Efficient LLM Inference", Liu et al., ICLR 2026, secs. 2.2 and 5.1, and
 * in "CTKVR: Efficient KV Cache Retrieval for Long-Context LLMs via
 * Centroid-then-Token Indexing", Lu et al., preprint, sec. 4.1.2), CPU
 * reference.
 *
 * Index. The keys are cut into pages of `page` tokens (default 16); per page
 * and channel i the min and max of the keys. Search. The page bound
 * sum_i max(q_i * max_i, q_i * min_i) is an upper bound of <q, k> for every
 * key of the page; the floor(k / page) pages with the largest bounds are
 * selected and contribute their tokens, so the selection never exceeds k.
 *
 * What the released code does and what is chosen here:
 * - Page alignment: pages start at the sink, page j covers
 *   [sink + j*page, sink + (j+1)*page), so the sink (always attended) never
 *   dilutes a page's min/max. Theirs aligns at position 0 (no separate sink).
 * - A page is summarised when its last token arrives (decode pages too).
 *   Tokens of the retrievable region in no full page (the partial last page;
 *   non-empty only when local < page) are attended densely and reported as
 *   extra indices, per kv head (outside the budget; the protocol reports
 *   them as mean_extra). Their kernel path (quest/utils/controller.py) keeps
 *   the last page out of the top-k, always attends it and counts it in the
 *   page budget; their accuracy path (evaluation/quest_attention.py) pads it
 *   and lets it compete, and selects at least 3 pages. Here the selection is
 *   floor(k/page) full pages, possibly none when k < page.
 * - A full page that crosses the local-window boundary is a candidate and
 *   contributes only its tokens inside the region (the rest are attended as
 *   local anyway); pages entirely inside the local window are not candidates.
 * - GQA, `pool`: none = per query head, as their accuracy path (not
 *   group-consistent); mean = FreeKV's group-consistent variant (sec. 3.2:
 *   softmax(softmax_scale * bound) over the pages per query head, averaged
 *   over the group); max = the max of the bounds over the group (how FreeKV
 *   made Quest group-consistent for its comparison, sec. 5.1). The method
 *   always reports per query head; with mean/max the G lists of a group are
 *   identical.
 * - Ties between equal bounds go to the earlier page; tokens of a page are
 *   listed in position order, pages in bound order. Bounds accumulate in
 *   float in channel order.
 * - memory_bytes: the min/max pages (2 x D float32 per page per kv head),
 *   plus the running min/max of the page being filled (the C reference's
 *   index, also on the GPU, whose float16 summaries below hold half).
 * - GPU path (shape->use_gpu, kernels/quest.cu): the summaries live on the
 *   device (channel-major), built and updated there; the bounds (bitwise the
 *   CPU's), pooling and the top-k over pages run there; the page ids come
 *   back and are expanded to tokens here by the same code, and the extra
 *   tokens are computed here as on the CPU. The summaries are float16 when
 *   the run's layer is, else float32 (kv_pages_gpu_create, shared with
 *   FreeKV: session 16 found the run's searches reading float32 summaries
 *   where the bench read float16 ones). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/quest.h"
#include "../kernels/ops/topk.h"
#include "baselines.h"
#include "pages.h"

enum { QUEST_POOL_NONE = 0, QUEST_POOL_MEAN = 1, QUEST_POOL_MAX = 2 };

typedef struct {
    kv_shape sh;
    int pool;
    int n;              /* positions seen */
    kv_pages pg;        /* the page summaries (retrievers/pages.c; host arrays only on the CPU path) */
    float *bound;       /* [Hq][max_pages] scratch */
    float *pooled;      /* [Hkv][max_pages] scratch */
    int32_t *pages;     /* [Hq][max_pages] scratch: selected page ids */
    kv_quest_gpu *gpu;  /* the device path (use_gpu): summaries on the device */
    int g_kp;           /* the launched GPU search's pages per list (0: none launched) */
} quest_state;

static const kv_param_spec quest_params[] = {
    {"page", KV_PARAM_INT, KV_PARAM_BUILD, 16, 1, 65536, NULL, "tokens per page (pages start at the sink)"},
    {"pool", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 2, "none|mean|max",
     "GQA: none = per query head; mean = FreeKV (group mean of page softmax); max = group max of bounds"},
    {NULL},
};

float kv_quest_page_bound(const float *q, const float *kmin, const float *kmax, int d) {
    return kv_pages_bound(q, kmin, kmax, d);
}

static void quest_free(quest_state *s) {
    if (!s) return;
    if (s->gpu) kv_quest_cuda.destroy(s->gpu);
    kv_pages_free(&s->pg);
    free(s->bound); free(s->pooled); free(s->pages);
    free(s);
}

static kv_status quest_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    quest_state *s = kv_calloc(1, sizeof *s, "quest state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->pool = kv_param_int(ps, "pool");
    kv_status st = kv_pages_init(&s->pg, sh, kv_param_int(ps, "page"), !sh->use_gpu, "quest page summaries");
    if (st != KV_OK) { quest_free(s); return st; }
    size_t Hkv = (size_t)sh->num_kv_heads, Hq = (size_t)sh->num_q_heads, P = (size_t)s->pg.max_pages;
    s->pages = kv_malloc(Hq * P * sizeof(int32_t), "quest selected pages");
    if (sh->use_gpu) { /* summaries, bounds and pooling on the device */
        st = !s->pages ? KV_ERR_NOMEM : kv_pages_gpu_create(&s->pg, sh, &s->gpu);
        if (st != KV_OK) { quest_free(s); return st; }
        *out = s;
        return KV_OK;
    }
    s->bound = kv_malloc(Hq * P * sizeof(float), "quest page bounds");
    s->pooled = kv_malloc(Hkv * P * sizeof(float), "quest pooled bounds");
    if (!s->bound || !s->pooled || !s->pages) {
        quest_free(s);
        return KV_ERR_NOMEM;
    }
    *out = s;
    return KV_OK;
}

static kv_status quest_build(void *st, const kv_prefill *pre) {
    quest_state *s = st;
    int D = s->sh.head_dim, Hkv = s->sh.num_kv_heads;
    if (pre->half) { /* the float16 form: one position of every head converted at a time */
        float *row = s->pg.kmin ? kv_malloc((size_t)Hkv * D * sizeof(float), "quest prefill row") : NULL;
        if (s->pg.kmin && !row) return KV_ERR_NOMEM;
        for (int t = 0; t < pre->n; t++) {
            for (int g = 0; row && g < Hkv; g++)
                kv_half_to_float_n(pre->k16 + ((size_t)g * pre->ld + t) * D, row + (size_t)g * D, (size_t)D);
            kv_pages_add(&s->pg, t, row, (size_t)D); /* without page storage (GPU) only the page count is kept */
        }
        free(row);
        s->n = pre->n;
        return s->gpu ? kv_quest_cuda.build_half(s->gpu, pre->k16, pre->n, pre->ld) : KV_OK;
    }
    for (int t = 0; t < pre->n; t++) kv_pages_add(&s->pg, t, pre->k + (size_t)t * D, (size_t)pre->n * D);
    s->n = pre->n;
    return s->gpu ? kv_quest_cuda.build(s->gpu, pre->k, pre->n) : KV_OK;
}

static kv_status quest_append(void *st, int t, const float *k, const float *v, const float *q) {
    quest_state *s = st;
    (void)v; (void)q;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "quest: append of position %d, expected %d", t, s->n);
    if (s->gpu) KV_TRY(kv_quest_cuda.append(s->gpu, t, k));
    kv_pages_add(&s->pg, t, k, (size_t)s->sh.head_dim);
    s->n++;
    return KV_OK;
}

/* What a search of step t selects from, on either path: the region's
 * tokens in no full page go into sel's extra lists (attended densely); the
 * candidates *ncand are the full pages starting inside the region; returns
 * the pages to select per list (<= 0: none). */
static int quest_plan(const quest_state *s, int t, int k, kv_selection *sel, int *ncand) {
    int hi = t + 1 - s->sh.local;
    *ncand = 0;
    if (hi <= s->sh.sink) return 0;
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        sel->n_extra[g] = kv_pages_partial(&s->pg, hi, sel->extra + (size_t)g * sel->extra_cap);
    *ncand = kv_pages_candidates(&s->pg, hi);
    return k / s->pg.page < *ncand ? k / s->pg.page : *ncand;
}

/* The GPU search in halves (kv_method.search_launch): the page ids from the
 * device, expanded into tokens by the CPU's code. */
static kv_status quest_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    quest_state *s = st;
    int ncand, kp = quest_plan(s, t, k, sel, &ncand);
    s->g_kp = 0;
    if (kp <= 0) return KV_OK;
    KV_TRY(kv_quest_cuda.launch(s->gpu, q, s->sh.softmax_scale, s->pool, ncand, kp, mark));
    s->g_kp = kp;
    return KV_OK;
}

static kv_status quest_finish(void *st, int t, int k, kv_selection *sel) {
    quest_state *s = st;
    const kv_shape *sh = &s->sh;
    int hi = t + 1 - sh->local, kp = s->g_kp;
    (void)k;
    if (kp <= 0) return KV_OK;
    KV_TRY(kv_quest_cuda.fetch(s->gpu, s->pages));
    for (int h = 0; h < sh->num_q_heads; h++) {
        const int32_t *pg = s->pages + (size_t)(s->pool == QUEST_POOL_NONE ? h : h / sh->group) * kp;
        sel->count[h] = kv_pages_expand(&s->pg, pg, kp, hi, sel->idx + (size_t)h * sel->cap);
    }
    return KV_OK;
}

static kv_status quest_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    quest_state *s = st;
    if (s->gpu) {
        KV_TRY(quest_launch(s, t, q, k, sel, NULL));
        return quest_finish(s, t, k, sel);
    }
    const kv_shape *sh = &s->sh;
    int G = sh->group, P = s->pg.max_pages, hi = t + 1 - sh->local, ncand, kp = quest_plan(s, t, k, sel, &ncand);
    if (kp <= 0) return KV_OK;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int g = 0; g < sh->num_kv_heads; g++) {
        for (int h = g * G; h < (g + 1) * G; h++)
            kv_pages_bounds(&s->pg, g, q + (size_t)h * sh->head_dim, ncand, s->bound + (size_t)h * P);
        if (s->pool == QUEST_POOL_NONE) {
            for (int h = g * G; h < (g + 1) * G; h++) {
                int32_t *pg = s->pages + (size_t)h * P;
                int np = kv_topk_ref(s->bound + (size_t)h * P, ncand, kp, 0, pg, NULL);
                failed |= np < 0;
                sel->count[h] = np < 0 ? 0 : kv_pages_expand(&s->pg, pg, np, hi, sel->idx + (size_t)h * sel->cap);
            }
            continue;
        }
        float *pool = s->pooled + (size_t)g * P;
        if (s->pool == QUEST_POOL_MAX) kv_pages_pool_max(s->bound + (size_t)g * G * P, (size_t)P, G, ncand, pool);
        else kv_pages_pool_mean(s->bound + (size_t)g * G * P, (size_t)P, G, ncand, sh->softmax_scale, pool);
        int32_t *pg = s->pages + (size_t)g * G * P;
        int np = kv_topk_ref(pool, ncand, kp, 0, pg, NULL);
        failed |= np < 0;
        for (int h = g * G; h < (g + 1) * G; h++)
            sel->count[h] = np < 0 ? 0 : kv_pages_expand(&s->pg, pg, np, hi, sel->idx + (size_t)h * sel->cap);
    }
    return failed ? kv_fail(KV_ERR_NOMEM, "quest: out of host memory for top-k scratch") : KV_OK;
}

/* kvbench bench on a GPU: summaries of all pages and one search, stage by
 * stage (kernels/quest.cu). */
static kv_status quest_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                                 const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q,
                              kv_gpu_stages *out) {
    (void)sh;
    KV_TRY(kv_gpu_table(&kv_quest_cuda));
    return kv_quest_cuda.bench(spec, kv_param_int(ps, "page"), kv_param_int(ps, "pool"), K, q, out);
}

static size_t quest_memory(const void *st) { return kv_pages_bytes(&((const quest_state *)st)->pg); }

static void quest_destroy(void *st) { quest_free(st); }

void kv_quest_view_of(const void *st, kv_quest_view *out) {
    const quest_state *s = st;
    *out = (kv_quest_view){.page = s->pg.page, .npages = s->pg.npages, .kmin = s->pg.kmin, .kmax = s->pg.kmax,
                           .max_pages = s->pg.max_pages};
}

const kv_method kv_method_quest = {
    .abi = KV_RETRIEVER_ABI,
    .name = "quest",
    .summary = "pages with per-channel key min/max; top floor(k/page) pages by the bound sum max(q*max, q*min)",
    .paper = "\"Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference\", Tang et al., ICML 2024, code "
             "mit-han-lab/Quest; pool=mean as FreeKV (\"FreeKV: Boosting KV Cache Retrieval for Efficient LLM "
             "Inference\", Liu et al., ICLR 2026)",
    .per_kv_head = 0,
    .group_pool_param = "pool",
    .has_gpu = 1,
    .prefill_half = 1,
    .params = quest_params,
    .create = quest_create,
    .build = quest_build,
    .append = quest_append,
    .search = quest_search,
    .search_launch = quest_launch,
    .search_finish = quest_finish,
    .memory_bytes = quest_memory,
    .destroy = quest_destroy,
    .bench_gpu = quest_bench_gpu,
};
