/* pariskv_codec.h: the building blocks of the ParisKV retriever (pariskv.c),
 * exposed so tests/test_pariskv.c can check each one against an
 * independent computation: the Lloyd-Max magnitude quantiser, the SRHT
 * rotation, the 4-bit encoder and RSQ-IP estimator, the collision tier
 * weights and the bucket top-k, Stage I's candidate count and the device
 * index's configuration. Implemented in pariskv_codec.c; the vtable, the
 * decode-time logic and the GPU glue are in pariskv.c. */
#ifndef KV_PARISKV_CODEC_H
#define KV_PARISKV_CODEC_H

#include <stdint.h>

#include "../kernels/ops/bf16.h"
#include "../kernels/pariskv.h"
#include "kv_retriever.h"

#define KV_PARISKV_LEVELS 8 /* 3-bit magnitude */
#define KV_PARISKV_MAX_M 8  /* centroid ids are bytes: 2^m <= 256 */

/* Lloyd-Max quantiser of |u_j| (u uniform on S^{m-1}; density
 * proportional to (1-x^2)^((m-3)/2) on [0, 1]), 2 <= m <= 8, computed by
 * numerical integration. converged = 0: the released procedure (quantile
 * thresholds, then 100 iterations of centres <- conditional means,
 * thresholds <- midpoints; the centres returned are those of the last
 * iteration and the thresholds their midpoints). converged = 1: iterate to
 * the fixed point. Returns the number of iterations run. */
int kv_pariskv_lloyd(int m, int converged, double level[KV_PARISKV_LEVELS], double thr[KV_PARISKV_LEVELS - 1]);
/* E[(X - Q(X))^2] of that quantiser (same quadrature). */
double kv_pariskv_lloyd_mse(int m, const double level[KV_PARISKV_LEVELS], const double thr[KV_PARISKV_LEVELS - 1]);

/* The shared transform and 4-bit codec of one layer. */
typedef struct {
    int d;          /* head dim */
    int dp;         /* transformed dim: next power of two of d with SRHT, d without */
    int m, nb;      /* subspace dim and count (dp = nb * m) */
    int code_bytes; /* ceil(dp / 2): two 4-bit codes per byte, coordinate c at byte c/2, high nibble if c odd */
    int rotate, normalize;
    float *signs;   /* [dp] the SRHT's random +-1 diagonal (NULL without rotation) */
    float level[KV_PARISKV_LEVELS], thr[KV_PARISKV_LEVELS - 1];
} kv_pariskv_codec;

/* KV_ERR_INPUT when m does not divide dp. */
kv_status kv_pariskv_codec_init(kv_pariskv_codec *c, int d, int m, int rotate, int normalize, int lloyd_converged,
                                uint64_t seed);
void kv_pariskv_codec_free(kv_pariskv_codec *c);

/* In-place orthonormal fast Walsh-Hadamard transform (Sylvester order,
 * scale 1/sqrt(n)); n a power of two. */
void kv_pariskv_fwht(float *x, int n);
/* out[dp] = R * (x / |x|) (normalisation and rotation as configured; x
 * zero-padded to dp). Returns |x| (the norm the estimator multiplies back,
 * 1 when normalisation is off). */
float kv_pariskv_transform(const kv_pariskv_codec *c, const float *x, float *out);

/* Encodes one key: sign-pattern centroid id per subspace (bit j set iff
 * u_j >= 0), the 4-bit codes, and w_b = |k| r_b / alpha_b with
 * alpha_b = sum_j level[t_j] |u_j| (alpha clamped at 1e-6 as the released
 * code), computed in float32 and stored as bf16 (round to nearest even,
 * kernels/ops/bf16.h), as the released code stores it. `xt` is dp floats
 * of scratch and receives the transformed key. */
void kv_pariskv_encode(const kv_pariskv_codec *c, const float *k, uint8_t *ids, uint8_t *code, kv_bf16 *w, float *xt);

/* Per-query lookup table: lut[c*16 + nibble] = qt[c] * sign * level[mag]
 * for coordinate c of the transformed query (dp*16 floats). */
void kv_pariskv_query_lut(const kv_pariskv_codec *c, const float *qt, float *lut);
/* RSQ-IP: |q| * sum_b w_b <v_b, q~_b>, accumulated in float in subspace
 * order (each bf16 weight widened exactly to float32). */
float kv_pariskv_rsqip(const kv_pariskv_codec *c, const float *lut, const uint8_t *code, const kv_bf16 *w, float qnorm);

/* Stage I, one subspace: given the proxy score of each of the nc
 * centroids and the number of searchable keys assigned to each, ranks the
 * centroids (larger score first, smaller id among equal scores), walks them
 * in rank order and gives each centroid its bonus: multi = 1: the number
 * of the 6 cumulative tiers (targets ceil(n*rho*f), f = .05 .15 .30 .50
 * .75 1) whose target exceeds the keys ranked before it (so 6..1, 0
 * outside); multi = 0: 1 if the keys before it are below ceil(n*rho), else
 * 0. `order` is nc ints of scratch. */
void kv_pariskv_tier_weights(const float *cscore, const int32_t *count, int nc, int n, double rho, int multi,
                             uint8_t *wt, int *order);

/* Bucket top-c of small integer scores in [0, max_score], without sorting:
 * histogram, the threshold score where the count from the top reaches c,
 * then one compaction pass in index order taking every score above the
 * threshold and the first (c - above) at it, so ties are truncated towards
 * the smaller index and out[] is in ascending index order. `hist` is
 * max_score + 1 ints of scratch. Returns min(c, n). */
int kv_pariskv_bucket_topk(const uint16_t *score, int n, int max_score, int c, int32_t *out, int *hist);

/* The released code's length-adaptive (candidate beta, collision rho) by
 * the retrieval-zone length n. */
void kv_pariskv_adaptive_ratios(int n, double *beta, double *rho);

/* Stage I's candidate count: max(1, ceil(beta * n)) as released, raised to
 * min(k, n) when floor_k, at most n (n >= 1). */
int kv_pariskv_candidates(int n, double beta, int k, int floor_k);
/* The device index's configuration for codec cx (its signs and levels are
 * read, not kept, by kv_pariskv_cuda.create). */
kv_pariskv_gpu_cfg kv_pariskv_gpu_config(const kv_pariskv_codec *cx, const kv_shape *sh, int pool_mean, int update);

#endif
