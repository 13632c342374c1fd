/* attention.cu: the exact attention of one decode step over a device-
 * resident layer, the oracle of the evaluation protocol (issue 2, point 8;
 * kv_gpu_attn_* of kv_gpu.h, the GPU side of cli/oracle.c). A step is three
 * launches and one copy back: scores of all Hq heads over [0, t] (score.cu,
 * with the top-k's first histogram fused), the kk-th largest score of the
 * retrievable region (topk.cu, threshold only) and softmax + PV below, then
 * m, Z, thr and o_full [Hq][D] in one device-to-host copy. Everything is
 * allocated in kv_gpu_attn_create; a step allocates nothing. The scores of
 * the last step stay on the device so kv_gpu_attn_gather returns exactly the
 * numbers the threshold was taken from (a tie is judged identically).
 *
 * Softmax + PV (flash-decoding split): a block takes a contiguous token
 * range of one kv head and all G query heads of its group, so V_g is read
 * once for the group. Each warp walks groups of 32 tokens: lane l computes
 * p for token l (one exp per token and head, an online max per warp that
 * rescales its sums when a group raises it), then streams the group's V
 * rows, 16 bytes per lane, with all of the group's loads issued before its
 * arithmetic and p broadcast by shuffle; the main loop has no barrier and no
 * separate max pass over the scores. Blocks write partial (m_b, z_b, o_b);
 * the kv head's last block combines them: m = max m_b, Z = sum z_b
 * e^(m_b - m) in double, o = sum o_b e^(m_b - m) / Z. Head dims whose rows
 * do not split into 8, 16 or 32 lanes of 16 bytes take a slower fallback
 * (a row-max kernel, then a block-wide pass).
 * The combination order is fixed, so results do not depend on block timing. */
#include <math.h>
#include <string.h>

#include "attn_state.cuh"

namespace {

constexpr int PV_TH = 256, PV_U = 4;

struct kv_pv_params {
    const float *S;
    long long ld;
    int n;
    const void *V;
    long long T;
    int D, G, ngroups, bph, span;
    float *part;
    double *partz;
    float *partm;
    unsigned *cnt, *mkey;
    float *m, *Z, *o;
};

constexpr int PV_BPH_MAX = 256;

template <typename T, int VEC> struct kv_vload;
template <> struct kv_vload<__half, 8> {
    static __device__ __forceinline__ void go(const __half *p, float *v) {
        uint4 u = *(const uint4 *)p;
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int j = 0; j < 4; j++) { float2 f = __half22float2(h[j]); v[2 * j] = f.x; v[2 * j + 1] = f.y; }
    }
};
template <> struct kv_vload<float, 4> {
    static __device__ __forceinline__ void go(const float *p, float *v) {
        float4 f = *(const float4 *)p;
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    }
};
/* 16 raw bytes of a V row, converted only when used (keeps registers low). */
template <typename T> struct kv_raw;
template <> struct kv_raw<__half> {
    typedef uint4 type;
    static __device__ __forceinline__ void cvt(const uint4 &u, float *v) {
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int j = 0; j < 4; j++) { float2 f = __half22float2(h[j]); v[2 * j] = f.x; v[2 * j + 1] = f.y; }
    }
};
template <> struct kv_raw<float> {
    typedef float4 type;
    static __device__ __forceinline__ void cvt(const float4 &f, float *v) { v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w; }
};
template <> struct kv_vload<__half, 1> {
    static __device__ __forceinline__ void go(const __half *p, float *v) { v[0] = __half2float(*p); }
};
template <> struct kv_vload<float, 1> {
    static __device__ __forceinline__ void go(const float *p, float *v) { v[0] = *p; }
};

/* mkey[h] = max over blocks of the largest key of S[h][chunk] (mkey zero before). */
__global__ void __launch_bounds__(PV_TH) kv_rowmax_kernel(const float *S, long long ld, int n, int chunk,
                                                          unsigned *mkey) {
    __shared__ unsigned wm[PV_TH / 32];
    const int h = blockIdx.y, a = blockIdx.x * chunk, b = min(n, a + chunk);
    const float *row = S + (size_t)h * ld;
    unsigned mx = 0;
    for (int i = a + threadIdx.x; i < b; i += 4 * PV_TH) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = i + u * PV_TH < b ? row[i + u * PV_TH] : -INFINITY;
#pragma unroll
        for (int u = 0; u < 4; u++) mx = max(mx, kv_f2key(v[u]));
    }
    mx = __reduce_max_sync(0xffffffffu, mx);
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < PV_TH / 32; w++) mx = max(mx, wm[w]);
        atomicMax(&mkey[h], max(mx, wm[0]));
    }
}

/* A block: tokens [b*span, (b+1)*span) of kv head g, heads h0 .. h0+nh-1 of
 * its group; p_i = exp(s_i - m) with the row max m known, so the main loop
 * has no barriers: thread (tl, dl) takes tokens tl, tl+TL, ... and VEC
 * elements of their V rows, PV_U tokens' loads in flight. */
template <typename T, int VEC, int GM, bool HAS_V>
__global__ void __launch_bounds__(PV_TH) kv_pv_kernel(const kv_pv_params p) {
    __shared__ float sacc[HAS_V ? PV_TH * VEC : 1];
    __shared__ double sz[PV_TH / 32][GM];
    __shared__ double sZ[GM];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = blockIdx.x / p.bph, b = blockIdx.x % p.bph, hg = blockIdx.y, h0 = g * p.G + hg * GM;
    const int nh = min(GM, p.G - hg * GM);
    const int a0 = b * p.span, a1 = min(p.n, a0 + p.span);
    const int DL = HAS_V ? p.D / VEC : 1, TL = PV_TH / DL, dl = tid % DL, tl = tid / DL;
    float m[GM], acc[GM][VEC];
    double z[GM];
#pragma unroll
    for (int gi = 0; gi < GM; gi++) {
        m[gi] = gi < nh ? kv_key2f(__ldcg(p.mkey + h0 + gi)) : 0.f;
        z[gi] = 0;
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[gi][e] = 0.f;
    }
    if (tl < TL) {
        const T *vb = (const T *)p.V + (size_t)g * p.T * p.D + dl * VEC;
        for (int j = a0 + tl; j < a1; j += PV_U * TL) {
            float v[PV_U][VEC], s[PV_U][GM];
#pragma unroll
            for (int u = 0; u < PV_U; u++) {
                const int jj = j + u * TL;
                const bool ok = jj < a1;
#pragma unroll
                for (int gi = 0; gi < GM; gi++)
                    s[u][gi] = ok && gi < nh ? p.S[(size_t)(h0 + gi) * p.ld + jj] : -INFINITY;
                if (HAS_V) {
                    if (ok) kv_vload<T, VEC>::go(vb + (size_t)jj * p.D, v[u]);
                    else
#pragma unroll
                        for (int e = 0; e < VEC; e++) v[u][e] = 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < PV_U; u++)
#pragma unroll
                for (int gi = 0; gi < GM; gi++) {
                    const float pr = expf(s[u][gi] - m[gi]);
                    if (dl == 0) z[gi] += pr;
                    if (HAS_V)
#pragma unroll
                        for (int e = 0; e < VEC; e++) acc[gi][e] = fmaf(pr, v[u][e], acc[gi][e]);
                }
        }
    }
    /* block partials: z by a block sum (double), o by a sum over the token lanes */
#pragma unroll
    for (int gi = 0; gi < GM; gi++) {
        double x = z[gi];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        if (lane == 0) sz[warp][gi] = x;
    }
    __syncthreads();
    const size_t blk = (size_t)(g * p.ngroups + hg) * p.bph + b;
    if (tid < nh) {
        double x = 0;
        for (int w = 0; w < PV_TH / 32; w++) x += sz[w][tid];
        p.partz[blk * GM + tid] = x;
    }
    if (HAS_V) {
        float *po = p.part + blk * GM * p.D;
#pragma unroll
        for (int gi = 0; gi < GM; gi++) {
            if (gi >= nh) break;
            if (tl < TL)
#pragma unroll
                for (int e = 0; e < VEC; e++) sacc[tl * p.D + dl * VEC + e] = acc[gi][e];
            __syncthreads();
            for (int d = tid; d < p.D; d += PV_TH) {
                float x = 0.f;
                for (int l = 0; l < TL; l++) x += sacc[l * p.D + d];
                po[gi * p.D + d] = x;
            }
            __syncthreads();
        }
    }
    /* the last block of this (kv head, head group) combines the partials in a fixed order */
    if (!kv_arrives_last(&p.cnt[g * p.ngroups + hg], (unsigned)p.bph)) return;
    const size_t b0 = (size_t)(g * p.ngroups + hg) * p.bph;
    if (tid < nh) {
        double x = 0;
        for (int bb = 0; bb < p.bph; bb++) x += __ldcg(p.partz + (b0 + bb) * GM + tid);
        sZ[tid] = x;
        p.m[h0 + tid] = kv_key2f(__ldcg(p.mkey + h0 + tid));
        p.Z[h0 + tid] = (float)x;
    }
    __syncthreads();
    if (HAS_V)
        for (int e = tid; e < nh * p.D; e += PV_TH) {
            const int gi = e / p.D, d = e % p.D;
            double x = 0;
#pragma unroll 8
            for (int bb = 0; bb < p.bph; bb++) x += __ldcg(p.part + ((b0 + bb) * GM + gi) * p.D + d);
            p.o[(size_t)(h0 + gi) * p.D + d] = (float)(x / sZ[gi]);
        }
    __syncthreads();
    if (tid < nh) p.mkey[h0 + tid] = 0; /* clean for the next call */
    if (tid == 0) p.cnt[g * p.ngroups + hg] = 0;
}

/* The fast path (LPT = D / VEC lanes per token, 8, 16 or 32; or no V at
 * all): a warp takes 32 tokens at a time. Lane l computes p for token l of
 * the group (one exp per token and head, an online max per warp rescaling
 * its sums when a group raises it), then the group's V rows are streamed
 * 32 / LPT rows per load instruction, each lane 16 bytes, with p broadcast
 * by shuffle; all of a group's V loads are issued before its arithmetic.
 * No barrier in the main loop, no separate max pass. */
template <typename T, int VEC, int GM, int LPT, bool HAS_V>
__global__ void __launch_bounds__(PV_TH) kv_pvw_kernel(const kv_pv_params p) {
    constexpr int TPW = 32 / LPT, STEPS = 32 / TPW, NW = PV_TH / 32;
    __shared__ float sm_m[NW][GM];
    __shared__ double sm_z[NW][GM];
    __shared__ float sm_o[HAS_V ? NW * LPT * VEC : 1];
    __shared__ float sS[PV_BPH_MAX][GM];
    __shared__ double sPz[PV_BPH_MAX][GM];
    __shared__ double sZ[GM];
    __shared__ float sM[GM];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, tsub = lane / LPT, dl = lane % LPT;
    const int g = blockIdx.x / p.bph, b = blockIdx.x % p.bph, hg = blockIdx.y, h0 = g * p.G + hg * GM;
    const int nh = min(GM, p.G - hg * GM);
    const int a0 = b * p.span, a1 = min(p.n, a0 + p.span);
    float m_w[GM], acc[GM][VEC];
    double z[GM];
#pragma unroll
    for (int gi = 0; gi < GM; gi++) {
        m_w[gi] = -INFINITY;
        z[gi] = 0;
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[gi][e] = 0.f;
    }
    const T *vb = (const T *)p.V + (size_t)g * p.T * p.D + dl * VEC;
    for (int g0 = a0 + warp * 32; g0 < a1; g0 += PV_TH) {
        const int tok = g0 + lane;
        float s[GM];
#pragma unroll
        for (int gi = 0; gi < GM; gi++)
            s[gi] = tok < a1 && gi < nh ? p.S[(size_t)(h0 + gi) * p.ld + tok] : -INFINITY;
        typename kv_raw<T>::type raw[HAS_V ? STEPS : 1];
        if (HAS_V)
#pragma unroll
            for (int t = 0; t < STEPS; t++) {
                const int jt = g0 + t * TPW + tsub;
                if (jt < a1) raw[t] = *(const typename kv_raw<T>::type *)(vb + (size_t)jt * p.D);
                else memset(&raw[t], 0, sizeof raw[t]);
            }
        float pr[GM];
#pragma unroll
        for (int gi = 0; gi < GM; gi++) {
            float gmax = s[gi];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, o));
            if (gmax > m_w[gi]) { /* warp-uniform */
                const float sc = m_w[gi] == -INFINITY ? 0.f : expf(m_w[gi] - gmax);
                z[gi] *= sc;
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[gi][e] *= sc;
                m_w[gi] = gmax;
            }
            pr[gi] = s[gi] == -INFINITY ? 0.f : expf(s[gi] - m_w[gi]);
            z[gi] += pr[gi];
        }
        if (HAS_V)
#pragma unroll
            for (int t = 0; t < STEPS; t++) {
                float v[VEC];
                kv_raw<T>::cvt(raw[t], v);
#pragma unroll
                for (int gi = 0; gi < GM; gi++) {
                    const float pj = __shfl_sync(0xffffffffu, pr[gi], t * TPW + tsub);
#pragma unroll
                    for (int e = 0; e < VEC; e++) acc[gi][e] = fmaf(pj, v[e], acc[gi][e]);
                }
            }
    }
    /* warp partials to shared memory */
#pragma unroll
    for (int gi = 0; gi < GM; gi++) {
        double x = z[gi];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        if (lane == 0) { sm_z[warp][gi] = x; sm_m[warp][gi] = m_w[gi]; }
        if constexpr (HAS_V && LPT < 32)
#pragma unroll
            for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[gi][e] += __shfl_xor_sync(0xffffffffu, acc[gi][e], o);
    }
    const size_t blk = (size_t)(g * p.ngroups + hg) * p.bph + b;
#pragma unroll
    for (int gi = 0; gi < GM; gi++) {
        if (gi >= nh) break;
        if (HAS_V && tsub == 0)
#pragma unroll
            for (int e = 0; e < VEC; e++) sm_o[warp * LPT * VEC + dl * VEC + e] = acc[gi][e];
        __syncthreads();
        float mb = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++) mb = fmaxf(mb, sm_m[w][gi]);
        if (HAS_V)
            for (int d = tid; d < p.D; d += PV_TH) {
                float x = 0.f;
#pragma unroll
                for (int w = 0; w < NW; w++)
                    if (sm_m[w][gi] != -INFINITY) x += sm_o[w * LPT * VEC + d] * expf(sm_m[w][gi] - mb);
                p.part[(blk * GM + gi) * p.D + d] = x;
            }
        if (tid == 0) {
            double x = 0;
            for (int w = 0; w < NW; w++)
                if (sm_m[w][gi] != -INFINITY) x += sm_z[w][gi] * exp((double)sm_m[w][gi] - mb);
            p.partz[blk * GM + gi] = x;
            p.partm[blk * GM + gi] = mb;
        }
        __syncthreads();
    }
    /* the last block of this (kv head, head group) combines the partials in a fixed order */
    if (!kv_arrives_last(&p.cnt[g * p.ngroups + hg], (unsigned)p.bph)) return;
    const size_t b0 = (size_t)(g * p.ngroups + hg) * p.bph;
    /* every partial into shared memory at once (independent loads), then short smem loops */
    for (int e = tid; e < p.bph * nh; e += PV_TH) {
        const int bb = e / nh, gi = e % nh;
        sS[bb][gi] = __ldcg(p.partm + (b0 + bb) * GM + gi);
        sPz[bb][gi] = __ldcg(p.partz + (b0 + bb) * GM + gi);
    }
    __syncthreads();
    if (tid < nh) {
        float M = -INFINITY;
        for (int bb = 0; bb < p.bph; bb++) M = fmaxf(M, sS[bb][tid]);
        sM[tid] = M;
    }
    __syncthreads();
    for (int e = tid; e < p.bph * nh; e += PV_TH) { /* each partial's weight e^(m_b - M) */
        const int bb = e / nh, gi = e % nh;
        const float mb = sS[bb][gi];
        const double w = mb == -INFINITY ? 0.0 : exp((double)mb - sM[gi]);
        sPz[bb][gi] *= w;
        sS[bb][gi] = (float)w;
    }
    __syncthreads();
    if (tid < nh) {
        double Zs = 0;
        for (int bb = 0; bb < p.bph; bb++) Zs += sPz[bb][tid];
        sZ[tid] = Zs;
        p.m[h0 + tid] = sM[tid];
        p.Z[h0 + tid] = (float)Zs;
    }
    __syncthreads();
    if constexpr (HAS_V) {
        for (int e = tid; e < nh * p.D; e += PV_TH) {
            const int gi = e / p.D, d = e % p.D;
            double x = 0;
#pragma unroll 8
            for (int bb = 0; bb < p.bph; bb++)
                x += (double)__ldcg(p.part + ((b0 + bb) * GM + gi) * p.D + d) * sS[bb][gi];
            p.o[(size_t)(h0 + gi) * p.D + d] = (float)(x / sZ[gi]);
        }
    }
    if (tid == 0) p.cnt[g * p.ngroups + hg] = 0;
}

template <typename T, int VEC, int GM, int LPT, bool HAS_V>
kv_status kv_pvw_go(const kv_pv_params &p, int Hkv, cudaStream_t st) {
    kv_pvw_kernel<T, VEC, GM, LPT, HAS_V><<<dim3((unsigned)(Hkv * p.bph), (unsigned)p.ngroups), PV_TH, 0, st>>>(p);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

template <typename T, int VEC, int LPT, bool HAS_V>
kv_status kv_pvw_gm(const kv_pv_params &p, int GM, int Hkv, cudaStream_t st) {
    switch (GM) {
    case 1: return kv_pvw_go<T, VEC, 1, LPT, HAS_V>(p, Hkv, st);
    case 2: return kv_pvw_go<T, VEC, 2, LPT, HAS_V>(p, Hkv, st);
    case 4: return kv_pvw_go<T, VEC, 4, LPT, HAS_V>(p, Hkv, st);
    default: return kv_pvw_go<T, VEC, 8, LPT, HAS_V>(p, Hkv, st);
    }
}

template <typename T, int VEC>
kv_status kv_pvw_lpt(const kv_pv_params &p, int GM, int LPT, int Hkv, cudaStream_t st) {
    switch (LPT) {
    case 8: return kv_pvw_gm<T, VEC, 8, true>(p, GM, Hkv, st);
    case 16: return kv_pvw_gm<T, VEC, 16, true>(p, GM, Hkv, st);
    default: return kv_pvw_gm<T, VEC, 32, true>(p, GM, Hkv, st);
    }
}

template <typename T, int VEC, int GM, bool HAS_V>
kv_status kv_pv_go(const kv_pv_params &p, int Hkv, cudaStream_t st) {
    kv_pv_kernel<T, VEC, GM, HAS_V><<<dim3((unsigned)(Hkv * p.bph), (unsigned)p.ngroups), PV_TH, 0, st>>>(p);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

template <typename T, int VEC, bool HAS_V>
kv_status kv_pv_gm(const kv_pv_params &p, int GM, int Hkv, cudaStream_t st) {
    switch (GM) {
    case 1: return kv_pv_go<T, VEC, 1, HAS_V>(p, Hkv, st);
    case 2: return kv_pv_go<T, VEC, 2, HAS_V>(p, Hkv, st);
    case 4: return kv_pv_go<T, VEC, 4, HAS_V>(p, Hkv, st);
    default: return kv_pv_go<T, VEC, 8, HAS_V>(p, Hkv, st);
    }
}

int kv_pv_gm_of(int G) { return G > 4 ? 8 : G > 2 ? 4 : G; }

}  // namespace

kv_status kv_pv_ws_create(kv_pv_ws *w, int Hq, int Hkv, int D, const kv_cuda_dev *dev) {
    memset(w, 0, sizeof *w);
    w->Hq = Hq; w->Hkv = Hkv; w->D = D;
    const int G = Hq / Hkv, GM = kv_pv_gm_of(G), ngroups = (G + GM - 1) / GM;
    w->bph_max = (2 * dev->sm_count + Hkv * ngroups - 1) / (Hkv * ngroups); /* one wave at 2 blocks per SM */
    if (w->bph_max > PV_BPH_MAX) w->bph_max = PV_BPH_MAX;
    if (w->bph_max < 1) w->bph_max = 1;
    const size_t nb = (size_t)Hkv * ngroups * w->bph_max * GM;
    KV_CUDA_ALLOC(w->part, nb * D * sizeof(float), 0, "attention partial sums");
    KV_CUDA_ALLOC(w->partz, nb * sizeof(double), 0, "attention partial normalisers");
    KV_CUDA_ALLOC(w->partm, nb * sizeof(float), 0, "attention partial maxima");
    KV_CUDA_ALLOC(w->cnt, (size_t)Hkv * ngroups * sizeof(unsigned), 0, "attention counters");
    KV_CUDA_ALLOC(w->mkey, (size_t)Hq * sizeof(unsigned), 0, "attention row maxima");
    KV_CUDA_TRY(cudaMemset(w->cnt, 0, (size_t)Hkv * ngroups * sizeof(unsigned)));
    KV_CUDA_TRY(cudaMemset(w->mkey, 0, (size_t)Hq * sizeof(unsigned))); /* before any kernel: kv_stream_create */
    return KV_OK;
}

void kv_pv_ws_destroy(kv_pv_ws *w) {
    cudaFree(w->part);
    cudaFree(w->partz);
    cudaFree(w->partm);
    cudaFree(w->cnt);
    cudaFree(w->mkey);
    memset(w, 0, sizeof *w);
}

kv_status kv_pv_launch(kv_pv_ws *w, const float *S, long long ld, int n, const kv_dev_kv *V, float *m, float *Z,
                       float *o, const kv_cuda_dev *dev, cudaStream_t st) {
    if (n <= 0) return KV_OK;
    const int G = w->Hq / w->Hkv, GM = kv_pv_gm_of(G), D = w->D;
    int vec = 1;
    if (V) {
        const int wide = V->half ? 8 : 4;
        vec = D % wide == 0 && D / wide <= PV_TH ? wide : 1;
        if (D / vec > PV_TH)
            return kv_fail(KV_ERR_INPUT, "GPU attention: head_dim %d is not supported (at most %d, or a multiple "
                                         "of 8)", D, PV_TH);
    }
    kv_pv_params p = {};
    p.S = S; p.ld = ld; p.n = n; p.D = D; p.G = G; p.ngroups = (G + GM - 1) / GM;
    p.part = w->part; p.partz = w->partz; p.partm = w->partm; p.cnt = w->cnt; p.mkey = w->mkey;
    p.m = m; p.Z = Z; p.o = o;
    int bph = (n + PV_TH - 1) / PV_TH;
    if (bph > w->bph_max) bph = w->bph_max;
    p.span = (((n + bph - 1) / bph) + PV_TH - 1) / PV_TH * PV_TH;
    p.bph = (n + p.span - 1) / p.span;
    if (V) { p.V = V->p; p.T = V->T; }
    const int lpt = D / vec;
    if (!V) return kv_pvw_gm<float, 1, 32, false>(p, GM, w->Hkv, st);
    if (vec > 1 && (lpt == 8 || lpt == 16 || lpt == 32)) {
        if (V->half) return kv_pvw_lpt<__half, 8>(p, GM, lpt, w->Hkv, st);
        return kv_pvw_lpt<float, 4>(p, GM, lpt, w->Hkv, st);
    }
    /* other head dims: the row maxima first, then one block-wide pass */
    int rb = (n + 4095) / 4096, rcap = (4 * dev->sm_count + w->Hq - 1) / w->Hq;
    if (rb > rcap) rb = rcap;
    if (rb < 1) rb = 1;
    const int chunk = (n + rb - 1) / rb;
    kv_rowmax_kernel<<<dim3((unsigned)((n + chunk - 1) / chunk), (unsigned)w->Hq), PV_TH, 0, st>>>(S, ld, n, chunk,
                                                                                                 w->mkey);
    KV_LAUNCH_CHECK();
    if (V->half && vec == 8) return kv_pv_gm<__half, 8, true>(p, GM, w->Hkv, st);
    if (V->half) return kv_pv_gm<__half, 1, true>(p, GM, w->Hkv, st);
    if (vec == 4) return kv_pv_gm<float, 4, true>(p, GM, w->Hkv, st);
    return kv_pv_gm<float, 1, true>(p, GM, w->Hkv, st);
}

/* ---- the oracle object ---- */
namespace {
__global__ void kv_gather_kernel(const float *S, const uint32_t *pos, float *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = S[pos[i]];
}
constexpr int KV_GATHER_CHUNK = 1 << 20;

/* cnt[h] += #{i in [lo, split): S[h][i] >= thr[h]}, cnt[Hq + h] += the same over [split, hi). */
__global__ void kv_count_top_kernel(const float *S, long long ld, const float *thr, int lo, int split, int hi,
                                    unsigned *cnt, int Hq) {
    const int h = blockIdx.y;
    const float th = thr[h];
    unsigned a = 0, b = 0;
    for (int i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += gridDim.x * blockDim.x)
        if (S[h * ld + i] >= th) (i < split ? a : b)++;
    for (int o = 16; o; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    if ((threadIdx.x & 31) == 0) {
        if (a) atomicAdd(&cnt[h], a);
        if (b) atomicAdd(&cnt[Hq + h], b);
    }
}
}  // namespace


static kv_status kv_attn_init(kv_gpu_attn *a, int half, const float *K, const float *V, const uint16_t *K16,
                              const uint16_t *V16) {
    const int Hq = a->Hq, Hkv = a->Hkv, T = a->T, D = a->D;
    KV_TRY(kv_cuda_dev_query(&a->dev));
    /* all device memory first: an impossible size fails before anything is read */
    KV_TRY(kv_gpu_keys_create(Hkv, T, D, half, &a->K));
    if (V || V16) KV_TRY(kv_gpu_keys_create(Hkv, T, D, 1, &a->V)); /* float16 while lossless */
    char what[128];
    snprintf(what, sizeof what, "the oracle's scores [%d][%d]", Hq, T);
    KV_CUDA_ALLOC(a->S, (size_t)Hq * T * sizeof(float), 0, what);
    const size_t nres = (size_t)3 * Hq + (size_t)Hq * D;
    KV_CUDA_ALLOC(a->q, (size_t)Hq * D * sizeof(float), 0, "oracle queries");
    KV_CUDA_ALLOC(a->res, nres * sizeof(float), 0, "oracle results");
    KV_CUDA_ALLOC(a->gpos, (size_t)KV_GATHER_CHUNK * sizeof(uint32_t), 0, "oracle gather positions");
    KV_CUDA_ALLOC(a->gout, (size_t)KV_GATHER_CHUNK * sizeof(float), 0, "oracle gather output");
    KV_CUDA_ALLOC(a->cnt, (size_t)2 * Hq * sizeof(unsigned), 0, "oracle top-k origin counts");
    KV_CUDA_ALLOC(a->hcnt, (size_t)2 * Hq * sizeof(unsigned), 1, "oracle top-k origin counts staging");
    KV_TRY(kv_topk_ws_create(&a->tk, Hq, T, &a->dev));
    KV_TRY(kv_pv_ws_create(&a->pv, Hq, Hkv, D, &a->dev));
    KV_CUDA_ALLOC(a->hq, (size_t)Hq * D * sizeof(float), 1, "oracle query staging");
    KV_CUDA_ALLOC(a->hres, nres * sizeof(float), 1, "oracle result staging");
    KV_CUDA_ALLOC(a->hpos, (size_t)KV_GATHER_CHUNK * sizeof(uint32_t), 1, "oracle gather staging");
    KV_CUDA_ALLOC(a->hout, (size_t)KV_GATHER_CHUNK * sizeof(float), 1, "oracle gather staging");
    KV_CUDA_TRY(kv_stream_create(&a->st));
    if (K16) KV_TRY(kv_gpu_keys_write_half(a->K, 0, T, K16)); /* the layer's float16 form, as it is */
    else KV_TRY(kv_gpu_keys_write(a->K, 0, T, K));
    if (V16) KV_TRY(kv_gpu_keys_write_half(a->V, 0, T, V16));
    else if (V) KV_TRY(kv_gpu_keys_write(a->V, 0, T, V));
    return KV_OK;
}

static kv_status kv_attn_create(int Hq, int Hkv, int T, int D, int half, const float *K, const float *V,
                                const uint16_t *K16, const uint16_t *V16, kv_gpu_attn **out) {
    *out = NULL;
    if (Hkv <= 0 || Hq <= 0 || Hq % Hkv || T <= 0 || D <= 0)
        return kv_fail(KV_ERR_INPUT, "GPU oracle: invalid shape Hq=%d Hkv=%d T=%d D=%d", Hq, Hkv, T, D);
    if ((unsigned long long)Hq * T >= (1ULL << 32))
        return kv_fail(KV_ERR_INPUT, "GPU oracle: Hq*T = %llu score positions exceed 2^32",
                       (unsigned long long)Hq * T);
    kv_gpu_attn *a = (kv_gpu_attn *)kv_calloc(1, sizeof *a, "GPU oracle");
    if (!a) return KV_ERR_NOMEM;
    a->Hq = Hq; a->Hkv = Hkv; a->T = T; a->D = D;
    kv_status st = kv_attn_init(a, half, K, V, K16, V16);
    if (st != KV_OK) { kv_gpu_attn_destroy(a); return st; }
    *out = a;
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_create(int Hq, int Hkv, int T, int D, int half, const float *K, const float *V,
                                        kv_gpu_attn **out) {
    return kv_attn_create(Hq, Hkv, T, D, half, K, V, NULL, NULL, out);
}

extern "C" kv_status kv_gpu_attn_create_half(int Hq, int Hkv, int T, int D, const uint16_t *K, const uint16_t *V,
                                             kv_gpu_attn **out) {
    return kv_attn_create(Hq, Hkv, T, D, 1, NULL, NULL, K, V, out);
}

extern "C" kv_status kv_gpu_attn_step(kv_gpu_attn *a, int t, const float *q, float scale, int lo, int hi, int k,
                                      float *m, float *Z, float *thr, float *o_full, int split, int *ntop) {
    const int Hq = a->Hq, D = a->D, n = t + 1;
    if (t < 0 || t >= a->T) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: step %d outside [0, %d)", t, a->T);
    if (lo < 0) lo = 0;
    if (hi > n) hi = n;
    const int kk = hi > lo ? (k < hi - lo ? k : hi - lo) : 0;
    memcpy(a->hq, q, (size_t)Hq * D * sizeof(float));
    if (!a->ev_ready) { /* the device-time events (attn_state.cuh), made at the first step */
        for (int i = 0; i < 6; i++) KV_CUDA_TRY(cudaEventCreate(&a->ev[i]));
        a->ev_ready = 1;
    }
    KV_CUDA_TRY(cudaEventRecord(a->ev[0], a->st));
    KV_CUDA_TRY(cudaMemcpyAsync(a->q, a->hq, (size_t)Hq * D * sizeof(float), cudaMemcpyHostToDevice, a->st));
    kv_score_extras x = {kk > 0 ? a->tk.hist : NULL, lo, hi, kk > 0 ? a->tk.tmax : NULL, a->tk.tmax_ld, 0, -1};
    KV_TRY(kv_scores_launch(&a->K->a, a->q, Hq, scale, 0, n, a->S, a->T, &x, &a->dev, a->st));
    if (kk > 0)
        KV_TRY(kv_topk_launch(&a->tk, a->S, a->T, lo, hi - lo, Hq, kk, 0, &x, 0, NULL, NULL, 0, a->res + 2 * Hq,
                              a->st));
    if (kk > 0 && ntop) {
        KV_CUDA_TRY(cudaMemsetAsync(a->cnt, 0, (size_t)2 * Hq * sizeof(unsigned), a->st));
        int bx = (hi - lo + 255) / 256, cap = (2 * a->dev.sm_count + Hq - 1) / Hq;
        dim3 grid(bx < cap ? bx : (cap < 1 ? 1 : cap), Hq);
        kv_count_top_kernel<<<grid, 256, 0, a->st>>>(a->S, a->T, a->res + 2 * Hq, lo, split, hi, a->cnt, Hq);
        KV_LAUNCH_CHECK();
        KV_CUDA_TRY(cudaMemcpyAsync(a->hcnt, a->cnt, (size_t)2 * Hq * sizeof(unsigned), cudaMemcpyDeviceToHost, a->st));
    }
    KV_TRY(kv_pv_launch(&a->pv, a->S, a->T, n, a->V ? &a->V->a : NULL, a->res, a->res + Hq, a->res + 3 * Hq, &a->dev,
                        a->st));
    const size_t nres = (size_t)3 * Hq + (a->V ? (size_t)Hq * D : 0);
    KV_CUDA_TRY(cudaMemcpyAsync(a->hres, a->res, nres * sizeof(float), cudaMemcpyDeviceToHost, a->st));
    if (a->ev_ready) KV_CUDA_TRY(cudaEventRecord(a->ev[1], a->st));
    KV_CUDA_TRY(cudaStreamSynchronize(a->st));
    kv_attn_ev_add(a, 0, 1, &a->t_step);
    if (a->diag_timed) { kv_attn_ev_add(a, 4, 5, &a->t_diag); a->diag_timed = 0; }
    for (int h = 0; h < Hq; h++) {
        m[h] = a->hres[h];
        Z[h] = a->hres[Hq + h];
        thr[h] = kk > 0 ? a->hres[2 * Hq + h] : INFINITY;
    }
    if (a->V && o_full) memcpy(o_full, a->hres + 3 * Hq, (size_t)Hq * D * sizeof(float));
    for (int i = 0; ntop && i < 2 * Hq; i++) ntop[i] = kk > 0 ? (int)a->hcnt[i] : 0;
    a->n_last = n;
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_gather(kv_gpu_attn *a, const int32_t *idx, const int *count, int cap, float *out) {
    int h = 0, j = 0; /* cursor of the next entry to pack, and of the next to unpack */
    int uh = 0, uj = 0;
    for (;;) {
        int c = 0;
        while (h < a->Hq && c < KV_GATHER_CHUNK) {
            if (j >= count[h]) { h++; j = 0; continue; }
            const int32_t i = idx[(size_t)h * cap + j];
            if (i < 0 || i >= a->n_last)
                return kv_fail(KV_ERR_INTERNAL, "GPU oracle: gather of position %d outside the last step's [0, %d)", i,
                               a->n_last);
            a->hpos[c++] = (uint32_t)h * (uint32_t)a->T + (uint32_t)i;
            j++;
        }
        if (c == 0) break;
        KV_CUDA_TRY(cudaMemcpyAsync(a->gpos, a->hpos, (size_t)c * sizeof(uint32_t), cudaMemcpyHostToDevice, a->st));
        kv_gather_kernel<<<(c + 255) / 256 < 1024 ? (c + 255) / 256 : 1024, 256, 0, a->st>>>(a->S, a->gpos, a->gout, c);
        KV_LAUNCH_CHECK();
        KV_CUDA_TRY(cudaMemcpyAsync(a->hout, a->gout, (size_t)c * sizeof(float), cudaMemcpyDeviceToHost, a->st));
        KV_CUDA_TRY(cudaStreamSynchronize(a->st));
        for (int e = 0; e < c;) {
            if (uj >= count[uh]) { uh++; uj = 0; continue; }
            out[(size_t)uh * cap + uj++] = a->hout[e++];
        }
    }
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_scores(kv_gpu_attn *a, const float **rows, int *n) {
    *rows = NULL;
    *n = 0;
    if (a->n_last <= 0) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: scores asked before any step");
    if (!a->hS) {
        char what[128];
        snprintf(what, sizeof what, "the oracle's host copy of the scores [%d][%d]", a->Hq, a->T);
        KV_CUDA_ALLOC(a->hS, (size_t)a->Hq * a->T * sizeof(float), 1, what);
    }
    const size_t ld = (size_t)a->T * sizeof(float);
    KV_CUDA_TRY(cudaMemcpy2DAsync(a->hS, ld, a->S, ld, (size_t)a->n_last * sizeof(float), (size_t)a->Hq,
                                  cudaMemcpyDeviceToHost, a->st));
    KV_CUDA_TRY(cudaStreamSynchronize(a->st));
    *rows = a->hS;
    *n = a->n_last;
    return KV_OK;
}

extern "C" const kv_gpu_keys *kv_gpu_attn_keys(const kv_gpu_attn *a) { return a->K; }

extern "C" void kv_gpu_attn_destroy(kv_gpu_attn *a) {
    if (!a) return;
    if (a->st) cudaStreamSynchronize(a->st);
    kv_gpu_keys_destroy(a->K);
    kv_gpu_keys_destroy(a->V);
    cudaFree(a->q); cudaFree(a->S); cudaFree(a->res); cudaFree(a->gpos); cudaFree(a->gout); cudaFree(a->cnt);
    cudaFreeHost(a->hq); cudaFreeHost(a->hres); cudaFreeHost(a->hpos); cudaFreeHost(a->hout); cudaFreeHost(a->hcnt);
    cudaFreeHost(a->hS);
    kv_topk_ws_destroy(&a->tk);
    kv_pv_ws_destroy(&a->pv);
    cudaFree(a->ev_ks); cudaFree(a->ev_key); cudaFree(a->ev_key2); cudaFree(a->ev_tmp); cudaFree(a->ev_res);
    cudaFree(a->ev_part);
    cudaFreeHost(a->ev_hres);
    for (int i = 0; a->slots && i < a->n_slots; i++) {
        kv_attn_slot *sl = &a->slots[i];
        cudaFreeHost(sl->hin); cudaFree(sl->din); cudaFree(sl->dcopy);
    }
    free(a->slots);
    cudaFree(a->drows); cudaFreeHost(a->hrows); cudaFree(a->dpar); cudaFreeHost(a->hpar); cudaFree(a->dchits);
    if (a->st) cudaStreamDestroy(a->st);
    for (int i = 0; a->ev_ready && i < 6; i++) cudaEventDestroy(a->ev[i]);
    free(a);
}
