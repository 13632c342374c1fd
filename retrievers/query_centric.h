/* query_centric.h: the numerical pieces of the two query-centric
 * retrievers, CSAttention (csattention.c) and CTKVR (ctkvr.c), exported so
 * tests/test_csattention.c and tests/test_ctkvr.c can check each against a
 * brute force of their own, and read-only views of a built index. The
 * vtables are reached through the registry like every other method. */
#ifndef KV_QUERY_CENTRIC_H
#define KV_QUERY_CENTRIC_H

#include "kv_retriever.h"

/* ---- CSAttention ---- */
enum { KV_CS_MISSING_ZERO = 0, KV_CS_MISSING_MIN = 1 };

/* x[i*ld .. i*ld+d) scaled to unit norm into out[i*d ..] (a zero vector stays zero). */
void kv_cs_normalise(const float *x, int n, int ld, int d, float *out);
/* Cosine k-means of n unit (or zero) points x [n][d] into C unit centroids
 * cent [C][d]: k-means++ seeding from a generator seeded by `seed` (first
 * centre uniform, then proportional to the squared distance to the nearest
 * centre, in double), then `iters` Lloyd rounds (assign by the largest
 * kv_dot_ref, ties to the smaller centroid; centre = normalised sum of its
 * points, in double; an empty cluster keeps its centre). n = 0: zeros. */
kv_status kv_cs_kmeans(const float *x, int n, int d, int C, int iters, uint64_t seed, float *cent);
/* Index of the centroid of cent [C][d] with the largest kv_dot_ref with x (ties: smaller index). */
int kv_cs_nearest(const float *x, const float *cent, int C, int d);
/* Reduce-by-key of m lists (list b: idx[b][0..cnt[b]), val[b][..]): the
 * union U of the keys in [lo, hi) in first-seen order (lists in order b =
 * 0..m-1) to u (returns |U|), and acc[i] for every i in U (acc is indexed
 * by key position) = the sum over b in order of w_b * (val_b[i] when i is
 * in list b, else 0 (missing = zero) or the minimum of list b's values
 * (missing = min; 0 for an empty list)); w NULL: w_b = 1 (and no product). stamp/tmp: scratch indexed by position
 * (stamp zeroed before the first call; *epoch carried between calls). */
int kv_cs_reduce(int m, const int32_t *const *idx, const float *const *val, const int *cnt, const float *w, int lo,
                 int hi, int missing, int32_t *u, float *acc, float *tmp, int *stamp, int *epoch);

typedef struct {
    int m, C, ds, L, n;          /* n: positions seen */
    const float *cent;           /* [Hkv][m][C][ds], unit rows */
    const int32_t *lidx;         /* [Hkv][m][C][L] (a min-heap on (value, -index): root = weakest) */
    const float *lval;           /* [Hkv][m][C][L] */
    const int *lcnt;             /* [Hkv][m][C] entries used */
} kv_cs_view;
void kv_csattention_view(const void *state, kv_cs_view *out);

/* ---- CTKVR ---- */
/* Positions of the C query centroids among P prefill positions, ascending:
 * choice 0 final (P-C .. P-1), 1 init (0 .. C-1), 2 random (C distinct
 * positions from a generator seeded by `seed`), 3 equi (floor((2j+1)P/(2C))). */
void kv_ctkvr_positions(int choice, int P, int C, uint64_t seed, int32_t *pos);

typedef struct {
    int C, rho, cp, n, next;     /* next: FIFO slot the next DCU insertion replaces */
    const float *cq;             /* [C][Hq][D]: the centroid queries (slot-major) */
    const int32_t *cpos;         /* [C]: position of each slot's query (-1: none) */
    const int32_t *lidx;         /* [Hkv][C][rho]: each slot's list, best first */
    const int *lcnt;             /* [Hkv][C] */
} kv_ctkvr_view;
void kv_ctkvr_view_of(const void *state, kv_ctkvr_view *out);

#endif
