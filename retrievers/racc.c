/* racc.c: RACC ("RACC: Retrieval-Augmented KV Cache Compression in
 * Long-Context Generation", under review: sec. 4 compression with grouped
 * recompression, appendix B the vote, appendix C algorithm 1, eq. 4 the
 * compression rate), CPU reference. No public code.
 *
 * Resident set (per kv head): SnapKV-style voting. At a compression, the
 * voted set V is every resident token of [sink, n - window) (n = positions
 * seen; the last `window` tokens are the observation window L_3 and stay,
 * as does the sink); each of the window's queries (the G query heads of
 * the kv head, positions [n - window, n)) scores V, and the vote of a token
 * is its softmax weight summed over the window and the group (appendix B
 * sums the attention of L_3 over L_2; alg. 1 line 4). The floor(alpha*|V|)
 * tokens with the highest votes stay resident, the rest are evicted to the
 * retrieval index. Compressions run at build (on the prefill: the paper's
 * LILO mode compresses prompt and generated tokens alike) and after every
 * L_n generated tokens (positions P + j*L_n - 1, j >= 1); tokens generated
 * in between are resident. alpha applies to the RESIDENT set, so the
 * resident fraction compounds (0.6 of 0.6 of ...): sec. 4, "Before
 * compression, the length of the KV cache is denoted as L_history. After
 * each compression, the resulting KV length becomes L_compression =
 * (L_history + L_n) x alpha", and eq. 4's overall rate
 * P_R = (alpha^n - 1) / (n (alpha - 1)) + beta is that geometric series
 * (alg. 1 line 5: K = L_2.size x compress_ratio, L_2 = the cache between
 * the sink and the window). The "a fraction alpha of the context"
 * reads as alpha of the cache being compressed; there is no parameter for
 * alpha of the whole context, which the paper does not describe. Retrieval: at step t the query of step t-1 (the
 * one append() was handed at t-1: lag 1, the retrieval runs one step ahead
 * asynchronously in the paper) searches the evicted keys of the region
 * exactly (index=exact: all inner products, kv_topk_ref) and the top
 * ceil(beta * (t+1)) are attended too (beta = the fraction of the context,
 * eq. 4). The selection (one list per kv head) is resident ∪ retrieved;
 * its size is not k: the method declares a variable budget and its mean
 * size is its effective budget. Method metric "resident_fraction": the
 * resident share of the region, averaged over kv heads.
 *
 * Choices where the paper is silent:
 * - Vote: softmax over V of softmax_scale * <q, k> per query (SnapKV's
 *   attention weights; eq. 5 writes the raw scores, alg. 1 says attention
 *   weights), max then the sum of exp in double, votes summed in double in
 *   query order (head, then position), ranked as float by kv_topk_ref
 *   (larger first, the earlier position among equals).
 * - GQA: the vote sums over the group (one resident set per kv head, the
 *   cache is per kv head); the retrieval query of a kv head is the mean of
 *   its G heads' queries (one MIPS query per kv head, as a single index
 *   search would be issued), scores softmax_scale * kv_dot_ref (the shared
 *   score kernel's, bitwise), ranked by kv_topk_ref.
 * - The retrieval searches the evicted set as it stands at step t (a
 *   compression at t already evicted its tokens); only the query lags.
 *   Evicted tokens inside the local window (possible when window < local -
 *   1) are not candidates (they are attended anyway).
 * - Without the prefill's queries (kvbench bench) the first compression has
 *   no window queries: nothing is evicted at build.
 * - index: exact (default: every evicted key scored, kv_topk_ref), or
 *   faiss-hnsw / faiss-ivf (retrievers/racc_index.c: one Faiss index per kv
 *   head, inner product; the keys a compression evicts are added to it in
 *   position order right after that compression, the paper's incremental
 *   "new KV entries are dynamically inserted into the existing index"; IVF
 *   trains on the first compression's evicted keys). The search query is
 *   the same group-mean q_{t-1} as exact's (one query per kv head); evicted
 *   keys inside the local window (not candidates) are over-fetched and
 *   dropped, so with exhaustive settings (ivf nprobe >= nlist; hnsw with
 *   efSearch >= the evicted set) the retrieved set is exact's up to the
 *   order of float-equal scores. Faiss's list is kept in Faiss's order.
 *   Built without Faiss, index=faiss-* fails at create (exit 2, naming the
 *   parameter). On the GPU path the vote stays on the device and a Faiss
 *   retrieval runs on the host (the paper's index lives in CPU memory:
 *   evicted keys are "offloaded to the CPU"); index=exact retrieves on the
 *   device.
 * - GPU path (shape->use_gpu, kernels/racc.cu): the keys live on the device
 *   (with index=exact only there: the host keeps no float32 copy);
 *   the vote (kernels/racc_scores.cu: one tiled sweep of scores bitwise
 *   kv_dot_ref's, kept on the device, then the row sums of exp and the
 *   votes; masked softmax, sum over the window and group) runs there and
 *   its float votes come back for the ranking here (nc floats once every
 *   L_n tokens), so votes agree with the CPU's to ~1e-12 relative (CUDA's
 *   exp, another summation order of the softmax denominators) and the kept
 *   set can differ only between near-equal votes; the retrieval (scores of
 *   the mean previous query masked to the evicted keys, the shared top-k,
 *   at most KV_GPU_TOPK_MAX keys) is bitwise the CPU's for the same
 *   eviction flags, and is queued (search_launch; the run waits for it
 *   once, after the resident part is copied). The resident part of the
 *   list and the flags stay on the host.
 * - The resident part: each kv head's resident positions are kept in an
 *   ascending array (racc_resident: rebuilt after each compression,
 *   extended by append), and a search copies its prefix below the region's
 *   end, rather than testing every region position's eviction flag at
 *   every step (issue 12: that loop was most of the GPU path's search). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/racc.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "baselines.h"
#include "racc_index.h"

typedef struct {
    kv_shape sh;
    double alpha, beta;
    int Ln, window;
    int n;              /* positions seen */
    int compressions;
    float *K;           /* [Hkv][T][D] all keys (resident or evicted: the index is exact); NULL on the GPU path
                         * with index=exact, which reads its keys on the device only */
    float *Qw;          /* [Hq][window][D] ring of the last `window` queries (slot = position % window) */
    int nq;             /* consecutive positions with a query handed over */
    float *q_prev;      /* [Hq][D] the query of position n-2 (n-1 is in the ring) */
    uint8_t *evicted;   /* [Hkv][T] */
    int *n_evicted;     /* [Hkv] */
    int32_t *res;       /* [Hkv][T] the resident positions of [sink, n), ascending (racc_resident) */
    int *n_res;         /* [Hkv] */
    /* scratch */
    int32_t *cand;      /* [T] */
    double *vote;       /* [T] */
    float *fs;          /* [T] */
    float *qw;          /* [G][window][D] the window's queries in position order */
    int32_t *top;       /* [T] */
    float *qm;          /* [Hkv][D] the groups' mean previous queries */
    uint8_t *kept;      /* [T] */
    float *fv;          /* [T] votes as float (the ranking) */
    float *vall;        /* GPU path: [Hkv][T] votes from the device */
    float *qwall;       /* GPU path: [Hq][window][D] the window queries in position order */
    int *rr;            /* GPU path: [Hkv] keys to retrieve */
    kv_racc_gpu *gpu;
    int queued;         /* GPU path: a retrieval is queued (racc_launch) for racc_finish */
    kv_racc_index *ix;  /* index=faiss-*: the evicted keys' Faiss indexes, else NULL */
    int32_t *newev;     /* [T] positions one compression evicts (for the index) */
} racc_state;

static const kv_param_spec racc_params[] = {
    {"alpha", KV_PARAM_FLOAT, KV_PARAM_BUILD, 0.6, 0, 1, NULL, "fraction of the voted tokens kept at each compression"},
    {"Ln", KV_PARAM_INT, KV_PARAM_BUILD, 400, 1, 1 << 30, NULL, "generated tokens between compressions (L_n)"},
    {"window", KV_PARAM_INT, KV_PARAM_BUILD, 32, 1, 65536, NULL, "observation window: the last queries that vote"},
    {"beta", KV_PARAM_FLOAT, KV_PARAM_SEARCH, 0.01, 0, 1, NULL,
     "keys retrieved per step from the evicted set, as a fraction of the context (t+1)"},
    {"index", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 2, "exact|faiss-hnsw|faiss-ivf",
     "MIPS index over the evicted keys: exact scan, or Faiss HNSW / IVF-Flat (inner product, per kv head)"},
    {"nlist", KV_PARAM_INT, KV_PARAM_BUILD, 128, 1, 1 << 20, NULL,
     "index=faiss-ivf: inverted lists (capped at the first compression's evicted keys)"},
    {"nprobe", KV_PARAM_INT, KV_PARAM_BUILD, 16, 1, 1 << 20, NULL, "index=faiss-ivf: lists scanned (>= nlist: exhaustive)"},
    {"hnsw_M", KV_PARAM_INT, KV_PARAM_BUILD, 32, 2, 512, NULL, "index=faiss-hnsw: graph neighbours per node"},
    {"efSearch", KV_PARAM_INT, KV_PARAM_BUILD, 128, 1, 1 << 20, NULL, "index=faiss-hnsw: search beam width"},
    {NULL},
};

void kv_racc_vote(const float *qw, int G, int nw, const float *K, int D, const int32_t *cand, int nc, float scale,
                  double *vote, float *scratch) {
    for (int i = 0; i < nc; i++) vote[i] = 0;
    for (int h = 0; h < G; h++)
        for (int w = 0; w < nw; w++) {
            const float *q = qw + ((size_t)h * nw + w) * D;
            float m = -INFINITY;
            for (int i = 0; i < nc; i++) {
                scratch[i] = scale * kv_dot_ref(q, K + (size_t)cand[i] * D, D);
                m = scratch[i] > m ? scratch[i] : m;
            }
            double z = 0;
            for (int i = 0; i < nc; i++) z += exp((double)scratch[i] - m);
            for (int i = 0; i < nc; i++) vote[i] += exp((double)scratch[i] - m) / z;
        }
}

static void racc_free(racc_state *s) {
    if (!s) return;
    free(s->K); free(s->Qw); free(s->q_prev); free(s->evicted); free(s->n_evicted); free(s->res); free(s->n_res);
    free(s->cand); free(s->vote); free(s->fs); free(s->qw); free(s->top); free(s->qm); free(s->kept); free(s->fv);
    free(s->vall); free(s->qwall); free(s->rr); free(s->newev);
    if (s->gpu) kv_racc_cuda.destroy(s->gpu);
    kv_racc_index_destroy(s->ix);
    free(s);
}

static kv_status racc_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    racc_state *s = kv_calloc(1, sizeof *s, "racc state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->alpha = kv_param(ps, "alpha");
    s->beta = kv_param(ps, "beta");
    s->Ln = kv_param_int(ps, "Ln");
    s->window = kv_param_int(ps, "window");
    size_t T = (size_t)sh->max_tokens, D = (size_t)sh->head_dim, Hkv = (size_t)sh->num_kv_heads,
           Hq = (size_t)sh->num_q_heads, W = (size_t)s->window, G = (size_t)sh->group;
    const int idxk = kv_param_int(ps, "index"), host_keys = !sh->use_gpu || idxk != KV_RACC_EXACT;
    if (host_keys) s->K = kv_malloc(Hkv * T * D * sizeof(float), "racc keys");
    s->Qw = kv_calloc(Hq * W * D, sizeof(float), "racc window queries");
    s->q_prev = kv_malloc(Hq * D * sizeof(float), "racc previous query");
    s->evicted = kv_calloc(Hkv * T, 1, "racc eviction flags");
    s->n_evicted = kv_calloc(Hkv, sizeof(int), "racc eviction counts");
    s->res = kv_malloc(Hkv * T * sizeof(int32_t), "racc resident positions");
    s->n_res = kv_calloc(Hkv, sizeof(int), "racc resident counts");
    s->cand = kv_malloc(T * sizeof(int32_t), "racc candidates");
    s->vote = kv_malloc(T * sizeof(double), "racc votes");
    s->fs = kv_malloc(T * sizeof(float), "racc scores");
    s->qw = kv_malloc(G * W * D * sizeof(float), "racc vote queries");
    s->top = kv_malloc((sh->use_gpu ? Hkv : 1) * T * sizeof(int32_t), "racc top-k");
    s->qm = kv_malloc(Hkv * D * sizeof(float), "racc mean query");
    s->kept = kv_malloc(T, "racc kept flags");
    s->fv = kv_malloc(T * sizeof(float), "racc float votes");
    if ((host_keys && !s->K) || !s->Qw || !s->q_prev || !s->evicted ||
        !s->n_evicted || !s->res || !s->n_res || !s->cand || !s->vote || !s->fs || !s->qw || !s->top || !s->qm ||
        !s->kept || !s->fv) {
        racc_free(s);
        return KV_ERR_NOMEM;
    }
    if (idxk != KV_RACC_EXACT) {
        kv_status st = kv_racc_index_create(idxk, sh->num_kv_heads, sh->head_dim, sh->max_tokens,
                                            kv_param_int(ps, "nlist"), kv_param_int(ps, "nprobe"),
                                            kv_param_int(ps, "hnsw_M"), kv_param_int(ps, "efSearch"), &s->ix);
        if (st == KV_OK && !(s->newev = kv_malloc(T * sizeof(int32_t), "racc evicted positions"))) st = KV_ERR_NOMEM;
        if (st != KV_OK) { racc_free(s); return st; }
    }
    if (sh->use_gpu) { /* keys, vote and retrieval on the device (kernels/racc.cu) */
        kv_status st = kv_gpu_table(&kv_racc_cuda);
        s->vall = kv_malloc(Hkv * T * sizeof(float), "racc device votes");
        s->qwall = kv_malloc(Hq * W * D * sizeof(float), "racc window queries (device order)");
        s->rr = kv_malloc(Hkv * sizeof(int), "racc retrieval counts");
        if (st == KV_OK && (!s->vall || !s->qwall || !s->rr)) st = KV_ERR_NOMEM;
        if (st == KV_OK)
            st = kv_racc_cuda.create(sh->num_q_heads, sh->num_kv_heads, sh->max_tokens, sh->head_dim, s->window, &s->gpu);
        if (st != KV_OK) { racc_free(s); return st; }
    }
    *out = s;
    return KV_OK;
}

/* Each kv head's resident positions of [sink, n), ascending, from the
 * eviction flags (the header's "resident part"): after each compression. */
static void racc_resident(racc_state *s) {
    const size_t T = (size_t)s->sh.max_tokens;
    for (int g = 0; g < s->sh.num_kv_heads; g++) {
        const uint8_t *ev = s->evicted + (size_t)g * T;
        int32_t *r = s->res + (size_t)g * T;
        int c = 0;
        for (int i = s->sh.sink; i < s->n; i++)
            if (!ev[i]) r[c++] = i;
        s->n_res[g] = c;
    }
}

/* One compression over positions [0, n): per kv head, vote on the resident
 * tokens of [sink, n - window) and evict all but floor(alpha * |V|): the
 * votes, as float, ranked by kv_topk_ref (larger first, earlier position
 * among equals: the order the shared GPU top-k reproduces too). */
static kv_status racc_evict(racc_state *s) {
    const kv_shape *sh = &s->sh;
    int n = s->n, W = s->window, D = sh->head_dim, G = sh->group, T = sh->max_tokens, lo = sh->sink, hi = n - W;
    s->compressions++;
    if (s->nq < W || hi <= lo) return KV_OK; /* no full observation window, or nothing older to vote on */
    if (s->gpu) { /* every head's window queries in position order, one vote launch for all kv heads */
        for (int h = 0; h < sh->num_q_heads; h++)
            for (int w = 0; w < W; w++)
                memcpy(s->qwall + ((size_t)h * W + w) * D, s->Qw + (((size_t)h * W) + (hi + w) % W) * D,
                       (size_t)D * sizeof(float));
        KV_TRY(kv_racc_cuda.vote(s->gpu, s->qwall, sh->softmax_scale, lo, hi, s->vall));
    }
    for (int g = 0; g < sh->num_kv_heads; g++) {
        uint8_t *ev = s->evicted + (size_t)g * T;
        int nc = 0;
        for (int i = lo; i < hi; i++)
            if (!ev[i]) s->cand[nc++] = i;
        int keep = (int)floor(s->alpha * nc);
        if (keep >= nc) continue;
        if (s->gpu)
            for (int i = 0; i < nc; i++) s->fv[i] = s->vall[(size_t)g * (hi - lo) + s->cand[i] - lo];
        else {
            for (int h = 0; h < G; h++) /* the window queries of this kv head in position order */
                    for (int w = 0; w < W; w++)
                        memcpy(s->qw + ((size_t)h * W + w) * D, s->Qw + (((size_t)(g * G + h) * W) + (hi + w) % W) * D,
                               (size_t)D * sizeof(float));
            kv_racc_vote(s->qw, G, W, s->K + (size_t)g * T * D, D, s->cand, nc, sh->softmax_scale, s->vote, s->fs);
            for (int i = 0; i < nc; i++) s->fv[i] = (float)s->vote[i];
        }
        int np = kv_topk_ref(s->fv, nc, keep, 0, s->top, NULL);
        if (np < 0) return kv_fail(KV_ERR_NOMEM, "racc: out of host memory for the compression top-k");
        memset(s->kept, 0, (size_t)nc);
        for (int j = 0; j < np; j++) s->kept[s->top[j]] = 1;
        int ne = 0;
        for (int i = 0; i < nc; i++)
            if (!s->kept[i]) {
                ev[s->cand[i]] = 1;
                s->n_evicted[g]++;
                if (s->ix) s->newev[ne++] = s->cand[i];
            }
        if (s->ix) KV_TRY(kv_racc_index_add(s->ix, g, s->K + (size_t)g * T * D, s->newev, ne));
    }
    return s->gpu ? kv_racc_cuda.set_evicted(s->gpu, n, s->evicted) : KV_OK;
}

static kv_status racc_compress(racc_state *s) {
    kv_status st = racc_evict(s);
    racc_resident(s);
    return st;
}

static void racc_push_query(racc_state *s, int t, const float *q, size_t head_stride) {
    size_t D = (size_t)s->sh.head_dim, W = (size_t)s->window;
    for (int h = 0; h < s->sh.num_q_heads; h++) {
        if (t >= 1) memcpy(s->q_prev + h * D, s->Qw + ((size_t)h * W + (size_t)(t - 1) % W) * D, D * sizeof(float));
        memcpy(s->Qw + ((size_t)h * W + (size_t)t % W) * D, q + h * head_stride, D * sizeof(float));
    }
}

static kv_status racc_build(void *st, const kv_prefill *pre) {
    racc_state *s = st;
    size_t D = (size_t)s->sh.head_dim, T = (size_t)s->sh.max_tokens;
    for (int g = 0; s->K && g < s->sh.num_kv_heads; g++)
        memcpy(s->K + (size_t)g * T * D, pre->k + (size_t)g * pre->n * D, (size_t)pre->n * D * sizeof(float));
    int W = s->window, t0 = pre->n - W > 0 ? pre->n - W : 0;
    if (pre->q) {
        for (int t = t0; t < pre->n; t++) racc_push_query(s, t, pre->q + (size_t)t * D, (size_t)pre->n * D);
        s->nq = pre->n - t0;
    }
    s->n = pre->n;
    if (s->gpu) KV_TRY(kv_racc_cuda.write_keys(s->gpu, 0, pre->n, pre->k));
    return racc_compress(s);
}

static kv_status racc_append(void *st, int t, const float *k, const float *v, const float *q) {
    racc_state *s = st;
    (void)v;
    size_t D = (size_t)s->sh.head_dim, T = (size_t)s->sh.max_tokens;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "racc: append of position %d, expected %d", t, s->n);
    for (int g = 0; s->K && g < s->sh.num_kv_heads; g++)
        memcpy(s->K + ((size_t)g * T + t) * D, k + g * D, D * sizeof(float));
    for (int g = 0; t >= s->sh.sink && g < s->sh.num_kv_heads; g++) s->res[(size_t)g * T + s->n_res[g]++] = t;
    if (q) { racc_push_query(s, t, q, D); s->nq++; }
    else s->nq = 0;
    if (s->gpu) KV_TRY(kv_racc_cuda.write_keys(s->gpu, t, 1, k));
    s->n++;
    int gen = s->n - s->sh.prefill_len;
    return gen > 0 && gen % s->Ln == 0 ? racc_compress(s) : KV_OK;
}

/* The resident positions of kv head g below hi (res is ascending). */
static int racc_resident_below(const racc_state *s, int g, int hi) {
    const int32_t *rg = s->res + (size_t)g * s->sh.max_tokens;
    int c = 0, e = s->n_res[g];
    while (c < e) {
        int mid = c + (e - c) / 2;
        if (rg[mid] < hi) c = mid + 1;
        else e = mid;
    }
    return c;
}

/* Each list's resident part of the region [sink, hi) and the method metric. */
static void racc_resident_part(racc_state *s, int hi, kv_selection *sel) {
    const kv_shape *sh = &s->sh;
    double res = 0;
    for (int g = 0; g < sh->num_kv_heads; g++) {
        int c = racc_resident_below(s, g, hi);
        memcpy(sel->idx + (size_t)g * sel->cap, s->res + (size_t)g * sh->max_tokens, (size_t)c * sizeof(int32_t));
        sel->count[g] = c;
        res += (double)c / (hi - sh->sink);
    }
    sel->metric = (float)(res / sh->num_kv_heads);
}

/* The retrieval query of each kv head: the mean of its group's queries of position t-1. */
static void racc_mean_queries(racc_state *s) {
    int D = s->sh.head_dim, G = s->sh.group;
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        for (int j = 0; j < D; j++) {
            float a = 0;
            for (int h = g * G; h < (g + 1) * G; h++) a += s->q_prev[(size_t)h * D + j];
            s->qm[(size_t)g * D + j] = a / G;
        }
}

/* The CPU path and index=faiss-*: the resident part, then the retrieval on the host. */
static kv_status racc_search_host(racc_state *s, int t, kv_selection *sel) {
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, T = sh->max_tokens, lo = sh->sink, hi = t + 1 - sh->local;
    if (hi <= lo) return KV_OK;
    int r = (int)ceil(s->beta * (double)(t + 1)), have_prev = s->nq >= 2;
    racc_resident_part(s, hi, sel);
    racc_mean_queries(s);
    if (r <= 0 || !have_prev) return KV_OK;
    if (s->ix) { /* Faiss over the evicted keys; evicted keys at or past hi (local window) over-fetched, dropped */
        for (int g = 0; g < sh->num_kv_heads; g++) {
            const uint8_t *ev = s->evicted + (size_t)g * T;
            int past = 0;
            for (int i = hi; i < s->n; i++) past += ev[i];
            int got = kv_racc_index_search(s->ix, g, s->qm + (size_t)g * D, r + past, s->top);
            if (got < 0) return KV_ERR_INTERNAL;
            int32_t *out = sel->idx + (size_t)g * sel->cap;
            for (int j = 0, c = 0; j < got && c < r; j++)
                if (s->top[j] >= lo && s->top[j] < hi) { out[sel->count[g]++] = s->top[j]; c++; }
        }
        return KV_OK;
    }
    for (int g = 0; g < sh->num_kv_heads; g++) { /* exact MIPS over the evicted keys of the region */
        const uint8_t *ev = s->evicted + (size_t)g * T;
        const float *Kg = s->K + (size_t)g * T * D;
        int nc = 0;
        for (int i = lo; i < hi; i++)
            if (ev[i]) s->cand[nc++] = i;
        if (!nc) continue;
        for (int i = 0; i < nc; i++)
            s->fs[i] = sh->softmax_scale * kv_dot_ref(s->qm + (size_t)g * D, Kg + (size_t)s->cand[i] * D, D);
        int nr = kv_topk_ref(s->fs, nc, r, 0, s->top, NULL);
        if (nr < 0) return kv_fail(KV_ERR_NOMEM, "racc: out of host memory for top-k scratch");
        int32_t *out = sel->idx + (size_t)g * sel->cap;
        for (int j = 0; j < nr; j++) out[sel->count[g]++] = s->cand[s->top[j]];
    }
    return KV_OK;
}

/* The GPU path with index=exact in halves (kv_method.search_launch): the launch queues the retrieval (scores
 * over the region masked to the evicted keys, the shared top-k), the finish copies the resident part while it
 * runs, then waits and appends the retrieved keys. With index=faiss-* the finish does the whole search. */
static kv_status racc_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    racc_state *s = st;
    const kv_shape *sh = &s->sh;
    (void)q; (void)k; (void)sel;
    int lo = sh->sink, hi = t + 1 - sh->local, any = 0;
    s->queued = 0;
    int r = (int)ceil(s->beta * (double)(t + 1));
    if (s->ix || hi <= lo || r <= 0 || s->nq < 2) return KV_OK;
    for (int g = 0; g < sh->num_kv_heads; g++) {
        int ne = (hi - lo) - racc_resident_below(s, g, hi);
        s->rr[g] = r < ne ? r : ne;
        any |= s->rr[g] > 0;
    }
    if (!any) return KV_OK;
    racc_mean_queries(s);
    KV_TRY(kv_racc_cuda.retrieve_launch(s->gpu, s->qm, sh->softmax_scale, lo, hi, s->rr, mark));
    s->queued = 1;
    return KV_OK;
}

static kv_status racc_finish(void *st, int t, int k, kv_selection *sel) {
    racc_state *s = st;
    (void)k;
    int hi = t + 1 - s->sh.local;
    if (s->ix) return racc_search_host(s, t, sel);
    if (hi <= s->sh.sink) return KV_OK;
    racc_resident_part(s, hi, sel);
    if (!s->queued) return KV_OK;
    s->queued = 0;
    int ld = 0;
    for (int g = 0; g < s->sh.num_kv_heads; g++) ld = s->rr[g] > ld ? s->rr[g] : ld;
    KV_TRY(kv_racc_cuda.retrieve_fetch(s->gpu, s->top, ld));
    for (int g = 0; g < s->sh.num_kv_heads; g++) {
        int32_t *out = sel->idx + (size_t)g * sel->cap;
        for (int j = 0; j < s->rr[g]; j++) out[sel->count[g]++] = s->top[(size_t)g * ld + j];
    }
    return KV_OK;
}

static kv_status racc_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    racc_state *s = st;
    if (!s->gpu) return racc_search_host(s, t, sel);
    KV_TRY(racc_launch(s, t, q, k, sel, NULL));
    return racc_finish(s, t, k, sel);
}

/* kvbench bench on a GPU: one compression vote and one lag-1 retrieval. */
static kv_status racc_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                                const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out) {
    (void)sh; (void)V;
    KV_TRY(kv_gpu_table(&kv_racc_cuda));
    return kv_racc_cuda.bench(spec, kv_param_int(ps, "window"), kv_param(ps, "beta"), K, q, out);
}

static size_t racc_memory(const void *st) {
    /* the retrieval index: the evicted keys (exact index: the keys themselves) */
    const racc_state *s = st;
    if (s->ix) return kv_racc_index_bytes(s->ix);
    size_t n = 0;
    for (int g = 0; g < s->sh.num_kv_heads; g++) n += (size_t)s->n_evicted[g];
    return n * (size_t)s->sh.head_dim * sizeof(float);
}

static void racc_destroy(void *st) { racc_free(st); }

void kv_racc_view_of(const void *st, kv_racc_view *out) {
    const racc_state *s = st;
    int res = 0;
    for (int i = s->sh.sink; i < s->n; i++) res += !s->evicted[i];
    *out = (kv_racc_view){.n_resident = res, .n_evicted = s->n_evicted[0], .compressions = s->compressions};
}

const kv_method kv_method_racc = {
    .abi = KV_RETRIEVER_ABI,
    .name = "racc",
    .summary = "resident set by SnapKV voting, recompressed every Ln tokens keeping alpha; plus lag-1 retrieval (exact or Faiss) "
               "of beta*(t+1) evicted keys; variable budget",
    .paper = "\"RACC: Retrieval-Augmented KV Cache Compression in Long-Context Generation\", anonymous, under double-blind review, sec. 4 and appendices B-C; no public code",
    .per_kv_head = 1,
    .variable_budget = 1,
    .has_gpu = 1,
    .params = racc_params,
    .create = racc_create,
    .build = racc_build,
    .prefill_reads = KV_PREFILL_K | KV_PREFILL_Q, /* build() reads pre->k and pre->q only */
    .append = racc_append,
    .search = racc_search,
    .search_launch = racc_launch,
    .search_finish = racc_finish,
    .memory_bytes = racc_memory,
    .destroy = racc_destroy,
    .bench_gpu = racc_bench_gpu,
    .metric_name = "resident_fraction",
};
