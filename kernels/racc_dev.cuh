/* racc_dev.cuh: device-side interface between kernels/racc.cu (RACC's
 * launcher table) and kernels/racc_vote.cu (the fused two-sweep vote; its
 * header comment has the design). Internal to kernels/. */
#ifndef KV_RACC_DEV_CUH
#define KV_RACC_DEV_CUH

#include "ops/kv_cuda.h"

/* 1 when the fused vote handles head dimension D (D % 8 == 0, 8 <= D <= 256). */
int racc_vote_fused_ok(int D);
/* Blocks per kv head the fused vote uses over span tokens (the size of the
 * per-row partials: [Hkv * rpg][blocks]). */
int racc_vote_blocks(int Hkv, int span, const kv_cuda_dev *dev);
/* Scratch of the fused vote (device): part_m/part_z [R][nblk_cap] per-row
 * partials then [R] row maxima / 1 z at part_m/z + R*nblk_cap (R = Hkv *
 * rpg); rpos [Hkv][T] resident positions, ccnt [Hkv][racc_vote_chunks(T)],
 * rcnt [Hkv]. */
typedef struct {
    float *part_m;
    double *part_z;
    int nblk_cap;
    int32_t *rpos;
    int *ccnt, *rcnt;
    /* the tiled vote (racc_scores.cu) only: S [R][lds] the scores of the
     * resident keys (lds >= T, a multiple of 4), mkey [R] row maxima as
     * kv_f2key keys (0: none), mrow [R] and rz [R] (1 / z) */
    float *S;
    long long lds;
    unsigned *mkey;
    double *mrow;
    double *rz;
    double *zp;  /* [R][zld] row-sum partials, zld >= racc_vote_zchunks(T) */
    int zld;
    int prefetch; /* 1: the score sweep prefetches the next key tile to L2 */
} racc_vote_scratch;
int racc_vote_zchunks(int T);
int racc_vote_chunks(int T);
/* The compaction both vote paths start with: rcnt[g] resident positions of
 * [lo, hi) to rpos[g*T ..] in order; evicted votes vote[g*vld + i - lo] =
 * -inf. Asynchronous on st. */
kv_status racc_vote_compact(const uint8_t *ev, int T, int Hkv, int lo, int hi, const racc_vote_scratch *w, float *vote,
                            long long vld, cudaStream_t st);
/* 1 when the tiled vote handles head dimension D (64, 128 or 256). */
int racc_vote_tiled_ok(int D);
/* The tiled vote (kernels/racc_scores.cu): same contract as racc_vote_fused;
 * needs w->S with Hkv * rpg rows of w->lds >= hi - lo floats. */
kv_status racc_vote_tiled(const kv_dev_kv *K, const uint8_t *ev, int T, const float *qw, int Hkv, int rpg, float scale,
                          int lo, int hi, const racc_vote_scratch *w, float *vote, long long vld, const kv_cuda_dev *dev,
                          cudaStream_t st);
/* Vote of the resident tokens of [lo, hi) (ev [Hkv][T], 1 = evicted) for
 * the window queries qw [Hkv * rpg][D] (device; rows of kv head g are
 * [g*rpg, (g+1)*rpg), in the CPU's order): vote[g*vld + i - lo] (device,
 * float; -inf where evicted). Only the resident keys are scored (a
 * compaction first). Asynchronous on st. */
kv_status racc_vote_fused(const kv_dev_kv *K, const uint8_t *ev, int T, const float *qw, int Hkv, int rpg, float scale,
                          int lo, int hi, const racc_vote_scratch *w, float *vote, long long vld, const kv_cuda_dev *dev,
                          cudaStream_t st);

#endif
