/* racc_scores.cu: RACC's compression vote as one register-tiled score sweep
 * and two streaming passes (issue 10; the CPU reference is kv_racc_vote in
 * retrievers/racc.c, the launcher table in kernels/racc.cu, the two-sweep
 * kernels it replaces by default in kernels/racc_vote.cu).
 *
 * The vote of a resident token i for kv head g is sum over its rpg = G*window
 * rows r of exp(s_ri - m_r) / z_r, s_ri = scale * <q_r, k_i>. The dot
 * products are the whole cost (rows x resident keys x D multiply-adds:
 * 34 G at 1M tokens with half of them resident, 16 query heads, window 32,
 * D 128) and must stay bitwise kv_dot_ref's: 8 partial sums over the
 * channels mod 8, each a chain of separately rounded products and sums in
 * ascending channel order, then the fixed tree ((a0+a4)+(a1+a5)) +
 * ((a2+a6)+(a3+a7)). So the multiply-adds are FMUL + FADD (no FFMA) and
 * every (row, key) output needs its 8 chains. The two-sweep kernel keeps the
 * 8 chains of each output live at once (8 accumulators x 8 outputs per
 * thread) and recomputes every score in its second sweep. Here:
 * 1. Scores, once. A block owns one kv head, 64 rows (all of them in the
 *    bench: G*window = 64) resident in shared memory for all its tiles, and a
 *    strided set of 64-key tiles of the compacted resident keys (float16 or
 *    float32, widened to float). Shared memory holds rows and keys with the
 *    channels permuted to partial-major order (channel 8m + j at j*D/8 + m),
 *    so one float4 load gives 4 consecutive steps of one chain. Each of 256
 *    threads computes a 4 x 4 tile of outputs chain by chain (0, 4, 1, 5,
 *    2, 6, 3, 7) with one accumulator per output, combining finished
 *    partials in the tree's order as soon as the tree allows ((a0+a4) +
 *    (a1+a5) waits in shared memory, so at most 48 registers of state):
 *    8 float4 shared loads per 128 FP32 instructions. While it computes a
 *    tile, the next tile's keys are prefetched to L2 (2.4% at 1M tokens;
 *    KVBENCH_RACC_PREFETCH=0 turns it off). The scores go to S [rows]
 *    [resident keys] (float: bitwise the CPU's) and each row's maximum to
 *    one atomicMax per warp (order-preserving keys: exact and order-free).
 * 2. z_r = sum of exp(s - m_r) in double over the row of S: a block per
 *    (row, 16384 keys), then the chunks' sums in chunk order (deterministic).
 * 3. The votes: a thread per resident key sums exp(s - m_r) * (1 / z_r) in
 *    double over its rows in the CPU's order, stored as float.
 * Only the exp and the order of z's sum differ from the CPU's (votes agree
 * to ~1e-15 relative; the tests allow 1e-6). Work: rows x resident keys x D
 * FMUL + FADD once (instead of twice), 2 double exps per (row, key); bytes:
 * the resident keys once, S written once and read twice (4 bytes x rows x
 * resident keys each), flags and positions. S needs rows x T floats
 * (kernels/racc.cu allocates it up to 4 GiB, else it keeps the two-sweep
 * kernel). Needs D in {64, 128, 256} (templated: the chains unroll fully).
 * H100, 1M tokens: scores 3.91 ms (~52% of the FP32 issue rate; ncu: 30% of
 * the stall cycles are instruction fetch, the fully unrolled body is ~4K
 * FP instructions), row sums 0.47 ms, votes 0.76 ms. The 8 chains as a loop
 * over one chain body (half the code) measured slower (5.24 vs 5.21 ms at
 * 1M, 723 vs 681 us at 128K) and was dropped. */
#include <math.h>

#include "ops/kv_cuda.h"
#include "racc_dev.cuh"

namespace {

constexpr int RS_TH = 256; /* threads per block: 16 row groups x 16 key groups */
constexpr int RS_RT = 64;  /* rows per row tile */
constexpr int RS_KT = 64;  /* keys per key tile */
constexpr int RS_ZC = 16384; /* keys per block of the row sums */

struct rs_args {
    const void *K;
    int half;
    long long ks;          /* elements between kv heads in K */
    int T;
    const float *qw;       /* [Hkv * rpg][D] */
    int rpg;
    float scale;
    const int32_t *rpos;   /* [Hkv][T] resident positions, in order */
    const int *rcnt;       /* [Hkv] */
    float *S;              /* [Hkv * rpg][lds] */
    long long lds;
    unsigned *mkey;        /* [Hkv * rpg], zero on entry */
    int prefetch;          /* 1: prefetch the next tile's keys to L2 while computing this one */
};

/* Rows [r0, r0 + RS_RT) of kv head g (zero past rpg) to sq, channels permuted. */
template <int D>
__device__ __forceinline__ void rs_load_rows(const rs_args &a, int g, int r0, float *sq) {
    constexpr int M = D / 8, DP = D + 4, C4 = D / 4;
    for (int e = threadIdx.x; e < RS_RT * C4; e += RS_TH) {
        const int rr = e / C4, c = e % C4; /* channels 4c .. 4c+3: m = c/2, j = 4(c%2) .. +3 */
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + rr < a.rpg) v = __ldg((const float4 *)(a.qw + ((long long)g * a.rpg + r0 + rr) * D) + c);
        float *d = sq + rr * DP + (4 * (c & 1)) * M + (c >> 1);
        d[0] = v.x; d[M] = v.y; d[2 * M] = v.z; d[3 * M] = v.w;
    }
}

/* Resident keys tile*RS_KT .. of kv head g (zero past cnt) to sk, channels permuted. */
template <int D>
__device__ __forceinline__ void rs_load_keys(const rs_args &a, int g, int tile, int cnt, float *sk) {
    constexpr int M = D / 8, DP = D + 4, NE = RS_KT * M / RS_TH; /* 8-channel chunks per thread */
    float v[NE][8];
#pragma unroll
    for (int u = 0; u < NE; u++) { /* every load in flight before the first store */
        const int e = threadIdx.x + u * RS_TH, kk = e / M, m = e % M, ri = tile * RS_KT + kk;
        if (ri >= cnt) {
#pragma unroll
            for (int j = 0; j < 8; j++) v[u][j] = 0.f;
            continue;
        }
        const long long i = a.rpos[(long long)g * a.T + ri];
        if (a.half) {
            const uint4 w = __ldg((const uint4 *)((const __half *)a.K + g * a.ks + i * D + 8 * m));
            const __half2 *h = (const __half2 *)&w;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = __half22float2(h[j]);
                v[u][2 * j] = f.x;
                v[u][2 * j + 1] = f.y;
            }
        } else {
            const float4 *s = (const float4 *)((const float *)a.K + g * a.ks + i * D + 8 * m);
            const float4 x = __ldg(s), y = __ldg(s + 1);
            v[u][0] = x.x; v[u][1] = x.y; v[u][2] = x.z; v[u][3] = x.w;
            v[u][4] = y.x; v[u][5] = y.y; v[u][6] = y.z; v[u][7] = y.w;
        }
    }
#pragma unroll
    for (int u = 0; u < NE; u++) {
        const int e = threadIdx.x + u * RS_TH, kk = e / M, m = e % M;
        float *d = sk + kk * DP + m;
#pragma unroll
        for (int j = 0; j < 8; j++) d[j * M] = v[u][j];
    }
}

/* acc[r][c] = chain j of kv_dot_ref for row rg + 16r and key kg + 16c:
 * sum over m ascending of q[8m + j] * k[8m + j], rounded step by step. */
template <int D>
__device__ __forceinline__ void rs_chain(const float *sq, const float *sk, int rg, int kg, int j, float acc[4][4]) {
    constexpr int M = D / 8, DP = D + 4;
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[r][c] = 0.f;
#pragma unroll
    for (int m0 = 0; m0 < M; m0 += 4) {
        float4 q[4], k[4];
#pragma unroll
        for (int r = 0; r < 4; r++) q[r] = *(const float4 *)(sq + (rg + 16 * r) * DP + j * M + m0);
#pragma unroll
        for (int c = 0; c < 4; c++) k[c] = *(const float4 *)(sk + (kg + 16 * c) * DP + j * M + m0);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float t = acc[r][c];
                t = __fadd_rn(t, __fmul_rn(q[r].x, k[c].x));
                t = __fadd_rn(t, __fmul_rn(q[r].y, k[c].y));
                t = __fadd_rn(t, __fmul_rn(q[r].z, k[c].z));
                t = __fadd_rn(t, __fmul_rn(q[r].w, k[c].w));
                acc[r][c] = t;
            }
    }
}

__device__ __forceinline__ void rs_add(float a[4][4], const float b[4][4]) {
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) a[r][c] = __fadd_rn(a[r][c], b[r][c]);
}

/* Sweep 1: S and the row maxima. */
template <int D>
__global__ void __launch_bounds__(RS_TH, D == 256 ? 1 : 2) racc_rs_scores(rs_args a) { /* D 256: 1 block per SM (smem) */
    constexpr int DP = D + 4;
    extern __shared__ float smem[];
    float *sq = smem, *sk = sq + RS_RT * DP, *sh = sk + RS_KT * DP; /* sh: [16][RS_TH] per-thread stash */
    const int g = blockIdx.y, cnt = a.rcnt[g], ntiles = (cnt + RS_KT - 1) / RS_KT;
    if ((int)blockIdx.x >= ntiles) return;
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    const int rg = (w >> 1) * 4 + (l >> 3), kg = (w & 1) * 8 + (l & 7); /* a warp: 4 row groups x 8 key groups */
    for (int r0 = 0; r0 < a.rpg; r0 += RS_RT) {
        __syncthreads();
        rs_load_rows<D>(a, g, r0, sq);
        float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
            __syncthreads();
            rs_load_keys<D>(a, g, tile, cnt, sk);
            __syncthreads();
            /* the next tile's positions now, its keys to L2 after the first chain (their latency hidden
             * behind it): the next load above then hits L2, not HBM */
            constexpr int NE = RS_KT * (D / 8) / RS_TH;
            const int nt = tile + gridDim.x;
            const bool pf = a.prefetch && nt < ntiles;
            int pn[NE];
#pragma unroll
            for (int u = 0; u < NE; u++) {
                const int ri = nt * RS_KT + (threadIdx.x + u * RS_TH) / (D / 8);
                pn[u] = pf && ri < cnt ? __ldg(a.rpos + (long long)g * a.T + ri) : -1;
            }
            float h0[4][4], h1[4][4], h2[4][4], x[4][4];
            rs_chain<D>(sq, sk, rg, kg, 0, h0);
            if (pf)
#pragma unroll
                for (int u = 0; u < NE; u++)
                    if (pn[u] >= 0) {
                        const int m = (threadIdx.x + u * RS_TH) % (D / 8);
                        const char *p = a.half ? (const char *)((const __half *)a.K + g * a.ks + (long long)pn[u] * D + 8 * m)
                                               : (const char *)((const float *)a.K + g * a.ks + (long long)pn[u] * D + 8 * m);
                        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
                    }
            rs_chain<D>(sq, sk, rg, kg, 4, x);
            rs_add(h0, x); /* a0 + a4 */
            rs_chain<D>(sq, sk, rg, kg, 1, h1);
            rs_chain<D>(sq, sk, rg, kg, 5, x);
            rs_add(h1, x); /* a1 + a5 */
            rs_add(h0, h1);
            /* (a0 + a4) + (a1 + a5) waits in shared memory: 48 registers of state, not 64 */
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) sh[(4 * r + c) * RS_TH + threadIdx.x] = h0[r][c];
            rs_chain<D>(sq, sk, rg, kg, 2, h1);
            rs_chain<D>(sq, sk, rg, kg, 6, x);
            rs_add(h1, x); /* a2 + a6 */
            rs_chain<D>(sq, sk, rg, kg, 3, h2);
            rs_chain<D>(sq, sk, rg, kg, 7, x);
            rs_add(h2, x); /* a3 + a7 */
            rs_add(h1, h2);
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) h0[r][c] = __fadd_rn(sh[(4 * r + c) * RS_TH + threadIdx.x], h1[r][c]);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int row = r0 + rg + 16 * r;
                if (row >= a.rpg) continue;
                float *out = a.S + ((long long)g * a.rpg + row) * a.lds;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int ri = tile * RS_KT + kg + 16 * c;
                    if (ri >= cnt) continue;
                    const float s = __fmul_rn(a.scale, h0[r][c]);
                    out[ri] = s;
                    mx[r] = fmaxf(mx[r], s);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float m = mx[r];
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const int row = r0 + rg + 16 * r;
            if ((l & 7) == 0 && row < a.rpg && m != -INFINITY) atomicMax(a.mkey + (long long)g * a.rpg + row, kv_f2key(m));
        }
    }
}

/* Pass 2a, a block per (row r, chunk of RS_ZC keys): zp[r][chunk] = sum of exp(s - m_r) over the chunk's
 * resident keys (a fixed tree: deterministic). */
__global__ void racc_rs_z(const float *S, long long lds, int rpg, const int *rcnt, const unsigned *mkey, double *zp,
                          int zld) {
    __shared__ double sh[32];
    const int r = blockIdx.x, c = blockIdx.y, cnt = rcnt[r / rpg], a = c * RS_ZC, b = min(cnt, a + RS_ZC);
    const unsigned mk = mkey[r];
    const double m = mk ? (double)kv_key2f(mk) : 0.0;
    const float *s = S + (long long)r * lds;
    double acc = 0;
    if (mk && a < b) {
        const int n4 = (b - a) / 4; /* a and lds are multiples of 4: aligned float4 */
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 v = __ldg((const float4 *)(s + a) + i);
            acc += exp((double)v.x - m) + exp((double)v.y - m) + (exp((double)v.z - m) + exp((double)v.w - m));
        }
        for (int i = a + 4 * n4 + threadIdx.x; i < b; i += blockDim.x) acc += exp((double)s[i] - m);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double z = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) z += sh[i];
        zp[(long long)r * zld + c] = z;
    }
}

/* Pass 2b, a thread per row: mrow[r] (double; -inf: no resident key), rz[r] = 1 / (the chunks' sums in chunk order). */
__global__ void racc_rs_zfin(const double *zp, int zld, int nzc, int R, const unsigned *mkey, double *mrow, double *rz) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    double z = 0;
    for (int c = 0; c < nzc; c++) z += zp[(long long)r * zld + c];
    mrow[r] = mkey[r] ? (double)kv_key2f(mkey[r]) : -INFINITY;
    rz[r] = z > 0 ? 1.0 / z : 0.0;
}

/* Pass 3, a thread per resident key: its vote, the rows of its kv head in order. */
__global__ void racc_rs_vote(const float *S, long long lds, int rpg, const int *rcnt, const int32_t *rpos, int T,
                             const double *mrow, const double *rz, int lo, float *vote, long long vld) {
    const int g = blockIdx.y, ri = blockIdx.x * blockDim.x + threadIdx.x;
    if (ri >= rcnt[g]) return;
    const float *s = S + (long long)g * rpg * lds + ri;
    const double *mr = mrow + (long long)g * rpg, *zr = rz + (long long)g * rpg;
    double acc = 0;
#pragma unroll 8
    for (int r = 0; r < rpg; r++) {
        const double m = __ldg(mr + r);
        if (m != -INFINITY) acc += exp((double)__ldg(s + (long long)r * lds) - m) * __ldg(zr + r);
    }
    vote[(long long)g * vld + (rpos[(long long)g * T + ri] - lo)] = (float)acc;
}

template <int D> size_t rs_smem() { return ((size_t)(RS_RT + RS_KT) * (D + 4) + 16 * RS_TH) * sizeof(float); }

template <int D>
kv_status rs_scores_launch(const rs_args &a, dim3 grid, cudaStream_t st) {
    const size_t sm = rs_smem<D>();
    KV_CUDA_TRY(cudaFuncSetAttribute(racc_rs_scores<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    KV_CUDA_TRY(cudaFuncSetAttribute(racc_rs_scores<D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     (int)cudaSharedmemCarveoutMaxShared));
    racc_rs_scores<D><<<grid, RS_TH, sm, st>>>(a);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

}  // namespace

int racc_vote_tiled_ok(int D) { return D == 64 || D == 128 || D == 256; }

int racc_vote_zchunks(int T) { return (T + RS_ZC - 1) / RS_ZC; }

kv_status racc_vote_tiled(const kv_dev_kv *K, const uint8_t *ev, int T, const float *qw, int Hkv, int rpg, float scale,
                          int lo, int hi, const racc_vote_scratch *w, float *vote, long long vld, const kv_cuda_dev *dev,
                          cudaStream_t st) {
    const int span = hi - lo, D = K->D;
    if (span <= 0) return KV_OK;
    if (!racc_vote_tiled_ok(D)) return kv_fail(KV_ERR_INTERNAL, "racc GPU vote: tiled path needs D 64, 128 or 256 (D %d)", D);
    if (!w->S || w->lds < span) return kv_fail(KV_ERR_INTERNAL, "racc GPU vote: tiled path without its score matrix");
    const int R = Hkv * rpg;
    KV_TRY(racc_vote_compact(ev, T, Hkv, lo, hi, w, vote, vld, st));
    KV_CUDA_TRY(cudaMemsetAsync(w->mkey, 0, (size_t)R * sizeof(unsigned), st));
    rs_args a = {};
    a.K = K->p; a.half = K->half; a.ks = (long long)K->T * D; a.T = T; a.qw = qw; a.rpg = rpg; a.scale = scale;
    a.rpos = w->rpos; a.rcnt = w->rcnt; a.S = w->S; a.lds = w->lds; a.mkey = w->mkey; a.prefetch = w->prefetch;
    /* one wave of 2 blocks per SM over the kv heads; each block strides over its head's tiles */
    const int ntiles = (span + RS_KT - 1) / RS_KT;
    int nb = (2 * dev->sm_count + Hkv - 1) / Hkv;
    nb = nb < 1 ? 1 : nb > ntiles ? ntiles : nb;
    const dim3 grid(nb, Hkv);
    const size_t sm = D == 64 ? rs_smem<64>() : D == 128 ? rs_smem<128>() : rs_smem<256>();
    if (sm > (size_t)dev->smem_optin) return kv_fail(KV_ERR_INPUT, "racc GPU vote: %zu bytes of shared memory needed", sm);
    if (D == 64) KV_TRY(rs_scores_launch<64>(a, grid, st));
    else if (D == 128) KV_TRY(rs_scores_launch<128>(a, grid, st));
    else KV_TRY(rs_scores_launch<256>(a, grid, st));
    const int nzc = racc_vote_zchunks(span);
    if (nzc > w->zld) return kv_fail(KV_ERR_INTERNAL, "racc GPU vote: %d row-sum chunks, room for %d", nzc, w->zld);
    racc_rs_z<<<dim3(R, nzc), 256, 0, st>>>(w->S, w->lds, rpg, w->rcnt, w->mkey, w->zp, w->zld);
    KV_LAUNCH_CHECK();
    racc_rs_zfin<<<(R + 127) / 128, 128, 0, st>>>(w->zp, w->zld, nzc, R, w->mkey, w->mrow, w->rz);
    KV_LAUNCH_CHECK();
    racc_rs_vote<<<dim3((span + 255) / 256, Hkv), 256, 0, st>>>(w->S, w->lds, rpg, w->rcnt, w->rpos, T, w->mrow, w->rz,
                                                                lo, vote, vld);
    KV_LAUNCH_CHECK();
    return KV_OK;
}
