/* faiss.c: Faiss baselines (Johnson, Douze, Jegou, "Billion-scale
 * similarity search with GPUs", IEEE TBD 2019; Douze et al., "The Faiss
 * library", 2024), through Faiss's C API: maximum-inner-product search over
 * the keys, the generic ANN answer to KV retrieval that the specialised
 * methods should beat.
 *
 *   faiss-flat   IndexFlatIP: exact inner products. Recall 1.0 up to float
 *                rounding at the k-th score: an independent cross-check of
 *                the exact oracle (different code, same answer).
 *   faiss-ivf    IndexIVFFlat ("IVF<nlist>,Flat"): k-means coarse quantizer,
 *                nprobe lists scanned exactly.
 *   faiss-ivfpq  IndexIVFPQ ("IVF<nlist>,PQ<M>x<nbits>np"): the same with
 *                residuals product-quantised (M codes of nbits).
 *   faiss-hnsw   IndexHNSWFlat ("HNSW<M>"): graph search, efConstruction at
 *                add, efSearch at search.
 * All with METRIC_INNER_PRODUCT (the ranking of softmax_scale * <q, k>),
 * one index per kv head.
 *
 * Faiss here is Debian's libfaiss-dev (1.7.3, CPU) plus its C API compiled
 * from Debian's own faiss source by scripts/build_faiss_capi.sh (Debian
 * ships the headers but not libfaiss_c). The 1.7.3 C API has no
 * IndexIVFPQ/IndexHNSW constructors, so those come from faiss_index_factory
 * and their knobs from ParameterSpace (efConstruction, efSearch), which is
 * how Faiss's own AutoTune sets them. Without the library (KV_HAVE_FAISS
 * unset) this file compiles to nothing and the registry omits the methods.
 *
 * Choices (Faiss has no notion of a moving retrievable region):
 * - Which keys, when. A key is added to its head's index exactly when it
 *   enters the region [sink, t+1-local): build() adds [sink, P-local), and
 *   append(t) adds position t-local. So at every step the index holds the
 *   region and nothing else: no filtering, no over-fetch (k' = k), and Faiss
 *   labels map to positions as sink + label (every index numbers its vectors
 *   in add order). The keys still in the local window wait in a ring of the
 *   last local+1 keys (not counted in memory_bytes: the local window is part
 *   of the KV cache any method keeps).
 * - Training (IVF, PQ) uses the prefill keys [sink, P): known at build,
 *   none from the future; decode keys are assigned to the prefill centroids,
 *   never re-clustered (the drift that PQCache has too). nlist (and 2^nbits
 *   for PQ) must not exceed the number of training keys: an input error,
 *   not Faiss's exception. Faiss warns on stderr when there are fewer than
 *   39 training keys per centroid, once per head and PQ sub-quantizer;
 *   training captures stderr and prints each distinct line once.
 * - Defaults: nlist=128 (about sqrt of a 16K-token context), nprobe=16
 *   (1/8 of the lists, ~2K keys scanned at 16K: the order of the candidate
 *   fractions the specialised methods use there); ivfpq M=16, nbits=8
 *   (16-byte codes, 8-dim sub-vectors at D=128, Faiss's usual 8 bits);
 *   hnsw M=32, efConstruction=40 (Faiss's default), efSearch=128 (>= the
 *   default k=100). All are parameters; sweep them.
 * - pq uses "np" (no polysemous training): polysemous codes only serve
 *   Hamming pre-filtering, which IVFPQ search does not use here, and their
 *   annealing costs minutes per head.
 * - Determinism: Faiss's k-means seeds are fixed (1234, its default; the C
 *   API does not expose them for IVF, so --seed does not reach Faiss), and
 *   each head's index is built and searched by one thread: the heads run in
 *   parallel (OpenMP over kv heads), Faiss's own OpenMP inside is pinned to
 *   one thread. HNSW insertion is then sequential in position order, so two
 *   runs build the same graph (parallel HNSW insertion does not).
 * - GQA, `pool`: none = one search per query head (nq = G per kv head);
 *   mean = one search per kv head with the mean of the group's raw query
 *   vectors, its list copied to the G query heads. The method reports per
 *   query head either way.
 * - Fewer results than k: IVF returns fewer when the probed lists hold
 *   fewer than k keys, HNSW may too (label -1); those slots are dropped.
 *   HNSW searches with ef = max(efSearch, k) (Faiss's rule).
 * - memory_bytes: the size of each index as faiss_write_index serialises it
 *   (vectors or codes, ids, centroids, codebooks, graph links), summed over
 *   the kv heads; counted through a byte-counting FILE, nothing is stored.
 * - FAISS_GPU=1 (KV_HAVE_FAISS_GPU, a user's own GPU build of Faiss): flat,
 *   ivf and ivfpq are trained on the CPU, then cloned to the GPU with
 *   faiss_index_cpu_to_gpu, where adds and searches run (one head at a
 *   time: GPU resources are not shared across threads). HNSW has no GPU
 *   index in Faiss and stays on the CPU. Untested here: no registry this
 *   project installs from ships a GPU Faiss. */
#define _GNU_SOURCE /* fopencookie: count the serialised bytes */
#include "baselines.h"
#include "kv_retriever.h"

static int kv_faiss_quiet_on;
void kv_faiss_quiet(int on) { kv_faiss_quiet_on = on; }

#ifdef KV_HAVE_FAISS
#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/faiss_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef KV_HAVE_FAISS_GPU
#include <faiss/c_api/gpu/GpuAutoTune_c.h>
#include <faiss/c_api/gpu/StandardGpuResources_c.h>
#endif

enum { KV_FAISS_FLAT, KV_FAISS_IVF, KV_FAISS_IVFPQ, KV_FAISS_HNSW };
static const char *const kv_faiss_names[] = {"faiss-flat", "faiss-ivf", "faiss-ivfpq", "faiss-hnsw"};

typedef struct {
    kv_shape sh;
    int kind, pool_mean, nlist, nbits;
    char desc[64];        /* index_factory string */
    FaissIndex **ix;      /* [Hkv] */
    int slots;            /* ring size: min(local + 1, T) */
    float *ring;          /* [Hkv][slots][D]: keys of positions not yet in the region */
    int n;                /* positions seen */
    int added;            /* positions [sink, sink + added) are in every index */
    int kcap;             /* capacity of the search scratch, per query */
    float *qmean;         /* [Hkv][D] */
    float *dist;          /* [Hkv][G * kcap] */
    idx_t *lab;           /* [Hkv][G * kcap] */
    char (*err)[256];     /* [Hkv]: Faiss's message from the worker that failed */
    int on_gpu;
#ifdef KV_HAVE_FAISS_GPU
    FaissStandardGpuResources *gpu;
#endif
} faiss_state;

#define KV_FAISS_POOL {"pool", KV_PARAM_ENUM, KV_PARAM_SEARCH, 0, 0, 1, "none|mean", \
    "none: one search per query head; mean: one per kv head with the group's mean query"}
#define KV_FAISS_IVF_PARAMS                                                                             \
    {"nlist", KV_PARAM_INT, KV_PARAM_BUILD, 128, 1, 1 << 20, NULL,                                      \
     "inverted lists (k-means centroids of the prefill keys); at most the training keys P - sink"},   \
    {"nprobe", KV_PARAM_INT, KV_PARAM_SEARCH, 16, 1, 1 << 20, NULL, "lists scanned per query (capped at nlist)"}

static const kv_param_spec flat_params[] = {KV_FAISS_POOL, {NULL}};
static const kv_param_spec ivf_params[] = {KV_FAISS_IVF_PARAMS, KV_FAISS_POOL, {NULL}};
static const kv_param_spec ivfpq_params[] = {
    KV_FAISS_IVF_PARAMS,
    {"M", KV_PARAM_INT, KV_PARAM_BUILD, 16, 1, 1024, NULL, "PQ sub-quantizers (must divide head_dim)"},
    {"nbits", KV_PARAM_INT, KV_PARAM_BUILD, 8, 1, 8, NULL, "bits per PQ code (IndexIVFPQ of 1.7.3: <= 8; 2^nbits <= training keys)"},
    KV_FAISS_POOL,
    {NULL},
};
static const kv_param_spec hnsw_params[] = {
    {"M", KV_PARAM_INT, KV_PARAM_BUILD, 32, 2, 512, NULL, "graph neighbours per node (2M on level 0)"},
    {"efConstruction", KV_PARAM_INT, KV_PARAM_BUILD, 40, 1, 65536, NULL, "candidate list size while inserting"},
    {"efSearch", KV_PARAM_INT, KV_PARAM_SEARCH, 128, 1, 65536, NULL, "candidate list size while searching (>= k is used)"},
    KV_FAISS_POOL,
    {NULL},
};

static const char *faiss_msg(void) {
    const char *m = faiss_get_last_error();
    return m ? m : "(no message)";
}

/* The worker's Faiss message, kept for the calling thread's kv_fail. */
static void faiss_keep(faiss_state *s, int g, const char *what) {
    snprintf(s->err[g], sizeof s->err[g], "%s: %s", what, faiss_msg());
}

static kv_status faiss_collect(const faiss_state *s, int failed) {
    if (!failed) return KV_OK;
    for (int g = 0; g < s->sh.num_kv_heads; g++)
        if (s->err[g][0]) return kv_fail(KV_ERR_INTERNAL, "%s: kv head %d: %s", kv_faiss_names[s->kind], g, s->err[g]);
    return kv_fail(KV_ERR_INTERNAL, "%s: Faiss failed", kv_faiss_names[s->kind]);
}

static void faiss_destroy(void *st) {
    faiss_state *s = st;
    if (!s) return;
    for (int g = 0; s->ix && g < s->sh.num_kv_heads; g++)
        if (s->ix[g]) faiss_Index_free(s->ix[g]);
#ifdef KV_HAVE_FAISS_GPU
    if (s->gpu) faiss_StandardGpuResources_free(s->gpu);
#endif
    free(s->ix); free(s->ring); free(s->qmean); free(s->dist); free(s->lab); free(s->err);
    free(s);
}

static kv_status faiss_create(const kv_shape *sh, const kv_param_set *ps, int kind, void **out) {
    const char *name = kv_faiss_names[kind];
    int D = sh->head_dim, Hkv = sh->num_kv_heads;
    faiss_state *s = kv_calloc(1, sizeof *s, "faiss state");
    if (!s) return KV_ERR_NOMEM;
    s->sh = *sh;
    s->kind = kind;
    s->pool_mean = kv_param_int(ps, "pool") == 1;
    s->slots = sh->local + 1 < sh->max_tokens ? sh->local + 1 : sh->max_tokens;
    s->ix = kv_calloc((size_t)Hkv, sizeof *s->ix, "faiss indexes");
    s->ring = kv_malloc((size_t)Hkv * s->slots * D * sizeof(float), "faiss key ring");
    s->qmean = kv_malloc((size_t)Hkv * D * sizeof(float), "faiss mean queries");
    s->err = kv_calloc((size_t)Hkv, sizeof *s->err, "faiss messages");
    if (!s->ix || !s->ring || !s->qmean || !s->err) { faiss_destroy(s); return KV_ERR_NOMEM; }
    kv_status st = KV_OK;
    switch (kind) {
    case KV_FAISS_FLAT: snprintf(s->desc, sizeof s->desc, "Flat"); break;
    case KV_FAISS_IVF:
        s->nlist = kv_param_int(ps, "nlist");
        snprintf(s->desc, sizeof s->desc, "IVF%d,Flat", s->nlist);
        break;
    case KV_FAISS_IVFPQ: {
        int M = kv_param_int(ps, "M");
        s->nlist = kv_param_int(ps, "nlist");
        s->nbits = kv_param_int(ps, "nbits");
        if (D % M) st = kv_fail(KV_ERR_INPUT, "%s: M=%d must divide head_dim %d", name, M, D);
        snprintf(s->desc, sizeof s->desc, "IVF%d,PQ%dx%dnp", s->nlist, M, s->nbits);
        break;
    }
    default: snprintf(s->desc, sizeof s->desc, "HNSW%d", kv_param_int(ps, "M"));
    }
    FaissParameterSpace *space = NULL;
    if (st == KV_OK && faiss_ParameterSpace_new(&space))
        st = kv_fail(KV_ERR_INTERNAL, "%s: faiss_ParameterSpace_new: %s", name, faiss_msg());
    for (int g = 0; g < Hkv && st == KV_OK; g++) {
        int rc;
        if (kind == KV_FAISS_FLAT) {
            FaissIndexFlatIP *flat = NULL;
            rc = faiss_IndexFlatIP_new_with(&flat, D);
            s->ix[g] = (FaissIndex *)flat;
        } else rc = faiss_index_factory(&s->ix[g], D, s->desc, METRIC_INNER_PRODUCT);
        if (rc) { st = kv_fail(KV_ERR_INTERNAL, "%s: creating %s (d=%d): %s", name, s->desc, D, faiss_msg()); break; }
        if (kind == KV_FAISS_IVF || kind == KV_FAISS_IVFPQ) {
            FaissIndexIVF *ivf = faiss_IndexIVF_cast(s->ix[g]);
            if (!ivf) st = kv_fail(KV_ERR_INTERNAL, "%s: %s is not an IVF index", name, s->desc);
            else faiss_IndexIVF_set_nprobe(ivf, (size_t)kv_param_int(ps, "nprobe"));
        } else if (kind == KV_FAISS_HNSW) {
            if (faiss_ParameterSpace_set_index_parameter(space, s->ix[g], "efConstruction", kv_param(ps, "efConstruction")) ||
                faiss_ParameterSpace_set_index_parameter(space, s->ix[g], "efSearch", kv_param(ps, "efSearch")))
                st = kv_fail(KV_ERR_INTERNAL, "%s: setting efConstruction/efSearch: %s", name, faiss_msg());
        }
    }
    if (space) faiss_ParameterSpace_free(space);
#ifdef KV_HAVE_FAISS_GPU
    s->on_gpu = sh->use_gpu && kind != KV_FAISS_HNSW;
    if (st == KV_OK && s->on_gpu && faiss_StandardGpuResources_new(&s->gpu))
        st = kv_fail(KV_ERR_GPU, "%s: faiss_StandardGpuResources_new: %s", name, faiss_msg());
#endif
    if (st != KV_OK) { faiss_destroy(s); return st; }
    *out = s;
    return KV_OK;
}

static kv_status flat_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    return faiss_create(sh, ps, KV_FAISS_FLAT, out);
}
static kv_status ivf_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    return faiss_create(sh, ps, KV_FAISS_IVF, out);
}
static kv_status ivfpq_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    return faiss_create(sh, ps, KV_FAISS_IVFPQ, out);
}
static kv_status hnsw_create(const kv_shape *sh, const kv_param_set *ps, void **out) {
    return faiss_create(sh, ps, KV_FAISS_HNSW, out);
}

static float *ring_at(faiss_state *s, int g, int pos) {
    return s->ring + ((size_t)g * s->slots + (size_t)(pos % s->slots)) * s->sh.head_dim;
}

/* Faiss's k-means prints a warning per clustering with fewer than 39
 * points per centroid: once per kv head, and for PQ once per sub-quantizer
 * too (32 identical lines for 2 heads x M=16). Training runs with fd 2
 * captured; each distinct line is then printed once, with its count. */
typedef struct { int saved; FILE *tmp; } faiss_capture;

static void capture_begin(faiss_capture *c) {
    fflush(stderr);
    c->tmp = tmpfile();
    c->saved = c->tmp ? dup(2) : -1;
    if (c->saved >= 0 && dup2(fileno(c->tmp), 2) < 0) { close(c->saved); c->saved = -1; }
}

static void capture_end(faiss_capture *c, const char *name) {
    if (c->saved >= 0) {
        fflush(stderr);
        dup2(c->saved, 2);
        close(c->saved);
        enum { KV_LINES = 16 };
        char line[512], seen[KV_LINES][512];
        int count[KV_LINES] = {0}, n = 0, more = 0;
        rewind(c->tmp);
        while (fgets(line, sizeof line, c->tmp)) {
            line[strcspn(line, "\n")] = 0;
            int j = 0;
            while (j < n && strcmp(seen[j], line)) j++;
            if (j == n && n < KV_LINES) memcpy(seen[n++], line, sizeof line);
            if (j < n) count[j]++;
            else more++;
        }
        for (int j = 0; j < n && !kv_faiss_quiet_on; j++)
            fprintf(stderr, count[j] > 1 ? "%s: Faiss: %s (%d times)\n" : "%s: Faiss: %s\n", name, seen[j], count[j]);
        if (more && !kv_faiss_quiet_on) fprintf(stderr, "%s: Faiss: %d more lines\n", name, more);
    }
    if (c->tmp) fclose(c->tmp);
}

static kv_status faiss_build(void *st, const kv_prefill *pre) {
    faiss_state *s = st;
    const kv_shape *sh = &s->sh;
    const char *name = kv_faiss_names[s->kind];
    int D = sh->head_dim, P = pre->n, S = sh->sink, W = sh->local, Hkv = sh->num_kv_heads;
    int n_train = P - S, n_add = P - W - S > 0 ? P - W - S : 0;
    if (s->kind == KV_FAISS_IVF || s->kind == KV_FAISS_IVFPQ) {
        if (n_train < s->nlist)
            return kv_fail(KV_ERR_INPUT, "%s: nlist=%d needs at least %d training keys; the prefill has %d outside the "
                           "sink ([%d, %d))", name, s->nlist, s->nlist, n_train > 0 ? n_train : 0, S, P);
        if (s->kind == KV_FAISS_IVFPQ && n_train < (1 << s->nbits))
            return kv_fail(KV_ERR_INPUT, "%s: nbits=%d needs at least %d training keys; the prefill has %d outside the "
                           "sink ([%d, %d))", name, s->nbits, 1 << s->nbits, n_train > 0 ? n_train : 0, S, P);
    }
    int failed = 0, train = s->kind == KV_FAISS_IVF || s->kind == KV_FAISS_IVFPQ;
    faiss_capture cap = {.saved = -1};
    if (train) capture_begin(&cap);
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int g = 0; g < Hkv; g++) {
        omp_set_num_threads(1); /* this head's index: one thread, deterministic */
        const float *K = pre->k + (size_t)g * P * D;
        if (train && faiss_Index_train(s->ix[g], n_train, K + (size_t)S * D)) {
            faiss_keep(s, g, "train");
            failed = 1;
            continue;
        }
        if (n_add && faiss_Index_add(s->ix[g], n_add, K + (size_t)S * D)) {
            faiss_keep(s, g, "add");
            failed = 1;
            continue;
        }
        for (int p = P - W > 0 ? P - W : 0; p < P; p++) memcpy(ring_at(s, g, p), K + (size_t)p * D, (size_t)D * sizeof(float));
    }
    if (train) capture_end(&cap, name);
    KV_TRY(faiss_collect(s, failed));
#ifdef KV_HAVE_FAISS_GPU
    for (int g = 0; g < Hkv && s->on_gpu; g++) {
        FaissGpuIndex *gi;
        if (faiss_index_cpu_to_gpu((FaissGpuResourcesProvider *)s->gpu, 0, s->ix[g], &gi))
            return kv_fail(KV_ERR_GPU, "%s: faiss_index_cpu_to_gpu of %s: %s", name, s->desc, faiss_msg());
        faiss_Index_free(s->ix[g]);
        s->ix[g] = (FaissIndex *)gi;
    }
#endif
    s->n = P;
    s->added = n_add;
    return KV_OK;
}

static kv_status faiss_append(void *st, int t, const float *k, const float *v, const float *q) {
    faiss_state *s = st;
    const kv_shape *sh = &s->sh;
    (void)v; (void)q;
    int D = sh->head_dim, W = sh->local, S = sh->sink, Hkv = sh->num_kv_heads;
    if (t != s->n || t >= sh->max_tokens)
        return kv_fail(KV_ERR_INTERNAL, "%s: append of position %d, expected %d", kv_faiss_names[s->kind], t, s->n);
    for (int g = 0; g < Hkv; g++) memcpy(ring_at(s, g, t), k + (size_t)g * D, (size_t)D * sizeof(float));
    s->n++;
    int p = t - W; /* the key entering the region [S, t+1-W) at this step */
    if (p < S) return KV_OK;
    int failed = 0;
    /* an HNSW insertion is a search: worth a thread per head; a flat or IVF add is a copy */
#pragma omp parallel for schedule(static) reduction(| : failed) if (s->kind == KV_FAISS_HNSW && !s->on_gpu)
    for (int g = 0; g < Hkv; g++) {
        omp_set_num_threads(1);
        if (faiss_Index_add(s->ix[g], 1, ring_at(s, g, p))) { faiss_keep(s, g, "add"); failed = 1; }
    }
    KV_TRY(faiss_collect(s, failed));
    s->added++;
    return KV_OK;
}

static kv_status faiss_search(void *st, int t, const float *q, int k, kv_selection *sel) {
    faiss_state *s = st;
    const kv_shape *sh = &s->sh;
    const char *name = kv_faiss_names[s->kind];
    int D = sh->head_dim, G = sh->group, S = sh->sink, Hkv = sh->num_kv_heads, region = t + 1 - sh->local - S;
    if (region <= 0) return KV_OK;
    if (s->added != region)
        return kv_fail(KV_ERR_INTERNAL, "%s: step %d: the index holds %d keys, the region [%d, %d) has %d", name, t,
                       s->added, S, t + 1 - sh->local, region);
    int kk = k < region ? k : region;
    if (kk > s->kcap) {
        free(s->dist); free(s->lab);
        s->dist = kv_malloc((size_t)Hkv * G * kk * sizeof *s->dist, "faiss distances");
        s->lab = kv_malloc((size_t)Hkv * G * kk * sizeof *s->lab, "faiss labels");
        s->kcap = s->dist && s->lab ? kk : 0;
        if (!s->kcap) return KV_ERR_NOMEM;
    }
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed) if (!s->on_gpu)
    for (int g = 0; g < Hkv; g++) {
        omp_set_num_threads(1);
        const float *qg = q + (size_t)g * G * D;
        int nq = G;
        if (s->pool_mean) {
            float *m = s->qmean + (size_t)g * D;
            for (int d = 0; d < D; d++) {
                float a = 0;
                for (int j = 0; j < G; j++) a += qg[(size_t)j * D + d];
                m[d] = a / (float)G;
            }
            qg = m;
            nq = 1;
        }
        float *dist = s->dist + (size_t)g * G * s->kcap;
        idx_t *lab = s->lab + (size_t)g * G * s->kcap;
        if (faiss_Index_search(s->ix[g], nq, qg, kk, dist, lab)) { faiss_keep(s, g, "search"); failed = 1; continue; }
        for (int j = 0; j < G; j++) {
            const idx_t *l = lab + (size_t)(s->pool_mean ? 0 : j) * kk;
            int h = g * G + j, c = 0;
            int32_t *out = sel->idx + (size_t)h * sel->cap;
            for (int r = 0; r < kk; r++)
                if (l[r] >= 0 && l[r] < region) out[c++] = S + (int32_t)l[r];
            sel->count[h] = c;
        }
    }
    return faiss_collect(s, failed);
}

static ssize_t faiss_count_write(void *cookie, const char *buf, size_t n) {
    (void)buf;
    *(size_t *)cookie += n;
    return (ssize_t)n;
}

static size_t faiss_memory(const void *st) {
    const faiss_state *s = st;
    size_t total = 0;
    for (int g = 0; g < s->sh.num_kv_heads; g++) {
        const FaissIndex *ix = s->ix[g];
        FaissIndex *cpu = NULL;
#ifdef KV_HAVE_FAISS_GPU
        if (s->on_gpu && faiss_index_gpu_to_cpu(ix, &cpu) == 0) ix = cpu;
#endif
        size_t bytes = 0;
        FILE *f = fopencookie(&bytes, "w", (cookie_io_functions_t){.write = faiss_count_write});
        int rc = f ? faiss_write_index(ix, f) : -1;
        if (f) fclose(f);
        if (cpu) faiss_Index_free(cpu);
        /* serialisation failed: at least the vectors */
        total += rc == 0 ? bytes : (size_t)s->added * s->sh.head_dim * sizeof(float);
    }
    return total;
}

static void faiss_describe(FILE *f, int kind) {
    static const char *const what[] = {
        "IndexFlatIP (faiss_IndexFlatIP_new_with)",
        "faiss_index_factory(\"IVF<nlist>,Flat\", METRIC_INNER_PRODUCT); nprobe via faiss_IndexIVF_set_nprobe",
        "faiss_index_factory(\"IVF<nlist>,PQ<M>x<nbits>np\", METRIC_INNER_PRODUCT); nprobe via faiss_IndexIVF_set_nprobe",
        "faiss_index_factory(\"HNSW<M>\", METRIC_INNER_PRODUCT); efConstruction, efSearch via ParameterSpace",
    };
    fprintf(f, "%-12s   index: %s; one per kv head; a key is added when it enters [sink, t+1-local)\n", "", what[kind]);
}
static void flat_describe(FILE *f) { faiss_describe(f, KV_FAISS_FLAT); }
static void ivf_describe(FILE *f) { faiss_describe(f, KV_FAISS_IVF); }
static void ivfpq_describe(FILE *f) { faiss_describe(f, KV_FAISS_IVFPQ); }
static void hnsw_describe(FILE *f) { faiss_describe(f, KV_FAISS_HNSW); }

#ifdef KV_HAVE_FAISS_GPU
#define KV_FAISS_HAS_GPU 1
#else
#define KV_FAISS_HAS_GPU 0
#endif

#define KV_FAISS_PAPER "Faiss (\"Billion-Scale Similarity Search with GPUs\", Johnson et al., IEEE Trans. Big Data 2019)"
#define KV_FAISS_METHOD(var, nm, sum, pap, tbl, gpu, pre)                                                  \
    const kv_method var = {.abi = KV_RETRIEVER_ABI, .name = nm, .summary = sum, .paper = pap, .per_kv_head = 0, \
                           .group_pool_param = "pool",                                                        \
                           .has_gpu = gpu, .params = tbl, .create = pre##_create, .build = faiss_build,        \
                           .prefill_reads = KV_PREFILL_K,                                                     \
                           .append = faiss_append, .search = faiss_search, .memory_bytes = faiss_memory,      \
                           .destroy = faiss_destroy, .describe = pre##_describe}

KV_FAISS_METHOD(kv_method_faiss_flat, "faiss-flat", "Faiss IndexFlatIP: exact inner-product search (cross-checks exact)",
                KV_FAISS_PAPER ", C API", flat_params, KV_FAISS_HAS_GPU, flat);
KV_FAISS_METHOD(kv_method_faiss_ivf, "faiss-ivf", "Faiss IVFFlat: k-means lists of the prefill keys, nprobe lists scanned",
                KV_FAISS_PAPER ", C API", ivf_params, KV_FAISS_HAS_GPU, ivf);
KV_FAISS_METHOD(kv_method_faiss_ivfpq, "faiss-ivfpq", "Faiss IVFPQ: IVF lists with product-quantised residuals",
                KV_FAISS_PAPER "; \"Product Quantization for Nearest Neighbor Search\", "
                "Jegou et al., TPAMI 2011; C API", ivfpq_params, KV_FAISS_HAS_GPU, ivfpq);
KV_FAISS_METHOD(kv_method_faiss_hnsw, "faiss-hnsw", "Faiss HNSWFlat: hierarchical navigable small-world graph",
                KV_FAISS_PAPER "; \"Efficient and Robust Approximate Nearest Neighbor Search Using "
                "Hierarchical Navigable Small World Graphs\", Malkov & Yashunin, TPAMI 2018; C API", hnsw_params, 0, hnsw);

#endif
