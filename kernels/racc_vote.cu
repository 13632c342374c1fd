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
 * A block owns one kv head and a strided set of 64-key tiles: the tile's
 * keys (float16 or float32, widened to float) and 32 query rows at a time
 * sit in shared memory; each of 256 threads computes 2 rows x 4 keys. The
 * dot products are kv_dot_ref's bitwise (8 float partial sums over the
 * channels mod 8, products and sums rounded separately, the same final
 * tree), so every score equals the CPU's; only the softmax sums differ in
 * order (double: votes agree to ~1e-15 relative, the tests allow 1e-6).
 * Bytes: the keys twice (one read per sweep) + the flags twice + the votes
 * out; the work is 2 x rows x context x D multiply-adds in FP32 (FP32-bound,
 * not memory-bound: 137 G per sweep at 1M tokens, 16 query heads, window
 * 32, D 128). Needs D % 8 == 0 and D <= 256 (racc.cu keeps the older
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
};

/* Tile `tile` of kv head g: keys to sk (float, zero past hi), validity to sv. */
__device__ __forceinline__ void vt_load_keys(const vt_args &a, int g, int tile, float *sk, unsigned char *sv) {
    const int k0 = a.lo + tile * VT_K, ch = a.D / 8; /* 8-element chunks per key */
    for (int e = threadIdx.x; e < VT_K * ch; e += VT_TH) {
        const int kk = e / ch, c = e % ch, i = k0 + kk;
        float *dst = sk + kk * a.DP + 8 * c;
        if (i >= a.hi) {
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
    for (int kk = threadIdx.x; kk < VT_K; kk += VT_TH) {
        const int i = k0 + kk;
        sv[kk] = i < a.hi && !a.ev[(long long)g * a.T + i];
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
    unsigned char *sv = (unsigned char *)(sq + VT_R * a.DP);
    const int g = blockIdx.y, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    for (int tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
        const bool first = tile == (int)blockIdx.x;
        __syncthreads();
        vt_load_keys(a, g, tile, sk, sv);
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
                    if (sv[tx + 16 * c]) m = fmaxf(m, s[r][c]);
#pragma unroll
                for (int o = 8; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                double z = 0;
                if (m != -INFINITY)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        if (sv[tx + 16 * c]) z += exp((double)s[r][c] - (double)m);
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
    unsigned char *sv = (unsigned char *)(srz + VT_R);
    const int g = blockIdx.y, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    for (int tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
        __syncthreads();
        vt_load_keys(a, g, tile, sk, sv);
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
                if (sv[tx + 16 * c])
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
            const int i = a.lo + tile * VT_K + kk;
            if (i < a.hi) a.vote[(long long)g * a.vld + (i - a.lo)] = sv[kk] ? (float)vacc[kk] : -INFINITY;
        }
    }
}

size_t vt_smem_stats(int DP) { return (size_t)(VT_K + VT_R) * DP * sizeof(float) + VT_K; }
size_t vt_smem_sum(int DP) {
    return (size_t)(VT_K + VT_R) * DP * sizeof(float) + (16 * VT_K + VT_K) * sizeof(double) + VT_R * sizeof(float) +
           VT_R * sizeof(double) + VT_K;
}

}  // namespace

int racc_vote_fused_ok(int D) { return D % 8 == 0 && D >= 8 && D <= 256; }

int racc_vote_blocks(int Hkv, int span, const kv_cuda_dev *dev) {
    const int ntiles = (span + VT_K - 1) / VT_K;
    int nb = (2 * dev->sm_count + Hkv - 1) / Hkv; /* one wave of 2 blocks per SM; each block strides over tiles */
    nb = nb < 1 ? 1 : nb;
    return ntiles < nb ? (ntiles < 1 ? 1 : ntiles) : nb;
}

kv_status racc_vote_fused(const kv_dev_kv *K, const uint8_t *ev, int T, const float *qw, int Hkv, int rpg, float scale,
                          int lo, int hi, float *mpart, double *zpart, int nblk_cap, float *mrow, double *rz,
                          float *vote, long long vld, const kv_cuda_dev *dev, cudaStream_t st) {
    const int span = hi - lo, D = K->D;
    if (span <= 0) return KV_OK;
    if (!racc_vote_fused_ok(D)) return kv_fail(KV_ERR_INTERNAL, "racc GPU vote: fused path needs D %% 8 == 0, D <= 256 (D %d)", D);
    vt_args a = {};
    a.K = K->p; a.half = K->half; a.ks = (long long)K->T * D; a.ev = ev; a.T = T; a.qw = qw;
    a.rpg = rpg; a.D = D; a.DP = D + 4; a.scale = scale; a.lo = lo; a.hi = hi;
    a.ntiles = (span + VT_K - 1) / VT_K;
    a.nblk = racc_vote_blocks(Hkv, span, dev);
    if (a.nblk > nblk_cap) a.nblk = nblk_cap;
    a.mpart = mpart; a.zpart = zpart; a.mrow = mrow; a.rz = rz; a.vote = vote; a.vld = vld;
    const size_t s1 = vt_smem_stats(a.DP), s2 = vt_smem_sum(a.DP);
    if (s2 > (size_t)dev->smem_optin) return kv_fail(KV_ERR_INPUT, "racc GPU vote: %zu bytes of shared memory needed", s2);
    KV_CUDA_TRY(cudaFuncSetAttribute(racc_vote_stats, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1));
    KV_CUDA_TRY(cudaFuncSetAttribute(racc_vote_sum, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2));
    const dim3 grid(a.nblk, Hkv);
    racc_vote_stats<<<grid, VT_TH, s1, st>>>(a);
    KV_LAUNCH_CHECK();
    const int R = Hkv * rpg;
    racc_vote_merge<<<(R + 127) / 128, 128, 0, st>>>(mpart, zpart, a.nblk, a.nblk, R, mrow, rz);
    KV_LAUNCH_CHECK();
    racc_vote_sum<<<grid, VT_TH, s2, st>>>(a);
    KV_LAUNCH_CHECK();
    return KV_OK;
}
