/* registry.c: the static table of retrievers, looked up by name. Adding a
 * method is one line here plus its retrievers/<name>.c. The order is the
 * order `kvbench list` prints. */
#include <string.h>

#include "kv_retriever.h"

extern const kv_method kv_method_exact;
extern const kv_method kv_method_streaming;
extern const kv_method kv_method_random;
extern const kv_method kv_method_sampled;
extern const kv_method kv_method_pqcache;
extern const kv_method kv_method_quest;
extern const kv_method kv_method_magicpig;
extern const kv_method kv_method_pariskv;
extern const kv_method kv_method_csattention;
extern const kv_method kv_method_ctkvr;
extern const kv_method kv_method_freekv;
extern const kv_method kv_method_racc;
#ifdef KV_HAVE_FAISS /* retrievers/faiss.c: only when the Faiss C API was found at build time */
extern const kv_method kv_method_faiss_flat;
extern const kv_method kv_method_faiss_ivf;
extern const kv_method kv_method_faiss_ivfpq;
extern const kv_method kv_method_faiss_hnsw;
#endif

static const kv_method *const kv_registry[] = {
    &kv_method_exact,
    &kv_method_streaming,
    &kv_method_random,
    &kv_method_sampled,
    &kv_method_pqcache,
    &kv_method_quest,
    &kv_method_magicpig,
    &kv_method_pariskv,
    &kv_method_csattention,
    &kv_method_ctkvr,
    &kv_method_freekv,
    &kv_method_racc,
#ifdef KV_HAVE_FAISS
    &kv_method_faiss_flat,
    &kv_method_faiss_ivf,
    &kv_method_faiss_ivfpq,
    &kv_method_faiss_hnsw,
#endif
};

/* Method families compiled out of this build, one line each for `kvbench list`. */
static const char *const kv_absent[] = {
#ifndef KV_HAVE_FAISS
    "faiss: not built (run make deps): faiss-flat, faiss-ivf, faiss-ivfpq, faiss-hnsw",
#endif
    NULL,
};

const char *const *kv_methods_absent(void) { return kv_absent; }

const kv_method *const *kv_methods(int *count) {
    *count = (int)(sizeof kv_registry / sizeof kv_registry[0]);
    return kv_registry;
}

int kv_method_group_consistent(const kv_method *m, const kv_param_set *ps) {
    if (m->per_kv_head) return 1;
    if (!m->group_pool_param || !ps || !ps->spec) return 0;
    for (int i = 0; i < ps->n; i++) {
        const kv_param_spec *s = &ps->spec[i];
        if (s->type != KV_PARAM_ENUM || strcmp(s->name, m->group_pool_param)) continue;
        const char *c = s->choices; /* the value's name: field val[i] of "a|b|c" */
        for (int v = (int)ps->val[i]; v > 0 && c; v--) c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
        return c && strncmp(c, "none", 4) != 0;
    }
    return 0;
}

const kv_method *kv_method_find(const char *name) {
    int n;
    const kv_method *const *all = kv_methods(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}
