/* baselines.h: the numerical pieces of the published baselines (PQCache,
 * Quest, MagicPIG), exported so the tests can check each against a brute
 * force on its own, and read-only views of a built index for the tests
 * that check a whole search. The vtables themselves are reached through
 * the registry (kv_retriever.h) like every other method; nothing outside
 * retrievers/ and tests/ should need this header. */
#ifndef KV_BASELINES_H
#define KV_BASELINES_H

#include "kv_retriever.h"

/* ---- PQCache (retrievers/pqcache.c) ----
 * Centroids of one (kv head, sub-vector) are stored transposed, cent[j*C + c]
 * (dimension j of centroid c), so the distance and lookup loops run across
 * centroids and vectorise without reassociating any sum. */

/* codes[i*code_ld] = the centroid nearest to x[i*ld .. i*ld+d) in squared L2
 * (sum over j in order, in float; ties to the smaller centroid). */
void kv_pq_assign(const float *x, int n, int ld, int d, const float *cent, int C, uint8_t *codes, int code_ld);
/* Lloyd's k-means of n points of d dims (x[i*ld + j]) into C <= 256
 * centroids: unless `warm`, cent starts from C distinct points sampled with
 * a generator seeded by `seed` (point i % n when n < C); then `iters` rounds
 * of assign + mean update (an empty cluster keeps its centroid); the final
 * codes are assigned to the final centroids. n = 0 leaves cent as it is
 * (zeros when not warm). */
kv_status kv_pq_kmeans(const float *x, int n, int ld, int d, int C, int iters, uint64_t seed, int warm, float *cent,
                       uint8_t *codes, int code_ld);
/* The cold start's points: pick[c] for c < C, C distinct indices of [0, n)
 * from a generator seeded by `seed` (c % n when n < C); shared with the GPU
 * k-means so both start from the same centroids. */
void kv_pq_init_picks(int n, int C, uint64_t seed, int32_t *pick);
/* Lookup table of one query: lut[m*C + c] = <q_m, centroid c of sub-vector m>,
 * cent = [M][dsub][C] (the transposed centroids of the M sub-vectors). */
void kv_pq_lut(const float *q, const float *cent, int M, int C, int dsub, float *lut);
/* ADC scores: out[i] = sum over m (in order) of lut[m*C + codes[i*code_ld + m]]. */
void kv_pq_adc(const float *lut, const uint8_t *codes, int code_ld, int n, int M, int C, float *out);

typedef struct {
    int M, C, dsub, n;      /* n: positions seen (codes exist for [sink, n)) */
    const float *cent;      /* [Hkv][M][dsub][C] */
    const uint8_t *codes;   /* [Hkv][T][M] */
} kv_pq_view;
void kv_pqcache_view(const void *state, kv_pq_view *out);

/* ---- Quest (retrievers/quest.c) ---- */
/* Upper bound of <q, k> over keys inside [kmin, kmax] per channel:
 * sum over i (in order) of max(q_i * kmax_i, q_i * kmin_i). */
float kv_quest_page_bound(const float *q, const float *kmin, const float *kmax, int d);

typedef struct {
    int page, npages;       /* full pages summarised; page j covers [sink + j*page, sink + (j+1)*page) */
    const float *kmin, *kmax; /* [Hkv][max_pages][D] */
    int max_pages;
} kv_quest_view;           /* kmin/kmax NULL on the GPU path (kernels/quest_gpu.h reads them back) */
void kv_quest_view_of(const void *state, kv_quest_view *out);

/* ---- FreeKV (retrievers/freekv.c) ---- */
/* FreeKV's correction test: the mean over G heads (a + h*D, b + h*D) of
 * cos(a_h, b_h), dot and norms in double in channel order (0 for a zero
 * norm), the mean in double; a kv head is corrected when this is < tau. */
double kv_freekv_group_cosine(const float *a, const float *b, int G, int D);

/* ---- RACC (retrievers/racc.c) ---- */
/* SnapKV-style vote of RACC's compression: for each of the nw window
 * queries (G heads of one kv head: qw[(h*nw + w)*D]), the softmax of
 * scale * <q, K[cand[i]]> over the nc candidates (max, sum of exp in
 * double), summed in double over queries and heads into vote[i]. */
void kv_racc_vote(const float *qw, int G, int nw, const float *K, int D, const int32_t *cand, int nc, float scale,
                  double *vote, float *scratch);
typedef struct {
    int n_resident;   /* resident tokens of kv head 0 in [sink, n) */
    int n_evicted;    /* evicted tokens of kv head 0 */
    int compressions; /* compressions so far (the one at build included) */
} kv_racc_view;
void kv_racc_view_of(const void *state, kv_racc_view *out);

/* ---- MagicPIG (retrievers/magicpig.c) ---- */
/* The seeded Gaussian projection, proj[j*(K*L) + b] (dimension j, bit b),
 * N(0, 1) entries from kv_rng_normal. */
void kv_mp_projection(uint64_t seed, int D, int K, int L, float *proj);
/* SimHash of x: bit b = (sum over j in order of x[j]*proj[j*K*L + b]) > 0,
 * in float; codes[l*code_stride] packs bits l*K .. l*K+K-1, bit l*K+i at
 * position i. acc: K*L floats of scratch. */
void kv_mp_hash(const float *x, const float *proj, int D, int K, int L, float *acc, uint16_t *codes, int code_stride);
/* counts[i] = number of tables l where codes[l*ld + lo + i] == qcodes[l],
 * for i in [0, hi - lo). */
void kv_mp_collisions(const uint16_t *codes, int ld, int lo, int hi, const uint16_t *qcodes, int L, uint16_t *counts);
/* The released code's log importance weight for a key at cosine `cos` to
 * the query: p = (1 - acos(cos)/pi)^K, w = 1 - (1-p)^(L-1) * (L*p + 1 - p),
 * returns -log(w + 1e-4) (computed in double). */
float kv_mp_logw(double cos, int K, int L);

typedef struct {
    int K, L, n;
    const float *proj;      /* [D][K*L] */
    const float *mean;      /* [Hkv][D]: the centre subtracted from every key */
    const uint16_t *codes;  /* [Hkv][L][T]; NULL on the GPU path */
    struct kv_mp_gpu *gpu;  /* the device index on the GPU path (kernels/magicpig_gpu.h), else NULL */
} kv_mp_view;
void kv_magicpig_view(const void *state, kv_mp_view *out);

/* ---- Faiss (retrievers/faiss.c) ----
 * Faiss's k-means warns on stderr when it has fewer than 39 training keys
 * per centroid; a build prints each distinct warning once, with its count.
 * kv_faiss_quiet(1) drops them: the test runner sets it, since its tests
 * train on small synthetic prefills on purpose (issue 16: the warnings
 * flooded the test output). Without Faiss it does nothing. */
void kv_faiss_quiet(int on);

#endif
