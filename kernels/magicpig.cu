/* magicpig.cu: the CUDA path of MagicPIG (Chen et al., ICLR 2025; code
 * Infini-AI-Lab/MagicPIG; issue 5, point 3): SimHash of the keys (K bits x
 * L tables of one Gaussian projection, keys centred by a mean) and of the
 * queries, the collision count over the L tables, the threshold
 * (>= min_collisions tables), compaction of the candidates in ascending
 * position and their importance-sampling log-weights, the same numbers as
 * the C reference (retrievers/magicpig.c).
 *
 * Exactness. Every projection, norm and dot product is a float sum over
 * the dims in the reference's order with separately rounded multiply and
 * add (__fmul_rn/__fadd_rn: the C reference is compiled without FMA
 * contraction), so codes and norms are bitwise the CPU's and no sign can
 * flip; the projection is therefore a tiled register-blocked kernel, not a
 * cuBLAS GEMM (TF32/FMA would reorder and fuse). The log-weight follows
 * kv_mp_logw in double (CUDA's acos/pow/log may differ from glibc by an
 * ulp or two of a double; the float result agrees to ~1e-7).
 *
 * Layout. codes [Hkv][L][Tp] uint16 (Tp = T rounded up to the 2048-key
 * chunk of the collision kernel): a thread of the collision kernel loads
 * 8 consecutive keys' codes of one table as one 16-byte word, a warp 512
 * contiguous bytes; the codes of a kv head are read once for the G query
 * heads of its group (their query codes sit in shared memory, each
 * duplicated in both halves of a word, so one xor-and-add compares two
 * keys at a time and accumulates two 16-bit counters per register). The
 * collision kernel writes a candidate bit per (query head, key) and the
 * number of candidates of each 2048-key chunk; the compaction kernel turns
 * the bits of a chunk into ascending positions at the chunk's offset (the
 * sum of the earlier chunks' counts), deterministically. Centred keys are
 * kept in float32 [Hkv][T][D] (the reference's ck) for the log-weights.
 *
 * Versions. v1: key hash reading shared memory as scalars, 4 code loads in
 * flight per thread of the collision kernel. v2 (this): key hash reading
 * float4 (keys transposed, broadcast), 8 loads in flight when a pass covers
 * <= 4 query heads, query hash from shared memory. v3: for short contexts
 * (few blocks) 4 groups of threads per block split the tables. */
#include <string.h>

#include "ops/kv_cuda.h"
#include "magicpig.h"

#define MP_CHUNK 2048   /* keys per block of the collision kernel (256 threads x 8) */
#define MP_KT 64        /* keys per block of the key-hash kernel */
#define MP_COLS 128     /* projection columns per pass of the key-hash kernel */
#define MP_XS 68        /* row stride of its transposed keys (floats; 16-byte rows) */
#define MP_BS 132       /* row stride of its sign bits (bytes; 33 words: no bank conflicts when packing) */
#define MP_QCOLS 256    /* projection columns per block of the query-hash kernel */
#define MP_NB_MAX 8     /* query heads per pass over the codes */
#define MP_STAGE 16384  /* positions per upload of host keys */
#define MP_FEW 4        /* at most this many keys hash through mp_hash_few (appends) */

struct kv_mp_gpu {
    int Hq, Hkv, T, Tp, D, K, L, KL, G, nch;
    float *proj;       /* [D][KL] */
    float *mean;       /* [Hkv][D] */
    float *ck;         /* [Hkv][T][D] centred keys */
    float *knorm;      /* [Hkv][T] */
    uint16_t *codes;   /* [Hkv][L][Tp] */
    float *q, *qnorm;  /* [Hq][D], [Hq] */
    uint16_t *qcodes;  /* [Hq][L] */
    unsigned *bits;    /* [Hq][nch*64] candidate bits */
    int *ccount;       /* [Hq][nch] candidates per chunk */
    int32_t *idx;      /* [Hq][T] */
    float *logw;       /* [Hq][T] */
    int *count;        /* [Hq] */
    uint16_t *counts;  /* [Hq][Tp] collision counts (tests only, allocated on demand) */
    float *stage;      /* [Hkv][MP_STAGE][D] host keys on their way in */
    int *hcount;       /* [Hq] pinned host: the launched search's list lengths */
    int lo, hi;        /* the launched search's region (hi <= lo: none launched) */
    cudaStream_t st;   /* the search's (the index runs on the legacy stream, which a blocking stream orders) */
    kv_cuda_dev dev;
};

namespace {

/* kv_dot_ref's order: 8 partial sums, element e into sum e & 7, then
 * ((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7)). */
__device__ float mp_dot_ref(const float *a, const float *b, int d) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int e = 0;
    for (; e + 8 <= d; e += 8)
#pragma unroll
        for (int u = 0; u < 8; u++) s[u] = __fadd_rn(s[u], __fmul_rn(a[e + u], b[e + u]));
#pragma unroll
    for (int u = 0; u < 8; u++)
        if (e + u < d) s[u] = __fadd_rn(s[u], __fmul_rn(a[e + u], b[e + u]));
    return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[1], s[5])),
                     __fadd_rn(__fadd_rn(s[2], s[6]), __fadd_rn(s[3], s[7])));
}

/* The same with the 8 partial sums on 8 consecutive lanes (lane & 7 = the
 * sum's number; `part` its partial sum); lane 0 of the 8 gets the total. */
__device__ __forceinline__ float mp_dot8_combine(float part) {
    const unsigned full = 0xffffffffu;
    float t = __fadd_rn(part, __shfl_down_sync(full, part, 4, 8));  /* lanes 0..3: s_j + s_{j+4} */
    float u = __fadd_rn(t, __shfl_down_sync(full, t, 1, 8));        /* lanes 0, 2: (s0+s4)+(s1+s5), (s2+s6)+(s3+s7) */
    return __fadd_rn(u, __shfl_down_sync(full, u, 2, 8));
}

/* Per 16-bit half of w: 1 where it equals the half of q, else 0 (bit 15 of
 * t is set iff the low 15 bits of the half of x are non-zero; no carry
 * crosses the halves). */
__device__ __forceinline__ unsigned mp_eq2(unsigned w, unsigned q) {
    unsigned x = w ^ q, t = (x & 0x7fff7fffu) + 0x7fff7fffu;
    return (~(t | x) >> 15) & 0x00010001u;
}

__device__ __forceinline__ float mp_load(const float *p) { return *p; }
__device__ __forceinline__ float mp_load(const __half *p) { return __half2float(*p); }

/* Centred keys and their norms for positions [t0, t0+n) of every kv head:
 * ck = x - mean (float), knorm = sqrtf(kv_dot_ref(ck, ck)); 8 lanes per key.
 * x[(g*ld + i)*D + j]. */
template <class T>
__global__ void mp_center(const T *x, long long ld, int n, int t0, int Hkv, int D, int Tt, const float *mean, float *ck,
                          float *knorm) {
    const int sub = threadIdx.x & 7;
    const long long total = (long long)Hkv * n;
    for (long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 3; w - ((threadIdx.x & 31) >> 3) < total;
         w += (gridDim.x * (long long)blockDim.x) >> 3) {
        const bool ok = w < total;
        const int g = ok ? (int)(w / n) : 0, i = ok ? (int)(w % n) : 0;
        float part = 0.f;
        if (ok) {
            const T *src = x + ((long long)g * ld + i) * D;
            float *dst = ck + ((long long)g * Tt + t0 + i) * D;
            const float *mu = mean + (long long)g * D;
            for (int j = sub; j < D; j += 8) {
                float c = __fsub_rn(mp_load(src + j), mu[j]);
                dst[j] = c;
                part = __fadd_rn(part, __fmul_rn(c, c));
            }
        }
        float s = mp_dot8_combine(part);
        if (ok && sub == 0) knorm[(long long)g * Tt + t0 + i] = __fsqrt_rn(s);
    }
}

/* SimHash codes of the centred keys of positions [t0, t0+n), kv head
 * blockIdx.y: 64 keys per block, projection columns in passes of
 * CT = 128/K whole tables; thread (ty, tx) sums keys ty*8..ty*8+7 x columns
 * tx*4..tx*4+3, each over j in order (kv_mp_hash's order), reading both as
 * float4 (the keys broadcast). Shared: the keys transposed [D][MP_XS], a
 * pass's columns [D][128], the sign bits [64][MP_BS]. */
__global__ void __launch_bounds__(256) mp_hash_keys(const float *ck, int Tt, int Tp, int t0, int n, int D, int K,
                                                     int L, const float *proj, uint16_t *codes) {
    extern __shared__ float4 smem4[];
    float *xs = (float *)smem4, *ps = xs + MP_XS * D;
    unsigned char *bits = (unsigned char *)(ps + D * MP_COLS);
    const int g = blockIdx.y, k0 = blockIdx.x * MP_KT, tid = threadIdx.x, ty = tid >> 5, tx = tid & 31;
    const int nk = min(MP_KT, n - k0), KL = K * L, CT = MP_COLS / K;
    for (int e = tid; e < MP_KT * D; e += 256) {
        int r = e / D, j = e - r * D;
        xs[j * MP_XS + r] = r < nk ? ck[((long long)g * Tt + t0 + k0 + r) * D + j] : 0.f;
    }
    for (int l0 = 0; l0 < L; l0 += CT) {
        const int nt = min(CT, L - l0), nc = nt * K, c0 = l0 * K;
        __syncthreads(); /* xs loaded / the previous pass's bits packed */
        for (int e = tid; e < D * MP_COLS; e += 256) {
            int j = e / MP_COLS, c = e - j * MP_COLS;
            ps[e] = c < nc ? proj[(long long)j * KL + c0 + c] : 0.f;
        }
        __syncthreads();
        float acc[8][4];
#pragma unroll
        for (int r = 0; r < 8; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][c] = 0.f;
#pragma unroll 2
        for (int j = 0; j < D; j++) {
            const float4 xa = *(const float4 *)(xs + j * MP_XS + ty * 8), xb = *(const float4 *)(xs + j * MP_XS + ty * 8 + 4);
            const float4 pv4 = *(const float4 *)(ps + j * MP_COLS + tx * 4);
            const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w}, pv[4] = {pv4.x, pv4.y, pv4.z, pv4.w};
#pragma unroll
            for (int r = 0; r < 8; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[r][c] = __fadd_rn(acc[r][c], __fmul_rn(xv[r], pv[c]));
        }
#pragma unroll
        for (int r = 0; r < 8; r++)
            *(unsigned *)(bits + (ty * 8 + r) * MP_BS + tx * 4) = (unsigned)(acc[r][0] > 0.f) |
                                                                  (unsigned)(acc[r][1] > 0.f) << 8 |
                                                                  (unsigned)(acc[r][2] > 0.f) << 16 |
                                                                  (unsigned)(acc[r][3] > 0.f) << 24;
        __syncthreads();
        for (int p = tid; p < nt * MP_KT; p += 256) {
            int lt = p / MP_KT, r = p - lt * MP_KT;
            if (r >= nk) continue;
            unsigned code = 0;
            for (int i = 0; i < K; i++) code |= (unsigned)bits[r * MP_BS + lt * K + i] << i;
            codes[((long long)g * L + l0 + lt) * Tp + t0 + k0 + r] = (uint16_t)code;
        }
    }
}

/* The codes of tables l0 .. l0+nt-1 of the vector xs (shared memory, D
 * floats): thread c < nt*K sums column l0*K + c over j in order
 * (kv_mp_hash's order, as mp_hash_keys), then thread l < nt packs table
 * l0 + l's K sign bits into out[l * stride]. Every thread calls it. */
__device__ void mp_hash_cols(const float *xs, int D, int K, int L, int l0, int nt, const float *proj,
                             unsigned char *bits, uint16_t *out, long long stride) {
    const int tid = threadIdx.x, KL = K * L;
    if (tid < nt * K) {
        const float *p = proj + l0 * K + tid;
        float acc = 0.f;
#pragma unroll 8
        for (int j = 0; j < D; j++) acc = __fadd_rn(acc, __fmul_rn(xs[j], p[(long long)j * KL]));
        bits[tid] = acc > 0.f;
    }
    __syncthreads();
    if (tid < nt) {
        unsigned code = 0;
        for (int i = 0; i < K; i++) code |= (unsigned)bits[tid * K + i] << i;
        out[(long long)tid * stride] = (uint16_t)code;
    }
}

/* Query head blockIdx.y: qnorm = sqrtf(kv_dot_ref(q, q)), qn = q / qnorm
 * (0 when qnorm is 0), and the codes of tables blockIdx.x*CT ..
 * (CT = 256/K whole tables per block). */
__global__ void __launch_bounds__(256) mp_hash_query(const float *q, int D, int K, int L, const float *proj,
                                                      float *qnorm, uint16_t *qcodes) {
    extern __shared__ float qs[];
    unsigned char *bits = (unsigned char *)(qs + D);
    __shared__ float nrm;
    const int h = blockIdx.y, tid = threadIdx.x, CT = MP_QCOLS / K, l0 = blockIdx.x * CT;
    const float *qh = q + (long long)h * D;
    for (int j = tid; j < D; j += 256) qs[j] = qh[j];
    __syncthreads();
    if (tid == 0) {
        nrm = __fsqrt_rn(mp_dot_ref(qs, qs, D));
        if (blockIdx.x == 0) qnorm[h] = nrm;
    }
    __syncthreads();
    for (int j = tid; j < D; j += 256) qs[j] = nrm > 0.f ? __fdiv_rn(qs[j], nrm) : 0.f;
    __syncthreads();
    mp_hash_cols(qs, D, K, L, l0, min(CT, L - l0), proj, bits, qcodes + (long long)h * L + l0, 1);
}

/* The codes of a few centred keys (an append: position t0 + blockIdx.z of
 * kv head blockIdx.y), tables blockIdx.x*CT .. as mp_hash_query: the same
 * sums as mp_hash_keys, whose 64-key blocks would leave all but one key
 * idle and run on Hkv multiprocessors (issue 12: MagicPIG's append took
 * 325 us of host time through them at 128K, 63 us with this). */
__global__ void __launch_bounds__(256) mp_hash_few(const float *ck, int Tt, int Tp, int t0, int D, int K, int L,
                                                    const float *proj, uint16_t *codes) {
    extern __shared__ float xk[];
    unsigned char *bits = (unsigned char *)(xk + D);
    const int g = blockIdx.y, i = t0 + blockIdx.z, CT = MP_QCOLS / K, l0 = blockIdx.x * CT;
    const float *x = ck + ((long long)g * Tt + i) * D;
    for (int j = threadIdx.x; j < D; j += 256) xk[j] = x[j];
    __syncthreads();
    mp_hash_cols(xk, D, K, L, l0, min(CT, L - l0), proj, bits, codes + ((long long)g * L + l0) * Tp + i, Tp);
}

/* Collision counts of the keys of chunk c0 + blockIdx.x of kv head
 * blockIdx.y with NB query heads h0 .. h0+NB-1 of its group: thread t of
 * each group of 256 holds keys base .. base+7 (base = chunk start + 8t) as
 * two 16-bit counters per register. S groups of 256 threads split the L
 * tables (S = 4 for short contexts, whose few blocks would otherwise keep
 * too few loads in flight) and add their counters in shared memory. Group
 * 0 writes the candidate bits (count >= minc, position in [lo, hi))
 * bits[h][base/32] and the chunk's candidate count ccount[h][chunk];
 * counts[h][i - lo] when counts is given (tests). */
template <int NB, int S>
__global__ void __launch_bounds__(256 * S) mp_collide(const uint16_t *codes, int Tp, int L, const uint16_t *qcodes,
                                                       int G, int h0, int c0, int lo, int hi, int minc, unsigned *bits,
                                                       int nch, int *ccount, uint16_t *counts) {
    extern __shared__ unsigned qq[]; /* [NB][L]: the query code in both halves; S > 1: then [NB*4][256] sums */
    unsigned *tot = qq + NB * L;
    __shared__ int wsum[NB][8];
    const int g = blockIdx.y, chunk = c0 + blockIdx.x, tid = threadIdx.x, grp = tid >> 8, t = tid & 255,
              lane = tid & 31;
    const int base = chunk * MP_CHUNK + t * 8;
    for (int e = tid; e < NB * L; e += 256 * S) {
        int b = e / L, l = e - b * L;
        unsigned c = qcodes[(long long)(g * G + h0 + b) * L + l];
        qq[e] = c | (c << 16);
    }
    if (S > 1)
        for (int e = tid; e < NB * 4 * 256; e += 256 * S) tot[e] = 0;
    __syncthreads();
    unsigned cnt[NB][4];
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int w = 0; w < 4; w++) cnt[b][w] = 0;
    const bool active = base < hi && base + 8 > lo;
    if (active) {
        const uint4 *p = (const uint4 *)(codes + (long long)g * L * Tp + base);
        const long long step = Tp / 8;
        const int lb = grp * L / S, le = (grp + 1) * L / S;
        constexpr int U = S > 1 || NB > 4 ? 4 : 8; /* loads in flight per thread: short contexts are latency-bound */
        for (int l = lb; l < le; l += U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = l + u < le ? __ldcs(p + (l + u) * step) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    if (l + u >= le) continue;
                    unsigned qv = qq[b * L + l + u];
                    cnt[b][0] += mp_eq2(v[u].x, qv);
                    cnt[b][1] += mp_eq2(v[u].y, qv);
                    cnt[b][2] += mp_eq2(v[u].z, qv);
                    cnt[b][3] += mp_eq2(v[u].w, qv);
                }
        }
    }
    if (S > 1) { /* packed 16-bit pairs add without carries: every count is <= L < 65536 */
#pragma unroll
        for (int b = 0; b < NB; b++)
#pragma unroll
            for (int w = 0; w < 4; w++)
                if (grp) atomicAdd(&tot[(b * 4 + w) * 256 + t], cnt[b][w]);
        __syncthreads();
        if (grp == 0)
#pragma unroll
            for (int b = 0; b < NB; b++)
#pragma unroll
                for (int w = 0; w < 4; w++) cnt[b][w] += tot[(b * 4 + w) * 256 + t];
    }
    if (grp == 0) { /* warp-uniform */
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const int h = g * G + h0 + b;
            unsigned byte = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                int c = (cnt[b][e >> 1] >> (16 * (e & 1))) & 0xffff, i = base + e;
                bool in = active && i >= lo && i < hi;
                byte |= (unsigned)(in && c >= minc) << e;
                if (counts && in) counts[(long long)h * Tp + i - lo] = (uint16_t)c;
            }
            unsigned word = byte << ((lane & 3) * 8);
            word |= __shfl_xor_sync(0xffffffffu, word, 1);
            word |= __shfl_xor_sync(0xffffffffu, word, 2);
            if ((lane & 3) == 0) bits[(long long)h * nch * 64 + base / 32] = word;
            int pc = __popc(byte);
            for (int o = 16; o; o >>= 1) pc += __shfl_xor_sync(0xffffffffu, pc, o);
            if (lane == 0) wsum[b][tid >> 5] = pc;
        }
    }
    __syncthreads();
    if (tid < NB) {
        int s = 0;
        for (int w = 0; w < 8; w++) s += wsum[tid][w];
        ccount[(long long)(g * G + h0 + tid) * nch + chunk] = s;
    }
}

/* Compaction of chunk c0 + blockIdx.x of query head blockIdx.y (64
 * threads, one 32-key word each): offset = candidates of the chunks
 * c0 .. chunk-1, then each word's set bits in ascending order; positions at
 * or beyond cap are dropped (the reference stops at the list's capacity).
 * The last chunk writes count[h] = min(total, cap). */
__global__ void __launch_bounds__(64) mp_compact(const unsigned *bits, const int *ccount, int nch, int c0, int c1, int cap,
                                                  int32_t *idx, int *count) {
    __shared__ int wpart[2], woff[2];
    const int h = blockIdx.y, chunk = c0 + blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int off = 0;
    for (int c = c0 + tid; c < chunk; c += 64) off += ccount[(long long)h * nch + c];
    for (int o = 16; o; o >>= 1) off += __shfl_xor_sync(0xffffffffu, off, o);
    unsigned word = bits[(long long)h * nch * 64 + (long long)chunk * 64 + tid];
    const int n = __popc(word);
    int inc = n;
    for (int o = 1; o < 32; o <<= 1) {
        int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 31) wpart[warp] = inc;
    if (lane == 0) woff[warp] = off;
    __syncthreads();
    int pos = woff[0] + woff[1] + (warp ? wpart[0] : 0) + inc - n;
    const int i0 = chunk * MP_CHUNK + tid * 32;
    int32_t *out = idx + (long long)h * cap;
    while (word) {
        int b = __ffs(word) - 1;
        if (pos < cap) out[pos] = i0 + b;
        pos++;
        word &= word - 1;
    }
    if (chunk == c1 && tid == 63) count[h] = pos < cap ? pos : cap;
}

__device__ float mp_logw(double cs, int K, int L) {
    if (cs > 1) cs = 1;
    if (cs < -1) cs = -1;
    double p = pow(1.0 - acos(cs) / 3.14159265358979323846, (double)K), q = 1.0 - p;
    double w = __dsub_rn(1.0, __dmul_rn(pow(q, (double)(L - 1)), __dadd_rn(__dmul_rn((double)L, p), q)));
    return (float)-log(w + 1e-4);
}

/* Log-weights of the candidates of query head blockIdx.y, 8 lanes per
 * candidate: cos = kv_dot_ref(q_h, ck_i) / (qnorm * knorm_i) in double (0
 * when the product is 0), then kv_mp_logw. */
__global__ void __launch_bounds__(256) mp_weights(const float *q, const float *qnorm, const float *ck,
                                                   const float *knorm, int Tt, int D, int G, int K, int L,
                                                   const int32_t *idx, const int *count, int cap, float *logw) {
    extern __shared__ float qs[];
    const int h = blockIdx.y, g = h / G, sub = threadIdx.x & 7;
    for (int j = threadIdx.x; j < D; j += blockDim.x) qs[j] = q[(long long)h * D + j];
    __syncthreads();
    const int n = count[h];
    const float qn = qnorm[h];
    const int per = (gridDim.x * blockDim.x) >> 3;
    for (int c0 = (blockIdx.x * blockDim.x + threadIdx.x) >> 3; c0 - ((threadIdx.x & 31) >> 3) < n; c0 += per) {
        const bool ok = c0 < n;
        const int i = ok ? idx[(long long)h * cap + c0] : 0;
        float part = 0.f;
        if (ok) {
            const float *kp = ck + ((long long)g * Tt + i) * D;
            for (int j = sub; j < D; j += 8) part = __fadd_rn(part, __fmul_rn(qs[j], kp[j]));
        }
        float dot = mp_dot8_combine(part);
        if (ok && sub == 0) {
            double den = (double)qn * (double)knorm[(long long)g * Tt + i];
            double cs = den > 0 ? (double)dot / den : 0.0;
            logw[(long long)h * cap + c0] = mp_logw(cs, K, L);
        }
    }
}

/* Per (kv head, dim) sums of float16 keys [Hkv][ld][D], positions [0, n), in double (bench only). */
__global__ void mp_mean_sum(const __half *x, long long ld, int n, int D, int per, double *sum) {
    const int g = blockIdx.y, t0 = blockIdx.x * per;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        double s = 0;
        for (int i = t0; i < min(n, t0 + per); i++) s += __half2float(x[((long long)g * ld + i) * D + j]);
        atomicAdd(sum + (long long)g * D + j, s);
    }
}
__global__ void mp_mean_div(const double *sum, int m, int n, float *mean) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < m) mean[e] = (float)(sum[e] / n);
}

}  // namespace

/* ---- launchers ---- */

static int mp_hash_smem(int D) { return (MP_XS + MP_COLS) * D * (int)sizeof(float) + MP_KT * MP_BS; }

static kv_status mp_center_hash(kv_mp_gpu *m, const void *x, int half, long long ld, int t0, int n, cudaStream_t st) {
    if (n <= 0) return KV_OK;
    long long lanes = (long long)m->Hkv * n * 8;
    int blocks = (int)((lanes + 255) / 256), cap = 8 * m->dev.sm_count;
    if (blocks > cap) blocks = cap;
    if (half)
        mp_center<__half><<<blocks, 256, 0, st>>>((const __half *)x, ld, n, t0, m->Hkv, m->D, m->T, m->mean, m->ck,
                                                  m->knorm);
    else
        mp_center<float><<<blocks, 256, 0, st>>>((const float *)x, ld, n, t0, m->Hkv, m->D, m->T, m->mean, m->ck,
                                                 m->knorm);
    KV_LAUNCH_CHECK();
    if (n <= MP_FEW) { /* an append: a block per (tables, key) */
        const int CT = MP_QCOLS / m->K;
        mp_hash_few<<<dim3((m->L + CT - 1) / CT, m->Hkv, n), 256, m->D * sizeof(float) + MP_QCOLS, st>>>(
            m->ck, m->T, m->Tp, t0, m->D, m->K, m->L, m->proj, m->codes);
        KV_LAUNCH_CHECK();
        return KV_OK;
    }
    dim3 grid((n + MP_KT - 1) / MP_KT, m->Hkv);
    mp_hash_keys<<<grid, 256, mp_hash_smem(m->D), st>>>(m->ck, m->T, m->Tp, t0, n, m->D, m->K, m->L, m->proj, m->codes);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

static kv_status mp_hash_query_launch(kv_mp_gpu *m, cudaStream_t st) {
    int CT = MP_QCOLS / m->K;
    dim3 grid((m->L + CT - 1) / CT, m->Hq);
    mp_hash_query<<<grid, 256, m->D * sizeof(float) + MP_QCOLS, st>>>(m->q, m->D, m->K, m->L, m->proj, m->qnorm,
                                                                     m->qcodes);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* split: 0 = choose (4 groups of threads per block when NB <= 4 and the
 * blocks are too few to keep ~2 per SM busy), or 1 / 4 forced (tests). */
static kv_status mp_collide_launch(kv_mp_gpu *m, int lo, int hi, int minc, uint16_t *counts, int split,
                                   cudaStream_t st) {
    int c0 = lo / MP_CHUNK, c1 = (hi - 1) / MP_CHUNK;
    dim3 grid(c1 - c0 + 1, m->Hkv);
    for (int h0 = 0; h0 < m->G; h0 += MP_NB_MAX) {
        int nb = m->G - h0 < MP_NB_MAX ? m->G - h0 : MP_NB_MAX;
        size_t sm = (size_t)nb * m->L * sizeof(unsigned), sm4 = sm + (size_t)nb * 4 * 256 * sizeof(unsigned);
        int S = split ? split : (nb <= 4 && (long long)grid.x * grid.y < 2LL * m->dev.sm_count) ? 4 : 1;
        if (S != 1 && (nb > 4 || sm4 > 48 * 1024)) S = 1; /* the split path's instances and its shared memory */
#define MP_COLLIDE(NB, SS)                                                                                           \
    case NB * 10 + SS:                                                                                               \
        mp_collide<NB, SS><<<grid, 256 * SS, SS > 1 ? sm4 : sm, st>>>(m->codes, m->Tp, m->L, m->qcodes, m->G, h0, c0, \
                                                                      lo, hi, minc, m->bits, m->nch, m->ccount,     \
                                                                      counts);                                      \
        break;
        switch (nb * 10 + S) {
            MP_COLLIDE(1, 1) MP_COLLIDE(2, 1) MP_COLLIDE(3, 1) MP_COLLIDE(4, 1) MP_COLLIDE(5, 1) MP_COLLIDE(6, 1)
            MP_COLLIDE(7, 1) MP_COLLIDE(8, 1) MP_COLLIDE(1, 4) MP_COLLIDE(2, 4) MP_COLLIDE(3, 4) MP_COLLIDE(4, 4)
        }
#undef MP_COLLIDE
        KV_LAUNCH_CHECK();
    }
    return KV_OK;
}

static kv_status mp_compact_launch(kv_mp_gpu *m, int lo, int hi, cudaStream_t st) {
    int c0 = lo / MP_CHUNK, c1 = (hi - 1) / MP_CHUNK;
    mp_compact<<<dim3(c1 - c0 + 1, m->Hq), 64, 0, st>>>(m->bits, m->ccount, m->nch, c0, c1, m->T, m->idx, m->count);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

static kv_status mp_weights_launch(kv_mp_gpu *m, cudaStream_t st) {
    int bx = (8 * m->dev.sm_count + m->Hq - 1) / m->Hq;
    mp_weights<<<dim3(bx, m->Hq), 256, m->D * sizeof(float), st>>>(m->q, m->qnorm, m->ck, m->knorm, m->T, m->D, m->G,
                                                                  m->K, m->L, m->idx, m->count, m->T, m->logw);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* The four launches of one search, the queries already in m->q; hi > lo. */
static kv_status mp_search_launch(kv_mp_gpu *m, int lo, int hi, int minc, cudaStream_t st) {
    KV_TRY(mp_hash_query_launch(m, st));
    KV_TRY(mp_collide_launch(m, lo, hi, minc, NULL, 0, st));
    KV_TRY(mp_compact_launch(m, lo, hi, st));
    return mp_weights_launch(m, st);
}

/* ---- the C-callable API ---- */

static kv_status mp_alloc(kv_mp_gpu *m, const float *proj) {
    size_t Hq = (size_t)m->Hq, Hkv = (size_t)m->Hkv, T = (size_t)m->T, Tp = (size_t)m->Tp, D = (size_t)m->D;
    KV_TRY(kv_cuda_dev_query(&m->dev));
    int smem = mp_hash_smem(m->D);
    if (smem > m->dev.smem_optin)
        return kv_fail(KV_ERR_INPUT, "magicpig GPU: head_dim %d needs %d bytes of shared memory per block, the GPU "
                                     "allows %d", m->D, smem, m->dev.smem_optin);
    KV_CUDA_TRY(cudaFuncSetAttribute(mp_hash_keys, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    KV_CUDA_ALLOC(m->proj, D * m->KL * sizeof(float), 0, "magicpig projection");
    KV_CUDA_ALLOC(m->mean, Hkv * D * sizeof(float), 0, "magicpig key centres");
    KV_CUDA_ALLOC(m->ck, Hkv * T * D * sizeof(float), 0, "magicpig centred keys");
    KV_CUDA_ALLOC(m->knorm, Hkv * T * sizeof(float), 0, "magicpig key norms");
    KV_CUDA_ALLOC(m->codes, Hkv * m->L * Tp * sizeof(uint16_t), 0, "magicpig hash codes");
    KV_CUDA_ALLOC(m->q, Hq * (D + 1) * sizeof(float), 0, "magicpig queries");
    m->qnorm = m->q + Hq * D;
    KV_CUDA_ALLOC(m->qcodes, Hq * m->L * sizeof(uint16_t), 0, "magicpig query codes");
    KV_CUDA_ALLOC(m->bits, Hq * m->nch * 64 * sizeof(unsigned), 0, "magicpig candidate bits");
    KV_CUDA_ALLOC(m->ccount, Hq * (m->nch + 1) * sizeof(int), 0, "magicpig chunk counts");
    m->count = m->ccount + Hq * m->nch;
    KV_CUDA_ALLOC(m->idx, Hq * T * sizeof(int32_t), 0, "magicpig candidate positions");
    KV_CUDA_ALLOC(m->logw, Hq * T * sizeof(float), 0, "magicpig log-weights");
    KV_CUDA_ALLOC(m->hcount, Hq * sizeof(int), 1, "magicpig list lengths (pinned host)");
    KV_CUDA_TRY(kv_stream_create(&m->st));
    KV_CUDA_TRY(cudaMemset(m->mean, 0, Hkv * D * sizeof(float)));
    KV_CUDA_TRY(cudaMemset(m->codes, 0, Hkv * m->L * Tp * sizeof(uint16_t)));
    KV_CUDA_TRY(cudaMemcpy(m->proj, proj, D * m->KL * sizeof(float), cudaMemcpyHostToDevice));
    return KV_OK;
}

static void kv_mp_gpu_destroy(kv_mp_gpu *m) {
    if (!m) return;
    cudaFree(m->proj); cudaFree(m->mean); cudaFree(m->ck); cudaFree(m->knorm); cudaFree(m->codes); cudaFree(m->q);
    cudaFree(m->qcodes); cudaFree(m->bits); cudaFree(m->ccount); cudaFree(m->idx); cudaFree(m->logw);
    cudaFree(m->counts); cudaFree(m->stage); cudaFreeHost(m->hcount);
    if (m->st) cudaStreamDestroy(m->st);
    free(m);
}

static kv_status kv_mp_gpu_create(int Hq, int Hkv, int T, int D, int K, int L, const float *proj, kv_mp_gpu **out) {
    *out = NULL;
    if (Hq < 1 || Hkv < 1 || Hq % Hkv || T < 1 || D < 1 || K < 1 || K > 16 || L < 1 || L > 4096)
        return kv_fail(KV_ERR_INPUT, "magicpig GPU: bad shape Hq=%d Hkv=%d T=%d D=%d K=%d L=%d", Hq, Hkv, T, D, K, L);
    kv_mp_gpu *m = (kv_mp_gpu *)kv_calloc(1, sizeof *m, "magicpig GPU state");
    if (!m) return KV_ERR_NOMEM;
    m->Hq = Hq; m->Hkv = Hkv; m->T = T; m->D = D; m->K = K; m->L = L; m->KL = K * L; m->G = Hq / Hkv;
    m->Tp = (T + MP_CHUNK - 1) / MP_CHUNK * MP_CHUNK;
    m->nch = m->Tp / MP_CHUNK;
    kv_status st = mp_alloc(m, proj);
    if (st != KV_OK) { kv_mp_gpu_destroy(m); return st; }
    *out = m;
    return KV_OK;
}

static kv_status kv_mp_gpu_set_mean(kv_mp_gpu *m, const float *mean) {
    KV_CUDA_TRY(cudaMemcpy(m->mean, mean, (size_t)m->Hkv * m->D * sizeof(float), cudaMemcpyHostToDevice));
    return KV_OK;
}

static kv_status kv_mp_gpu_index(kv_mp_gpu *m, int t0, int n, const float *x, int ld) {
    if (t0 < 0 || n < 0 || t0 + n > m->T || ld < n)
        return kv_fail(KV_ERR_INTERNAL, "magicpig GPU: index of [%d, %d) beyond %d positions", t0, t0 + n, m->T);
    if (n == 0) return KV_OK;
    int cap = m->T < MP_STAGE ? m->T : MP_STAGE;
    if (!m->stage) KV_CUDA_ALLOC(m->stage, (size_t)m->Hkv * cap * m->D * sizeof(float), 0, "magicpig key upload");
    size_t row = (size_t)m->D * sizeof(float);
    for (int c0 = 0; c0 < n; c0 += cap) {
        int c = n - c0 < cap ? n - c0 : cap;
        KV_CUDA_TRY(cudaMemcpy2D(m->stage, (size_t)cap * row, x + (size_t)c0 * m->D, (size_t)ld * row, (size_t)c * row,
                                 (size_t)m->Hkv, cudaMemcpyHostToDevice));
        KV_TRY(mp_center_hash(m, m->stage, 0, cap, t0 + c0, c, 0));
    }
    KV_CUDA_TRY(cudaStreamSynchronize(0));
    return KV_OK;
}

/* Queues one search (kv_gpu_mark: `kvbench run`); the list lengths come back into pinned memory. */
static kv_status kv_mp_gpu_launch(kv_mp_gpu *m, const float *q, int lo, int hi, int minc, kv_gpu_mark *mark) {
    if (hi > m->T) hi = m->T;
    if (lo < 0) lo = 0;
    m->lo = lo; m->hi = lo;
    if (hi <= lo) return KV_OK;
    KV_CUDA_TRY(cudaMemcpyAsync(m->q, q, (size_t)m->Hq * m->D * sizeof(float), cudaMemcpyHostToDevice, m->st));
    KV_TRY(kv_gpu_mark_start(mark, m->st));
    KV_TRY(mp_search_launch(m, lo, hi, minc, m->st));
    KV_TRY(kv_gpu_mark_end(mark, m->st));
    KV_CUDA_TRY(cudaMemcpyAsync(m->hcount, m->count, (size_t)m->Hq * sizeof(int), cudaMemcpyDeviceToHost, m->st));
    m->hi = hi;
    return KV_OK;
}

/* Waits for the launched search, then copies its lists: one 2-D copy per array, as wide as the longest list (a
 * copy per head cost ~10 us each: issue 12). */
static kv_status kv_mp_gpu_fetch(kv_mp_gpu *m, int32_t *idx, float *logw, int cap, int *count) {
    for (int h = 0; h < m->Hq; h++) count[h] = 0;
    if (m->hi <= m->lo) return KV_OK;
    KV_CUDA_TRY(cudaStreamSynchronize(m->st));
    int w = 0;
    for (int h = 0; h < m->Hq; h++) {
        count[h] = m->hcount[h] < cap ? m->hcount[h] : cap;
        w = count[h] > w ? count[h] : w;
    }
    if (!w) return KV_OK;
    KV_CUDA_TRY(cudaMemcpy2DAsync(idx, (size_t)cap * sizeof(int32_t), m->idx, (size_t)m->T * sizeof(int32_t),
                                  (size_t)w * sizeof(int32_t), (size_t)m->Hq, cudaMemcpyDeviceToHost, m->st));
    KV_CUDA_TRY(cudaMemcpy2DAsync(logw, (size_t)cap * sizeof(float), m->logw, (size_t)m->T * sizeof(float),
                                  (size_t)w * sizeof(float), (size_t)m->Hq, cudaMemcpyDeviceToHost, m->st));
    KV_CUDA_TRY(cudaStreamSynchronize(m->st));
    return KV_OK;
}

static kv_status kv_mp_gpu_read_index(const kv_mp_gpu *m, int lo, int hi, uint16_t *codes, float *knorm) {
    if (lo < 0 || hi > m->T || hi <= lo) return kv_fail(KV_ERR_INTERNAL, "magicpig GPU: read of [%d, %d)", lo, hi);
    size_t n = (size_t)(hi - lo);
    if (codes)
        KV_CUDA_TRY(cudaMemcpy2D(codes, n * sizeof(uint16_t), m->codes + lo, (size_t)m->Tp * sizeof(uint16_t),
                                 n * sizeof(uint16_t), (size_t)m->Hkv * m->L, cudaMemcpyDeviceToHost));
    if (knorm)
        KV_CUDA_TRY(cudaMemcpy2D(knorm, n * sizeof(float), m->knorm + lo, (size_t)m->T * sizeof(float),
                                 n * sizeof(float), (size_t)m->Hkv, cudaMemcpyDeviceToHost));
    return KV_OK;
}

static kv_status kv_mp_gpu_counts(kv_mp_gpu *m, const float *q, int lo, int hi, int split, uint16_t *qcodes,
                                      uint16_t *counts) {
    if (lo < 0 || hi > m->T || hi <= lo || (split != 0 && split != 1 && split != 4))
        return kv_fail(KV_ERR_INTERNAL, "magicpig GPU: counts of [%d, %d), split %d", lo, hi, split);
    if (!m->counts) KV_CUDA_ALLOC(m->counts, (size_t)m->Hq * m->Tp * sizeof(uint16_t), 0, "magicpig collision counts");
    KV_CUDA_TRY(cudaMemset(m->counts, 0xff, (size_t)m->Hq * m->Tp * sizeof(uint16_t))); /* every count must be written */
    KV_CUDA_TRY(cudaMemcpy(m->q, q, (size_t)m->Hq * m->D * sizeof(float), cudaMemcpyHostToDevice));
    KV_TRY(mp_hash_query_launch(m, 0));
    KV_TRY(mp_collide_launch(m, lo, hi, 1, m->counts, split, 0));
    size_t n = (size_t)(hi - lo);
    KV_CUDA_TRY(cudaMemcpy(qcodes, m->qcodes, (size_t)m->Hq * m->L * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy2D(counts, n * sizeof(uint16_t), m->counts, (size_t)m->Tp * sizeof(uint16_t),
                             n * sizeof(uint16_t), (size_t)m->Hq, cudaMemcpyDeviceToHost));
    return KV_OK;
}

/* ---- kvbench bench --method magicpig ---- */

namespace {
struct mp_bench_ctx {
    kv_bench_timer tm;
    kv_mp_gpu *m;
    double *sum;
};

kv_status mp_bench_build(kv_mp_gpu *m, const kv_gpu_keys *keys, int n, double *sum, cudaStream_t st) {
    const int per = 4096;
    KV_CUDA_TRY(cudaMemsetAsync(sum, 0, (size_t)m->Hkv * m->D * sizeof(double), st));
    mp_mean_sum<<<dim3((n + per - 1) / per, m->Hkv), 128, 0, st>>>((const __half *)keys->a.p, keys->a.T, n, m->D, per,
                                                                   sum);
    KV_LAUNCH_CHECK();
    int e = m->Hkv * m->D;
    mp_mean_div<<<(e + 255) / 256, 256, 0, st>>>(sum, e, n, m->mean);
    KV_LAUNCH_CHECK();
    return mp_center_hash(m, keys->a.p, 1, keys->a.T, 0, n, st);
}

kv_status mp_bench_go(mp_bench_ctx *c, const kv_gpu_bench_spec *s, int K, int L, int minc, const float *proj,
                      const kv_gpu_keys *keys, const float *q, kv_gpu_stages *out) {
    KV_TRY(kv_bench_timer_init(&c->tm, s->reps, s->warmup, s->stream));
    KV_TRY(kv_mp_gpu_create(s->Hq, s->Hkv, s->n, s->D, K, L, proj, &c->m));
    kv_mp_gpu *m = c->m;
    cudaStream_t st = c->tm.st;
    const int n = s->n;
    KV_CUDA_ALLOC(c->sum, (size_t)s->Hkv * s->D * sizeof(double), 0, "magicpig bench key sums");
    KV_CUDA_TRY(cudaMemcpy(m->q, q, (size_t)s->Hq * s->D * sizeof(float), cudaMemcpyHostToDevice));
    KV_TRY(mp_bench_build(m, keys, n, c->sum, st));
    KV_TRY(mp_search_launch(m, 0, n, minc, st)); /* real candidates for the compact and weights stages */
    KV_CUDA_TRY(cudaStreamSynchronize(st));
    int *cnt = (int *)kv_malloc((size_t)s->Hq * sizeof(int), "magicpig bench counts");
    if (!cnt) return KV_ERR_NOMEM;
    cudaError_t ce = cudaMemcpy(cnt, m->count, (size_t)s->Hq * sizeof(int), cudaMemcpyDeviceToHost);
    double ncand = 0;
    for (int h = 0; h < s->Hq; h++) ncand += cnt[h];
    free(cnt);
    KV_CUDA_TRY(ce);
    const double Hkv = s->Hkv, Hq = s->Hq, D = s->D, N = n, KL = (double)K * L;
    const double hq_b = Hq * D * 4 + D * KL * 4 + Hq * L * 2 + Hq * 4;          /* q, projection in; codes, norms out */
    const double co_b = Hkv * N * L * 2 + Hq * L * 2 + Hq * N / 8;             /* codes in; candidate bits out */
    const double cp_b = Hq * N / 8 + ncand * 4;                                /* bits in; positions out */
    const double we_b = ncand * (4 + D * 4 + 4 + 4);                           /* positions, centred key, norm in; log-weight out */
    const double hk_b = Hkv * N * (D * 2 + D * 4 + L * 2 + 4);                 /* keys in; centred keys, codes, norms out */
    struct { const char *name; double bytes; } stg[6] = {{"hash_keys", hk_b}, {"hash_query", hq_b},
                                                        {"collide", co_b},    {"compact", cp_b},
                                                        {"weights", we_b},    {"search", hq_b + co_b + cp_b + we_b}};
    for (int i = 0; i < 6; i++) {
        auto fn = [&]() -> kv_status {
            switch (i) {
            case 0: return mp_bench_build(m, keys, n, c->sum, st);
            case 1: return mp_hash_query_launch(m, st);
            case 2: return mp_collide_launch(m, 0, n, minc, NULL, 0, st);
            case 3: return mp_compact_launch(m, 0, n, st);
            case 4: return mp_weights_launch(m, st);
            default: return mp_search_launch(m, 0, n, minc, st);
            }
        };
        out->stage[i].name = stg[i].name;
        out->stage[i].bytes = stg[i].bytes;
        KV_TRY(kv_bench_time(&c->tm, fn, &out->stage[i].t));
    }
    out->n = 6;
    out->l2_bytes = c->tm.dev.l2_bytes;
    out->flush_bytes = c->tm.flush_n * sizeof(uint4);
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "K=%d L=%d minc=%d: %.0f candidates per query head (%.2f%%: the variable budget). Per key and kv head: "
             "hash_keys = fp16 key in, fp32 centred key + norm + %d B codes out (compute-bound: %d unfused mul+add); "
             "collide = %d B codes in (once for the %d query heads of the group) + 1 bit out per query head; compact = "
             "bits in + 4 B out per candidate; weights = position, %d B centred key, norm in + log-weight out per "
             "candidate; hash_query = q + %.0f KB projection in",
             K, L, minc, ncand / Hq, 100.0 * ncand / (Hq * N), 2 * L, (int)(D * KL), 2 * L, s->Hq / s->Hkv, 4 * s->D,
             D * KL * 4 / 1e3);
    return KV_OK;
}
}  // namespace

static kv_status kv_mp_gpu_bench(const kv_gpu_bench_spec *s, int K, int L, int minc, const float *proj,
                                     const kv_gpu_keys *keys, const float *q, kv_gpu_stages *out) {
    memset(out, 0, sizeof *out);
    if (s->reps < 1 || s->n < 1 || s->n > keys->a.T || keys->a.H != s->Hkv || keys->a.D != s->D || !keys->a.half)
        return kv_fail(KV_ERR_INPUT, "magicpig GPU bench: inconsistent spec (n=%d reps=%d, float16 keys expected)", s->n,
                       s->reps);
    mp_bench_ctx c = {};
    kv_status st = mp_bench_go(&c, s, K, L, minc, proj, keys, q, out);
    kv_bench_timer_free(&c.tm);
    kv_mp_gpu_destroy(c.m);
    cudaFree(c.sum);
    return st;
}

extern "C" const kv_magicpig_cuda_ops kv_magicpig_cuda = {
    .create = kv_mp_gpu_create,
    .set_mean = kv_mp_gpu_set_mean,
    .index = kv_mp_gpu_index,
    .launch = kv_mp_gpu_launch,
    .fetch = kv_mp_gpu_fetch,
    .read_index = kv_mp_gpu_read_index,
    .counts = kv_mp_gpu_counts,
    .destroy = kv_mp_gpu_destroy,
    .bench = kv_mp_gpu_bench,
};
