/* topk_ref.c: C reference of top-k and of the k-th largest value
 * (quickselect). The order is a total one on (score, -index), so the
 * result is unique: larger score first, the smaller index among ties.
 * Two routes to it (issue 12: the heap was the CPU run's largest single
 * cost): for k small against n, the k-th largest value by quickselect,
 * then one pass keeping every score above it and the first (smallest
 * index) ties, then a sort of those k by the order; otherwise (or when a
 * score is NaN, which the order does not rank) a size-k min-heap, O(n log
 * k). Both give the same indices and values: tests topk_ref_matches_sort
 * and topk_routes_agree. */
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "topk.h"

#define beats kv_beats

void kv_heap_down(float *hv, int32_t *hi, int n, int i) {
    for (;;) { /* min-heap on "beats": the root is the weakest kept */
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && beats(hv[m], hi[m], hv[l], hi[l])) m = l;
        if (r < n && beats(hv[m], hi[m], hv[r], hi[r])) m = r;
        if (m == i) return;
        float tv = hv[i]; hv[i] = hv[m]; hv[m] = tv;
        int32_t ti = hi[i]; hi[i] = hi[m]; hi[m] = ti;
        i = m;
    }
}

void kv_heap_up(float *hv, int32_t *hi, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!beats(hv[p], hi[p], hv[i], hi[i])) return; /* the parent is already the weaker */
        float tv = hv[i]; hv[i] = hv[p]; hv[p] = tv;
        int32_t ti = hi[i]; hi[i] = hi[p]; hi[p] = ti;
        i = p;
    }
}

typedef struct { float v; int32_t i; } kv_vi;

/* (v, i) pairs strongest first: insertion sort for short runs, else quicksort on the median of three. */
static void sort_vi(kv_vi *a, int n) {
    while (n > 24) {
        kv_vi *m = a + n / 2, *z = a + n - 1, t;
#define KV_BEATS(x, y) beats((x).v, (x).i, (y).v, (y).i)
#define KV_SWAP(x, y) (t = (x), (x) = (y), (y) = t)
        if (KV_BEATS(*m, *a)) KV_SWAP(*m, *a);
        if (KV_BEATS(*z, *m)) { KV_SWAP(*z, *m); if (KV_BEATS(*m, *a)) KV_SWAP(*m, *a); }
        kv_vi piv = *m;
        int i = 0, j = n - 1;
        for (;;) { /* the pairs are distinct (distinct indices): no element equals the pivot but itself */
            while (KV_BEATS(a[i], piv)) i++;
            while (KV_BEATS(piv, a[j])) j--;
            if (i >= j) break;
            KV_SWAP(a[i], a[j]);
            i++; j--;
        }
        /* [0, j] beat-or-equal piv, [j+1, n) do not beat it: sort the smaller side by recursion */
        int left = j + 1;
        if (left < n - left) { sort_vi(a, left); a += left; n -= left; }
        else { sort_vi(a + left, n - left); n = left; }
    }
    for (int i = 1; i < n; i++) {
        kv_vi x = a[i];
        int j = i;
        for (; j > 0 && KV_BEATS(x, a[j - 1]); j--) a[j] = a[j - 1];
        a[j] = x;
    }
#undef KV_BEATS
#undef KV_SWAP
}

/* The quickselect route; returns -2 when a score is NaN (the heap route then decides), else as kv_topk_ref. */
static int topk_select(const float *scores, int n, int k, int base, int32_t *idx, float *val) {
    float *a = malloc((size_t)n * sizeof *a);
    kv_vi *p = malloc((size_t)k * sizeof *p);
    if (!a || !p) { free(a); free(p); kv_fail(KV_ERR_NOMEM, "top-k scratch (%d)", n); return -1; }
    for (int i = 0; i < n; i++)
        if (scores[i] != scores[i]) { free(a); free(p); return -2; }
    float thr = kv_kth_largest_ref(scores, n, k, a);
    int above = 0;
    for (int i = 0; i < n; i++) above += scores[i] > thr;
    int ties = k - above, c = 0;
    for (int i = 0; i < n; i++) {
        float x = scores[i];
        if (x > thr || (x == thr && ties-- > 0)) { p[c].v = x; p[c].i = i; c++; }
    }
    sort_vi(p, c);
    for (int j = 0; j < c; j++) {
        idx[j] = p[j].i + base;
        if (val) val[j] = p[j].v;
    }
    free(a);
    free(p);
    return c;
}

int kv_topk_ref(const float *scores, int n, int k, int base, int32_t *idx, float *val) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    if (n >= 64 && k <= n / 4) {
        int c = topk_select(scores, n, k, base, idx, val);
        if (c != -2) return c;
    }
    return kv_topk_heap_ref(scores, n, k, base, idx, val);
}

int kv_topk_heap_ref(const float *scores, int n, int k, int base, int32_t *idx, float *val) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    float *hv = malloc((size_t)k * sizeof *hv);
    int32_t *hi = malloc((size_t)k * sizeof *hi);
    if (!hv || !hi) { free(hv); free(hi); kv_fail(KV_ERR_NOMEM, "top-k scratch (%d)", k); return -1; }
    for (int i = 0; i < k; i++) { hv[i] = scores[i]; hi[i] = i; }
    for (int i = k / 2 - 1; i >= 0; i--) kv_heap_down(hv, hi, k, i);
    for (int i = k; i < n; i++)
        if (beats(scores[i], i, hv[0], hi[0])) { hv[0] = scores[i]; hi[0] = i; kv_heap_down(hv, hi, k, 0); }
    /* pop weakest-first into the tail: output strongest-first */
    for (int m = k; m > 0; m--) {
        idx[m - 1] = hi[0] + base;
        if (val) val[m - 1] = hv[0];
        hv[0] = hv[m - 1]; hi[0] = hi[m - 1];
        kv_heap_down(hv, hi, m - 1, 0);
    }
    free(hv);
    free(hi);
    return k;
}

/* Quickselect on a (modified in place): the k-th largest, a[0, k) the k largest. */
static float kth_quickselect(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) { float t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want];
    }
    return a[want];
}

/* Order-preserving key of a float (-0 keyed as +0: the two are one value). */
static inline uint32_t fkey(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* The k-th largest; a becomes a permutation of the scores with the k
 * largest in a[0, k) (oracle.c sorts them next, and the rest a[k, n) only
 * when its budget profile needs more). Radix select (issue 12, goal 5: quickselect's
 * unpredictable branches were 6-11% of a CPU run): a histogram of the key's
 * top 11 bits over the scores finds the bin holding the k-th; one pass
 * copies the bins above it to a[0, g), the bin to a[g, g + c) and the bins
 * below it to a[g + c, n); the bin is
 * then split on the next 11 and the last 10 bits by in-place three-way
 * partitions. The candidates left share one key, so one value: the same
 * value and the same multiset a[0, k) as any exact selection. Short inputs
 * keep quickselect. */
float kv_kth_largest_ref(const float *scores, int n, int k, float *a) {
    if (n < 512) {
        memcpy(a, scores, (size_t)n * sizeof *a);
        return kth_quickselect(a, n, k);
    }
    unsigned hist[2048];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < n; i++) hist[fkey(scores[i]) >> 21]++;
    int want = k, b = 2047;
    while (hist[b] < (unsigned)want) want -= hist[b--];
    int g = 0, c = 0, l = n, gk = k - want; /* gk scores lie in bins above b */
    for (int i = 0; i < n; i++) {
        uint32_t d = fkey(scores[i]) >> 21;
        if (d > (uint32_t)b) a[g++] = scores[i];
        else if (d == (uint32_t)b) a[gk + c++] = scores[i];
        else a[--l] = scores[i];
    }
    static const int shift[2] = {10, 0}, bits[2] = {11, 10};
    for (int lv = 0; lv < 2 && c > 1; lv++) {
        unsigned mask = (1u << bits[lv]) - 1;
        memset(hist, 0, sizeof hist);
        float *x = a + g;
        for (int i = 0; i < c; i++) hist[(fkey(x[i]) >> shift[lv]) & mask]++;
        int w = want, bb = (int)mask;
        while (hist[bb] < (unsigned)w) w -= hist[bb--];
        /* three-way partition of x[0, c): digit > bb | == bb | < bb */
        int lt = 0, i = 0, gt = c;
        while (i < gt) {
            uint32_t d = (fkey(x[i]) >> shift[lv]) & mask;
            if (d > (uint32_t)bb) { float t = x[i]; x[i++] = x[lt]; x[lt++] = t; }
            else if (d < (uint32_t)bb) { float t = x[i]; x[i] = x[--gt]; x[gt] = t; }
            else i++;
        }
        g += lt;
        c = gt - lt;
        want = w;
    }
    return a[k - 1];
}
