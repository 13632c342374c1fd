/* kv_cuda.h: what the kernels/ .cu files share and nothing outside them
 * sees (C code talks to the GPU through kv_gpu.h only).
 *
 * Error handling (STYLE.md point 5): KV_CUDA_TRY(call) returns KV_ERR_GPU
 * through kv_fail with file:line, the expression and the CUDA error name;
 * an out-of-memory error becomes KV_ERR_NOMEM, never a crash.
 * KV_CUDA_ALLOC names what was being allocated and how many bytes, so a GPU
 * OOM reads "GPU out of memory allocating N bytes for X". KV_LAUNCH_CHECK()
 * follows every kernel launch (launch-configuration errors; faults inside
 * a kernel surface at the next synchronising call, itself checked).
 *
 * Also here: the device-resident [H][T][D] array type shared by keys and
 * values, the order-preserving float <-> uint32 key map used by every
 * top-k path, and the internal launchers (C++ linkage) the .cu files call
 * on each other. */
#ifndef KV_CUDA_H
#define KV_CUDA_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kv_common.h"
#include "kv_gpu.h"

kv_status kv_cuda_error(cudaError_t e, const char *expr, const char *file, int line);
kv_status kv_cuda_alloc(void **p, size_t bytes, int pinned, const char *what, const char *file, int line);

#define KV_CUDA_TRY(call)                                                           \
    do {                                                                            \
        cudaError_t kv_e_ = (call);                                                 \
        if (kv_e_ != cudaSuccess) return kv_cuda_error(kv_e_, #call, __FILE__, __LINE__); \
    } while (0)
#define KV_LAUNCH_CHECK() KV_CUDA_TRY(cudaGetLastError())
/* Every stream the kernels use is made here, and is a blocking stream: the
 * synchronous cudaMemcpy and cudaMemset calls run on the legacy default
 * stream, which orders with blocking streams both ways and with
 * non-blocking ones not at all. With non-blocking streams a cudaMemcpy from
 * pageable memory returns once the data is staged, and the object's next
 * kernel on its own stream could read the destination before the copy
 * landed (session 18: PQCache's tuple test saw its first search read codes
 * still being uploaded, once in 16 runs); a create-time cudaMemset could
 * likewise still be running under the first kernel. So no device
 * synchronisation is needed between such a call and a launch on these
 * streams. tests/test_core.c (gpu_streams_blocking) checks that no .cu file
 * makes a stream otherwise. */
static inline cudaError_t kv_stream_create(cudaStream_t *st) { return cudaStreamCreate(st); }
/* Device (pinned = 0) or pinned host (pinned = 1) allocation. */
#define KV_CUDA_ALLOC(ptr, bytes, pinned, what)                                     \
    do {                                                                            \
        void *kv_p_ = NULL;                                                         \
        kv_status kv_s_ = kv_cuda_alloc(&kv_p_, (bytes), (pinned), (what), __FILE__, __LINE__); \
        if (kv_s_ != KV_OK) return kv_s_;                                           \
        (ptr) = (decltype(ptr))kv_p_;                                               \
    } while (0)

/* Device and SM facts every launcher sizes its grid from. */
typedef struct {
    int sm_count;
    int smem_optin;   /* max dynamic shared memory per block (bytes) */
    int smem_per_sm;
    size_t l2_bytes;
    int score_hist;   /* KVBENCH_SCORE_HIST=1 at the query: the score kernel builds the top-k's first histogram
                         (kv_scores_launch; off by default) */
} kv_cuda_dev;
kv_status kv_cuda_dev_query(kv_cuda_dev *d);

/* ---- device arrays [H][T][D], float16 or float32 ---- */
typedef struct {
    void *p;
    int half;   /* 1: __half elements, 0: float */
    int H, T, D;
} kv_dev_kv;

struct kv_gpu_keys {
    kv_dev_kv a;
    int lossless_half; /* half requested "while lossless": widen on the first inexact value */
    void *stage;       /* pinned staging for writes */
    int stage_tokens;
};

/* ---- order-preserving key: a > b (as floats) <=> key(a) > key(b); -0 == +0 ---- */
__device__ __forceinline__ unsigned kv_f2key(float f) {
    unsigned u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float kv_key2f(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* ---- block and warp building blocks the kernels share (call from every thread) ---- */
/* The n distinct 64-bit keys v[0..n) (shared memory, P >= n words, a power
 * of two; written before the caller's barrier) in ascending order:
 * out(rank, key) for each. Up to KV_RANK_MAX keys each counts the smaller
 * ones (no barrier: n broadcast reads a key, cheaper than a bitonic sort's
 * log2(P)^2 / 2 block barriers at the top-k's usual k = 100: session 18,
 * ParisKV's final top-k 17.0 -> 14.0 us at 16K, H200); above it the O(n^2)
 * reads cost more than the barriers (PQCache takes k up to 8192), so
 * v[n..P) is padded with ~0 and sorted bitonically. n is the block's. */
constexpr int KV_RANK_MAX = 256;
template <class Out> __device__ void kv_sort_out(unsigned long long *v, int n, int P, Out out) {
    const int tid = threadIdx.x, nt = blockDim.x;
    if (n <= KV_RANK_MAX) {
        for (int j = tid; j < n; j += nt) {
            const unsigned long long x = v[j];
            int r = 0;
            for (int i = 0; i < n; i++) r += v[i] < x;
            out(r, x);
        }
        return;
    }
    for (int j = n + tid; j < P; j += nt) v[j] = ~0ULL;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int j = tid; j < P; j += nt) {
                const int l = j ^ stride;
                if (l > j) {
                    const unsigned long long a = v[j], b = v[l];
                    if ((a > b) == ((j & size) == 0)) { v[j] = b; v[l] = a; }
                }
            }
            __syncthreads();
        }
    for (int j = tid; j < n; j += nt) out(j, v[j]);
}
/* Block reduction of v, the result in every thread: warp(v) reduces a warp's
 * values (shuffles, the same result in every lane), then every warp reduces
 * the warps' results the same way (none pads past the block's warps); sh is
 * 32 values of shared scratch. Has barriers. */
template <class T, class W>
__device__ __forceinline__ T kv_block_reduce_w(T v, T *sh, W warp, T none) {
    v = warp(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return warp(lane < nw ? sh[lane] : none);
}
/* Exclusive block-wide prefix sum of v (blockDim a multiple of 32); *total
 * gets the block's sum; sw is 32 ints of shared scratch. Has barriers. */
__device__ __forceinline__ int kv_block_scan(int v, int *total, int *sw) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sw[w] = x;
    __syncthreads();
    if (w == 0) {
        int s = lane < nw ? sw[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        sw[lane] = s;
    }
    __syncthreads();
    const int excl = x - v + (w ? sw[w - 1] : 0);
    *total = sw[nw - 1];
    __syncthreads();
    return excl;
}

/* Warp-aggregated append: the lanes with `take` get consecutive slots from
 * *counter in lane order, one atomic per warp. Call from all 32 lanes. */
template <typename C> __device__ __forceinline__ C kv_warp_append(bool take, C *counter) {
    const unsigned m = __ballot_sync(0xffffffffu, take);
    if (!m) return 0;
    const int lane = threadIdx.x & 31, leader = __ffs(m) - 1;
    C pos = 0;
    if (lane == leader) pos = atomicAdd(counter, (C)__popc(m));
    return __shfl_sync(0xffffffffu, pos, leader) + (C)__popc(m & ((1u << lane) - 1));
}

/* Acquire load (gpu scope) of a flag or counter other blocks write: the spin side of a flag a block raises
 * after a __threadfence. */
__device__ __forceinline__ unsigned kv_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* cp.async (sm_80+), 16 B from global to shared memory: kv_cp16, or kv_cp16_n, which reads the first n bytes
 * and zero-fills the rest (n = 0: zeros, nothing read); kv_cp_commit closes the thread's group of copies,
 * kv_cp_wait<N> waits until at most N of its groups are in flight (their data visible to the issuing thread). */
__device__ __forceinline__ void kv_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void kv_cp16_n(void *dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void kv_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void kv_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Programmatic dependent launch (sm_90): the device side. kv_dep_launch lets the next kernel's blocks be
 * scheduled now; kv_dep_wait waits for the previous kernel's completion and memory. Both no-ops when the
 * kernel was launched plainly. */
__device__ __forceinline__ void kv_dep_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void kv_dep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/* The host side: a launch configuration with programmatic stream serialization when pdl (its blocks may
 * start during the previous kernel on st, and order their reads of its results with kv_dep_wait) and
 * thread-block clusters of `cluster` blocks along x when cluster > 0; at[2] holds the attributes. */
inline cudaLaunchConfig_t kv_launch_cfg(cudaLaunchAttribute at[2], dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                        int pdl, unsigned cluster) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    if (cluster) {
        at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        at[cfg.numAttrs].val.clusterDim.x = cluster;
        at[cfg.numAttrs].val.clusterDim.y = 1;
        at[cfg.numAttrs++].val.clusterDim.z = 1;
    }
    if (pdl) {
        at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    return cfg;
}

/* Launch k with programmatic stream serialization (clusters of `cluster` blocks when > 0). Returns the
 * launch's error: a caller that gets one may clear it (cudaGetLastError) and launch plainly. */
template <typename... A, typename... B>
cudaError_t kv_launch_pdl(void (*k)(A...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, unsigned cluster,
                          B &&...args) {
    cudaLaunchAttribute at[2];
    const cudaLaunchConfig_t cfg = kv_launch_cfg(at, grid, block, smem, st, 1, cluster);
    return cudaLaunchKernelEx(&cfg, k, args...);
}

/* Launch k (in clusters of `cluster` blocks when > 0) with programmatic dependent launch when *pdl, else
 * plainly; a launch the driver refuses with the attribute clears *pdl (said once on stderr, naming who) and
 * is made plainly. */
template <typename... A, typename... B>
kv_status kv_launch_cl(int *pdl, const char *who, unsigned cluster, void (*k)(A...), dim3 grid, dim3 block,
                       size_t smem, cudaStream_t st, B &&...args) {
    if (*pdl) {
        const cudaError_t e = kv_launch_pdl(k, grid, block, smem, st, cluster, args...);
        if (e == cudaSuccess) return KV_OK;
        (void)cudaGetLastError(); /* not sticky */
        fprintf(stderr, "kvbench: %s: a launch with programmatic dependent launch refused (%s, grid %u x %u): "
                "plain launches from now on\n", who, cudaGetErrorString(e), grid.x, grid.y);
        *pdl = 0;
    }
    if (cluster) {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = kv_launch_cfg(at, grid, block, smem, st, 0, cluster);
        KV_CUDA_TRY(cudaLaunchKernelEx(&cfg, k, args...));
        return KV_OK;
    }
    k<<<grid, block, smem, st>>>(args...);
    KV_LAUNCH_CHECK();
    return KV_OK;
}
template <typename... A, typename... B>
kv_status kv_launch(int *pdl, const char *who, void (*k)(A...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                    B &&...args) {
    return kv_launch_cl(pdl, who, 0u, k, grid, block, smem, st, args...);
}

/* Threadfence reduction: true, in every thread, for the one block that
 * arrives last of `nblocks` at *ctr; every block's earlier global writes
 * are then visible to it. Has barriers. */
__device__ __forceinline__ bool kv_arrives_last(unsigned *ctr, unsigned nblocks) {
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(ctr, 1u) == nblocks - 1;
    __syncthreads();
    const bool last = s_last != 0;
    __syncthreads(); /* everyone has read s_last before a later call rewrites it */
    if (last) __threadfence();
    return last;
}

#define KV_HIST_BINS 2048   /* 11-bit radix digits */
#define KV_TOPK_CAP 16384   /* candidates per row the final top-k stage holds in shared memory */

/* ---- scores (score.cu) ---- */
/* What the score kernel may compute on the side, for the top-k that follows:
 * the top-digit histogram hist[h*2048 + digit] of the scores i in [hlo, hhi)
 * and the largest key of each tile of 2^tshift scores, tmax[h*tmax_ld +
 * i >> tshift] (an upper bound the top-k's filter skips tiles with). */
typedef struct {
    unsigned *hist;       /* in, nullable: [Hq][2048], zero */
    int hlo, hhi;
    unsigned *tmax;       /* in, nullable: [Hq][tmax_ld] */
    long long tmax_ld;
    int hist_done;        /* out: hist was filled */
    int tshift;           /* out: tmax was filled with tiles of 2^tshift scores, or -1 */
} kv_score_extras;
/* out[h*ld + i] = scale * <q_h, K_{h/G}[lo + i]> for i in [0, n), bitwise
 * equal to kv_scores_ref; x (nullable) as above. */
kv_status kv_scores_launch(const kv_dev_kv *K, const float *q, int Hq, float scale, int lo, int n, float *out,
                           long long ld, kv_score_extras *x, const kv_cuda_dev *dev, cudaStream_t st);

/* ---- top-k (topk.cu) ---- */
typedef struct {
    unsigned *hist;  /* [3][R][2048], zero between calls (the kernel cleans up after itself) */
    unsigned *ctr;   /* [R][4] */
    unsigned *ckey;  /* [R][CAP] */
    int *cidx;       /* [R][CAP] */
    unsigned *tmax;  /* [R][tmax_ld]: tile maxima from the score kernel */
    long long tmax_ld;
    int R;
    int grid_max;    /* co-resident blocks of the top-k kernel */
} kv_topk_ws;
/* R rows of at most T scores. */
kv_status kv_topk_ws_create(kv_topk_ws *w, int R, int T, const kv_cuda_dev *dev);
void kv_topk_ws_destroy(kv_topk_ws *w);
/* Row r = S[r*ld + off + i], i in [0, n). kk = min(k, n) >= 1 of each row in
 * kv_topk_ref order: oidx[r*out_ld + j] = i + base, oval (nullable) the
 * scores; othr[r] (nullable) the kk-th largest. want_idx = 0: threshold only
 * (any kk); otherwise kk <= KV_GPU_TOPK_MAX. x (nullable): what the score
 * kernel computed on the side for these rows (its hist must be w->hist, its
 * tmax w->tmax, with S-row index 0 at tile 0). */
kv_status kv_topk_launch(kv_topk_ws *w, const float *S, long long ld, int off, int n, int R, int k, int base,
                         const kv_score_extras *x, int want_idx, int32_t *oidx, float *oval, int out_ld, float *othr,
                         cudaStream_t st);

/* ---- softmax + PV (attention.cu) ---- */
typedef struct {
    float *part;      /* per block partial o: [Hkv][groups][bph_max][8][D] */
    double *partz;    /* per block partial z: [Hkv][groups][bph_max][8] */
    float *partm;     /* per block partial max: [Hkv][groups][bph_max][8] */
    unsigned *cnt;    /* per (kv head, head group) arrival counters */
    unsigned *mkey;   /* [Hq] row maxima (order-preserving keys), zero between calls */
    int bph_max;      /* blocks per kv head at most (<= 256) */
    int Hq, Hkv, D;
} kv_pv_ws;
kv_status kv_pv_ws_create(kv_pv_ws *w, int Hq, int Hkv, int D, const kv_cuda_dev *dev);
void kv_pv_ws_destroy(kv_pv_ws *w);
/* Over scores S[h*ld + i], i in [0, n): m[h] = max, Z[h] = sum exp(s - m),
 * and when V is given o[h*D + d] = sum softmax_i V_{h/G}[i][d]. */
kv_status kv_pv_launch(kv_pv_ws *w, const float *S, long long ld, int n, const kv_dev_kv *V, float *m, float *Z,
                       float *o, const kv_cuda_dev *dev, cudaStream_t st);

/* ---- the exact search on the device (search.cu): fused scores + top-k ---- */
/* idx[h*kk + j] (device), kk = min(k, n), positions lo + i. */
kv_status kv_exact_launch(const kv_dev_kv *K, const float *q, int Hq, float scale, int lo, int n, float *S,
                          long long ld, kv_topk_ws *tk, int k, int32_t *idx, const kv_cuda_dev *dev, cudaStream_t st);

/* ---- stage timing for benchmarks (bench.cu) ---- */
/* A stream, a flush buffer of >= 3x L2 (read before every repetition, so a
 * stage never finds its inputs in L2) and 2*reps CUDA events. The stream is
 * the bench process's (kv_gpu_bench_spec.stream; the timer does not destroy
 * it). */
typedef struct {
    kv_cuda_dev dev;
    cudaStream_t st;
    uint4 *flush;
    size_t flush_n;
    unsigned *sink;
    cudaEvent_t *ev;
    int nev, reps, warmup;
    float *ms;
} kv_bench_timer;
kv_status kv_bench_timer_init(kv_bench_timer *t, int reps, int warmup, void *stream);
void kv_bench_timer_free(kv_bench_timer *t);
kv_status kv_bench_flush(kv_bench_timer *t);
/* Median and p90 of the repetitions' event times. */
kv_status kv_bench_timer_stats(kv_bench_timer *t, kv_gpu_timing *out);
/* Times `launch` (a callable returning kv_status, launching on t->st):
 * warm-up runs, then reps runs each preceded by a flush, CUDA events around
 * exactly the launch. */
template <class F> kv_status kv_bench_time(kv_bench_timer *t, F &&launch, kv_gpu_timing *out) {
    for (int w = 0; w < t->warmup; w++) {
        KV_TRY(kv_bench_flush(t));
        KV_TRY(launch());
    }
    for (int r = 0; r < t->reps; r++) {
        KV_TRY(kv_bench_flush(t));
        KV_CUDA_TRY(cudaEventRecord(t->ev[2 * r], t->st));
        KV_TRY(launch());
        KV_CUDA_TRY(cudaEventRecord(t->ev[2 * r + 1], t->st));
    }
    return kv_bench_timer_stats(t, out);
}

/* ---- CUDA Graphs for a fixed launch sequence (issue 12: short searches are launch-bound) ----
 * kv_graph_run(g, key, key_n, st, launch): `launch` (a callable taking the
 * stream, returning kv_status, doing nothing but kernel launches and
 * async device work on it) is captured into a graph when `key` (the bytes
 * its launches depend on: sizes, scalars) is the same as at the previous
 * call, and the graph is replayed while the key stays; a key seen once runs
 * the launches directly, since a capture (tens of microseconds of host time)
 * pays off only for a shape that repeats: `kvbench bench` repeats one shape,
 * a decode loop grows the region at every step (issue 12 goal 1). A
 * re-capture updates the executable graph in place (cudaGraphExecUpdate; a
 * new instantiation when the topology changed). The launches and their order
 * are exactly those of a direct call, so results are unchanged. Where
 * capture or instantiation fails (or KVBENCH_CUDA_GRAPHS=0), the handle
 * falls back to direct launches for good, with no error left behind. */
#include <string.h>
typedef struct {
    cudaGraphExec_t exec;
    cudaStream_t st;
    unsigned char key[128];
    int key_n;
    int off; /* 1: direct launches */
    unsigned char last[128]; /* the previous call's key */
    int last_n;
} kv_graph;
/* 1 unless KVBENCH_CUDA_GRAPHS=0 (read at each call: cheap, and tests may set it). */
static inline int kv_graphs_enabled(void) {
    const char *e = getenv("KVBENCH_CUDA_GRAPHS");
    return !(e && e[0] == '0' && !e[1]);
}
static inline void kv_graph_destroy(kv_graph *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
    g->key_n = 0;
}
template <class F> kv_status kv_graph_run(kv_graph *g, const void *key, int key_n, cudaStream_t st, F &&launch) {
    if (g->off || key_n > (int)sizeof g->key || !kv_graphs_enabled()) return launch(st);
    if (g->exec && g->st == st && g->key_n == key_n && !memcmp(g->key, key, (size_t)key_n)) {
        KV_CUDA_TRY(cudaGraphLaunch(g->exec, st));
        return KV_OK;
    }
    const int repeat = g->last_n == key_n && !memcmp(g->last, key, (size_t)key_n);
    memcpy(g->last, key, (size_t)key_n);
    g->last_n = key_n;
    if (!repeat) return launch(st); /* a shape seen once: no capture */
    cudaGraph_t graph = NULL;
    int ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
        kv_status ls = launch(st);
        cudaError_t e = cudaStreamEndCapture(st, &graph);
        ok = ls == KV_OK && e == cudaSuccess && graph;
    }
    if (ok && g->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(g->exec, graph, &info) != cudaSuccess) {
            (void)cudaGetLastError();
            cudaGraphExecDestroy(g->exec);
            g->exec = NULL;
        }
    }
    if (ok && !g->exec) ok = cudaGraphInstantiate(&g->exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!ok) { /* not capturable here: direct launches from now on (a real error recurs there) */
        (void)cudaGetLastError();
        kv_clear_error();
        kv_graph_destroy(g);
        g->off = 1;
        return launch(st);
    }
    g->st = st;
    g->key_n = key_n;
    memcpy(g->key, key, (size_t)key_n);
    KV_CUDA_TRY(cudaGraphLaunch(g->exec, st));
    return KV_OK;
}

#endif
