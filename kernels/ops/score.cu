/* score.cu: exact attention scores on the GPU, s[h][i] = scale * <q_h, k_i>,
 * for all query heads of a kv group at once (issue 2, point 8; the cost
 * every method is measured against). Decode is memory-bound: each kv
 * head's keys are read ONCE for its G query heads. A block streams runs of
 * whole tiles (256 float16 keys, 64 KB) of the flattened (kv head, tile)
 * list through a 3-stage cp.async pipeline with 16-byte coalesced loads,
 * so two tiles are in flight while one is computed; a pair of threads owns
 * one key and its G dot products. Shared-memory rows are padded by 16
 * bytes, which makes the per-thread row reads conflict-free. The arithmetic is
 * the C reference's, operation for operation (8 partial sums in dimension
 * order, separate rounded multiply and add, the same final tree), so GPU
 * scores are bitwise equal to kv_scores_ref: the GPU oracle's threshold and
 * the GPU exact retriever's selections equal the CPU's exactly. That costs
 * twice the FP32 instructions of FMA, still ~3x below what the SMs issue at
 * memory speed. Optionally the kernel also histograms the top 11 bits of
 * each score's order-preserving key (the top-k's first radix pass) in
 * shared memory, so the top-k does not read the scores an extra time (off
 * by default: kv_scores_launch), and records each tile's largest score, so
 * the top-k's candidate pass reads only the few tiles that can hold a
 * top-k score.
 * D = 64 and 128 take this path; any other D a plain one-thread-per-key
 * kernel with the same arithmetic. */
#include "kv_cuda.h"

namespace {

constexpr int KV_SC_STAGES = 3;

template <typename T> struct kv_sc_cfg;
template <> struct kv_sc_cfg<__half> { static constexpr int threads = 256; };
template <> struct kv_sc_cfg<float> { static constexpr int threads = 128; };

struct kv_score_params {
    const void *K;
    long long T;         /* K is [Hkv][T][D] */
    const float *q;      /* [Hq][D] */
    int G, hg, nh;       /* heads g*G + hg*GM + gi, gi < nh */
    int D;
    float scale;
    int lo, n;           /* keys lo .. lo+n-1 */
    float *out;
    long long ld;
    unsigned *hist;      /* [Hq][2048] or NULL */
    int hlo, hhi;
    unsigned *tmax;      /* [Hq][tmax_ld] tile maxima or NULL */
    long long tmax_ld;
    int tph;             /* tiles per kv head */
    long long total;     /* tiles over all kv heads */
};

__device__ __forceinline__ float kv_tof(__half h) { return __half2float(h); }
__device__ __forceinline__ float kv_tof(float f) { return f; }

/* Elements 8c + 4hh .. 8c + 4hh + 3 of a staged row (one half of a chunk),
 * as floats (exact conversions). */
__device__ __forceinline__ void kv_load4(const __half *row, int c, int hh, float k[4]) {
    uint2 u = *(const uint2 *)(row + 8 * c + 4 * hh);
    const __half2 *h = (const __half2 *)&u;
    float2 f0 = __half22float2(h[0]), f1 = __half22float2(h[1]);
    k[0] = f0.x; k[1] = f0.y; k[2] = f1.x; k[3] = f1.y;
}
__device__ __forceinline__ void kv_load4(const float *row, int c, int hh, float k[4]) {
    float4 a = *(const float4 *)(row + 8 * c + 4 * hh);
    k[0] = a.x; k[1] = a.y; k[2] = a.z; k[3] = a.w;
}

/* kv_dot_ref's final combination of its 8 partial sums. */
__device__ __forceinline__ float kv_dot_finish(const float a[8]) {
    return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[4]), __fadd_rn(a[1], a[5])),
                     __fadd_rn(__fadd_rn(a[2], a[6]), __fadd_rn(a[3], a[7])));
}

/* Warp-aggregated shared histogram add of the score's top 11-bit digit:
 * scores crowd into few bins, so lanes with equal digits add once. */
__device__ __forceinline__ void kv_hist_add(unsigned *hs, float s, bool valid) {
    unsigned d = valid ? (kv_f2key(s) >> 21) : 0xffffffffu;
    unsigned peers = __match_any_sync(0xffffffffu, d);
    if (valid && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hs[d], (unsigned)__popc(peers));
}

template <int GM>
__device__ void kv_hist_flush(unsigned *hs, const kv_score_params &p, int g, int threads) {
    for (int b = threadIdx.x; b < GM * KV_HIST_BINS; b += threads) {
        unsigned v = hs[b];
        if (v) {
            int h = g * p.G + p.hg * GM + b / KV_HIST_BINS;
            atomicAdd(&p.hist[(size_t)h * KV_HIST_BINS + b % KV_HIST_BINS], v);
            hs[b] = 0;
        }
    }
}

template <typename T, int D, int GM>
constexpr size_t kv_sc_smem(bool hist) {
    return (size_t)KV_SC_STAGES * kv_sc_cfg<T>::threads * (D * sizeof(T) + 16) + GM * D * sizeof(float) +
           (hist ? (size_t)GM * KV_HIST_BINS * sizeof(unsigned) : 0);
}

/* Two threads per key: thread hh of the pair owns partial sums 4hh .. 4hh+3
 * (dimensions = 4hh .. 4hh+3 mod 8), each summed in dimension order exactly
 * as in the C reference; the pair swaps them by shuffle for the final tree.
 * Twice the warps of one thread per key for the same shared memory, which
 * hides the latency the single-warp-per-scheduler version left exposed. */
template <typename T, int D, int GM, bool HIST>
__global__ void __launch_bounds__(2 * kv_sc_cfg<T>::threads) kv_score_tile_kernel(const kv_score_params p) {
    constexpr int TILE = kv_sc_cfg<T>::threads, TH = 2 * TILE, NV = D * (int)sizeof(T) / 16;
    constexpr int RB = D * (int)sizeof(T), ROWB = RB + 16, STB = TILE * ROWB;
    extern __shared__ __align__(16) unsigned char kv_sm[];
    __shared__ unsigned wmax[GM][TH / 32];
    float *qs = (float *)(kv_sm + KV_SC_STAGES * STB);
    unsigned *hs = (unsigned *)(qs + GM * D);
    const int tid = threadIdx.x;
    const long long x0 = (long long)blockIdx.x * p.total / gridDim.x;
    const long long nt = (long long)(blockIdx.x + 1) * p.total / gridDim.x - x0;
    if (HIST)
        for (int b = tid; b < GM * KV_HIST_BINS; b += TH) hs[b] = 0;

    auto issue = [&](long long x, int s) {
        const int g = (int)(x / p.tph), i0 = (int)(x % p.tph) * TILE, rows = min(TILE, p.n - i0);
        const char *src = (const char *)p.K + ((size_t)g * p.T + p.lo + i0) * RB;
        unsigned char *dst = kv_sm + s * STB;
#pragma unroll
        for (int j = 0; j < NV / 2; j++) {
            const int v = tid + j * TH, r = v / NV, c = v % NV;
            if (r < rows) kv_cp16(dst + r * ROWB + c * 16, src + (size_t)r * RB + c * 16);
        }
    };

#pragma unroll
    for (int s = 0; s < KV_SC_STAGES - 1; s++) {
        if (s < nt) issue(x0 + s, s);
        kv_cp_commit();
    }
    int cur_g = -1;
    for (long long it = 0; it < nt; it++) {
        const long long nx = it + KV_SC_STAGES - 1;
        if (nx < nt) issue(x0 + nx, (int)(nx % KV_SC_STAGES));
        kv_cp_commit();
        kv_cp_wait<KV_SC_STAGES - 1>();
        __syncthreads();
        const long long x = x0 + it;
        const int g = (int)(x / p.tph), i = (int)(x % p.tph) * TILE + (tid >> 1), hh = tid & 1;
        if (g != cur_g) { /* a new kv head: flush its predecessor's histogram, load its queries */
            if (HIST && cur_g >= 0) kv_hist_flush<GM>(hs, p, cur_g, TH);
            for (int e = tid; e < GM * D; e += TH) {
                const int gi = e / D;
                qs[e] = gi < p.nh ? p.q[(size_t)(g * p.G + p.hg * GM + gi) * D + e % D] : 0.f;
            }
            cur_g = g;
            __syncthreads();
        }
        const T *row = (const T *)(kv_sm + (int)(it % KV_SC_STAGES) * STB + (tid >> 1) * ROWB);
        float acc[GM][4];
#pragma unroll
        for (int gi = 0; gi < GM; gi++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[gi][j] = 0.f;
#pragma unroll
        for (int c = 0; c < D / 8; c++) {
            float k[4];
            kv_load4(row, c, hh, k);
#pragma unroll
            for (int gi = 0; gi < GM; gi++) {
                const float4 qa = *(const float4 *)(qs + gi * D + 8 * c + 4 * hh);
                acc[gi][0] = __fadd_rn(acc[gi][0], __fmul_rn(qa.x, k[0]));
                acc[gi][1] = __fadd_rn(acc[gi][1], __fmul_rn(qa.y, k[1]));
                acc[gi][2] = __fadd_rn(acc[gi][2], __fmul_rn(qa.z, k[2]));
                acc[gi][3] = __fadd_rn(acc[gi][3], __fmul_rn(qa.w, k[3]));
            }
        }
        const bool valid = i < p.n && hh == 0;
#pragma unroll
        for (int gi = 0; gi < GM; gi++) {
            if (gi >= p.nh) break;
            float a[8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float o = __shfl_xor_sync(0xffffffffu, acc[gi][j], 1);
                a[j] = hh ? o : acc[gi][j];
                a[4 + j] = hh ? acc[gi][j] : o;
            }
            const float s = __fmul_rn(p.scale, kv_dot_finish(a));
            if (valid) p.out[(size_t)(g * p.G + p.hg * GM + gi) * p.ld + i] = s;
            if (HIST) kv_hist_add(hs + gi * KV_HIST_BINS, s, valid && i >= p.hlo && i < p.hhi);
            if (p.tmax) {
                const unsigned mx = __reduce_max_sync(0xffffffffu, valid ? kv_f2key(s) : 0u);
                if ((tid & 31) == 0) wmax[gi][tid >> 5] = mx;
            }
        }
        __syncthreads();
        if (p.tmax && tid < p.nh) { /* the tile's largest key, per head */
            unsigned mx = 0;
#pragma unroll
            for (int w = 0; w < TH / 32; w++) mx = max(mx, wmax[tid][w]);
            p.tmax[(size_t)(g * p.G + p.hg * GM + tid) * p.tmax_ld + x % p.tph] = mx;
        }
    }
    if (HIST && cur_g >= 0) kv_hist_flush<GM>(hs, p, cur_g, TH);
}

/* Any D: one thread per key, the same arithmetic, no staging. */
template <typename T>
__global__ void kv_score_generic_kernel(const kv_score_params p, int Hkv) {
    const long long total = (long long)Hkv * p.n;
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < total;
         x += (long long)gridDim.x * blockDim.x) {
        const int g = (int)(x / p.n), i = (int)(x % p.n);
        const T *k = (const T *)p.K + ((size_t)g * p.T + p.lo + i) * p.D;
        for (int gi = 0; gi < p.G; gi++) {
            const int h = g * p.G + gi;
            const float *q = p.q + (size_t)h * p.D;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            int d = 0;
            for (; d + 8 <= p.D; d += 8)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[j] = __fadd_rn(acc[j], __fmul_rn(q[d + j], kv_tof(k[d + j])));
#pragma unroll
            for (int j = 0; j < 8; j++) /* the tail: element d+j goes to partial sum (d+j) & 7 = j */
                if (d + j < p.D) acc[j] = __fadd_rn(acc[j], __fmul_rn(q[d + j], kv_tof(k[d + j])));
            p.out[(size_t)h * p.ld + i] = __fmul_rn(p.scale, kv_dot_finish(acc));
        }
    }
}

template <typename T, int D, int GM, bool HIST>
kv_status kv_score_go(const kv_score_params &p, const kv_cuda_dev *dev, cudaStream_t st) {
    constexpr size_t smem = kv_sc_smem<T, D, GM>(HIST);
    auto kern = kv_score_tile_kernel<T, D, GM, HIST>;
    constexpr int threads = 2 * kv_sc_cfg<T>::threads;
    KV_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    long long per_sm = dev->smem_per_sm / (long long)(smem + 1024);
    if (per_sm < 1) per_sm = 1;
    if (per_sm > 2048 / threads) per_sm = 2048 / threads;
    long long grid = per_sm * dev->sm_count;
    if (grid > p.total) grid = p.total;
    kern<<<(unsigned)grid, threads, smem, st>>>(p);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

template <typename T, int D>
kv_status kv_score_dispatch_gm(const kv_score_params &p, int GM, bool hist, const kv_cuda_dev *dev,
                               cudaStream_t st) {
    switch (GM * 2 + (hist ? 1 : 0)) {
    case 2: return kv_score_go<T, D, 1, false>(p, dev, st);
    case 3: return kv_score_go<T, D, 1, true>(p, dev, st);
    case 4: return kv_score_go<T, D, 2, false>(p, dev, st);
    case 5: return kv_score_go<T, D, 2, true>(p, dev, st);
    case 8: return kv_score_go<T, D, 4, false>(p, dev, st);
    case 9: return kv_score_go<T, D, 4, true>(p, dev, st);
    case 16: return kv_score_go<T, D, 8, false>(p, dev, st);
    default: return kv_score_go<T, D, 8, true>(p, dev, st);
    }
}

size_t kv_score_smem(int half, int D, int GM, bool hist) {
    if (half) {
        if (D == 64) return GM == 1 ? kv_sc_smem<__half, 64, 1>(hist) : GM == 2 ? kv_sc_smem<__half, 64, 2>(hist)
                          : GM == 4 ? kv_sc_smem<__half, 64, 4>(hist) : kv_sc_smem<__half, 64, 8>(hist);
        return GM == 1 ? kv_sc_smem<__half, 128, 1>(hist) : GM == 2 ? kv_sc_smem<__half, 128, 2>(hist)
               : GM == 4 ? kv_sc_smem<__half, 128, 4>(hist) : kv_sc_smem<__half, 128, 8>(hist);
    }
    if (D == 64) return GM == 1 ? kv_sc_smem<float, 64, 1>(hist) : GM == 2 ? kv_sc_smem<float, 64, 2>(hist)
                      : GM == 4 ? kv_sc_smem<float, 64, 4>(hist) : kv_sc_smem<float, 64, 8>(hist);
    return GM == 1 ? kv_sc_smem<float, 128, 1>(hist) : GM == 2 ? kv_sc_smem<float, 128, 2>(hist)
           : GM == 4 ? kv_sc_smem<float, 128, 4>(hist) : kv_sc_smem<float, 128, 8>(hist);
}

}  // namespace

kv_status kv_scores_launch(const kv_dev_kv *K, const float *q, int Hq, float scale, int lo, int n, float *out,
                           long long ld, kv_score_extras *x, const kv_cuda_dev *dev, cudaStream_t st) {
    if (x) { x->hist_done = 0; x->tshift = -1; }
    if (n <= 0) return KV_OK;
    const int G = Hq / K->H, D = K->D;
    unsigned *hist = x ? x->hist : NULL;
    kv_score_params p = {};
    p.K = K->p; p.T = K->T; p.q = q; p.G = G; p.D = D; p.scale = scale; p.lo = lo; p.n = n; p.out = out; p.ld = ld;
    if (x) { p.hlo = x->hlo; p.hhi = x->hhi; }
    if (D != 64 && D != 128) {
        long long blocks = ((long long)K->H * n + 255) / 256, cap = 16LL * dev->sm_count;
        if (K->half) kv_score_generic_kernel<__half><<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, st>>>(p, K->H);
        else kv_score_generic_kernel<float><<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, st>>>(p, K->H);
        KV_LAUNCH_CHECK();
        return KV_OK;
    }
    const int GM = G > 4 ? 8 : G > 2 ? 4 : G, ngroups = (G + GM - 1) / GM;
    const int tile = K->half ? kv_sc_cfg<__half>::threads : kv_sc_cfg<float>::threads;
    p.tph = (n + tile - 1) / tile;
    p.total = (long long)K->H * p.tph;
    /* The histogram rides along only with KVBENCH_SCORE_HIST=1 (dev->score_hist). It saves the top-k a pass
     * over the scores, but its shared atomics cost more: the scores crowd into few of the 2048 bins, so the
     * warps' adds meet on the same words. Exact search, H200, 16 q and 8 kv heads, session 30 call E, with /
     * without it (us): 34.7 / 34.1-34.5 at 16K, 46.7 / 43.8-44.1 at 32K, 69.9 / 62.6-63.1 at 64K, 120.3 /
     * 104.1-104.3 at 128K, 783.8 / 637.3-638.8 at 1M (the 1M launch 759.4 with it, 594.7 without). */
    const bool fuse = hist && dev->score_hist && ngroups == 1 && kv_score_smem(K->half, D, GM, true) <= (size_t)dev->smem_optin;
    p.hist = fuse ? hist : NULL;
    if (x && x->tmax) { p.tmax = x->tmax; p.tmax_ld = x->tmax_ld; }
    for (int hg = 0; hg < ngroups; hg++) {
        p.hg = hg;
        p.nh = G - hg * GM < GM ? G - hg * GM : GM;
        if (K->half) {
            if (D == 64) KV_TRY((kv_score_dispatch_gm<__half, 64>(p, GM, fuse, dev, st)));
            else KV_TRY((kv_score_dispatch_gm<__half, 128>(p, GM, fuse, dev, st)));
        } else {
            if (D == 64) KV_TRY((kv_score_dispatch_gm<float, 64>(p, GM, fuse, dev, st)));
            else KV_TRY((kv_score_dispatch_gm<float, 128>(p, GM, fuse, dev, st)));
        }
    }
    if (x) {
        x->hist_done = fuse;
        x->tshift = p.tmax ? (tile == 256 ? 8 : 7) : -1;
    }
    return KV_OK;
}

/* ---- host-array entry point (tests) ---- */
namespace {
struct kv_sc_host {
    kv_gpu_keys *keys;
    float *q, *out;
    cudaStream_t st;
};
kv_status kv_sc_host_run(kv_sc_host *r, const float *q, const float *K, int Hq, int Hkv, int T, int D, int half,
                         float scale, int lo, int hi, float *out) {
    kv_cuda_dev dev;
    KV_TRY(kv_cuda_dev_query(&dev));
    KV_TRY(kv_gpu_keys_create(Hkv, T, D, half, &r->keys));
    KV_TRY(kv_gpu_keys_write(r->keys, 0, T, K));
    const int n = hi - lo;
    KV_CUDA_ALLOC(r->q, (size_t)Hq * D * sizeof(float), 0, "test queries");
    KV_CUDA_ALLOC(r->out, (size_t)Hq * (n > 0 ? n : 1) * sizeof(float), 0, "test scores");
    KV_CUDA_TRY(kv_stream_create(&r->st));
    KV_CUDA_TRY(cudaMemcpy(r->q, q, (size_t)Hq * D * sizeof(float), cudaMemcpyHostToDevice));
    KV_TRY(kv_scores_launch(&r->keys->a, r->q, Hq, scale, lo, n, r->out, n, NULL, &dev, r->st));
    KV_CUDA_TRY(cudaStreamSynchronize(r->st));
    KV_CUDA_TRY(cudaMemcpy(out, r->out, (size_t)Hq * n * sizeof(float), cudaMemcpyDeviceToHost));
    return KV_OK;
}
}  // namespace

extern "C" kv_status kv_gpu_scores_host(const float *q, const float *K, int Hq, int Hkv, int T, int D, int half,
                                        float scale, int lo, int hi, float *out) {
    if (Hkv <= 0 || Hq % Hkv || lo < 0 || hi > T || hi < lo)
        return kv_fail(KV_ERR_INPUT, "kv_gpu_scores_host: bad shape (Hq %d, Hkv %d, [%d, %d) of %d)", Hq, Hkv, lo, hi, T);
    kv_sc_host r = {};
    kv_status st = kv_sc_host_run(&r, q, K, Hq, Hkv, T, D, half, scale, lo, hi, out);
    if (r.st) cudaStreamDestroy(r.st);
    cudaFree(r.q);
    cudaFree(r.out);
    kv_gpu_keys_destroy(r.keys);
    return st;
}
