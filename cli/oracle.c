/* oracle.c: the exact attention per step (see oracle.h), dispatching to
 * the C reference below or to the GPU launchers in kernels/kv_gpu.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/kv_gpu.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "oracle.h"

struct kv_oracle {
    const kv_layer *L;
    float scale;
    int sink, local, k, G, split;
    kv_oracle_out res;
    float *scores;  /* CPU: [Hq][T], the current step's rows */
    float *scratch; /* CPU: [Hq][T], one row per head so heads run in parallel */
    kv_gpu_attn *gpu;
};

kv_status kv_oracle_create(const kv_layer *L, float scale, int sink, int local, int k, int split, int use_gpu,
                           kv_oracle **out) {
    kv_oracle *o = kv_calloc(1, sizeof *o, "oracle");
    if (!o) return KV_ERR_NOMEM;
    o->L = L; o->scale = scale; o->sink = sink; o->local = local; o->k = k; o->G = L->Hq / L->Hkv; o->split = split;
    o->res.m = kv_malloc(3 * (size_t)L->Hq * sizeof(float), "oracle results");
    o->res.ntop_pre = kv_malloc(2 * (size_t)L->Hq * sizeof(int), "oracle top-k origin counts");
    if (!o->res.m || !o->res.ntop_pre) { free(o->res.m); free(o->res.ntop_pre); free(o); return KV_ERR_NOMEM; }
    o->res.ntop_gen = o->res.ntop_pre + L->Hq;
    o->res.Z = o->res.m + L->Hq;
    o->res.thr = o->res.Z + L->Hq;
    if (L->v && !(o->res.o_full = kv_malloc((size_t)L->Hq * L->D * sizeof(float), "oracle output"))) {
        kv_oracle_destroy(o);
        return KV_ERR_NOMEM;
    }
    kv_status st = KV_OK;
    if (use_gpu) st = kv_gpu_attn_create(L->Hq, L->Hkv, L->T, L->D, L->half, L->k, L->v, &o->gpu);
    else {
        o->scores = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle scores");
        o->scratch = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle scratch");
        if (!o->scores || !o->scratch) st = KV_ERR_NOMEM;
    }
    if (st != KV_OK) { kv_oracle_destroy(o); return st; }
    *out = o;
    return KV_OK;
}

static void step_head_cpu(kv_oracle *o, int t, int h, const float *q) {
    const kv_layer *L = o->L;
    int D = L->D, T = L->T, g = h / o->G, n = t + 1;
    float *s = o->scores + (size_t)h * T;
    const float *K = L->k + (size_t)g * T * D;
    kv_scores_ref(q + (size_t)h * D, K, n, D, o->scale, s);
    float m = s[0];
    for (int i = 1; i < n; i++) m = s[i] > m ? s[i] : m;
    double Z = 0;
    for (int i = 0; i < n; i++) Z += exp((double)s[i] - m);
    o->res.m[h] = m;
    o->res.Z[h] = (float)Z;
    int lo = o->sink, hi = t + 1 - o->local, kk = o->k < hi - lo ? o->k : hi - lo;
    float thr = kk > 0 ? kv_kth_largest_ref(s + lo, hi - lo, kk, o->scratch + (size_t)h * T) : INFINITY;
    int npre = 0, ngen = 0;
    for (int i = lo; i < hi; i++)
        if (s[i] >= thr) *(i < o->split ? &npre : &ngen) += 1;
    o->res.thr[h] = thr;
    o->res.ntop_pre[h] = npre;
    o->res.ntop_gen[h] = ngen;
    if (!L->v) return;
    double acc[1024];
    for (int d = 0; d < D; d++) acc[d] = 0;
    const float *V = L->v + (size_t)g * T * D;
    for (int i = 0; i < n; i++) {
        double p = exp((double)s[i] - m) / Z;
        for (int d = 0; d < D; d++) acc[d] += p * V[(size_t)i * D + d];
    }
    for (int d = 0; d < D; d++) o->res.o_full[(size_t)h * D + d] = (float)acc[d];
}

kv_status kv_oracle_step(kv_oracle *o, int t, const float *q, kv_oracle_out *res) {
    const kv_layer *L = o->L;
    if (o->gpu) {
        int lo = o->sink, hi = t + 1 - o->local;
        KV_TRY(kv_gpu_attn_step(o->gpu, t, q, o->scale, lo, hi, o->k, o->res.m, o->res.Z, o->res.thr,
                                o->res.o_full, o->split, o->res.ntop_pre));
    } else {
#pragma omp parallel for schedule(static)
        for (int h = 0; h < L->Hq; h++) step_head_cpu(o, t, h, q);
    }
    *res = o->res;
    return KV_OK;
}

kv_status kv_oracle_gather(kv_oracle *o, const int32_t *idx, const int *count, int cap, float *out) {
    if (o->gpu) return kv_gpu_attn_gather(o->gpu, idx, count, cap, out);
    for (int h = 0; h < o->L->Hq; h++) {
        const float *s = o->scores + (size_t)h * o->L->T;
        for (int j = 0; j < count[h]; j++) out[(size_t)h * cap + j] = s[idx[(size_t)h * cap + j]];
    }
    return KV_OK;
}

const char *kv_oracle_device(const kv_oracle *o) { return o->gpu ? "gpu" : "cpu"; }

void kv_oracle_destroy(kv_oracle *o) {
    if (!o) return;
    if (o->gpu) kv_gpu_attn_destroy(o->gpu);
    free(o->res.m);
    free(o->res.ntop_pre);
    free(o->res.o_full);
    free(o->scores);
    free(o->scratch);
    free(o);
}
