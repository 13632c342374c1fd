/* attn_eval.cu: the evaluation of a decode step where the oracle's scores
 * are (issue 12, goal 1): the run loop spent 20 ms a step copying every
 * score to the host and sorting it there for the several-budget thresholds
 * and the budget profile (issue 11), and 1.2 ms per method-step on the
 * protocol's diagnostics. Both now run on the device, after the step's
 * softmax + PV (attention.cu), on the oracle's stream, and only O(Hq) numbers
 * come back.
 *
 * Several budgets and the profile (kv_gpu_attn_multi): each head's region is
 * sorted descending by one device radix sort of (head, order-preserving
 * score key) pairs; the k-th largest of each budget is read from it and the
 * origin counts are taken against it, as the host did (the same float
 * numbers, so identical). The profile's crossing j of mass p (the smallest j
 * with sink/local mass + the j largest region terms >= p Z, kv_profile_head)
 * is found in two passes over spans of each head's order, up to 64 blocks a
 * head (one block a head took 146 us a step at 128K): each block's sum,
 * then each thread's scan from base + the earlier blocks' sums + the block's
 * exclusive scan, its first crossing offered to the block's minimum and
 * that to the head's (an atomic per thread on the head's words cost 119
 * us). These double sums run in another order than the host's sequential
 * ones, and exp may differ by an ulp, so the two sums can
 * differ by at most about 4 (t + 2) 2^-53 Z; every crossing whose sums are
 * within 8 (t + 3) 2^-53 Z of the target is reported uncertain and the host
 * recomputes that head with its own arithmetic (cli/oracle.c), so the result
 * is the host's in every case.
 *
 * Diagnostics (kv_gpu_attn_diag): the host builds and checks each head's
 * attended list (cli/protocol.c: sink, local, selected, extra, deduplicated,
 * the method's contract) and packs it with the candidate lists into one
 * upload (a method's device candidates, kv_method.candidates_dev, are read
 * where they are instead): the positions, the flags as bytes, the
 * log-weights only for a method that has them, and one list for the G heads
 * of a group where a per-kv-head method gives them one (issue 12: RACC's
 * lists, most of the region, made packing and uploading them a step's
 * largest host cost); the candidate hits are counted by blocks striding
 * each list (ev_cand_kernel), then one block per query head computes the
 * protocol's row with the host's double operations in the host's order (per
 * element d the output sum over the list in list order, beside it the mass
 * and weight sums, over shared-memory tiles of the list; then the error's
 * sums over d; explicit __dadd_rn/__dmul_rn so nothing is contracted into an
 * FMA), the hit counts from the same float scores and threshold. At 128K
 * with MagicPIG's ~2000-entry lists (issue 12's run, ncu) the kernel took
 * 344 us a step when one block a head also counted the candidates and
 * thread 0 summed from global memory, 191 us with these tiles, and 253 us
 * with a tile's V elements held in registers instead (not kept; the output
 * sums stay latency-bound on each row's load). exp is CUDA's, within an ulp of
 * glibc's; the rows are stored as float, so a difference would have to fall
 * on a float rounding boundary to show (scripts/golden_run.py checks the
 * printed numbers bit for bit). */
#include <math.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_pipeline.h>

#include "attn_state.cuh"

namespace {

constexpr int EV_TH = 256;  /* the profile: threads per block */
constexpr int EV_NB = 64;   /* the profile: at most this many blocks per head */
constexpr int EV_DT = 128;  /* the diagnostics: one block per head */
constexpr int EV_TILE = 256; /* the diagnostics: list entries per shared-memory tile */
constexpr int EV_CT = 256;  /* the candidate hits: threads per block */
constexpr int EV_NP = 5;    /* KV_NPROFILE */
constexpr double EV_U = 1.1102230246251565e-16; /* 2^-53 */

/* ev_diag_kernel's dynamic shared memory: [2][D] doubles, then with vstage two tiles of value rows. */
inline size_t ev_diag_smem(int D, int vstage) {
    return 2 * (size_t)D * sizeof(double) + (vstage ? 2 * (size_t)EV_TILE * D * sizeof(__half) : 0);
}

/* descending floats as ascending keys (cli/oracle.c radix_sort_desc) and back */
__device__ __forceinline__ unsigned ev_desc(float f) {
    const unsigned b = __float_as_uint(f);
    return (b & 0x80000000u) ? b : (~b & 0x7fffffffu);
}
__device__ __forceinline__ float ev_undesc(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? k : (~k & 0x7fffffffu));
}

__global__ void ev_keys_kernel(const float *S, long long ld, int lo, int n, int Hq, unsigned long long *out) {
    const long long total = (long long)Hq * n;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int h = (int)(e / n), j = (int)(e % n);
        out[e] = ((unsigned long long)h << 32) | ev_desc(S[(size_t)h * ld + lo + j]);
    }
}

/* exclusive block prefix sum of v (any order of additions: bounded error) */
__device__ double ev_block_exscan(double v, double *total, double *sw) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sw[warp] = x;
    __syncthreads();
    if (warp == 0) {
        double w = lane < nw ? sw[lane] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nw) sw[lane] = w;
    }
    __syncthreads();
    double ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0.0;
    *total = sw[nw - 1];
    return (warp ? sw[warp - 1] : 0.0) + ex;
}

struct ev_prof_params {
    const float *S;
    long long ld;
    const unsigned long long *keys; /* sorted, [Hq][n] */
    int n, lo, hi, t, nk, profile, Hq, span;
    const int *ks;
    double p[EV_NP];
    float *thr;     /* [nk][Hq] */
    double *part;   /* [Hq][EV_NB]: each block's sum of its span's terms */
    unsigned long long *cross; /* [Hq][EV_NP]: min over threads of crossing j << 1 | uncertain (all ones before) */
};

/* The head's row maximum m over [0, t] (the largest region key, then the
 * sink and local scores; max is exact in any order) into *sm, by warp 0. */
__device__ void ev_head_max(const ev_prof_params &p, const unsigned long long *K, const float *row, double *sm) {
    if (threadIdx.x >= 32) return;
    float m = ev_undesc((unsigned)K[0]);
    for (int i = threadIdx.x; i < p.lo; i += 32) m = fmaxf(m, row[i]);
    for (int i = p.hi + threadIdx.x; i <= p.t; i += 32) m = fmaxf(m, row[i]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) *sm = m;
}

/* Thread tid's keys of block blockIdx.x's span: [a, b). */
__device__ __forceinline__ void ev_range(const ev_prof_params &p, int *a, int *b) {
    const int b0 = blockIdx.x * p.span, b1 = min(p.n, b0 + p.span), per = (p.span + EV_TH - 1) / EV_TH;
    *a = min(b1, b0 + (int)threadIdx.x * per);
    *b = min(b1, *a + per);
}

/* Pass 1, blocks (span, head): the thresholds of every budget (block 0),
 * and with the profile each block's sum of exp(key - m) over its span. */
__global__ void __launch_bounds__(EV_TH) ev_psum_kernel(const ev_prof_params p) {
    __shared__ double sw[32], s_m;
    const int h = blockIdx.y, tid = threadIdx.x;
    const unsigned long long *K = p.keys + (size_t)h * p.n;
    if (blockIdx.x == 0 && tid == 0)
        for (int b = 0; b < p.nk; b++) {
            const int kk = min(p.ks[b], p.n);
            p.thr[(size_t)b * p.Hq + h] = kk > 0 ? ev_undesc((unsigned)K[kk - 1]) : INFINITY;
        }
    if (!p.profile) return;
    ev_head_max(p, K, p.S + (size_t)h * p.ld, &s_m);
    __syncthreads();
    const double m = s_m;
    int a, b;
    ev_range(p, &a, &b);
    double s = 0;
    for (int j = a; j < b; j++) s += exp((double)ev_undesc((unsigned)K[j]) - m);
    double total;
    ev_block_exscan(s, &total, sw);
    if (tid == 0) p.part[(size_t)h * EV_NB + blockIdx.x] = total;
}

/* Pass 2, the same blocks: the profile's crossings. Z = the sink/local mass
 * (in index order, kv_profile_head) + the blocks' sums in block order, the
 * same numbers in every block; each thread scans its keys from its offset
 * (base + the earlier blocks' sums + the block's exclusive scan) and offers
 * its first crossing of each target, flagged when within the margin, to the
 * block's minimum; the thread holding the last key offers n (no crossing),
 * flagged when the mass before the last term is within the margin. */
__global__ void __launch_bounds__(EV_TH) ev_cross_kernel(const ev_prof_params p) {
    __shared__ double sw[32], s_m, s_off, s_Z;
    __shared__ unsigned long long s_cross[EV_NP]; /* the block's minimum first, then one global atomic per target */
    const int h = blockIdx.y, tid = threadIdx.x, nb = (p.n + p.span - 1) / p.span;
    if (tid < EV_NP) s_cross[tid] = ~0ull;
    const unsigned long long *K = p.keys + (size_t)h * p.n;
    const float *row = p.S + (size_t)h * p.ld;
    ev_head_max(p, K, row, &s_m);
    __syncthreads();
    const double m = s_m;
    if (tid == 0) {
        double base = 0, off = 0, all = 0;
        for (int i = 0; i < p.lo; i++) base += exp((double)row[i] - m);
        for (int i = p.hi; i <= p.t; i++) base += exp((double)row[i] - m);
        for (int b = 0; b < nb; b++) {
            if (b == (int)blockIdx.x) off = all;
            all += p.part[(size_t)h * EV_NB + b];
        }
        s_off = base + off;
        s_Z = base + all;
    }
    __syncthreads();
    int a, b;
    ev_range(p, &a, &b);
    double s = 0;
    for (int j = a; j < b; j++) s += exp((double)ev_undesc((unsigned)K[j]) - m);
    double total;
    const double pre = ev_block_exscan(s, &total, sw);
    const double Z = s_Z, margin = 8.0 * (p.t + 3.0) * EV_U * Z;
    double cum = s_off + pre, prev = -INFINITY; /* cum = the mass before term j; prev = before term j - 1 */
    if (a > 0 && a < b) prev = cum - exp((double)ev_undesc((unsigned)K[a - 1]) - m);
    unsigned long long *cross = p.cross + (size_t)h * EV_NP;
    int fj[EV_NP];
#pragma unroll
    for (int q = 0; q < EV_NP; q++) fj[q] = -1;
    for (int j = a; j < b; j++) {
#pragma unroll
        for (int q = 0; q < EV_NP; q++) {
            const double tgt = p.p[q] * Z;
            if (fj[q] < 0 && cum >= tgt) {
                fj[q] = j;
                const bool near = cum - tgt <= margin || (j > 0 && tgt - prev <= margin);
                atomicMin(&s_cross[q], (unsigned long long)j << 1 | (near ? 1ull : 0ull));
            }
        }
        prev = cum;
        cum += exp((double)ev_undesc((unsigned)K[j]) - m);
    }
    if (a < b && b == p.n)
#pragma unroll
        for (int q = 0; q < EV_NP; q++)
            atomicMin(&s_cross[q], (unsigned long long)p.n << 1 | (p.p[q] * Z - prev <= margin ? 1ull : 0ull));
    __syncthreads();
    if (tid < EV_NP && s_cross[tid] != ~0ull) atomicMin(&cross[tid], s_cross[tid]);
}

/* cnt[b][0][h] / cnt[b][1][h] += scores of [lo, split) / [split, hi) >= thr[b][h] */
__global__ void ev_count_kernel(const float *S, long long ld, const float *thr, int lo, int split, int hi,
                                unsigned *cnt, int Hq) {
    const int h = blockIdx.y, b = blockIdx.z;
    const float th = thr[(size_t)b * Hq + h];
    unsigned x = 0, y = 0;
    for (int i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += gridDim.x * blockDim.x)
        if (S[(size_t)h * ld + i] >= th) (i < split ? x : y)++;
    for (int o = 16; o; o >>= 1) {
        x += __shfl_down_sync(0xffffffffu, x, o);
        y += __shfl_down_sync(0xffffffffu, y, o);
    }
    if ((threadIdx.x & 31) == 0) {
        if (x) atomicAdd(&cnt[(size_t)b * 2 * Hq + h], x);
        if (y) atomicAdd(&cnt[(size_t)b * 2 * Hq + Hq + h], y);
    }
}

struct ev_diag_params {
    const uint32_t *in; /* kv_gpu_attn_diag's words: [Hq] list starts, [Hq] lengths, [Hq+1] candidate offsets,
                         * then att[N], logw[N] (when lw_off), the flags (bytes), cand[NC] at these offsets */
    size_t att_off, lw_off, flg_off, cand_off; /* in words; lw_off 0: every log-weight 0 */
    int Hq, G, N, kk, split, has_cand, t;
    const int32_t *dc;  /* device candidates (NULL: cand[] of in): list r at dc + r*dld, dcount each (-1: head
                         * h's length packed as a candidate offset); head h reads list h / dmap (dmap = Hq / lists) */
    long long dld;
    int dmap, dcount;
    unsigned *chits;    /* [Hq + 1]: ev_cand_kernel's hits per head, then 1 for a position outside [0, t] */
    const float *S;
    long long ld;
    const void *V; /* NULL: no values */
    int Vhalf;
    int vstage;    /* 1: each tile's value rows staged in shared memory (ev_vstage) */
    long long VT;
    int D;
    const float *m, *Z, *of, *thr;
    const unsigned *ntop; /* [2][Hq] */
    kv_gpu_diag_row *out;
};

/* Head h's candidate list and its length. */
__device__ __forceinline__ const int32_t *ev_cands(const ev_diag_params &p, int h, int *n) {
    const uint32_t *coff = p.in + 2 * p.Hq;
    if (p.dc) {
        *n = p.dcount >= 0 ? p.dcount : (int)(coff[h + 1] - coff[h]);
        return p.dc + (long long)(h / p.dmap) * p.dld;
    }
    *n = (int)(coff[h + 1] - coff[h]);
    return (const int32_t *)(p.in + p.cand_off) + coff[h];
}

/* Candidate hits, head blockIdx.y of method-step blockIdx.z, blocks
 * blockIdx.x striding its list (a list can hold a tenth of the region: one
 * block per head made this the diagnostics' longest part): chits[h] += the
 * candidates scoring >= the threshold; integer sums, so any order gives the
 * host's count. A position outside [0, t] (a method's error) sets chits[Hq]. */
__global__ void __launch_bounds__(EV_CT) ev_cand_kernel(const ev_diag_params *ps) {
    const ev_diag_params &p = ps[blockIdx.z];
    if (!p.has_cand) return;
    const int h = blockIdx.y, t = p.t;
    int n;
    const int32_t *c = ev_cands(p, h, &n);
    const float *row = p.S + (size_t)h * p.ld;
    const float th = p.thr[h];
    unsigned hits = 0, bad = 0;
#pragma unroll 4
    for (int j = blockIdx.x * EV_CT + threadIdx.x; j < n; j += gridDim.x * EV_CT) {
        const int i = c[j];
        const bool in = i >= 0 && i <= t;
        bad |= !in;
        hits += in && row[in ? i : 0] >= th;
    }
    for (int o = 16; o; o >>= 1) hits += __shfl_down_sync(0xffffffffu, hits, o);
    bad = __any_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31) == 0) {
        if (hits) atomicAdd(&p.chits[h], hits);
        if (bad) atomicOr(&p.chits[p.Hq], 1u);
    }
}

/* Whether the diagnostics stage each tile's float16 value rows in shared memory (two tiles: EV_TILE x D
 * halves each, after the [2][D] doubles): one block pass over d (D <= EV_DT), whole 16-B pieces a row. */
inline bool ev_vstage(int Vhalf, int D, int smem_optin) {
    return Vhalf && D <= EV_DT && D % 8 == 0 && ev_diag_smem(D, 1) <= (size_t)smem_optin;
}

/* ev_diag_kernel's sums with vstage (float16 values, D <= EV_DT: thread d owns element d): the same operands
 * in the same order as the unstaged loop, but every global read of a tile is a cp.async issued one tile
 * ahead (list entries two tiles ahead, their scores, log-weights and value rows one tile ahead, the scores
 * gathered through the entries already in shared memory), so neither the exp terms nor the sums wait on a
 * global load; and without log-weights, when lmax == m, a weight is its mass term (the host's reuse: the same
 * double). Into sacc[d] and, for thread 0, *mass and *wsum. */
__device__ void ev_sums_staged(const ev_diag_params &p, int g, int c0, int c1, const float *row, double m,
                               double lmax, double *sacc, double *mass, double *wsum) {
    __shared__ int32_t s_att[3][EV_TILE];
    __shared__ float s_sc[2][EV_TILE], s_lw[2][EV_TILE];
    __shared__ double s_e[EV_TILE], s_w[EV_TILE];
    const int tid = threadIdx.x, D = p.D, pr = D / 8, nti = (c1 - c0 + EV_TILE - 1) / EV_TILE;
    const int32_t *att = (const int32_t *)(p.in + p.att_off);
    const float *lw = p.lw_off ? (const float *)(p.in + p.lw_off) : NULL;
    const __half *V = (const __half *)p.V;
    __half *sv = (__half *)(sacc + 2 * D); /* [2][EV_TILE][D] */
    const bool same_w = !lw && lmax == m;
    /* tile u's entries into s_att[u % 3] (a group of their own: committed by the caller) */
    auto copy_att = [&](int u) {
        const int t0 = c0 + u * EV_TILE, nt = min(EV_TILE, c1 - t0);
        for (int j = tid; j < nt; j += EV_DT) __pipeline_memcpy_async(&s_att[u % 3][j], att + t0 + j, 4);
    };
    /* tile u's scores, log-weights and value rows (its entries already in shared memory) */
    auto copy_rest = [&](int u) {
        const int t0 = c0 + u * EV_TILE, nt = min(EV_TILE, c1 - t0), b = u & 1;
        for (int j = tid; j < nt; j += EV_DT) {
            __pipeline_memcpy_async(&s_sc[b][j], row + s_att[u % 3][j], 4);
            if (lw) __pipeline_memcpy_async(&s_lw[b][j], lw + t0 + j, 4);
        }
        __half *dst = sv + (size_t)b * EV_TILE * D;
        for (int x = tid; x < nt * pr; x += EV_DT) {
            const int j = x / pr, q = x - j * pr;
            __pipeline_memcpy_async((uint4 *)(dst + (size_t)j * D) + q,
                                    (const uint4 *)(V + ((size_t)g * p.VT + s_att[u % 3][j]) * D) + q, 16);
        }
    };
    double acc = 0, ms = 0, ws = 0;
    if (nti > 0) {
        copy_att(0);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncthreads();
        copy_rest(0);
        if (nti > 1) copy_att(1);
        __pipeline_commit();
    }
    for (int u = 0; u < nti; u++) {
        const int nt = min(EV_TILE, c1 - c0 - u * EV_TILE), b = u & 1;
        __pipeline_wait_prior(0); /* tile u's scores and rows, tile u + 1's entries */
        __syncthreads();          /* ... visible to all; tile u - 1's sums done with its buffers */
        if (u + 1 < nti) {
            copy_rest(u + 1);
            if (u + 2 < nti) copy_att(u + 2);
            __pipeline_commit();
        }
        for (int j = tid; j < nt; j += EV_DT) {
            const double sx = (double)s_sc[b][j];
            s_e[j] = exp(sx - m);
            s_w[j] = same_w ? s_e[j] : exp((sx + (double)(lw ? s_lw[b][j] : 0.f)) - lmax);
        }
        __syncthreads();
        const __half *sb = sv + (size_t)b * EV_TILE * D + tid;
        if (tid < D) {
#pragma unroll 8
            for (int j = 0; j < nt; j++) {
                acc = __dadd_rn(acc, __dmul_rn(s_w[j], (double)__half2float(sb[(size_t)j * D])));
                if (tid == 0) { ms = __dadd_rn(ms, s_e[j]); ws = __dadd_rn(ws, s_w[j]); }
            }
        }
    }
    if (tid < D) sacc[tid] = acc;
    *mass = ms;
    *wsum = ws;
}

/* Head blockIdx.x of method-step blockIdx.y (its parameters ps[blockIdx.y]): cli/protocol.c kv_protocol_score's row.
 * The list's counts and log-weight maximum in parallel; then tiles of EV_TILE entries in shared memory (their
 * exp terms computed as they are loaded), over which thread d runs element d's output sum in list order while
 * thread 0 runs the mass and weight sums beside it, so the sequential sums cost one pass, not three. With
 * vstage (a float16 V) the tiles come through ev_sums_staged instead, whose global reads are all issued a tile
 * ahead (issue 12: RACC's lists, most of the region, made this kernel's dependent loads its time). The sums'
 * operands and order are the same either way. */
__global__ void __launch_bounds__(EV_DT) ev_diag_kernel(const ev_diag_params *ps) {
    const ev_diag_params &p = ps[blockIdx.y];
    extern __shared__ double sacc[]; /* [2][D]: the output sums, then each d's squared error and reference */
    __shared__ double s_lmax[EV_DT / 32], s_e[EV_TILE], s_w[EV_TILE];
    __shared__ int s_a[EV_TILE], s_cnt[5];
    const int h = blockIdx.x, tid = threadIdx.x, g = h / p.G, lane = tid & 31, warp = tid >> 5, D = p.D;
    const int32_t *att = (const int32_t *)(p.in + p.att_off);
    const uint8_t *flg = (const uint8_t *)(p.in + p.flg_off);
    const float *lw = p.lw_off ? (const float *)(p.in + p.lw_off) : NULL;
    const int c0 = (int)p.in[h], c1 = c0 + (int)p.in[p.Hq + h];
    const float *row = p.S + (size_t)h * p.ld;
    const double m = (double)p.m[h];
    const float th = p.thr[h];
    if (tid < 5) s_cnt[tid] = 0;
    __syncthreads();
    int hits = 0, hits_pre = 0, hits_sel = 0, n_sel = 0, n_extra = 0;
    double lmax = -INFINITY;
    for (int c = c0 + tid; c < c1; c += EV_DT) {
        const unsigned f = flg[c];
        const float s = row[att[c]];
        const int good = (f & 1u) && s >= th;
        hits += good && (f & 6u);
        hits_pre += good && (f & 6u) && att[c] < p.split;
        hits_sel += good && (f & 2u);
        n_sel += (f & 2u) != 0;
        n_extra += (f & 4u) && !(f & 2u) && (f & 1u);
        const double l = (double)s + (double)(lw ? lw[c] : 0.f);
        lmax = l > lmax ? l : lmax;
    }
    for (int o = 16; o; o >>= 1) lmax = fmax(lmax, __shfl_xor_sync(0xffffffffu, lmax, o));
    if (lane == 0) s_lmax[warp] = lmax;
    atomicAdd(&s_cnt[0], hits);
    atomicAdd(&s_cnt[1], hits_pre);
    atomicAdd(&s_cnt[2], hits_sel);
    atomicAdd(&s_cnt[3], n_sel);
    atomicAdd(&s_cnt[4], n_extra);
    __syncthreads();
    lmax = s_lmax[0];
    for (int i = 1; i < EV_DT / 32; i++) lmax = s_lmax[i] > lmax ? s_lmax[i] : lmax;
    /* the host's terms: exp(s - m) for the mass, exp(s + logw - lmax) for the output's weights */
    const void *V = p.V;
    const int Vhalf = p.Vhalf;
    const long long VT = p.VT;
    double mass = 0, wsum = 0;
    if (p.vstage && V) {
        ev_sums_staged(p, g, c0, c1, row, m, lmax, sacc, &mass, &wsum);
    } else {
        for (int d0 = 0; d0 < (V ? D : 1); d0 += EV_DT) {
            const int d = d0 + tid;
            const bool lead = tid == 0 && d0 == 0, vd = V && d < D;
            double acc = 0;
            for (int t0 = c0; t0 < c1; t0 += EV_TILE) {
                const int nt = min(EV_TILE, c1 - t0);
                __syncthreads(); /* the previous tile is consumed */
                for (int j = tid; j < nt; j += EV_DT) {
                    const int i = att[t0 + j];
                    const double s = (double)row[i];
                    s_a[j] = i;
                    s_e[j] = exp(s - m);
                    s_w[j] = exp((s + (double)(lw ? lw[t0 + j] : 0.f)) - lmax);
                }
                __syncthreads();
                if (vd) {
#pragma unroll 8 /* the loads of 8 rows in flight ahead of the (ordered) sums */
                    for (int j = 0; j < nt; j++) {
                        const size_t e = ((size_t)g * VT + s_a[j]) * D + d;
                        const double vv =
                            Vhalf ? (double)__half2float(((const __half *)V)[e]) : (double)((const float *)V)[e];
                        acc = __dadd_rn(acc, __dmul_rn(s_w[j], vv));
                        if (lead) { mass = __dadd_rn(mass, s_e[j]); wsum = __dadd_rn(wsum, s_w[j]); }
                    }
                } else if (lead) {
                    for (int j = 0; j < nt; j++) { mass = __dadd_rn(mass, s_e[j]); wsum = __dadd_rn(wsum, s_w[j]); }
                }
            }
            if (vd) sacc[d] = acc;
        }
    }
    __shared__ double s_wsum;
    if (tid == 0) s_wsum = wsum;
    __syncthreads();
    /* the output error's terms per d (independent), then their sums in d order */
    const float *of = p.of + (size_t)h * D;
    for (int d = tid; p.V && d < D; d += EV_DT) {
        const double diff = __dsub_rn(__ddiv_rn(sacc[d], s_wsum), (double)of[d]);
        sacc[d] = __dmul_rn(diff, diff);
        sacc[D + d] = __dmul_rn((double)of[d], (double)of[d]);
    }
    __syncthreads();
    if (tid != 0) return;
    const float nanf_ = __int_as_float(0x7fc00000);
    const int kk = p.kk;
    hits = s_cnt[0]; hits_pre = s_cnt[1]; hits_sel = s_cnt[2];
    const int chits = p.has_cand ? (int)p.chits[h] : 0;
    kv_gpu_diag_row r;
    r.n_sel = s_cnt[3];
    r.n_extra = s_cnt[4];
    r.cand_bad = p.has_cand ? (int)p.chits[p.Hq] : 0;
    r.recall = (float)(hits < kk ? hits : kk) / (float)kk;
    r.recall_sel = (float)(hits_sel < kk ? hits_sel : kk) / (float)kk;
    r.cand_recall = p.has_cand && kk > 0 ? (float)(chits < kk ? chits : kk) / (float)kk : nanf_;
    const int np = (int)p.ntop[h], ng = (int)p.ntop[p.Hq + h], hits_gen = hits - hits_pre;
    r.recall_pre = np > 0 ? (float)(hits_pre < np ? hits_pre : np) / (float)np : nanf_;
    r.recall_gen = ng > 0 ? (float)(hits_gen < ng ? hits_gen : ng) / (float)ng : nanf_;
    r.gen_share = np + ng > 0 ? (float)ng / (float)(np + ng) : nanf_;
    r.mass = (float)__ddiv_rn(mass, (double)p.Z[h]);
    r.outerr = nanf_;
    if (p.V) {
        double num = 0, den = 0;
        for (int d = 0; d < D; d++) {
            num = __dadd_rn(num, sacc[d]);
            den = __dadd_rn(den, sacc[D + d]);
        }
        r.outerr = (float)(den > 0 ? __dsqrt_rn(__ddiv_rn(num, den)) : __dsqrt_rn(num));
    }
    p.out[h] = r;
}

}  // namespace

extern "C" kv_status kv_gpu_attn_multi_init(kv_gpu_attn *a, const int *ks, int nk, int profile) {
    if (nk < 1) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: %d budgets", nk);
    const size_t cells = (size_t)a->Hq * a->T;
    if (cells > 0x7fffffffu) return kv_fail(KV_ERR_INPUT, "GPU oracle: Hq*T = %zu exceeds 2^31 for the device sort", cells);
    KV_CUDA_ALLOC(a->ev_ks, (size_t)nk * sizeof(int), 0, "oracle budgets");
    KV_CUDA_TRY(cudaMemcpy(a->ev_ks, ks, (size_t)nk * sizeof(int), cudaMemcpyHostToDevice));
    char what[160];
    snprintf(what, sizeof what, "the oracle's sort keys [2][%d][%d] (several budgets or the budget profile)", a->Hq,
             a->T);
    KV_CUDA_ALLOC(a->ev_key, cells * sizeof(unsigned long long), 0, what);
    KV_CUDA_ALLOC(a->ev_key2, cells * sizeof(unsigned long long), 0, what);
    a->ev_hbits = 0;
    while ((1 << a->ev_hbits) < a->Hq) a->ev_hbits++;
    size_t bytes = 0;
    cub::DoubleBuffer<unsigned long long> db(a->ev_key, a->ev_key2);
    KV_CUDA_TRY(cub::DeviceRadixSort::SortKeys(NULL, bytes, db, (int)cells, 0, 32 + a->ev_hbits, a->st));
    KV_CUDA_ALLOC(a->ev_tmp, bytes + 256, 0, "the oracle's sort storage");
    a->ev_tmp_bytes = bytes + 256;
    /* [nk][Hq] thresholds, [nk][2][Hq] origin counts, then (at an even word) [Hq][EV_NP] 64-bit crossings */
    a->ev_cross_w = ((size_t)nk * a->Hq * 3 + 1) & ~(size_t)1;
    a->ev_words = a->ev_cross_w + 2 * (size_t)a->Hq * EV_NP;
    KV_CUDA_ALLOC(a->ev_part, (size_t)a->Hq * EV_NB * sizeof(double), 0, "oracle profile partial sums");
    KV_CUDA_ALLOC(a->ev_res, a->ev_words * sizeof(uint32_t), 0, "oracle budget results");
    KV_CUDA_ALLOC(a->ev_hres, a->ev_words * sizeof(uint32_t), 1, "oracle budget results staging");
    a->ev_nk = nk;
    a->ev_profile = profile;
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_multi(kv_gpu_attn *a, int lo, int hi, int split, const double *ptarget, float *thr,
                                       int *ntop, int *budget, int *uncertain) {
    const int Hq = a->Hq, nk = a->ev_nk, t = a->n_last - 1;
    if (!nk) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: kv_gpu_attn_multi before kv_gpu_attn_multi_init");
    if (t < 0) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: kv_gpu_attn_multi before any step");
    if (lo < 0) lo = 0;
    if (hi > t + 1) hi = t + 1;
    const int n = hi > lo ? hi - lo : 0;
    if (n == 0) { /* an empty region: what the host computes for it */
        for (int i = 0; i < nk * Hq; i++) thr[i] = INFINITY;
        memset(ntop, 0, (size_t)nk * 2 * Hq * sizeof(int));
        if (budget) memset(budget, 0, (size_t)Hq * EV_NP * sizeof(int));
        memset(uncertain, 0, (size_t)Hq * sizeof(int));
        return KV_OK;
    }
    const long long total = (long long)Hq * n;
    const int kb = (int)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
    if (a->ev_ready) KV_CUDA_TRY(cudaEventRecord(a->ev[2], a->st));
    ev_keys_kernel<<<kb, 256, 0, a->st>>>(a->S, a->T, lo, n, Hq, a->ev_key);
    KV_LAUNCH_CHECK();
    size_t bytes = a->ev_tmp_bytes;
    cub::DoubleBuffer<unsigned long long> db(a->ev_key, a->ev_key2); /* no third buffer: the sorted keys end in one */
    KV_CUDA_TRY(cub::DeviceRadixSort::SortKeys(a->ev_tmp, bytes, db, (int)total, 0, 32 + a->ev_hbits, a->st));
    float *dthr = (float *)a->ev_res;
    unsigned *dcnt = a->ev_res + (size_t)nk * Hq;
    unsigned long long *dcross = (unsigned long long *)(a->ev_res + a->ev_cross_w);
    ev_prof_params pp = {};
    pp.S = a->S; pp.ld = a->T; pp.keys = db.Current(); pp.n = n; pp.lo = lo; pp.hi = hi; pp.t = t; pp.nk = nk;
    pp.profile = budget ? 1 : 0; pp.Hq = Hq; pp.ks = a->ev_ks;
    /* spans of at least 4096 keys, at most EV_NB blocks a head */
    const int nbh = (n + 4095) / 4096 < EV_NB ? (n + 4095) / 4096 : EV_NB;
    pp.span = (n + nbh - 1) / nbh;
    for (int j = 0; j < EV_NP; j++) pp.p[j] = ptarget ? ptarget[j] : 0.0;
    pp.thr = dthr; pp.part = a->ev_part; pp.cross = dcross;
    KV_CUDA_TRY(cudaMemsetAsync(dcnt, 0, (size_t)2 * nk * Hq * sizeof(unsigned), a->st));
    ev_psum_kernel<<<dim3(budget ? nbh : 1, Hq), EV_TH, 0, a->st>>>(pp);
    KV_LAUNCH_CHECK();
    if (budget) {
        KV_CUDA_TRY(cudaMemsetAsync(dcross, 0xff, (size_t)Hq * EV_NP * sizeof(unsigned long long), a->st));
        ev_cross_kernel<<<dim3(nbh, Hq), EV_TH, 0, a->st>>>(pp);
        KV_LAUNCH_CHECK();
    }
    const int bx = (n + 255) / 256, cap = (2 * a->dev.sm_count + Hq * nk - 1) / (Hq * nk);
    ev_count_kernel<<<dim3(bx < cap ? bx : (cap < 1 ? 1 : cap), Hq, nk), 256, 0, a->st>>>(a->S, a->T, dthr, lo, split,
                                                                                          hi, dcnt, Hq);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaMemcpyAsync(a->ev_hres, a->ev_res, a->ev_words * sizeof(uint32_t), cudaMemcpyDeviceToHost, a->st));
    if (a->ev_ready) KV_CUDA_TRY(cudaEventRecord(a->ev[3], a->st));
    KV_CUDA_TRY(cudaStreamSynchronize(a->st));
    kv_attn_ev_add(a, 2, 3, &a->t_eval);
    memcpy(thr, a->ev_hres, (size_t)nk * Hq * sizeof(float));
    for (int i = 0; i < 2 * nk * Hq; i++) ntop[i] = (int)a->ev_hres[(size_t)nk * Hq + i];
    const unsigned long long *hc = (const unsigned long long *)(a->ev_hres + a->ev_cross_w);
    for (int h = 0; h < Hq; h++) {
        uncertain[h] = 0;
        for (int q = 0; budget && q < EV_NP; q++) {
            budget[h * EV_NP + q] = (int)(hc[h * EV_NP + q] >> 1);
            uncertain[h] |= (int)(hc[h * EV_NP + q] & 1);
        }
    }
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_row(kv_gpu_attn *a, int h, float *out) {
    if (h < 0 || h >= a->Hq || a->n_last <= 0) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: row %d of no step", h);
    KV_CUDA_TRY(cudaMemcpyAsync(out, a->S + (size_t)h * a->T, (size_t)a->n_last * sizeof(float),
                                cudaMemcpyDeviceToHost, a->st));
    KV_CUDA_TRY(cudaStreamSynchronize(a->st));
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_diag_slots(kv_gpu_attn *a, int n_slots) {
    if (a->slots) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: diagnostics slots allocated twice");
    a->slots = (kv_attn_slot *)kv_calloc((size_t)(n_slots > 0 ? n_slots : 1), sizeof *a->slots, "diagnostics slots");
    if (!a->slots) return KV_ERR_NOMEM;
    a->n_slots = n_slots;
    const size_t nr = (size_t)(n_slots > 0 ? n_slots : 1) * a->Hq;
    KV_CUDA_ALLOC(a->drows, nr * sizeof(kv_gpu_diag_row), 0, "diagnostics rows");
    KV_CUDA_ALLOC(a->hrows, nr * sizeof(kv_gpu_diag_row), 1, "diagnostics rows staging");
    KV_CUDA_ALLOC(a->dpar, (size_t)(n_slots > 0 ? n_slots : 1) * sizeof(ev_diag_params), 0, "diagnostics parameters");
    KV_CUDA_ALLOC(a->hpar, (size_t)(n_slots > 0 ? n_slots : 1) * sizeof(ev_diag_params), 1,
                  "diagnostics parameters staging");
    KV_CUDA_ALLOC(a->dchits, (size_t)(n_slots > 0 ? n_slots : 1) * (a->Hq + 1) * sizeof(unsigned), 0,
                  "diagnostics candidate hits");
    a->ev_vstage = a->V && ev_vstage(a->V->a.half, a->D, a->dev.smem_optin) && kv_env_on("KVBENCH_EV_VSTAGE");
    if (a->ev_vstage)
        KV_CUDA_TRY(cudaFuncSetAttribute(ev_diag_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)ev_diag_smem(a->D, 1)));
    for (int i = 0; i < n_slots; i++) {
        a->slots[i].drow = a->drows + (size_t)i * a->Hq;
        a->slots[i].hrow = a->hrows + (size_t)i * a->Hq;
        a->slots[i].chits = a->dchits + (size_t)i * (a->Hq + 1);
    }
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_diag(kv_gpu_attn *a, int slot, const kv_gpu_diag_in *in) {
    if (slot < 0 || slot >= a->n_slots) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: diagnostics slot %d", slot);
    const int Hq = a->Hq;
    if (a->n_last <= 0) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: diagnostics before any step");
    if (in->b < 0 || in->b >= (a->ev_nk ? a->ev_nk : 1))
        return kv_fail(KV_ERR_INTERNAL, "GPU oracle: diagnostics of budget %d", in->b);
    const int devc = in->has_cand && in->dcidx; /* device candidates: nothing of them packed */
    const int share = in->share > 1 ? in->share : 1; /* heads h with h % share > 0 read head h - 1's list */
    size_t N = 0, NC = 0;
    for (int h = 0; h < Hq; h++) {
        if (h % share == 0) N += (size_t)in->count[h];
        if (in->has_cand && !devc) NC += (size_t)in->ccount[h];
    }
    const size_t words = 3 * (size_t)Hq + 1 + (in->has_logw ? 2 : 1) * N + (N + 3) / 4 + NC;
    if (words > 0xffffffffu) return kv_fail(KV_ERR_INPUT, "GPU oracle: %zu diagnostics entries in one step", words);
    kv_attn_slot *s = &a->slots[slot];
    if (s->pending) return kv_fail(KV_ERR_INTERNAL, "GPU oracle: diagnostics slot %d packed twice", slot);
    if (words > s->cap) { /* the slot's previous upload may still be in flight */
        KV_CUDA_TRY(cudaStreamSynchronize(a->st));
        cudaFreeHost(s->hin); cudaFree(s->din);
        s->hin = s->din = NULL; s->cap = 0;
        const size_t cap = words + words / 2 + 1024;
        KV_CUDA_ALLOC(s->hin, cap * sizeof(uint32_t), 1, "diagnostics lists staging");
        KV_CUDA_ALLOC(s->din, cap * sizeof(uint32_t), 0, "diagnostics lists");
        s->cap = cap;
    }
    s->dc = NULL;
    if (devc) {
        int cmax = in->dcount;
        for (int r = 0; in->dcounts && r < in->drows; r++) {
            if (in->dcounts[r] < 0 || in->dcounts[r] > in->dld)
                return kv_fail(KV_ERR_INTERNAL, "GPU oracle: device candidate list %d of %d (stride %lld)", r,
                               in->dcounts[r], in->dld);
            cmax = r == 0 || in->dcounts[r] > cmax ? in->dcounts[r] : cmax;
        }
        if (cmax < 0 || in->drows < 1 || Hq % in->drows || (cmax > 0 && in->dld < cmax))
            return kv_fail(KV_ERR_INTERNAL, "GPU oracle: device candidates of %d rows x %d (stride %lld) for %d heads",
                           in->drows, cmax, in->dld, Hq);
        s->dc = in->dcidx; s->dld = in->dld; s->dmap = Hq / in->drows; s->dcount = in->dcounts ? -1 : in->dcount;
        s->dcmax = cmax;
        if (a->ev_nk > 1 && cmax > 0) {
            /* several budgets: the method's next search of this step rewrites its lists before the flush, so
             * they are copied now (its searches are synchronous, so the lists are complete) */
            const size_t need = (size_t)in->drows * cmax;
            if (need > s->dcopy_cap) {
                const size_t cap = need + need / 2 + 1024;
                KV_CUDA_TRY(cudaStreamSynchronize(a->st));
                cudaFree(s->dcopy);
                s->dcopy = NULL; s->dcopy_cap = 0;
                KV_CUDA_ALLOC(s->dcopy, cap * sizeof(int32_t), 0, "diagnostics candidates");
                s->dcopy_cap = cap;
            }
            KV_CUDA_TRY(cudaMemcpy2DAsync(s->dcopy, (size_t)cmax * 4, in->dcidx, (size_t)in->dld * 4, (size_t)cmax * 4,
                                          (size_t)in->drows, cudaMemcpyDeviceToDevice, a->st));
            KV_CUDA_TRY(cudaStreamSynchronize(a->st));
            s->dc = s->dcopy; s->dld = cmax;
        }
    }
    /* the words: list starts and lengths, candidate offsets, att, logw (only when the method has log-weights),
     * the flags as bytes, the candidates; a group's lists packed once when they are one list (share) */
    s->att_off = 3 * (size_t)Hq + 1;
    s->lw_off = in->has_logw ? s->att_off + N : 0;
    s->flg_off = s->att_off + (in->has_logw ? 2 : 1) * N;
    s->cand_off = s->flg_off + (N + 3) / 4;
    uint32_t *w = s->hin, *st = w, *len = w + Hq, *coff = w + 2 * Hq, *att = w + s->att_off,
             *lw = in->has_logw ? w + s->lw_off : NULL, *cand = w + s->cand_off;
    uint8_t *flg = (uint8_t *)(w + s->flg_off);
    uint32_t pos = 0;
    coff[0] = 0;
    for (int h = 0; h < Hq; h++) {
        const int c = in->count[h], cc = in->has_cand && !devc ? in->ccount[h] : 0,
                  dn = devc && in->dcounts ? in->dcounts[h / (Hq / in->drows)] : 0; /* a length, no words */
        const size_t r = (size_t)h * in->cap;
        if (h % share) {
            st[h] = st[h - 1];
            len[h] = len[h - 1];
        } else {
            memcpy(att + pos, in->att + r, (size_t)c * sizeof(uint32_t));
            if (lw) memcpy(lw + pos, in->logw + r, (size_t)c * sizeof(float));
            memcpy(flg + pos, in->flag + r, (size_t)c);
            st[h] = pos;
            len[h] = (uint32_t)c;
            pos += (uint32_t)c;
        }
        if (cc && !devc) memcpy(cand + coff[h], in->cidx + (size_t)h * in->ccap, (size_t)cc * sizeof(uint32_t));
        coff[h + 1] = coff[h] + (uint32_t)(devc ? dn : cc);
    }
    s->pending = 1;
    s->held = 1;
    s->t = in->t;
    s->metric = in->metric;
    s->words = words;
    s->N = (int)N;
    s->kk = in->kk;
    s->split = in->split;
    s->has_cand = in->has_cand;
    s->b = in->b;
    return KV_OK;
}

/* Launches every packed slot: an upload of each slot's lists, then one
 * upload of the launch parameters, one kernel (a block per head and slot)
 * and one download of every slot's rows. */
extern "C" kv_status kv_gpu_attn_diag_flush(kv_gpu_attn *a) {
    const int Hq = a->Hq;
    int any = 0;
    for (int i = 0; i < a->n_slots; i++) any |= a->slots[i].pending;
    if (!any) return KV_OK;
    if (a->diag_timed) { /* the previous flush's interval (its events are long done when flushes follow steps) */
        KV_CUDA_TRY(cudaEventSynchronize(a->ev[5]));
        kv_attn_ev_add(a, 4, 5, &a->t_diag);
        a->diag_timed = 0;
    }
    if (a->ev_ready) KV_CUDA_TRY(cudaEventRecord(a->ev[4], a->st));
    ev_diag_params *par = (ev_diag_params *)a->hpar;
    int np = 0, cmax = 0, anyc = 0;
    for (int i = 0; i < a->n_slots; i++) {
        kv_attn_slot *s = &a->slots[i];
        if (!s->pending) continue;
        s->pending = 0;
        KV_CUDA_TRY(cudaMemcpyAsync(s->din, s->hin, s->words * sizeof(uint32_t), cudaMemcpyHostToDevice, a->st));
        ev_diag_params &p = par[np++];
        p = ev_diag_params{};
        p.in = s->din; p.Hq = Hq; p.G = Hq / a->Hkv; p.N = s->N; p.kk = s->kk; p.split = s->split;
        p.att_off = s->att_off; p.lw_off = s->lw_off; p.flg_off = s->flg_off; p.cand_off = s->cand_off;
        p.has_cand = s->has_cand; p.t = a->n_last - 1;
        p.dc = s->dc; p.dld = s->dld; p.dmap = s->dmap; p.dcount = s->dcount; p.chits = s->chits;
        anyc |= s->has_cand;
        const uint32_t *coff = s->hin + 2 * Hq; /* the longest candidate list, for the hit count's grid */
        if (s->has_cand && s->dc) cmax = s->dcmax > cmax ? s->dcmax : cmax;
        for (int h = 0; s->has_cand && !s->dc && h < Hq; h++)
            cmax = (int)(coff[h + 1] - coff[h]) > cmax ? (int)(coff[h + 1] - coff[h]) : cmax;
        p.S = a->S; p.ld = a->T;
        if (a->V) { p.V = a->V->a.p; p.Vhalf = a->V->a.half; p.VT = a->V->a.T; p.vstage = a->ev_vstage; }
        p.D = a->D;
        p.m = a->res; p.Z = a->res + Hq; p.of = a->res + 3 * Hq;
        if (a->ev_nk) {
            p.thr = (const float *)a->ev_res + (size_t)s->b * Hq;
            p.ntop = a->ev_res + (size_t)a->ev_nk * Hq + (size_t)s->b * 2 * Hq;
        } else {
            p.thr = a->res + 2 * Hq;
            p.ntop = a->cnt;
        }
        p.out = s->drow;
    }
    KV_CUDA_TRY(cudaMemcpyAsync(a->dpar, a->hpar, (size_t)np * sizeof(ev_diag_params), cudaMemcpyHostToDevice, a->st));
    if (anyc) /* every slot's hits zeroed, then counted: about 8 candidates a thread, at most 64 blocks a list */
        KV_CUDA_TRY(cudaMemsetAsync(a->dchits, 0, (size_t)a->n_slots * (Hq + 1) * sizeof(unsigned), a->st));
    if (cmax > 0) {
        const int cb = (cmax + 8 * EV_CT - 1) / (8 * EV_CT);
        ev_cand_kernel<<<dim3((unsigned)(cb < 64 ? cb : 64), (unsigned)Hq, (unsigned)np), EV_CT, 0, a->st>>>(
            (const ev_diag_params *)a->dpar);
        KV_LAUNCH_CHECK();
    }
    ev_diag_kernel<<<dim3((unsigned)Hq, (unsigned)np), EV_DT, ev_diag_smem(a->D, a->ev_vstage), a->st>>>(
        (const ev_diag_params *)a->dpar);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaMemcpyAsync(a->hrows, a->drows, (size_t)a->n_slots * Hq * sizeof(kv_gpu_diag_row),
                                cudaMemcpyDeviceToHost, a->st));
    if (a->ev_ready) {
        KV_CUDA_TRY(cudaEventRecord(a->ev[5], a->st));
        a->diag_timed = 1;
    }
    return KV_OK;
}

extern "C" kv_status kv_gpu_attn_diag_wait(kv_gpu_attn *a) {
    KV_TRY(kv_gpu_attn_diag_flush(a));
    KV_CUDA_TRY(cudaStreamSynchronize(a->st));
    if (a->diag_timed) { kv_attn_ev_add(a, 4, 5, &a->t_diag); a->diag_timed = 0; }
    return KV_OK;
}

extern "C" void kv_gpu_attn_times(const kv_gpu_attn *a, double *step_s, double *eval_s, double *diag_s) {
    *step_s = a->t_step;
    *eval_s = a->t_eval;
    *diag_s = a->t_diag;
}

extern "C" const kv_gpu_diag_row *kv_gpu_attn_diag_take(kv_gpu_attn *a, int slot, int *t, float *metric) {
    if (slot < 0 || slot >= a->n_slots || !a->slots[slot].held || a->slots[slot].pending) return NULL;
    kv_attn_slot *s = &a->slots[slot];
    s->held = 0;
    *t = s->t;
    *metric = s->metric;
    return s->hrow;
}
