/* csattention.c: CSAttention (anonymous, "CSAttention: Centroid-Scoring
 * Attention for Accelerating LLM Inference", under review; no public code),
 * CPU reference, following the paper's sec. 3.1-3.3 and app. B/D.
 *
 * Index (sec. 3.2). Per kv head the head dimension is cut into m subspaces
 * of ds = D/m dims (uniform split, the paper's default). Per subspace,
 * cosine k-means (eq. in 3.2(1): unit-normalised sub-vectors, unit
 * centroids) of the prefill queries of the kv group into C centroids,
 * k-means++ seeded, `iters` Lloyd rounds. For every centroid c the top-L keys
 * by the partial score <c, k^(b)> (raw keys, unit centroid) are kept as a
 * fixed-size list of (index, score), L = ceil(alpha * N) with N the keys
 * indexed at build. Decode (3.3). Per subspace the centroid nearest to the
 * query's sub-vector (largest cosine), gather the m lists, sum the partial
 * scores by key index (reduce-by-key), top k. Streaming update (3.3(5)):
 * each appended key is tried against every centroid's list and replaces the
 * list's weakest entry when its score is larger (lists keep size L).
 *
 * Choices where the paper is silent, and why:
 * - Indexed keys: every position >= sink, as it arrives (the paper indexes
 *   all N prefill keys and try-inserts each appended key; the sink is always
 *   attended). Entries inside the local window are dropped at search (the
 *   protocol attends them anyway; the paper's recent window R is the
 *   protocol's `local`). L is fixed at build from N = P - sink.
 * - Missing keys (`missing`): the paper's sum (eq. in 3.3(3)) has the
 *   indicator [i in I_jb], so a key absent from a list contributes zero:
 *   the default. `missing=min` charges it the list's minimum score instead
 *   (an absent key scores at most that), offered as the alternative.
 *   Partial scores can be negative: when a list's minimum is below zero,
 *   `zero` ranks an absent key above present keys with negative partials.
 * - k-means points: the paper runs mini-batch k-means on the GPU; here full
 *   Lloyd on at most `max_points` points (default 65536; 0 = all) taken at
 *   evenly spaced indices of the G*P query sub-vectors of the group (head
 *   major), so a 1M-token prefill stays tractable on the CPU. Zero
 *   sub-vectors stay zero (cosine 0 to everything). Ties to the smaller
 *   centroid. Per (kv head, subspace) seed = f(--seed + seed, g, b).
 * - GQA (`pool`): the index is per kv head (queries of its G heads
 *   clustered together); none = every query head picks its own centroids
 *   and gets its own list; mean = the group's raw queries averaged, one
 *   selection shared by the group (group-consistent). Always reported per
 *   query head.
 * - Ablation `centroids=keys` clusters the normalised prefill keys of the kv
 *   head instead of the queries (the key-centric path Q -> K-centroid -> K
 *   the paper argues against, sec. 2.4), everything else unchanged.
 * - A prefill without queries (only `kvbench bench` hands one) is clustered
 *   from its keys, as centroids=keys (the bench measures cost, not recall).
 * - `update=0` freezes the lists after the build (generated keys are then
 *   never selected; that is the ablation of the streaming update).
 * - Weights (`weight`): w_b = 1 (one, the paper's default, table 6): the
 *   unit centroids drop each subspace's query norm |q^(b)|, which the true
 *   partial <q^(b), k^(b)> carries (the paper's sec. 2.3 observes the
 *   subspaces contribute unevenly and app. D allows other weights);
 *   weight=qnorm sets w_b = |q^(b)| at decode (no index change). The budget is the
 *   protocol's k (the paper's rho*N). Scores accumulate in float in subspace
 *   order; ties in the top-k go to the smaller index (kernels/topk.h).
 * - Candidate set: the distinct keys of the region gathered from the m
 *   lists (|U| <= mL, app. B.2), per query head.
 * - GPU path (shape->use_gpu, kernels/csattention.cu): kmeans=gpu (default)
 *   runs the k-means on the device from the same points and uniforms (its
 *   centroid sums add in another order: a coordinate may differ in its last
 *   bit), kmeans=host runs the C code above (both paths then share the
 *   centroids bitwise); the lists are built, searched and try-inserted on
 *   the device (see its header). The search comes in halves
 *   (search_launch/search_finish: `kvbench run` queues it behind the other
 *   methods'); its union (the candidate set, a diagnostic) is listed after
 *   the search and copied by `candidates` or left on the device by
 *   `candidates_dev` (the run's device evaluation), outside the timed
 *   search: at the defaults it is about 90% of the region a row (943,467
 *   keys at 1M tokens in `kvbench bench`, session 21).
 * - memory_bytes: centroids (float32) + lists (int32 index + float32 score
 *   per entry: 8 B; the paper stores fp16 scores, 6 B). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/csattention.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "query_centric.h"

enum { CS_POOL_NONE = 0, CS_POOL_MEAN = 1 };
enum { CS_CENT_QUERIES = 0, CS_CENT_KEYS = 1 };

typedef struct {
    kv_shape sh;
    int m, C, ds, L, iters, pool, update, missing, centroids, max_points, weight, kmeans_gpu;
    double alpha;
    uint64_t seed;
    int n;                /* positions seen */
    float *cent;          /* [Hkv][m][C][ds] */
    int32_t *lidx;        /* [Hkv][m][C][L]: min-heap on (score, -index) */
    float *lval;          /* [Hkv][m][C][L] */
    int *lcnt;            /* [Hkv][m][C] */
    /* search scratch, one set per kv head (heads run in parallel) */
    float *acc, *tmp, *sc;    /* [Hkv][T] */
    int *stamp, *epoch;       /* [Hkv][T], [Hkv] */
    int32_t *u;               /* [Hkv][m*L] */
    float *qp;                /* [Hkv][D] pooled query */
    void *gpu;                /* the device path (kernels/csattention.h) */
} cs_state;

static const kv_param_spec cs_params[] = {
    {"m", KV_PARAM_INT, KV_PARAM_BUILD, 8, 1, 128, NULL, "subspaces (must divide head_dim)"},
    {"C", KV_PARAM_INT, KV_PARAM_BUILD, 128, 1, 65536, NULL, "centroids per subspace"},
    {"alpha", KV_PARAM_FLOAT, KV_PARAM_BUILD, 0.25, 1e-6, 1, NULL, "list length L = ceil(alpha * (P - sink))"},
    {"iters", KV_PARAM_INT, KV_PARAM_BUILD, 10, 0, 1000, NULL, "Lloyd rounds of the cosine k-means"},
    {"max_points", KV_PARAM_INT, KV_PARAM_BUILD, 65536, 0, 2147483647, NULL,
     "k-means points per subspace at most (evenly spaced; 0 = all)"},
    {"centroids", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 1, "queries|keys",
     "cluster the prefill queries (paper) or keys (key-centric ablation)"},
    {"update", KV_PARAM_INT, KV_PARAM_BUILD, 1, 0, 1, NULL, "try-insert appended keys into the lists (1, paper)"},
    {"kmeans", KV_PARAM_ENUM, KV_PARAM_BUILD, 1, 0, 1, "host|gpu",
     "GPU path only: run the k-means on the host (the C reference) or on the device"},
    {"missing", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 1, "zero|min",
     "score of a key absent from a gathered list: zero (paper's sum) or the list minimum"},
    {"weight", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 1, "one|qnorm",
     "subspace weight w_b: one (paper, table 6) or |q^(b)| (restores each subspace's query norm)"},
    {"pool", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 1, "none|mean",
     "GQA: none = per query head; mean = group-mean query, one selection per group"},
    {"seed", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 2147483647, NULL, "seed of the k-means++ init (added to --seed)"},
    {NULL},
};

/* ---- numerical pieces (query_centric.h) ---- */

void kv_cs_normalise(const float *x, int n, int ld, int d, float *out) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ld;
        double s = 0;
        for (int j = 0; j < d; j++) s += (double)xi[j] * xi[j];
        float inv = s > 0 ? (float)(1.0 / sqrt(s)) : 0.f;
        for (int j = 0; j < d; j++) out[(size_t)i * d + j] = xi[j] * inv;
    }
}

int kv_cs_nearest(const float *x, const float *cent, int C, int d) {
    int best = 0;
    float bv = -INFINITY;
    for (int c = 0; c < C; c++) {
        float v = kv_dot_ref(x, cent + (size_t)c * d, d);
        if (v > bv) { bv = v; best = c; }
    }
    return best;
}

kv_status kv_cs_kmeans(const float *x, int n, int d, int C, int iters, uint64_t seed, float *cent) {
    memset(cent, 0, (size_t)C * d * sizeof(float));
    if (n <= 0) return KV_OK;
    double *dist = kv_malloc((size_t)n * sizeof(double), "csattention k-means++ distances");
    double *sum = kv_malloc((size_t)C * d * sizeof(double), "csattention k-means sums");
    int *cnt = kv_malloc((size_t)C * sizeof(int), "csattention k-means counts");
    int *asg = kv_malloc((size_t)n * sizeof(int), "csattention k-means assignment");
    if (!dist || !sum || !cnt || !asg) { free(dist); free(sum); free(cnt); free(asg); return KV_ERR_NOMEM; }
    kv_rng r;
    kv_rng_seed(&r, seed);
    /* k-means++: squared distance to the nearest chosen centre, in double */
    int pick = (int)(kv_rng_uniform(&r) * n);
    for (int c = 0; c < C; c++) {
        memcpy(cent + (size_t)c * d, x + (size_t)pick * d, (size_t)d * sizeof(float));
        if (c == C - 1) break;
        double total = 0;
        const float *cc = cent + (size_t)c * d;
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int j = 0; j < d; j++) {
                double e = (double)x[(size_t)i * d + j] - cc[j];
                s += e * e;
            }
            dist[i] = c == 0 || s < dist[i] ? s : dist[i];
            total += dist[i];
        }
        double u = kv_rng_uniform(&r) * total;
        pick = -1;
        if (total > 0) {
            double run = 0;
            for (int i = 0; i < n; i++) {
                run += dist[i];
                if (dist[i] > 0 && run > u) { pick = i; break; }
            }
            if (pick < 0) /* rounding at the end of the walk: the last point with weight */
                for (int i = n - 1; i >= 0 && pick < 0; i--)
                    if (dist[i] > 0) pick = i;
        }
        if (pick < 0) pick = (int)(kv_rng_uniform(&r) * n); /* every point is a centre already */
    }
    for (int it = 0; it < iters; it++) {
        for (int i = 0; i < n; i++) asg[i] = kv_cs_nearest(x + (size_t)i * d, cent, C, d);
        memset(sum, 0, (size_t)C * d * sizeof(double));
        memset(cnt, 0, (size_t)C * sizeof(int));
        for (int i = 0; i < n; i++) {
            double *s = sum + (size_t)asg[i] * d;
            for (int j = 0; j < d; j++) s[j] += x[(size_t)i * d + j];
            cnt[asg[i]]++;
        }
        for (int c = 0; c < C; c++) {
            double nn = 0;
            for (int j = 0; j < d; j++) nn += sum[(size_t)c * d + j] * sum[(size_t)c * d + j];
            if (!cnt[c] || nn <= 0) continue; /* empty: keeps its centre */
            double inv = 1.0 / sqrt(nn);
            for (int j = 0; j < d; j++) cent[(size_t)c * d + j] = (float)(sum[(size_t)c * d + j] * inv);
        }
    }
    free(dist); free(sum); free(cnt); free(asg);
    return KV_OK;
}

int kv_cs_reduce(int m, const int32_t *const *idx, const float *const *val, const int *cnt, const float *w, int lo,
                 int hi, int missing, int32_t *u, float *acc, float *tmp, int *stamp, int *epoch) {
    int nu = 0;
    int e0 = ++*epoch; /* membership of U */
    for (int b = 0; b < m; b++)
        for (int j = 0; j < cnt[b]; j++) {
            int i = idx[b][j];
            if (i < lo || i >= hi || stamp[i] == e0) continue;
            stamp[i] = e0;
            u[nu++] = i;
            acc[i] = 0.f;
        }
    for (int b = 0; b < m; b++) {
        int e = ++*epoch;
        float miss = 0.f;
        if (missing == KV_CS_MISSING_MIN && cnt[b] > 0) {
            miss = val[b][0];
            for (int j = 1; j < cnt[b]; j++) miss = val[b][j] < miss ? val[b][j] : miss;
        }
        for (int j = 0; j < cnt[b]; j++) {
            int i = idx[b][j];
            if (i < lo || i >= hi) continue;
            stamp[i] = e;
            tmp[i] = val[b][j];
        }
        float wb = w ? w[b] : 1.f;
        for (int a = 0; a < nu; a++) {
            int i = u[a];
            acc[i] += wb * (stamp[i] == e ? tmp[i] : miss);
        }
    }
    return nu;
}

/* ---- the lists are heaps with the weakest at the root (kv_heap_*: smallest score; among equal scores the
 * larger index) ---- */

/* Try-insert key `pos` with score v into a list of capacity L. */
static void list_try_insert(int32_t *hi, float *hv, int *cnt, int L, int pos, float v) {
    if (*cnt < L) {
        hi[*cnt] = pos; hv[*cnt] = v;
        kv_heap_up(hv, hi, (*cnt)++);
    } else if (L > 0 && kv_beats(v, pos, hv[0], hi[0])) {
        hi[0] = pos; hv[0] = v;
        kv_heap_down(hv, hi, L, 0);
    }
}

/* ---- the retriever ---- */

static void cs_free(cs_state *s) {
    if (!s) return;
    if (s->gpu) kv_csattention_cuda.destroy(s->gpu);
    free(s->cent); free(s->lidx); free(s->lval); free(s->lcnt);
    free(s->acc); free(s->tmp); free(s->sc); free(s->stamp); free(s->epoch); free(s->u); free(s->qp);
    free(s);
}

static kv_status cs_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    int m = kv_param_int(ps, "m");
    if (sh->head_dim % m)
        return kv_fail(KV_ERR_INPUT, "csattention: m=%d must divide head_dim %d", m, sh->head_dim);
    if (sh->use_gpu && !&kv_csattention_cuda) return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
    cs_state *s = kv_calloc(1, sizeof *s, "csattention state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->m = m;
    s->ds = sh->head_dim / m;
    s->C = kv_param_int(ps, "C");
    s->alpha = kv_param(ps, "alpha");
    s->iters = kv_param_int(ps, "iters");
    s->max_points = kv_param_int(ps, "max_points");
    s->centroids = kv_param_int(ps, "centroids");
    s->update = kv_param_int(ps, "update");
    s->missing = kv_param_int(ps, "missing");
    s->pool = kv_param_int(ps, "pool");
    s->weight = kv_param_int(ps, "weight");
    s->kmeans_gpu = kv_param_int(ps, "kmeans");
    s->seed = sh->seed + (uint64_t)kv_param_int(ps, "seed");
    int N = sh->prefill_len - sh->sink;
    s->L = N > 0 ? (int)ceil(s->alpha * N - 1e-9) : 0;
    if (s->L < 1) s->L = 1;
    size_t Hkv = (size_t)sh->num_kv_heads, T = (size_t)sh->max_tokens, M = (size_t)m, C = (size_t)s->C,
           L = (size_t)s->L;
    s->cent = kv_malloc(Hkv * M * C * s->ds * sizeof(float), "csattention centroids");
    s->lidx = kv_malloc(Hkv * M * C * L * sizeof(int32_t), "csattention list indices");
    s->lval = kv_malloc(Hkv * M * C * L * sizeof(float), "csattention list scores");
    s->lcnt = kv_calloc(Hkv * M * C, sizeof(int), "csattention list counts");
    s->acc = kv_malloc(Hkv * T * sizeof(float), "csattention sums");
    s->tmp = kv_malloc(Hkv * T * sizeof(float), "csattention scratch");
    s->sc = kv_malloc(Hkv * T * sizeof(float), "csattention scores");
    s->stamp = kv_calloc(Hkv * T, sizeof(int), "csattention stamps");
    s->epoch = kv_calloc(Hkv, sizeof(int), "csattention epochs");
    s->u = kv_malloc(Hkv * M * L * sizeof(int32_t), "csattention union");
    s->qp = kv_malloc(Hkv * sh->head_dim * sizeof(float), "csattention pooled query");
    if (!s->cent || !s->lidx || !s->lval || !s->lcnt || !s->acc || !s->tmp || !s->sc || !s->stamp || !s->epoch ||
        !s->u || !s->qp) {
        cs_free(s);
        return KV_ERR_NOMEM;
    }
    if (sh->use_gpu) {
        kv_cs_gpu_config cfg = {.Hq = sh->num_q_heads, .Hkv = sh->num_kv_heads, .T = sh->max_tokens,
                                .D = sh->head_dim, .m = m, .C = s->C, .L = s->L, .sink = sh->sink};
        kv_status st = kv_csattention_cuda.create(&cfg, &s->gpu);
        if (st != KV_OK) { cs_free(s); return st; }
    }
    *out = s;
    return KV_OK;
}

static uint64_t cs_job_seed(const cs_state *s, int g, int b) {
    return s->seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(g + 1) << 32) ^ (uint64_t)(b + 1) * 0xbf58476d1ce4e5b9ULL;
}

/* The k-means points of (kv head g, subspace b): unit sub-vectors of the
 * group's prefill queries (or the head's prefill keys), evenly spaced down
 * to max_points. Returns the count; *out is malloc'd. */
static int cs_points(const cs_state *s, const kv_prefill *pre, int g, int b, float **out) {
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, G = sh->group, P = pre->n, ds = s->ds;
    int keys = s->centroids == CS_CENT_KEYS || !pre->q; /* no queries: kvbench bench (the keys stand in) */
    long total = keys ? (long)P : (long)G * P;
    long n = s->max_points > 0 && total > s->max_points ? s->max_points : total;
    *out = kv_malloc((size_t)(n > 0 ? n : 1) * ds * sizeof(float), "csattention k-means points");
    if (!*out) return -1;
    for (long i = 0; i < n; i++) {
        long p = n == total ? i : (long)((double)i * total / n);
        const float *src = keys
                               ? pre->k + ((size_t)g * P + p) * D + (size_t)b * ds
                               : pre->q + ((size_t)(g * G + p / P) * P + p % P) * D + (size_t)b * ds;
        kv_cs_normalise(src, 1, D, ds, *out + (size_t)i * ds);
    }
    return (int)n;
}

/* The k-means of every job on the device (kmeans=gpu): the same points and
 * uniforms as the C reference; done[j] = 1 for the jobs it finished. */
static kv_status cs_gpu_kmeans(cs_state *s, const kv_prefill *pre, int *done) {
    int m = s->m, C = s->C, ds = s->ds, jobs = s->sh.num_kv_heads * m, maxn = 0;
    float **x = kv_calloc((size_t)jobs, sizeof(float *), "csattention k-means jobs");
    int *npts = kv_calloc((size_t)jobs, sizeof(int), "csattention k-means point counts");
    int *fb = kv_calloc((size_t)jobs, sizeof(int), "csattention k-means fallbacks");
    double *draws = kv_malloc((size_t)jobs * C * sizeof(double), "csattention k-means uniforms");
    kv_status rc = x && npts && fb && draws ? KV_OK : KV_ERR_NOMEM;
    for (int j = 0; j < jobs && rc == KV_OK; j++) {
        npts[j] = cs_points(s, pre, j / m, j % m, &x[j]);
        if (npts[j] < 0) rc = KV_ERR_NOMEM;
        maxn = npts[j] > maxn ? npts[j] : maxn;
        kv_rng r;
        kv_rng_seed(&r, cs_job_seed(s, j / m, j % m));
        for (int c = 0; c < C; c++) draws[(size_t)j * C + c] = kv_rng_uniform(&r);
    }
    float *pts = NULL;
    if (rc == KV_OK && maxn > 0) {
        pts = kv_calloc((size_t)jobs * maxn * ds, sizeof(float), "csattention k-means points");
        if (!pts) rc = KV_ERR_NOMEM;
        for (int j = 0; j < jobs && rc == KV_OK; j++)
            memcpy(pts + (size_t)j * maxn * ds, x[j], (size_t)npts[j] * ds * sizeof(float));
        if (rc == KV_OK)
            rc = kv_csattention_cuda.kmeans(s->gpu, pts, npts, maxn, s->iters, draws, s->cent, fb);
    }
    for (int j = 0; j < jobs && rc == KV_OK; j++) done[j] = maxn > 0 && npts[j] > 0 && !fb[j];
    for (int j = 0; x && j < jobs; j++) free(x[j]);
    free(x); free(npts); free(fb); free(draws); free(pts);
    return rc;
}

static kv_status cs_build(void *st, const kv_prefill *pre) {
    cs_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, P = pre->n, m = s->m, C = s->C, ds = s->ds, L = s->L, lo = sh->sink;
    int Hkv = sh->num_kv_heads;
    kv_status rc = KV_OK;
    int *done = kv_calloc((size_t)Hkv * m, sizeof(int), "csattention k-means flags");
    if (!done) return KV_ERR_NOMEM;
    if (s->gpu && s->kmeans_gpu && (rc = cs_gpu_kmeans(s, pre, done)) != KV_OK) { free(done); return rc; }
#pragma omp parallel for schedule(dynamic) collapse(2)
    for (int g = 0; g < Hkv; g++)
        for (int b = 0; b < m; b++) {
            float *x = NULL, *scores = NULL;
            int32_t *ti = NULL;
            float *tv = NULL;
            int n = cs_points(s, pre, g, b, &x);
            kv_status r = n < 0 ? KV_ERR_NOMEM : KV_OK;
            float *cent = s->cent + ((size_t)g * m + b) * C * ds;
            if (r == KV_OK && !done[g * m + b]) r = kv_cs_kmeans(x, n, ds, C, s->iters, cs_job_seed(s, g, b), cent);
            int nk = P > lo && !s->gpu ? P - lo : 0; /* the GPU builds the lists itself */
            scores = kv_malloc((size_t)(nk > 0 ? nk : 1) * sizeof(float), "csattention partial scores");
            ti = kv_malloc((size_t)L * sizeof(int32_t), "csattention top-L");
            tv = kv_malloc((size_t)L * sizeof(float), "csattention top-L");
            if (!scores || !ti || !tv) r = KV_ERR_NOMEM;
            for (int c = 0; c < C && r == KV_OK && !s->gpu; c++) {
                for (int i = 0; i < nk; i++)
                    scores[i] = kv_dot_ref(cent + (size_t)c * ds, pre->k + ((size_t)g * P + lo + i) * D + (size_t)b * ds, ds);
                int got = kv_topk_ref(scores, nk, L, lo, ti, tv);
                if (got < 0) { r = KV_ERR_NOMEM; break; }
                size_t li = (((size_t)g * m + b) * C + c);
                int32_t *hi = s->lidx + li * L;
                float *hv = s->lval + li * L;
                s->lcnt[li] = 0;
                for (int j = 0; j < got; j++) list_try_insert(hi, hv, &s->lcnt[li], L, ti[j], tv[j]);
            }
            free(x); free(scores); free(ti); free(tv);
            if (r != KV_OK) {
#pragma omp critical
                rc = r;
            }
        }
    free(done);
    s->n = P;
    if (rc != KV_OK || !s->gpu) return rc;
    KV_TRY(kv_csattention_cuda.build(s->gpu, pre->k, P, s->cent));
    return kv_csattention_cuda.read_index(s->gpu, NULL, s->lidx, s->lval, s->lcnt);
}

static kv_status cs_append(void *st, int t, const float *k, const float *v, const float *q) {
    cs_state *s = st;
    (void)v; (void)q;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "csattention: append of position %d, expected %d", t, s->n);
    s->n++;
    if (!s->update || t < s->sh.sink) return KV_OK;
    if (s->gpu) return kv_csattention_cuda.append(s->gpu, t, k);
    int D = s->sh.head_dim, m = s->m, C = s->C, ds = s->ds, L = s->L;
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        for (int b = 0; b < m; b++)
            for (int c = 0; c < C; c++) {
                size_t li = ((size_t)g * m + b) * C + c;
                const float *cent = s->cent + li * ds;
                float sc = kv_dot_ref(cent, k + (size_t)g * D + (size_t)b * ds, ds);
                list_try_insert(s->lidx + li * L, s->lval + li * L, &s->lcnt[li], L, t, sc);
            }
    return KV_OK;
}

/* One selection for query vector qv of kv head g into out (<= k indices); returns the count, *nu = |U|. */
static int cs_select(cs_state *s, int g, const float *qv, int hi, int k, int32_t *out, int32_t *cand, int *nu) {
    const kv_shape *sh = &s->sh;
    int m = s->m, C = s->C, ds = s->ds, L = s->L, lo = sh->sink;
    size_t T = (size_t)sh->max_tokens;
    const int32_t *idx[128];
    const float *val[128];
    int cnt[128];
    float w[128];
    for (int b = 0; b < m; b++) {
        size_t cb = ((size_t)g * m + b) * C;
        w[b] = sqrtf(kv_dot_ref(qv + (size_t)b * ds, qv + (size_t)b * ds, ds));
        int j = kv_cs_nearest(qv + (size_t)b * ds, s->cent + cb * ds, C, ds);
        idx[b] = s->lidx + (cb + j) * L;
        val[b] = s->lval + (cb + j) * L;
        cnt[b] = s->lcnt[cb + j];
    }
    float *acc = s->acc + g * T, *sc = s->sc + g * T;
    int32_t *u = s->u + (size_t)g * m * L;
    int n = kv_cs_reduce(m, idx, val, cnt, s->weight ? w : NULL, lo, hi, s->missing, u, acc, s->tmp + g * T, s->stamp + g * T,
                         &s->epoch[g]);
    *nu = n;
    if (cand) memcpy(cand, u, (size_t)n * sizeof(int32_t));
    if (n == 0) return 0;
    for (int i = lo; i < hi; i++) sc[i - lo] = -INFINITY;
    for (int a = 0; a < n; a++) sc[u[a] - lo] = acc[u[a]];
    return kv_topk_ref(sc, hi - lo, k < n ? k : n, lo, out, NULL);
}

/* The GPU search in halves (kv_method.search_launch); the union, a diagnostic, is listed and copied by
 * cs_candidates, outside the run's timed search (about 90% of the region a row: copied inside it, the in-run search
 * took 897 us at 128K tokens against 42 after, session 21). */
static kv_status cs_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    cs_state *s = st;
    return kv_csattention_cuda.launch(s->gpu, q, s->pool, s->missing, s->weight, t + 1 - s->sh.local, k,
                                      sel->cand != NULL, mark);
}

static kv_status cs_finish(void *st, int t, int k, kv_selection *sel) {
    cs_state *s = st;
    (void)t; (void)k;
    return kv_csattention_cuda.fetch(s->gpu, sel->idx, sel->cap, sel->count);
}

static kv_status cs_candidates(void *st, kv_selection *sel) {
    cs_state *s = st;
    return s->gpu && sel->cand ? kv_csattention_cuda.candidates(s->gpu, sel->cand, sel->cand_cap, sel->n_cand) : KV_OK;
}

/* The same union where it is, for the run's device evaluation: not copied down and packed back up (at 1M
 * tokens about 3.8 MB a row each way). */
static kv_status cs_candidates_dev(void *st, kv_dev_cands *out) {
    cs_state *s = st;
    *out = (kv_dev_cands){0};
    if (!s->gpu) return KV_OK;
    return kv_csattention_cuda.candidates_dev(s->gpu, &out->idx, &out->ld, &out->rows, &out->counts);
}

static kv_status cs_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    cs_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, G = sh->group, hi = t + 1 - sh->local;
    if (hi <= sh->sink || k <= 0) return KV_OK;
    if (s->gpu) {
        KV_TRY(cs_launch(s, t, q, k, sel, NULL));
        return cs_finish(s, t, k, sel);
    }
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int g = 0; g < sh->num_kv_heads; g++) {
        if (s->pool == CS_POOL_MEAN) {
            float *qp = s->qp + (size_t)g * D;
            for (int j = 0; j < D; j++) {
                float a = 0.f;
                for (int h = g * G; h < (g + 1) * G; h++) a += q[(size_t)h * D + j];
                qp[j] = a / G;
            }
            int nu, h0 = g * G;
            int c = cs_select(s, g, qp, hi, k, sel->idx + (size_t)h0 * sel->cap, sel->cand + (size_t)h0 * sel->cand_cap, &nu);
            failed |= c < 0;
            for (int h = h0; h < h0 + G; h++) {
                sel->count[h] = c < 0 ? 0 : c;
                sel->n_cand[h] = nu;
                if (h == h0) continue;
                memcpy(sel->idx + (size_t)h * sel->cap, sel->idx + (size_t)h0 * sel->cap, (size_t)sel->count[h] * sizeof(int32_t));
                memcpy(sel->cand + (size_t)h * sel->cand_cap, sel->cand + (size_t)h0 * sel->cand_cap, (size_t)nu * sizeof(int32_t));
            }
            continue;
        }
        for (int h = g * G; h < (g + 1) * G; h++) {
            int nu;
            int c = cs_select(s, g, q + (size_t)h * D, hi, k, sel->idx + (size_t)h * sel->cap,
                              sel->cand + (size_t)h * sel->cand_cap, &nu);
            failed |= c < 0;
            sel->count[h] = c < 0 ? 0 : c;
            sel->n_cand[h] = nu;
        }
    }
    return failed ? kv_fail(KV_ERR_NOMEM, "csattention: out of host memory for top-k scratch") : KV_OK;
}

static size_t cs_memory(const void *st) {
    const cs_state *s = st;
    size_t Hkv = (size_t)s->sh.num_kv_heads, MC = (size_t)s->m * s->C;
    return Hkv * MC * ((size_t)s->ds * sizeof(float) + (size_t)s->L * (sizeof(int32_t) + sizeof(float)));
}

static void cs_destroy(void *st) { cs_free(st); }

static void cs_describe(FILE *f) {
    fprintf(f, "    list length L = ceil(alpha * (P - sink)); union per step <= m * L; missing=zero is the paper's sum\n");
}

void kv_csattention_view(const void *st, kv_cs_view *out) {
    const cs_state *s = st;
    if (s->gpu) /* the lists live on the device: refresh the host mirror */
        (void)kv_csattention_cuda.read_index(s->gpu, NULL, s->lidx, s->lval, s->lcnt);
    *out = (kv_cs_view){.m = s->m, .C = s->C, .ds = s->ds, .L = s->L, .n = s->n, .cent = s->cent,
                        .lidx = s->lidx, .lval = s->lval, .lcnt = s->lcnt};
}

static kv_status cs_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                              const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out) {
    (void)V;
    if (!&kv_csattention_cuda) return kv_fail(KV_ERR_GPU, KV_NO_CUDA);
    if (spec->D % kv_param_int(ps, "m"))
        return kv_fail(KV_ERR_INPUT, "csattention: m=%d must divide head_dim %d", kv_param_int(ps, "m"), spec->D);
    kv_cs_bench_params bp = {.m = kv_param_int(ps, "m"), .C = kv_param_int(ps, "C"), .alpha = kv_param(ps, "alpha"),
                             .iters = kv_param_int(ps, "iters"), .pool = kv_param_int(ps, "pool"),
                             .missing = kv_param_int(ps, "missing"), .weight = kv_param_int(ps, "weight"),
                             .seed = sh->seed + (uint64_t)kv_param_int(ps, "seed")};
    return kv_csattention_cuda.bench(spec, &bp, K, q, out);
}

const kv_method kv_method_csattention = {
    .abi = KV_RETRIEVER_ABI,
    .name = "csattention",
    .summary = "query-centric subspace tables: per subspace nearest query centroid, sum its top-L partial scores by key, top k",
    .paper = "\"CSAttention: Centroid-Scoring Attention for Accelerating LLM Inference\", anonymous, under double-blind review; no public code",
    .per_kv_head = 0,
    .has_gpu = 1,
    .params = cs_params,
    .create = cs_create,
    .build = cs_build,
    .prefill_reads = KV_PREFILL_K | KV_PREFILL_Q, /* build() reads pre->k and pre->q only */
    .append = cs_append,
    .search = cs_search,
    .candidates = cs_candidates,
    .candidates_dev = cs_candidates_dev,
    .search_launch = cs_launch,
    .search_finish = cs_finish,
    .memory_bytes = cs_memory,
    .destroy = cs_destroy,
    .describe = cs_describe,
    .bench_gpu = cs_bench_gpu,
};
