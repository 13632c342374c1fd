/* pariskv.c: ParisKV ("ParisKV: Fast and Drift-Robust KV-Cache Retrieval
 * for Long-Context LLMs", Qi et al., preprint 2026; released code amy-77/ParisKV,
 * cache_hub/polar_cache.py), CPU reference. Sections implemented:
 *   4.1.1  normalise + one shared SRHT rotation, B contiguous subspaces of
 *          m dims, polar form (radius r_b, unit direction u_b);
 *   4.1.2  analytic sign-pattern centroids: id = bit j set iff u_j >= 0;
 *   4.1.3 / B.2.2  4-bit codes (sign + 3-bit magnitude bin), alpha_b and
 *          the stored weight w_b = |k| r_b / alpha_b; RSQ-IP rerank
 *          |q| sum_b w_b <v_b, q~_b>;
 *   B.1.2  Lloyd-Max magnitude levels from the Beta prior (pariskv_encode.c);
 *   B.2.1  Stage I multi-tier collision voting + bucket top-beta;
 *   4.2.1  decode-time update buffer folded into the index every `update`
 *          tokens, never re-clustered.
 *
 * Choices where the paper is silent, and why:
 * - Lloyd-Max: `lloyd=released` (default) reproduces the released
 *   generator's procedure (quantile start, 100 iterations) on the exact
 *   density instead of 10M Monte-Carlo samples: within 2e-4 of its m=8
 *   values. `lloyd=converged` is the fixed point the paper describes
 *   ("iterate until convergence"); its MSE is 0.02% lower. Levels and
 *   thresholds are float32 here (bf16 in the released code).
 * - Bins: t_j = number of thresholds strictly below |u_j| (torch.bucketize
 *   with right=False, as the released encoder); alpha is clamped at 1e-6
 *   and |k| at 1e-8 as there, so a zero block gets weight 0.
 * - GQA (as the released code): pool=mean averages the raw query vectors
 *   of a kv group and does one retrieval per kv head. The harness fixes the
 *   number of lists from the static per_kv_head flag, and pool=none needs
 *   one list per query head, so the method registers per_kv_head = 0 and,
 *   with pool=mean, writes the same list (and candidate set) into the G
 *   query heads' lists of the group; group_pool_param = "pool" makes
 *   `kvbench list` and summary.json report per_kv_head=true unless
 *   pool=none (kv_method_group_consistent).
 * - Tiers exactly as the released fused collision kernel: per subspace the
 *   centroids are ranked by <q~_b, c> (ties: smaller id first); walking in
 *   rank order, a centroid belongs to tier t while the keys of the
 *   centroids ranked before it are below ceil(n * rho * f_t) (computed in
 *   double in that order), f = .05 .15 .30 .50 .75 1; its bonus is the
 *   number of tiers that hold it (6..1). Key score: sum over subspaces,
 *   in [0, 6B]. Counts cover exactly the n searchable keys of the step.
 * - Stage I keeps C = max(1, ceil(beta * n)) candidates, as released, so
 *   on a short region (C < k) fewer than k keys are selected (the released
 *   code runs full attention below 2000 tokens instead, which no budgeted
 *   benchmark can); cand_floor=1 raises C to min(k, n) so the budget is
 *   never wasted (kvbench's default before issue 15). Bucket top-k:
 *   histogram, threshold, compaction in index order; ties at the threshold
 *   go to the smaller index. Final top-k (kernels/topk.h): larger estimate
 *   first, smaller index among equals.
 *   The candidate set is reported (selection.cand) so the protocol gives
 *   Stage I's own recall (candidate_recall).
 * - beta = 0 / rho = 0 (the defaults) mean the released length-adaptive
 *   table by retrieval-zone length n (n < 5K: .5/.5, < 10K: .25/.3,
 *   < 30K: .2/.25, else .1/.2); any other value fixes it.
 * - RSQ-IP weights are stored as bf16, as the released code stores them
 *   (rounded to nearest even from the float32 w_b; kernels/ops/bf16.h,
 *   the same bits on the GPU); the estimate widens them exactly and
 *   accumulates in float32 (the released kernel accumulates in bf16; a
 *   float accumulator is the reference METHODS.md asks for, and it is what
 *   keeps the GPU's scores bitwise the CPU's).
 * - Index layout (layout=released, the default, as polar_cache.py does it):
 *   the protocol fixes sink S and local window W, and keys inside the local
 *   window are never indexed. build() indexes [S, P-W); the last W prefill
 *   keys and every appended key wait raw in the update buffer; every
 *   `update` decode tokens (the released interval, 256 or 512 in their
 *   configs) the buffered keys that have left the window, [n_idx, t+1-W),
 *   are encoded and indexed together. Region tokens not yet indexed,
 *   [n_idx, t+1-W), are attended densely and reported as extra indices:
 *   between updates 0 .. update-1 of them (the released code's "update
 *   buffer" beside its local window). layout=eager is kvbench's layout
 *   before issue 15 (build [S, P), each update folds the whole buffer, the
 *   newest W keys included, which then sit indexed inside the window and
 *   are filtered out of the search and of the centroid counts): about W
 *   fewer extra tokens per step, kept to measure what that costs.
 * - Ablations: centroids=kmeans learns 2^m centroids per (kv head,
 *   subspace) by Lloyd k-means (Euclidean) on the transformed prefill key
 *   blocks of [S, P) (a seeded sample of at most kmeans_sample keys,
 *   initialised from 2^m sampled keys, empty clusters keep their centre),
 *   assigns every key to its nearest centre, and ranks centroids by
 *   <q~_b, c>; with no prefill keys to learn from it falls back to the sign
 *   centroids. rotation=none skips the SRHT (no padding then: m must divide
 *   D); normalize=0 skips the l2 normalisation (w_b = r_b / alpha_b with
 *   the raw radius, score without |q|: the same ranking up to rounding, as
 *   METHODS.md notes); tiers=binary is one tier at rho with bonus 1;
 *   rerank=exact scores the candidates with the full-precision keys and the
 *   retrieval query, rerank=none orders them by collision score.
 *
 * Index layout, per kv head, by absolute position i (token-major so one
 * key's metadata is contiguous for the CPU):
 *   ids  uint8 [T][B]        centroid id per subspace
 *   code uint8 [T][D'/2]     4-bit codes, coordinate c at byte c/2 (low
 *                            nibble even c), nibble = sign<<3 | magnitude bin
 *   w    bf16  [T][B]        RSQ-IP weights (uint16_t bits)
 *   counts int32 [B][2^m]    keys per centroid (all indexed keys)
 *   kmeans only: float [B][2^m][m] centres.
 * Bytes per key and kv head: B + D'/2 + 2B (D = 128, m = 8: 16 + 64 + 32 =
 * 112, as the released code's layout with its bf16 weights), which memory_bytes
 * counts, plus the per-head tables; with rerank=exact also the 4D bytes
 * of the full-precision key it reads. The raw keys of the update buffer
 * are KV cache, not index, and are not counted.
 *
 * GPU path (shape->use_gpu; kernels/pariskv.cu and pariskv_encode.cu):
 * with centroids=analytic, rotation=srht, normalize=1, rerank=rsqip (any
 * m, pool, tiers, lloyd, beta, rho, update) the index lives on the device
 * only (its layout there is subspace-major ids, see pariskv.cu), prefill
 * and every folded update batch are encoded there, and a search runs all
 * rows on the device and copies back the lists and candidates; the update
 * buffer stays on the host and travels with its batch. Its results equal
 * this CPU path's (tests/test_pariskv_gpu.c). The other ablation values
 * run on the CPU path even under --device gpu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "kv_retriever.h"
#include "pariskv_codec.h"

enum { RERANK_RSQIP, RERANK_EXACT, RERANK_NONE };

typedef struct {
    uint16_t *score;  /* [T] collision scores of the searchable keys */
    int32_t *cand;    /* [T] candidates (absolute positions, ascending) */
    float *csc;       /* [T] rerank scores of the candidates */
    int32_t *pos;     /* [T] top-k positions into cand */
    int32_t *out;     /* [T] the final list */
    int32_t *cnt;     /* [B][2^m] centroid counts of the step */
    uint8_t *wt;      /* [B][2^m] tier bonus per centroid */
    float *qv, *qt, *lut, *cent_score; /* [D], [D'], [D'*16], [2^m] */
    int *hist, *order;
} pk_scratch;

typedef struct {
    kv_shape sh;
    kv_pariskv_codec cx;
    int nc, update, pool_mean, multi, rerank, kmeans, km_iters, km_sample;
    int released;     /* layout=released: the local window is never indexed */
    int cand_floor;   /* raise Stage I's C to min(k, n) */
    int pend_cap;     /* update buffer capacity: U (+ W with the released layout) */
    double beta, rho; /* 0: adaptive */
    int n_seen;       /* positions 0..n_seen-1 handed over */
    int n_idx;        /* positions [sink, n_idx) are indexed */
    int pend_start;   /* first position held in the update buffer (= n_idx once the buffer holds any) */
    uint8_t *ids, *code;
    kv_bf16 *w;       /* RSQ-IP weights, bf16 */
    int32_t *counts;  /* [Hkv][B][nc] */
    float *cent, *cnorm; /* kmeans: [Hkv][B][nc][m], [Hkv][B][nc] */
    float *pend;      /* [Hkv][pend_cap][D] raw keys of the positions [pend_start, n_seen) */
    float *keys;      /* rerank=exact: [Hkv][T][D] */
    kv_pariskv_gpu *gpu; /* GPU path: the index lives on the device (kernels/pariskv.cu) */
    int32_t *gout;    /* GPU path: host [rows][k_cap] lists */
    int gk_cap;
    int g_C;          /* GPU path: the launched search's candidates per row (0: none launched) */
    int last_C;      /* GPU: candidates per row of the last search (0: none), for pk_candidates */
    int nthreads;
    pk_scratch *scr;
} pk_state;

static const kv_param_spec pariskv_params[] = {
    {"m", KV_PARAM_INT, KV_PARAM_BUILD, 8, 2, 8, NULL,
     "subspace dimension (B = D'/m subspaces, D' = D padded to a power of two under SRHT; m must divide D')"},
    {"lloyd", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 1, "released|converged",
     "magnitude levels: 100 Lloyd-Max iterations from quantiles (released code) or the converged fixed point"},
    {"update", KV_PARAM_INT, KV_PARAM_BUILD, 256, 1, 1048576, NULL,
     "decode tokens buffered (attended densely) before they are encoded into the index together"},
    {"layout", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 1, "released|eager",
     "released: the index never holds the local window (build [S, P-W), each update folds what left the window); "
     "eager: build [S, P), each update folds the whole buffer, the newest W keys included (kvbench before issue 15)"},
    {"cand_floor", KV_PARAM_INT, KV_PARAM_SEARCH, 0, 0, 1, NULL,
     "1: raise Stage I's candidate count ceil(beta*n) to min(k, n) so the budget is never wasted; 0: max(1, ceil(beta*n)) as released"},
    {"pool", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 1, "mean|none",
     "mean: one retrieval per kv head from the mean of its group's queries; none: one per query head"},
    {"beta", KV_PARAM_FLOAT, KV_PARAM_SEARCH, 0, 0, 1, NULL,
     "Stage I candidate fraction of the n searchable keys (0: the released length-adaptive table)"},
    {"rho", KV_PARAM_FLOAT, KV_PARAM_SEARCH, 0, 0, 1, NULL,
     "collision fraction: tiers cover ceil(n*rho) keys per subspace (0: the released length-adaptive table)"},
    {"centroids", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 1, "analytic|kmeans",
     "sign-pattern centroids, or 2^m k-means centroids per subspace learned on the prefill key blocks"},
    {"kmeans_iters", KV_PARAM_INT, KV_PARAM_BUILD, 10, 1, 1000, NULL, "Lloyd iterations of centroids=kmeans"},
    {"kmeans_sample", KV_PARAM_INT, KV_PARAM_BUILD, 8192, 256, 16777216, NULL,
     "prefill keys (seeded sample) centroids=kmeans learns from"},
    {"rotation", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 1, "srht|none", "shared SRHT rotation of keys and queries, or none"},
    {"normalize", KV_PARAM_INT, KV_PARAM_BUILD, 1, 0, 1, NULL, "l2-normalise keys and queries before the rotation"},
    {"tiers", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 1, "multi|binary",
     "collision bonus: 6 cumulative tiers (6..1), or one tier at rho (bonus 1)"},
    {"rerank", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 2, "rsqip|exact|none",
     "Stage II: RSQ-IP estimate from the 4-bit codes, exact scores, or collision-score order"},
    {"seed", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 2147483647, NULL,
     "seed of the SRHT signs and the k-means sample (added to the run's --seed)"},
    {NULL},
};

static void scratch_free(pk_scratch *c) {
    free(c->score); free(c->cand); free(c->csc); free(c->pos); free(c->out); free(c->cnt); free(c->wt);
    free(c->qv); free(c->qt); free(c->lut); free(c->cent_score); free(c->hist); free(c->order);
}

static void pk_destroy(void *st) {
    pk_state *s = st;
    if (!s) return;
    kv_pariskv_codec_free(&s->cx);
    free(s->ids); free(s->code); free(s->w); free(s->counts); free(s->cent); free(s->cnorm);
    free(s->pend); free(s->keys);
    if (s->gpu) kv_pariskv_cuda.destroy(s->gpu);
    free(s->gout);
    for (int i = 0; s->scr && i < s->nthreads; i++) scratch_free(&s->scr[i]);
    free(s->scr);
    free(s);
}

/* 1 when these parameters run on the GPU path (centroids=analytic,
 * rotation=srht, normalize=1, rerank=rsqip; any m, pool, tiers, lloyd,
 * beta, rho, update) for head dim D (32 <= D' <= 256): the ablations stay on
 * the CPU path even under --device gpu (they are study switches, not the
 * method, and the CPU path is exact for them). */
static int pk_gpu_ok(const kv_param_set *ps, int head_dim) {
    int dp = 1;
    while (dp < head_dim) dp *= 2;
    return kv_param_int(ps, "centroids") == 0 && kv_param_int(ps, "rotation") == 0 &&
           kv_param_int(ps, "normalize") == 1 && kv_param_int(ps, "rerank") == 0 && dp >= 32 && dp <= 256;
}

static kv_status pk_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    pk_state *s = kv_calloc(1, sizeof *s, "pariskv state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->update = kv_param_int(ps, "update");
    s->pool_mean = kv_param_int(ps, "pool") == 0;
    s->beta = kv_param_is_set(ps, "beta") ? kv_param(ps, "beta") : 0;
    s->rho = kv_param_is_set(ps, "rho") ? kv_param(ps, "rho") : 0;
    s->multi = kv_param_int(ps, "tiers") == 0;
    s->rerank = kv_param_int(ps, "rerank");
    s->kmeans = kv_param_int(ps, "centroids") == 1;
    s->km_iters = kv_param_int(ps, "kmeans_iters");
    s->km_sample = kv_param_int(ps, "kmeans_sample");
    s->released = kv_param_int(ps, "layout") == 0;
    s->cand_floor = kv_param_int(ps, "cand_floor");
    uint64_t seed = sh->seed + (uint64_t)kv_param_int(ps, "seed");
    kv_status st = kv_pariskv_codec_init(&s->cx, sh->head_dim, kv_param_int(ps, "m"), kv_param_int(ps, "rotation") == 0,
                                         kv_param_int(ps, "normalize"), kv_param_int(ps, "lloyd"), seed);
    if (st != KV_OK) { pk_destroy(s); return st; }
    s->nc = 1 << s->cx.m;
    s->sh.seed = seed;
    int Hkv = sh->num_kv_heads, T = sh->max_tokens, D = sh->head_dim, nb = s->cx.nb, dp = s->cx.dp;
    size_t nt = (size_t)Hkv * T;
    int pend_n = (s->update < T ? s->update : T) + (s->released ? sh->local : 0);
    if (pend_n > T) pend_n = T;
    s->pend_cap = pend_n;
    if (sh->use_gpu && pk_gpu_ok(ps, D)) { /* the index lives on the device; the update buffer on the host */
        kv_pariskv_gpu_cfg cfg = kv_pariskv_gpu_config(&s->cx, sh, s->pool_mean, pend_n);
        if ((st = kv_gpu_table(&kv_pariskv_cuda)) != KV_OK || (st = kv_pariskv_cuda.create(&cfg, &s->gpu)) != KV_OK) {
            pk_destroy(s);
            return st;
        }
        s->pend = kv_malloc((size_t)Hkv * pend_n * D * sizeof(float), "pariskv update buffer");
        if (!s->pend) { pk_destroy(s); return KV_ERR_NOMEM; }
        *out = s;
        return KV_OK;
    }
    s->ids = kv_malloc(nt * nb, "pariskv centroid ids");
    s->code = kv_malloc(nt * s->cx.code_bytes, "pariskv codes");
    s->w = kv_malloc(nt * nb * sizeof(kv_bf16), "pariskv weights (bf16)");
    s->counts = kv_calloc((size_t)Hkv * nb * s->nc, sizeof(int32_t), "pariskv centroid counts");
    s->pend = kv_malloc((size_t)Hkv * pend_n * D * sizeof(float), "pariskv update buffer");
    int fail = !s->ids || !s->code || !s->w || !s->counts || !s->pend;
    if (s->kmeans) {
        s->cent = kv_malloc((size_t)Hkv * nb * s->nc * s->cx.m * sizeof(float), "pariskv k-means centres");
        s->cnorm = kv_malloc((size_t)Hkv * nb * s->nc * sizeof(float), "pariskv k-means centre norms");
        fail |= !s->cent || !s->cnorm;
    }
    if (s->rerank == RERANK_EXACT) {
        s->keys = kv_malloc(nt * D * sizeof(float), "pariskv full-precision keys");
        fail |= !s->keys;
    }
#ifdef _OPENMP
    s->nthreads = omp_get_max_threads();
#else
    s->nthreads = 1;
#endif
    s->scr = kv_calloc((size_t)s->nthreads, sizeof *s->scr, "pariskv scratch");
    fail |= !s->scr;
    int max_score = KV_PARISKV_TIERS * nb;
    for (int i = 0; !fail && i < s->nthreads; i++) {
        pk_scratch *c = &s->scr[i];
        c->score = kv_malloc((size_t)T * sizeof(uint16_t), "pariskv scores");
        c->cand = kv_malloc((size_t)T * sizeof(int32_t), "pariskv candidates");
        c->csc = kv_malloc((size_t)T * sizeof(float), "pariskv rerank scores");
        c->pos = kv_malloc((size_t)T * sizeof(int32_t), "pariskv top-k");
        c->out = kv_malloc((size_t)T * sizeof(int32_t), "pariskv list");
        c->cnt = kv_malloc((size_t)nb * s->nc * sizeof(int32_t), "pariskv step counts");
        c->wt = kv_malloc((size_t)nb * s->nc, "pariskv tier bonus");
        c->qv = kv_malloc((size_t)D * sizeof(float), "pariskv query");
        c->qt = kv_malloc((size_t)dp * sizeof(float), "pariskv rotated query");
        c->lut = kv_malloc((size_t)dp * 16 * sizeof(float), "pariskv query table");
        c->cent_score = kv_malloc((size_t)s->nc * sizeof(float), "pariskv centroid scores");
        c->hist = kv_malloc((size_t)(max_score + 1) * sizeof(int), "pariskv histogram");
        c->order = kv_malloc((size_t)s->nc * sizeof(int), "pariskv centroid order");
        fail |= !c->score || !c->cand || !c->csc || !c->pos || !c->out || !c->cnt || !c->wt || !c->qv || !c->qt ||
                !c->lut || !c->cent_score || !c->hist || !c->order;
    }
    if (fail) { pk_destroy(s); return KV_ERR_NOMEM; }
    *out = s;
    return KV_OK;
}

/* ---- k-means ablation ---- */

/* Nearest centre (squared Euclidean, smaller id among equals) of block x. */
static int nearest(const float *x, const float *cent, const float *cnorm, int nc, int m) {
    int best = 0;
    float bd = INFINITY;
    for (int c = 0; c < nc; c++) {
        float dot = 0;
        for (int j = 0; j < m; j++) dot += x[j] * cent[(size_t)c * m + j];
        float d = cnorm[c] - 2 * dot;
        if (d < bd) { bd = d; best = c; }
    }
    return best;
}

/* Knuth's selection sampling: `want` of [0, n) in ascending order. */
static void select_sample(kv_rng *r, int n, int want, int *out) {
    for (int i = 0, got = 0; i < n && got < want; i++)
        if ((n - i) * kv_rng_uniform(r) < want - got) out[got++] = i;
}

/* k-means of the prefill keys k [Hkv][P][D]. */
static kv_status kmeans_train(pk_state *s, const float *k, int P) {
    const kv_pariskv_codec *cx = &s->cx;
    int Hkv = s->sh.num_kv_heads, D = s->sh.head_dim, dp = cx->dp, m = cx->m, nb = cx->nb, nc = s->nc;
    int lo = s->sh.sink, n = P - lo;
    if (n <= 0) { /* nothing to learn from: the sign centroids (unit norm, so assignment = sign pattern) */
        for (size_t gb = 0; gb < (size_t)Hkv * nb; gb++)
            for (int c = 0; c < nc; c++) {
                for (int j = 0; j < m; j++) s->cent[(gb * nc + c) * m + j] = ((c >> j) & 1 ? 1.0f : -1.0f) / sqrtf((float)m);
                s->cnorm[gb * nc + c] = 1.0f;
            }
        return KV_OK;
    }
    int ns = n < s->km_sample ? n : s->km_sample, ni = ns < nc ? ns : nc;
    int *sample = kv_malloc((size_t)Hkv * ns * sizeof(int), "k-means sample");
    int *init = kv_malloc((size_t)Hkv * ni * sizeof(int), "k-means init");
    float *xt = kv_malloc((size_t)Hkv * ns * dp * sizeof(float), "k-means training blocks");
    if (!sample || !init || !xt) { free(sample); free(init); free(xt); return KV_ERR_NOMEM; }
    for (int g = 0; g < Hkv; g++) {
        kv_rng r;
        kv_rng_seed(&r, s->sh.seed * 0x9e3779b97f4a7c15ULL + 0x6b6d65616e73ULL + (uint64_t)g);
        select_sample(&r, n, ns, sample + (size_t)g * ns);
        select_sample(&r, ns, ni, init + (size_t)g * ni);
    }
#pragma omp parallel for schedule(static)
    for (long j = 0; j < (long)Hkv * ns; j++) {
        int g = (int)(j / ns);
        kv_pariskv_transform(cx, k + ((size_t)g * P + lo + sample[j]) * D, xt + (size_t)j * dp);
    }
    int failed = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : failed)
    for (long gb = 0; gb < (long)Hkv * nb; gb++) {
        int g = (int)(gb / nb), b = (int)(gb % nb);
        float *cent = s->cent + (size_t)gb * nc * m, *cn = s->cnorm + (size_t)gb * nc;
        const float *X = xt + (size_t)g * ns * dp + (size_t)b * m;
        double *sum = malloc((size_t)nc * m * sizeof(double));
        int *cnt = malloc((size_t)nc * sizeof(int));
        if (!sum || !cnt) { free(sum); free(cnt); failed = 1; continue; }
        for (int c = 0; c < nc; c++)
            memcpy(cent + (size_t)c * m, X + (size_t)init[(size_t)g * ni + c % ni] * dp, (size_t)m * sizeof(float));
        for (int it = 0; it <= s->km_iters; it++) {
            for (int c = 0; c < nc; c++) {
                float q = 0;
                for (int j = 0; j < m; j++) q += cent[(size_t)c * m + j] * cent[(size_t)c * m + j];
                cn[c] = q;
            }
            if (it == s->km_iters) break; /* cn matches the final centres */
            memset(sum, 0, (size_t)nc * m * sizeof(double));
            memset(cnt, 0, (size_t)nc * sizeof(int));
            for (int i = 0; i < ns; i++) {
                const float *x = X + (size_t)i * dp;
                int c = nearest(x, cent, cn, nc, m);
                cnt[c]++;
                for (int j = 0; j < m; j++) sum[(size_t)c * m + j] += x[j];
            }
            for (int c = 0; c < nc; c++)
                if (cnt[c]) for (int j = 0; j < m; j++) cent[(size_t)c * m + j] = (float)(sum[(size_t)c * m + j] / cnt[c]);
        }
        free(sum);
        free(cnt);
    }
    free(sample); free(init); free(xt);
    return failed ? kv_fail(KV_ERR_NOMEM, "pariskv: out of memory in k-means") : KV_OK;
}

/* ---- encoding into the index ---- */

/* Encodes key `k` of kv head g at position i (ids, codes, weights); the
 * caller adds it to the counts. */
static void encode_at(pk_state *s, int g, int i, const float *k, float *xt) {
    const kv_pariskv_codec *cx = &s->cx;
    size_t gi = (size_t)g * s->sh.max_tokens + i;
    uint8_t *ids = s->ids + gi * cx->nb;
    kv_pariskv_encode(cx, k, ids, s->code + gi * cx->code_bytes, s->w + gi * cx->nb, xt);
    if (s->kmeans)
        for (int b = 0; b < cx->nb; b++) {
            size_t gb = (size_t)g * cx->nb + b;
            ids[b] = (uint8_t)nearest(xt + b * cx->m, s->cent + gb * s->nc * cx->m, s->cnorm + gb * s->nc, s->nc, cx->m);
        }
}

/* Encodes positions [a, b) of every kv head; key of (g, i) at src + g*gstride + (i - a)*D. */
static kv_status encode_range(pk_state *s, int a, int b, const float *src, size_t gstride) {
    int Hkv = s->sh.num_kv_heads, D = s->sh.head_dim, n = b - a, nb = s->cx.nb;
    if (n <= 0) return KV_OK;
    int failed = 0;
#pragma omp parallel reduction(| : failed) if ((long)Hkv * n >= 256)
    {
        float *xt = malloc((size_t)s->cx.dp * sizeof(float));
        if (!xt) failed = 1;
#pragma omp for schedule(static)
        for (long j = 0; j < (long)Hkv * n; j++) {
            int g = (int)(j / n), i = a + (int)(j % n);
            if (xt) encode_at(s, g, i, src + g * gstride + (size_t)(i - a) * D, xt);
        }
        free(xt);
    }
    if (failed) return kv_fail(KV_ERR_NOMEM, "pariskv: out of memory encoding keys");
    for (int g = 0; g < Hkv; g++)
        for (int i = a; i < b; i++) {
            const uint8_t *ids = s->ids + ((size_t)g * s->sh.max_tokens + i) * nb;
            for (int q = 0; q < nb; q++) s->counts[((size_t)g * nb + q) * s->nc + ids[q]]++;
        }
    return KV_OK;
}

/* Builds from either form of the prefill. The CPU path reads one float32
 * array (the float16 form widened once); the GPU path encodes the float16
 * form a chunk of KV_HOST_ROWS_CHUNK positions at a time, so a layer held as float16
 * never has a float32 copy on the host (issue 12, goal 3). Encoding is per
 * key, so the chunks change no bit of the index. */
static kv_status pk_build(void *st, const kv_prefill *pre) {
    pk_state *s = st;
    int Hkv = s->sh.num_kv_heads, T = s->sh.max_tokens, D = s->sh.head_dim, S = s->sh.sink, P = pre->n;
    kv_host_rows x = kv_prefill_keys(pre);
    float *k32 = NULL;
    if (!s->gpu && x.f16) {
        if (!kv_prefill_k32(pre, Hkv, D, &k32)) return KV_ERR_NOMEM;
        x = (kv_host_rows){k32, NULL, P};
    }
    if (s->keys)
        for (int g = 0; g < Hkv; g++) kv_host_rows_head(&x, g, D, 0, P, s->keys + (size_t)g * T * D);
    kv_status rc = s->kmeans ? kmeans_train(s, x.f32, P) : KV_OK; /* the CPU path: x.f32 */
    /* released layout: the prefill's last W keys are the local window, kept raw in the buffer */
    int e = s->released ? P - s->sh.local : P;
    if (e < S) e = S;
    kv_rows_walk w = {0};
    if (rc == KV_OK) rc = kv_rows_walk_start(&w, &x, Hkv, D, S, e, "pariskv prefill chunk");
    const float *src;
    int a, c;
    size_t hs;
    while (rc == KV_OK && (src = kv_rows_walk_next(&w, &a, &c, &hs)))
        rc = s->gpu ? kv_pariskv_cuda.encode_host(s->gpu, a, a + c, src, hs) : encode_range(s, a, a + c, src, hs);
    kv_rows_walk_end(&w);
    s->n_idx = e;
    s->pend_start = e > P ? P : e;
    for (int g = 0; g < Hkv && rc == KV_OK; g++)
        kv_host_rows_head(&x, g, D, s->pend_start, P - s->pend_start, s->pend + (size_t)g * s->pend_cap * D);
    free(k32);
    s->n_seen = P;
    return rc;
}

static kv_status pk_append(void *st, int t, const float *k, const float *v, const float *q) {
    pk_state *s = st;
    (void)v; (void)q;
    int Hkv = s->sh.num_kv_heads, T = s->sh.max_tokens, D = s->sh.head_dim, U = s->update < T ? s->update : T;
    int P = s->sh.prefill_len, cap = s->pend_cap;
    if (t != s->n_seen || t >= T) return kv_fail(KV_ERR_INTERNAL, "pariskv: append of position %d, expected %d", t, s->n_seen);
    int slot = t - s->pend_start;
    if (slot >= cap) return kv_fail(KV_ERR_INTERNAL, "pariskv: update buffer overflow at position %d", t);
    for (int g = 0; g < Hkv; g++) {
        memcpy(s->pend + ((size_t)g * cap + slot) * D, k + (size_t)g * D, (size_t)D * sizeof(float));
        if (s->keys) memcpy(s->keys + ((size_t)g * T + t) * D, k + (size_t)g * D, (size_t)D * sizeof(float));
    }
    s->n_seen = t + 1;
    if ((t + 1 - P) % U != 0) return KV_OK;
    /* every U decode tokens (the released interval): fold the buffered keys into the index, up to the
     * local window's start with the released layout, all of them with the eager one; the sink is never indexed */
    int b = s->released ? t + 1 - s->sh.local : t + 1, a = s->pend_start > s->sh.sink ? s->pend_start : s->sh.sink;
    if (b > a) {
        const float *src = s->pend + (size_t)(a - s->pend_start) * D;
        if (s->gpu) KV_TRY(kv_pariskv_cuda.encode_host(s->gpu, a, b, src, (size_t)cap * D));
        else KV_TRY(encode_range(s, a, b, src, (size_t)cap * D));
        s->n_idx = b;
    }
    /* keep the keys not yet indexed [max(b, pend_start), t] at the buffer's front */
    int keep0 = b > s->pend_start ? b : s->pend_start;
    if (keep0 > s->pend_start) {
        for (int g = 0; g < Hkv; g++)
            memmove(s->pend + (size_t)g * cap * D, s->pend + ((size_t)g * cap + keep0 - s->pend_start) * D,
                    (size_t)(t + 1 - keep0) * D * sizeof(float));
        s->pend_start = keep0;
    }
    return KV_OK;
}

/* ---- search ---- */

/* One retrieval for kv head g with query qv (raw, [D]); fills c->out
 * (returns its count) and c->cand (*n_cand). */
static int search_one(pk_state *s, pk_scratch *c, int g, int t, int k, int *n_cand) {
    const kv_pariskv_codec *cx = &s->cx;
    int T = s->sh.max_tokens, D = s->sh.head_dim, nb = cx->nb, m = cx->m, nc = s->nc, lo = s->sh.sink;
    int hi = t + 1 - s->sh.local, end = s->n_idx < hi ? s->n_idx : hi, n = end - lo;
    *n_cand = 0;
    if (n <= 0 || k <= 0) return 0;
    double beta = s->beta, rho = s->rho, ab, ar;
    kv_pariskv_adaptive_ratios(n, &ab, &ar);
    if (beta <= 0) beta = ab;
    if (rho <= 0) rho = ar;
    /* centroid counts over the searchable keys: indexed keys still in the local window are taken out */
    const size_t gT = (size_t)g * T;
    memcpy(c->cnt, s->counts + (size_t)g * nb * nc, (size_t)nb * nc * sizeof(int32_t));
    for (int i = end; i < s->n_idx; i++)
        for (int b = 0; b < nb; b++) c->cnt[b * nc + s->ids[(gT + i) * nb + b]]--;
    float qnorm = kv_pariskv_transform(cx, c->qv, c->qt);
    for (int b = 0; b < nb; b++) {
        const float *qb = c->qt + b * m;
        for (int id = 0; id < nc; id++) {
            float sc = 0;
            if (s->kmeans) {
                const float *ce = s->cent + (((size_t)g * nb + b) * nc + id) * m;
                for (int j = 0; j < m; j++) sc += qb[j] * ce[j];
            } else
                for (int j = 0; j < m; j++) sc += (id >> j) & 1 ? qb[j] : -qb[j];
            c->cent_score[id] = sc;
        }
        kv_pariskv_tier_weights(c->cent_score, c->cnt + b * nc, nc, n, rho, s->multi, c->wt + b * nc, c->order);
    }
    const uint8_t *ids = s->ids + (gT + lo) * nb;
    for (int i = 0; i < n; i++, ids += nb) {
        int sc = 0;
        for (int b = 0; b < nb; b++) sc += c->wt[b * nc + ids[b]];
        c->score[i] = (uint16_t)sc;
    }
    int C = kv_pariskv_candidates(n, beta, k, s->cand_floor);
    C = kv_pariskv_bucket_topk(c->score, n, (s->multi ? KV_PARISKV_TIERS : 1) * nb, C, c->cand, c->hist);
    if (s->rerank == RERANK_RSQIP) kv_pariskv_query_lut(cx, c->qt, c->lut);
    for (int j = 0; j < C; j++) {
        int rel = c->cand[j], i = rel + lo;
        size_t gi = gT + i;
        if (s->rerank == RERANK_RSQIP)
            c->csc[j] = kv_pariskv_rsqip(cx, c->lut, s->code + gi * cx->code_bytes, s->w + gi * nb, qnorm);
        else if (s->rerank == RERANK_EXACT) c->csc[j] = kv_dot_ref(c->qv, s->keys + gi * D, D);
        else c->csc[j] = (float)c->score[rel];
        c->cand[j] = i;
    }
    int got = kv_topk_ref(c->csc, C, k, 0, c->pos, NULL);
    if (got < 0) return -1;
    for (int j = 0; j < got; j++) c->out[j] = c->cand[c->pos[j]];
    *n_cand = C;
    return got;
}

/* The region's tokens not yet indexed (update buffer) are attended densely. */
static void report_extra(const pk_state *s, int lo, int hi, kv_selection *sel) {
    int e0 = s->n_idx > lo ? s->n_idx : lo, ne = hi - e0;
    if (ne > sel->extra_cap) ne = sel->extra_cap;
    for (int g = 0; g < s->sh.num_kv_heads && ne > 0; g++) {
        for (int j = 0; j < ne; j++) sel->extra[(size_t)g * sel->extra_cap + j] = e0 + j;
        sel->n_extra[g] = ne;
    }
}

/* The GPU path's search, in halves (kv_method.search_launch): every row (kv
 * head, or query head with pool=none) on the device in one pass; the lists
 * are copied into sel by pk_finish, the candidates by pk_candidates. */
static kv_status pk_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    pk_state *s = st;
    const kv_shape *sh = &s->sh;
    (void)sel;
    s->last_C = s->g_C = 0; /* until a search is launched, and then fetched */
    int lo = sh->sink, hi = t + 1 - sh->local, end = s->n_idx < hi ? s->n_idx : hi, n = end - lo;
    if (n <= 0 || k <= 0) return KV_OK;
    double beta = s->beta, rho = s->rho, ab, ar;
    kv_pariskv_adaptive_ratios(n, &ab, &ar);
    kv_pariskv_gpu_step step = {.lo = lo, .end = end, .n_idx = s->n_idx, .C = kv_pariskv_candidates(n, beta > 0 ? beta : ab, k, s->cand_floor),
                                .k = k, .multi = s->multi, .rho = rho > 0 ? rho : ar};
    int rows = s->pool_mean ? sh->num_kv_heads : sh->num_q_heads;
    if (k > s->gk_cap) {
        free(s->gout);
        s->gk_cap = 0;
        if (!(s->gout = kv_malloc((size_t)rows * k * sizeof(int32_t), "pariskv GPU lists"))) return KV_ERR_NOMEM;
        s->gk_cap = k;
    }
    KV_TRY(kv_pariskv_cuda.launch(s->gpu, q, &step, mark));
    s->g_C = step.C;
    return KV_OK;
}

static kv_status pk_finish(void *st, int t, int k, kv_selection *sel) {
    pk_state *s = st;
    const kv_shape *sh = &s->sh;
    int lo = sh->sink, hi = t + 1 - sh->local;
    if (hi <= lo) return KV_OK;
    if (s->g_C > 0) {
        KV_TRY(kv_pariskv_cuda.fetch(s->gpu, s->gout, NULL, 0)); /* the candidates: pk_candidates */
        int rows = s->pool_mean ? sh->num_kv_heads : sh->num_q_heads, nh = s->pool_mean ? sh->group : 1;
        int got = k < s->g_C ? k : s->g_C;
        if (got > sel->cap) got = sel->cap;
        for (int r = 0; r < rows; r++)
            for (int h = r * nh; h < (r + 1) * nh; h++) {
                memcpy(sel->idx + (size_t)h * sel->cap, s->gout + (size_t)r * k, (size_t)got * sizeof(int32_t));
                sel->count[h] = got;
            }
        s->last_C = s->g_C;
    }
    report_extra(s, lo, hi, sel);
    return KV_OK;
}

/* The GPU path's candidates of the last search, copied after it (kv_method.candidates: outside the run's timed
 * search); the CPU path fills them in search(). */
static kv_status pk_candidates(void *st, kv_selection *sel) {
    pk_state *s = st;
    const kv_shape *sh = &s->sh;
    if (!s->gpu || s->last_C <= 0) return KV_OK;
    if (s->last_C > sel->cand_cap)
        return kv_fail(KV_ERR_INTERNAL, "pariskv: %d candidates a row, above the selection's capacity %d", s->last_C,
                       sel->cand_cap);
    int rows = s->pool_mean ? sh->num_kv_heads : sh->num_q_heads, nh = s->pool_mean ? sh->group : 1;
    /* row r straight into the first list of its group, then copied to the group's others */
    KV_TRY(kv_pariskv_cuda.candidates(s->gpu, sel->cand, nh * sel->cand_cap));
    for (int h = 0; h < rows * nh; h++) {
        if (h % nh)
            memcpy(sel->cand + (size_t)h * sel->cand_cap, sel->cand + (size_t)(h - h % nh) * sel->cand_cap,
                   (size_t)s->last_C * sizeof(int32_t));
        sel->n_cand[h] = s->last_C;
    }
    return KV_OK;
}

/* The same lists left on the device for the run's device evaluation (kv_method.candidates_dev): R rows of
 * last_C ids, Tp apart; the search that made them has synchronised its stream. */
static kv_status pk_candidates_dev(void *st, kv_dev_cands *out) {
    pk_state *s = st;
    *out = (kv_dev_cands){0};
    if (!s->gpu || s->last_C <= 0) return KV_OK;
    kv_pariskv_cuda.candidates_dev(s->gpu, &out->idx, &out->ld);
    out->rows = s->pool_mean ? s->sh.num_kv_heads : s->sh.num_q_heads;
    out->count = s->last_C;
    return KV_OK;
}

static kv_status pk_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    pk_state *s = st;
    s->last_C = 0; /* until a GPU search sets it */
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, G = sh->group, lo = sh->sink, hi = t + 1 - sh->local;
    if (hi <= lo) return KV_OK;
    if (s->gpu) {
        KV_TRY(pk_launch(s, t, q, k, sel, NULL));
        return pk_finish(s, t, k, sel);
    }
    int jobs = s->pool_mean ? sh->num_kv_heads : sh->num_q_heads, failed = 0;
    /* threads only pay off on long regions (a parallel region costs more than a short search) */
#pragma omp parallel for schedule(dynamic) reduction(| : failed) if ((long)jobs * (hi - lo) >= 65536)
    for (int job = 0; job < jobs; job++) {
#ifdef _OPENMP
        pk_scratch *c = &s->scr[omp_get_thread_num()];
#else
        pk_scratch *c = &s->scr[0];
#endif
        int g = s->pool_mean ? job : job / G, h0 = s->pool_mean ? job * G : job, nh = s->pool_mean ? G : 1;
        for (int d = 0; d < D; d++) { /* the group's mean raw query (or the head's own) */
            float acc = 0;
            for (int h = h0; h < h0 + nh; h++) acc += q[(size_t)h * D + d];
            c->qv[d] = acc / (float)nh;
        }
        int ncand = 0, got = search_one(s, c, g, t, k, &ncand);
        if (got < 0) { failed = 1; continue; }
        if (got > sel->cap) got = sel->cap;
        if (ncand > sel->cand_cap) ncand = sel->cand_cap;
        for (int h = h0; h < h0 + nh; h++) {
            memcpy(sel->idx + (size_t)h * sel->cap, c->out, (size_t)got * sizeof(int32_t));
            sel->count[h] = got;
            memcpy(sel->cand + (size_t)h * sel->cand_cap, c->cand, (size_t)ncand * sizeof(int32_t));
            sel->n_cand[h] = ncand;
        }
    }
    if (failed) return kv_fail(KV_ERR_NOMEM, "pariskv: out of host memory for top-k scratch");
    report_extra(s, lo, hi, sel);
    return KV_OK;
}

static size_t pk_memory(const void *st) {
    const pk_state *s = st;
    const kv_pariskv_codec *cx = &s->cx;
    size_t Hkv = (size_t)s->sh.num_kv_heads, n = (size_t)(s->n_idx - s->sh.sink > 0 ? s->n_idx - s->sh.sink : 0);
    size_t bytes = Hkv * n * ((size_t)cx->nb + cx->code_bytes + cx->nb * sizeof(kv_bf16));
    bytes += Hkv * cx->nb * s->nc * sizeof(int32_t);
    if (s->kmeans) bytes += Hkv * cx->nb * s->nc * (cx->m + 1) * sizeof(float);
    if (s->keys) bytes += Hkv * (size_t)s->n_seen * s->sh.head_dim * sizeof(float);
    return bytes;
}

static void pk_describe(FILE *f) {
    for (int conv = 0; conv < 2; conv++) {
        double lv[KV_PARISKV_LEVELS], th[KV_PARISKV_LEVELS - 1];
        int it = kv_pariskv_lloyd(8, conv, lv, th);
        fprintf(f, "%-12s   m=8 lloyd=%s (%d iterations, MSE %.6e)\n%-12s     levels    ", "",
                conv ? "converged" : "released", it, kv_pariskv_lloyd_mse(8, lv, th), "");
        for (int i = 0; i < KV_PARISKV_LEVELS; i++) fprintf(f, " %.4f", lv[i]);
        fprintf(f, "\n%-12s     thresholds", "");
        for (int i = 0; i < KV_PARISKV_LEVELS - 1; i++) fprintf(f, " %.4f", th[i]);
        fputc('\n', f);
    }
    fprintf(f, "%-12s   index bytes per key and kv head: B + D'/2 + 2B (bf16 weights; D=128, m=8: 112)\n", "");
    fprintf(f, "%-12s   GPU path: centroids=analytic rotation=srht normalize=1 rerank=rsqip (other values run on the CPU)\n",
            "");
}

/* kvbench bench --method pariskv on a GPU (kv_retriever.h's bench_gpu). */
static kv_status pk_bench_gpu(const kv_shape *shape, const kv_param_set *params, const kv_gpu_bench_spec *spec,
                              const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out) {
    if (!pk_gpu_ok(params, shape->head_dim))
        return kv_fail(KV_ERR_INPUT, "pariskv: the GPU bench runs the GPU path only (centroids=analytic, "
                                     "rotation=srht, normalize=1, rerank=rsqip, 32 <= D' <= 256); --device cpu times the rest");
    KV_TRY(kv_gpu_table(&kv_pariskv_cuda));
    kv_pariskv_codec cx;
    KV_TRY(kv_pariskv_codec_init(&cx, shape->head_dim, kv_param_int(params, "m"), 1, 1, kv_param_int(params, "lloyd"),
                                 shape->seed + (uint64_t)kv_param_int(params, "seed")));
    double beta, rho;
    kv_pariskv_adaptive_ratios(spec->n, &beta, &rho);
    if (kv_param_is_set(params, "beta") && kv_param(params, "beta") > 0) beta = kv_param(params, "beta");
    if (kv_param_is_set(params, "rho") && kv_param(params, "rho") > 0) rho = kv_param(params, "rho");
    kv_pariskv_gpu_cfg cfg = kv_pariskv_gpu_config(&cx, shape, kv_param_int(params, "pool") == 0,
                                                   kv_param_int(params, "update"));
    cfg.T = spec->n;
    kv_status st = kv_pariskv_cuda.bench(&cfg, spec, K, q, beta, rho, kv_param_int(params, "tiers") == 0, out);
    kv_pariskv_codec_free(&cx);
    return st;
}

const kv_method kv_method_pariskv = {
    .abi = KV_RETRIEVER_ABI,
    .name = "pariskv",
    .summary = "ParisKV: SRHT + sign-centroid collision voting, then RSQ-IP rerank from 4-bit codes",
    .paper = "\"ParisKV: Fast and Drift-Robust KV-Cache Retrieval for Long-Context LLMs\", Qi et al., "
             "preprint 2026 (secs. 4.1-4.2, app. B), code amy-77/ParisKV",
    .per_kv_head = 0,
    .group_pool_param = "pool",
    .has_gpu = 1,
    .params = pariskv_params,
    .create = pk_create,
    .build = pk_build,
    .prefill_half = 1, /* the GPU path widens a chunk at a time, the CPU path the keys once */
    .append = pk_append,
    .search = pk_search,
    .candidates = pk_candidates,
    .candidates_dev = pk_candidates_dev,
    .search_launch = pk_launch,
    .search_finish = pk_finish,
    .memory_bytes = pk_memory,
    .destroy = pk_destroy,
    .describe = pk_describe,
    .bench_gpu = pk_bench_gpu,
};
