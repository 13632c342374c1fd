/* registry.c: the static table of retrievers, looked up by name. Adding a
 * method is one line here plus its retrievers/<name>.c. The order is the
 * order `kvbench list` prints. */
#include <string.h>

#include "kv_retriever.h"

extern const kv_method kv_method_exact;
extern const kv_method kv_method_streaming;
extern const kv_method kv_method_random;

static const kv_method *const kv_registry[] = {
    &kv_method_exact,
    &kv_method_streaming,
    &kv_method_random,
};

const kv_method *const *kv_methods(int *count) {
    *count = (int)(sizeof kv_registry / sizeof kv_registry[0]);
    return kv_registry;
}

const kv_method *kv_method_find(const char *name) {
    int n;
    const kv_method *const *all = kv_methods(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}
