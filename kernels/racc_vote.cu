/* racc_vote.cu: RACC's compression vote as two fused flash-style sweeps
 * (issue 10; the CPU reference is kv_racc_vote in retrievers/racc.c, the
 * launcher table in kernels/racc.cu).
 *
 * The vote of a resident token i of [lo, hi) for kv head g is
 * sum over its rpg = G*window rows r of exp(s_ri - m_r) / z_r, with
 * s_ri = scale * <q_r, k_i>, m_r and z_r the max and sum of exp over the
 * resident tokens. The score matrix (rows x context: 512 x 1M floats = 2 GB
 * at 1M tokens) never reaches memory: sweep 1 computes, tile by tile, each
 * row's max and sum of exp (per block a running max and a double sum,
 * rescaled when the max grows; one (m, z) partial per row and block, merged
 * in block order by a small kernel), sweep 2 recomputes the scores and adds
 * exp(s - m_r) / z_r over the rows into each token's vote in shared memory.
 * Only resident keys are scored: three small kernels first compact the
 * resident positions of [lo, hi) per kv head (chunk counts, their prefix,
 * the positions in order; evicted votes set to -inf), and the tiles run
 * over that list (after a few compressions most of the context is evicted,
 * and the bench evicts half).
 * A block owns one kv head and a strided set of 64-key tiles: the tile's
 * keys (float16 or float32, widened to float) and 32 query rows at a time
 * sit in shared memory; each of 256 threads computes 2 rows x 4 keys. The
 * dot products are kv_dot_ref's bitwise (8 float partial sums over the
 * channels mod 8, products and sums rounded separately, the same final
 * tree), so every score equals the CPU's; only the softmax sums differ in
 * order (double: votes agree to ~1e-15 relative, the tests allow 1e-6).
 * Bytes: the resident keys twice (one read per sweep) + the flags twice
 * (compaction) + the votes out; the work is 2 x rows x resident keys x D
 * multiply-adds in FP32 (FP32-bound, not memory-bound: 69 G per sweep at
 * 1M tokens with half of them resident, 16 query heads, window 32, D 128). Needs D % 8 == 0 and D <= 256 (racc.cu keeps the older
 * three-sweep path through the shared score kernel for other shapes). */
#include <math.h>

#include "ops/kv_cuda.h"
#include "racc_dev.cuh"

namespace {

constexpr int VT_K = 64;  /* keys per tile */
constexpr int VT_R = 32;  /* query rows per row tile */
constexpr int VT_TH = 256;

__device__ __forceinline__ float vt_finish(const float a[8]) {
    return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[4]), __fadd_rn(a[1], a[5])),
                     __fadd_rn(__fadd_rn(a[2], a[6]), __fadd_rn(a[3], a[7])));
}

struct vt_args {
    const void *K;
    int half;
    long long ks;          /* elements between kv heads in K */
    const uint8_t *ev;     /* [Hkv][T] */
    int T;
    const float *qw;       /* [Hkv * rpg][D] */
    int rpg, D, DP;        /* DP: shared row stride in floats (D + 4) */
    float scale;
    int lo, hi, ntiles;
    float *mpart;          /* [R][nblk] */
    double *zpart;         /* [R][nblk] */
    int nblk;
    const float *mrow;     /* [R] */
    const double *rz;      /* [R] 1 / z */
    float *vote;           /* [Hkv][vld] */
    long long vld;
    const int32_t *rpos;   /* [Hkv][T]: the resident positions of [lo, hi), in order */
    const int *rcnt;       /* [Hkv]: how many */
};

constexpr int VC_CHUNK = 4096; /* positions per block of the compaction */

/* Compaction of the resident positions, 1: per chunk of [lo, hi), the count. */
__global__ void racc_res_count(const uint8_t *ev, int T, int lo, int hi, int *ccnt, int nch) {
    __shared__ int sw[32];
    const int g = blockIdx.y, a = lo + blockIdx.x * VC_CHUNK, b = min(hi, a + VC_CHUNK);
    int c = 0;
    for (int i = a + threadIdx.x; i < b; i += blockDim.x) c += !ev[(long long)g * T + i];
    for (int o = 16; o; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) t += sw[k];
        ccnt[(long long)g * nch + blockIdx.x] = t;
    }
}

/* 2: per kv head, the exclusive prefix of the chunk counts (in place) and the total. */
__global__ void racc_res_scan(int *ccnt, int nch, int *rcnt) {
    __shared__ int sw[32];
    const int g = blockIdx.x;
    int carry = 0;
    for (int c0 = 0; c0 < nch; c0 += blockDim.x) {
        const int c = c0 + threadIdx.x;
        const int v = c < nch ? ccnt[(long long)g * nch + c] : 0;
        int tot;
        const int ex = kv_block_scan(v, &tot, sw);
        if (c < nch) ccnt[(long long)g * nch + c] = carry + ex;
        carry += tot;
    }
    if (threadIdx.x == 0) rcnt[g] = carry;
}

/* 3: the positions, in order; evicted positions get vote -inf. */
__global__ void racc_res_write(const uint8_t *ev, int T, int lo, int hi, const int *coff, int nch, int32_t *rpos,
                               float *vote, long long vld) {
    __shared__ int sw[32];
    const int g = blockIdx.y, a = lo + blockIdx.x * VC_CHUNK, b = min(hi, a + VC_CHUNK);
    int base = coff[(long long)g * nch + blockIdx.x];
    for (int i0 = a; i0 < b; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const bool res = i < b && !ev[(long long)g * T + i];
        int tot;
        const int ex = kv_block_scan(res ? 1 : 0, &tot, sw);
        if (res) rpos[(long long)g * T + base + ex] = i;
        else if (i < b) vote[(long long)g * vld + (i - lo)] = -INFINITY;
        base += tot;
    }
}

/* Tile `tile` (resident keys tile*VT_K ..) of kv head g: positions to sp
 * (-1 past the cnt resident keys), then keys to sk (float, zero for none). */
__device__ __forceinline__ void vt_load_keys(const vt_args &a, int g, int tile, int cnt, float *sk, int *sp) {
    for (int kk = threadIdx.x; kk < VT_K; kk += VT_TH) {
        const int r = tile * VT_K + kk;
        sp[kk] = r < cnt ? a.rpos[(long long)g * a.T + r] : -1;
    }
    __syncthreads();
    const int ch = a.D / 8; /* 8-element chunks per key */
    for (int e = threadIdx.x; e < VT_K * ch; e += VT_TH) {
        const int kk = e / ch, c = e % ch, i = sp[kk];
        float *dst = sk + kk * a.DP + 8 * c;
        if (i < 0) {
#pragma unroll
            for (int j = 0; j < 8; j++) dst[j] = 0.f;
            continue;
        }
        if (a.half) {
            const uint4 u = __ldg((const uint4 *)((const __half *)a.K + g * a.ks + (long long)i * a.D + 8 * c));
            const __half2 *h = (const __half2 *)&u;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __half22float2(h[j]);
                dst[2 * j] = f.x;
                dst[2 * j + 1] = f.y;
            }
        } else {
            const float4 *s = (const float4 *)((const float *)a.K + g * a.ks + (long long)i * a.D + 8 * c);
            *(float4 *)dst = __ldg(s);
            *(float4 *)(dst + 4) = __ldg(s + 1);
        }
    }
}

/* Rows [r0, r0 + VT_R) of kv head g (zero past rpg) to sq. */
__device__ __forceinline__ void vt_load_rows(const vt_args &a, int g, int r0, float *sq) {
    const int c4 = a.D / 4;
    for (int e = threadIdx.x; e < VT_R * c4; e += VT_TH) {
        const int rr = e / c4, c = e % c4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + rr < a.rpg) v = __ldg((const float4 *)(a.qw + ((long long)g * a.rpg + r0 + rr) * a.D) + c);
        *(float4 *)(sq + rr * a.DP + 4 * c) = v;
    }
}

/* s[r][c] = scale * <q_row(ty + 16r), k_key(tx + 16c)>, bitwise kv_dot_ref's. */
__device__ __forceinline__ void vt_scores(const vt_args &a, const float *sq, const float *sk, int ty, int tx,
                                          float s[2][4]) {
    float acc[2][4][8];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r][c][j] = 0.f;
    for (int m = 0; m < a.D; m += 8) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) { /* channels m + 4hh .. m + 4hh + 3 */
            float4 q[2], k[4];
#pragma unroll
            for (int r = 0; r < 2; r++) q[r] = *(const float4 *)(sq + (ty + 16 * r) * a.DP + m + 4 * hh);
#pragma unroll
            for (int c = 0; c < 4; c++) k[c] = *(const float4 *)(sk + (tx + 16 * c) * a.DP + m + 4 * hh);
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    float *p = acc[r][c] + 4 * hh;
                    p[0] = __fadd_rn(p[0], __fmul_rn(q[r].x, k[c].x));
                    p[1] = __fadd_rn(p[1], __fmul_rn(q[r].y, k[c].y));
                    p[2] = __fadd_rn(p[2], __fmul_rn(q[r].z, k[c].z));
                    p[3] = __fadd_rn(p[3], __fmul_rn(q[r].w, k[c].w));
                }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) s[r][c] = __fmul_rn(a.scale, vt_finish(acc[r][c]));
}

/* Sweep 1: per row and block, the running max and sum of exp over the block's tiles. */
__global__ void __launch_bounds__(VT_TH, 2) racc_vote_stats(vt_args a) {
    extern __shared__ float smem[];
    float *sk = smem, *sq = sk + VT_K * a.DP;
    int *sp = (int *)(sq + VT_R * a.DP);
    const int g = blockIdx.y, ty = threadIdx.x / 16, tx = threadIdx.x % 16, cnt = a.rcnt[g],
              ntiles = (cnt + VT_K - 1) / VT_K;
    if ((int)blockIdx.x >= ntiles) /* no tile for this block: an empty partial */
        for (int row = threadIdx.x; row < a.rpg; row += VT_TH) {
            const long long o = ((long long)g * a.rpg + row) * a.nblk + blockIdx.x;
            a.mpart[o] = -INFINITY;
            a.zpart[o] = 0.0;
        }
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const bool first = tile == (int)blockIdx.x;
        __syncthreads();
        vt_load_keys(a, g, tile, cnt, sk, sp);
        for (int r0 = 0; r0 < a.rpg; r0 += VT_R) {
            __syncthreads();
            vt_load_rows(a, g, r0, sq);
            __syncthreads();
            float s[2][4];
            vt_scores(a, sq, sk, ty, tx, s);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float m = -INFINITY;
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (sp[tx + 16 * c] >= 0) m = fmaxf(m, s[r][c]);
#pragma unroll
                for (int o = 8; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                double z = 0;
                if (m != -INFINITY)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        if (sp[tx + 16 * c] >= 0) z += exp((double)s[r][c] - (double)m);
#pragma unroll
                for (int o = 8; o; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
                const int row = r0 + ty + 16 * r;
                if (tx == 0 && row < a.rpg) {
                    const long long o = ((long long)g * a.rpg + row) * a.nblk + blockIdx.x;
                    float M = first ? -INFINITY : a.mpart[o];
                    double Z = first ? 0.0 : a.zpart[o];
                    const float M2 = fmaxf(M, m);
                    if (M2 != -INFINITY) {
                        Z = (M == -INFINITY ? 0.0 : Z * exp((double)M - (double)M2)) +
                            (m == -INFINITY ? 0.0 : z * exp((double)m - (double)M2));
                    }
                    a.mpart[o] = M2;
                    a.zpart[o] = Z;
                }
            }
        }
    }
}

/* Per row: m = max over blocks, 1/z with z = sum of the partials rescaled to m (block order). */
__global__ void racc_vote_merge(const float *mpart, const double *zpart, int nblk, int used, int R, float *mrow,
                                double *rz) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    const float *mp = mpart + (long long)r * nblk;
    const double *zp = zpart + (long long)r * nblk;
    float m = -INFINITY;
    for (int b = 0; b < used; b++) m = fmaxf(m, mp[b]);
    double z = 0;
    if (m != -INFINITY)
        for (int b = 0; b < used; b++)
            if (mp[b] != -INFINITY) z += zp[b] * exp((double)mp[b] - (double)m);
    mrow[r] = m;
    rz[r] = z > 0 ? 1.0 / z : 0.0;
}

/* Sweep 2: vote[g][i - lo] = sum over the rows of exp(s - m_r) / z_r (-inf if not resident). */
__global__ void __launch_bounds__(VT_TH, 2) racc_vote_sum(vt_args a) {
    extern __shared__ float smem[];
    float *sk = smem, *sq = sk + VT_K * a.DP;
    double *red = (double *)(sq + VT_R * a.DP); /* [16][VT_K] */
    double *vacc = red + 16 * VT_K;             /* [VT_K] */
    float *sm = (float *)(vacc + VT_K);         /* [VT_R] row maxima */
    double *srz = (double *)(sm + VT_R);        /* [VT_R] (8-byte aligned: VT_R even) */
    int *sp = (int *)(srz + VT_R);              /* [VT_K] positions */
    const int g = blockIdx.y, ty = threadIdx.x / 16, tx = threadIdx.x % 16, cnt = a.rcnt[g],
              ntiles = (cnt + VT_K - 1) / VT_K;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        __syncthreads();
        vt_load_keys(a, g, tile, cnt, sk, sp);
        for (int kk = threadIdx.x; kk < VT_K; kk += VT_TH) vacc[kk] = 0;
        for (int r0 = 0; r0 < a.rpg; r0 += VT_R) {
            __syncthreads();
            vt_load_rows(a, g, r0, sq);
            for (int rr = threadIdx.x; rr < VT_R; rr += VT_TH) {
                const int row = r0 + rr;
                sm[rr] = row < a.rpg ? a.mrow[(long long)g * a.rpg + row] : -INFINITY;
                srz[rr] = row < a.rpg ? a.rz[(long long)g * a.rpg + row] : 0.0;
            }
            __syncthreads();
            float s[2][4];
            vt_scores(a, sq, sk, ty, tx, s);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                double t = 0;
                if (sp[tx + 16 * c] >= 0)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int rr = ty + 16 * r;
                        if (r0 + rr < a.rpg && sm[rr] != -INFINITY)
                            t += exp((double)s[r][c] - (double)sm[rr]) * srz[rr];
                    }
                red[ty * VT_K + tx + 16 * c] = t;
            }
            __syncthreads();
            for (int kk = threadIdx.x; kk < VT_K; kk += VT_TH) {
                double t = vacc[kk];
                for (int y = 0; y < 16; y++) t += red[y * VT_K + kk];
                vacc[kk] = t;
            }
        }
        __syncthreads();
        for (int kk = threadIdx.x; kk < VT_K; kk += VT_TH) {
            const int i = sp[kk];
            if (i >= 0) a.vote[(long long)g * a.vld + (i - a.lo)] = (float)vacc[kk];
        }
    }
}

size_t vt_smem_stats(int DP) { return (size_t)(VT_K + VT_R) * DP * sizeof(float) + VT_K * sizeof(int); }
size_t vt_smem_sum(int DP) {
    return (size_t)(VT_K + VT_R) * DP * sizeof(float) + (16 * VT_K + VT_K) * sizeof(double) + VT_R * sizeof(float) +
           VT_R * sizeof(double) + VT_K * sizeof(int);
}

}  // namespace

int racc_vote_fused_ok(int D) { return D % 8 == 0 && D >= 8 && D <= 256; }

int racc_vote_blocks(int Hkv, int span, const kv_cuda_dev *dev) {
    const int ntiles = (span + VT_K - 1) / VT_K;
    int nb = (2 * dev->sm_count + Hkv - 1) / Hkv; /* one wave of 2 blocks per SM; each block strides over tiles */
    nb = nb < 1 ? 1 : nb;
    return ntiles < nb ? (ntiles < 1 ? 1 : ntiles) : nb;
}

int racc_vote_chunks(int T) { return (T + VC_CHUNK - 1) / VC_CHUNK; }

kv_status racc_vote_compact(const uint8_t *ev, int T, int Hkv, int lo, int hi, const racc_vote_scratch *w, float *vote,
                            long long vld, cudaStream_t st) {
    const int nch = racc_vote_chunks(hi - lo);
    racc_res_count<<<dim3(nch, Hkv), 256, 0, st>>>(ev, T, lo, hi, w->ccnt, nch);
    KV_LAUNCH_CHECK();
    racc_res_scan<<<Hkv, 1024, 0, st>>>(w->ccnt, nch, w->rcnt);
    KV_LAUNCH_CHECK();
    racc_res_write<<<dim3(nch, Hkv), 256, 0, st>>>(ev, T, lo, hi, w->ccnt, nch, w->rpos, vote, vld);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

kv_status racc_vote_fused(const kv_dev_kv *K, const uint8_t *ev, int T, const float *qw, int Hkv, int rpg, float scale,
                          int lo, int hi, const racc_vote_scratch *w, float *vote, long long vld, const kv_cuda_dev *dev,
                          cudaStream_t st) {
    const int span = hi - lo, D = K->D;
    if (span <= 0) return KV_OK;
    if (!racc_vote_fused_ok(D)) return kv_fail(KV_ERR_INTERNAL, "racc GPU vote: fused path needs D %% 8 == 0, D <= 256 (D %d)", D);
    vt_args a = {};
    a.K = K->p; a.half = K->half; a.ks = (long long)K->T * D; a.ev = ev; a.T = T; a.qw = qw;
    a.rpg = rpg; a.D = D; a.DP = D + 4; a.scale = scale; a.lo = lo; a.hi = hi;
    a.ntiles = (span + VT_K - 1) / VT_K;
    a.nblk = racc_vote_blocks(Hkv, span, dev);
    if (a.nblk > w->nblk_cap) a.nblk = w->nblk_cap;
    const int R = Hkv * rpg;
    a.mpart = w->part_m; a.zpart = w->part_z; a.mrow = w->part_m + (size_t)R * w->nblk_cap;
    a.rz = w->part_z + (size_t)R * w->nblk_cap; a.vote = vote; a.vld = vld; a.rpos = w->rpos; a.rcnt = w->rcnt;
    const size_t s1 = vt_smem_stats(a.DP), s2 = vt_smem_sum(a.DP);
    if (s2 > (size_t)dev->smem_optin) return kv_fail(KV_ERR_INPUT, "racc GPU vote: %zu bytes of shared memory needed", s2);
    KV_CUDA_TRY(cudaFuncSetAttribute(racc_vote_stats, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1));
    KV_CUDA_TRY(cudaFuncSetAttribute(racc_vote_sum, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2));
    KV_TRY(racc_vote_compact(ev, T, Hkv, lo, hi, w, vote, vld, st));
    const dim3 grid(a.nblk, Hkv);
    racc_vote_stats<<<grid, VT_TH, s1, st>>>(a);
    KV_LAUNCH_CHECK();
    racc_vote_merge<<<(R + 127) / 128, 128, 0, st>>>(a.mpart, a.zpart, a.nblk, a.nblk, R, (float *)a.mrow,
                                                     (double *)a.rz);
    KV_LAUNCH_CHECK();
    racc_vote_sum<<<grid, VT_TH, s2, st>>>(a);
    KV_LAUNCH_CHECK();
    return KV_OK;
}
