/* pariskv.cu: the CUDA path of the ParisKV retriever (issue 4, point 5;
 * "ParisKV: Fast and Drift-Robust KV-Cache Retrieval for Long-Context
 * LLMs", Qi et al., preprint 2026, secs. 4.1-4.2 and B.2), reproducing the CPU reference of
 * retrievers/pariskv.c / pariskv_codec.c for its default codec
 * (normalise + SRHT, analytic sign centroids, 4-bit codes, RSQ-IP rerank).
 *
 * Kernels, in search order:
 *   encode     one warp per key: l2 norm (double, tree-reduced), SRHT
 *              (signs, FWHT in shared memory, the CPU's butterflies), then
 *              one lane per subspace: radius, sign-centroid id, 4-bit codes,
 *              w = |k| r / alpha (float32, stored as bf16 rounded to
 *              nearest even with ops/bf16.h, the C reference's function,
 *              as the released code stores it); per-block shared histograms of the ids
 *              become the per-centroid counts (one atomic per bin per block).
 *   tier       one block per (row, subspace): the row's query (group mean),
 *              its transform (one warp, in registers), the 2^m centroid
 *              scores <q~_b, c>, each centroid's keys-before (the counts
 *              of the centroids ranked above it: warp sorts and binary
 *              searches) and the tier bonus; counts of the indexed keys in
 *              [end, n_idx) (the local window) are taken out first, as the
 *              CPU does.
 *   collision  all rows (kv heads) in one launch; a block is a bucket tile
 *              of 4096 keys, 16 keys per thread, one uint4 of ids per
 *              subspace (the first 8, or 4 on a long grid, loaded before
 *              the PDL wait), the bonuses a table in shared memory (m = 8:
 *              two 4-bit bonuses a byte, so a warp's lookups fall one a
 *              bank, four 8-bit sums a word); scores
 *              are uint16 [rows][Tp] by absolute position. It also writes
 *              the tile's score histogram as suffix sums (the bucket
 *              top-k's first pass, so the scores are read once less).
 *   bucket top-k  (pariskv_bucket.cu) multi-block and deterministic: the
 *              row's threshold from the row histogram (as
 *              kv_pariskv_bucket_topk), each tile's output offset and share
 *              of the threshold ties (ties go to the smallest positions:
 *              the first `take` ties in index order), then each tile
 *              compacts in index order with a block scan (a thread's 16
 *              scores compared two a word, pk_tile_select). Where the tiles
 *              are one wave (pk_fold: 16K, 128K) each tile's block finds its
 *              offset itself, one launch; else a scan kernel (a block per
 *              row) first. The output equals the CPU's exactly.
 *   rerank     one thread per candidate: 4-bit codes (uint4 loads) and
 *              bf16 weights (uint4 loads, widened exactly) gathered, the query's 16-entry-per-coordinate table in
 *              shared memory, accumulated in float in the CPU's order with
 *              no contraction (__fadd_rn / __fmul_rn), so the scores are
 *              bitwise the CPU's.
 *   final top-k  over the candidates' scores, larger first, smaller
 *              candidate (so smaller position) among equals: for C <= 16384
 *              and k <= 1024 one block per row (pk_small_topk_kernel: for
 *              k <= 256 one 12-bit histogram and the bucket at the k-th key
 *              ranked, pk_topk_row2, else and for a crowded bucket a radix
 *              select; kv_sort_out in shared memory); for longer lists and
 *              k <= 256 a cluster of 16 blocks per row, 8 where the
 *              device cannot place 16 (pariskv_cluster.cu: a bound from
 *              the warps' maxima, then a radix select if it is loose);
 *              else the cooperative kv_topk_launch (topk.cu).
 * Fused search (issue 12, the default): a dependent kernel costs a few
 * microseconds even inside a graph, so the chain above is cut to three
 * launches for candidate lists up to 4096 (tier; collision, whose last
 * tile per row runs the bucket top-k's scan; pk_select_rerank_kernel:
 * compaction + rerank per tile, whose last tile per row runs the final
 * top-k) and four for longer lists (the one-block-per-row top-k up to
 * 16384; beyond, each tile's own top-k list, merged by one block per row
 * instead of the cooperative kv_topk_launch); the
 * "last tile" steps are threadfence reductions, and the results are the
 * unfused chain's exactly. KVBENCH_PK_FUSED=1 (read at create) selects it;
 * the default is the unfused chain (five launches at 16K and 128K, six at
 * 1M), which the H100 ran faster at every length (create's comment has the
 * numbers). The whole search runs as one CUDA graph per
 * step shape (pk_search_launch, ops/kv_cuda.h kv_graph_run), which removes
 * the per-launch host cost.
 * Programmatic dependent launches (session 19; KVBENCH_PK_PDL=0 at create:
 * plain): every launch of the unfused chain after the tier kernel (a
 * plain one; in the fused form the collision kernel and the id map) is a
 * PDL launch whose kernel waits (kv_dep_wait) before its first read and
 * write and then lets the next kernel's blocks be scheduled
 * (kv_dep_launch), so each kernel's blocks are resident when its
 * predecessor ends instead of being launched then; the order of memory operations is the plain chain's, the
 * results the same. The one-block top-k writes the selected key ids itself
 * (pk_ids_kernel's work, one launch fewer where it runs). Search on the
 * H200 (session 19, call C, three rounds), before / PDL / PDL off: 48.0-48.3
 * / 42.4-42.6 / 44.0-44.6 us at 16K, 72.2-72.4 / 73.8-74.1 / 70.3-71.0 at
 * 128K (PDL loses there, for a reason not found), 159.5-159.7 / 156.8-157.2
 * / 158.9-159.5 at 1M. Tried and dropped (call B): the collision kernel
 * prefetching all its ids into L2 before its wait: 165.0 us at 1M with PDL
 * and 168.6 without (session 26 loads its first 8 subspaces into registers
 * before the wait and prefetches the rest only where the region's ids are
 * at most 4 MB). Session 26 (H200, calls A-D, interleaved with HEAD
 * 60d5176): the tier kernel's warp query and rank, these early ids, the
 * folded bucket scan and plain-atomic top-k histograms took the search from
 * 41.0-41.1 to 32.4-33.0 us at 16K (exact 34.0-34.5), 60.8-61.0 to
 * 49.5-49.8 at 128K and 150.6-150.8 to 147.2-147.9 at 1M (call D).
 * Session 27 (H200, call D, two rounds interleaved with HEAD 4a0fc64): the
 * compaction's two-a-word compares and the cluster top-k took 1M from
 * 147.2-147.3 to 142.6-142.8 us (compaction + scan stage 23.3 -> 17.0,
 * final top-k 22.9 -> 19.2), 128K from 49.1-49.6 to 47.6-47.7.
 * Session 28 (H200, interleaved with HEAD d0e5d37, call B): the collision
 * kernel's table of nibbles took 1M from 142.1-142.8 to 138.0-138.1 us
 * (ncu: 55.7-56.0 -> 50.5-50.8 us, shared wavefronts 9.15 M -> 4.91 M, warp
 * instructions 23.3 M -> 29.2 M), 16K and 128K unchanged; its batches of 4
 * on a long grid (call C, against 2a4949a) took 1M to 135.2.
 * Index layout on the device (chosen for coalesced reads): centroid ids
 * uint8 [Hkv][B][Tp] subspace-major, so a warp reading one subspace of
 * consecutive keys reads consecutive bytes (the collision kernel reads each
 * key's B ids once); codes uint8 [Hkv][Tp][D'/2] and weights bf16
 * [Hkv][Tp][B] token-major, so a gathered candidate is a 64-byte and a
 * 32-byte run (D = 128, m = 8: 112 index bytes per key with the ids, as
 * the released layout); counts int32 [Hkv][B][2^m]. Tp = T rounded
 * up to 16 (aligned uint4 access). D' <= 256. Exactness: everything but the key norm follows the CPU's float
 * operations in the CPU's order; the key norm's double sum is tree-reduced,
 * which can differ from the CPU's sequential double sum only in the last
 * double bit, so the float norm agrees except with probability ~1e-9 per
 * key (the tests compare ids and codes exactly, the bf16 weights exactly
 * but for at most two one-step differences per case).
 * Streams: every copy and launch of a handle goes on its own stream
 * (kv_stream_create), and create ends with a device synchronisation. The
 * bench's `search` stage is the device work of one search (the query
 * already uploaded, nothing copied back), replayed as its graph; the
 * retriever's search adds the query upload and the copy-back of the lists
 * and candidates. */
#include <string.h>

#include "pariskv_dev.cuh"
#include "ops/radix_digit.cuh"

namespace {

/* x <- the orthonormal FWHT of the warp's D' = 32 E coordinates, lane l
 * holding d = l E + e in x[e]: the CPU's butterflies (x[i] + x[i+h], x[i] -
 * x[i+h]), of span h < E in a lane, else with lane ^ h/E by shuffles, the
 * upper of a pair taking partner - own; then * 1/sqrt(D'). Every lane of the
 * warp calls it. The encode and tier kernels' one FWHT. */
template <int E> __device__ __forceinline__ void pk_fwht(float (&x)[E], int lane) {
#pragma unroll
    for (int h = 1; h < E; h *= 2)
#pragma unroll
        for (int e = 0; e < E; e++)
            if (!(e & h)) {
                const float a = x[e], c = x[e + h];
                x[e] = __fadd_rn(a, c);
                x[e + h] = __fsub_rn(a, c);
            }
#pragma unroll
    for (int h = E; h < 32 * E; h *= 2) {
        const bool up = lane & (h / E);
#pragma unroll
        for (int e = 0; e < E; e++) {
            const float y = __shfl_xor_sync(0xffffffffu, x[e], h / E);
            x[e] = up ? __fsub_rn(y, x[e]) : __fadd_rn(x[e], y);
        }
    }
    const float s = 1.0f / sqrtf((float)(32 * E));
#pragma unroll
    for (int e = 0; e < E; e++) x[e] = __fmul_rn(x[e], s);
}

/* Keys (g, a + j), j < n, at src + g*gstride + j*D (float16 or float32); D' = 32 E. */
template <int E>
__global__ void pk_encode_kernel(const void *src, int half, long long gstride, int a, int n, int D, int m, int nb,
                                 const float *signs, pk_lv lv, uint8_t *ids, uint8_t *code, kv_bf16 *w, int *counts,
                                 long long Tp) {
    constexpr int dp = 32 * E;
    extern __shared__ float sm[];
    const int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = blockIdx.y, nc = 1 << m;
    const int cb = dp / 2;
    int *scnt = (int *)(sm + nw * dp);
    for (int i = threadIdx.x; i < nb * nc; i += blockDim.x) scnt[i] = 0;
    __syncthreads();
    float *x = sm + warp * dp;
    for (int j = blockIdx.x * nw + warp; j < n; j += gridDim.x * nw) {
        const long long off = g * gstride + (long long)j * D;
        double ss = 0;
        for (int d = lane; d < dp; d += 32) {
            float v = 0;
            if (d < D) v = half ? __half2float(((const __half *)src)[off + d]) : ((const float *)src)[off + d];
            x[d] = v;
            ss = __dadd_rn(ss, __dmul_rn((double)v, (double)v));
        }
        for (int o = 16; o; o >>= 1) ss = __dadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
        const float norm = (float)sqrt(ss), inv = 1.0f / fmaxf(norm, 1e-8f);
        __syncwarp();
        for (int d = lane; d < dp; d += 32) x[d] = __fmul_rn(d < D ? __fmul_rn(x[d], inv) : 0.0f, signs[d]);
        __syncwarp();
        float xr[E]; /* the FWHT in registers (pk_fwht's layout), back to shared for the subspaces */
#pragma unroll
        for (int e = 0; e < E; e++) xr[e] = x[lane * E + e];
        pk_fwht<E>(xr, lane);
        __syncwarp();
#pragma unroll
        for (int e = 0; e < E; e++) x[lane * E + e] = xr[e];
        __syncwarp();
        const long long i = a + j;
        for (int b = lane; b < nb; b += 32) {
            const float *xb = x + b * m;
            float s2 = 0, alpha = 0;
            for (int t = 0; t < m; t++) s2 = __fadd_rn(s2, __fmul_rn(xb[t], xb[t]));
            float r = sqrtf(s2), ir = r > 0 ? 1.0f / r : 0.0f;
            unsigned id = 0, bits = 0; /* m <= 8 coordinates: 4 code bytes at most */
            for (int t = 0; t < m; t++) {
                int pos = xb[t] >= 0, q = 0;
                float au = fabsf(__fmul_rn(xb[t], ir));
                while (q < 7 && lv.thr[q] < au) q++;
                id |= (unsigned)pos << t;
                bits |= (unsigned)((pos << 3) | q) << (4 * t);
                alpha = __fadd_rn(alpha, __fmul_rn(lv.level[q], au));
            }
            ids[((long long)g * nb + b) * Tp + i] = (uint8_t)id;
            uint8_t *cp = code + ((long long)g * Tp + i) * cb + b * (m / 2);
            for (int t = 0; t < m / 2; t++) cp[t] = (uint8_t)(bits >> (8 * t));
            w[((long long)g * Tp + i) * nb + b] = kv_bf16_from_f32(__fdiv_rn(__fmul_rn(norm, r), fmaxf(alpha, 1e-6f)));
            atomicAdd(&scnt[b * nc + id], 1);
        }
        __syncwarp();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nb * nc; e += blockDim.x)
        if (scnt[e]) atomicAdd(&counts[(long long)g * nb * nc + e], scnt[e]);
}

/* Named barrier `id` (1..15) of the block's first n threads (whole warps). */
__device__ __forceinline__ void bar_sync_n(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

/* Block (b, r): the tier bonus of every centroid of subspace b for row r.
 * Warp 0 makes the row's query in registers, E = D'/32 coordinates a lane
 * (d = lane*E + e): the group mean; the norm, the CPU's sequential double
 * sum with every lane adding the same products in the CPU's order, read
 * from shared memory (broadcast loads issued ahead of the dependent adds:
 * the kernel 7.8-8.3 us at 1M tokens, where a shuffle a product that each
 * add waited on took 9.2-9.8, ncu, session 29 call D); the normalising
 * product; the FWHT, butterflies of span h < E in a
 * lane, else with lane ^ h/E, the upper of a pair taking partner - own
 * (the CPU's x[i] - x[i+h]). Meanwhile the other warps load the counts;
 * after a block barrier every thread takes the window's keys out. A
 * block-wide shared-memory FWHT and a thread-0 norm loop took 3.1 of the
 * kernel's 10.3 us at 16K (session 25, call F's stamps); the kernel ends
 * at 6.6-6.9 us now (session 26, calls B-C). Then the centroids' scores
 * <q~_b, c>, each one's keys-before (the counts of the centroids ranked
 * above it) and its tier bonus (the step's targets from the host,
 * kv_pariskv_tier_targets, the C reference's). */
template <int E>
__global__ void __launch_bounds__(PK_TH) pk_tier_kernel(const float *q, int G, int nh, int D, int m, int nb,
                                                        const float *signs, const int *counts, const uint8_t *ids,
                                                        long long Tp, int end, int n_idx, pk_tt tt, uint8_t *wt,
                                                        float *qt_out, float *qnorm_out, int *ghist, int nbins) {
    constexpr int DP = 32 * E;
    __shared__ float qv[DP];
    __shared__ double sq[DP]; /* warp 0: the query's squared coordinates, for the norm */
    __shared__ int cnt[1 << 8]; /* m <= 8 */
    __shared__ unsigned long long sk[1 << 8];
    __shared__ int sp[1 << 8];
    kv_dep_launch(); /* the collision kernel's blocks may be scheduled now (pk_stage: PDL) */
    const int b = blockIdx.x, r = blockIdx.y, h0 = r * nh, g = h0 / G, nc = 1 << m, tid = threadIdx.x;
    const int lane = tid & 31, nt = blockDim.x;
    const uint8_t *ib = ids + ((long long)g * nb + b) * Tp;
    const int id0 = end + tid < n_idx ? ib[end + tid] : -1; /* the local window's first ids, loaded early */
    if (tid >= 32) { /* the counts */
        const int *cg = counts + ((long long)g * nb + b) * nc;
        for (int c = tid - 32; c < nc; c += nt - 32) cnt[c] = cg[c];
    } else {
        float x[E], sg[E];
#pragma unroll
        for (int e = 0; e < E; e++) {
            x[e] = 0.0f;
            /* the signs loaded with the query, not after the norm's double sum: one global round trip less
               (session 32 call B, three rounds interleaved: 130.5-131.1 -> 128.1-128.4 us at 1M) */
            sg[e] = signs[lane * E + e];
        }
        for (int h = h0; h < h0 + nh; h++) /* padding coordinates (D < D') read nothing */
#pragma unroll
            for (int e = 0; e < E; e++)
                if (lane * E + e < D) x[e] = __fadd_rn(x[e], q[(long long)h * D + lane * E + e]);
        double pr[E];
#pragma unroll
        for (int e = 0; e < E; e++) {
            x[e] = lane * E + e < D ? __fdiv_rn(x[e], (float)nh) : 0.0f;
            pr[e] = __dmul_rn((double)x[e], (double)x[e]); /* exact; padding adds +0, which changes no sum */
        }
#pragma unroll
        for (int e = 0; e < E; e++) sq[lane * E + e] = pr[e];
        __syncwarp();
        double ss = 0; /* the products in the CPU's order, broadcast loads ahead of the adds */
#pragma unroll 16
        for (int i = 0; i < DP; i++) ss = __dadd_rn(ss, sq[i]);
        const float norm = (float)sqrt(ss), inv = 1.0f / fmaxf(norm, 1e-8f);
#pragma unroll
        for (int e = 0; e < E; e++)
            x[e] = __fmul_rn(lane * E + e < D ? __fmul_rn(x[e], inv) : 0.0f, sg[e]);
        pk_fwht<E>(x, lane);
#pragma unroll
        for (int e = 0; e < E; e++) qv[lane * E + e] = x[e];
        if (b == 0) { /* also: the row's score histogram starts from zero (the collision kernel adds to it) */
#pragma unroll
            for (int e = 0; e < E; e++) qt_out[(long long)r * DP + lane * E + e] = x[e];
            for (int k = lane; k < nbins; k += 32) ghist[(long long)r * nbins + k] = 0;
            if (lane == 0) qnorm_out[r] = norm;
        }
    }
    /* the counts less the indexed keys in [end, n_idx) (the local window), as the CPU, by every thread after a
     * block barrier: session 26 took them out behind a barrier of warps 1-7 alone (bar.sync 1, 224) while warp
     * 0 made the query, and racecheck then reported hazards across the rank's later barriers (calls F, G) */
    __syncthreads();
    if (id0 >= 0) atomicSub(&cnt[id0], 1);
    for (long long i = end + tid + nt; i < n_idx; i += nt) atomicSub(&cnt[ib[i]], 1);
    __syncthreads();
    /* the rank: each warp sorts 32 of the sort keys ~key << 32 | id (score descending, the smaller id first
     * among equal scores; ~0 pads past nc) by shuffles and takes its counts' prefix sums in that order; a
     * centroid's keys-before is its own warp's prefix plus, from every other warp, the prefix below its key
     * there (a binary search of that warp's sorted keys). A block-wide bitonic sort and a block scan took
     * 3.1 us at 16K (session 26, call A's stamps), these 2.8 (call B; the searches 1.95). */
    const int w = tid >> 5, nw = (nc + 31) >> 5;
    if (w < nw) {
        unsigned long long key = ~0ULL;
        if (tid < nc) {
            const float *qb = qv + b * m;
            float sc = 0;
            for (int j = 0; j < m; j++) sc = __fadd_rn(sc, (tid >> j) & 1 ? qb[j] : -qb[j]);
            key = (unsigned long long)~kv_f2key(sc) << 32 | (unsigned)tid;
        }
        key = pk_warp_sort<false>(key);
        const int cn = key == ~0ULL ? 0 : cnt[(unsigned)key];
        int inc = cn; /* inclusive prefix of the counts in key order (counts sum to < 2^31 keys) */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        sk[tid] = key;
        sp[tid] = inc;
        bar_sync_n(1, nw * 32); /* the warps holding centroids */
        if (key != ~0ULL) {
            long long before = inc - cn;
#pragma unroll
            for (int v = 0; v < 8; v++) /* m <= 8: 8 warps at most */
                if (v < nw && v != w) {
                    const unsigned long long *kv = sk + 32 * v;
                    int pos = 0; /* keys of warp v below this one */
#pragma unroll
                    for (int st = 32; st; st >>= 1)
                        if (pos + st <= 32 && kv[pos + st - 1] < key) pos += st;
                    before += pos ? sp[32 * v + pos - 1] : 0;
                }
            int wv = 0;
#pragma unroll
            for (int t = 0; t < PK_TIERS; t++)
                if (t < tt.nt) wv += (double)before < tt.v[t];
            wt[((long long)r * nb + b) * nc + (unsigned)key] = (uint8_t)wv;
        }
    }
}

/* acc (two 16-bit sums per word, keys 2e and 2e+1 of 16) += the bonuses t[id] of one subspace's 16 ids; each
 * id by one instruction (byte_perm for the middle bytes, where a shift and a mask took two). */
__device__ __forceinline__ void pk_vote(unsigned acc[8], const uint4 v, const unsigned char *t) {
    const unsigned w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const unsigned w = w4[q];
        acc[2 * q] += t[w & 255] | (unsigned)t[__byte_perm(w, 0, 0x4441)] << 16;
        acc[2 * q + 1] += t[__byte_perm(w, 0, 0x4442)] | (unsigned)t[w >> 24] << 16;
    }
}

/* Bytes of w as 0xff where the byte's bit 7 is set, else 0 (prmt's sign replication; __byte_perm has none). */
__device__ __forceinline__ unsigned pk_sign_bytes(unsigned w) {
    unsigned d;
    asm("prmt.b32 %0, %1, %2, 0xba98;" : "=r"(d) : "r"(w), "r"(0u));
    return d;
}

/* m = 8 (NC = 256): the same votes from the table of nibbles, byte j of a subspace's 128 holding id j's bonus in
 * its low nibble and id j + 128's in its high one (the bonuses are at most PK_TIERS < 16), so a warp's 32 lookups
 * fall in 32 words, one a bank, where the 256-byte table's 64 words cost about 2.2 shared wavefronts a lookup
 * (ncu, session 27: the collision kernel was bound by them). acc holds four 8-bit sums a word (keys 4q .. 4q+3; a
 * sum is at most PK_TIERS * nb <= 192 with nb <= 32). The four bytes looked up are packed into one word and each
 * id's bit 7 (spread over its byte) picks the nibble. */
__device__ __forceinline__ void pk_vote4(unsigned acc[4], const uint4 v, const unsigned char *t) {
    static_assert(PK_TIERS < 16, "pariskv collision: a bonus fits a nibble");
    const unsigned w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const unsigned w = w4[q], a = w & 0x7f7f7f7fu;
        const unsigned lo = __byte_perm(t[a & 255], t[__byte_perm(a, 0, 0x4441)], 0x1140);
        const unsigned hi = __byte_perm(t[__byte_perm(a, 0, 0x4442)], t[a >> 24], 0x1140);
        const unsigned g = __byte_perm(lo, hi, 0x5410), s = pk_sign_bytes(w);
        acc[q] += (((g >> 4) & s) | (g & ~s)) & 0x0f0f0f0fu;
    }
}

/* scores[r*Tp + i] = sum_b wt[r][b][id_b(i)], i in [lo, end); block t is
 * bucket tile t (keys base + t*TILE + [0, TILE), base = lo rounded down to
 * 16), 16 keys per thread, one uint4 of ids per subspace, the bonuses a
 * table in shared memory (m = 8: of nibbles, pk_vote4; else of bytes). Also
 * the tile's score histogram (pk_tile_hist) for the bucket top-k. The ids
 * are loaded VB subspaces at a time: 8 where the grid is short (few blocks,
 * each latency-bound: 8 x 16 B in flight a thread), 4 at 8 blocks an SM (32
 * registers) where it is long (pk_stage). Session 28 (H200, call C, 1M
 * tokens): 137.6-137.8 -> 135.2 us search with 4 (48 -> 32 registers,
 * warps active 56% -> 83%, ncu 50.6 -> 48.6 us), but 16K 32.3 -> 34.5 and
 * 128K 47.6 -> 50.7 (6 blocks an SM without the bound: 135.2-135.4 at 1M). */
template <class ST, int NC, int VB>
__global__ void __launch_bounds__(PK_TH, VB == 4 ? 8 : 1)
    pk_collision_kernel(const uint8_t *ids, const uint8_t *wt, int G, int nh, int m, int nb, long long Tp, int base,
                        int lo, int end, ST *scores, int nbins, int ntiles, int *thist, int *ghist, int C, int *toff,
                        int *teq, int *thr, unsigned *ctr, int pf) {
    extern __shared__ unsigned stab[]; /* the table (nb x 128 or 2^m bytes), then [warps][nbins + 1] ints */
    constexpr bool NIB = NC == 256; /* m = 8: the table of nibbles (pk_vote4) */
    const int r = blockIdx.y, g = r * nh / G, nc = NC ? NC : 1 << m, ts = NIB ? 128 : nc, nwords = nb * ts / 4;
    const long long i0 = base + (long long)blockIdx.x * PK_TILE + 16 * threadIdx.x;
    const uint8_t *ib = ids + (long long)g * nb * Tp + i0;
    /* the ids are the index's (written before the tier kernel began): the first batch of VB subspaces is
     * loaded before the wait, so a block resident during the tier kernel (a short region's all) has it
     * when the bonuses are ready; with pf, the rest is prefetched into L2 (pk_stage sets it where the
     * region's ids fit the L2 many times over: prefetching all of 1M's took L2 from the bonuses' readers,
     * session 19) */
    uint4 v0[VB];
    const bool live = i0 < end, pre = live && nb >= VB;
    if (pre)
#pragma unroll
        for (int u = 0; u < VB; u++) v0[u] = __ldg((const uint4 *)(ib + (long long)u * Tp));
    if (live && pf)
        for (int b = VB; b < nb; b++) asm volatile("prefetch.global.L2 [%0];" ::"l"(ib + (long long)b * Tp));
    kv_dep_wait(); /* the tier kernel's bonuses (PDL, pk_stage) */
    kv_dep_launch();
    const unsigned *wr = (const unsigned *)(wt + (long long)r * nb * nc);
    if (NIB) /* word j of subspace b: ids 4j .. 4j+3 low, 4j+128 .. high */
        for (int e = threadIdx.x; e < nwords; e += blockDim.x)
            stab[e] = wr[(e >> 5) * 64 + (e & 31)] | wr[(e >> 5) * 64 + 32 + (e & 31)] << 4;
    else
        for (int e = threadIdx.x; e < nwords; e += blockDim.x) stab[e] = wr[e];
    __syncthreads();
    const unsigned char *tb = (const unsigned char *)stab;
    unsigned acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* two 16-bit sums per word (NIB: four 8-bit in acc[0..3]) */
    auto vote = [&](const uint4 v, const unsigned char *t) {
        if constexpr (NIB) pk_vote4(acc, v, t);
        else pk_vote(acc, v, t);
    };
    if (live) {
        /* the subspaces' id words in batches of VB loads issued together (VB x 16 bytes in flight per
         * thread: a short region has few blocks, and one load at a time left them latency-bound);
         * integer sums, so the batching changes no result (ptxas issues them two at a time). With NC
         * known (m = 8: 256), a subspace's table is an offset in the shared load's instruction: the byte
         * table's vote was then about 3.2 SASS instructions a key and subspace, where it had been 4.2
         * (session 23); the nibble table's is 18.9 a word of 4 keys (19.9 with VB = 4), the byte table's
         * was 14.3 counted the same way (cuobjdump, loads and loop included, session 28). */
        int b = 0;
        if (pre) {
#pragma unroll
            for (int u = 0; u < VB; u++) vote(v0[u], tb + u * ts);
            b = VB;
        }
        for (; b + VB <= nb; b += VB) {
            uint4 v[VB];
#pragma unroll
            for (int u = 0; u < VB; u++) v[u] = __ldg((const uint4 *)(ib + (long long)(b + u) * Tp));
            const unsigned char *tb8 = tb + b * ts;
#pragma unroll
            for (int u = 0; u < VB; u++) vote(v[u], tb8 + u * ts);
        }
        for (; b < nb; b++) vote(__ldg((const uint4 *)(ib + (long long)b * Tp)), tb + b * ts);
        if constexpr (NIB) /* to two 16-bit sums a word, keys in the same order */
#pragma unroll
            for (int q = 3; q >= 0; q--) {
                acc[2 * q + 1] = __byte_perm(acc[q], 0, 0x4342);
                acc[2 * q] = __byte_perm(acc[q], 0, 0x4140);
            }
        ST *out = scores + (long long)r * Tp + i0;
        if (i0 >= lo && i0 + 16 <= end) {
            if constexpr (sizeof(ST) == 1) /* bytes 0 and 2 of each pair of sums (every sum < 255) */
                *(uint4 *)out = make_uint4(__byte_perm(acc[0], acc[1], 0x6420), __byte_perm(acc[2], acc[3], 0x6420),
                                           __byte_perm(acc[4], acc[5], 0x6420), __byte_perm(acc[6], acc[7], 0x6420));
            else {
                ((uint4 *)out)[0] = make_uint4(acc[0], acc[1], acc[2], acc[3]);
                ((uint4 *)out)[1] = make_uint4(acc[4], acc[5], acc[6], acc[7]);
            }
        } else
            for (int e = 0; e < 16; e++)
                if (i0 + e >= lo && i0 + e < end) out[e] = (ST)(acc[e >> 1] >> (16 * (e & 1)));
    }
    uint16_t v[16];
    /* the thread's keys in [lo, end) are e in [e0, e1): 32-bit compares a key (64-bit ones took six instructions) */
    const int e0 = (int)max(min((long long)lo - i0, 16LL), 0LL), e1 = (int)max(min((long long)end - i0, 16LL), 0LL);
#pragma unroll
    for (int e = 0; e < 16; e++)
        v[e] = e >= e0 && e < e1 ? (uint16_t)(acc[e >> 1] >> (16 * (e & 1))) : (uint16_t)0xffff;
    pk_tile_hist(v, (int *)(stab + nwords), nbins, r, blockIdx.x, ntiles, thist, ghist);
    /* fused (ctr): the row's last tile to finish runs the bucket top-k's scan (threshold, tile offsets) */
    if (!ctr || !kv_arrives_last(&ctr[r], ntiles)) return;
    __shared__ int wsum[32];
    pk_scan_row(r, thist, ghist, nbins, ntiles, C, toff, teq, thr, (int *)(stab + nwords), wsum);
    if (threadIdx.x == 0) ctr[r] = 0;
}

/* The query's table: lut[c*16 + nibble] = (+-q~_c) * level[nibble & 7], the
 * CPU's products (D' = 32 CW coordinates), by a block of PK_TH threads: a
 * thread's nibble and level are the same for its 2 CW entries, so the level
 * is read once (a variable index into the parameter struct is a chain of 8
 * compares and constant loads), and its coordinates are loaded together.
 * Until session 23 each entry read both anew: the table was 36% of the
 * rerank's instructions at 1M tokens (ncu). */
template <int CW> __device__ __forceinline__ void pk_rsq_lut(float *lut, const float *q, const pk_lv lv) {
    constexpr int RS = PK_TH / 16; /* coordinates a pass */
    static_assert((32 * CW) % RS == 0, "pariskv rerank table: whole passes");
    const int nib = threadIdx.x & 15, c0 = threadIdx.x >> 4;
    const float lev = lv.level[nib & 7];
    float x[32 * CW / RS];
#pragma unroll
    for (int i = 0; i < 32 * CW / RS; i++) x[i] = __ldg(q + c0 + RS * i);
#pragma unroll
    for (int i = 0; i < 32 * CW / RS; i++) lut[(c0 + RS * i) * 16 + nib] = __fmul_rn(nib & 8 ? x[i] : -x[i], lev);
}

/* The RSQ-IP sum of key i of kv head g (before the query norm), in the
 * CPU's float order; CW = D'/32 uint4 words of codes per key, loaded up front. */
template <int M, int CW>
__device__ __forceinline__ float pk_rsq(long long i, int g, const uint8_t *code, const kv_bf16 *w, const float *lut,
                                        long long Tp) {
    constexpr int DP = 32 * CW, NB = DP / M;
    const uint4 *cr = (const uint4 *)(code + ((long long)g * Tp + i) * (DP / 2));
    const kv_bf16 *wr = w + ((long long)g * Tp + i) * NB;
    uint4 cw[CW];
    float wv[NB]; /* the bf16 weights widened exactly (element 2e of a word is its low half) */
#pragma unroll
    for (int wd = 0; wd < CW; wd++) cw[wd] = __ldg(cr + wd);
    if constexpr (NB % 8 == 0) { /* rows of 2*NB bytes at a 16-byte multiple (Tp is one of 16) */
#pragma unroll
        for (int b = 0; b < NB; b += 8) {
            const uint4 x = __ldg((const uint4 *)(wr + b));
            const unsigned u[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                wv[b + 2 * e] = __uint_as_float(u[e] << 16);
                wv[b + 2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
            }
        }
    } else { /* NB = 4 (D' = 32, m = 8): 8-byte rows */
        static_assert(NB == 4, "pariskv rerank: NB is 4 or a multiple of 8");
        const uint2 x = __ldg((const uint2 *)wr);
        wv[0] = __uint_as_float(x.x << 16); wv[1] = __uint_as_float(x.x & 0xffff0000u);
        wv[2] = __uint_as_float(x.y << 16); wv[3] = __uint_as_float(x.y & 0xffff0000u);
    }
    float acc = 0, dot = 0;
#pragma unroll
    for (int wd = 0; wd < CW; wd++) {
        const unsigned word[4] = {cw[wd].x, cw[wd].y, cw[wd].z, cw[wd].w};
#pragma unroll
        for (int k = 0; k < 32; k++) {
            const int cc = wd * 32 + k;
            dot = __fadd_rn(dot, lut[cc * 16 + ((word[k >> 3] >> (4 * (k & 7))) & 15)]);
            if ((k & (M - 1)) == M - 1) {
                acc = __fadd_rn(acc, __fmul_rn(wv[cc / M], dot));
                dot = 0;
            }
        }
    }
    return acc;
}

/* csc[r*ld + j] = RSQ-IP estimate of candidate j of row r (the unfused path).
 * Tried in session 23 and not kept (H200, 1M tokens): the final top-k's
 * first pass done here (the row's top-digit histogram of the scores by
 * warp-aggregated global atomics, each tile's largest key, given to
 * kv_topk_launch as a score kernel's kv_score_extras): the top-k took 15.8
 * us instead of 23.4 (ncu) and this kernel about as much longer, the search
 * 152.7-152.8 us against 152.9 without; and a grid capped at 8 blocks an
 * SM, each reranking several tiles after building the table once: rerank
 * 48.8 -> 57.8 us (a tile's blocks read nearby candidates together, the
 * capped grid's spread over the row). */
template <int M, int CW>
__global__ void pk_rerank_kernel(const int32_t *cand, long long ld, int C, const uint8_t *code, const kv_bf16 *w,
                                 const float *qt, const float *qnorm, pk_lv lv, int G, int nh, long long Tp,
                                 float *csc) {
    extern __shared__ float lut[];
    kv_dep_wait();
    kv_dep_launch();
    const int r = blockIdx.y, g = r * nh / G;
    pk_rsq_lut<CW>(lut, qt + (long long)r * 32 * CW, lv);
    __syncthreads();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    csc[r * ld + j] = __fmul_rn(qnorm[r], pk_rsq<M, CW>(cand[r * ld + j], g, code, w, lut, Tp));
}

/* Final top-k of a short candidate list, one 1024-thread block per row
 * (C <= PK_SMALL_C, kk <= PK_SMALL_K): pos[r*kk + j] = the j-th candidate of
 * row r in kv_topk_ref's order (larger score first, smaller index among
 * equal scores; -0 == +0 through kv_f2key). The row's order-preserving keys
 * sit in shared memory; a radix select (8 bits a pass, most significant
 * first) finds K, the kk-th largest key, and `take`, how many keys equal to
 * K belong to the top kk; then every key above K and the first `take`
 * equal to K in index order (block scan) become 64-bit sort keys
 * ~key << 32 | index, sorted ascending (kv_sort_out: placed by rank up to
 * KV_RANK_MAX keys, else bitonic) = kv_topk_ref's order. One
 * launch without grid synchronisation, where the cooperative kv_topk_launch
 * costs ~20 us at these lengths (the 16K search is launch- and
 * latency-bound). Dynamic shared memory: P * 8 + C * 4 bytes. */
constexpr int PK_SMALL_C = 16384, PK_SMALL_K = 1024;
/* The block's top-kk of keys key(j), j < C (order-preserving uint32 keys),
 * as above: out(rank, j) for rank < kk, in kv_topk_ref's order; sv: P >= kk
 * 64-bit words of shared memory. Every thread of the block calls it
 * (barriers); key may read shared memory written just before the call. */
template <class KeyAt, class Out>
__device__ void pk_topk_row(KeyAt key, int C, int kk, int P, unsigned long long *sv, Out out) {
    __shared__ unsigned rh[256], sel[2], s_nab;
    __shared__ int wsum[32];
    const int tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) s_nab = 0;
    unsigned prefix = 0, mask = 0, need = (unsigned)kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int e = tid; e < 256; e += nt) rh[e] = 0;
        __syncthreads();
        for (int j = tid; j < C; j += nt) { /* plain atomics, as pk_topk_row2's histogram */
            const unsigned u = key(j);
            if ((u & mask) == prefix) atomicAdd(&rh[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) kv_radix_pick_digit(rh, need, tid, sel);
        __syncthreads();
        prefix |= sel[0] << shift;
        mask |= 255u << shift;
        need = sel[1];
    }
    const unsigned K = prefix, take = need; /* kk - take keys lie above K */
    int carry = 0;
    for (int j0 = 0; j0 < C; j0 += nt) {
        const int j = j0 + tid;
        const unsigned u = j < C ? key(j) : 0u;
        const int above = j < C && u > K, eq = j < C && u == K;
        if (above) sv[atomicAdd(&s_nab, 1u)] = (unsigned long long)~u << 32 | (unsigned)j;
        const int neq = __syncthreads_count(eq); /* a block scan only where ties still count */
        if (neq && carry < (int)take) {
            int tot;
            const int rk = kv_block_scan(eq, &tot, wsum) + carry;
            if (eq && rk < (int)take) sv[(kk - (int)take) + rk] = (unsigned long long)~u << 32 | (unsigned)j;
        }
        carry += neq;
    }
    __syncthreads();
    kv_sort_out(sv, kk, P, [&](int q, unsigned long long v) { out(q, (unsigned)v); });
}

/* pk_topk_row in two levels, for a row whose keys sit in shared memory
 * (sk[j], j < C): one histogram of the keys' top PK_D1 bits finds the
 * digit D where the count from the top reaches kk; the keys above D (fewer
 * than kk) and the m keys at D are gathered as sort keys ~key << 32 | j
 * (warp-aggregated slots), and the `need` = kk - above smallest of the m
 * (each counts the smaller ones: m broadcast reads) join them; then
 * kv_sort_out. The same list as pk_topk_row (the kk smallest sort keys of
 * the row are the keys above D and the smallest `need` at D), with one
 * histogram and two passes over the row where the radix select makes four
 * histograms and five passes: that kernel was 11.1 of ParisKV's 39.3 us at
 * 16K (session 25, call D's stamps). A bucket of more than PK_BKT keys (scores crowded into one
 * digit) goes to pk_topk_row. bh: 1 << PK_D1 words of shared memory, reused
 * for the bucket's sort keys. */
constexpr int PK_D1 = 12, PK_BKT = (1 << PK_D1) / 2;
template <class Out>
__device__ void pk_topk_row2(const unsigned *sk, int C, int kk, int P, unsigned long long *sv, unsigned *bh,
                             Out out) {
    __shared__ int wsum[32];
    __shared__ unsigned s_na, s_nb;
    const int tid = threadIdx.x, nt = blockDim.x, NB = 1 << PK_D1, sh = 32 - PK_D1;
    for (int e = tid; e < NB; e += nt) bh[e] = 0;
    if (tid == 0) { s_na = 0; s_nb = 0; }
    __syncthreads();
    /* plain shared atomics: the scores' top bits spread, so same-address lanes are few; by __match_any_sync
     * and one add a digit the search took 35.2-36.0 us at 16K and 65.2-65.5 at 128K, against 32.8-33.1 and
     * 50.0-50.3 (session 26, call B) */
    for (int j = tid; j < C; j += nt) atomicAdd(&bh[sk[j] >> sh], 1u);
    __syncthreads();
    unsigned D, above, m; /* the digit where the count from the top reaches kk */
    pk_digit_at(bh, NB, (unsigned)kk, wsum, &D, &above, &m);
    if (m > (unsigned)PK_BKT) { /* crowded: the radix select (uniform) */
        pk_topk_row([&](int j) { return sk[j]; }, C, kk, P, sv, out);
        return;
    }
    unsigned long long *bk = (unsigned long long *)bh; /* the histogram is read: the bucket's sort keys */
    __syncthreads();
    if (tid == 0) s_nb = 0;
    __syncthreads();
    for (int j0 = 0; j0 < C; j0 += nt) {
        const int j = j0 + tid;
        const unsigned u = j < C ? sk[j] : 0u, d = u >> sh;
        const bool hi = j < C && d > D, eq = j < C && d == D;
        const unsigned ph = kv_warp_append(hi, &s_na), pe = kv_warp_append(eq, &s_nb);
        const unsigned long long x = (unsigned long long)~u << 32 | (unsigned)j;
        if (hi) sv[ph] = x;
        if (eq) bk[pe] = x;
    }
    __syncthreads();
    pk_rank_bucket(bk, (int)m, (unsigned)kk - above, sv + above);
    __syncthreads();
    kv_sort_out(sv, kk, P, [&](int q, unsigned long long v) { out(q, (unsigned)v); });
}

/* Also the selected key ids: ids[r][q] = cand[r][pos[r][q]] (pk_ids_kernel's work, one launch fewer). */
__global__ void __launch_bounds__(1024) pk_small_topk_kernel(const float *csc, long long ld, int C, int kk, int P,
                                                              int32_t *pos, const int32_t *cand, int32_t *ids) {
    extern __shared__ unsigned long long sv[]; /* [P] sort keys, then [C] score keys */
    __shared__ __align__(8) unsigned bh[1 << PK_D1]; /* also the bucket's 8-B sort keys (pk_topk_row2) */
    kv_dep_wait();
    kv_dep_launch();
    unsigned *sk = (unsigned *)(sv + P);
    const int r = blockIdx.x;
    const float *row = csc + (long long)r * ld;
    /* the row's scores in 16-B loads, up to four a thread in flight before any is stored (C <= PK_SMALL_C =
     * 16 x 1024; ld is a multiple of 16 floats): a load-then-store loop had one in flight (128K search
     * 64.2-64.8 -> 61.9-62.0 us, 16K unchanged: session 25 call F) */
    for (int j0 = 0; j0 < C; j0 += 16 * (int)blockDim.x) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + 4 * (u * (int)blockDim.x + (int)threadIdx.x);
            if (j + 4 <= C) v[u] = *(const float4 *)(row + j);
            else {
                v[u].x = j < C ? row[j] : 0.f;
                v[u].y = j + 1 < C ? row[j + 1] : 0.f;
                v[u].z = j + 2 < C ? row[j + 2] : 0.f;
                v[u].w = j + 3 < C ? row[j + 3] : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + 4 * (u * (int)blockDim.x + (int)threadIdx.x);
            const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (j + i < C) sk[j + i] = kv_f2key(e[i]);
        }
    }
    int32_t *o = pos + (long long)r * kk, *id = ids + (long long)r * kk;
    const int32_t *cr = cand + r * ld;
    auto put = [&](int q, unsigned j) {
        o[q] = (int32_t)j;
        id[q] = cr[j];
    };
    if (kk <= KV_RANK_MAX && blockDim.x * 4 == (1 << PK_D1)) /* its first barrier follows sk's writes */
        pk_topk_row2(sk, C, kk, P, sv, bh, put);
    else
        pk_topk_row([&](int j) { return sk[j]; }, C, kk, P, sv, put);
}

/* The final top-k from the tiles' own top-kk lists (pk_select_rerank_kernel's
 * tile mode): one 1024-thread block per row over E = tiles * kk entries
 * list[r*E + e] = ~key << 32 | candidate index (~0: none), each tile's
 * entries in (score desc, index asc) order, so among equal scores slot order
 * is index order and pk_topk_row over the slots selects and orders exactly
 * as kv_topk_ref over all C scores would. Dynamic shared memory: P * 8 +
 * E * 4 bytes. */
__global__ void __launch_bounds__(1024) pk_merge_topk_kernel(const unsigned long long *list, int E, int kk, int P,
                                                              int32_t *pos) {
    extern __shared__ unsigned long long sv[]; /* [P] sort keys, then [E] score keys */
    unsigned *sk = (unsigned *)(sv + P);
    const int r = blockIdx.x;
    const unsigned long long *l = list + (long long)r * E;
#pragma unroll 8
    for (int e = threadIdx.x; e < E; e += blockDim.x) sk[e] = ~(unsigned)(l[e] >> 32);
    int32_t *o = pos + (long long)r * kk;
    pk_topk_row([&](int e) { return sk[e]; }, E, kk, P, sv, [&](int q, unsigned e) { o[q] = (int32_t)(unsigned)l[e]; });
}

/* The fused bucket compaction + rerank (+ final top-k), grid (tiles, rows),
 * PK_TH threads: tile t of row r selects its candidates as
 * pk_compact_kernel (pk_tile_select, offsets and tie shares from the
 * collision kernel's last block) into shared memory and cand, then reranks
 * them (pk_rsq, the scores at csc[r*ld + its candidate index]), so the
 * candidates are not re-read from memory and two launches become one; S
 * blocks share a tile (block x: tile x / S, part x % S reranks the tile's
 * candidates l with l / blockDim = part mod S; each selects the whole tile,
 * part 0 writes cand), so a short region's rerank has enough threads for
 * its gathers. Then,
 * by mode: 0 nothing (the final top-k follows elsewhere); 1 (short lists,
 * C <= PK_LAST_C) the last tile of the row to finish (threadfence
 * reduction) stages the row's C scores in shared memory and runs the final
 * top-k (pk_topk_row) into pos[r*kk ..]: the 16K search is then three
 * kernels; 2 (C > PK_SMALL_C) each tile writes its own top-kk, sorted, to
 * list[(r*tiles + t)*kk ..] for pk_merge_topk_kernel (in place of the
 * cooperative kv_topk_launch over all C). Dynamic shared memory: the query
 * table (D'*16 floats), then PK_TILE ints (the tile's candidates, then in
 * mode 2 their score keys) followed in mode 2 by P sort keys; in mode 1's
 * last block the region holds P sort keys and C score keys. */
template <int M, int CW, class ST>
__global__ void __launch_bounds__(PK_TH, 5) pk_select_rerank_kernel(const ST *scores, long long ld, int base,
                                                                 int lo, int end, int ntiles, const int *toff,
                                                                 const int *teq, const int *thr_arr, int32_t *cand,
                                                                 const uint8_t *code, const kv_bf16 *w,
                                                                 const float *qt, const float *qnorm, pk_lv lv, int G,
                                                                 int nh, long long Tp, float *csc, int C, int mode,
                                                                 int kk, int P, int32_t *pos, unsigned *ctr,
                                                                 unsigned long long *list, int S) {
    extern __shared__ float lut[];
    int *sel = (int *)(lut + 32 * CW * 16);
    __shared__ int wsum[32];
    const int r = blockIdx.y, t = blockIdx.x / S, part = blockIdx.x % S, g = r * nh / G;
    pk_rsq_lut<CW>(lut, qt + (long long)r * 32 * CW, lv);
    const int thr = thr_arr[r], off = toff[(long long)r * ntiles + t], take = teq[(long long)r * ntiles + t];
    const long long i0 = base + (long long)t * PK_TILE + threadIdx.x * PK_PER_TH;
    unsigned v[PK_PER_TH / 2];
    pk_load_w(scores + r * ld, i0, lo, end, v);
    int32_t *out = cand + r * ld + off;
    const int ns = pk_tile_select(v, thr, take, i0, wsum, [&](int l, long long i) {
        sel[l] = (int)i;
        if (part == 0) out[l] = (int32_t)i;
    });
    __syncthreads();
    const float qn = qnorm[r];
    float *cs = csc + r * ld + off;
    for (int l = threadIdx.x + part * blockDim.x; l < ns; l += S * blockDim.x) {
        const float sc = __fmul_rn(qn, pk_rsq<M, CW>(sel[l], g, code, w, lut, Tp));
        cs[l] = sc;
        sel[l] = (int)kv_f2key(sc); /* mode 2: the tile's score keys, in place (each l is this thread's) */
    }
    if (mode == 2) {
        const int kt = min(kk, ns);
        unsigned long long *tl = list + ((long long)r * ntiles + t) * kk;
        for (int q = kt + threadIdx.x; q < kk; q += blockDim.x) tl[q] = ~0ULL; /* none */
        if (kt > 0) /* uniform */
            pk_topk_row([&](int l) { return (unsigned)sel[l]; }, ns, kt, P, (unsigned long long *)(sel + PK_TILE),
                        [&](int q, unsigned l) {
                            tl[q] = (unsigned long long)~(unsigned)sel[l] << 32 | (unsigned)(off + (int)l);
                        });
        return;
    }
    if (mode != 1 || !kv_arrives_last(&ctr[r], gridDim.x)) return;
    unsigned long long *sv = (unsigned long long *)sel;
    unsigned *sk = (unsigned *)(sv + P);
    const float *row = csc + r * ld;
#pragma unroll 8
    for (int j = threadIdx.x; j < C; j += blockDim.x) sk[j] = kv_f2key(__ldcg(row + j));
    int32_t *o = pos + (long long)r * kk;
    pk_topk_row([&](int j) { return sk[j]; }, C, kk, P, sv, [&](int q, unsigned j) { o[q] = (int32_t)j; });
    if (threadIdx.x == 0) ctr[r] = 0;
}

}  // namespace

namespace {

/* The fused path's final top-k: 1 in the select-rerank kernel's last tile
 * per row (C <= PK_LAST_C: that block has 256 threads, and its shared
 * memory is every tile's), 2 the tiles' own top-kk lists merged by
 * pk_merge_topk_kernel (when its shared memory holds them), 0 after the
 * select-rerank kernel as unfused (pk_small_topk_kernel for C <=
 * PK_SMALL_C, else kv_topk_launch). */
constexpr int PK_LAST_C = 4096;
int pk_topk_mode(const kv_pariskv_gpu *p, const kv_pariskv_gpu_step *s, int ntiles) {
    const int kk = s->k < s->C ? s->k : s->C;
    if (kk > KV_GPU_TOPK_MAX) return 0;
    if (s->C <= PK_LAST_C && kk <= PK_SMALL_K) return 1;
    if (s->C <= PK_SMALL_C && kk <= PK_SMALL_K) return 0;
    int P = 32;
    while (P < kk) P <<= 1;
    if (kk <= PK_SMALL_K && (size_t)ntiles * kk * 4 + (size_t)P * 8 <= p->merge_smax) return 2;
    return 0;
}

/* Who takes a step's final top-k (stage 3; C candidates, kk kept, fused mode): 1 pk_small_topk_kernel, one block
 * a row; 2 the cluster top-k (pariskv_cluster.cu, *csm its dynamic shared memory); 0 the fused form's last tiles or
 * merge, the cooperative kv_topk_launch or the host. 1 and 2 also write stage 4's ids. */
int pk_final_route(const kv_pariskv_gpu *p, int C, int kk, int mode, size_t *csm) {
    *csm = 0;
    if (kk > KV_GPU_TOPK_MAX || (p->fused && mode != 0)) return 0;
    if (C <= PK_SMALL_C && kk <= PK_SMALL_K) return 1;
    if (kk <= KV_RANK_MAX && C > PK_SMALL_C) *csm = pk_cluster_smem(C, p->clus_n, p->clus_smax);
    return *csm ? 2 : 0;
}

/* The bucket compaction finds its offsets itself (pk_bucket's fold) where its grid is one wave of two
 * blocks an SM; beyond, a scan kernel first (pk_compact_kernel's comment has why). */
int pk_fold(const kv_pariskv_gpu *p, int ntiles) { return ntiles * p->c.rows <= 2 * p->dev.sm_count; }

/* pk_select_rerank_kernel's dynamic shared memory (see there). */
size_t pk_sr_smem(int dp, int mode, int C, int P) {
    size_t x = (size_t)PK_TILE * 4 + (mode == 2 ? (size_t)P * 8 : 0);
    if (mode == 1 && (size_t)C * 4 + (size_t)P * 8 > x) x = (size_t)C * 4 + (size_t)P * 8;
    return (size_t)dp * 16 * 4 + x;
}

/* X(CW) for the layer's D' = 32 CW, and X(M, CW) for its m as well (create accepts D' in {32, 64, 128, 256} and
 * m in {2, 4, 8}): the one dispatch of the templated kernels. */
#define PK_BY_DP(dp, X)                          \
    do {                                         \
        if ((dp) == 32) { X(1); }                \
        else if ((dp) == 64) { X(2); }           \
        else if ((dp) == 128) { X(4); }          \
        else { X(8); }                           \
    } while (0)
#define PK_BY_M(m, X, CW)                        \
    do {                                         \
        if ((m) == 8) { X(8, CW); }              \
        else if ((m) == 4) { X(4, CW); }         \
        else { X(2, CW); }                       \
    } while (0)

kv_status pk_alloc(kv_pariskv_gpu *p) {
    const kv_pariskv_gpu_cfg *c = &p->c;
    const size_t Tp = (size_t)p->Tp, R = (size_t)c->rows, H = (size_t)c->Hkv;
    KV_TRY(kv_cuda_dev_query(&p->dev));
    KV_CUDA_TRY(kv_stream_create(&p->st));
    KV_CUDA_ALLOC(p->signs, (size_t)c->dp * 4, 0, "pariskv SRHT signs");
    KV_CUDA_ALLOC(p->ids, H * c->nb * Tp, 0, "pariskv centroid ids");
    KV_CUDA_ALLOC(p->code, H * Tp * p->cb, 0, "pariskv 4-bit codes");
    KV_CUDA_ALLOC(p->w, H * Tp * c->nb * sizeof(kv_bf16), 0, "pariskv weights (bf16)");
    KV_CUDA_ALLOC(p->counts, H * c->nb * p->nc * 4, 0, "pariskv centroid counts");
    KV_CUDA_ALLOC(p->stage, H * p->stage_tokens * c->D * 4, 0, "pariskv key staging");
    KV_CUDA_ALLOC(p->q, (size_t)c->Hq * c->D * 4, 0, "pariskv queries");
    KV_CUDA_ALLOC(p->qt, R * c->dp * 4, 0, "pariskv rotated queries");
    KV_CUDA_ALLOC(p->qnorm, R * 4, 0, "pariskv query norms");
    KV_CUDA_ALLOC(p->wt, R * c->nb * p->nc, 0, "pariskv tier bonuses");
    KV_CUDA_ALLOC(p->scores, R * Tp * 2, 0, "pariskv collision scores");
    KV_CUDA_ALLOC(p->thist, R * p->ntiles_max * p->nbins * 4, 0, "pariskv tile histograms");
    KV_CUDA_ALLOC(p->ghist, R * p->nbins * 4, 0, "pariskv row histograms");
    KV_CUDA_ALLOC(p->toff, R * p->ntiles_max * 4, 0, "pariskv tile offsets");
    KV_CUDA_ALLOC(p->teq, R * p->ntiles_max * 4, 0, "pariskv tile ties");
    KV_CUDA_ALLOC(p->thr, R * 4, 0, "pariskv thresholds");
    KV_CUDA_ALLOC(p->cand, R * Tp * 4, 0, "pariskv candidates");
    KV_CUDA_ALLOC(p->csc, R * Tp * 4, 0, "pariskv rerank scores");
    KV_CUDA_ALLOC(p->pos, R * p->kmax * 4, 0, "pariskv top-k positions");
    KV_CUDA_ALLOC(p->ctr, 2 * R * 4, 0, "pariskv last-tile counters");
    const size_t lk = p->kmax < PK_SMALL_K ? p->kmax : PK_SMALL_K;
    KV_CUDA_ALLOC(p->list, R * p->ntiles_max * lk * 8, 0, "pariskv tile top-k lists");
    KV_CUDA_ALLOC(p->sel, R * p->kmax * 4, 0, "pariskv selected ids");
    KV_CUDA_ALLOC(p->hpos, R * p->kmax * 4, 1, "pariskv selected ids (pinned host)");
    KV_TRY(kv_topk_ws_create(&p->tk, c->rows, (int)Tp, &p->dev));
    KV_CUDA_TRY(cudaFuncSetAttribute(pk_small_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)((size_t)PK_SMALL_K * 8 + (size_t)PK_SMALL_C * 4)));
    {   /* the opt-in limit counts the kernel's static shared arrays too (pk_topk_row's) */
        cudaFuncAttributes fa;
        KV_CUDA_TRY(cudaFuncGetAttributes(&fa, pk_merge_topk_kernel));
        p->merge_smax = (size_t)p->dev.smem_optin - fa.sharedSizeBytes;
        KV_CUDA_TRY(cudaFuncSetAttribute(pk_merge_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)p->merge_smax));
    }
    {
        const int sr = (int)pk_sr_smem(c->dp, 2, PK_LAST_C, PK_SMALL_K) > (int)pk_sr_smem(c->dp, 1, PK_LAST_C, PK_SMALL_K)
                           ? (int)pk_sr_smem(c->dp, 2, PK_LAST_C, PK_SMALL_K)
                           : (int)pk_sr_smem(c->dp, 1, PK_LAST_C, PK_SMALL_K); /* the larger of the two modes */
#define PK_SR_ATTR(M, CW)                                                                                        \
    do {                                                                                                          \
        KV_CUDA_TRY(cudaFuncSetAttribute(pk_select_rerank_kernel<M, CW, uint16_t>,                                \
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, sr));                       \
        KV_CUDA_TRY(cudaFuncSetAttribute(pk_select_rerank_kernel<M, CW, uint8_t>,                                 \
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, sr));                       \
    } while (0)
#define PK_SR_ATTR_M(CW) PK_BY_M(c->m, PK_SR_ATTR, CW)
        PK_BY_DP(c->dp, PK_SR_ATTR_M);
#undef PK_SR_ATTR_M
#undef PK_SR_ATTR
    }
    /* the final top-k's clusters: 16 blocks (non-portable) where the device places one, else 8
     * (KVBENCH_PK_CL=8: 8); KVBENCH_PK_FAST=0: without the warps' maxima bound (pariskv_cluster.cu) */
    const char *ce = getenv("KVBENCH_PK_CL");
    p->clus_n = ce && !strcmp(ce, "8") ? 8 : 16;
    p->clus_fast = kv_env_on("KVBENCH_PK_FAST");
    KV_TRY(pk_cluster_topk_attr((size_t)p->dev.smem_optin, p->clus_n, &p->clus_smax));
    if (!p->clus_smax && p->clus_n == 16) {
        p->clus_n = 8;
        KV_TRY(pk_cluster_topk_attr((size_t)p->dev.smem_optin, p->clus_n, &p->clus_smax));
    }
    KV_CUDA_TRY(cudaMemsetAsync(p->ids, 0, H * c->nb * Tp, p->st));
    KV_CUDA_TRY(cudaMemsetAsync(p->counts, 0, H * c->nb * p->nc * 4, p->st));
    KV_CUDA_TRY(cudaMemsetAsync(p->ctr, 0, 2 * R * 4, p->st)); /* the last tiles zero them again */
    KV_CUDA_TRY(cudaMemcpyAsync(p->signs, c->signs, (size_t)c->dp * 4, cudaMemcpyHostToDevice, p->st));
    return KV_OK;
}

/* Encodes positions [a, a+n) of every kv head from src (device). */
kv_status pk_encode(kv_pariskv_gpu *p, const void *src, int half, long long gstride, int a, int n, cudaStream_t st) {
    if (n <= 0) return KV_OK;
    const kv_pariskv_gpu_cfg *c = &p->c;
    const int nw = 8;
    int bx = (n + nw - 1) / nw, cap = (8 * p->dev.sm_count + c->Hkv - 1) / c->Hkv;
    if (bx > cap) bx = cap;
    size_t smem = (size_t)nw * c->dp * 4 + (size_t)c->nb * p->nc * 4;
#define PK_ENC(E)                                                                                                 \
    pk_encode_kernel<E><<<dim3(bx, c->Hkv), nw * 32, smem, st>>>(src, half, gstride, a, n, c->D, c->m, c->nb, p->signs, \
                                                                 p->lv, p->ids, p->code, p->w, p->counts, p->Tp)
    PK_BY_DP(c->dp, PK_ENC);
#undef PK_ENC
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* Row r's selected key ids: ids[r][j] = cand[r][pos[r][j]], j < kk. */
__global__ void pk_ids_kernel(const int32_t *cand, long long ld, const int32_t *pos, int kk, int32_t *ids) {
    kv_dep_wait();
    const int r = blockIdx.x;
    for (int j = threadIdx.x; j < kk; j += blockDim.x) ids[(size_t)r * kk + j] = cand[r * ld + pos[(size_t)r * kk + j]];
}

/* Search stages on stream st (the query already in p->q). Unfused (the
 * default): 0 tier + collision, 1 bucket top-k (the compaction, after a
 * scan kernel where pk_fold says so), 2 rerank, 3 final top-k: five or
 * six launches with stage 4. Fused (KVBENCH_PK_FUSED=1): 0 tier +
 * collision with the bucket scan in its last tile per row, 1 compaction +
 * rerank (+ the final top-k in its last tile per row when the candidate
 * list is short), 3 the final top-k otherwise: three or four launches (each
 * dependent launch costs a few microseconds even in a graph). Both: 4 the
 * selected positions mapped to key ids (one launch; none where stage 3 ran
 * pk_small_topk_kernel or pk_cluster_topk, which write them), so a search downloads R k ids
 * and nothing else. Tried in session 23 and not kept: the unfused chain with
 * the bucket scan in the collision kernel's last tile per row, as fused
 * (one launch fewer): 43.2-43.4 against 42.8-43.1 us at 16K, 152.0-152.3
 * against 150.8-151.3 at 1M (H200, three rounds). */
kv_status pk_stage(kv_pariskv_gpu *p, const kv_pariskv_gpu_step *s, int which, cudaStream_t st) {
    const kv_pariskv_gpu_cfg *c = &p->c;
    const int R = c->rows, base = s->lo & ~15, ntiles = (s->end - base + PK_TILE - 1) / PK_TILE;
    const int nbins = (s->multi ? PK_TIERS : 1) * c->nb + 1, n = s->end - s->lo;
    const int kk = s->k < s->C ? s->k : s->C;
    int P = 32;
    while (P < kk) P <<= 1;
    const int mode = pk_topk_mode(p, s, ntiles), E = ntiles * kk; /* fused: 1 last tile, 2 tile lists + merge */
    size_t csm; /* stage 3 on one block a row (small) or a cluster a row (lng), which also write stage 4's ids */
    const int route = pk_final_route(p, s->C, kk, mode, &csm);
    const bool small = route == 1, lng = route == 2;
    switch (which) {
    case 0: {
        pk_tt tt; /* the targets on the host (kv_pariskv_tier_targets), the C reference's */
        tt.nt = kv_pariskv_tier_targets(n, s->rho, s->multi, tt.v);
#define PK_TIER(E)                                                                                              \
    pk_tier_kernel<E><<<dim3(c->nb, R), PK_TH, 0, st>>>(p->q, p->G, p->nh, c->D, c->m, c->nb, p->signs, p->counts, \
                                                        p->ids, p->Tp, s->end, s->n_idx, tt, p->wt, p->qt, p->qnorm,  \
                                                        p->ghist, nbins)
        PK_BY_DP(c->dp, PK_TIER);
#undef PK_TIER
        KV_LAUNCH_CHECK();
        size_t cs = (size_t)c->nb * p->nc + pk_hist_smem(nbins);
        const int pf = (long long)R * c->nb * (s->end - base) <= (4LL << 20); /* L2 prefetch: 4 MB of ids at most */
#define PK_COLL(ST, NC, VB, SP, CTR)                                                                           \
    return kv_launch(&p->pdl, "pariskv GPU", pk_collision_kernel<ST, NC, VB>, dim3(ntiles, R), dim3(PK_TH), cs, st,   \
                     p->ids, p->wt, p->G, p->nh, c->m, c->nb, p->Tp, base, s->lo, s->end, SP, nbins, ntiles,       \
                     p->thist, p->ghist, s->C, p->toff, p->teq, p->thr, CTR, pf)
        /* m = 8 and more than 4 blocks an SM: batches of 4 subspaces at 8 blocks an SM (pk_collision_kernel) */
        const bool vb4 = c->m == 8 && ntiles * R > 4 * p->dev.sm_count;
        if (p->score8) {
            if (vb4) PK_COLL(uint8_t, 256, 4, (uint8_t *)p->scores, p->ctr);
            if (c->m == 8) PK_COLL(uint8_t, 256, 8, (uint8_t *)p->scores, p->ctr);
            PK_COLL(uint8_t, 0, 8, (uint8_t *)p->scores, p->ctr);
        }
        if (vb4) PK_COLL(uint16_t, 256, 4, p->scores, p->fused ? p->ctr : NULL);
        if (c->m == 8) PK_COLL(uint16_t, 256, 8, p->scores, p->fused ? p->ctr : NULL);
        PK_COLL(uint16_t, 0, 8, p->scores, p->fused ? p->ctr : NULL);
#undef PK_COLL
    }
    case 1:
        if (p->fused) {
            const size_t smem = pk_sr_smem(c->dp, mode, s->C, P);
            /* blocks per tile: about two per SM in all (mode 2 needs the whole tile in one block) */
            int S = (2 * p->dev.sm_count + ntiles * R - 1) / (ntiles * R);
            S = mode == 2 || S < 1 ? 1 : S > 8 ? 8 : S;
#define PK_SR_T(M, CW, ST, SP)                                                                                     \
    pk_select_rerank_kernel<M, CW, ST><<<dim3(ntiles * S, R), PK_TH, smem, st>>>(                                  \
        SP, p->Tp, base, s->lo, s->end, ntiles, p->toff, p->teq, p->thr, p->cand, p->code, p->w, p->qt,          \
        p->qnorm, p->lv, p->G, p->nh, p->Tp, p->csc, s->C, mode, kk, P, p->pos, p->ctr + R, p->list, S)
#define PK_SR(M, CW)                                                  \
    if (p->score8) PK_SR_T(M, CW, uint8_t, (const uint8_t *)p->scores); \
    else PK_SR_T(M, CW, uint16_t, p->scores)
#define PK_SR_M(CW) PK_BY_M(c->m, PK_SR, CW)
            PK_BY_DP(c->dp, PK_SR_M);
#undef PK_SR_M
#undef PK_SR
#undef PK_SR_T
            KV_LAUNCH_CHECK();
            return KV_OK;
        }
        return pk_bucket(p->scores, p->Tp, base, s->lo, s->end, nbins, ntiles, R, s->C, p->thist, p->ghist, p->toff,
                         p->teq, p->thr, p->cand, p->Tp, 0, pk_fold(p, ntiles), &p->pdl, st);
    case 2: {
        if (p->fused) return KV_OK; /* reranked in stage 1 */
        dim3 grid((s->C + PK_TH - 1) / PK_TH, R);
        size_t smem = (size_t)c->dp * 16 * 4;
#define PK_RERANK(M, CW)                                                                                          \
    return kv_launch(&p->pdl, "pariskv GPU", pk_rerank_kernel<M, CW>, grid, dim3(PK_TH), smem, st, p->cand, p->Tp,  \
                     s->C, p->code, p->w, p->qt, p->qnorm, p->lv, p->G, p->nh, p->Tp, p->csc)
#define PK_RERANK_M(CW) PK_BY_M(c->m, PK_RERANK, CW)
        PK_BY_DP(c->dp, PK_RERANK_M);
#undef PK_RERANK_M
#undef PK_RERANK
    }
    case 3: {
        if (kk > KV_GPU_TOPK_MAX) return KV_OK; /* the host finishes (search) */
        if (p->fused && mode == 1) return KV_OK; /* done by stage 1's last tiles */
        if (p->fused && mode == 2) {                /* the tiles' lists merged, one block per row */
            pk_merge_topk_kernel<<<R, 1024, (size_t)P * 8 + (size_t)E * 4, st>>>(p->list, E, kk, P, p->pos);
            KV_LAUNCH_CHECK();
            return KV_OK;
        }
        if (small) /* no grid synchronisation; also stage 4's ids */
            return kv_launch(&p->pdl, "pariskv GPU", pk_small_topk_kernel, dim3(R), dim3(1024),
                             (size_t)P * 8 + (size_t)s->C * 4, st, p->csc, p->Tp, s->C, kk, P, p->pos,
                             (const int32_t *)p->cand, p->sel);
        if (lng)
            return pk_cluster_topk(p->csc, p->Tp, s->C, kk, R, p->pos, p->cand, p->sel, p->clus_n, p->clus_fast, csm, &p->pdl, st);
        return kv_topk_launch(&p->tk, p->csc, p->Tp, 0, s->C, R, s->k, 0, NULL, 1, p->pos, NULL, kk, NULL, st);
    }
    default: /* 4: the top-k's candidate positions to key ids, on the device (the search downloads only these) */
        if (kk > KV_GPU_TOPK_MAX || small || lng) return KV_OK; /* the host finishes, or stage 3 wrote them */
        return kv_launch(&p->pdl, "pariskv GPU", pk_ids_kernel, dim3(R), dim3(128), 0, st, (const int32_t *)p->cand,
                         p->Tp, (const int32_t *)p->pos, kk, p->sel);
    }
}

/* The whole search's device work (stages 0-3) on st: one CUDA graph,
 * captured for this step's shape and replayed while it repeats (ops/kv_cuda.h
 * kv_graph_run; the same launches as calling pk_stage 0..3 directly). */
kv_status pk_search_launch(kv_pariskv_gpu *p, const kv_pariskv_gpu_step *s, cudaStream_t st) {
    struct {
        int v[6];
        double rho;
    } key;
    memset(&key, 0, sizeof key);
    key.v[0] = s->lo; key.v[1] = s->end; key.v[2] = s->n_idx; key.v[3] = s->C; key.v[4] = s->k; key.v[5] = s->multi;
    key.rho = s->rho;
    return kv_graph_run(&p->graph, &key, (int)sizeof key, st, [&](cudaStream_t cs) -> kv_status {
        for (int w = 0; w < 5; w++) KV_TRY(pk_stage(p, s, w, cs));
        return KV_OK;
    });
}

kv_status pk_check_step(const kv_pariskv_gpu *p, const kv_pariskv_gpu_step *s) {
    int n = s->end - s->lo;
    if (s->lo < 0 || n <= 0 || s->end > p->c.T || s->n_idx > p->c.T || s->C < 1 || s->C > n || s->k < 1)
        return kv_fail(KV_ERR_INTERNAL, "pariskv GPU: bad search step (lo %d end %d n_idx %d C %d k %d)", s->lo, s->end,
                       s->n_idx, s->C, s->k);
    return KV_OK;
}

}  // namespace

static void kv_pariskv_gpu_destroy(kv_pariskv_gpu *p) {
    if (!p) return;
    if (p->st) cudaStreamSynchronize(p->st);
    kv_graph_destroy(&p->graph);
    void *d[] = {p->signs, p->w, p->stage, p->q, p->qt, p->qnorm, p->csc, p->ids, p->code, p->wt, p->counts,
                 p->thist, p->ghist, p->toff, p->teq, p->thr, p->scores, p->cand, p->pos, p->ctr, p->list, p->sel};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cudaFree(d[i]);
    kv_topk_ws_destroy(&p->tk);
    if (p->st) cudaStreamDestroy(p->st);
    cudaFreeHost(p->hpos);
    free(p->hcsc);
    free(p);
}

static kv_status kv_pariskv_gpu_create(const kv_pariskv_gpu_cfg *cfg, kv_pariskv_gpu **out) {
    *out = NULL;
    const kv_pariskv_gpu_cfg *c = cfg;
    if (c->dp < 32 || c->dp > 256 || (c->dp & (c->dp - 1)) || (c->m != 2 && c->m != 4 && c->m != 8) || c->nb * c->m != c->dp ||
        c->D > c->dp || c->Hkv <= 0 || c->Hq % c->Hkv || (c->rows != c->Hkv && c->rows != c->Hq) || c->T <= 0)
        return kv_fail(KV_ERR_INPUT, "pariskv GPU: unsupported shape (D %d D' %d m %d rows %d)", c->D, c->dp, c->m,
                       c->rows);
    kv_pariskv_gpu *p = (kv_pariskv_gpu *)kv_calloc(1, sizeof *p, "pariskv GPU state");
    if (!p) return KV_ERR_NOMEM;
    p->c = *c; /* pk_alloc uploads the signs; the pointers are not kept */
    p->nc = 1 << c->m;
    p->cb = c->dp / 2;
    p->G = c->Hq / c->Hkv;
    p->nh = c->rows == c->Hkv ? p->G : 1;
    p->nbins = PK_TIERS * c->nb + 1;
    p->Tp = ((long long)c->T + 15) & ~15LL;
    p->ntiles_max = (int)((p->Tp + PK_TILE - 1) / PK_TILE) + 1;
    p->stage_tokens = c->max_update > 4096 ? c->max_update : 4096;
    if (p->stage_tokens > c->T) p->stage_tokens = c->T;
    p->kmax = c->T < KV_GPU_TOPK_MAX ? c->T : KV_GPU_TOPK_MAX;
    /* 1: the fused search (3-4 launches). Not the default: on the H100 it
     * took 52.8 / 74.9 / 243.9 us at 16K / 128K / 1M against the six-launch
     * path's 46.9 / 73.7 / 177.5 (scripts/dev/s4-pk.sh, same call) */
    p->fused = kv_env_is1("KVBENCH_PK_FUSED");
    /* KVBENCH_PK_SCORE8=1: 8-bit collision scores (fused path; scores <= 254) */
    p->score8 = p->fused && kv_env_is1("KVBENCH_PK_SCORE8") && PK_TIERS * c->nb <= 254;
    p->pdl = kv_env_on("KVBENCH_PK_PDL");
    for (int i = 0; i < 8; i++) p->lv.level[i] = c->level[i];
    for (int i = 0; i < 7; i++) p->lv.thr[i] = c->thr[i];
    kv_status st = pk_alloc(p);
    p->c.signs = p->c.level = p->c.thr = NULL;
    if (st != KV_OK) { kv_pariskv_gpu_destroy(p); return st; }
    *out = p;
    return KV_OK;
}

static kv_status kv_pariskv_gpu_encode_host(kv_pariskv_gpu *p, int a, int b, const float *src, size_t gstride) {
    const int H = p->c.Hkv, D = p->c.D;
    if (a < 0 || b > p->c.T) return kv_fail(KV_ERR_INTERNAL, "pariskv GPU: encode of [%d, %d) outside [0, %d)", a, b, p->c.T);
    for (int c0 = a; c0 < b; c0 += p->stage_tokens) {
        int c = b - c0 < p->stage_tokens ? b - c0 : p->stage_tokens;
        KV_CUDA_TRY(cudaMemcpy2DAsync(p->stage, (size_t)c * D * 4, src + (size_t)(c0 - a) * D, gstride * 4,
                                      (size_t)c * D * 4, (size_t)H, cudaMemcpyHostToDevice, p->st));
        KV_TRY(pk_encode(p, p->stage, 0, (long long)c * D, c0, c, p->st));
    }
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    return KV_OK;
}

/* The last search's candidate lists (R rows of last_C key ids) into cand[r*cand_ld + j]. */
static kv_status kv_pariskv_gpu_candidates(kv_pariskv_gpu *p, int32_t *cand, int cand_ld) {
    const int nc = p->last_C < cand_ld ? p->last_C : cand_ld;
    if (nc <= 0) return KV_OK;
    KV_CUDA_TRY(cudaMemcpy2DAsync(cand, (size_t)cand_ld * 4, p->cand, (size_t)p->Tp * 4, (size_t)nc * 4,
                                  (size_t)p->c.rows, cudaMemcpyDeviceToHost, p->st));
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    return KV_OK;
}

static void kv_pariskv_gpu_candidates_dev(const kv_pariskv_gpu *p, const int32_t **cand, long long *ld) {
    *cand = p->cand;
    *ld = p->Tp;
}

/* Queues one search (kv_gpu_mark: `kvbench run`); the ids come back into pinned memory, read by fetch. */
static kv_status kv_pariskv_gpu_launch(kv_pariskv_gpu *p, const float *q, const kv_pariskv_gpu_step *s,
                                       kv_gpu_mark *mark) {
    p->last_k = 0;
    KV_TRY(pk_check_step(p, s));
    const int R = p->c.rows, kk = s->k < s->C ? s->k : s->C;
    KV_CUDA_TRY(cudaMemcpyAsync(p->q, q, (size_t)p->c.Hq * p->c.D * 4, cudaMemcpyHostToDevice, p->st));
    KV_TRY(kv_gpu_mark_start(mark, p->st));
    KV_TRY(pk_search_launch(p, s, p->st));
    KV_TRY(kv_gpu_mark_end(mark, p->st));
    p->last_lo = s->lo;
    p->last_n = s->end - s->lo;
    p->last_C = s->C;
    p->last_k = s->k;
    if (kk <= KV_GPU_TOPK_MAX) /* the ids mapped on the device (stage 4): R kk ids come back, into pinned memory */
        KV_CUDA_TRY(cudaMemcpyAsync(p->hpos, p->sel, (size_t)R * kk * 4, cudaMemcpyDeviceToHost, p->st));
    return KV_OK;
}

/* Waits for the launched search and writes its lists out[r * k + j] (and its candidates when cand). */
static kv_status kv_pariskv_gpu_fetch(kv_pariskv_gpu *p, int32_t *out, int32_t *cand, int cand_ld) {
    const int R = p->c.rows, k = p->last_k, C = p->last_C, kk = k < C ? k : C;
    if (k <= 0) return kv_fail(KV_ERR_INTERNAL, "pariskv GPU: fetch without a launched search");
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    if (kk <= KV_GPU_TOPK_MAX) {
        for (int r = 0; r < R; r++) memcpy(out + (size_t)r * k, p->hpos + (size_t)r * kk, (size_t)kk * 4);
        return cand ? kv_pariskv_gpu_candidates(p, cand, cand_ld) : KV_OK;
    }
    /* beyond the GPU top-k's index limit: the host ranks the rerank scores */
    int32_t *hc = (int32_t *)kv_malloc((size_t)R * C * 4, "pariskv candidates (host)");
    float *sc = (float *)kv_malloc((size_t)C * 4, "pariskv rerank scores (host)");
    int32_t *ps = (int32_t *)kv_malloc((size_t)kk * 4, "pariskv top-k (host)");
    kv_status st = hc && sc && ps ? kv_pariskv_gpu_candidates(p, hc, C) : KV_ERR_NOMEM;
    for (int r = 0; r < R && st == KV_OK; r++) {
        cudaError_t e = cudaMemcpy(sc, p->csc + (size_t)r * p->Tp, (size_t)C * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) { st = kv_cuda_error(e, "copying the rerank scores back", __FILE__, __LINE__); break; }
        kv_topk_ref(sc, C, kk, 0, ps, NULL);
        for (int j = 0; j < kk; j++) out[(size_t)r * k + j] = hc[(size_t)r * C + ps[j]];
    }
    const int nc = C < cand_ld ? C : cand_ld;
    for (int r = 0; r < R && st == KV_OK && cand; r++)
        memcpy(cand + (size_t)r * cand_ld, hc + (size_t)r * C, (size_t)nc * 4);
    free(hc);
    free(sc);
    free(ps);
    return st;
}

static kv_status kv_pariskv_gpu_search(kv_pariskv_gpu *p, const float *q, const kv_pariskv_gpu_step *s,
                                           int32_t *out, int32_t *cand, int cand_ld) {
    KV_TRY(kv_pariskv_gpu_launch(p, q, s, NULL));
    return kv_pariskv_gpu_fetch(p, out, cand, cand_ld);
}

static kv_status kv_pariskv_gpu_read_index(kv_pariskv_gpu *p, int g, int a, int b, uint8_t *ids, uint8_t *code,
                                               kv_bf16 *w, int32_t *counts) {
    const int nb = p->c.nb, n = b - a;
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    if (ids) {
        uint8_t *tmp = (uint8_t *)kv_malloc((size_t)nb * n, "pariskv ids (host)");
        if (!tmp) return KV_ERR_NOMEM;
        cudaError_t e = cudaMemcpy2D(tmp, (size_t)n, p->ids + (size_t)g * nb * p->Tp + a, (size_t)p->Tp, (size_t)n,
                                     (size_t)nb, cudaMemcpyDeviceToHost);
        for (int i = 0; i < n && e == cudaSuccess; i++)
            for (int q = 0; q < nb; q++) ids[(size_t)i * nb + q] = tmp[(size_t)q * n + i];
        free(tmp);
        KV_CUDA_TRY(e);
    }
    if (code)
        KV_CUDA_TRY(cudaMemcpy(code, p->code + ((size_t)g * p->Tp + a) * p->cb, (size_t)n * p->cb, cudaMemcpyDeviceToHost));
    if (w)
        KV_CUDA_TRY(cudaMemcpy(w, p->w + ((size_t)g * p->Tp + a) * nb, (size_t)n * nb * sizeof(kv_bf16),
                               cudaMemcpyDeviceToHost));
    if (counts)
        KV_CUDA_TRY(cudaMemcpy(counts, p->counts, (size_t)p->c.Hkv * nb * p->nc * 4, cudaMemcpyDeviceToHost));
    return KV_OK;
}

static kv_status kv_pariskv_gpu_read_last(kv_pariskv_gpu *p, uint16_t *scores, float *csc) {
    const int R = p->c.rows;
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    if (scores && p->last_n > 0 && p->score8) { /* 8-bit on the device: widened here */
        const size_t n = (size_t)p->last_n;
        uint8_t *tmp = (uint8_t *)kv_malloc((size_t)R * n, "pariskv 8-bit scores (host)");
        if (!tmp) return KV_ERR_NOMEM;
        cudaError_t e = cudaMemcpy2D(tmp, n, (const uint8_t *)p->scores + p->last_lo, (size_t)p->Tp, n, (size_t)R,
                                     cudaMemcpyDeviceToHost);
        for (size_t i = 0; e == cudaSuccess && i < (size_t)R * n; i++) scores[i] = tmp[i];
        free(tmp);
        KV_CUDA_TRY(e);
    } else if (scores && p->last_n > 0)
        KV_CUDA_TRY(cudaMemcpy2D(scores, (size_t)p->last_n * 2, p->scores + p->last_lo, (size_t)p->Tp * 2, (size_t)p->last_n * 2,
                                 (size_t)R, cudaMemcpyDeviceToHost));
    if (csc && p->last_C > 0)
        KV_CUDA_TRY(cudaMemcpy2D(csc, (size_t)p->last_C * 4, p->csc, (size_t)p->Tp * 4, (size_t)p->last_C * 4,
                                 (size_t)R, cudaMemcpyDeviceToHost));
    return KV_OK;
}

namespace {
kv_status pk_bench_go(kv_pariskv_gpu *p, kv_bench_timer *tm, const kv_gpu_bench_spec *spec, const kv_gpu_keys *K,
                      const float *q, double beta, double rho, int multi, kv_gpu_stages *out) {
    const kv_pariskv_gpu_cfg *c = &p->c;
    const int n = spec->n, R = c->rows;
    KV_TRY(kv_bench_timer_init(tm, spec->reps, spec->warmup, spec->stream));
    cudaStream_t st = tm->st;
    const size_t cnt_bytes = (size_t)c->Hkv * c->nb * p->nc * 4;
    auto encode = [&]() -> kv_status {
        KV_CUDA_TRY(cudaMemsetAsync(p->counts, 0, cnt_bytes, st));
        return pk_encode(p, K->a.p, K->a.half, (long long)K->a.T * K->a.D, 0, n, st);
    };
    KV_TRY(encode());
    KV_CUDA_TRY(cudaMemcpyAsync(p->q, q, (size_t)c->Hq * c->D * 4, cudaMemcpyHostToDevice, st));
    int C = (int)ceil((double)n * beta), kn = spec->k < n ? spec->k : n;
    if (C < kn) C = kn;
    if (C > n) C = n;
    kv_pariskv_gpu_step s = {0, n, n, C, spec->k, multi, rho};
    for (int w = 0; w < 5; w++) KV_TRY(pk_stage(p, &s, w, st)); /* real inputs for every stage */
    KV_CUDA_TRY(cudaStreamSynchronize(st));
    const double ke = K->a.half ? 2 : 4, Bn = c->nb, kk = spec->k < C ? spec->k : C;
    const double row_keys = (double)R * n, cand = (double)R * C, cand_bytes = 4 + p->cb + 2 * Bn;
    const double enc_bytes = (double)c->Hkv * n * (c->D * ke + Bn + p->cb + 2 * Bn); /* key in, index out */
    const double search_bytes = row_keys * Bn + cand * (cand_bytes - 4) + R * kk * 4; /* ids, cand. codes+weights */
    const int mode = pk_topk_mode(p, &s, (n + PK_TILE - 1) / PK_TILE);
    struct {
        const char *name;
        int which; /* pk_stage; -1 encode, -2 the whole search */
        double bytes;
    } st6[6];
    int ns = 0;
    st6[ns++] = {"encode", -1, enc_bytes};
    if (p->fused) {
        st6[ns++] = {"collision_scan", 0, row_keys * (Bn + 2)};                            /* ids in, score out */
        st6[ns++] = {mode == 1 ? "select_rerank_topk" : mode == 2 ? "select_rerank_tiletopk" : "select_rerank", 1,
                     row_keys * 2 + cand * (cand_bytes + 4)};
        if (mode != 1) st6[ns++] = {mode == 2 ? "merge_topk" : "final_topk", 3, cand * 4 + R * kk * 4};
    } else {
        st6[ns++] = {"collision", 0, row_keys * (Bn + 2)};             /* ids in, score out */
        st6[ns++] = {"bucket_topk", 1, row_keys * 2 + cand * 4};       /* scores in, candidates out */
        st6[ns++] = {"rerank", 2, cand * (cand_bytes + 4)};            /* candidate, codes, weights in, score out */
        st6[ns++] = {"final_topk", 3, cand * 4 + R * kk * 4};          /* scores in, positions out */
    }
    st6[ns++] = {"search", -2, search_bytes};
    for (int i = 0; i < ns; i++) {
        kv_gpu_timing t;
        const int w = st6[i].which;
        if (w == -1) KV_TRY(kv_bench_time(tm, encode, &t));
        else if (w >= 0) KV_TRY(kv_bench_time(tm, [&]() { return pk_stage(p, &s, w, st); }, &t));
        else KV_TRY(kv_bench_time(tm, [&]() { return pk_search_launch(p, &s, st); }, &t));
        out->stage[i] = kv_gpu_stage{st6[i].name, t, st6[i].bytes};
    }
    out->n = ns;
    /* the unfused chain's launches: tier, collision, (scan), compaction, rerank, final top-k, (id map) */
    size_t csm;
    const int ntl = (n + PK_TILE - 1) / PK_TILE, route = pk_final_route(p, C, (int)kk, 0, &csm);
    char unf[96];
    snprintf(unf, sizeof unf, "unfused (the default, %d launches; KVBENCH_PK_FUSED=1 fuses)",
             5 + !pk_fold(p, ntl) + (route == 0));
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "pariskv %s, per key and row (R=%d, B=%d, D'/2=%d, C=%d/row): encode = K %dD + ids B + codes + weights "
             "2B per kv-head key (%.3f us/token); collision = ids B + score 2; compaction = score 2 + 4 per "
             "candidate; rerank = per candidate index 4 + codes + weights 2B + score 4; final_topk = 4 per "
             "candidate; search = ids B per key + codes + weights per candidate",
             p->fused ? (mode == 1 ? "fused (3 launches)" : "fused (4 launches)") : unf,
             R, c->nb, p->cb, C, (int)ke, out->stage[0].t.med_us / n);
    out->l2_bytes = tm->dev.l2_bytes;
    out->flush_bytes = tm->flush_n * sizeof(uint4);
    return KV_OK;
}
}  // namespace

static kv_status kv_pariskv_gpu_bench(const kv_pariskv_gpu_cfg *cfg, const kv_gpu_bench_spec *spec,
                                          const kv_gpu_keys *K, const float *q, double beta, double rho, int multi,
                                          kv_gpu_stages *out) {
    memset(out, 0, sizeof *out);
    if (spec->n < 1 || spec->n > K->a.T || K->a.H != cfg->Hkv || K->a.D != cfg->D || cfg->T < spec->n)
        return kv_fail(KV_ERR_INPUT, "pariskv GPU bench: inconsistent spec (n=%d)", spec->n);
    kv_pariskv_gpu *p = NULL;
    KV_TRY(kv_pariskv_gpu_create(cfg, &p));
    kv_bench_timer tm = {};
    kv_status st = pk_bench_go(p, &tm, spec, K, q, beta, rho, multi, out);
    kv_bench_timer_free(&tm);
    kv_pariskv_gpu_destroy(p);
    return st;
}

extern "C" const kv_pariskv_cuda_ops kv_pariskv_cuda = {
    .create = kv_pariskv_gpu_create,
    .destroy = kv_pariskv_gpu_destroy,
    .encode_host = kv_pariskv_gpu_encode_host,
    .search = kv_pariskv_gpu_search,
    .launch = kv_pariskv_gpu_launch,
    .fetch = kv_pariskv_gpu_fetch,
    .candidates = kv_pariskv_gpu_candidates,
    .candidates_dev = kv_pariskv_gpu_candidates_dev,
    .read_index = kv_pariskv_gpu_read_index,
    .read_last = kv_pariskv_gpu_read_last,
    .bucket_topk_host = pk_bucket_topk_host,
    .bench = kv_pariskv_gpu_bench,
};
