/* racc_index.c: RACC's Faiss retrieval index (racc_index.h). One index per
 * kv head ("HNSW<M>" or "IVF<nlist>,Flat" from faiss_index_factory with
 * METRIC_INNER_PRODUCT, knobs through ParameterSpace / IndexIVF as
 * retrievers/faiss.c sets them), the evicted keys added at each
 * recompression in position order, labels (add order) mapped to positions.
 * IVF is created and trained at the first add that has keys, on those keys,
 * with nlist capped at their count (the first compression evicts
 * (1 - alpha) of the prefill: thousands of keys on any real trace; a cap,
 * not an error, because a short synthetic trace may evict fewer); nprobe is
 * capped at that nlist, so nprobe >= nlist scans every list (exhaustive).
 * Heads are added and searched in kv-head order with Faiss's OpenMP pinned
 * to one thread, so HNSW's insertion order, hence its graph, and IVF's
 * k-means are deterministic. */
#define _GNU_SOURCE /* fopencookie: count the serialised bytes */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "racc_index.h"

#ifdef KV_HAVE_FAISS
#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>
#include <omp.h>

struct kv_racc_index {
    int kind, Hkv, D, T, nlist, nprobe, M, ef;
    FaissIndex **ix;   /* [Hkv], NULL until the first add */
    int32_t **pos;     /* [Hkv][T]: position of label l */
    int *n;            /* [Hkv] keys added */
    float *buf;        /* [T][D] gathered keys of one add */
    float *dist;       /* [T] */
    idx_t *lab;        /* [T] */
};

static const char *msg(void) {
    const char *m = faiss_get_last_error();
    return m ? m : "(no message)";
}

void kv_racc_index_destroy(kv_racc_index *x) {
    if (!x) return;
    for (int g = 0; g < x->Hkv; g++) {
        if (x->ix && x->ix[g]) faiss_Index_free(x->ix[g]);
        if (x->pos) free(x->pos[g]);
    }
    free(x->ix); free(x->pos); free(x->n); free(x->buf); free(x->dist); free(x->lab);
    free(x);
}

kv_status kv_racc_index_create(int kind, int Hkv, int D, int T, int nlist, int nprobe, int M, int ef_search,
                               kv_racc_index **out) {
    *out = NULL;
    if (kind != KV_RACC_HNSW && kind != KV_RACC_IVF) return kv_fail(KV_ERR_INTERNAL, "racc: index kind %d", kind);
    kv_racc_index *x = kv_calloc(1, sizeof *x, "racc index");
    if (!x) return KV_ERR_NOMEM;
    *x = (kv_racc_index){.kind = kind, .Hkv = Hkv, .D = D, .T = T, .nlist = nlist, .nprobe = nprobe, .M = M,
                         .ef = ef_search};
    x->ix = kv_calloc((size_t)Hkv, sizeof *x->ix, "racc index");
    x->pos = kv_calloc((size_t)Hkv, sizeof *x->pos, "racc index labels");
    x->n = kv_calloc((size_t)Hkv, sizeof *x->n, "racc index counts");
    x->buf = kv_malloc((size_t)T * D * sizeof(float), "racc index staging");
    x->dist = kv_malloc((size_t)T * sizeof(float), "racc index distances");
    x->lab = kv_malloc((size_t)T * sizeof(idx_t), "racc index labels");
    int ok = x->ix && x->pos && x->n && x->buf && x->dist && x->lab;
    for (int g = 0; ok && g < Hkv; g++) ok = (x->pos[g] = kv_malloc((size_t)T * sizeof(int32_t), "racc index labels")) != NULL;
    if (!ok) { kv_racc_index_destroy(x); return KV_ERR_NOMEM; }
    *out = x;
    return KV_OK;
}

static kv_status index_new(kv_racc_index *x, int g, int n_train) {
    char desc[64];
    int nl = x->nlist < n_train ? x->nlist : n_train;
    if (x->kind == KV_RACC_HNSW) snprintf(desc, sizeof desc, "HNSW%d", x->M);
    else snprintf(desc, sizeof desc, "IVF%d,Flat", nl);
    if (faiss_index_factory(&x->ix[g], x->D, desc, METRIC_INNER_PRODUCT))
        return kv_fail(KV_ERR_INTERNAL, "racc index: creating %s (d=%d): %s", desc, x->D, msg());
    if (x->kind == KV_RACC_IVF) {
        FaissIndexIVF *ivf = faiss_IndexIVF_cast(x->ix[g]);
        if (!ivf) return kv_fail(KV_ERR_INTERNAL, "racc index: %s is not an IVF index", desc);
        faiss_IndexIVF_set_nprobe(ivf, (size_t)(x->nprobe < nl ? x->nprobe : nl));
        return KV_OK;
    }
    FaissParameterSpace *space = NULL;
    kv_status st = KV_OK;
    if (faiss_ParameterSpace_new(&space) ||
        faiss_ParameterSpace_set_index_parameter(space, x->ix[g], "efConstruction", 40) ||
        faiss_ParameterSpace_set_index_parameter(space, x->ix[g], "efSearch", x->ef))
        st = kv_fail(KV_ERR_INTERNAL, "racc index: setting efConstruction/efSearch: %s", msg());
    if (space) faiss_ParameterSpace_free(space);
    return st;
}

static kv_status index_add(kv_racc_index *x, int g, int n) {
    if (!x->ix[g]) {
        KV_TRY(index_new(x, g, n));
        if (x->kind == KV_RACC_IVF && faiss_Index_train(x->ix[g], n, x->buf))
            return kv_fail(KV_ERR_INTERNAL, "racc index: kv head %d: train: %s", g, msg());
    }
    if (faiss_Index_add(x->ix[g], n, x->buf)) return kv_fail(KV_ERR_INTERNAL, "racc index: kv head %d: add: %s", g, msg());
    return KV_OK;
}

kv_status kv_racc_index_add(kv_racc_index *x, int g, const float *Kg, const int32_t *pos, int n) {
    if (n <= 0) return KV_OK;
    if (x->n[g] + n > x->T) return kv_fail(KV_ERR_INTERNAL, "racc index: %d keys beyond %d", x->n[g] + n, x->T);
    for (int i = 0; i < n; i++) memcpy(x->buf + (size_t)i * x->D, Kg + (size_t)pos[i] * x->D, (size_t)x->D * sizeof(float));
    /* Faiss's own OpenMP pinned to one thread: HNSW insertion and IVF's k-means then do not depend on the
     * thread count (parallel HNSW insertion builds another graph on every run) */
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    kv_status st = index_add(x, g, n);
    omp_set_num_threads(nt);
    KV_TRY(st);
    memcpy(x->pos[g] + x->n[g], pos, (size_t)n * sizeof(int32_t));
    x->n[g] += n;
    return KV_OK;
}

int kv_racc_index_search(kv_racc_index *x, int g, const float *q, int kk, int32_t *out) {
    if (!x->ix[g] || kk <= 0) return 0;
    if (kk > x->n[g]) kk = x->n[g];
    if (faiss_Index_search(x->ix[g], 1, q, kk, x->dist, x->lab)) {
        kv_fail(KV_ERR_INTERNAL, "racc index: kv head %d: search: %s", g, msg());
        return -1;
    }
    int c = 0;
    for (int i = 0; i < kk; i++)
        if (x->lab[i] >= 0 && x->lab[i] < x->n[g]) out[c++] = x->pos[g][x->lab[i]];
    return c;
}

static ssize_t count_write(void *cookie, const char *buf, size_t n) {
    (void)buf;
    *(size_t *)cookie += n;
    return (ssize_t)n;
}

size_t kv_racc_index_bytes(const kv_racc_index *x) {
    size_t total = 0;
    for (int g = 0; g < x->Hkv; g++) {
        if (!x->ix[g]) continue;
        size_t b = 0;
        FILE *f = fopencookie(&b, "w", (cookie_io_functions_t){.write = count_write});
        if (f) {
            faiss_write_index(x->ix[g], f);
            fclose(f);
        }
        total += b + (size_t)x->n[g] * sizeof(int32_t);
    }
    return total;
}

#else /* built without Faiss */

kv_status kv_racc_index_create(int kind, int Hkv, int D, int T, int nlist, int nprobe, int M, int ef_search,
                               kv_racc_index **out) {
    (void)Hkv; (void)D; (void)T; (void)nlist; (void)nprobe; (void)M; (void)ef_search;
    *out = NULL;
    return kv_fail(KV_ERR_INPUT, "racc: --param index=%s needs Faiss, and this kvbench was built without it (run "
                   "make deps, then make); index=exact works everywhere", kind == KV_RACC_HNSW ? "faiss-hnsw" : "faiss-ivf");
}
kv_status kv_racc_index_add(kv_racc_index *x, int g, const float *Kg, const int32_t *pos, int n) {
    (void)x; (void)g; (void)Kg; (void)pos; (void)n;
    return kv_fail(KV_ERR_INTERNAL, "racc: no Faiss");
}
int kv_racc_index_search(kv_racc_index *x, int g, const float *q, int kk, int32_t *out) {
    (void)x; (void)g; (void)q; (void)kk; (void)out;
    return -1;
}
size_t kv_racc_index_bytes(const kv_racc_index *x) { (void)x; return 0; }
void kv_racc_index_destroy(kv_racc_index *x) { (void)x; }

#endif
