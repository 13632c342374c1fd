/* topk.h: top-k selection, the primitive every retriever and the oracle
 * share. The C reference (topk_ref.c) defines the order every
 * implementation must reproduce: larger score first, and among equal
 * scores the smaller index first, so a selection is a deterministic
 * function of the scores. GPU launchers are declared in kv_gpu.h. */
#ifndef KV_TOPK_H
#define KV_TOPK_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Top min(k, n) of scores[0..n) in the documented order; idx[j] are
 * positions in [0, n) plus `base`. val may be NULL. Returns the count. */
int kv_topk_ref(const float *scores, int n, int k, int base, int32_t *idx, float *val);
/* The same by a size-k heap alone (kv_topk_ref's other route; for tests). */
int kv_topk_heap_ref(const float *scores, int n, int k, int base, int32_t *idx, float *val);

/* The order: a "beats" b when its score is larger, or equal with a smaller index. */
static inline int kv_beats(float sa, int ia, float sb, int ib) { return sa > sb || (sa == sb && ia < ib); }
/* A heap of (score hv[i], index hi[i]) pairs with the weakest at the root (a size-k top-k's kept set):
 * sift entry i down among n, or up. */
void kv_heap_down(float *hv, int32_t *hi, int n, int i);
void kv_heap_up(float *hv, int32_t *hi, int i);

/* The k-th largest of scores[0..n) (1 <= k <= n), via a copy in `scratch` (n floats). */
float kv_kth_largest_ref(const float *scores, int n, int k, float *scratch);

#ifdef __cplusplus
}
#endif
#endif
