/* ctkvr.c: CTKVR (Lu et al., "CTKVR: Efficient KV Cache Retrieval for
 * Long-Context LLMs via Centroid-then-Token Indexing"; no public code), CPU
 * reference, following the paper's sec. 3.1 and Algorithms 1-2.
 *
 * Index (Alg. 1). The query centroids are C prefill query positions (the
 * last C by default, C = min(2048, P/16), sec. 4.1.1); a centroid slot holds
 * the Hq query vectors of its position. Per slot and kv head, the top-rho
 * keys by max over the group's query heads of softmax(scale * q_c . K)
 * (lines 2-4), best first: the qcIVF list. Decode (Alg. 2). Per kv head:
 * the cosine of the query to every slot, max over the group (lines 1-2), the
 * top C' slots (line 3, C' = 4), the union of their lists deduplicated (line
 * 4), an exact rerank of that union by max over the group of
 * softmax(scale * q . K_union) (line 5), top k (line 6). Dynamic centroid
 * update (sec. 3.1.3, line 12): the step's queries and the top-rho keys of
 * that step's rerank replace the oldest slot (FIFO).
 *
 * Choices where the paper is silent, and why:
 * - rho and k: the lists are built at prefill, before any k is known; rho
 *   is a build parameter, default ceil(2.5 * k_hint) with k_hint = 100 (the
 *   benchmark's standard k; the paper's rho = 2.5 rho'). Building lazily at
 *   the first search would hide the index cost inside a search. Set k_hint
 *   (or rho) to the k of the run for the paper's ratio.
 * - Indexed keys: the build lists cover [sink, P - local), the part the
 *   paper offloads to the CPU (Alg. 1 lines 5-6: initial and local tokens
 *   stay on the GPU, attended densely; the protocol's sink and local window
 *   are those). The softmax of a centroid runs over that range, not
 *   causally (the index is built once after prefill, as theirs).
 * - Keys that arrive after the build (positions >= P - local once they leave
 *   the local window) are in no list. The paper keeps the GPU-resident part
 *   "static" and never says it indexes decode tokens; in its system they
 *   stay in the GPU cache and are attended densely. `gen=dense` (default):
 *   they are reported as extra indices (attended densely, outside the
 *   budget; the recall on generated keys is then 1 by construction and the
 *   cost is the extras count). `gen=rerank`: they join the rerank set every
 *   step and compete for the k (so DCU can index them). Only DCU ever puts
 *   a key into a list after the build.
 * - Ranking by "max over the group of softmax": computed as the max over the
 *   group of the log-softmax s_h(i) - lse_h (same order as the max of the
 *   softmax, as exp is increasing; lse in double), rounded to float; ties
 *   then go to the smaller position (kernels/topk.h). Cosines in float.
 * - DCU (`dcu`): on = the paper (at every search call: with a step stride
 *   the FIFO advances once per evaluated step); off = frozen lists;
 *   oracle = the exact top-rho by the same ranking of every key the method
 *   may select ([sink, hi) with gen=rerank; [sink, P - local) with
 *   gen=dense, whose later keys are attended densely anyway) (labelled
 *   upper bound, not the paper). The FIFO is shared by the kv
 *   heads (a slot is one position); the initial slots are in position order,
 *   so the first replaced is the earliest position.
 * - A prefill without queries (only `kvbench bench` hands one): the keys of
 *   the centroid positions stand in for their queries (cost, not recall).
 * - Centroid choice (`centroids`, table 4): final (paper), init (the first
 *   C), random (C distinct positions, seeded), equi (evenly spaced).
 * - Parameter stages: dcu and gen are build parameters although they act
 *   at search time, because with DCU every search changes the index (a
 *   search-parameter sweep must not share one index); cp likewise changes
 *   what DCU inserts when dcu is on.
 * - Candidate set: the rerank set (union, plus the generated keys with
 *   gen=rerank), per kv head.
 * - GPU path (kernels/ctkvr.cu): the search comes in halves
 *   (search_launch/search_finish: `kvbench run` queues it behind the other
 *   methods'); DCU's commit of the step's queries and lists follows the
 *   fetch, an update of the index outside the timed search.
 * - memory_bytes: slot queries (Hq x D float32 per slot) + lists (int32).
 *   The exact keys the rerank reads are the KV cache itself (a copy is kept
 *   here, not counted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ctkvr.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "query_centric.h"

enum { CT_DCU_OFF = 0, CT_DCU_ON = 1, CT_DCU_ORACLE = 2 };
enum { CT_GEN_DENSE = 0, CT_GEN_RERANK = 1 };

typedef struct {
    kv_shape sh;
    int C, rho, cp, dcu, gen, choice;
    uint64_t seed;
    int n;          /* positions seen */
    int idx_hi;     /* the build lists cover [sink, idx_hi) */
    int next;       /* FIFO slot replaced next */
    float *keys;    /* [Hkv][T][D] */
    float *cq;      /* [C][Hq][D] */
    float *cnorm;   /* [C][Hq] */
    int32_t *cpos;  /* [C] */
    int32_t *lidx;  /* [Hkv][C][rho] */
    int *lcnt;      /* [Hkv][C] */
    /* scratch per kv head */
    float *cosv;    /* [Hkv][C] */
    int32_t *top;   /* [Hkv][C] */
    int32_t *set;   /* [Hkv][T] rerank set */
    float *rank;    /* [Hkv][T] ranking values of the set */
    double *sc;     /* [Hkv][G][T] raw scores */
    int32_t *sel;   /* [Hkv][T] top positions */
    int *stamp, *epoch;
    int32_t *dcu_list; /* [Hkv][rho] */
    int *dcu_cnt;      /* [Hkv] */
    void *gpu;
    float *qlast;      /* GPU: the launched search's queries [Hq][D], for the host mirror of DCU's commit */
    int launched;      /* GPU: a search is launched and not fetched */
} ct_state;

static const kv_param_spec ct_params[] = {
    {"C", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 1e9, NULL, "query centroids (0: min(2048, P/16), the paper)"},
    {"cp", KV_PARAM_INT, KV_PARAM_SEARCH, 4, 1, 1e9, NULL, "C': centroids retrieved per kv head"},
    {"rho", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 1e9, NULL, "keys per centroid list (0: ceil(2.5 * k_hint))"},
    {"k_hint", KV_PARAM_INT, KV_PARAM_BUILD, 100, 1, 1e9, NULL, "the k the lists are sized for when rho=0"},
    {"dcu", KV_PARAM_ENUM, KV_PARAM_BUILD, 1, 0, 2, "off|on|oracle",
     "dynamic centroid update: on = step's query + top-rho of its rerank (paper); oracle = exact top-rho (upper bound)"},
    {"centroids", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 3, "final|init|random|equi",
     "which prefill query positions become centroids (table 4)"},
    {"gen", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 1, "dense|rerank",
     "keys after the build: attended densely as extra (GPU-resident cache) or reranked every step"},
    {"seed", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 2147483647, NULL, "seed of centroids=random (added to --seed)"},
    {NULL},
};

void kv_ctkvr_positions(int choice, int P, int C, uint64_t seed, int32_t *pos) {
    if (choice == 1) {
        for (int j = 0; j < C; j++) pos[j] = j;
    } else if (choice == 2) {
        int np = 0;
        kv_rng r;
        kv_rng_seed(&r, seed);
        for (int j = P - C; j < P; j++) { /* Floyd: C distinct positions of [0, P) */
            int v = (int)(kv_rng_uniform(&r) * (j + 1)), dup = 0;
            for (int a = 0; a < np; a++) dup |= pos[a] == v;
            pos[np++] = dup ? j : v;
        }
        for (int a = 1; a < C; a++) { /* ascending */
            int32_t x = pos[a];
            int b = a - 1;
            while (b >= 0 && pos[b] > x) { pos[b + 1] = pos[b]; b--; }
            pos[b + 1] = x;
        }
    } else if (choice == 3) {
        for (int j = 0; j < C; j++) pos[j] = (int32_t)(((int64_t)(2 * j + 1) * P) / (2 * (int64_t)C));
    } else {
        for (int j = 0; j < C; j++) pos[j] = P - C + j;
    }
}

static void ct_free(ct_state *s) {
    if (!s) return;
    if (s->gpu) kv_ctkvr_cuda.destroy(s->gpu);
    free(s->keys); free(s->cq); free(s->cnorm); free(s->cpos); free(s->lidx); free(s->lcnt);
    free(s->cosv); free(s->top); free(s->set); free(s->rank); free(s->sc); free(s->sel);
    free(s->stamp); free(s->epoch); free(s->dcu_list); free(s->dcu_cnt); free(s->qlast);
    free(s);
}

static kv_status ct_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    if (sh->use_gpu && !&kv_ctkvr_cuda) return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
    ct_state *s = kv_calloc(1, sizeof *s, "ctkvr state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    int P = sh->prefill_len;
    s->C = kv_param_int(ps, "C");
    if (s->C == 0) s->C = P / 16 < 2048 ? P / 16 : 2048;
    if (s->C > P) s->C = P;
    if (s->C < 1) s->C = 1;
    s->rho = kv_param_int(ps, "rho");
    if (s->rho == 0) s->rho = (int)ceil(2.5 * kv_param_int(ps, "k_hint"));
    int span = sh->max_tokens - sh->sink;
    if (s->rho > span) s->rho = span > 1 ? span : 1;
    s->cp = kv_param_int(ps, "cp");
    s->dcu = kv_param_int(ps, "dcu");
    s->gen = kv_param_int(ps, "gen");
    s->choice = kv_param_int(ps, "centroids");
    s->seed = sh->seed + (uint64_t)kv_param_int(ps, "seed");
    size_t Hkv = (size_t)sh->num_kv_heads, Hq = (size_t)sh->num_q_heads, D = (size_t)sh->head_dim,
           T = (size_t)sh->max_tokens, C = (size_t)s->C, R = (size_t)s->rho, G = (size_t)sh->group;
    s->cq = kv_malloc(C * Hq * D * sizeof(float), "ctkvr centroid queries");
    s->cnorm = kv_malloc(C * Hq * sizeof(float), "ctkvr centroid norms");
    s->cpos = kv_malloc(C * sizeof(int32_t), "ctkvr centroid positions");
    s->lidx = kv_malloc(Hkv * C * R * sizeof(int32_t), "ctkvr lists");
    s->lcnt = kv_calloc(Hkv * C, sizeof(int), "ctkvr list counts");
    s->cosv = kv_malloc(Hkv * C * sizeof(float), "ctkvr cosines");
    s->top = kv_malloc(Hkv * C * sizeof(int32_t), "ctkvr top centroids");
    s->dcu_list = kv_malloc(Hkv * R * sizeof(int32_t), "ctkvr dcu lists");
    s->dcu_cnt = kv_calloc(Hkv, sizeof(int), "ctkvr dcu counts");
    int ok = s->cq && s->cnorm && s->cpos && s->lidx && s->lcnt && s->cosv && s->top && s->dcu_list && s->dcu_cnt;
    if (ok && !sh->use_gpu) {
        s->keys = kv_malloc(Hkv * T * D * sizeof(float), "ctkvr keys");
        s->set = kv_malloc(Hkv * T * sizeof(int32_t), "ctkvr rerank set");
        s->rank = kv_malloc(Hkv * T * sizeof(float), "ctkvr ranking");
        s->sc = kv_malloc(Hkv * G * T * sizeof(double), "ctkvr scores");
        s->sel = kv_malloc(Hkv * T * sizeof(int32_t), "ctkvr selection");
        s->stamp = kv_calloc(Hkv * T, sizeof(int), "ctkvr stamps");
        s->epoch = kv_calloc(Hkv, sizeof(int), "ctkvr epochs");
        ok = s->keys && s->set && s->rank && s->sc && s->sel && s->stamp && s->epoch;
    }
    if (!ok) { ct_free(s); return KV_ERR_NOMEM; }
    for (size_t j = 0; j < C; j++) s->cpos[j] = -1;
    if (sh->use_gpu) {
        kv_ctkvr_gpu_config cfg = {.Hq = sh->num_q_heads, .Hkv = sh->num_kv_heads, .T = sh->max_tokens,
                                   .D = sh->head_dim, .C = s->C, .rho = s->rho, .sink = sh->sink,
                                   .scale = sh->softmax_scale};
        s->qlast = kv_malloc((size_t)sh->num_q_heads * sh->head_dim * sizeof(float), "ctkvr queries");
        kv_status st = s->qlast ? kv_ctkvr_cuda.create(&cfg, &s->gpu) : KV_ERR_NOMEM;
        if (st != KV_OK) { ct_free(s); return st; }
    }
    *out = s;
    return KV_OK;
}

/* Ranking of positions set[0..n) for kv head g: max over the group of
 * (scale * <q_h, k_i> - lse_h), lse over the set, in double, rounded to float.
 * Q [Hq][D] rows of the group's heads at qh0 .. qh0+G-1 (stride qstride). */
static void ct_rank(ct_state *s, int g, const float *Q, size_t qstride, const int32_t *set, int n, float *rank) {
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, G = sh->group;
    size_t T = (size_t)sh->max_tokens;
    const float *K = s->keys + (size_t)g * T * D;
    double *sc = s->sc + (size_t)g * G * T;
    for (int a = 0; a < n; a++) rank[a] = -INFINITY;
    for (int hh = 0; hh < G; hh++) {
        const float *q = Q + (size_t)(g * G + hh) * qstride;
        double mx = -INFINITY, z = 0;
        for (int a = 0; a < n; a++) {
            sc[a] = (double)(sh->softmax_scale * kv_dot_ref(q, K + (size_t)set[a] * D, D));
            mx = sc[a] > mx ? sc[a] : mx;
        }
        for (int a = 0; a < n; a++) z += exp(sc[a] - mx);
        double lse = mx + log(z);
        for (int a = 0; a < n; a++) {
            float v = (float)(sc[a] - lse);
            rank[a] = v > rank[a] ? v : rank[a];
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static kv_status ct_build(void *st, const kv_prefill *pre) {
    ct_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, P = pre->n, Hq = sh->num_q_heads, Hkv = sh->num_kv_heads, C = s->C;
    size_t T = (size_t)sh->max_tokens;
    s->idx_hi = P - sh->local > sh->sink ? P - sh->local : sh->sink;
    s->n = P;
    s->next = 0;
    int nc = C < P ? C : P;
    if (nc > 0) kv_ctkvr_positions(s->choice, P, nc, s->seed, s->cpos);
    for (int j = 0; j < nc; j++)
        for (int h = 0; h < Hq; h++) {
            float *dst = s->cq + ((size_t)j * Hq + h) * D;
            const float *src = pre->q ? pre->q + ((size_t)h * P + s->cpos[j]) * D /* no queries (kvbench bench): */
                                      : pre->k + ((size_t)(h / sh->group) * P + s->cpos[j]) * D; /* the keys stand in */
            memcpy(dst, src, (size_t)D * sizeof(float));
            s->cnorm[(size_t)j * Hq + h] = sqrtf(kv_dot_ref(dst, dst, D));
        }
    if (s->gpu) {
        KV_TRY(kv_ctkvr_cuda.build(s->gpu, pre->k, P, s->cq, nc, s->idx_hi));
        return kv_ctkvr_cuda.read_lists(s->gpu, s->lidx, s->lcnt);
    }
    for (int g = 0; g < Hkv; g++)
        memcpy(s->keys + (size_t)g * T * D, pre->k + (size_t)g * P * D, (size_t)P * D * sizeof(float));
    int lo = sh->sink, n = s->idx_hi - lo, failed = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : failed)
    for (int g = 0; g < Hkv; g++) {
        int32_t *set = s->set + (size_t)g * T;
        float *rank = s->rank + (size_t)g * T;
        for (int a = 0; a < n; a++) set[a] = lo + a;
        for (int j = 0; j < nc; j++) {
            ct_rank(s, g, s->cq + (size_t)j * Hq * D, (size_t)D, set, n, rank);
            int got = kv_topk_ref(rank, n, s->rho, lo, s->lidx + ((size_t)g * C + j) * s->rho, NULL);
            failed |= got < 0;
            s->lcnt[(size_t)g * C + j] = got < 0 ? 0 : got;
        }
    }
    return failed ? kv_fail(KV_ERR_NOMEM, "ctkvr: out of host memory for top-k scratch") : KV_OK;
}

static kv_status ct_append(void *st, int t, const float *k, const float *v, const float *q) {
    ct_state *s = st;
    (void)v; (void)q;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "ctkvr: append of position %d, expected %d", t, s->n);
    int D = s->sh.head_dim;
    if (s->gpu) KV_TRY(kv_ctkvr_cuda.append(s->gpu, t, k));
    else
        for (int g = 0; g < s->sh.num_kv_heads; g++)
            memcpy(s->keys + ((size_t)g * s->sh.max_tokens + t) * D, k + (size_t)g * D, (size_t)D * sizeof(float));
    s->n++;
    return KV_OK;
}

/* Replaces the FIFO's oldest slot by the step's queries and the lists in dcu_list. */
static void ct_dcu_insert(ct_state *s, int t, const float *q) {
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, Hq = sh->num_q_heads, j = s->next;
    memcpy(s->cq + (size_t)j * Hq * D, q, (size_t)Hq * D * sizeof(float));
    for (int h = 0; h < Hq; h++) s->cnorm[(size_t)j * Hq + h] = sqrtf(kv_dot_ref(q + (size_t)h * D, q + (size_t)h * D, D));
    s->cpos[j] = t;
    for (int g = 0; g < sh->num_kv_heads; g++) {
        memcpy(s->lidx + ((size_t)g * s->C + j) * s->rho, s->dcu_list + (size_t)g * s->rho,
               (size_t)s->dcu_cnt[g] * sizeof(int32_t));
        s->lcnt[(size_t)g * s->C + j] = s->dcu_cnt[g];
    }
    s->next = (j + 1) % s->C;
}

/* The search's plan for step t: the region [sink, hi), where the build lists end (gen_lo), C', the oracle's
 * end for dcu=oracle; with gen=dense the generated keys go to sel's extra lists. 0: nothing to search. */
static int ct_plan(ct_state *s, int t, int k, kv_selection *sel, int *hi, int *gen_lo, int *cp, int *oracle_hi) {
    const kv_shape *sh = &s->sh;
    int lo = sh->sink;
    *hi = t + 1 - sh->local;
    if (*hi <= lo || k <= 0) return 0;
    *gen_lo = s->idx_hi > lo ? s->idx_hi : lo; /* keys from here on are in no build list */
    if (s->gen == CT_GEN_DENSE)
        for (int g = 0; g < sh->num_kv_heads; g++) {
            int c = 0;
            for (int i = *gen_lo; i < *hi; i++) sel->extra[(size_t)g * sel->extra_cap + c++] = i;
            sel->n_extra[g] = c;
        }
    *cp = s->cp < s->C ? s->cp : s->C;
    /* the oracle ranks every key the method could index: with gen=dense the generated keys are attended
     * densely already, so only [sink, gen_lo) */
    *oracle_hi = s->gen == CT_GEN_RERANK ? *hi : (*gen_lo < *hi ? *gen_lo : *hi);
    return 1;
}

/* The GPU search in halves (kv_method.search_launch); DCU's commit of the step's query and lists, an update of
 * the index, follows the fetch (it is not part of the timed search). */
static kv_status ct_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    ct_state *s = st;
    int hi, gen_lo, cp, oracle_hi;
    s->launched = ct_plan(s, t, k, sel, &hi, &gen_lo, &cp, &oracle_hi);
    if (!s->launched) return KV_OK;
    memcpy(s->qlast, q, (size_t)s->sh.num_q_heads * s->sh.head_dim * sizeof(float));
    return kv_ctkvr_cuda.launch(s->gpu, q, cp, k, hi, s->gen == CT_GEN_RERANK ? gen_lo : hi, s->dcu, oracle_hi, mark);
}

static kv_status ct_finish(void *st, int t, int k, kv_selection *sel) {
    ct_state *s = st;
    (void)k;
    if (!s->launched) return KV_OK;
    s->launched = 0;
    KV_TRY(kv_ctkvr_cuda.fetch(s->gpu, sel->idx, sel->cap, sel->count, sel->cand, sel->cand_cap, sel->n_cand,
                               s->dcu_list, s->dcu_cnt));
    if (s->dcu != CT_DCU_OFF) {
        KV_TRY(kv_ctkvr_cuda.dcu_commit(s->gpu, s->next));
        ct_dcu_insert(s, t, s->qlast); /* host mirror of the slot queries and lists */
    }
    return KV_OK;
}

static kv_status ct_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    ct_state *s = st;
    const kv_shape *sh = &s->sh;
    if (s->gpu) {
        KV_TRY(ct_launch(s, t, q, k, sel, NULL));
        return ct_finish(s, t, k, sel);
    }
    int D = sh->head_dim, G = sh->group, Hq = sh->num_q_heads, C = s->C, lo = sh->sink, hi, gen_lo, cp, oracle_hi;
    size_t T = (size_t)sh->max_tokens;
    if (!ct_plan(s, t, k, sel, &hi, &gen_lo, &cp, &oracle_hi)) return KV_OK;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int g = 0; g < sh->num_kv_heads; g++) {
        float *cosv = s->cosv + (size_t)g * C;
        for (int j = 0; j < C; j++) {
            float best = -INFINITY;
            if (s->cpos[j] >= 0)
                for (int h = g * G; h < (g + 1) * G; h++) {
                    const float *c = s->cq + ((size_t)j * Hq + h) * D, *qh = q + (size_t)h * D;
                    float den = s->cnorm[(size_t)j * Hq + h] * sqrtf(kv_dot_ref(qh, qh, D));
                    float cv = den > 0 ? kv_dot_ref(qh, c, D) / den : 0.f;
                    best = cv > best ? cv : best;
                }
            cosv[j] = best;
        }
        int32_t *top = s->top + (size_t)g * C;
        int ntop = kv_topk_ref(cosv, C, cp, 0, top, NULL);
        failed |= ntop < 0;
        int32_t *set = s->set + (size_t)g * T;
        int *stamp = s->stamp + (size_t)g * T, e = ++s->epoch[g], n = 0;
        for (int r = 0; r < ntop; r++) {
            if (s->cpos[top[r]] < 0) continue;
            const int32_t *li = s->lidx + ((size_t)g * C + top[r]) * s->rho;
            for (int a = 0; a < s->lcnt[(size_t)g * C + top[r]]; a++)
                if (li[a] >= lo && li[a] < hi && stamp[li[a]] != e) { stamp[li[a]] = e; set[n++] = li[a]; }
        }
        if (s->gen == CT_GEN_RERANK)
            for (int i = gen_lo; i < hi; i++)
                if (stamp[i] != e) { stamp[i] = e; set[n++] = i; }
        qsort(set, (size_t)n, sizeof *set, cmp_i32); /* position order: ties go to the smaller position */
        memcpy(sel->cand + (size_t)g * sel->cand_cap, set, (size_t)n * sizeof(int32_t));
        sel->n_cand[g] = n;
        float *rank = s->rank + (size_t)g * T;
        int32_t *pick = s->sel + (size_t)g * T;
        ct_rank(s, g, q, (size_t)D, set, n, rank);
        int kk = k < n ? k : n, got = kv_topk_ref(rank, n, kk, 0, pick, NULL);
        failed |= got < 0;
        for (int a = 0; a < got; a++) sel->idx[(size_t)g * sel->cap + a] = set[pick[a]];
        sel->count[g] = got < 0 ? 0 : got;
        if (s->dcu == CT_DCU_ON) {
            int nr = kv_topk_ref(rank, n, s->rho, 0, pick, NULL);
            failed |= nr < 0;
            for (int a = 0; a < nr; a++) s->dcu_list[(size_t)g * s->rho + a] = set[pick[a]];
            s->dcu_cnt[g] = nr < 0 ? 0 : nr;
        } else if (s->dcu == CT_DCU_ORACLE) {
            n = oracle_hi - lo;
            for (int a = 0; a < n; a++) set[a] = lo + a;
            ct_rank(s, g, q, (size_t)D, set, n, rank);
            int nr = kv_topk_ref(rank, n, s->rho, lo, s->dcu_list + (size_t)g * s->rho, NULL);
            failed |= nr < 0;
            s->dcu_cnt[g] = nr < 0 ? 0 : nr;
        }
    }
    if (failed) return kv_fail(KV_ERR_NOMEM, "ctkvr: out of host memory for top-k scratch");
    if (s->dcu != CT_DCU_OFF) ct_dcu_insert(s, t, q);
    return KV_OK;
}

static size_t ct_memory(const void *st) {
    const ct_state *s = st;
    size_t C = (size_t)s->C;
    return C * s->sh.num_q_heads * s->sh.head_dim * sizeof(float) + C * sizeof(int32_t) +
           (size_t)s->sh.num_kv_heads * C * s->rho * sizeof(int32_t);
}

static void ct_destroy(void *st) { ct_free(st); }

static void ct_describe(FILE *f) {
    fprintf(f, "    C = min(2048, P/16) unless set; rho = ceil(2.5 * k_hint) unless set; union <= C' * rho\n");
}

void kv_ctkvr_view_of(const void *st, kv_ctkvr_view *out) {
    const ct_state *s = st;
    *out = (kv_ctkvr_view){.C = s->C, .rho = s->rho, .cp = s->cp, .n = s->n, .next = s->next, .cq = s->cq,
                           .cpos = s->cpos, .lidx = s->lidx, .lcnt = s->lcnt};
}

static kv_status ct_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                              const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out) {
    (void)V;
    if (!&kv_ctkvr_cuda) return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
    int C = kv_param_int(ps, "C"), rho = kv_param_int(ps, "rho");
    if (C == 0) C = spec->n / 16 < 2048 ? spec->n / 16 : 2048;
    if (C < 1) C = 1;
    if (rho == 0) rho = (int)ceil(2.5 * spec->k);
    kv_ctkvr_bench_params bp = {.C = C, .rho = rho, .cp = kv_param_int(ps, "cp"),
                                .seed = sh->seed + (uint64_t)kv_param_int(ps, "seed")};
    return kv_ctkvr_cuda.bench(spec, &bp, K, q, out);
}

const kv_method kv_method_ctkvr = {
    .abi = KV_RETRIEVER_ABI,
    .name = "ctkvr",
    .summary = "query centroids (last C prefill queries) with top-rho key lists; top C' centroids, union, exact rerank, top k",
    .paper = "\"CTKVR: Efficient KV Cache Retrieval for Long-Context LLMs via Centroid-then-Token Indexing\", Lu, Lin et al., preprint (ACM template); no public code",
    .per_kv_head = 1,
    .has_gpu = 1,
    .search_updates_state = 1, /* DCU: every search replaces the FIFO's oldest centroid slot */
    .params = ct_params,
    .create = ct_create,
    .build = ct_build,
    .prefill_reads = KV_PREFILL_K | KV_PREFILL_Q, /* build() reads pre->k and pre->q only */
    .append = ct_append,
    .search = ct_search,
    .search_launch = ct_launch,
    .search_finish = ct_finish,
    .memory_bytes = ct_memory,
    .destroy = ct_destroy,
    .describe = ct_describe,
    .bench_gpu = ct_bench_gpu,
};
