/* pages.h: page summaries shared by Quest (retrievers/quest.c) and FreeKV
 * (retrievers/freekv.c): per kv head, the keys of [sink, ...) are cut into
 * pages of `page` tokens, page j covering [sink + j*page, sink + (j+1)*page);
 * per page and channel the min and max of its keys, written when the page's
 * last token arrives (a running min/max holds the page being filled). The
 * bound sum_i max(q_i*max_i, q_i*min_i) is an upper bound of <q, k> over the
 * page; the group pooling (FreeKV's mean of per-head page softmaxes, or the
 * max of the bounds) and the expansion of chosen pages to tokens live here
 * too, so both methods run one copy of each (bitwise what quest.c did). */
#ifndef KV_PAGES_H
#define KV_PAGES_H

#include "../kernels/quest.h"
#include "kv_retriever.h"

typedef struct {
    int Hkv, D, page, sink;
    int max_pages;      /* pages per kv head at most (T - sink) / page + 1 */
    int npages;         /* full pages summarised */
    float *kmin, *kmax; /* [Hkv][max_pages][D]; NULL when host = 0 (the summaries live on a GPU) */
    float *cmin, *cmax; /* [Hkv][D] running summary of the page being filled */
} kv_pages;

/* host = 0 keeps only the page count (a GPU path holds the summaries). */
kv_status kv_pages_init(kv_pages *p, const kv_shape *sh, int page, int host, const char *who);
void kv_pages_free(kv_pages *p);
/* Position t's keys (kv head g at k + g*head_stride); positions in order. */
void kv_pages_add(kv_pages *p, int t, const float *k, size_t head_stride);
/* Upper bound of <q, k> over keys inside [kmin, kmax] per channel:
 * sum over i (in order) of max(q_i * kmax_i, q_i * kmin_i). */
float kv_pages_bound(const float *q, const float *kmin, const float *kmax, int d);
/* Candidate pages of the region [sink, hi): full pages starting below hi. */
int kv_pages_candidates(const kv_pages *p, int hi);
/* Bounds of pages [0, ncand) of kv head g for query q into out[ncand]. */
void kv_pages_bounds(const kv_pages *p, int g, const float *q, int ncand, float *out);
/* FreeKV's group pooling: out[j] = (1/G) sum over the G rows of bound
 * (row r at bound + r*ld) of softmax_j(scale * bound[r][j]) over j < ncand
 * (max, then the sum of exp in double, rows in order). */
void kv_pages_pool_mean(const float *bound, size_t ld, int G, int ncand, float scale, float *out);
/* out[j] = max over the G rows of bound[r][j]. */
void kv_pages_pool_max(const float *bound, size_t ld, int G, int ncand, float *out);
/* Tokens of the chosen pages inside [.., hi), pages in the given order. */
int kv_pages_expand(const kv_pages *p, const int32_t *pages, int np, int hi, int32_t *out);
/* Region tokens in no full page, [sink + npages*page, hi): out, returns the count. */
int kv_pages_partial(const kv_pages *p, int hi, int32_t *out);
/* Bytes of the summaries (full pages + the running one), all kv heads. */
size_t kv_pages_bytes(const kv_pages *p);
/* The GPU path's summaries (Quest's launcher table) for p's pages: float16
 * when the run's layer is (shape->layer_keys holds float16: every key, so
 * every min and max, is a float16 value exactly, and a search reads half
 * the bytes), else float32. Quest and FreeKV create their device state here. */
kv_status kv_pages_gpu_create(const kv_pages *p, const kv_shape *sh, kv_quest_gpu **out);

#endif
