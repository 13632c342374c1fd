/* magicpig.c: MagicPIG (Chen et al., "MagicPIG: LSH Sampling for Efficient
 * LLM Generation", ICLR 2025; code github Infini-AI-Lab/MagicPIG), CPU
 * reference.
 *
 * Index. SimHash: one seeded Gaussian projection of K*L columns; a vector's
 * code in table l packs the signs of its projections on columns
 * l*K .. l*K+K-1 (K bits; bit i = column l*K+i, as their
 * sum(hash_code[..., i] * 2^i) packing). Keys are centred by a mean before
 * hashing. Search, per query head: the query is normalised and hashed; a key
 * is a candidate iff its code equals the query's in at least
 * `min_collisions` of the L tables (their lsh.cc marks a key on its first
 * collision and emits it on its second: threshold 2). Every candidate is
 * attended, so the budget is variable (effective budget = mean selected);
 * each carries the released code's importance weight (gather_gemv.cc,
 * batch_transform): with theta the angle between q and the centred key,
 * p = (1 - theta/pi)^K, w = 1 - (1-p)^(L-1) * (L*p + 1 - p), and the
 * attended logit is q.k * scale - log(w + 1e-4) (the log-weight here).
 *
 * What the released code does and what is chosen here:
 * - K = 10, L = 150 (their defaults; 170 in some runs, CTKVR used 9 and 120).
 * - Projection: theirs is torch.randn per kv head, shared by groups of 16
 *   layers; here one projection from a seeded generator, shared by all heads
 *   (and, with the same seed, by all layers): the hash family is the same,
 *   and sharing keeps the index state small and the test simple.
 * - Centre: theirs subtracts the mean of the keys it offloads at prefill (the
 *   keys outside sink and local window), once, and subtracts that same mean
 *   from keys that arrive later. Here: the mean of the prefill keys at
 *   positions [sink, P), fixed at build; every later key is centred by it.
 *   Centring shifts every score of a query by the same q.mean, so softmax is
 *   unchanged; it only changes the angles the hash sees.
 * - Decode keys: theirs keeps generated tokens in a dense GPU buffer, never
 *   hashed; here every key at position >= sink is hashed on arrival, so the
 *   whole region is searchable and no extra indices are reported.
 * - The query is normalised before hashing as in theirs (signs do not
 *   change; it keeps the float path identical). A zero key or query gets
 *   theta = pi/2.
 * - Hashing accumulates each projection in float over the D dims in order;
 *   the weight is evaluated in double.
 * - memory_bytes: hash codes (uint16 per table per key: 2L bytes; K*L bits
 *   would pack tighter), key norms (float32 per key), the projection and the
 *   centres. The centred key copy is the KV cache itself (theirs keeps it in
 *   CPU memory too) and is not counted.
 *
 * GPU path (shape->use_gpu; kernels/magicpig.cu): the centre is computed
 * here as on the CPU, and the centred keys, norms and codes live on the
 * device only; build and append hash on the device (keys uploaded), search
 * runs query hashing, the collision count, compaction and the log-weights
 * there and copies back each head's variable-size list. The kernels sum in
 * the reference's order without FMA, so codes, norms and candidate lists
 * are the CPU's exactly and log-weights agree to float rounding (the
 * double acos/pow/log of CUDA and glibc may differ in their last bits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/magicpig.h"
#include "../kernels/ops/score.h"
#include "baselines.h"

#define KV_PI 3.14159265358979323846

typedef struct {
    kv_shape sh;
    int K, L, KL, minc;
    int n;              /* positions seen */
    float *proj;        /* [D][K*L] */
    float *mean;        /* [Hkv][D] */
    float *ck;          /* [Hkv][T][D] centred keys (positions >= sink) */
    float *knorm;       /* [Hkv][T] */
    uint16_t *codes;    /* [Hkv][L][T] */
    float *acc;         /* [Hq][K*L] scratch (append uses row 0) */
    uint16_t *qcodes;   /* [Hq][L] */
    uint16_t *cnt;      /* [Hq][T] */
    float *qn;          /* [Hq][D] normalised queries */
    kv_mp_gpu *dev;     /* GPU path: the index on the device (ck, knorm, codes, scratch unused on the host) */
} mp_state;

static const kv_param_spec mp_params[] = {
    {"K", KV_PARAM_INT, KV_PARAM_BUILD, 10, 1, 16, NULL, "SimHash bits per table"},
    {"L", KV_PARAM_INT, KV_PARAM_BUILD, 150, 1, 1024, NULL, "hash tables"},
    {"min_collisions", KV_PARAM_INT, KV_PARAM_SEARCH, 2, 1, 1024, NULL,
     "a key is a candidate when it collides with the query in at least this many tables"},
    {"seed", KV_PARAM_INT, KV_PARAM_BUILD, 0, 0, 2147483647, NULL, "seed of the projection (added to --seed)"},
    {NULL},
};

/* ---- numerical pieces (baselines.h) ---- */

void kv_mp_projection(uint64_t seed, int D, int K, int L, float *proj) {
    kv_rng r;
    kv_rng_seed(&r, seed);
    size_t n = (size_t)D * K * L;
    for (size_t i = 0; i < n; i++) proj[i] = (float)kv_rng_normal(&r);
}

KV_CLONES void kv_mp_hash(const float *x, const float *proj, int D, int K, int L, float *acc, uint16_t *codes, int code_stride) {
    int KL = K * L;
    for (int b = 0; b < KL; b++) acc[b] = 0.f;
    for (int j = 0; j < D; j++) {
        const float *row = proj + (size_t)j * KL;
        float xj = x[j];
        for (int b = 0; b < KL; b++) acc[b] += xj * row[b];
    }
    for (int l = 0; l < L; l++) {
        unsigned c = 0;
        for (int i = 0; i < K; i++) c |= (unsigned)(acc[l * K + i] > 0.f) << i;
        codes[(size_t)l * code_stride] = (uint16_t)c;
    }
}

KV_CLONES void kv_mp_collisions(const uint16_t *codes, int ld, int lo, int hi, const uint16_t *qcodes, int L, uint16_t *counts) {
    int n = hi - lo;
    for (int i = 0; i < n; i++) counts[i] = 0;
    for (int l = 0; l < L; l++) {
        const uint16_t *row = codes + (size_t)l * ld + lo, qc = qcodes[l];
        for (int i = 0; i < n; i++) counts[i] += row[i] == qc;
    }
}

float kv_mp_logw(double cos, int K, int L) {
    if (cos > 1) cos = 1;
    if (cos < -1) cos = -1;
    double p = pow(1.0 - acos(cos) / KV_PI, K), q = 1.0 - p;
    double w = 1.0 - pow(q, L - 1) * (L * p + q);
    return (float)-log(w + 1e-4);
}

/* ---- the retriever ---- */

static void mp_free(mp_state *s) {
    if (!s) return;
    free(s->proj); free(s->mean); free(s->ck); free(s->knorm); free(s->codes); free(s->acc); free(s->qcodes);
    free(s->cnt); free(s->qn);
    if (s->dev) kv_magicpig_cuda.destroy(s->dev);
    free(s);
}

static kv_status mp_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    int K = kv_param_int(ps, "K"), L = kv_param_int(ps, "L"), minc = kv_param_int(ps, "min_collisions");
    if (minc > L)
        return kv_fail(KV_ERR_INPUT, "--param min_collisions for method magicpig: %d is above L=%d (no key could qualify)",
                       minc, L);
    mp_state *s = kv_calloc(1, sizeof *s, "magicpig state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->K = K; s->L = L; s->KL = K * L; s->minc = minc;
    size_t Hkv = (size_t)sh->num_kv_heads, Hq = (size_t)sh->num_q_heads, T = (size_t)sh->max_tokens,
           D = (size_t)sh->head_dim;
    s->proj = kv_malloc(D * s->KL * sizeof(float), "magicpig projection");
    s->mean = kv_calloc(Hkv * D, sizeof(float), "magicpig key centres");
    if (sh->use_gpu) { /* the index and all scratch live on the device */
        kv_status st = s->proj && s->mean ? kv_gpu_table(&kv_magicpig_cuda) : KV_ERR_NOMEM;
        if (st == KV_OK) {
            kv_mp_projection(sh->seed + (uint64_t)kv_param_int(ps, "seed"), sh->head_dim, K, L, s->proj);
            st = kv_magicpig_cuda.create(sh->num_q_heads, sh->num_kv_heads, sh->max_tokens, sh->head_dim, K, L, s->proj,
                                         &s->dev);
        }
        if (st != KV_OK) { mp_free(s); return st; }
        *out = s;
        return KV_OK;
    }
    s->ck = kv_malloc(Hkv * T * D * sizeof(float), "magicpig centred keys");
    s->knorm = kv_malloc(Hkv * T * sizeof(float), "magicpig key norms");
    s->codes = kv_calloc(Hkv * L * T, sizeof(uint16_t), "magicpig hash codes");
    s->acc = kv_malloc(Hq * s->KL * sizeof(float), "magicpig projections");
    s->qcodes = kv_malloc(Hq * L * sizeof(uint16_t), "magicpig query codes");
    s->cnt = kv_malloc(Hq * T * sizeof(uint16_t), "magicpig collision counts");
    s->qn = kv_malloc(Hq * D * sizeof(float), "magicpig normalised queries");
    if (!s->proj || !s->mean || !s->ck || !s->knorm || !s->codes || !s->acc || !s->qcodes || !s->cnt || !s->qn) {
        mp_free(s);
        return KV_ERR_NOMEM;
    }
    kv_mp_projection(sh->seed + (uint64_t)kv_param_int(ps, "seed"), sh->head_dim, K, L, s->proj);
    *out = s;
    return KV_OK;
}

/* Centre, measure and hash the keys of positions t .. t+nb-1 (nb <= 4) for
 * kv head g. Four keys share each pass over the projection (it is read
 * from cache once instead of four times); each key's sums keep the order
 * of kv_mp_hash, so the codes are bitwise the same. acc: 4*K*L floats. */
static void mp_index(mp_state *s, int g, int t, int nb, const float *keys, size_t key_stride, float *acc) {
    int D = s->sh.head_dim, T = s->sh.max_tokens, KL = s->KL;
    const float *mu = s->mean + (size_t)g * D;
    float *c[4];
    for (int r = 0; r < nb; r++) {
        c[r] = s->ck + ((size_t)g * T + t + r) * D;
        for (int j = 0; j < D; j++) c[r][j] = keys[r * key_stride + j] - mu[j];
        s->knorm[(size_t)g * T + t + r] = sqrtf(kv_dot_ref(c[r], c[r], D));
    }
    if (nb < 4) {
        for (int r = 0; r < nb; r++)
            kv_mp_hash(c[r], s->proj, D, s->K, s->L, acc, s->codes + (size_t)g * s->L * T + t + r, T);
        return;
    }
    float *a0 = acc, *a1 = acc + KL, *a2 = acc + 2 * KL, *a3 = acc + 3 * KL;
    for (int b = 0; b < 4 * KL; b++) acc[b] = 0.f;
    for (int j = 0; j < D; j++) {
        const float *row = s->proj + (size_t)j * KL;
        float x0 = c[0][j], x1 = c[1][j], x2 = c[2][j], x3 = c[3][j];
        for (int b = 0; b < KL; b++) {
            float p = row[b];
            a0[b] += x0 * p;
            a1[b] += x1 * p;
            a2[b] += x2 * p;
            a3[b] += x3 * p;
        }
    }
    for (int r = 0; r < 4; r++) {
        uint16_t *codes = s->codes + (size_t)g * s->L * T + t + r;
        const float *a = acc + (size_t)r * KL;
        for (int l = 0; l < s->L; l++) {
            unsigned code = 0;
            for (int i = 0; i < s->K; i++) code |= (unsigned)(a[l * s->K + i] > 0.f) << i;
            codes[(size_t)l * T] = (uint16_t)code;
        }
    }
}

/* Builds from either form of the prefill: the CPU path reads one float32
 * array (the float16 form widened once), the GPU path widens the float16
 * form KV_HOST_ROWS_CHUNK positions at a time, once for the mean and once for the
 * index (issue 12, goal 3: no float32 copy of the layer on the host). The
 * mean's sums run in the same order either way. */
static kv_status mp_build(void *st, const kv_prefill *pre) {
    mp_state *s = st;
    int D = s->sh.head_dim, lo = s->sh.sink, n = pre->n, Hkv = s->sh.num_kv_heads;
    kv_host_rows x = kv_prefill_keys(pre);
    float *k32 = NULL;
    if (!s->dev && x.f16) {
        if (!kv_prefill_k32(pre, Hkv, D, &k32)) return KV_ERR_NOMEM;
        x = (kv_host_rows){k32, NULL, n};
    }
    double *acc = kv_calloc((size_t)Hkv * D + 1, sizeof(double), "magicpig mean");
    kv_rows_walk w = {0};
    kv_status rc = acc ? kv_rows_walk_start(&w, &x, Hkv, D, lo, n, "magicpig prefill chunk") : KV_ERR_NOMEM;
    const float *src;
    int a, c;
    size_t hs;
    while (rc == KV_OK && (src = kv_rows_walk_next(&w, &a, &c, &hs)))
        for (int g = 0; g < Hkv; g++)
            for (int i = 0; i < c; i++)
                for (int j = 0; j < D; j++) acc[(size_t)g * D + j] += src[g * hs + (size_t)i * D + j];
    for (size_t e = 0; n > lo && rc == KV_OK && e < (size_t)Hkv * D; e++) s->mean[e] = (float)(acc[e] / (n - lo));
    free(acc);
    int cnt = n > lo ? n - lo : 0, blocks = (cnt + 3) / 4, failed = 0;
    if (s->dev && rc == KV_OK) {
        rc = kv_magicpig_cuda.set_mean(s->dev, s->mean);
        w.at = lo; /* the same rows again, for the index */
        while (rc == KV_OK && (src = kv_rows_walk_next(&w, &a, &c, &hs)))
            rc = kv_magicpig_cuda.index(s->dev, a, c, src, (int)(hs / D));
    }
    kv_rows_walk_end(&w);
    if (s->dev || rc != KV_OK) {
        free(k32);
        s->n = n;
        return rc;
    }
    long total = (long)Hkv * blocks;
#pragma omp parallel reduction(| : failed)
    {
        float *pacc = kv_malloc((size_t)4 * s->KL * sizeof(float), "magicpig projections");
        failed |= !pacc;
#pragma omp for schedule(static)
        for (long w = 0; w < total; w++) {
            if (!pacc) continue;
            int g = (int)(w / blocks), t = lo + 4 * (int)(w % blocks), nb = n - t < 4 ? n - t : 4;
            mp_index(s, g, t, nb, x.f32 + ((size_t)g * n + t) * D, (size_t)D, pacc);
        }
        free(pacc);
    }
    free(k32);
    s->n = n;
    return failed ? kv_fail(KV_ERR_NOMEM, "magicpig: out of host memory for hashing") : KV_OK;
}

static kv_status mp_append(void *st, int t, const float *k, const float *v, const float *q) {
    mp_state *s = st;
    (void)v; (void)q;
    if (t != s->n || t >= s->sh.max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "magicpig: append of position %d, expected %d", t, s->n);
    if (t >= s->sh.sink && s->dev) KV_TRY(kv_magicpig_cuda.index(s->dev, t, 1, k, 1));
    else if (t >= s->sh.sink)
        for (int g = 0; g < s->sh.num_kv_heads; g++) mp_index(s, g, t, 1, k + (size_t)g * s->sh.head_dim, 0, s->acc);
    s->n++;
    return KV_OK;
}

/* The GPU search in halves (kv_method.search_launch). */
static kv_status mp_launch(void *st, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark) {
    mp_state *s = st;
    (void)k; (void)sel;
    return kv_magicpig_cuda.launch(s->dev, q, s->sh.sink, t + 1 - s->sh.local, s->minc, mark);
}

static kv_status mp_finish(void *st, int t, int k, kv_selection *sel) {
    mp_state *s = st;
    (void)t; (void)k;
    return kv_magicpig_cuda.fetch(s->dev, sel->idx, sel->logw, sel->cap, sel->count);
}

static kv_status mp_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    mp_state *s = st;
    const kv_shape *sh = &s->sh;
    int D = sh->head_dim, T = sh->max_tokens, L = s->L, lo = sh->sink, hi = t + 1 - sh->local;
    (void)k; /* variable budget: every candidate is attended */
    if (hi <= lo) return KV_OK;
    if (s->dev) {
        KV_TRY(mp_launch(s, t, q, k, sel, NULL));
        return mp_finish(s, t, k, sel);
    }
#pragma omp parallel for schedule(static)
    for (int h = 0; h < sh->num_q_heads; h++) {
        int g = h / sh->group;
        const float *qh = q + (size_t)h * D;
        float *qn = s->qn + (size_t)h * D;
        float qnorm = sqrtf(kv_dot_ref(qh, qh, D));
        for (int j = 0; j < D; j++) qn[j] = qnorm > 0 ? qh[j] / qnorm : 0.f;
        uint16_t *qc = s->qcodes + (size_t)h * L, *cnt = s->cnt + (size_t)h * T;
        kv_mp_hash(qn, s->proj, D, s->K, L, s->acc + (size_t)h * s->KL, qc, 1);
        kv_mp_collisions(s->codes + (size_t)g * L * T, T, lo, hi, qc, L, cnt);
        int32_t *idx = sel->idx + (size_t)h * sel->cap;
        float *lw = sel->logw + (size_t)h * sel->cap;
        int c = 0;
        for (int i = lo; i < hi && c < sel->cap; i++) {
            if (cnt[i - lo] < s->minc) continue;
            float kn = s->knorm[(size_t)g * T + i];
            double den = (double)qnorm * kn;
            double cs = den > 0 ? kv_dot_ref(qh, s->ck + ((size_t)g * T + i) * D, D) / den : 0.0;
            idx[c] = i;
            lw[c++] = kv_mp_logw(cs, s->K, L);
        }
        sel->count[h] = c;
    }
    return KV_OK;
}

static size_t mp_memory(const void *st) {
    const mp_state *s = st;
    size_t Hkv = (size_t)s->sh.num_kv_heads, D = (size_t)s->sh.head_dim;
    size_t idx = s->n > s->sh.sink ? (size_t)(s->n - s->sh.sink) : 0;
    return Hkv * idx * ((size_t)s->L * sizeof(uint16_t) + sizeof(float)) + D * s->KL * sizeof(float) +
           Hkv * D * sizeof(float);
}

static void mp_destroy(void *st) { mp_free(st); }

void kv_magicpig_view(const void *st, kv_mp_view *out) {
    const mp_state *s = st;
    *out = (kv_mp_view){.K = s->K, .L = s->L, .n = s->n, .proj = s->proj, .mean = s->mean, .codes = s->codes,
                        .gpu = s->dev};
}

/* kvbench bench on a GPU: the projection of the same seed as create(), the
 * index of all n positions (centre = their mean, computed on the device),
 * then the per-stage timings of kernels/magicpig.cu. */
static kv_status mp_bench_gpu(const kv_shape *sh, const kv_param_set *ps, const kv_gpu_bench_spec *spec,
                              const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q,
                              kv_gpu_stages *out) {
    int k = kv_param_int(ps, "K"), L = kv_param_int(ps, "L"), minc = kv_param_int(ps, "min_collisions");
    if (minc > L)
        return kv_fail(KV_ERR_INPUT, "--param min_collisions for method magicpig: %d is above L=%d (no key could qualify)",
                       minc, L);
    KV_TRY(kv_gpu_table(&kv_magicpig_cuda));
    float *proj = kv_malloc((size_t)sh->head_dim * k * L * sizeof(float), "magicpig projection");
    if (!proj) return KV_ERR_NOMEM;
    kv_mp_projection(sh->seed + (uint64_t)kv_param_int(ps, "seed"), sh->head_dim, k, L, proj);
    kv_status st = kv_magicpig_cuda.bench(spec, k, L, minc, proj, K, q, out);
    free(proj);
    return st;
}

const kv_method kv_method_magicpig = {
    .abi = KV_RETRIEVER_ABI,
    .name = "magicpig",
    .summary = "SimHash LSH (K bits x L tables) on centred keys; keys colliding >= min_collisions times, "
               "importance-weighted",
    .paper = "\"MagicPIG: LSH Sampling for Efficient LLM Generation\", Chen et al., ICLR 2025, code Infini-AI-Lab/MagicPIG",
    .per_kv_head = 0,
    .variable_budget = 1,
    .uses_logw = 1,
    .has_gpu = 1,
    .params = mp_params,
    .create = mp_create,
    .build = mp_build,
    .prefill_half = 1, /* the GPU path widens a chunk at a time, the CPU path the keys once */
    .append = mp_append,
    .search = mp_search,
    .memory_bytes = mp_memory,
    .destroy = mp_destroy,
    .bench_gpu = mp_bench_gpu,
    .search_launch = mp_launch,
    .search_finish = mp_finish,
};
