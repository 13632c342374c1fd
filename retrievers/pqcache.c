/* pqcache.c: PQCache (Zhang et al., "PQCache: Product Quantization-based
 * KVCache for Long Context LLM Inference", SIGMOD 2025; code
 * github HugoZHL/PQCache, vq_method/retrieval_based/pq_search.py), CPU
 * reference.
 *
 * Index. Per kv head, every key is cut into M sub-vectors of D/M dims; per
 * (kv head, sub-vector) a codebook of C = 2^b centroids is learned by
 * Lloyd's k-means on the prefill keys, and each key is stored as M one-byte
 * codes (nearest centroid in squared L2, the released code's default
 * "euc" metric).
 * Search (ADC). Per query head, a lookup table <q_m, centroid> (M x C
 * inner products); a key's approximate score is the sum of its M entries.
 * As in the released decoding_attn_GQA_euc: softmax(score * softmax_scale)
 * per query head over the retrievable region, summed over the G query heads
 * of the group, top-k per kv head (one list shared by the group).
 *
 * What the released code does and what is chosen here:
 * - Defaults M = 2, b = 6 (their SUBVEC / SUBBITS defaults). k-means: they
 *   use a multi-process sklearn-style KMeans with 3-9 iterations (chosen to
 *   overlap prefill); here Lloyd with `iters` (default 10) rounds from C
 *   distinct prefill keys sampled by a seeded generator (per kv head and
 *   sub-vector), deterministic; an empty cluster keeps its previous centroid
 *   (sklearn would relocate it; with C = 64 and thousands of keys empty
 *   clusters are rare). Fewer indexed prefill keys than C: key i % n seeds
 *   centroid i (duplicates then stay empty, harmless). No indexed prefill
 *   key at all (P <= sink): the centroids stay zero (every score ties, the
 *   earliest tokens win) until a recluster, which then starts cold.
 * - Indexed tokens: every position in [sink, t] as it arrives (the sink is
 *   never compressed, as in theirs); selections are filtered to the
 *   protocol's region [sink, t+1-local). They encode a token when it leaves
 *   their recent window; with fixed centroids encoding it on arrival gives
 *   the same code, so the region is always fully indexed and no update
 *   buffer (extra indices) is needed.
 * - Decode-time keys are encoded with the prefill centroids, never
 *   re-clustered (the drift other methods target). `recluster=N` (not in
 *   the paper) re-runs k-means on all indexed keys every N appended keys,
 *   warm-started from the current centroids (continuity, and `iters` rounds
 *   suffice from there), then re-encodes every key; it keeps a copy of the
 *   keys to do so, counted in memory_bytes.
 * - Their budget splits a compress ratio between a recent window and top-k;
 *   here the protocol's sink, local window and k apply to every method.
 * - memory_bytes: codes (one byte per sub-vector per key, as stored; b bits
 *   would pack tighter) + centroids (float32), plus the key copy when
 *   reclustering. Scores and softmax accumulate in float.
 * - GPU path (shape->use_gpu, kernels/pqcache.cu): codes and centroids live
 *   on the device (host mirrors kept for the view); k-means from the same
 *   seeded picks, appended keys encoded there, search = LUT, ADC scan with
 *   the group softmax sum, top-k (with C^M <= 4096, the default, found on
 *   the code tuples: a threshold from the tuple histogram, then an ordered
 *   compaction, no per-key scores), indices copied back; the selection is
 *   kv_topk_ref's over the same sums, ties included. Its k-means
 *   assigns through a GEMM (||c||^2 - 2<x, c>), so a key almost equidistant
 *   from two centroids may take the other one than on the CPU (see
 *   pqcache.cu); recluster=N runs k-means on the CPU and uploads the result. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/pqcache.h"
#include "../kernels/ops/topk.h"
#include "baselines.h"

typedef struct {
    kv_shape sh;
    int M, b, C, dsub, iters, recluster;
    uint64_t seed;
    int n;            /* positions seen: 0..n-1 */
    int since;        /* keys appended since the last clustering */
    int clustered;    /* the centroids come from at least one key */
    float *cent;      /* [Hkv][M][dsub][C] */
    uint8_t *codes;   /* [Hkv][T][M]; rows below sink unused */
    float *keys;      /* [Hkv][T][D], only with recluster > 0 */
    float *lut;       /* [Hq][M][C] scratch */
    float *score;     /* [Hq][T] scratch: ADC scores of the region */
    float *agg;       /* [Hkv][T] scratch: softmax summed over the group */
    kv_pq_gpu *gpu;   /* the device path (use_gpu); cent and codes above mirror it */
} pq_state;

static const kv_param_spec pq_params[] = {
    {"M", KV_PARAM_INT, KV_PARAM_BUILD, 2, 1, 1024, NULL, "sub-vectors per key (must divide head_dim)"},
    {"b", KV_PARAM_INT, KV_PARAM_BUILD, 6, 1, 8, NULL, "bits per sub-vector code: 2^b centroids"},
    {"iters", KV_PARAM_INT, KV_PARAM_BUILD, 10, 0, 1000, NULL, "Lloyd iterations of k-means"},
    {"recluster", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 1e9, NULL,
     "re-run k-means on all indexed keys every N appended keys (0: never, as in the paper)"},
    {"seed", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 2147483647, NULL, "seed of the k-means init (added to --seed)"},
    {NULL},
};

/* ---- numerical pieces (baselines.h) ---- */

void kv_pq_assign(const float *x, int n, int ld, int d, const float *cent, int C, uint8_t *codes, int code_ld) {
    float dist[256];
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ld;
        for (int c = 0; c < C; c++) dist[c] = 0.f;
        for (int j = 0; j < d; j++) {
            const float *cj = cent + (size_t)j * C, xj = xi[j];
            for (int c = 0; c < C; c++) {
                float e = xj - cj[c];
                dist[c] += e * e;
            }
        }
        int best = 0;
        for (int c = 1; c < C; c++)
            if (dist[c] < dist[best]) best = c;
        codes[(size_t)i * code_ld] = (uint8_t)best;
    }
}

void kv_pq_init_picks(int n, int C, uint64_t seed, int32_t *pick) {
    int np = 0;
    if (n >= C) { /* Floyd: C distinct indices of [0, n) */
        kv_rng r;
        kv_rng_seed(&r, seed);
        for (int j = n - C; j < n; j++) {
            int v = (int)(kv_rng_uniform(&r) * (j + 1)), dup = 0;
            for (int a = 0; a < np; a++) dup |= pick[a] == v;
            pick[np++] = dup ? j : v;
        }
    } else
        for (int c = 0; c < C; c++) pick[np++] = c % n;
}

kv_status kv_pq_kmeans(const float *x, int n, int ld, int d, int C, int iters, uint64_t seed, int warm, float *cent,
                       uint8_t *codes, int code_ld) {
    if (!warm) memset(cent, 0, (size_t)d * C * sizeof(float));
    if (n <= 0) return KV_OK;
    if (!warm) {
        int32_t pick[256];
        kv_pq_init_picks(n, C, seed, pick);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < d; j++) cent[(size_t)j * C + c] = x[(size_t)pick[c] * ld + j];
    }
    double *sum = kv_malloc((size_t)C * d * sizeof(double), "k-means sums");
    int *cnt = kv_malloc((size_t)C * sizeof(int), "k-means counts");
    if (!sum || !cnt) { free(sum); free(cnt); return KV_ERR_NOMEM; }
    for (int it = 0; it < iters; it++) {
        kv_pq_assign(x, n, ld, d, cent, C, codes, code_ld);
        memset(sum, 0, (size_t)C * d * sizeof(double));
        memset(cnt, 0, (size_t)C * sizeof(int));
        for (int i = 0; i < n; i++) {
            int c = codes[(size_t)i * code_ld];
            const float *xi = x + (size_t)i * ld;
            double *s = sum + (size_t)c * d;
            for (int j = 0; j < d; j++) s[j] += xi[j];
            cnt[c]++;
        }
        for (int c = 0; c < C; c++)
            if (cnt[c])
                for (int j = 0; j < d; j++) cent[(size_t)j * C + c] = (float)(sum[(size_t)c * d + j] / cnt[c]);
    }
    kv_pq_assign(x, n, ld, d, cent, C, codes, code_ld);
    free(sum);
    free(cnt);
    return KV_OK;
}

void kv_pq_lut(const float *q, const float *cent, int M, int C, int dsub, float *lut) {
    for (int m = 0; m < M; m++) {
        float *l = lut + (size_t)m * C;
        const float *qm = q + (size_t)m * dsub, *cm = cent + (size_t)m * dsub * C;
        for (int c = 0; c < C; c++) l[c] = 0.f;
        for (int j = 0; j < dsub; j++)
            for (int c = 0; c < C; c++) l[c] += qm[j] * cm[(size_t)j * C + c];
    }
}

void kv_pq_adc(const float *lut, const uint8_t *codes, int code_ld, int n, int M, int C, float *out) {
    for (int i = 0; i < n; i++) {
        const uint8_t *ci = codes + (size_t)i * code_ld;
        float s = 0.f;
        for (int m = 0; m < M; m++) s += lut[(size_t)m * C + ci[m]];
        out[i] = s;
    }
}

/* ---- the retriever ---- */

static void pq_free(pq_state *s) {
    if (!s) return;
    if (s->gpu) kv_pqcache_cuda.destroy(s->gpu);
    free(s->cent); free(s->codes); free(s->keys); free(s->lut); free(s->score); free(s->agg);
    free(s);
}

static kv_status pq_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    int M = kv_param_int(ps, "M"), b = kv_param_int(ps, "b"), D = sh->head_dim;
    if (D % M)
        return kv_fail(KV_ERR_INPUT, "--param M for method pqcache: M=%d must divide head_dim %d", M, D);
    pq_state *s = kv_calloc(1, sizeof *s, "pqcache state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->M = M; s->b = b; s->C = 1 << b; s->dsub = D / M;
    s->iters = kv_param_int(ps, "iters");
    s->recluster = kv_param_int(ps, "recluster");
    s->seed = sh->seed + (uint64_t)kv_param_int(ps, "seed");
    size_t Hkv = (size_t)sh->num_kv_heads, Hq = (size_t)sh->num_q_heads, T = (size_t)sh->max_tokens;
    s->cent = kv_calloc(Hkv * D * s->C, sizeof(float), "pqcache centroids"); /* M * dsub = D */
    s->codes = kv_calloc(Hkv * T * M, 1, "pqcache codes");
    if (!sh->use_gpu) { /* the GPU path scores on the device */
        s->lut = kv_malloc(Hq * M * s->C * sizeof(float), "pqcache lookup tables");
        s->score = kv_malloc(Hq * T * sizeof(float), "pqcache scores");
        s->agg = kv_malloc(Hkv * T * sizeof(float), "pqcache group scores");
    }
    if (s->recluster) s->keys = kv_malloc(Hkv * T * D * sizeof(float), "pqcache key copy");
    if (!s->cent || !s->codes || (!sh->use_gpu && (!s->lut || !s->score || !s->agg)) || (s->recluster && !s->keys)) {
        pq_free(s);
        return KV_ERR_NOMEM;
    }
    if (sh->use_gpu) {
        kv_status st = kv_gpu_table(&kv_pqcache_cuda);
        if (st == KV_OK) st = kv_pqcache_cuda.create(sh->num_q_heads, sh->num_kv_heads, sh->max_tokens, D, M, s->C, &s->gpu);
        if (st != KV_OK) { pq_free(s); return st; }
    }
    *out = s;
    return KV_OK;
}

static uint64_t pq_job_seed(const pq_state *s, int g, int m) {
    return s->seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)g << 32) ^ (uint64_t)(m + 1) * 0xbf58476d1ce4e5b9ULL;
}

/* k-means of every (kv head, sub-vector) on keys [sink, n) held in
 * keys[g*kstride + i*D] (i a position), codes re-assigned for all of them. */
static kv_status pq_cluster(pq_state *s, const float *keys, size_t kstride, int n, int warm) {
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, lo = sh->sink, M = s->M, C = s->C, ds = s->dsub, T = sh->max_tokens;
    int cnt = n - lo, jobs = sh->num_kv_heads * M, failed = 0;
    if (cnt <= 0) return KV_OK;
    warm &= s->clustered; /* never warm-start from the zero centroids of an empty prefill */
    s->clustered = 1;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int job = 0; job < jobs; job++) {
        int g = job / M, m = job % M;
        uint64_t seed = pq_job_seed(s, g, m);
        kv_status st = kv_pq_kmeans(keys + g * kstride + (size_t)lo * D + (size_t)m * ds, cnt, D, ds, C, s->iters, seed,
                                    warm, s->cent + ((size_t)g * M + m) * ds * C,
                                    s->codes + ((size_t)g * T + lo) * M + m, M);
        failed |= st != KV_OK;
    }
    if (failed) return kv_fail(KV_ERR_NOMEM, "pqcache: out of host memory for k-means");
    return s->gpu ? kv_pqcache_cuda.upload(s->gpu, s->cent, s->codes, lo, n) : KV_OK; /* recluster on the GPU path */
}

/* The GPU build: k-means of the prefill keys on the device, from the CPU's
 * picks; the keys in either form (the float16 form widened a chunk at a time
 * on its way to the device, kernels/pqcache_kmeans.cu). */
static kv_status pq_build_gpu(pq_state *s, const kv_host_rows *k, int n) {
    const kv_shape *sh = &s->sh;
    int M = s->M, C = s->C, cnt = n - sh->sink;
    if (cnt <= 0) return KV_OK;
    int32_t *picks = kv_malloc((size_t)sh->num_kv_heads * M * C * sizeof(int32_t), "pqcache k-means picks");
    if (!picks) return KV_ERR_NOMEM;
    for (int g = 0; g < sh->num_kv_heads; g++)
        for (int m = 0; m < M; m++) kv_pq_init_picks(cnt, C, pq_job_seed(s, g, m), picks + ((size_t)g * M + m) * C);
    s->clustered = 1;
    kv_status st = kv_pqcache_cuda.build(s->gpu, k, n, sh->sink, s->iters, picks, s->cent, s->codes);
    free(picks);
    return st;
}

static void pq_encode_one(pq_state *s, int g, int t, const float *key) {
    int M = s->M, C = s->C, ds = s->dsub;
    for (int m = 0; m < M; m++)
        kv_pq_assign(key + (size_t)m * ds, 1, ds, ds, s->cent + ((size_t)g * M + m) * ds * C, C,
                     s->codes + ((size_t)g * s->sh.max_tokens + t) * M + m, M);
}

static kv_status pq_build(void *st, const kv_prefill *pre) {
    pq_state *s = st;
    int D = s->sh.head_dim, T = s->sh.max_tokens, Hkv = s->sh.num_kv_heads;
    kv_host_rows x = kv_prefill_keys(pre);
    if (s->keys)
        for (int g = 0; g < Hkv; g++) kv_host_rows_head(&x, g, D, 0, pre->n, s->keys + (size_t)g * T * D);
    s->n = pre->n;
    if (s->gpu) return pq_build_gpu(s, &x, pre->n);
    float *k32;
    const float *k = kv_prefill_k32(pre, Hkv, D, &k32); /* the CPU path: one float32 array */
    kv_status rc = k ? pq_cluster(s, k, (size_t)pre->n * D, pre->n, 0) : KV_ERR_NOMEM;
    free(k32);
    return rc;
}

static kv_status pq_append(void *st, int t, const float *k, const float *v, const float *q) {
    pq_state *s = st;
    (void)v; (void)q;
    int D = s->sh.head_dim, T = s->sh.max_tokens;
    if (t != s->n || t >= T) return kv_fail(KV_ERR_INTERNAL, "pqcache: append of position %d, expected %d", t, s->n);
    for (int g = 0; g < s->sh.num_kv_heads; g++) {
        if (s->keys) memcpy(s->keys + ((size_t)g * T + t) * D, k + (size_t)g * D, (size_t)D * sizeof(float));
        if (t >= s->sh.sink && !s->gpu) pq_encode_one(s, g, t, k + (size_t)g * D);
    }
    if (s->gpu && t >= s->sh.sink) {
        uint8_t c1[4096];
        size_t nc = (size_t)s->sh.num_kv_heads * s->M;
        uint8_t *c = nc <= sizeof c1 ? c1 : kv_malloc(nc, "pqcache appended codes");
        if (!c) return KV_ERR_NOMEM;
        kv_status st = kv_pqcache_cuda.encode(s->gpu, t, k, c);
        for (int g = 0; g < s->sh.num_kv_heads && st == KV_OK; g++)
            memcpy(s->codes + ((size_t)g * T + t) * s->M, c + (size_t)g * s->M, (size_t)s->M);
        if (c != c1) free(c);
        KV_TRY(st);
    }
    s->n++;
    if (s->recluster && ++s->since >= s->recluster) {
        s->since = 0;
        return pq_cluster(s, s->keys, (size_t)T * D, s->n, 1);
    }
    return KV_OK;
}

/* The GPU search in halves (kv_method.search_launch). */
static kv_status pq_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    pq_state *s = st;
    int lo = s->sh.sink, hi = t + 1 - s->sh.local;
    return kv_pqcache_cuda.launch(s->gpu, q, s->sh.softmax_scale, lo, hi, k, sel->idx, sel->cap, mark);
}

static kv_status pq_finish(void *st, int t, int k, kv_selection *sel) {
    pq_state *s = st;
    (void)t; (void)k;
    return kv_pqcache_cuda.fetch(s->gpu, sel->count);
}

static kv_status pq_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    pq_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, T = sh->max_tokens, M = s->M, C = s->C, G = sh->group;
    int lo = sh->sink, hi = t + 1 - sh->local, n = hi - lo;
    if (n <= 0) return KV_OK;
    if (s->gpu) {
        KV_TRY(pq_launch(s, t, q, k, sel, NULL));
        return pq_finish(s, t, k, sel);
    }
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int g = 0; g < sh->num_kv_heads; g++) {
        float *agg = s->agg + (size_t)g * T;
        const uint8_t *codes = s->codes + ((size_t)g * T + lo) * M;
        for (int i = 0; i < n; i++) agg[i] = 0.f;
        for (int h = g * G; h < (g + 1) * G; h++) {
            float *lut = s->lut + (size_t)h * M * C, *sc = s->score + (size_t)h * T;
            kv_pq_lut(q + (size_t)h * D, s->cent + (size_t)g * M * s->dsub * C, M, C, s->dsub, lut);
            kv_pq_adc(lut, codes, M, n, M, C, sc);
            float mx = -INFINITY;
            for (int i = 0; i < n; i++) {
                sc[i] *= sh->softmax_scale;
                if (sc[i] > mx) mx = sc[i];
            }
            double z = 0;
            for (int i = 0; i < n; i++) {
                sc[i] = expf(sc[i] - mx);
                z += sc[i];
            }
            float inv = (float)(1.0 / z);
            for (int i = 0; i < n; i++) agg[i] += sc[i] * inv;
        }
        int c = kv_topk_ref(agg, n, k, lo, sel->idx + (size_t)g * sel->cap, NULL);
        failed |= c < 0;
        sel->count[g] = c < 0 ? 0 : c;
    }
    return failed ? kv_fail(KV_ERR_NOMEM, "pqcache: out of host memory for top-k scratch") : KV_OK;
}

static size_t pq_memory(const void *st) {
    const pq_state *s = st;
    size_t Hkv = (size_t)s->sh.num_kv_heads, idx = s->n > s->sh.sink ? (size_t)(s->n - s->sh.sink) : 0;
    size_t bytes = Hkv * idx * s->M + Hkv * s->M * s->dsub * s->C * sizeof(float);
    if (s->keys) bytes += Hkv * (size_t)s->n * s->sh.head_dim * sizeof(float);
    return bytes;
}

static void pq_destroy(void *st) { pq_free(st); }

/* kvbench bench on a GPU: the build (k-means from the CPU's picks) and one
 * search, stage by stage (kernels/pqcache.cu). */
static kv_status pq_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                              const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q,
                              kv_gpu_stages *out) {
    int M = kv_param_int(ps, "M"), C = 1 << kv_param_int(ps, "b"), n = spec->n;
    if (sh->head_dim % M)
        return kv_fail(KV_ERR_INPUT, "--param M for method pqcache: M=%d must divide head_dim %d", M, sh->head_dim);
    KV_TRY(kv_gpu_table(&kv_pqcache_cuda));
    pq_state tmp = {.sh = *sh, .seed = sh->seed + (uint64_t)kv_param_int(ps, "seed")};
    int32_t *picks = kv_malloc((size_t)sh->num_kv_heads * M * C * sizeof(int32_t), "pqcache k-means picks");
    if (!picks) return KV_ERR_NOMEM;
    for (int g = 0; g < sh->num_kv_heads; g++)
        for (int m = 0; m < M; m++) kv_pq_init_picks(n, C, pq_job_seed(&tmp, g, m), picks + ((size_t)g * M + m) * C);
    kv_status st = kv_pqcache_cuda.bench(spec, M, C, kv_param_int(ps, "iters"), picks, K, q, out);
    free(picks);
    return st;
}

void kv_pqcache_view(const void *st, kv_pq_view *out) {
    const pq_state *s = st;
    *out = (kv_pq_view){.M = s->M, .C = s->C, .dsub = s->dsub, .n = s->n, .cent = s->cent, .codes = s->codes};
}

const kv_method kv_method_pqcache = {
    .abi = KV_RETRIEVER_ABI,
    .name = "pqcache",
    .summary = "product quantisation (k-means per sub-vector on prefill keys), ADC scores, group softmax sum, top-k",
    .paper = "\"PQCache: Product Quantization-based KVCache for Long Context LLM Inference\", Zhang et al., SIGMOD 2025, "
             "code HugoZHL/PQCache",
    .per_kv_head = 1,
    .has_gpu = 1,
    .params = pq_params,
    .create = pq_create,
    .build = pq_build,
    .prefill_half = 1, /* the GPU path widens a chunk at a time, the CPU path the keys once */
    .append = pq_append,
    .search = pq_search,
    .memory_bytes = pq_memory,
    .destroy = pq_destroy,
    .bench_gpu = pq_bench_gpu,
    .search_launch = pq_launch,
    .search_finish = pq_finish,
};
