/* ctkvr.cu: CTKVR's CUDA path (issue 9, point 4; the CPU reference and the
 * paper's facts are in retrievers/ctkvr.c).
 *
 * Build: per slot, the scores of its Hq queries over [sink, idx_hi) by the
 * shared score kernel (kv_scores_launch: bitwise kv_scores_ref), the log-sum-
 * exp of each row (max in float, sum of exp in double, one block per row),
 * the ranking value max over the group of float(s - lse), and the top rho
 * per kv head by the shared top-k (kv_topk_launch: kv_topk_ref's order).
 * The lists are also kept sorted by position (lsrt: ct_sort_lists after the
 * build and after each DCU commit) for the one-launch search's merge.
 * Search (default): the whole search as ONE launch, ctkvr_search.cuh
 * (version 3 = version 2 with the rerank's key reads coalesced through
 * per-warp shared tiles; its header has the design; the same numbers as
 * the staged path below) within its shared-memory limit; KVBENCH_CTKVR_V2=1
 * runs version 2 (the same kernel, one thread per key reading its own row),
 * KVBENCH_CTKVR_FUSED=1 version 1 (ctkvr_fused.cuh, the set <= 4096 keys), and
 * KVBENCH_CTKVR_STAGED=1 or a search outside those limits the staged path.
 * Staged search: cosines of the query to every slot (one thread per (kv
 * head, slot), kv_dot_ref's order with __fmul_rn/__fadd_rn, so bitwise the CPU's),
 * top C' by the shared top-k, then one block per kv head gathers the C'
 * lists into shared memory, bitonic-sorts them and keeps the distinct
 * positions (ascending, as the CPU's qsort) below gen_lo, then appends
 * [gen_lo, hi) (the generated keys with gen=rerank; an empty range with
 * gen=dense). Rerank: the set's scores (one thread per (query head, key),
 * bitwise the CPU's), lse and ranking as in the build, padded with -inf to
 * the host's bound on the set size, top k (and top rho for DCU) by the
 * shared top-k; row positions map back to keys on the host, which also
 * receives the set (the candidates). The lse sums in a different order than
 * the CPU (a block reduction), so a ranking value may differ in its last
 * bit: selections then differ only between keys whose values tie to within
 * an ulp. DCU commit writes the step's queries and the host-mapped list
 * into the slot. C' x rho <= 16384 (the gather's shared memory). */
#include <stdlib.h>
#include <string.h>

#include "ctkvr.h"
#include "ops/bench_method.cuh"
#include "ops/block_topk.cuh"
#include "ops/kv_cuda.h"

namespace {

constexpr int CT_GATHER_CAP = 16384;

__device__ __forceinline__ float ct_tof(__half h) { return __half2float(h); }
__device__ __forceinline__ float ct_tof(float f) { return f; }

/* kv_dot_ref's order: 8 partial sums, then ((0+4)+(1+5))+((2+6)+(3+7)), no contraction. */
template <typename TK> __device__ __forceinline__ float ct_dot(const float *a, const TK *b, int d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= d; i += 8)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = __fadd_rn(acc[j], __fmul_rn(a[i + j], ct_tof(b[i + j])));
    for (; i < d; i++) acc[i & 7] = __fadd_rn(acc[i & 7], __fmul_rn(a[i], ct_tof(b[i])));
    return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                     __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7])));
}

/* lse[h] over S[h*ld + a], a < n (n = nrow[h/G] when nrow, else n_fixed). One block per row. */
__global__ void ct_lse(const float *S, long long ld, const int *nrow, int n_fixed, int G, double *lse) {
    __shared__ float smax[32];
    __shared__ double ssum[32];
    const int h = blockIdx.x, n = nrow ? nrow[h / G] : n_fixed, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *row = S + (size_t)h * ld;
    float mx = -INFINITY;
    for (int a = threadIdx.x; a < n; a += blockDim.x) mx = fmaxf(mx, row[a]);
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) smax[w] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) mx = fmaxf(mx, smax[i]);
    double z = 0;
    for (int a = threadIdx.x; a < n; a += blockDim.x) z += exp((double)row[a] - (double)mx);
    for (int o = 16; o; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
    if (lane == 0) ssum[w] = z;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += ssum[i];
        lse[h] = n > 0 ? (double)mx + log(t) : 0.0;
    }
}

/* rank[g*rld + a] = max over the group of float(S[h][a] - lse[h]) for a < n_g; -inf up to npad. */
__global__ void ct_rank(const float *S, long long ld, const double *lse, int G, int Hkv, const int *nrow, int n_fixed,
                        int npad, float *rank, long long rld) {
    const int g = blockIdx.y, n = nrow ? nrow[g] : n_fixed;
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < npad; a += gridDim.x * blockDim.x) {
        float best = -INFINITY;
        if (a < n)
            for (int hh = 0; hh < G; hh++) {
                const int h = g * G + hh;
                const float v = (float)((double)S[(size_t)h * ld + a] - lse[h]);
                best = v > best ? v : best;
            }
        rank[(size_t)g * rld + a] = best;
    }
}

/* cosv[g*C + j] = max over the group of <q_h, c_jh> / (|c_jh| |q_h|) (-inf for an empty slot). */
__global__ void ct_cos(const float *q, const float *cq, const float *cnorm, const int *valid, int C, int G, int Hq,
                       int Hkv, int D, float *cosv) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= C * Hkv) return;
    const int g = t / C, j = t % C;
    float best = -INFINITY;
    if (valid[j])
        for (int h = g * G; h < (g + 1) * G; h++) {
            const float *qh = q + (size_t)h * D, *c = cq + ((size_t)j * Hq + h) * D;
            const float den = __fmul_rn(cnorm[(size_t)j * Hq + h], __fsqrt_rn(ct_dot(qh, qh, D)));
            const float cv = den > 0 ? __fdiv_rn(ct_dot(qh, c, D), den) : 0.f;
            best = cv > best ? cv : best;
        }
    cosv[t] = best;
}

/* One block per kv head: distinct list entries of the top cp slots in [lo, gen_lo), ascending, then [gen_lo, hi). */
__global__ void ct_gather(const int32_t *lidx, const int *lcnt, int C, int rho, const int32_t *top, int cp,
                          const int *valid, int lo, int gen_lo, int hi, int cap, int32_t *set, long long setld,
                          int *nset) {
    extern __shared__ int sv[];
    __shared__ int scount, sw[32];
    const int g = blockIdx.x;
    if (threadIdx.x == 0) scount = 0;
    __syncthreads();
    for (int r = 0; r < cp; r++) {
        const int slot = top[g * cp + r];
        if (!valid[slot]) continue;
        const int n = lcnt[g * C + slot];
        const int32_t *li = lidx + ((size_t)g * C + slot) * rho;
        for (int a = threadIdx.x; a < n; a += blockDim.x) {
            const int v = li[a];
            if (v >= lo && v < gen_lo) sv[atomicAdd(&scount, 1)] = v;
        }
    }
    __syncthreads();
    const int cnt = scount;
    int p2 = 1;
    while (p2 < cnt) p2 <<= 1;
    for (int a = cnt + threadIdx.x; a < p2; a += blockDim.x) sv[a] = 0x7fffffff;
    __syncthreads();
    for (int k = 2; k <= p2; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p2; i += blockDim.x) {
                const int l = i ^ j;
                if (l > i) {
                    const int a = sv[i], b = sv[l];
                    const bool up = (i & k) == 0;
                    if ((a > b) == up) { sv[i] = b; sv[l] = a; }
                }
            }
            __syncthreads();
        }
    int32_t *out = set + (size_t)g * setld;
    int base = 0;
    for (int c0 = 0; c0 < cnt; c0 += blockDim.x) {
        const int i = c0 + threadIdx.x;
        const int take = i < cnt && (i == 0 || sv[i] != sv[i - 1]);
        int total;
        const int ex = kv_block_scan(take, &total, sw);
        if (take) out[base + ex] = sv[i];
        base += total;
    }
    for (int i = gen_lo + threadIdx.x; i < hi; i += blockDim.x) out[base + i - gen_lo] = i;
    if (threadIdx.x == 0) nset[g] = base + (hi > gen_lo ? hi - gen_lo : 0);
}

/* S[h*sld + a] = scale * <q_h, K_g[set[g][a]]> for a < nset[g]. */
template <typename TK>
__global__ void ct_set_scores(const TK *K, int T, int D, const float *q, const int32_t *set, long long setld,
                              const int *nset, int G, float scale, float *S, long long sld) {
    const int h = blockIdx.y, g = h / G, n = nset[g];
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < n; a += gridDim.x * blockDim.x) {
        const int i = set[(size_t)g * setld + a];
        S[(size_t)h * sld + a] = __fmul_rn(scale, ct_dot(q + (size_t)h * D, K + ((size_t)g * T + i) * D, D));
    }
}

/* Slot `slot` <- queries q [Hq][D] (device), its norms, valid. */
__global__ void ct_commit(float *cq, float *cnorm, int *valid, int slot, const float *q, int Hq, int D) {
    for (int h = threadIdx.x; h < Hq; h += blockDim.x) {
        const float *src = q + (size_t)h * D;
        float *dst = cq + ((size_t)slot * Hq + h) * D;
        for (int d = 0; d < D; d++) dst[d] = src[d];
        cnorm[(size_t)slot * Hq + h] = __fsqrt_rn(ct_dot(src, src, D));
    }
    if (threadIdx.x == 0) valid[slot] = 1;
}

/* Bench stand-ins: slot j's query of head h = key at position pos_j of kv head h/G, as float. */
template <typename TK>
__global__ void ct_slots_from_keys(const TK *K, int T, int D, int G, int Hq, int C, int n, float *cq, float *cnorm,
                                   int *valid) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= C * Hq) return;
    const int j = t / Hq, h = t % Hq;
    const int pos = (int)(((long long)(2 * j + 1) * n) / (2LL * C));
    const TK *src = K + ((size_t)(h / G) * T + pos) * D;
    float *dst = cq + (size_t)t * D;
    for (int d = 0; d < D; d++) dst[d] = ct_tof(src[d]);
    cnorm[t] = __fsqrt_rn(ct_dot(dst, dst, D));
    if (h == 0) valid[j] = 1;
}

#include "ctkvr_fused.cuh"
#include "ctkvr_search.cuh"

}  // namespace

struct kv_ct_gpu {
    kv_ctkvr_gpu_config c;
    int G;
    kv_cuda_dev dev;
    cudaStream_t st;
    kv_gpu_keys *own;      /* the retriever's keys (float32) */
    const kv_dev_kv *K;    /* the keys read: own->a, or the bench's */
    float *cq, *cnorm, *q, *cosv, *S, *rank;
    double *lse;
    int *valid, *lcnt, *nset;
    int32_t *lidx, *lsrt, *top, *set, *oidx, *odcu; /* lsrt: the lists sorted by position (cts_search) */
    int32_t *h_set, *h_oidx, *h_odcu;  /* pinned */
    int *h_nset;
    float *h_q;
    int sld;                /* row length of S / rank / set: max(T, C) */
    kv_topk_ws tk;
    unsigned *ckey, *ctr;   /* the fused search's per-block candidates; [3 Hkv] arrivals, set flags, rerank counts */
    int *cslot;
    int staged;             /* KVBENCH_CTKVR_STAGED=1: always the staged path (tests compare both) */
    int fused_v1;           /* KVBENCH_CTKVR_FUSED=1: the one-launch search's version 1 (ctkvr_fused.cuh) */
    int v2;                 /* KVBENCH_CTKVR_V2=1: cts_search's rerank as version 2 (rr = 0), else tiled (rr = 1) */
    int nodist;             /* KVBENCH_CTKVR_DIST=0: version 3's rerank on one block per kv head (no split) */
    int pf;                 /* KVBENCH_CTKVR_PREFETCH=1: the merge prefetches the set's keys to L2 (off: faster with the split rerank) */
    size_t fused_smem_max;  /* dynamic shared memory the fused kernel may ask: opt-in max less its static arrays */
    size_t search_smem_max; /* the same for cts_search (ctkvr_search.cuh) */
    unsigned long long *ts; /* the bench's phase stamps of cts_search when tracing, else NULL */
    int last_nmax, last_kk, last_dcu, last_oracle_hi; /* the launched search (ct_launch; nmax 0: none) */
};

namespace {

kv_status ct_create_go(kv_ct_gpu *g, int own_keys) {
    const kv_ctkvr_gpu_config &c = g->c;
    g->G = c.Hq / c.Hkv;
    KV_TRY(kv_cuda_dev_query(&g->dev));
    KV_CUDA_TRY(kv_stream_create(&g->st));
    if (c.rho > KV_GPU_TOPK_MAX)
        return kv_fail(KV_ERR_INPUT, "ctkvr GPU: rho=%d above the GPU top-k's %d", c.rho, KV_GPU_TOPK_MAX);
    if (own_keys) {
        KV_TRY(kv_gpu_keys_create(c.Hkv, c.T, c.D, 0, &g->own));
        g->K = &g->own->a;
    }
    g->sld = c.T > c.C ? c.T : c.C;
    const size_t C = c.C, Hq = c.Hq, Hkv = c.Hkv, D = c.D, R = c.rho, L = g->sld;
    KV_CUDA_ALLOC(g->cq, C * Hq * D * sizeof(float), 0, "ctkvr slot queries");
    KV_CUDA_ALLOC(g->cnorm, C * Hq * sizeof(float), 0, "ctkvr slot norms");
    KV_CUDA_ALLOC(g->valid, C * sizeof(int), 0, "ctkvr slot flags");
    KV_CUDA_TRY(cudaMemset(g->valid, 0, C * sizeof(int)));
    KV_CUDA_ALLOC(g->lidx, Hkv * C * R * sizeof(int32_t), 0, "ctkvr lists");
    KV_CUDA_ALLOC(g->lsrt, Hkv * C * R * sizeof(int32_t), 0, "ctkvr sorted lists");
    KV_CUDA_TRY(cudaMemset(g->lsrt, 0, Hkv * C * R * sizeof(int32_t))); /* cts_search reads whole rows */
    KV_CUDA_ALLOC(g->lcnt, Hkv * C * sizeof(int), 0, "ctkvr list counts");
    KV_CUDA_TRY(cudaMemset(g->lcnt, 0, Hkv * C * sizeof(int)));
    KV_CUDA_ALLOC(g->q, Hq * D * sizeof(float), 0, "ctkvr query");
    KV_CUDA_ALLOC(g->cosv, Hkv * C * sizeof(float), 0, "ctkvr cosines");
    KV_CUDA_ALLOC(g->top, Hkv * C * sizeof(int32_t), 0, "ctkvr top slots");
    KV_CUDA_ALLOC(g->S, Hq * L * sizeof(float), 0, "ctkvr scores");
    KV_CUDA_ALLOC(g->rank, Hkv * L * sizeof(float), 0, "ctkvr ranking");
    KV_CUDA_ALLOC(g->lse, Hq * sizeof(double), 0, "ctkvr lse");
    KV_CUDA_ALLOC(g->set, Hkv * L * sizeof(int32_t), 0, "ctkvr rerank set");
    KV_CUDA_ALLOC(g->nset, Hkv * sizeof(int), 0, "ctkvr set sizes");
    KV_CUDA_ALLOC(g->oidx, Hkv * KV_GPU_TOPK_MAX * sizeof(int32_t), 0, "ctkvr top-k");
    KV_CUDA_ALLOC(g->odcu, Hkv * R * sizeof(int32_t), 0, "ctkvr dcu top-rho");
    KV_CUDA_ALLOC(g->h_set, Hkv * L * sizeof(int32_t), 1, "ctkvr rerank set (host)");
    KV_CUDA_ALLOC(g->h_oidx, Hkv * KV_GPU_TOPK_MAX * sizeof(int32_t), 1, "ctkvr top-k (host)");
    KV_CUDA_ALLOC(g->h_odcu, Hkv * R * sizeof(int32_t), 1, "ctkvr dcu (host)");
    KV_CUDA_ALLOC(g->h_nset, Hkv * sizeof(int), 1, "ctkvr set sizes (host)");
    KV_CUDA_ALLOC(g->h_q, Hq * D * sizeof(float), 1, "ctkvr query (host)");
    KV_TRY(kv_topk_ws_create(&g->tk, (int)Hkv, (int)L, &g->dev));
    KV_CUDA_TRY(cudaFuncSetAttribute(ct_gather, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     CT_GATHER_CAP * (int)sizeof(int)));
    /* per kv head nb x cpb <= nb x spb < C + spb candidates, spb <= 256 (both versions) */
    KV_CUDA_ALLOC(g->ckey, Hkv * (C + 256) * sizeof(unsigned), 0, "ctkvr fused candidates");
    KV_CUDA_ALLOC(g->cslot, Hkv * (C + 256) * sizeof(int), 0, "ctkvr fused candidate slots");
    KV_CUDA_ALLOC(g->ctr, 3 * Hkv * sizeof(unsigned), 0, "ctkvr fused counters");
    KV_CUDA_TRY(cudaMemset(g->ctr, 0, 3 * Hkv * sizeof(unsigned)));
    /* the opt-in limit covers static + dynamic shared memory: ask for what is left after the static arrays */
    cudaFuncAttributes fa_h, fa_f;
    KV_CUDA_TRY(cudaFuncGetAttributes(&fa_h, ctf_search<__half>));
    KV_CUDA_TRY(cudaFuncGetAttributes(&fa_f, ctf_search<float>));
    const size_t st_max = fa_h.sharedSizeBytes > fa_f.sharedSizeBytes ? fa_h.sharedSizeBytes : fa_f.sharedSizeBytes;
    g->fused_smem_max = (size_t)g->dev.smem_optin > st_max ? (size_t)g->dev.smem_optin - st_max : 0;
    KV_CUDA_TRY(cudaFuncSetAttribute(ctf_search<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g->fused_smem_max));
    KV_CUDA_TRY(cudaFuncSetAttribute(ctf_search<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g->fused_smem_max));
    KV_CUDA_TRY(cudaFuncGetAttributes(&fa_h, cts_search<__half>));
    KV_CUDA_TRY(cudaFuncGetAttributes(&fa_f, cts_search<float>));
    const size_t st2 = fa_h.sharedSizeBytes > fa_f.sharedSizeBytes ? fa_h.sharedSizeBytes : fa_f.sharedSizeBytes;
    g->search_smem_max = (size_t)g->dev.smem_optin > st2 ? (size_t)g->dev.smem_optin - st2 : 0;
    const int smx = (int)g->search_smem_max;
    KV_CUDA_TRY(cudaFuncSetAttribute(cts_search<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, smx));
    KV_CUDA_TRY(cudaFuncSetAttribute(cts_search<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, smx));
    g->staged = kv_env_is1("KVBENCH_CTKVR_STAGED");
    g->fused_v1 = kv_env_is1("KVBENCH_CTKVR_FUSED");
    g->v2 = kv_env_is1("KVBENCH_CTKVR_V2");
    g->nodist = !kv_env_on("KVBENCH_CTKVR_DIST");
    g->pf = kv_env_is1("KVBENCH_CTKVR_PREFETCH");
    return KV_OK;
}

void ct_destroy(void *p) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    if (!g) return;
    if (g->st) cudaStreamSynchronize(g->st);
    kv_gpu_keys_destroy(g->own);
    cudaFree(g->cq); cudaFree(g->cnorm); cudaFree(g->valid); cudaFree(g->lidx); cudaFree(g->lsrt); cudaFree(g->lcnt);
    cudaFree(g->q);
    cudaFree(g->cosv); cudaFree(g->top); cudaFree(g->S); cudaFree(g->rank); cudaFree(g->lse); cudaFree(g->set);
    cudaFree(g->nset); cudaFree(g->oidx); cudaFree(g->odcu); cudaFree(g->ckey); cudaFree(g->cslot); cudaFree(g->ctr);
    cudaFreeHost(g->h_set); cudaFreeHost(g->h_oidx); cudaFreeHost(g->h_odcu); cudaFreeHost(g->h_nset);
    cudaFreeHost(g->h_q);
    kv_topk_ws_destroy(&g->tk);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

kv_status ct_alloc(const kv_ctkvr_gpu_config *cfg, int own_keys, kv_ct_gpu **out) {
    kv_ct_gpu *g = (kv_ct_gpu *)calloc(1, sizeof *g);
    if (!g) return kv_fail(KV_ERR_NOMEM, "ctkvr GPU state");
    g->c = *cfg;
    kv_status s = ct_create_go(g, own_keys);
    if (s != KV_OK) { ct_destroy(g); return s; }
    *out = g;
    return KV_OK;
}

kv_status ct_create(const kv_ctkvr_gpu_config *cfg, void **out) {
    kv_ct_gpu *g = NULL;
    KV_TRY(ct_alloc(cfg, 1, &g));
    *out = g;
    return KV_OK;
}

/* Lists of slots [0, nc) over [sink, idx_hi) (slot queries and norms already on the device). */
kv_status ct_build_lists(kv_ct_gpu *g, int nc, int idx_hi) {
    const kv_ctkvr_gpu_config &c = g->c;
    const int lo = c.sink, n = idx_hi - lo;
    if (n <= 0) return KV_OK;
    const int kk = n < c.rho ? n : c.rho;
    for (int j = 0; j < nc; j++) {
        KV_TRY(kv_scores_launch(g->K, g->cq + (size_t)j * c.Hq * c.D, c.Hq, c.scale, lo, n, g->S, g->sld, NULL, &g->dev,
                                g->st));
        ct_lse<<<c.Hq, 256, 0, g->st>>>(g->S, g->sld, NULL, n, g->G, g->lse);
        KV_LAUNCH_CHECK();
        ct_rank<<<dim3((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024, c.Hkv), 256, 0, g->st>>>(
            g->S, g->sld, g->lse, g->G, c.Hkv, NULL, n, n, g->rank, g->sld);
        KV_LAUNCH_CHECK();
        KV_TRY(kv_topk_launch(&g->tk, g->rank, g->sld, 0, n, c.Hkv, kk, lo, NULL, 1, g->lidx + (size_t)j * c.rho, NULL,
                              c.C * c.rho, NULL, g->st));
    }
    /* counts: every slot's list holds kk keys */
    int *h = (int *)malloc((size_t)c.Hkv * c.C * sizeof(int));
    if (!h) return kv_fail(KV_ERR_NOMEM, "ctkvr GPU list counts");
    for (int a = 0; a < c.Hkv * c.C; a++) h[a] = a % c.C < nc ? kk : 0;
    cudaError_t e = cudaMemcpyAsync(g->lcnt, h, (size_t)c.Hkv * c.C * sizeof(int), cudaMemcpyHostToDevice, g->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    free(h);
    KV_CUDA_TRY(e);
    if (nc > 0)
        ct_sort_lists<<<dim3(nc, c.Hkv), 256, CT_SL_SMEM(c.rho), g->st>>>(g->lidx, g->lcnt, c.C, c.rho,
                                                                                        0, g->lsrt);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

kv_status ct_build(void *p, const float *k, int n, const float *cq, int nc, int idx_hi) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    const kv_ctkvr_gpu_config &c = g->c;
    KV_TRY(kv_gpu_keys_write(g->own, 0, n, k));
    if (nc <= 0) return KV_OK;
    KV_CUDA_TRY(cudaMemcpy(g->cq, cq, (size_t)nc * c.Hq * c.D * sizeof(float), cudaMemcpyHostToDevice));
    /* norms and flags on the device, as a DCU commit computes them */
    for (int j = 0; j < nc; j++) {
        ct_commit<<<1, 32, 0, g->st>>>(g->cq, g->cnorm, g->valid, j, g->cq + (size_t)j * c.Hq * c.D, c.Hq, c.D);
        KV_LAUNCH_CHECK();
    }
    return ct_build_lists(g, nc, idx_hi);
}

kv_status ct_read_lists(void *p, int32_t *lidx, int *lcnt) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    const kv_ctkvr_gpu_config &c = g->c;
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    KV_CUDA_TRY(cudaMemcpy(lidx, g->lidx, (size_t)c.Hkv * c.C * c.rho * sizeof(int32_t), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy(lcnt, g->lcnt, (size_t)c.Hkv * c.C * sizeof(int), cudaMemcpyDeviceToHost));
    return KV_OK;
}

kv_status ct_append(void *p, int t, const float *key) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    return kv_gpu_keys_write(g->own, t, 1, key);
}

/* The recall of one search on g->st: cosines, top C', the deduplicated union. */
kv_status ct_front(kv_ct_gpu *g, int cp, int hi, int gen_lo) {
    const kv_ctkvr_gpu_config &c = g->c;
    const int lo = c.sink;
    ct_cos<<<(c.C * c.Hkv + 127) / 128, 128, 0, g->st>>>(g->q, g->cq, g->cnorm, g->valid, c.C, g->G, c.Hq, c.Hkv, c.D,
                                                         g->cosv);
    KV_LAUNCH_CHECK();
    KV_TRY(kv_topk_launch(&g->tk, g->cosv, c.C, 0, c.C, c.Hkv, cp, 0, NULL, 1, g->top, NULL, cp, NULL, g->st));
    ct_gather<<<c.Hkv, 1024, CT_GATHER_CAP * sizeof(int), g->st>>>(g->lidx, g->lcnt, c.C, c.rho, g->top, cp, g->valid,
                                                                   lo, gen_lo, hi, CT_GATHER_CAP, g->set, g->sld,
                                                                   g->nset);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* The rerank after ct_front: set scores, lse, ranking, top k (and DCU's top rho). */
kv_status ct_back(kv_ct_gpu *g, int k, int dcu, int nmax) {
    const kv_ctkvr_gpu_config &c = g->c;
    if (nmax <= 0) return KV_OK;
    const int bx = (nmax + 127) / 128 < 512 ? (nmax + 127) / 128 : 512;
    if (g->K->half)
        ct_set_scores<__half><<<dim3(bx, c.Hq), 128, 0, g->st>>>((const __half *)g->K->p, g->K->T, c.D, g->q, g->set,
                                                                 g->sld, g->nset, g->G, c.scale, g->S, g->sld);
    else
        ct_set_scores<float><<<dim3(bx, c.Hq), 128, 0, g->st>>>((const float *)g->K->p, g->K->T, c.D, g->q, g->set,
                                                                g->sld, g->nset, g->G, c.scale, g->S, g->sld);
    KV_LAUNCH_CHECK();
    ct_lse<<<c.Hq, 256, 0, g->st>>>(g->S, g->sld, g->nset, 0, g->G, g->lse);
    KV_LAUNCH_CHECK();
    ct_rank<<<dim3(bx, c.Hkv), 128, 0, g->st>>>(g->S, g->sld, g->lse, g->G, c.Hkv, g->nset, 0, nmax, g->rank, g->sld);
    KV_LAUNCH_CHECK();
    if (k > 0)
        KV_TRY(kv_topk_launch(&g->tk, g->rank, g->sld, 0, nmax, c.Hkv, k < nmax ? k : nmax, 0, NULL, 1, g->oidx, NULL,
                              KV_GPU_TOPK_MAX, NULL, g->st));
    if (dcu == 1)
        KV_TRY(kv_topk_launch(&g->tk, g->rank, g->sld, 0, nmax, c.Hkv, c.rho < nmax ? c.rho : nmax, 0, NULL, 1, g->odcu,
                              NULL, c.rho, NULL, g->st));
    return KV_OK;
}

/* DCU oracle: the exact top rho of all of [sink, ohi) by the same ranking, to odcu (positions). */
kv_status ct_oracle(kv_ct_gpu *g, int ohi) {
    const kv_ctkvr_gpu_config &c = g->c;
    const int lo = c.sink;
    if (ohi > lo) {
        const int n = ohi - lo, bo = (n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024;
        KV_TRY(kv_scores_launch(g->K, g->q, c.Hq, c.scale, lo, n, g->S, g->sld, NULL, &g->dev, g->st));
        ct_lse<<<c.Hq, 256, 0, g->st>>>(g->S, g->sld, NULL, n, g->G, g->lse);
        KV_LAUNCH_CHECK();
        ct_rank<<<dim3(bo, c.Hkv), 256, 0, g->st>>>(g->S, g->sld, g->lse, g->G, c.Hkv, NULL, n, n, g->rank, g->sld);
        KV_LAUNCH_CHECK();
        KV_TRY(kv_topk_launch(&g->tk, g->rank, g->sld, 0, n, c.Hkv, c.rho < n ? c.rho : n, lo, NULL, 1, g->odcu, NULL,
                              c.rho, NULL, g->st));
    }
    return KV_OK;
}

/* The one-launch search, version 2 (ctkvr_search.cuh), when its limits hold; *done = 0 otherwise. */
kv_status ct_search2(kv_ct_gpu *g, int cp, int k, int hi, int gen_lo, int dcu, int nmax, int *done) {
    const kv_ctkvr_gpu_config &c = g->c;
    *done = 0;
    const int G = g->G, cpe = cp < c.C ? cp : c.C, spb = G <= 256 ? 256 / G : 0;
    if (g->staged || cpe < 1 || spb < 1 || c.D % 8 || ((uintptr_t)g->K->p & 15)) return KV_OK;
    const int nb = (c.C + spb - 1) / spb, cpb = cpe < spb ? cpe : spb, krho = dcu == 1 ? c.rho : 0,
              kmax = k > krho ? k : krho;
    size_t smem = cts_smem(G, c.D, spb, nb * cpb, cpe, c.rho, nmax, kmax);
    if (smem > g->search_smem_max) return KV_OK;
    /* the tiled rerank (version 3) where its tiles fit too, else version 2's */
    const size_t toff = (smem + 15) / 16 * 16;
    const int rr = !g->v2 && toff + cts_tile_smem() <= g->search_smem_max;
    if (rr) smem = toff + cts_tile_smem();
    cts_args a = {g->q, g->cq, g->cnorm, g->valid, c.C, G, c.Hq, c.D, cpe, spb, nb, cpb, g->ckey, g->ctr, g->cslot,
                  g->lsrt, g->lcnt, c.rho, c.sink, gen_lo, hi, nmax, kmax, g->K->p, g->K->T, c.scale, g->top,
                  g->set, g->sld, g->nset, k, krho, g->oidx, g->odcu, g->ts, rr, (int)toff,
                  rr && !g->nodist && nb > 1, g->S, (long long)g->sld, g->pf};
    if (g->K->half) cts_search<__half><<<dim3(nb, c.Hkv), CTS_TH, smem, g->st>>>(a);
    else cts_search<float><<<dim3(nb, c.Hkv), CTS_TH, smem, g->st>>>(a);
    KV_LAUNCH_CHECK();
    *done = 1;
    return KV_OK;
}

/* The fused search, version 1 (ctkvr_fused.cuh), when its limits hold; *done = 0 otherwise (nothing launched). */
kv_status ct_fused(kv_ct_gpu *g, int cp, int k, int hi, int gen_lo, int dcu, int nmax, int *done) {
    const kv_ctkvr_gpu_config &c = g->c;
    *done = 0;
    const int cpe = cp < c.C ? cp : c.C, nb = (c.C + CTF_SPB - 1) / CTF_SPB, cpb = cpe < CTF_SPB ? cpe : CTF_SPB;
    int gcap = 1;
    while (gcap < cpe * c.rho) gcap <<= 1;
    const size_t smem = ctf_smem(g->G, c.D, gcap);
    if (g->staged || cpe < 1 || nmax > CTF_CAP || nb * cpb > CTF_CAP || smem > g->fused_smem_max ||
        (size_t)g->G * c.D > 8192 || g->G * CTF_SPB > CTF_CAP)
        return KV_OK;
    ctf_args a = {g->q, g->cq, g->cnorm, g->valid, c.C, g->G, c.Hq, c.D, cpe, nb, cpb, g->ckey, g->ctr, g->cslot,
                  g->lidx, g->lcnt, c.rho, c.sink, gen_lo, hi, gcap, g->K->p, g->K->T, c.scale, g->top, g->set,
                  g->sld, g->nset, k, dcu == 1 ? c.rho : 0, g->oidx, g->odcu};
    if (g->K->half) ctf_search<__half><<<dim3(nb, c.Hkv), CTF_TH, smem, g->st>>>(a);
    else ctf_search<float><<<dim3(nb, c.Hkv), CTF_TH, smem, g->st>>>(a);
    KV_LAUNCH_CHECK();
    *done = 1;
    return KV_OK;
}

/* The device part of one search, all on g->st; nmax = the bound on the set size. dcu 2 also scores [lo, hi). */
kv_status ct_search_launch(kv_ct_gpu *g, int cp, int k, int hi, int gen_lo, int dcu, int nmax, int oracle_hi) {
    int done = 0;
    if (g->fused_v1) KV_TRY(ct_fused(g, cp, k, hi, gen_lo, dcu, nmax, &done));
    else KV_TRY(ct_search2(g, cp, k, hi, gen_lo, dcu, nmax, &done));
    if (!done) {
        KV_TRY(ct_front(g, cp, hi, gen_lo));
        KV_TRY(ct_back(g, k, dcu, nmax));
    }
    return dcu == 2 ? ct_oracle(g, oracle_hi) : KV_OK;
}

/* The staged path alone (the bench's comparison). */
kv_status ct_staged_launch(kv_ct_gpu *g, int cp, int k, int hi, int gen_lo, int nmax) {
    KV_TRY(ct_front(g, cp, hi, gen_lo));
    return ct_back(g, k, 0, nmax);
}

kv_status ct_launch(void *p, const float *q, int cp, int k, int hi, int gen_lo, int dcu, int oracle_hi,
                    kv_gpu_mark *mark) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    const kv_ctkvr_gpu_config &c = g->c;
    const int Hkv = c.Hkv, lo = c.sink;
    g->last_nmax = 0;
    if (gen_lo > hi) gen_lo = hi;
    if (gen_lo < lo) gen_lo = lo;
    if ((long long)cp * c.rho > CT_GATHER_CAP)
        return kv_fail(KV_ERR_INPUT, "ctkvr GPU: C' x rho = %lld above the gather's %d", (long long)cp * c.rho,
                       CT_GATHER_CAP);
    if (k > KV_GPU_TOPK_MAX) return kv_fail(KV_ERR_INPUT, "ctkvr GPU: k=%d above %d", k, KV_GPU_TOPK_MAX);
    int nmax = cp * c.rho + (hi - gen_lo); /* the union's bound, at most the region */
    if (nmax > hi - lo) nmax = hi - lo;
    memcpy(g->h_q, q, (size_t)c.Hq * c.D * sizeof(float));
    KV_CUDA_TRY(cudaMemcpyAsync(g->q, g->h_q, (size_t)c.Hq * c.D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    KV_TRY(kv_gpu_mark_start(mark, g->st));
    KV_TRY(ct_search_launch(g, cp, k, hi, gen_lo, dcu, nmax, oracle_hi));
    KV_TRY(kv_gpu_mark_end(mark, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(g->h_nset, g->nset, Hkv * sizeof(int), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaMemcpy2DAsync(g->h_set, nmax * sizeof(int32_t), g->set, g->sld * sizeof(int32_t),
                                  nmax * sizeof(int32_t), Hkv, cudaMemcpyDeviceToHost, g->st));
    const int kk = k < nmax ? k : nmax;
    if (kk > 0)
        KV_CUDA_TRY(cudaMemcpy2DAsync(g->h_oidx, kk * sizeof(int32_t), g->oidx, KV_GPU_TOPK_MAX * sizeof(int32_t),
                                      kk * sizeof(int32_t), Hkv, cudaMemcpyDeviceToHost, g->st));
    if (dcu)
        KV_CUDA_TRY(cudaMemcpyAsync(g->h_odcu, g->odcu, (size_t)Hkv * c.rho * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    g->st));
    g->last_nmax = nmax;
    g->last_kk = kk;
    g->last_dcu = dcu;
    g->last_oracle_hi = oracle_hi;
    return KV_OK;
}

kv_status ct_fetch(void *p, int32_t *idx, int ld, int *count, int32_t *cand, int cand_ld, int *ncand,
                   int32_t *dcu_list, int *dcu_cnt) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    const kv_ctkvr_gpu_config &c = g->c;
    const int Hkv = c.Hkv, lo = c.sink, nmax = g->last_nmax, kk = g->last_kk, dcu = g->last_dcu,
              oracle_hi = g->last_oracle_hi;
    if (nmax <= 0) return KV_OK;
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    for (int r = 0; r < Hkv; r++) {
        const int n = g->h_nset[r];
        const int32_t *s = g->h_set + (size_t)r * nmax;
        memcpy(cand + (size_t)r * cand_ld, s, (size_t)n * sizeof(int32_t));
        ncand[r] = n;
        const int cnt = kk < n ? kk : n;
        for (int a = 0; a < cnt; a++) idx[(size_t)r * ld + a] = s[g->h_oidx[(size_t)r * kk + a]];
        count[r] = cnt;
        if (dcu == 1) {
            const int m = c.rho < n ? c.rho : n;
            for (int a = 0; a < m; a++) dcu_list[(size_t)r * c.rho + a] = s[g->h_odcu[(size_t)r * c.rho + a]];
            dcu_cnt[r] = m;
        } else if (dcu == 2) {
            const int m = c.rho < oracle_hi - lo ? c.rho : oracle_hi - lo;
            memcpy(dcu_list + (size_t)r * c.rho, g->h_odcu + (size_t)r * c.rho, (size_t)(m > 0 ? m : 0) * sizeof(int32_t));
            dcu_cnt[r] = m > 0 ? m : 0;
        }
    }
    /* keep the host-mapped DCU lists for the commit */
    if (dcu) memcpy(g->h_odcu, dcu_list, (size_t)Hkv * c.rho * sizeof(int32_t));
    if (dcu) memcpy(g->h_nset, dcu_cnt, (size_t)Hkv * sizeof(int));
    return KV_OK;
}

/* The slot's queries from g->q, where ct_launch uploaded the fetched search's (nothing writes it between). */
kv_status ct_dcu_commit(void *p, int slot) {
    kv_ct_gpu *g = (kv_ct_gpu *)p;
    const kv_ctkvr_gpu_config &c = g->c;
    ct_commit<<<1, 32, 0, g->st>>>(g->cq, g->cnorm, g->valid, slot, g->q, c.Hq, c.D);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaMemcpy2DAsync(g->lidx + (size_t)slot * c.rho, (size_t)c.C * c.rho * sizeof(int32_t), g->h_odcu,
                                  (size_t)c.rho * sizeof(int32_t), (size_t)c.rho * sizeof(int32_t), c.Hkv,
                                  cudaMemcpyHostToDevice, g->st));
    KV_CUDA_TRY(cudaMemcpy2DAsync(g->lcnt + slot, (size_t)c.C * sizeof(int), g->h_nset, sizeof(int), sizeof(int), c.Hkv,
                                  cudaMemcpyHostToDevice, g->st));
    ct_sort_lists<<<dim3(1, c.Hkv), 256, CT_SL_SMEM(c.rho), g->st>>>(g->lidx, g->lcnt, c.C, c.rho, slot,
                                                                                    g->lsrt);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

/* ---- kvbench bench --method ctkvr ---- */
/* KVBENCH_CTKVR_TRACE=1: 5 + 5 more searches (the default, then version 2; L2 flushed before each) with
 * cts_search's phase stamps, printed to stderr in microseconds from the first block's start (where the time
 * of one launch goes). */
kv_status ct_trace_one(kv_mbench<kv_ct_gpu> &x, kv_ct_gpu *g, int cp, int k, int n, int nmax, unsigned long long *h) {
    for (int i = 0; i < CTS_NT; i++) h[i] = i == 0 ? ~0ull : 0ull;
    KV_TRY(kv_bench_flush(&x.tm));
    KV_CUDA_TRY(cudaMemcpyAsync(g->ts, h, CTS_NT * sizeof *h, cudaMemcpyHostToDevice, g->st));
    KV_TRY(ct_search_launch(g, cp, k, n, n, 0, nmax, n));
    KV_CUDA_TRY(cudaMemcpyAsync(h, g->ts, CTS_NT * sizeof *h, cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

kv_status ct_trace(kv_mbench<kv_ct_gpu> &x, kv_ct_gpu *g, int cp, int k, int n, int nmax) {
    static const char *name[CTS_NT] = {"start", "arrive", "top_cp", "gather", "merge", "set", "scores", "lse",
                                       "topk", "end"};
    KV_CUDA_ALLOC(g->ts, CTS_NT * sizeof(unsigned long long), 0, "ctkvr trace stamps");
    kv_status st = KV_OK;
    const int v2 = g->v2;
    for (int r = 0; r < 10 && st == KV_OK; r++) { /* 5 of the default (version 3), then 5 of version 2 */
        unsigned long long h[CTS_NT];
        g->v2 = r < 5 ? v2 : 1;
        st = ct_trace_one(x, g, cp, k, n, nmax, h);
        if (st != KV_OK) break;
        fprintf(stderr, "ctkvr trace n=%d %s rep %d (us from the first block's start):", n,
                r < 5 && !v2 ? "v3" : "v2", r % 5);
        for (int i = 1; i < CTS_NT; i++) fprintf(stderr, " %s %.2f", name[i], h[i] ? (h[i] - h[0]) * 1e-3 : -1.0);
        fprintf(stderr, "\n");
    }
    g->v2 = v2;
    cudaFree(g->ts);
    g->ts = NULL;
    return st;
}

/* The bench's own check of the one-launch searches on its data (float16 keys, D = 128 by default; the
 * tests run float32 keys): path 0 = staged, 1 = the default (version 3: version 2 with the tiled rerank),
 * 2 = version 1, 3 = version 2 (KVBENCH_CTKVR_V2=1); per path the sets and the top k (positions in the set) of
 * every kv head into hs / ho, the set sizes into hn. */
kv_status ct_check_run(kv_ct_gpu *g, int path, int cp, int k, int n, int nmax, int32_t *hs, int32_t *ho, int *hn) {
    const int Hkv = g->c.Hkv, kk = k < nmax ? k : nmax, v1 = g->fused_v1, v2 = g->v2;
    g->fused_v1 = path == 2;
    g->v2 = path == 3;
    const kv_status st =
        path == 0 ? ct_staged_launch(g, cp, k, n, n, nmax) : ct_search_launch(g, cp, k, n, n, 0, nmax, n);
    g->fused_v1 = v1;
    g->v2 = v2;
    KV_TRY(st);
    KV_CUDA_TRY(cudaMemcpyAsync(hn, g->nset, Hkv * sizeof(int), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaMemcpy2DAsync(hs, nmax * sizeof(int32_t), g->set, g->sld * sizeof(int32_t), nmax * sizeof(int32_t),
                                  Hkv, cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaMemcpy2DAsync(ho, kk * sizeof(int32_t), g->oidx, KV_GPU_TOPK_MAX * sizeof(int32_t),
                                  kk * sizeof(int32_t), Hkv, cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

/* Prints (stderr) whether versions 3, 1 and 2 give the staged path's sets and top k (the lse's summation order
 * differs between the three, so a top-k entry may differ only at a tie to the last bit). */
kv_status ct_bench_check(kv_ct_gpu *g, int cp, int k, int n, int nmax) {
    const int Hkv = g->c.Hkv, kk = k < nmax ? k : nmax;
    const size_t ns = (size_t)Hkv * nmax, no = (size_t)Hkv * (kk > 0 ? kk : 1);
    int32_t *hs = (int32_t *)malloc(4 * ns * sizeof(int32_t)), *ho = (int32_t *)malloc(4 * no * sizeof(int32_t));
    int *hn = (int *)malloc(4 * (size_t)Hkv * sizeof(int));
    kv_status st = hs && ho && hn ? KV_OK : kv_fail(KV_ERR_NOMEM, "ctkvr bench check buffers");
    for (int p = 0; p < 4 && st == KV_OK; p++)
        st = ct_check_run(g, p, cp, k, n, nmax, hs + p * ns, ho + p * no, hn + p * Hkv);
    for (int p = 1; p < 4 && st == KV_OK; p++) {
        int sets = 0, same = 0, all = 0;
        for (int r = 0; r < Hkv; r++) {
            const int m = hn[r];
            const int32_t *s0 = hs + (size_t)r * nmax, *s1 = hs + p * ns + (size_t)r * nmax;
            sets += hn[p * Hkv + r] == m && !memcmp(s1, s0, m * sizeof(int32_t));
            for (int j = 0; j < kk && j < m && j < hn[p * Hkv + r]; j++, all++) {
                const int a = ho[(size_t)r * kk + j], b = ho[p * no + (size_t)r * kk + j];
                same += a >= 0 && a < m && b >= 0 && b < hn[p * Hkv + r] && s0[a] == s1[b];
            }
        }
        fprintf(stderr, "ctkvr bench check n=%d: %s vs staged: %d of %d sets equal, %d of %d top-k entries equal\n", n,
                p == 1 ? "search (version 3)" : p == 2 ? "search_v1" : "search_v2", sets, Hkv, same, all);
    }
    free(hs); free(ho); free(hn);
    return st;
}

kv_status ct_bench_go(kv_mbench<kv_ct_gpu> &x, const kv_gpu_bench_spec *s, const kv_ctkvr_bench_params *bp,
                      const kv_gpu_keys *K, const float *q, kv_gpu_stages *out) {
    const int n = s->n, C = bp->C < n ? bp->C : n, cp = bp->cp < C ? bp->cp : C;
    kv_ctkvr_gpu_config cfg = {s->Hq, s->Hkv, n, s->D, C, bp->rho, 0, s->scale};
    KV_TRY(ct_alloc(&cfg, 0, &x.g));
    kv_ct_gpu *g = x.g;
    g->K = &K->a;
    const int T = K->a.T;
    if (K->a.half)
        ct_slots_from_keys<__half><<<(C * s->Hq + 127) / 128, 128, 0, g->st>>>((const __half *)K->a.p, T, s->D, g->G,
                                                                               s->Hq, C, n, g->cq, g->cnorm, g->valid);
    else
        ct_slots_from_keys<float><<<(C * s->Hq + 127) / 128, 128, 0, g->st>>>((const float *)K->a.p, T, s->D, g->G,
                                                                              s->Hq, C, n, g->cq, g->cnorm, g->valid);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    kv_gpu_timing t[9];
    /* the build is long: 3 runs, or KVBENCH_CTKVR_BUILD_REPS (1..3: a short device check) */
    const char *brs = getenv("KVBENCH_CTKVR_BUILD_REPS");
    int br = brs ? atoi(brs) : 3;
    br = br < 1 ? 1 : br > 3 ? 3 : br;
    KV_TRY(x.begin(s->reps < br ? s->reps : br, 0, s->stream));
    KV_TRY(x.time([&]() { return ct_build_lists(g, C, n); }, &t[0]));
    KV_TRY(x.begin(s->reps, s->warmup, s->stream));
    KV_CUDA_TRY(cudaMemcpy(g->q, q, (size_t)s->Hq * s->D * sizeof(float), cudaMemcpyHostToDevice));
    const int nmax = cp * bp->rho < n ? cp * bp->rho : n, k = s->k;
    /* the staged path stage by stage: recall (cosines + top C'), gather (dedup), rerank (scores, lse, ranking +
     * top-k); then the staged path whole, the default one-launch search (version 2) and its version 1 */
    auto recall = [&]() -> kv_status {
        ct_cos<<<(C * s->Hkv + 127) / 128, 128, 0, g->st>>>(g->q, g->cq, g->cnorm, g->valid, C, g->G, s->Hq, s->Hkv,
                                                             s->D, g->cosv);
        KV_LAUNCH_CHECK();
        return kv_topk_launch(&g->tk, g->cosv, C, 0, C, s->Hkv, cp, 0, NULL, 1, g->top, NULL, cp, NULL, g->st);
    };
    auto gather = [&]() -> kv_status {
        ct_gather<<<s->Hkv, 1024, CT_GATHER_CAP * sizeof(int), g->st>>>(g->lidx, g->lcnt, C, bp->rho, g->top, cp,
                                                                        g->valid, 0, n, n, CT_GATHER_CAP, g->set,
                                                                        g->sld, g->nset);
        KV_LAUNCH_CHECK();
        return KV_OK;
    };
    KV_TRY(x.time(recall, &t[1]));
    KV_TRY(x.time(gather, &t[2]));
    KV_TRY(x.time([&]() { return ct_back(g, k, 0, nmax); }, &t[3]));
    KV_TRY(x.time([&]() { return ct_staged_launch(g, cp, k, n, n, nmax); }, &t[4]));
    const int v1 = g->fused_v1;
    g->fused_v1 = 1; /* the one-launch search's version 1 first (a fault in the default would not hide it) */
    const kv_status sv1 = x.time([&]() { return ct_search_launch(g, cp, k, n, n, 0, nmax, n); }, &t[6]);
    g->fused_v1 = v1;
    KV_TRY(sv1);
    const int v2 = g->v2;
    g->v2 = 1; /* version 2 (version 3 less its tiled rerank) */
    const kv_status sv2 = x.time([&]() { return ct_search_launch(g, cp, k, n, n, 0, nmax, n); }, &t[7]);
    g->v2 = v2;
    KV_TRY(sv2);
    /* the search with DCU's top rho of the rerank too (dcu=on, the method's default: what `kvbench run` times) */
    KV_TRY(x.time([&]() { return ct_search_launch(g, cp, k, n, n, 1, nmax, n); }, &t[8]));
    KV_TRY(x.time([&]() { return ct_search_launch(g, cp, k, n, n, 0, nmax, n); }, &t[5]));
    KV_TRY(ct_bench_check(g, cp, k, n, nmax));
    const char *tr = getenv("KVBENCH_CTKVR_TRACE");
    if (tr && tr[0] == '1') KV_TRY(ct_trace(x, g, cp, k, n, nmax));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    int nset[64];
    KV_CUDA_TRY(cudaMemcpy(nset, g->nset, (size_t)(s->Hkv < 64 ? s->Hkv : 64) * sizeof(int), cudaMemcpyDeviceToHost));
    double u = 0;
    for (int r = 0; r < s->Hkv && r < 64; r++) u += nset[r];
    const double es = K->a.half ? 2 : 4, slots = (double)C * s->Hq * s->D * 4, qb = (double)s->Hq * s->D * 4,
                 lists = (double)s->Hkv * cp * bp->rho * 4, keys = u * s->D * es,
                 build = (double)C * (s->Hkv * (double)n * s->D * es + s->Hkv * (double)bp->rho * 4),
                 all = slots + qb + lists + keys + s->Hkv * (double)k * 4;
    out->n = 9;
    out->stage[0] = kv_gpu_stage{"build", t[0], build};
    out->stage[1] = kv_gpu_stage{"recall", t[1], slots + qb + s->Hkv * (double)cp * 4};
    out->stage[2] = kv_gpu_stage{"gather", t[2], lists + u * 4};
    out->stage[3] = kv_gpu_stage{"rerank", t[3], keys + u * 4 + s->Hkv * (double)k * 4};
    out->stage[4] = kv_gpu_stage{"search_staged", t[4], all};
    out->stage[5] = kv_gpu_stage{"search", t[5], all};
    out->stage[6] = kv_gpu_stage{"search_v1", t[6], all};
    out->stage[7] = kv_gpu_stage{"search_v2", t[7], all};
    out->stage[8] = kv_gpu_stage{"search_dcu", t[8], all + s->Hkv * (double)bp->rho * 4};
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "ctkvr C=%d C'=%d rho=%d, slot queries = keys at C evenly spaced positions (no prefill queries in the "
             "bench); union %.0f keys/kv head; recall = slot queries (f32, Hq x D x 4 B each) + q; gather = C' lists "
             "(4 B/entry) + union; rerank = union keys (%.0f B/elem) + ids + top-k; search_staged = those 3 stages; "
             "search = one launch (ctkvr_search.cuh), search_v1 = its version 1 (ctkvr_fused.cuh), search_v2 = its "
             "version 2 (rerank untiled), same bytes; search_dcu = search + DCU's top rho (dcu=on)",
             C, cp, bp->rho, u / s->Hkv, es);
    return KV_OK;
}

kv_status ct_bench(const kv_gpu_bench_spec *s, const kv_ctkvr_bench_params *bp, const kv_gpu_keys *K, const float *q,
                   kv_gpu_stages *out) {
    if (s->n < 1 || s->n > K->a.T || K->a.H != s->Hkv || K->a.D != s->D) {
        memset(out, 0, sizeof *out);
        return kv_fail(KV_ERR_INPUT, "ctkvr GPU bench: inconsistent spec (n=%d)", s->n);
    }
    return kv_mbench_run<kv_ct_gpu>(out, ct_destroy, [&](kv_mbench<kv_ct_gpu> &x) { return ct_bench_go(x, s, bp, K, q, out); });
}

}  // namespace

extern "C" const kv_ctkvr_cuda_ops kv_ctkvr_cuda = {
    ct_create, ct_build, ct_read_lists, ct_append, ct_launch, ct_fetch, ct_dcu_commit, ct_destroy, ct_bench,
};
