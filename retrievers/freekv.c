/* freekv.c: FreeKV ("FreeKV: Boosting KV Cache Retrieval for Efficient
 * LLM Inference", Liu et al., sec. 3.2 speculative retrieval and 3.3 fine-grained correction; code github sjtu-zhao-lab/FreeKV), CPU
 * reference, with a CUDA path that reuses Quest's device summaries. The
 * released code was not in the stored source index this was written from,
 * so every choice below rests on the paper alone.
 *
 * Index: Quest-style page summaries (retrievers/pages.c, the module Quest
 * uses): pages of `page` tokens (default 32, the paper's sec. 5.1), per page
 * and channel the key min/max, page j covering [sink + j*page, sink +
 * (j+1)*page). Selection with a query set Q (the G query heads of kv head g):
 * per head the softmax over the candidate pages of softmax_scale * bound,
 * averaged over the group (sec. 3.2, "group-consistent selection"), the top
 * floor(k/page) pages; one list per kv head (the method is per kv head).
 * Speculation: the selection attended at step t is the one computed at step
 * t-1 with q_{t-1}, over the pages that were candidates then (region [sink,
 * t-local)); it is recomputed here from q_{t-1} (the query appended at
 * position t-1) and the summaries of the pages full at t-1, so the result
 * does not depend on which steps the protocol evaluates (--stride). Its
 * pages are expanded against step t's region; a page that crossed the
 * boundary at t-1 now contributes its token that entered the region.
 * Correction (sec. 3.3): C_g = the mean over the group of cos(q_t,h,
 * q_{t-1},h); if `correct` and C_g < tau, kv head g uses the selection
 * computed with q_t over step t's candidates instead. The per-step method
 * metric "correction_rate" is the fraction of kv heads corrected.
 *
 * Choices where the paper is silent:
 * - Cosines in double (dot and norms accumulated in channel order), the group
 *   mean in double, compared with tau as a double; a zero-norm query gives
 *   cosine 0 (the paper: mean pooling of C_i over the group, sec. 3.3).
 * - Tokens of the region in no full page (non-empty only when local < page
 *   - 1) are attended densely and reported as extra, as Quest does.
 * - Without the prefill's queries (kvbench bench) the first decode step has
 *   no q_{t-1}: it selects with q_t and counts as corrected.
 * - q_t is the query search() is handed; q_{t-1} the one append() was handed
 *   at t-1 (under `kvbench run --lag d` both are d steps late).
 * - GPU path (shape->use_gpu): the summaries live on the device through
 *   Quest's launcher table (kernels/quest.h: summaries, bounds, group-mean
 *   softmax, top-k over pages), the cosine test runs on the device
 *   (kernels/freekv.cu, the same double arithmetic, bitwise the CPU's
 *   decision) and, with correct=1, the re-selection with q_t follows in the
 *   same device step for only the kv heads that fire (kv_freekv_cuda.correct:
 *   the flagged blocks run, the others return at once; no host round trip
 *   between test and selection); pages come back to the host and are
 *   expanded by the same code. The device summaries are float16 when the
 *   run's layer is, float32 otherwise, as Quest's (kv_pages_gpu_create;
 *   session 17).
 *   CUDA's expf may differ from glibc's by an ulp, so near-equal pooled page
 *   scores may order differently (as Quest's pool=mean). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/freekv.h"
#include "../kernels/quest.h"
#include "../kernels/ops/topk.h"
#include "baselines.h"
#include "pages.h"

typedef struct {
    kv_shape sh;
    int correct;
    double tau;
    int n;              /* positions seen */
    int nq;             /* consecutive positions whose query was handed over (q_last, q_prev valid when >= 2) */
    kv_pages pg;
    float *q_last;      /* [Hq][D] query appended at position n-1 */
    float *q_prev;      /* [Hq][D] query appended at position n-2 */
    float *bound;       /* [Hq][max_pages] scratch */
    float *pooled;      /* [Hkv][max_pages] scratch */
    int32_t *spec, *corr; /* [Hkv][max_pages]: pages selected with q_{t-1} / with q_t */
    int *flag;          /* [Hkv]: 1 = corrected at the last search */
    kv_quest_gpu *gpu;
    kv_freekv_gpu *cgpu;
} freekv_state;

static const kv_param_spec freekv_params[] = {
    {"page", KV_PARAM_INT, KV_PARAM_BUILD, 32, 1, 65536, NULL, "tokens per page (pages start at the sink)"},
    {"tau", KV_PARAM_FLOAT, KV_PARAM_SEARCH, 0.9, -2, 2, NULL,
     "correction threshold on the group-mean cosine of q_t and q_{t-1} (paper: 0.9 long generation, 0.8 long input)"},
    {"correct", KV_PARAM_INT, KV_PARAM_SEARCH, 1, 0, 1, NULL, "1 = correct heads below tau; 0 = pure speculation"},
    {NULL},
};

static void freekv_free(freekv_state *s) {
    if (!s) return;
    if (s->gpu) kv_quest_cuda.destroy(s->gpu);
    if (s->cgpu) kv_freekv_cuda.destroy(s->cgpu);
    kv_pages_free(&s->pg);
    free(s->q_last); free(s->q_prev); free(s->bound); free(s->pooled); free(s->spec); free(s->corr); free(s->flag);
    free(s);
}

static kv_status freekv_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    freekv_state *s = kv_calloc(1, sizeof *s, "freekv state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->correct = kv_param_int(ps, "correct");
    s->tau = kv_param(ps, "tau");
    kv_status st = kv_pages_init(&s->pg, sh, kv_param_int(ps, "page"), !sh->use_gpu, "freekv page summaries");
    if (st != KV_OK) { freekv_free(s); return st; }
    size_t Hkv = (size_t)sh->num_kv_heads, Hq = (size_t)sh->num_q_heads, P = (size_t)s->pg.max_pages,
           D = (size_t)sh->head_dim;
    s->q_last = kv_calloc(Hq * D, sizeof(float), "freekv last query");
    s->q_prev = kv_calloc(Hq * D, sizeof(float), "freekv previous query");
    s->spec = kv_malloc(Hkv * P * sizeof(int32_t), "freekv speculative pages");
    s->corr = kv_malloc(Hkv * P * sizeof(int32_t), "freekv corrected pages");
    s->flag = kv_calloc(Hkv, sizeof(int), "freekv correction flags");
    if (!s->q_last || !s->q_prev || !s->spec || !s->corr || !s->flag) { freekv_free(s); return KV_ERR_NOMEM; }
    if (sh->use_gpu) {
        st = kv_pages_gpu_create(&s->pg, sh, &s->gpu);
        if (st == KV_OK) st = kv_gpu_table(&kv_freekv_cuda);
        if (st == KV_OK) st = kv_freekv_cuda.create(sh->num_q_heads, sh->num_kv_heads, sh->head_dim, &s->cgpu);
        if (st != KV_OK) { freekv_free(s); return st; }
    } else {
        s->bound = kv_malloc(Hq * P * sizeof(float), "freekv page bounds");
        s->pooled = kv_malloc(Hkv * P * sizeof(float), "freekv pooled scores");
        if (!s->bound || !s->pooled) { freekv_free(s); return KV_ERR_NOMEM; }
    }
    *out = s;
    return KV_OK;
}

/* Keeps the queries of the last two positions. */
static void freekv_push_query(freekv_state *s, const float *q, size_t head_stride) {
    size_t D = (size_t)s->sh.head_dim;
    float *tmp = s->q_prev;
    s->q_prev = s->q_last;
    s->q_last = tmp;
    for (int h = 0; h < s->sh.num_q_heads; h++) memcpy(s->q_last + h * D, q + h * head_stride, D * sizeof(float));
}

static kv_status freekv_build(void *st, const kv_prefill *pre) {
    freekv_state *s = st;
    size_t D = (size_t)s->sh.head_dim;
    for (int t = 0; t < pre->n; t++) kv_pages_add(&s->pg, t, pre->k + (size_t)t * D, (size_t)pre->n * D);
    s->n = pre->n;
    if (pre->q && pre->n >= 1) {
        freekv_push_query(s, pre->q + (size_t)(pre->n - 1) * D, (size_t)pre->n * D);
        s->nq = 1; /* q_{P-1}: q_{t-1} of the first decode step */
    }
    return s->gpu ? kv_quest_cuda.build(s->gpu, pre->k, pre->n) : KV_OK;
}

static kv_status freekv_append(void *st, int t, const float *k, const float *v, const float *q) {
    freekv_state *s = st;
    (void)v;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "freekv: append of position %d, expected %d", t, s->n);
    if (s->gpu) KV_TRY(kv_quest_cuda.append(s->gpu, t, k));
    kv_pages_add(&s->pg, t, k, (size_t)s->sh.head_dim);
    if (q) { freekv_push_query(s, q, (size_t)s->sh.head_dim); s->nq++; }
    else s->nq = 0;
    s->n++;
    return KV_OK;
}

double kv_freekv_group_cosine(const float *a, const float *b, int G, int D) {
    double acc = 0;
    for (int h = 0; h < G; h++) {
        const float *x = a + (size_t)h * D, *y = b + (size_t)h * D;
        double dot = 0, nx = 0, ny = 0;
        for (int i = 0; i < D; i++) {
            dot += (double)x[i] * y[i];
            nx += (double)x[i] * x[i];
            ny += (double)y[i] * y[i];
        }
        acc += nx > 0 && ny > 0 ? dot / (sqrt(nx) * sqrt(ny)) : 0.0;
    }
    return acc / G;
}

/* Group-mean page selection of kv head g with queries q (its G heads at
 * q + h*D) over pages [0, ncand): kp page ids into pages. */
static int freekv_select(freekv_state *s, int g, const float *q, int ncand, int kp, int32_t *pages) {
    const kv_shape *sh = &s->sh;
    int G = sh->group, P = s->pg.max_pages;
    for (int h = g * G; h < (g + 1) * G; h++)
        kv_pages_bounds(&s->pg, g, q + (size_t)h * sh->head_dim, ncand, s->bound + (size_t)h * P);
    float *pool = s->pooled + (size_t)g * P;
    kv_pages_pool_mean(s->bound + (size_t)g * G * P, (size_t)P, G, ncand, sh->softmax_scale, pool);
    return kv_topk_ref(pool, ncand, kp, 0, pages, NULL);
}

static kv_status freekv_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    freekv_state *s = st;
    const kv_shape *sh = &s->sh;
    int G = sh->group, D = sh->head_dim, Hkv = sh->num_kv_heads, P = s->pg.max_pages, page = s->pg.page;
    int hi = t + 1 - sh->local, hi1 = t - sh->local; /* regions of steps t and t-1 */
    if (hi <= sh->sink) return KV_OK;
    int ncand = kv_pages_candidates(&s->pg, hi);
    /* the pages full at step t-1 (position t-1 seen) and its candidates */
    int full1 = t - 1 >= sh->sink ? (t - sh->sink) / page : 0;
    int ncand1 = hi1 > sh->sink ? (hi1 - sh->sink + page - 1) / page : 0;
    ncand1 = ncand1 < full1 ? ncand1 : full1;
    int kp = k / page < ncand ? k / page : ncand, kp1 = k / page < ncand1 ? k / page : ncand1;
    for (int g = 0; g < Hkv; g++)
        sel->n_extra[g] = kv_pages_partial(&s->pg, hi, sel->extra + (size_t)g * sel->extra_cap);
    /* which kv heads need the correction */
    int any = 0, ncorr = 0, have_prev = s->nq >= 2, done = 0;
    if (s->gpu && have_prev && s->correct && kp > 0) { /* test + re-selection of the heads that fire, one device step */
        KV_TRY(kv_freekv_cuda.correct(s->cgpu, s->gpu, q, s->q_prev, s->tau, sh->softmax_scale, ncand, kp, s->flag,
                                      s->corr));
        done = 1;
    } else if (s->gpu && have_prev)
        KV_TRY(kv_freekv_cuda.cosine(s->cgpu, q, s->q_prev, s->tau, s->flag));
    for (int g = 0; g < Hkv; g++) {
        if (!have_prev) s->flag[g] = 1;
        else if (!s->gpu)
            s->flag[g] = kv_freekv_group_cosine(q + (size_t)g * G * D, s->q_prev + (size_t)g * G * D, G, D) < s->tau;
        s->flag[g] = s->flag[g] && (s->correct || !have_prev);
        any |= s->flag[g];
        ncorr += s->flag[g];
    }
    sel->metric = (float)ncorr / (float)Hkv;
    int np1 = kp1, np = kp;
    if (s->gpu) {
        if (kp1 > 0 && have_prev)
            KV_TRY(kv_quest_cuda.search(s->gpu, s->q_prev, sh->softmax_scale, 1, ncand1, kp1, s->spec, NULL));
        if (kp > 0 && any && !done)
            KV_TRY(kv_quest_cuda.search(s->gpu, q, sh->softmax_scale, 1, ncand, kp, s->corr, NULL));
    }
    int failed = 0;
    for (int g = 0; g < Hkv; g++) {
        int32_t *pages;
        int cnt;
        if (s->flag[g]) {
            pages = s->gpu ? s->corr + (size_t)g * kp : s->corr + (size_t)g * P;
            cnt = kp <= 0 ? 0 : s->gpu ? np : freekv_select(s, g, q, ncand, kp, pages);
        } else {
            pages = s->gpu ? s->spec + (size_t)g * kp1 : s->spec + (size_t)g * P;
            cnt = kp1 <= 0 ? 0 : s->gpu ? np1 : freekv_select(s, g, s->q_prev, ncand1, kp1, pages);
        }
        failed |= cnt < 0;
        sel->count[g] = cnt < 0 ? 0 : kv_pages_expand(&s->pg, pages, cnt, hi, sel->idx + (size_t)g * sel->cap);
    }
    return failed ? kv_fail(KV_ERR_NOMEM, "freekv: out of host memory for top-k scratch") : KV_OK;
}

/* kvbench bench on a GPU: the speculative selection (off the critical path:
 * Quest's pool=mean search over the device summaries) and the correction
 * that is on it (the cosine test, plus one more selection when it fires). */
static kv_status freekv_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                                  const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out) {
    (void)sh; (void)V;
    KV_TRY(kv_gpu_table(&kv_quest_cuda));
    KV_TRY(kv_gpu_table(&kv_freekv_cuda));
    return kv_freekv_cuda.bench(spec, kv_param_int(ps, "page"), K, q, out);
}

static size_t freekv_memory(const void *st) {
    const freekv_state *s = st;
    return kv_pages_bytes(&s->pg) + 2 * (size_t)s->sh.num_q_heads * s->sh.head_dim * sizeof(float);
}

static void freekv_destroy(void *st) { freekv_free(st); }

const kv_method kv_method_freekv = {
    .abi = KV_RETRIEVER_ABI,
    .name = "freekv",
    .summary = "Quest pages (32) with group-mean page softmax; speculative selection with q_{t-1}, corrected per kv "
               "head when the group-mean cosine(q_t, q_{t-1}) < tau",
    .paper = "\"FreeKV: Boosting KV Cache Retrieval for Efficient LLM Inference\", Liu et al., preprint 2025, secs. 3.2-3.3, code sjtu-zhao-lab/FreeKV",
    .per_kv_head = 1,
    .has_gpu = 1,
    .params = freekv_params,
    .create = freekv_create,
    .build = freekv_build,
    .prefill_reads = KV_PREFILL_K | KV_PREFILL_Q, /* build() reads pre->k and pre->q only */
    .append = freekv_append,
    .search = freekv_search,
    .memory_bytes = freekv_memory,
    .destroy = freekv_destroy,
    .bench_gpu = freekv_bench_gpu,
    .metric_name = "correction_rate",
};
