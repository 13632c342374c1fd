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
#include <stdio.h>
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
    double *ew;     /* CPU: [Hq][T] exp(s_i - m) of the step, computed once for Z and for the output */
    int *bad_pos;   /* CPU: [Hq], the first non-finite score's position, or -1 */
    float *row;     /* GPU: one head's scores, computed on the host to locate a non-finite score */
    double *kmax;   /* GPU: [Hkv] the largest key norm of the layer */
    const char *path, *layer; /* for messages */
    int *ks, nk, profile;     /* budgets; the budget profile on */
    float *thr_all;           /* [nk][Hq] */
    int *ntop_all;            /* [nk][2][Hq]: prefill, generated */
    float *sorted;            /* [Hq][T]: each head's region, descending (several budgets or the profile) */
    uint32_t *rtmp;           /* [Hq][T]: the radix sort's second buffer (the profile's long sorts) */
    int *unc;                 /* GPU + several budgets or profile: [Hq] heads the host recomputes (attn_eval.cu) */
    int host_eval;            /* GPU, KVBENCH_HOST_EVAL=1: every score to the host, sorts and protocol there (the
                               * reference of the device evaluation) */
    const float *hs;          /* host_eval: the last step's scores [Hq][T] (pinned, owned by the GPU oracle) */
    int hs_n;
    long host_heads;          /* how many it did */
};

const double kv_profile_p[KV_NPROFILE] = {0.5, 0.8, 0.9, 0.95, 0.99};

/* Sorts finite floats descending (the oracle checks every score first):
 * quicksort on the median of three, insertion sort below 24. Equal values
 * are equal numbers (a -0 beside a +0 compares and computes alike), so the
 * result is qsort's (issue 12: qsort's calls through a comparator were 8%
 * of a CPU run). */
static void sort_desc(float *a, int n) {
    while (n > 24) {
        float *m = a + n / 2, *z = a + n - 1, t;
        if (*m > *a) { t = *m; *m = *a; *a = t; }
        if (*z > *m) { t = *z; *z = *m; *m = t; if (*m > *a) { t = *m; *m = *a; *a = t; } }
        float piv = *m;
        int i = 0, j = n - 1;
        for (;;) {
            while (a[i] > piv) i++;
            while (a[j] < piv) j--;
            if (i >= j) break;
            t = a[i]; a[i] = a[j]; a[j] = t;
            i++; j--;
        }
        int left = j + 1; /* [0, left) >= piv >= [left, n) */
        if (left < n - left) { sort_desc(a, left); a += left; n -= left; }
        else { sort_desc(a + left, n - left); n = left; }
    }
    for (int i = 1; i < n; i++) {
        float x = a[i];
        int j = i;
        for (; j > 0 && x > a[j - 1]; j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

/* Sorts finite floats descending by an LSD radix sort on their bits
 * (4 passes of 8 bits; a pass whose digit is the same for all is skipped),
 * tmp: n words. O(n) where sort_desc is O(n log n): the profile's p = 0.99
 * can need most of a region at every step (issue 12: on a 128K-token trace
 * the sorts were most of the GPU run's host time). The order of equal values
 * is all that can differ from sort_desc's, and equal values are equal
 * numbers to every sum and comparison the callers make (-0 and +0 included). */
static void radix_sort_desc(float *a, int n, uint32_t *tmp) {
    uint32_t *u = (uint32_t *)a, *src = u, *dst = tmp;
    size_t cnt[4][256] = {{0}};
    for (int i = 0; i < n; i++) { /* descending floats = ascending keys: a negative keeps its bits (sign set: after
                                     * every positive; larger magnitude later), a positive flips all but the sign */
        uint32_t b = u[i];
        u[i] = b & 0x80000000u ? b : ~b & 0x7fffffffu;
        for (int d = 0; d < 4; d++) cnt[d][(u[i] >> (8 * d)) & 255]++;
    }
    for (int d = 0; d < 4; d++) {
        int sh = 8 * d;
        if (cnt[d][(src[0] >> sh) & 255] == (size_t)n) continue;
        size_t off = 0;
        for (int b = 0; b < 256; b++) { size_t c = cnt[d][b]; cnt[d][b] = off; off += c; }
        for (int i = 0; i < n; i++) dst[cnt[d][(src[i] >> sh) & 255]++] = src[i];
        uint32_t *t = src; src = dst; dst = t;
    }
    for (int i = 0; i < n; i++) { /* back to float bits, into a */
        uint32_t k = src[i];
        u[i] = k & 0x80000000u ? k : ~k & 0x7fffffffu;
    }
}

int kv_profile_head(const float *s, int t, int sink, int local, double m, double Z, const float *sorted,
                    int n_sorted, int *out) {
    int lo = sink, hi = t + 1 - local, n = hi > lo ? hi - lo : 0;
    double cum = 0;
    for (int i = 0; i < t + 1; i++)
        if (i < lo || i >= hi) cum += exp((double)s[i] - m); /* sink and local: attended at any budget */
    int j = 0;
    for (int p = 0; p < KV_NPROFILE; p++) {
        while (j < n && cum < kv_profile_p[p] * Z) {
            if (j == n_sorted) return 1; /* needs more of the order than the caller sorted */
            cum += exp((double)sorted[j++] - m);
        }
        out[p] = j;
    }
    return 0;
}

/* The region's top part that is sorted first: every budget, and (on real
 * traces) the tokens the profile's p = 0.99 needs; a head that needs more
 * gets its whole region sorted. Sorting everything at every step would cost
 * O(n log n) per head where selection is O(n). */
#define KV_PROFILE_FIRST 512

/* Thresholds and origin counts of every budget, and the profile, for head
 * h from its host scores s[0..t] (m, Z: the softmax's, in double). */
static void multi_head(kv_oracle *o, int h, int t, const float *s, double m, double Z) {
    int lo = o->sink, hi = t + 1 - o->local, n = hi > lo ? hi - lo : 0, Hq = o->L->Hq;
    float *srt = o->sorted + (size_t)h * o->L->T;
    int kmax = 0;
    for (int b = 0; b < o->nk; b++) kmax = o->ks[b] > kmax ? o->ks[b] : kmax;
    int top = kmax > KV_PROFILE_FIRST ? kmax : KV_PROFILE_FIRST;
    if (top > n) top = n;
    /* the top `top` scores of the region in srt[0, top) (quickselect partitions around the top-th), sorted */
    if (top > 0 && top < n) kv_kth_largest_ref(s + lo, n, top, srt);
    else if (n > 0) memcpy(srt, s + lo, (size_t)n * sizeof(float));
    sort_desc(srt, top);
    for (int b = 0; b < o->nk; b++) {
        int kk = o->ks[b] < n ? o->ks[b] : n, npre = 0, ngen = 0;
        float thr = kk > 0 ? srt[kk - 1] : INFINITY;
        for (int i = lo; i < hi; i++)
            if (s[i] >= thr) *(i < o->split ? &npre : &ngen) += 1;
        o->thr_all[(size_t)b * Hq + h] = thr;
        o->ntop_all[(size_t)b * 2 * Hq + h] = npre;
        o->ntop_all[(size_t)b * 2 * Hq + Hq + h] = ngen;
    }
    int *bud = o->res.budget + (size_t)h * KV_NPROFILE;
    if (o->profile && kv_profile_head(s, t, o->sink, o->local, m, Z, srt, top, bud)) {
        /* the rest is below every one of the top */
        if (n - top > 4096) radix_sort_desc(srt + top, n - top, o->rtmp + (size_t)h * o->L->T);
        else sort_desc(srt + top, n - top);
        kv_profile_head(s, t, o->sink, o->local, m, Z, srt, n, bud);
    }
}

/* The host's sorted regions (the CPU path; on the GPU path only for a head
 * the device left to the host, allocated then). */
static kv_status alloc_sorted(kv_oracle *o) {
    const kv_layer *L = o->L;
    if (!o->sorted && !(o->sorted = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle sorted regions")))
        return KV_ERR_NOMEM;
    if (o->profile && !o->rtmp && !(o->rtmp = kv_malloc((size_t)L->Hq * L->T * sizeof(uint32_t), "oracle sort buffer")))
        return KV_ERR_NOMEM;
    return KV_OK;
}

kv_status kv_oracle_create(const kv_layer *L, float scale, int sink, int local, int k, int split, int use_gpu,
                           kv_oracle **out) {
    return kv_oracle_create_ks(L, scale, sink, local, &k, 1, split, use_gpu, 0, out);
}

/* Several budgets or the profile: the host needs each head's sorted region. */
static int multi(const kv_oracle *o) { return o->nk > 1 || o->profile; }

kv_status kv_oracle_create_ks(const kv_layer *L, float scale, int sink, int local, const int *ks, int nk, int split,
                              int use_gpu, int profile, kv_oracle **out) {
    kv_oracle *o = kv_calloc(1, sizeof *o, "oracle");
    if (!o) return KV_ERR_NOMEM;
    o->L = L; o->scale = scale; o->sink = sink; o->local = local; o->k = ks[0]; o->G = L->Hq / L->Hkv; o->split = split;
    o->nk = nk; o->profile = profile;
    o->res.m = kv_malloc(2 * (size_t)L->Hq * sizeof(float), "oracle results");
    o->thr_all = kv_malloc((size_t)nk * L->Hq * sizeof(float), "oracle thresholds");
    o->ntop_all = kv_malloc(2 * (size_t)nk * L->Hq * sizeof(int), "oracle top-k origin counts");
    o->ks = kv_malloc((size_t)nk * sizeof(int), "oracle budgets");
    if (!o->res.m || !o->thr_all || !o->ntop_all || !o->ks) { kv_oracle_destroy(o); return KV_ERR_NOMEM; }
    memcpy(o->ks, ks, (size_t)nk * sizeof(int));
    o->res.Z = o->res.m + L->Hq;
    o->res.thr = o->thr_all;
    o->res.ntop_pre = o->ntop_all;
    o->res.ntop_gen = o->ntop_all + L->Hq;
    if (profile && !(o->res.budget = kv_malloc((size_t)L->Hq * KV_NPROFILE * sizeof(int), "oracle budget profile"))) {
        kv_oracle_destroy(o);
        return KV_ERR_NOMEM;
    }
    if (multi(o) && !use_gpu && alloc_sorted(o) != KV_OK) {
        kv_oracle_destroy(o);
        return KV_ERR_NOMEM;
    }
    if ((L->v || L->v16) && !(o->res.o_full = kv_malloc((size_t)L->Hq * L->D * sizeof(float), "oracle output"))) {
        kv_oracle_destroy(o);
        return KV_ERR_NOMEM;
    }
    kv_status st = KV_OK;
    if (use_gpu) {
        st = kv_layer_is_f16(L) ? kv_gpu_attn_create_half(L->Hq, L->Hkv, L->T, L->D, L->k16, L->v16, &o->gpu)
                                : kv_gpu_attn_create(L->Hq, L->Hkv, L->T, L->D, L->half, L->k, L->v, &o->gpu);
        if (st == KV_OK && !(o->kmax = kv_calloc((size_t)L->Hkv, sizeof(double), "oracle key norms"))) st = KV_ERR_NOMEM;
        float *tmp = st == KV_OK ? kv_malloc((size_t)L->D * sizeof(float), "oracle key row") : NULL;
        if (st == KV_OK && !tmp) st = KV_ERR_NOMEM;
        for (int g = 0; st == KV_OK && g < L->Hkv; g++)
            for (int i = 0; i < L->T; i++) {
                const float *k = kv_layer_row(L, 'k', g, i, tmp); /* either form (issue 12 goal 3) */
                double n = 0;
                for (int d = 0; d < L->D; d++) n += (double)k[d] * k[d];
                if (sqrt(n) > o->kmax[g]) o->kmax[g] = sqrt(n);
            }
        free(tmp);
    }
    else if (kv_layer_is_f16(L)) st = kv_fail(KV_ERR_INTERNAL, "the CPU oracle reads a float32 layer (kv_layer_widen)");
    else {
        o->scores = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle scores");
        o->scratch = kv_malloc((size_t)L->Hq * L->T * sizeof(float), "oracle scratch");
        o->acc = kv_malloc((size_t)L->Hq * L->D * sizeof(double), "oracle accumulators");
        o->ew = kv_malloc((size_t)L->Hq * L->T * sizeof(double), "oracle softmax terms");
        o->bad_pos = kv_malloc((size_t)L->Hq * sizeof(int), "oracle checks");
        if (!o->scores || !o->scratch || !o->acc || !o->ew || !o->bad_pos) st = KV_ERR_NOMEM;
    }
    if (st == KV_OK && o->gpu) { /* the evaluation on the device, or (KVBENCH_HOST_EVAL=1, the reference) the host */
        o->host_eval = kv_env_is1("KVBENCH_HOST_EVAL");
        if (multi(o)) st = o->host_eval ? alloc_sorted(o) : kv_gpu_attn_multi_init(o->gpu, ks, nk, profile);
        if (st == KV_OK && multi(o) && !(o->unc = kv_malloc((size_t)L->Hq * sizeof(int), "oracle heads"))) st = KV_ERR_NOMEM;
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
    double Z = 0, *ew = o->ew + (size_t)h * T;
    for (int i = 0; i < n; i++) Z += ew[i] = exp((double)s[i] - m);
    o->res.m[h] = m;
    o->res.Z[h] = (float)Z;
    if (multi(o)) multi_head(o, h, t, s, m, Z);
    else {
        int lo = o->sink, hi = t + 1 - o->local, kk = o->k < hi - lo ? o->k : hi - lo;
        float thr = kk > 0 ? kv_kth_largest_ref(s + lo, hi - lo, kk, o->scratch + (size_t)h * T) : INFINITY;
        int npre = 0, ngen = 0;
        for (int i = lo; i < hi; i++)
            if (s[i] >= thr) *(i < o->split ? &npre : &ngen) += 1;
        o->res.thr[h] = thr;
        o->res.ntop_pre[h] = npre;
        o->res.ntop_gen[h] = ngen;
    }
    if (!L->v) return 0;
    double *acc = o->acc + (size_t)h * D;
    for (int d = 0; d < D; d++) acc[d] = 0;
    const float *V = L->v + (size_t)g * T * D;
    for (int i = 0; i < n; i++) kv_acc_row(acc, ew[i] / Z, V + (size_t)i * D, D);
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
        const float *K = L->k ? L->k + (size_t)(h / o->G) * L->T * L->D : NULL;
        float *K32 = NULL; /* the float16 form: this head's keys widened (a rare path) */
        if (!K && !(K = K32 = kv_malloc((size_t)(t + 1) * L->D * sizeof(float), "oracle check keys"))) return KV_ERR_NOMEM;
        if (K32) kv_half_to_float_n(L->k16 + (size_t)(h / o->G) * L->T * L->D, K32, (size_t)(t + 1) * L->D);
        kv_scores_ref(q + (size_t)h * L->D, K, t + 1, L->D, o->scale, o->row);
        free(K32);
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
        /* several budgets or the profile on the device: no threshold of the step's own (k = 0) */
        int dev = multi(o) && !o->host_eval;
        KV_TRY(kv_gpu_attn_step(o->gpu, t, q, o->scale, lo, hi, dev ? 0 : o->k, o->res.m, o->res.Z, o->res.thr,
                                o->res.o_full, o->split, dev ? NULL : o->res.ntop_pre));
        KV_TRY(check_gpu(o, t, q));
        if (multi(o) && o->host_eval) {
            /* every score of the step to the host in one copy, then the CPU's
             * sort, heads in parallel (the path before issue 12's device
             * evaluation); the protocol's gathers read the same copy */
            int n = 0;
            KV_TRY(kv_gpu_attn_scores(o->gpu, &o->hs, &n));
            o->hs_n = n;
#pragma omp parallel for schedule(dynamic, 1)
            for (int h = 0; h < L->Hq; h++) {
                const float *s = o->hs + (size_t)h * L->T;
                double m = s[0], Z = 0;
                for (int i = 1; i <= t; i++) m = s[i] > m ? s[i] : m;
                for (int i = 0; i <= t; i++) Z += exp((double)s[i] - m);
                multi_head(o, h, t, s, m, Z);
            }
        } else if (multi(o)) {
            /* issue 12: the thresholds, origin counts and profile from a sort on
             * the device (kernels/ops/attn_eval.cu; the thresholds are the GPU's
             * own scores, the k-th of the numbers the protocol compares); a head
             * whose profile sums fall within their rounding bound of a target is
             * redone here from its scores with the host's arithmetic */
            KV_TRY(kv_gpu_attn_multi(o->gpu, lo, hi, o->split, kv_profile_p, o->thr_all, o->ntop_all,
                                     o->profile ? o->res.budget : NULL, o->unc));
            for (int h = 0; h < L->Hq; h++) {
                if (!o->unc[h]) continue;
                if (!o->row && !(o->row = kv_malloc((size_t)L->T * sizeof(float), "oracle check row"))) return KV_ERR_NOMEM;
                KV_TRY(alloc_sorted(o));
                KV_TRY(kv_gpu_attn_row(o->gpu, h, o->row));
                const float *s = o->row;
                double m = s[0], Z = 0;
                for (int i = 1; i <= t; i++) m = s[i] > m ? s[i] : m;
                for (int i = 0; i <= t; i++) Z += exp((double)s[i] - m);
                multi_head(o, h, t, s, m, Z);
                o->host_heads++;
            }
        }
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
    if (o->gpu && o->hs) { /* the host copy of the GPU's scores (KVBENCH_HOST_EVAL=1, several budgets or the profile) */
        for (int h = 0; h < o->L->Hq; h++) {
            const float *s = o->hs + (size_t)h * o->L->T;
            for (int j = 0; j < count[h]; j++) {
                int32_t i = idx[(size_t)h * cap + j];
                if (i < 0 || i >= o->hs_n)
                    return kv_fail(KV_ERR_INTERNAL, "GPU oracle: gather of position %d outside the last step's [0, %d)",
                                   i, o->hs_n);
                out[(size_t)h * cap + j] = s[i];
            }
        }
        return KV_OK;
    }
    if (o->gpu) return kv_gpu_attn_gather(o->gpu, idx, count, cap, out);
    for (int h = 0; h < o->L->Hq; h++) {
        const float *s = o->scores + (size_t)h * o->L->T;
        for (int j = 0; j < count[h]; j++) out[(size_t)h * cap + j] = s[idx[(size_t)h * cap + j]];
    }
    return KV_OK;
}

void kv_oracle_view(const kv_oracle *o, int i, kv_oracle_out *res) {
    int Hq = o->L->Hq;
    *res = o->res;
    res->thr = o->thr_all + (size_t)i * Hq;
    res->ntop_pre = o->ntop_all + (size_t)i * 2 * Hq;
    res->ntop_gen = res->ntop_pre + Hq;
}

const char *kv_oracle_device(const kv_oracle *o) { return o->gpu ? "gpu" : "cpu"; }

long kv_oracle_host_heads(const kv_oracle *o) { return o->host_heads; }

int kv_oracle_device_eval(const kv_oracle *o) { return o->gpu && !o->host_eval; }

const kv_gpu_keys *kv_oracle_gpu_keys(const kv_oracle *o) { return o->gpu ? kv_gpu_attn_keys(o->gpu) : NULL; }

void kv_oracle_gpu_times(const kv_oracle *o, double *step_s, double *eval_s, double *diag_s) {
    *step_s = *eval_s = *diag_s = 0;
    if (o->gpu) kv_gpu_attn_times(o->gpu, step_s, eval_s, diag_s);
}

kv_status kv_oracle_diag_slots(kv_oracle *o, int n) {
    if (!kv_oracle_device_eval(o)) return kv_fail(KV_ERR_INTERNAL, "device diagnostics without the device evaluation");
    return kv_gpu_attn_diag_slots(o->gpu, n);
}

kv_status kv_oracle_diag(kv_oracle *o, int slot, const kv_gpu_diag_in *in) {
    if (!o->gpu) return kv_fail(KV_ERR_INTERNAL, "device diagnostics without the GPU oracle");
    return kv_gpu_attn_diag(o->gpu, slot, in);
}

kv_status kv_oracle_diag_flush(kv_oracle *o) { return o->gpu ? kv_gpu_attn_diag_flush(o->gpu) : KV_OK; }

kv_status kv_oracle_diag_wait(kv_oracle *o) { return o->gpu ? kv_gpu_attn_diag_wait(o->gpu) : KV_OK; }

const kv_gpu_diag_row *kv_oracle_diag_take(kv_oracle *o, int slot, int *t, float *metric) {
    return o->gpu ? kv_gpu_attn_diag_take(o->gpu, slot, t, metric) : NULL;
}

void kv_oracle_destroy(kv_oracle *o) {
    if (!o) return;
    if (o->gpu) kv_gpu_attn_destroy(o->gpu);
    free(o->res.m);
    free(o->res.budget);
    free(o->thr_all);
    free(o->ntop_all);
    free(o->ks);
    free(o->sorted);
    free(o->rtmp);
    free(o->res.o_full);
    free(o->scores);
    free(o->scratch);
    free(o->acc);
    free(o->ew);
    free(o->bad_pos);
    free(o->row);
    free(o->kmax);
    free(o->unc);
    free(o);
}
