/* racc_index.h: RACC's retrieval index over the evicted keys (index=
 * faiss-hnsw | faiss-ivf), one Faiss index per kv head, inner-product
 * metric, through Faiss's C API like retrievers/faiss.c; labels are the
 * add order, mapped back to positions here. index=exact needs none of
 * this (retrievers/racc.c scans the evicted keys). Built without Faiss
 * (KV_HAVE_FAISS unset), create() fails with an input error naming the
 * parameter. */
#ifndef KV_RACC_INDEX_H
#define KV_RACC_INDEX_H

#include "kv_retriever.h"

enum { KV_RACC_EXACT = 0, KV_RACC_HNSW = 1, KV_RACC_IVF = 2 };

typedef struct kv_racc_index kv_racc_index;

/* kind KV_RACC_HNSW (M, ef_search; efConstruction 40, Faiss's default) or
 * KV_RACC_IVF (nlist, nprobe). */
kv_status kv_racc_index_create(int kind, int Hkv, int D, int T, int nlist, int nprobe, int M, int ef_search,
                               kv_racc_index **out);
/* Adds the keys of positions pos[0..n) of kv head g (Kg: that head's keys
 * [T][D]). IVF trains on the first add with keys (nlist capped at their
 * number), later adds are assigned to those lists (the paper's index is
 * updated incrementally: "new KV entries are dynamically inserted"). */
kv_status kv_racc_index_add(kv_racc_index *x, int g, const float *Kg, const int32_t *pos, int n);
/* The kk best positions of kv head g for query q (decreasing inner
 * product, Faiss's order) to out; returns the count (<= kk; -1 on error). */
int kv_racc_index_search(kv_racc_index *x, int g, const float *q, int kk, int32_t *out);
/* Serialised size of all the indexes (memory_bytes). */
size_t kv_racc_index_bytes(const kv_racc_index *x);
void kv_racc_index_destroy(kv_racc_index *x);

#endif
