/* topk_ref.c: C reference of top-k (a size-k min-heap keyed on
 * (score, -index), O(n log k)) and of the k-th largest value (quickselect).
 * The heap order makes ties deterministic: the smaller index wins. */
#include <stdlib.h>
#include <string.h>

#include "topk.h"

/* a "beats" b: larger score, or equal score and smaller index */
static inline int beats(float sa, int ia, float sb, int ib) { return sa > sb || (sa == sb && ia < ib); }

static void sift_down(float *hv, int32_t *hi, int n, int i) {
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

int kv_topk_ref(const float *scores, int n, int k, int base, int32_t *idx, float *val) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    float *hv = malloc((size_t)k * sizeof *hv);
    int32_t *hi = malloc((size_t)k * sizeof *hi);
    if (!hv || !hi) { free(hv); free(hi); kv_fail(KV_ERR_NOMEM, "top-k scratch (%d)", k); return -1; }
    for (int i = 0; i < k; i++) { hv[i] = scores[i]; hi[i] = i; }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(hv, hi, k, i);
    for (int i = k; i < n; i++)
        if (beats(scores[i], i, hv[0], hi[0])) { hv[0] = scores[i]; hi[0] = i; sift_down(hv, hi, k, 0); }
    /* pop weakest-first into the tail: output strongest-first */
    for (int m = k; m > 0; m--) {
        idx[m - 1] = hi[0] + base;
        if (val) val[m - 1] = hv[0];
        hv[0] = hv[m - 1]; hi[0] = hi[m - 1];
        sift_down(hv, hi, m - 1, 0);
    }
    free(hv);
    free(hi);
    return k;
}

float kv_kth_largest_ref(const float *scores, int n, int k, float *a) {
    memcpy(a, scores, (size_t)n * sizeof *a);
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
