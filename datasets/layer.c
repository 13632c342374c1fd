/* layer.c: the two host forms of a loaded layer (kv_trace.h, issue 12 goal
 * 3). A float16 trace kept as float16 holds half the bytes of its float32
 * copy (at 1M tokens, 16 q and 8 kv heads, D 128: 8.6 GB instead of
 * 17.2); the GPU takes the bits as they are and the host converts one row
 * at a time where it needs float32 (the step's q/k/v rows, the protocol's
 * attended values, the oracle's key norms), which costs one F16C
 * instruction per 8 values. The CPU path widens the layer to float32 once
 * (kv_layer_widen): its oracle and methods read whole arrays at every step. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv_trace.h"

static void arrays(const kv_layer *L, char which, const float **f, const uint16_t **h, int *H) {
    *f = which == 'q' ? L->q : which == 'k' ? L->k : L->v;
    *h = which == 'q' ? L->q16 : which == 'k' ? L->k16 : L->v16;
    *H = which == 'q' ? L->Hq : L->Hkv;
}

void kv_layer_rows(const kv_layer *L, char which, int t, float *out) {
    const float *f;
    const uint16_t *h16;
    int H, D = L->D;
    arrays(L, which, &f, &h16, &H);
    for (int h = 0; h < H; h++) {
        size_t off = ((size_t)h * L->T + t) * D;
        if (h16) kv_half_to_float_n(h16 + off, out + (size_t)h * D, (size_t)D);
        else memcpy(out + (size_t)h * D, f + off, (size_t)D * sizeof(float));
    }
}

const float *kv_layer_row(const kv_layer *L, char which, int h, int t, float *tmp) {
    const float *f;
    const uint16_t *h16;
    int H;
    arrays(L, which, &f, &h16, &H);
    size_t off = ((size_t)h * L->T + t) * L->D;
    if (!h16) return f + off;
    kv_half_to_float_n(h16 + off, tmp, (size_t)L->D);
    return tmp;
}

static float *widen(const uint16_t *src, size_t n, const char *what) {
    float *d = kv_malloc(n * sizeof(float) + 1, what);
    if (!d) return NULL;
    const size_t piece = (size_t)1 << 20;
    long long np = (long long)((n + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (np > 1)
    for (long long p = 0; p < np; p++) {
        size_t e0 = (size_t)p * piece, ne = n - e0 < piece ? n - e0 : piece;
        kv_half_to_float_n(src + e0, d + e0, ne);
    }
    return d;
}

kv_status kv_layer_widen(kv_layer *L) {
    if (!L->k16) return KV_OK;
    size_t nq = (size_t)L->Hq * L->T * L->D, nk = (size_t)L->Hkv * L->T * L->D;
    /* one array at a time, each float16 array freed once widened: the peak is the float32 layer plus one array */
    if (!(L->q = widen(L->q16, nq, "layer queries (float32)"))) return KV_ERR_NOMEM;
    free(L->q16); L->q16 = NULL;
    if (!(L->k = widen(L->k16, nk, "layer keys (float32)"))) return KV_ERR_NOMEM;
    free(L->k16); L->k16 = NULL;
    if (L->v16) {
        if (!(L->v = widen(L->v16, nk, "layer values (float32)"))) return KV_ERR_NOMEM;
        free(L->v16); L->v16 = NULL;
    }
    return KV_OK;
}

double kv_layer_bytes(const kv_layer *L) {
    double e = L->k16 ? 2 : 4, nv = L->v || L->v16 ? 1 : 0;
    return e * L->T * L->D * ((double)L->Hq + L->Hkv * (1 + nv));
}
