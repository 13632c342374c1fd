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
 *   plus the running min/max of the page being filled.
 * - GPU path (shape->use_gpu, kernels/quest.cu): the summaries live on the
 *   device (float32, channel-major), built and updated there; the bounds
 *   (bitwise the CPU's), pooling and the top-k over pages run there; the
 *   page ids come back and are expanded to tokens here by the same code, and
 *   the extra tokens are computed here as on the CPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/quest.h"
#include "../kernels/ops/topk.h"
#include "baselines.h"

enum { QUEST_POOL_NONE = 0, QUEST_POOL_MEAN = 1, QUEST_POOL_MAX = 2 };

typedef struct {
    kv_shape sh;
    int page, pool, max_pages;
    int n;              /* positions seen */
    int npages;         /* full pages summarised */
    float *kmin, *kmax; /* [Hkv][max_pages][D] */
    float *cmin, *cmax; /* [Hkv][D] running summary of the page being filled */
    float *bound;       /* [Hq][max_pages] scratch */
    float *pooled;      /* [Hkv][max_pages] scratch */
    int32_t *pages;     /* [Hq][max_pages] scratch: selected page ids */
    kv_quest_gpu *gpu;  /* the device path (use_gpu): summaries on the device */
} quest_state;

static const kv_param_spec quest_params[] = {
    {"page", KV_PARAM_INT, KV_PARAM_BUILD, 16, 1, 65536, NULL, "tokens per page (pages start at the sink)"},
    {"pool", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 2, "none|mean|max",
     "GQA: none = per query head; mean = FreeKV (group mean of page softmax); max = group max of bounds"},
    {NULL},
};

float kv_quest_page_bound(const float *q, const float *kmin, const float *kmax, int d) {
    float acc = 0.f;
    for (int i = 0; i < d; i++) {
        float a = q[i] * kmax[i], b = q[i] * kmin[i];
        acc += a > b ? a : b; /* not fmaxf: a library call here without -ffast-math */
    }
    return acc;
}

static void quest_free(quest_state *s) {
    if (!s) return;
    if (s->gpu) kv_quest_cuda.destroy(s->gpu);
    free(s->kmin); free(s->kmax); free(s->cmin); free(s->cmax); free(s->bound); free(s->pooled); free(s->pages);
    free(s);
}

static kv_status quest_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    quest_state *s = kv_calloc(1, sizeof *s, "quest state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->page = kv_param_int(ps, "page");
    s->pool = kv_param_int(ps, "pool");
    int span = sh->max_tokens - sh->sink;
    s->max_pages = (span > 0 ? span / s->page : 0) + 1;
    size_t Hkv = (size_t)sh->num_kv_heads, Hq = (size_t)sh->num_q_heads, D = (size_t)sh->head_dim,
           P = (size_t)s->max_pages;
    s->pages = kv_malloc(Hq * P * sizeof(int32_t), "quest selected pages");
    if (sh->use_gpu) { /* summaries, bounds and pooling on the device */
        kv_status st = !s->pages ? KV_ERR_NOMEM : kv_gpu_table(&kv_quest_cuda);
        if (st == KV_OK)
            st = kv_quest_cuda.create(sh->num_q_heads, sh->num_kv_heads, sh->max_tokens, sh->head_dim, s->page, sh->sink,
                                      s->max_pages, 0, &s->gpu);
        if (st != KV_OK) { quest_free(s); return st; }
        *out = s;
        return KV_OK;
    }
    s->kmin = kv_malloc(Hkv * P * D * sizeof(float), "quest page minima");
    s->kmax = kv_malloc(Hkv * P * D * sizeof(float), "quest page maxima");
    s->cmin = kv_malloc(Hkv * D * sizeof(float), "quest running minima");
    s->cmax = kv_malloc(Hkv * D * sizeof(float), "quest running maxima");
    s->bound = kv_malloc(Hq * P * sizeof(float), "quest page bounds");
    s->pooled = kv_malloc(Hkv * P * sizeof(float), "quest pooled bounds");
    if (!s->kmin || !s->kmax || !s->cmin || !s->cmax || !s->bound || !s->pooled || !s->pages) {
        quest_free(s);
        return KV_ERR_NOMEM;
    }
    *out = s;
    return KV_OK;
}

/* Key of position t for kv head g into the running summary; the page is
 * written out when its last token arrives. */
static void quest_add(quest_state *s, int g, int t, const float *key) {
    int D = s->sh.head_dim, off = (t - s->sh.sink) % s->page, j = (t - s->sh.sink) / s->page;
    float *mn = s->cmin + (size_t)g * D, *mx = s->cmax + (size_t)g * D;
    if (off == 0) {
        memcpy(mn, key, (size_t)D * sizeof(float));
        memcpy(mx, key, (size_t)D * sizeof(float));
    } else
        for (int i = 0; i < D; i++) {
            mn[i] = key[i] < mn[i] ? key[i] : mn[i];
            mx[i] = key[i] > mx[i] ? key[i] : mx[i];
        }
    if (off == s->page - 1) {
        memcpy(s->kmin + ((size_t)g * s->max_pages + j) * D, mn, (size_t)D * sizeof(float));
        memcpy(s->kmax + ((size_t)g * s->max_pages + j) * D, mx, (size_t)D * sizeof(float));
    }
}

static void quest_add_position(quest_state *s, int t, const float *k, size_t head_stride) {
    if (t < s->sh.sink) return;
    if (!s->gpu)
        for (int g = 0; g < s->sh.num_kv_heads; g++) quest_add(s, g, t, k + g * head_stride);
    if ((t - s->sh.sink) % s->page == s->page - 1) s->npages = (t - s->sh.sink) / s->page + 1;
}

static kv_status quest_build(void *st, const kv_prefill *pre) {
    quest_state *s = st;
    int D = s->sh.head_dim;
    for (int t = 0; t < pre->n; t++) quest_add_position(s, t, pre->k + (size_t)t * D, (size_t)pre->n * D);
    s->n = pre->n;
    return s->gpu ? kv_quest_cuda.build(s->gpu, pre->k, pre->n) : KV_OK;
}

static kv_status quest_append(void *st, int t, const float *k, const float *v, const float *q) {
    quest_state *s = st;
    (void)v; (void)q;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "quest: append of position %d, expected %d", t, s->n);
    if (s->gpu) KV_TRY(kv_quest_cuda.append(s->gpu, t, k));
    quest_add_position(s, t, k, (size_t)s->sh.head_dim);
    s->n++;
    return KV_OK;
}

/* Tokens of the chosen pages inside [.., hi), pages in the given order. */
static int quest_expand(const quest_state *s, const int32_t *pages, int np, int hi, int32_t *out) {
    int c = 0;
    for (int r = 0; r < np; r++) {
        int a = s->sh.sink + pages[r] * s->page, b = a + s->page < hi ? a + s->page : hi;
        for (int i = a; i < b; i++) out[c++] = i;
    }
    return c;
}

static kv_status quest_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    quest_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, G = sh->group, P = s->max_pages, lo = sh->sink, hi = t + 1 - sh->local;
    if (hi <= lo) return KV_OK;
    /* candidate pages: full pages starting inside the region */
    int ncand = (hi - lo + s->page - 1) / s->page;
    if (ncand > s->npages) ncand = s->npages;
    int kp = k / s->page < ncand ? k / s->page : ncand;
    int pstart = lo + s->npages * s->page; /* region tokens in no full page: attended densely */
    for (int g = 0; g < sh->num_kv_heads; g++) {
        int32_t *ex = sel->extra + (size_t)g * sel->extra_cap;
        int c = 0;
        for (int i = pstart; i < hi; i++) ex[c++] = i;
        sel->n_extra[g] = c;
    }
    if (kp <= 0) return KV_OK;
    if (s->gpu) { /* page ids from the device, expanded here */
        KV_TRY(kv_quest_cuda.search(s->gpu, q, sh->softmax_scale, s->pool, ncand, kp, s->pages, NULL));
        for (int h = 0; h < sh->num_q_heads; h++) {
            const int32_t *pg = s->pages + (size_t)(s->pool == QUEST_POOL_NONE ? h : h / G) * kp;
            sel->count[h] = quest_expand(s, pg, kp, hi, sel->idx + (size_t)h * sel->cap);
        }
        return KV_OK;
    }
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int g = 0; g < sh->num_kv_heads; g++) {
        const float *mn = s->kmin + (size_t)g * P * D, *mx = s->kmax + (size_t)g * P * D;
        for (int h = g * G; h < (g + 1) * G; h++) {
            float *b = s->bound + (size_t)h * P;
            for (int j = 0; j < ncand; j++)
                b[j] = kv_quest_page_bound(q + (size_t)h * D, mn + (size_t)j * D, mx + (size_t)j * D, D);
        }
        if (s->pool == QUEST_POOL_NONE) {
            for (int h = g * G; h < (g + 1) * G; h++) {
                int32_t *pg = s->pages + (size_t)h * P;
                int np = kv_topk_ref(s->bound + (size_t)h * P, ncand, kp, 0, pg, NULL);
                failed |= np < 0;
                sel->count[h] = np < 0 ? 0 : quest_expand(s, pg, np, hi, sel->idx + (size_t)h * sel->cap);
            }
            continue;
        }
        float *pool = s->pooled + (size_t)g * P;
        for (int j = 0; j < ncand; j++) pool[j] = s->pool == QUEST_POOL_MAX ? -INFINITY : 0.f;
        for (int h = g * G; h < (g + 1) * G; h++) {
            const float *b = s->bound + (size_t)h * P;
            if (s->pool == QUEST_POOL_MAX) {
                for (int j = 0; j < ncand; j++) pool[j] = fmaxf(pool[j], b[j]);
                continue;
            }
            float m = -INFINITY;
            for (int j = 0; j < ncand; j++) m = fmaxf(m, sh->softmax_scale * b[j]);
            double z = 0;
            for (int j = 0; j < ncand; j++) z += expf(sh->softmax_scale * b[j] - m);
            float w = (float)(1.0 / (z * G));
            for (int j = 0; j < ncand; j++) pool[j] += expf(sh->softmax_scale * b[j] - m) * w;
        }
        int32_t *pg = s->pages + (size_t)g * G * P;
        int np = kv_topk_ref(pool, ncand, kp, 0, pg, NULL);
        failed |= np < 0;
        for (int h = g * G; h < (g + 1) * G; h++)
            sel->count[h] = np < 0 ? 0 : quest_expand(s, pg, np, hi, sel->idx + (size_t)h * sel->cap);
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

static size_t quest_memory(const void *st) {
    const quest_state *s = st;
    size_t D = (size_t)s->sh.head_dim, Hkv = (size_t)s->sh.num_kv_heads;
    return Hkv * ((size_t)s->npages + 1) * 2 * D * sizeof(float);
}

static void quest_destroy(void *st) { quest_free(st); }

void kv_quest_view_of(const void *st, kv_quest_view *out) {
    const quest_state *s = st;
    *out = (kv_quest_view){.page = s->page, .npages = s->npages, .kmin = s->kmin, .kmax = s->kmax,
                           .max_pages = s->max_pages};
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
    .params = quest_params,
    .create = quest_create,
    .build = quest_build,
    .append = quest_append,
    .search = quest_search,
    .memory_bytes = quest_memory,
    .destroy = quest_destroy,
    .bench_gpu = quest_bench_gpu,
};
