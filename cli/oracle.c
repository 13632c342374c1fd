/* oracle.c: the exact attention per step (see oracle.h), dispatching to
 * the C reference below or to the GPU launchers in kernels/ops/kv_gpu.h.
 * A score that is not finite (q.k overflows float32, an absurd
 * softmax_scale, an inf in the trace) is an input error naming the trace,
 * layer, query head, step and key position: left alone it would silently
 * drop rows from every mean and make even exact look imperfect. The CPU
 * path checks every score. The GPU path checks m, Z and o_full of each
 * head (a score of +inf or NaN makes m infinite or Z NaN), and, since a
 * score of -inf leaves them finite, bounds every score by Cauchy-Schwarz:
 * |s| <= |q| max_i |k_i| max(scale, 1), which also bounds every partial
 * sum of the dot product; only a head whose bound reaches 1e38 (never, on
 * real data) has its scores computed on the host to decide. Either way the
 * position comes from the C reference scores of that one head. */
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
    double *acc;    /* CPU: [Hq][D] output accumulators */
    int *bad_pos;   /* CPU: [Hq], the first non-finite score's position, or -1 */
    float *row;     /* GPU: one head's scores, computed on the host to locate a non-finite score */
    double *kmax;   /* GPU: [Hkv] the largest key norm of the layer */
    const char *path, *layer; /* for messages */
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
    if (use_gpu) {
        st = kv_gpu_attn_create(L->Hq, L->Hkv, L->T, L->D, L->half, L->k, L->v, &o->gpu);
        if (st == KV_OK && !(o->kmax = kv_calloc((size_t)L->Hkv, sizeof(double), "oracle key norms"))) st = KV_ERR_NOMEM;
        for (int g = 0; st == KV_OK && g < L->Hkv; g++)
            for (int i = 0; i < L->T; i++) {
                const float *k = L->k + ((size_t)g * L->T + i) * L->D;
                double n = 0;
                for (int d = 0; d < L->D; d++) n += (double)k[d] * k[d];
                if (sqrt(n) > o->kmax[g]) o->kmax[g] = sqrt(n);
            }
    }
    else {
        o->scores = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle scores");
        o->scratch = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle scratch");
        o->acc = kv_malloc((size_t)L->Hq * L->D * sizeof(double), "oracle accumulators");
        o->bad_pos = kv_malloc((size_t)L->Hq * sizeof(int), "oracle checks");
        if (!o->scores || !o->scratch || !o->acc || !o->bad_pos) st = KV_ERR_NOMEM;
    }
    if (st != KV_OK) { kv_oracle_destroy(o); return st; }
    *out = o;
    return KV_OK;
}

void kv_oracle_set_context(kv_oracle *o, const char *path, const char *layer) {
    o->path = path;
    o->layer = layer;
}

static kv_status nonfinite(const kv_oracle *o, int t, int h, int pos, float s) {
    return kv_fail(KV_ERR_INPUT, "%s: layer %s, query head %d, step %d: the attention score of key position %d is "
                   "%g (q.k * softmax_scale %g is not finite in float32): the trace's q/k values or its softmax_scale "
                   "are out of range", o->path ? o->path : "trace", o->layer ? o->layer : "?", h, t, pos, s, o->scale);
}

/* Head h of step t on the CPU; returns 0, or 1 with o->bad_pos[h] set when a score is not finite. */
static int step_head_cpu(kv_oracle *o, int t, int h, const float *q) {
    const kv_layer *L = o->L;
    int D = L->D, T = L->T, g = h / o->G, n = t + 1;
    float *s = o->scores + (size_t)h * T;
    const float *K = L->k + (size_t)g * T * D;
    kv_scores_ref(q + (size_t)h * D, K, n, D, o->scale, s);
    o->bad_pos[h] = -1;
    for (int i = 0; i < n; i++)
        if (!isfinite(s[i])) { o->bad_pos[h] = i; return 1; }
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
    if (!L->v) return 0;
    double *acc = o->acc + (size_t)h * D;
    for (int d = 0; d < D; d++) acc[d] = 0;
    const float *V = L->v + (size_t)g * T * D;
    for (int i = 0; i < n; i++) {
        double p = exp((double)s[i] - m) / Z;
        for (int d = 0; d < D; d++) acc[d] += p * V[(size_t)i * D + d];
    }
    for (int d = 0; d < D; d++) o->res.o_full[(size_t)h * D + d] = (float)acc[d];
    return 0;
}

/* After a GPU step: every head's m, Z and output finite, else the error
 * naming the first non-finite score of the first bad head. */
static kv_status check_gpu(kv_oracle *o, int t, const float *q) {
    const kv_layer *L = o->L;
    for (int h = 0; h < L->Hq; h++) {
        int ok = isfinite(o->res.m[h]) && isfinite(o->res.Z[h]) && o->res.Z[h] > 0;
        for (int d = 0; ok && o->res.o_full && d < L->D; d++) ok = isfinite(o->res.o_full[(size_t)h * L->D + d]);
        double qn = 0;
        for (int d = 0; d < L->D; d++) qn += (double)q[(size_t)h * L->D + d] * q[(size_t)h * L->D + d];
        int bounded = sqrt(qn) * o->kmax[h / o->G] * (o->scale > 1 ? o->scale : 1) < 1e38;
        if (ok && bounded) continue;
        if (!o->row && !(o->row = kv_malloc((size_t)L->T * sizeof(float), "oracle check row"))) return KV_ERR_NOMEM;
        kv_scores_ref(q + (size_t)h * L->D, L->k + (size_t)(h / o->G) * L->T * L->D, t + 1, L->D, o->scale, o->row);
        for (int i = 0; i <= t; i++)
            if (!isfinite(o->row[i])) return nonfinite(o, t, h, i, o->row[i]);
        if (ok) continue; /* only the bound was large: every score is finite */
        return kv_fail(KV_ERR_INPUT, "%s: layer %s, query head %d, step %d: the GPU oracle's softmax is not finite "
                       "(max %g, sum %g) although every score is: the trace's values are out of range",
                       o->path ? o->path : "trace", o->layer ? o->layer : "?", h, t, o->res.m[h], o->res.Z[h]);
    }
    return KV_OK;
}

kv_status kv_oracle_step(kv_oracle *o, int t, const float *q, kv_oracle_out *res) {
    const kv_layer *L = o->L;
    if (o->gpu) {
        int lo = o->sink, hi = t + 1 - o->local;
        KV_TRY(kv_gpu_attn_step(o->gpu, t, q, o->scale, lo, hi, o->k, o->res.m, o->res.Z, o->res.thr,
                                o->res.o_full, o->split, o->res.ntop_pre));
        KV_TRY(check_gpu(o, t, q));
    } else {
        int bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
        for (int h = 0; h < L->Hq; h++) bad += step_head_cpu(o, t, h, q);
        for (int h = 0; bad && h < L->Hq; h++)
            if (o->bad_pos[h] >= 0) {
                int i = o->bad_pos[h];
                return nonfinite(o, t, h, i, o->scores[(size_t)h * L->T + i]);
            }
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
    free(o->acc);
    free(o->bad_pos);
    free(o->row);
    free(o->kmax);
    free(o);
}
