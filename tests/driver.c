/* driver.c: the one loop every method test drives a retriever with, as
 * cli/run.c does: build on the prefill [0, P), then append each position in
 * order and search, on the C or the GPU path; and the synthetic layer most
 * method tests run on. Tests own their data; this only hands it over. */
#include <stdlib.h>
#include <string.h>

#include "kv_test.h"

/* L's rows [H][T][D] as float16 bits (the layer's float16 form). */
static uint16_t *to_half(const float *x, int H, int T, int D) {
    uint16_t *h = malloc((size_t)H * T * D * 2 + 1);
    for (size_t i = 0; h && x && i < (size_t)H * T * D; i++) h[i] = kv_float_to_half(x[i]);
    return h;
}

/* Creates method `name` with the given "name=value" assignments (on the
 * GPU path when use_gpu) and builds it on positions [0, P) of L: from tight
 * float32 copies, or (half) from L's float16 form in place, row stride T, as
 * `kvbench run` hands a layer held as float16 to a method with prefill_half. */
static kv_status driver_open(kv_test_driver *d, const char *name, const char *const *params, int np, const kv_layer *L,
                             int P, int sink, int local, int k, int use_gpu, int half) {
    memset(d, 0, sizeof *d);
    d->m = kv_method_find(name);
    if (!d->m) return kv_fail(KV_ERR_INTERNAL, "method %s is not registered", name);
    d->L = L;
    int D = L->D, T = L->T;
    d->sh = (kv_shape){.num_q_heads = L->Hq, .num_kv_heads = L->Hkv, .head_dim = D, .group = L->Hq / L->Hkv,
                       .max_tokens = T, .prefill_len = P, .softmax_scale = 0.17677669f, .sink = sink,
                       .local = local, .seed = 11, .use_gpu = use_gpu};
    kv_param_set ps;
    kv_params_init(&ps, d->m->params);
    for (int i = 0; i < np; i++) KV_TRY(kv_params_set(&ps, name, params[i]));
    int lists = d->m->per_kv_head ? L->Hkv : L->Hq, cap = d->m->variable_budget ? T : k;
    KV_TRY(kv_selection_alloc(&d->sel, lists, L->Hkv, cap, T, T));
    size_t fs = sizeof(float);
    float *pk = malloc((size_t)L->Hkv * P * D * fs), *pv = malloc((size_t)L->Hkv * P * D * fs),
          *pq = malloc((size_t)L->Hq * P * D * fs);
    d->kr = malloc((size_t)L->Hkv * D * fs);
    d->vr = malloc((size_t)L->Hkv * D * fs);
    d->qr = malloc((size_t)L->Hq * D * fs);
    kv_status st = (!pk || !pv || !pq || !d->kr || !d->vr || !d->qr) ? KV_ERR_NOMEM : KV_OK;
    for (int g = 0; g < L->Hkv && st == KV_OK; g++) {
        memcpy(pk + (size_t)g * P * D, L->k + (size_t)g * T * D, (size_t)P * D * fs);
        if (L->v) memcpy(pv + (size_t)g * P * D, L->v + (size_t)g * T * D, (size_t)P * D * fs);
    }
    for (int h = 0; h < L->Hq && st == KV_OK; h++)
        memcpy(pq + (size_t)h * P * D, L->q + (size_t)h * T * D, (size_t)P * D * fs);
    kv_prefill pre = {.n = P, .k = pk, .v = L->v ? pv : NULL, .q = pq};
    uint16_t *k16 = half ? to_half(L->k, L->Hkv, T, D) : NULL, *v16 = half ? to_half(L->v, L->Hkv, T, D) : NULL,
             *q16 = half ? to_half(L->q, L->Hq, T, D) : NULL;
    if (half && (!k16 || !v16 || !q16)) st = KV_ERR_NOMEM;
    if (half)
        pre = (kv_prefill){.n = P, .half = 1, .ld = T, .ldq = T, .k16 = k16, .v16 = L->v ? v16 : NULL, .q16 = q16};
    if (st == KV_OK) st = d->m->create(&d->sh, &ps, &d->st);
    if (st == KV_OK) st = d->m->build(d->st, &pre);
    d->n = P;
    free(pk); free(pv); free(pq);
    free(k16); free(v16); free(q16);
    return st;
}

kv_status kv_test_driver_open(kv_test_driver *d, const char *name, const char *const *params, int np, const kv_layer *L,
                              int P, int sink, int local, int k) {
    return driver_open(d, name, params, np, L, P, sink, local, k, 0, 0);
}

kv_status kv_test_driver_open_gpu(kv_test_driver *d, const char *name, const char *const *params, int np,
                                  const kv_layer *L, int P, int sink, int local, int k) {
    return driver_open(d, name, params, np, L, P, sink, local, k, 1, 0);
}

kv_status kv_test_driver_open_half(kv_test_driver *d, const char *name, const char *const *params, int np,
                                   const kv_layer *L, int P, int sink, int local, int k, int use_gpu) {
    return driver_open(d, name, params, np, L, P, sink, local, k, use_gpu, 1);
}

/* The synthetic generator's layer (float32, with values) in one kv_layer. */
kv_status kv_test_synth_layer(int T, int P, int Hq, int Hkv, int D, uint64_t seed, kv_layer *L) {
    kv_synth_spec sp = {.tokens = T, .prefill = P, .q_heads = Hq, .kv_heads = Hkv, .dim = D, .layers = 1,
                        .seed = seed, .half = 0, .with_v = 1};
    kv_synth *s;
    KV_TRY(kv_synth_create(&sp, 0, &s));
    *L = (kv_layer){.Hq = Hq, .Hkv = Hkv, .T = T, .D = D};
    L->q = malloc((size_t)Hq * T * D * sizeof(float));
    L->k = malloc((size_t)Hkv * T * D * sizeof(float));
    L->v = malloc((size_t)Hkv * T * D * sizeof(float));
    if (!L->q || !L->k || !L->v) { kv_synth_destroy(s); kv_layer_free(L); return KV_ERR_NOMEM; }
    kv_synth_rows(s, 0, T, L->q, L->k, L->v);
    kv_synth_destroy(s);
    return KV_OK;
}

/* Appends positions up to t (inclusive) and searches step t into d->sel. */
kv_status kv_test_driver_step(kv_test_driver *d, int t, int k) {
    const kv_layer *L = d->L;
    int D = L->D, T = L->T;
    size_t fs = sizeof(float);
    for (; d->n <= t; d->n++) {
        for (int g = 0; g < L->Hkv; g++) {
            memcpy(d->kr + (size_t)g * D, L->k + ((size_t)g * T + d->n) * D, D * fs);
            if (L->v) memcpy(d->vr + (size_t)g * D, L->v + ((size_t)g * T + d->n) * D, D * fs);
        }
        for (int h = 0; h < L->Hq; h++) memcpy(d->qr + (size_t)h * D, L->q + ((size_t)h * T + d->n) * D, D * fs);
        KV_TRY(d->m->append(d->st, d->n, d->kr, L->v ? d->vr : NULL, d->qr));
    }
    kv_selection_reset(&d->sel);
    return kv_method_search(d->m, d->st, t, d->qr, k, &d->sel);
}

void kv_test_driver_close(kv_test_driver *d) {
    if (d->st) d->m->destroy(d->st);
    kv_selection_free(&d->sel);
    free(d->kr); free(d->vr); free(d->qr);
    memset(d, 0, sizeof *d);
}
