/* ctkvr_search.cuh: CTKVR's whole search as one launch, version 2 (issue 9,
 * point 4: < 40 us at every length). Included by ctkvr.cu inside its
 * anonymous namespace after ctkvr_fused.cuh (version 1, kept selectable by
 * KVBENCH_CTKVR_FUSED=1 for comparison; bench stage search_v1), whose frame
 * it keeps: phase 1 over a grid (nb, Hkv), then the kv head's last block to
 * arrive (threadfence reduction) does the rest alone. Version 1 spent its
 * time in latency: scalar loads of the slot queries a few at a time, a
 * 1024-wide bitonic sort (55 barrier stages), one sequential rank count per
 * selected key. What version 2 changes, with the same numbers (bitwise
 * where version 1 was):
 * - Phase 1: 512 threads, spb = 256 / G slots a block; a (slot, query head)
 *   pair is two lanes, lane h summing kv_dot_ref's partial sums 4h..4h+3
 *   from 16-byte loads, all of a lane's loads issued before the first add
 *   and before the block's first barrier (the whole 17 MB is in flight at
 *   once); the same lanes sum the query's norm; the partner's four partials
 *   come by one shuffle and are combined in kv_dot_ref's tree, so the
 *   cosines are bitwise ct_cos's. Each block's best cpb slots have their
 *   sorted lists and lengths prefetched to L2 (the final C' are among them).
 * - Rank counts (block top C', the merge of the blocks' candidates, the
 *   top-k's final order) share each item's count among up to 32 lanes.
 * - Gather: the lists are also kept sorted by position (lsrt, written at the
 *   build and at each DCU commit by ct_sort_lists), so the union is a merge
 *   of C' sorted lists: every entry finds its place by binary searches in
 *   the other lists (stable: ties by list order; 4 lists in lockstep), then
 *   adjacent duplicates and entries outside [lo, gen_lo) drop out by one
 *   block scan: ~6 barriers instead of ~60. The keys the rerank will read
 *   are prefetched to L2 on the way.
 * - Rerank: one thread per key reads the key once (16-byte loads, all in
 *   flight) for two query heads at a time; the G maxima and the G double
 *   sums are each one block reduction (fixed order: the documented tie with
 *   the CPU's sequential sum stays, the result is deterministic).
 * - Top k and DCU's top rho: kv_block_topk (block_topk.cuh), one ranking of
 *   the longer (session 22), the shorter copied as its prefix.
 * Version 3 (the default; KVBENCH_CTKVR_V2=1 keeps version 2): the rerank's
 * key reads. Version 2's thread-per-key 16-byte loads touch 32 rows (32
 * cache lines) per warp instruction, which the L1 serves about a line at a
 * time (the likely cause of the 1M trace's ~12 us for ~1000 keys x 256 B on
 * one SM; not yet measured on a device); cts_rerank_tiled
 * has each warp load its 32 keys as whole 128-byte pieces (4 lines per
 * instruction, all 16 loads in flight) into a per-warp shared tile (+74 KB,
 * padded: conflict-free), then each thread sums its own key from the tile
 * with cts_key_dots' operations in its order (bitwise the same scores).
 * Where the tiles do not fit the shared memory, version 2's rerank runs.
 * Split rerank (the default with the tiles; KVBENCH_CTKVR_DIST=0 keeps it
 * on one block): the kv head's other nb - 1 blocks no longer exit after
 * phase 1 but wait for the last one's set (a flag holding its size + 1),
 * score slice bx of it with the same tiled code (the same bits), write the
 * scores to the scratch S and count themselves; the last block scores its
 * own slice, waits for the count and reads the others' scores back. Every
 * block of the head has arrived, so all are resident: no deadlock. The
 * merge no longer prefetches the set's keys to L2 (KVBENCH_CTKVR_PREFETCH=1
 * does): with the split, the other blocks read them themselves. Measured
 * (H100, session 5, `kvbench bench --method ctkvr`, search at 16K / 128K /
 * 1M): one block 38.8 / 41.3 / 41.6 us, split 37.3 / 39.6 / 40.3, split
 * without the prefetch 36.4-36.7 / 38.8-39.0 / 39.3-39.5; tried and
 * dropped: the top k by a bitonic sort in the tiles (the trace's top-k
 * step 10.3 us against kv_block_topk's 6.5).
 * Session 22 (H200): the merge's binary searches issue the 4 lists' probes
 * together (cts_place), and the tail's loops that run a few times are not
 * unrolled (#pragma unroll 1: about 7700 SASS instructions for the float16 kernel
 * against 10712). The tail (27 us of the 37 at 128K) waits on shared-memory
 * latency and barriers, not on code or data: without the bench's L2 flush
 * only phase 1 got faster (arrival 9.6 -> 7.8 us, the tail as long), and a
 * block that ran the tail's code ahead during phase 1 to bring it into L2
 * gained nothing (not kept). Search 38.4-38.7 -> 35.6-35.9 us at 16K,
 * 41.6-41.9 -> 38.2-38.7 at 128K, 41.3 -> 38.6 at 1M (call B); the trace's
 * merge 5.7 -> 3.6 us.
 * Limits (else the staged path): D % 8 == 0, G <= 256, 16-byte aligned
 * keys, the shared memory (about (G + 4) x 4 B per entry of the set bound) within the
 * device's opt-in. KVBENCH_CTKVR_TRACE=1 makes the bench print where one
 * launch's time goes (cts_stamp). */

constexpr int CTS_TH = 512;  /* threads a block */
constexpr int CTS_VEC = 16;  /* 16-byte loads a thread has in flight */
constexpr int CTS_GM = 2;    /* query heads the rerank scores per read of a key */

struct cts_args {
    const float *q, *cq, *cnorm;
    const int *valid;
    int C, G, Hq, D, cpe, spb, nb, cpb;
    unsigned *ckey, *ctr;
    int *cslot;
    const int32_t *lsrt;
    const int *lcnt;
    int rho, lo, gen_lo, hi, ncap, kmax;
    const void *K;
    int T;
    float scale;
    int32_t *top, *set;
    long long setld;
    int *nset;
    int k, krho;
    int32_t *oidx, *odcu;
    unsigned long long *ts; /* nullable: the bench's phase stamps (KVBENCH_CTKVR_TRACE=1), cts_stamp */
    int rr;                 /* 1: the rerank through per-warp shared tiles (cts_rerank_tiled); 0: version 2's */
    int tile_off;           /* bytes from the dynamic shared memory's start to the tiles (16-byte aligned) */
    int dist;               /* 1 (with rr): the rerank split over the kv head's nb blocks (cts_rerank_slice) */
    float *gsc;             /* dist: the other blocks' scores, [Hq][gld] */
    long long gld;
    int pf;                 /* 1: the merge asks L2 for the keys the rerank will read (KVBENCH_CTKVR_PREFETCH=1) */
};

/* The rerank's tiles (rr = 1): per warp 32 keys x (CTS_PU + 1) 16-byte units (one of padding: the per-thread
 * reads of a row are conflict-free), bytes. */
constexpr int CTS_PU = 8;
inline size_t cts_tile_smem() { return (size_t)(CTS_TH / 32) * 32 * (CTS_PU + 1) * 16; }

/* The bench's phase stamps (%globaltimer, ns): ts[0] = the first block's start (atomicMin; the host sets
 * ~0), ts[1] = the last block's arrival, ts[2..8] = kv head 0's tail after each step, ts[9] = the last
 * tail's end (atomicMax). Thread 0 only. */
enum { CTS_T_START, CTS_T_ARRIVE, CTS_T_TOPC, CTS_T_GATHER, CTS_T_MERGE, CTS_T_SET, CTS_T_SCORES, CTS_T_LSE,
       CTS_T_TOPK, CTS_T_END, CTS_NT };
__device__ __forceinline__ void cts_stamp(unsigned long long *ts, int what, int g) {
    if (!ts || threadIdx.x) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (what == CTS_T_START) atomicMin(ts, t);
    else if (what == CTS_T_ARRIVE || what == CTS_T_END) atomicMax(ts + what, t);
    else if (g == 0) ts[what] = t;
}

/* Shared memory of one launch (bytes); the kernel carves it in this order. */
inline size_t cts_smem(int G, int D, int spb, int nc, int cpe, int rho, int ncap, int kmax) {
    const size_t tcap = (size_t)cpe * rho;
    const size_t p1 = (size_t)spb * G + spb;
    const size_t tail = 2 * (size_t)nc + 2 * tcap + ncap + (size_t)G * ncap + ncap + kmax + 257;
    return (size_t)G * D * 4 + ((size_t)(CTS_TH / 32) * G + G) * 8 + (size_t)G * 4 + 2 * (size_t)cpe * 4 +
           (p1 > tail ? p1 : tail) * 4;
}

/* kv_dot_ref(a, b, d) and kv_dot_ref(a, a, d) in both lanes of an aligned lane pair, lane h summing the
 * partials 4h..4h+3 (d % 8 == 0, a and b 16-byte aligned, a in shared memory). Has one barrier, after the
 * first loads of b are issued: fill() (which writes a) runs just before it. Call from every thread of the
 * block with the same d. */
template <class F>
__device__ __forceinline__ float2 cts_dot_pair(const float *a, const float *b, int d, int h, F &&fill) {
    float x[4] = {0.f, 0.f, 0.f, 0.f}, y[4] = {0.f, 0.f, 0.f, 0.f};
    const float4 *a4 = (const float4 *)a + h, *b4 = (const float4 *)b + h;
    const int ng = d / 8;
    for (int c0 = 0; c0 < ng; c0 += CTS_VEC) {
        const int nv = ng - c0 < CTS_VEC ? ng - c0 : CTS_VEC;
        float4 v[CTS_VEC];
#pragma unroll
        for (int i = 0; i < CTS_VEC; i++)
            if (i < nv) v[i] = __ldg(b4 + 2 * (c0 + i));
        if (c0 == 0) {
            fill();
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < CTS_VEC; i++)
            if (i < nv) {
                const float4 u = a4[2 * (c0 + i)];
                x[0] = __fadd_rn(x[0], __fmul_rn(u.x, v[i].x));
                x[1] = __fadd_rn(x[1], __fmul_rn(u.y, v[i].y));
                x[2] = __fadd_rn(x[2], __fmul_rn(u.z, v[i].z));
                x[3] = __fadd_rn(x[3], __fmul_rn(u.w, v[i].w));
                y[0] = __fadd_rn(y[0], __fmul_rn(u.x, u.x));
                y[1] = __fadd_rn(y[1], __fmul_rn(u.y, u.y));
                y[2] = __fadd_rn(y[2], __fmul_rn(u.z, u.z));
                y[3] = __fadd_rn(y[3], __fmul_rn(u.w, u.w));
            }
    }
    float tx[4], ty[4];
#pragma unroll
    for (int j = 0; j < 4; j++) { /* s_j + s_{j+4}: IEEE addition commutes, so both lanes get the same bits */
        tx[j] = __fadd_rn(x[j], __shfl_xor_sync(0xffffffffu, x[j], 1));
        ty[j] = __fadd_rn(y[j], __shfl_xor_sync(0xffffffffu, y[j], 1));
    }
    return make_float2(__fadd_rn(__fadd_rn(tx[0], tx[1]), __fadd_rn(tx[2], tx[3])),
                       __fadd_rn(__fadd_rn(ty[0], ty[1]), __fadd_rn(ty[2], ty[3])));
}

/* out[hh] = kv_dot_ref(q + hh*D, key, D) for hh < gm <= CTS_GM (q in shared memory, D % 8 == 0): the key
 * read once, CTS_VEC 16-byte loads in flight. */
__device__ __forceinline__ void cts_key_dots(const float *q, int D, int gm, const __half *key, float *out) {
    float acc[CTS_GM][8];
#pragma unroll
    for (int hh = 0; hh < CTS_GM; hh++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[hh][j] = 0.f;
    const uint4 *k4 = (const uint4 *)key;
    const int ng = D / 8;
    for (int c0 = 0; c0 < ng; c0 += CTS_VEC) {
        const int nv = ng - c0 < CTS_VEC ? ng - c0 : CTS_VEC;
        uint4 u[CTS_VEC];
#pragma unroll
        for (int i = 0; i < CTS_VEC; i++)
            if (i < nv) u[i] = __ldg(k4 + c0 + i);
#pragma unroll
        for (int i = 0; i < CTS_VEC; i++)
            if (i < nv) {
                const __half2 *h2 = (const __half2 *)&u[i];
                float f[8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 t = __half22float2(h2[j]);
                    f[2 * j] = t.x;
                    f[2 * j + 1] = t.y;
                }
#pragma unroll
                for (int hh = 0; hh < CTS_GM; hh++)
                    if (hh < gm) {
                        const float4 qa = *(const float4 *)(q + hh * D + 8 * (c0 + i));
                        const float4 qb = *(const float4 *)(q + hh * D + 8 * (c0 + i) + 4);
                        acc[hh][0] = __fadd_rn(acc[hh][0], __fmul_rn(qa.x, f[0]));
                        acc[hh][1] = __fadd_rn(acc[hh][1], __fmul_rn(qa.y, f[1]));
                        acc[hh][2] = __fadd_rn(acc[hh][2], __fmul_rn(qa.z, f[2]));
                        acc[hh][3] = __fadd_rn(acc[hh][3], __fmul_rn(qa.w, f[3]));
                        acc[hh][4] = __fadd_rn(acc[hh][4], __fmul_rn(qb.x, f[4]));
                        acc[hh][5] = __fadd_rn(acc[hh][5], __fmul_rn(qb.y, f[5]));
                        acc[hh][6] = __fadd_rn(acc[hh][6], __fmul_rn(qb.z, f[6]));
                        acc[hh][7] = __fadd_rn(acc[hh][7], __fmul_rn(qb.w, f[7]));
                    }
            }
    }
#pragma unroll
    for (int hh = 0; hh < CTS_GM; hh++)
        if (hh < gm)
            out[hh] = __fadd_rn(__fadd_rn(__fadd_rn(acc[hh][0], acc[hh][4]), __fadd_rn(acc[hh][1], acc[hh][5])),
                                __fadd_rn(__fadd_rn(acc[hh][2], acc[hh][6]), __fadd_rn(acc[hh][3], acc[hh][7])));
}

/* The same for float32 keys: 16-byte loads of 4 floats, partials 0..3 from even loads, 4..7 from odd. */
__device__ __forceinline__ void cts_key_dots(const float *q, int D, int gm, const float *key, float *out) {
    float acc[CTS_GM][8];
#pragma unroll
    for (int hh = 0; hh < CTS_GM; hh++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[hh][j] = 0.f;
    const float4 *k4 = (const float4 *)key;
    const int nf = D / 4;
    for (int c0 = 0; c0 < nf; c0 += CTS_VEC) { /* c0 even: load i's partials are 4 * (i & 1) .. + 3 */
        const int nv = nf - c0 < CTS_VEC ? nf - c0 : CTS_VEC;
        float4 v[CTS_VEC];
#pragma unroll
        for (int i = 0; i < CTS_VEC; i++)
            if (i < nv) v[i] = __ldg(k4 + c0 + i);
#pragma unroll
        for (int i = 0; i < CTS_VEC; i++)
            if (i < nv) {
                const int o = 4 * (i & 1);
#pragma unroll
                for (int hh = 0; hh < CTS_GM; hh++)
                    if (hh < gm) {
                        const float4 qa = *(const float4 *)(q + hh * D + 4 * (c0 + i));
                        acc[hh][o] = __fadd_rn(acc[hh][o], __fmul_rn(qa.x, v[i].x));
                        acc[hh][o + 1] = __fadd_rn(acc[hh][o + 1], __fmul_rn(qa.y, v[i].y));
                        acc[hh][o + 2] = __fadd_rn(acc[hh][o + 2], __fmul_rn(qa.z, v[i].z));
                        acc[hh][o + 3] = __fadd_rn(acc[hh][o + 3], __fmul_rn(qa.w, v[i].w));
                    }
            }
    }
#pragma unroll
    for (int hh = 0; hh < CTS_GM; hh++)
        if (hh < gm)
            out[hh] = __fadd_rn(__fadd_rn(__fadd_rn(acc[hh][0], acc[hh][4]), __fadd_rn(acc[hh][1], acc[hh][5])),
                                __fadd_rn(__fadd_rn(acc[hh][2], acc[hh][6]), __fadd_rn(acc[hh][3], acc[hh][7])));
}

/* One 16-byte unit u of a key into cts_key_dots' partial sums (the same operations in the same order per
 * partial): float16, unit u = elements 8u..8u+7 -> partials 0..7; float32, unit u = elements 4u..4u+3 ->
 * partials 4(u & 1)..+3. */
__device__ __forceinline__ void cts_unit(float (&acc)[CTS_GM][8], const float *q, int D, int gm, int u, uint4 raw,
                                         const __half *) {
    const __half2 *h2 = (const __half2 *)&raw;
    float f[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 t = __half22float2(h2[j]);
        f[2 * j] = t.x;
        f[2 * j + 1] = t.y;
    }
#pragma unroll
    for (int hh = 0; hh < CTS_GM; hh++)
        if (hh < gm) {
            const float4 qa = *(const float4 *)(q + hh * D + 8 * u);
            const float4 qb = *(const float4 *)(q + hh * D + 8 * u + 4);
            acc[hh][0] = __fadd_rn(acc[hh][0], __fmul_rn(qa.x, f[0]));
            acc[hh][1] = __fadd_rn(acc[hh][1], __fmul_rn(qa.y, f[1]));
            acc[hh][2] = __fadd_rn(acc[hh][2], __fmul_rn(qa.z, f[2]));
            acc[hh][3] = __fadd_rn(acc[hh][3], __fmul_rn(qa.w, f[3]));
            acc[hh][4] = __fadd_rn(acc[hh][4], __fmul_rn(qb.x, f[4]));
            acc[hh][5] = __fadd_rn(acc[hh][5], __fmul_rn(qb.y, f[5]));
            acc[hh][6] = __fadd_rn(acc[hh][6], __fmul_rn(qb.z, f[6]));
            acc[hh][7] = __fadd_rn(acc[hh][7], __fmul_rn(qb.w, f[7]));
        }
}
__device__ __forceinline__ void cts_unit(float (&acc)[CTS_GM][8], const float *q, int D, int gm, int u, uint4 raw,
                                         const float *) {
    const float4 v = *(const float4 *)&raw;
    const int o = 4 * (u & 1);
#pragma unroll
    for (int hh = 0; hh < CTS_GM; hh++)
        if (hh < gm) {
            const float4 qa = *(const float4 *)(q + hh * D + 4 * u);
            acc[hh][o] = __fadd_rn(acc[hh][o], __fmul_rn(qa.x, v.x));
            acc[hh][o + 1] = __fadd_rn(acc[hh][o + 1], __fmul_rn(qa.y, v.y));
            acc[hh][o + 2] = __fadd_rn(acc[hh][o + 2], __fmul_rn(qa.z, v.z));
            acc[hh][o + 3] = __fadd_rn(acc[hh][o + 3], __fmul_rn(qa.w, v.w));
        }
}

/* The rerank's scores with coalesced key reads (rr = 1): each warp takes 32 keys of the set at a time; its
 * loads cover 4 whole 128-byte pieces of rows per instruction (lane l: unit l % 8 of row l / 8 + 4s), where
 * version 2's one-row-per-thread loads touch 32 rows per instruction; the units go through the warp's tile
 * (shared memory), and each thread then sums its own key exactly as cts_key_dots does (bitwise the same).
 * sc[hh * ncap + i] = scale * kv_dot_ref(q_hh, key sset[i]). Call from every thread (whole warps). */
template <typename TK>
__device__ __forceinline__ void cts_rerank_tiled(const float *sq, const int *sset, int n, const TK *Kg, int G, int D,
                                                 float scale, float *sc, int ncap, uint4 *tl) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, sub = lane >> 3, cu = lane & 7;
    const int nu = D * (int)sizeof(TK) / 16;
    tl += (size_t)w * 32 * (CTS_PU + 1);
#pragma unroll 1
    for (int i0 = w * 32; i0 < n; i0 += CTS_TH) { /* i0 is the same in the whole warp */
        const int i = i0 + lane;
#pragma unroll 1
        for (int h0 = 0; h0 < G; h0 += CTS_GM) {
            const int gm = G - h0 < CTS_GM ? G - h0 : CTS_GM;
            float acc[CTS_GM][8];
#pragma unroll
            for (int hh = 0; hh < CTS_GM; hh++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[hh][j] = 0.f;
#pragma unroll 1
            for (int u0 = 0; u0 < nu; u0 += 2 * CTS_PU) {
                uint4 v[2 * CTS_PU];
#pragma unroll
                for (int s = 0; s < 2 * CTS_PU; s++) { /* all of them in flight */
                    const int r = (s % CTS_PU) * 4 + sub, u = u0 + (s / CTS_PU) * CTS_PU + cu, ii = i0 + r;
                    v[s] = ii < n && u < nu ? __ldg((const uint4 *)(Kg + (size_t)sset[ii] * D) + u)
                                            : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const int ub = u0 + p * CTS_PU;
                    if (ub >= nu) break; /* the same in the whole warp */
                    __syncwarp();        /* the previous piece's reads are done */
#pragma unroll
                    for (int s = 0; s < CTS_PU; s++) tl[((s * 4 + sub) * (CTS_PU + 1)) + cu] = v[p * CTS_PU + s];
                    __syncwarp();
                    if (i < n)
#pragma unroll 1
                        for (int uu = 0; uu < CTS_PU; uu++)
                            if (ub + uu < nu)
                                cts_unit(acc, sq + h0 * D, D, gm, ub + uu, tl[lane * (CTS_PU + 1) + uu],
                                         (const TK *)nullptr);
                }
            }
            if (i < n)
#pragma unroll
                for (int hh = 0; hh < CTS_GM; hh++)
                    if (hh < gm)
                        sc[(size_t)(h0 + hh) * ncap + i] = __fmul_rn(
                            scale, __fadd_rn(__fadd_rn(__fadd_rn(acc[hh][0], acc[hh][4]), __fadd_rn(acc[hh][1], acc[hh][5])),
                                             __fadd_rn(__fadd_rn(acc[hh][2], acc[hh][6]), __fadd_rn(acc[hh][3], acc[hh][7]))));
        }
    }
}

__device__ __forceinline__ void cts_prefetch(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* Ranks of n items among themselves, larger key first, ties to the smaller id (id NULL: the item's
 * number): item i's rank goes to emit(i, r). Up to 32 adjacent lanes share an item's count. Call from
 * every thread of the block (the loop's trip count is the same in all: the shuffles need whole warps). */
template <class F> __device__ __forceinline__ void cts_rank(const unsigned *key, const int *id, int n, F &&emit) {
    const int bd = blockDim.x;
    int P = 1;
    while (P < 32 && 2 * P * n <= bd) P <<= 1;
#pragma unroll 1
    for (int t0 = 0; t0 < n * P; t0 += bd) {
        const int t = t0 + threadIdx.x, i = t / P, part = t % P;
        int r = 0;
        if (i < n) {
            const unsigned kt = key[i];
            const int it = id ? id[i] : i;
            for (int u = part; u < n; u += P) {
                const unsigned ku = key[u];
                const int iu = id ? id[u] : u;
                r += ku > kt || (ku == kt && iu < it);
            }
        }
        for (int o = 1; o < P; o <<= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
        if (i < n && part == 0) emit(i, r);
    }
}

/* The place of entry v of sorted list r among the entries of the other sorted lists j < cpe (list j at
 * L + j * rho, len[j] entries): those < v, and those == v in lists j < r (a stable merge). Binary lifting
 * from pw (the largest power of 2 <= rho), 4 lists in lockstep: each step reads the 4 probes first (a
 * probe past a list's end reads its first entry and is ignored), then decides, so the 4 shared loads are
 * in flight together (a guarded load per list, as before session 22, waited for each load in turn: the
 * merge took 5.6 us at 128K, session 21's trace). */
__device__ __forceinline__ int cts_place(const int *L, const int *len, int cpe, int rho, int r, int v, int pw) {
    int total = 0;
    for (int j0 = 0; j0 < cpe; j0 += 4) {
        int p[4], n[4];
        const int *Lj[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + u;
            n[u] = j < cpe && j != r ? len[j] : 0; /* 0: no probe is taken */
            Lj[u] = L + (size_t)(j < cpe ? j : 0) * rho - 1;
            p[u] = 0;
        }
        for (int step = pw; step > 0; step >>= 1) {
            int x[4];
#pragma unroll
            for (int u = 0; u < 4; u++) x[u] = Lj[u][p[u] + step <= n[u] ? p[u] + step : 1];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (p[u] + step <= n[u] && (x[u] < v || (j0 + u < r && x[u] == v))) p[u] += step;
        }
        total += p[0] + p[1] + p[2] + p[3];
    }
    return total;
}

/* Slice bx of the set of n keys: positions [n bx / nb, n (bx + 1) / nb). */
__device__ __forceinline__ int cts_cut(int n, int bx, int nb) { return (int)((long long)n * bx / nb); }

/* dist: a block of kv head g that is not its last to arrive waits for the last one's set (flag ctr[Hkv + g]),
 * scores its slice of it with cts_rerank_tiled (the same bits), writes them to gsc and counts itself in
 * ctr[2 Hkv + g]. The rerank is then ~1/nb of the set per SM instead of all of it on one (at 1M, ~1000 keys
 * x 256 B on one SM: ~8.6 us of the ~41 us search, KVBENCH_CTKVR_TRACE=1, H100, session 5). Every block
 * of the kv head is resident by then (it arrived), so the waits cannot deadlock. */
template <typename TK>
__device__ void cts_rerank_slice(const cts_args &a, int g, const float *sq, float *U, uint4 *tiles) {
    __shared__ int s_n;
    const int tid = threadIdx.x, Hkv = gridDim.y, G = a.G, D = a.D;
    if (tid == 0) { /* the flag is the set's size + 1 */
        unsigned f;
        while ((f = kv_ld_acquire(a.ctr + Hkv + g)) == 0) {
        }
        s_n = (int)f - 1;
    }
    __syncthreads();
    const int n = s_n, i0 = cts_cut(n, blockIdx.x, a.nb), m = cts_cut(n, blockIdx.x + 1, a.nb) - i0;
    int *ss = (int *)U;
    float *sl = (float *)(ss + m);
    for (int i = tid; i < m; i += CTS_TH) ss[i] = __ldcg(a.set + (size_t)g * a.setld + i0 + i);
    __syncthreads();
    cts_rerank_tiled<TK>(sq, ss, m, (const TK *)a.K + (size_t)g * a.T * D, G, D, a.scale, sl, m, tiles);
    __syncthreads();
    for (int e = tid; e < G * m; e += CTS_TH) {
        const int hh = e / m, i = e - hh * m;
        a.gsc[(size_t)(g * G + hh) * a.gld + i0 + i] = sl[e];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) atomicAdd(a.ctr + 2 * Hkv + g, 1u);
}

template <typename TK> __global__ void __launch_bounds__(CTS_TH) cts_search(cts_args a) {
    extern __shared__ __align__(16) float cts_sm[];
    __shared__ int sw[32];
    const int g = blockIdx.y, bx = blockIdx.x, tid = threadIdx.x, G = a.G, D = a.D, NW = CTS_TH / 32;
    float *sq = cts_sm;
    double *red = (double *)(sq + G * D), *slse = red + NW * G;
    float *smx = (float *)(slse + G);
    int *sslot = (int *)(smx + G), *slen = sslot + a.cpe;
    float *U = (float *)(slen + a.cpe); /* phase 1's arrays, then the tail's */
    cts_stamp(a.ts, CTS_T_START, g);
    const int nq = G * D;
    const float qv = tid < nq ? __ldg(a.q + (size_t)g * nq + tid) : 0.f; /* to sq once the slot loads are out */
    /* ---- phase 1: the cosines of the block's slots, its top cpb ---- */
    const int s0 = bx * a.spb, ns = a.C - s0 < a.spb ? a.C - s0 : a.spb;
    float *cvs = U;
    unsigned *bkey = (unsigned *)(cvs + a.spb * G);
    const int vld = tid < ns ? a.valid[s0 + tid] : 0;
    {
        const int h = tid & 1, pp = tid >> 1, sl = pp / G, hh = pp - sl * G, slot = s0 + sl;
        const bool on = sl < ns; /* off: reads slot 0's first row (the barrier inside needs every thread) */
        const float *cb = on ? a.cq + ((size_t)slot * a.Hq + g * G + hh) * D : a.cq;
        const float cn = on ? __ldg(a.cnorm + (size_t)slot * a.Hq + g * G + hh) : 0.f;
        const float2 r = cts_dot_pair(on ? sq + hh * D : sq, cb, D, h, [&]() {
            if (tid < nq) sq[tid] = qv;
            for (int i = tid + CTS_TH; i < nq; i += CTS_TH) sq[i] = a.q[(size_t)g * nq + i];
        });
        if (on && h == 0) {
            const float den = __fmul_rn(cn, __fsqrt_rn(r.y));
            cvs[sl * G + hh] = den > 0 ? __fdiv_rn(r.x, den) : 0.f;
        }
    }
    __syncthreads();
    if (tid < ns) {
        float best = -INFINITY;
        if (vld)
            for (int hh = 0; hh < G; hh++) {
                const float cv = cvs[tid * G + hh];
                best = cv > best ? cv : best;
            }
        bkey[tid] = kv_f2key(best);
    }
    __syncthreads();
    const size_t cbase = ((size_t)g * a.nb + bx) * a.cpb;
    cts_rank(bkey, nullptr, ns, [&](int i, int r) {
        if (r < a.cpb) {
            a.ckey[cbase + r] = bkey[i];
            a.cslot[cbase + r] = s0 + i;
            /* the tail's lists are among the blocks' candidates': bring this one's (and its length) to L2 */
            const char *row = (const char *)(a.lsrt + ((size_t)g * a.C + s0 + i) * a.rho);
            for (int b = 0; b < a.rho * 4; b += 128) cts_prefetch(row + b);
            cts_prefetch(a.lcnt + (size_t)g * a.C + s0 + i);
        }
    });
    if (tid >= ns && tid < a.cpb) { a.ckey[cbase + tid] = 0u; a.cslot[cbase + tid] = 0x7fffffff; } /* ranks < ns */
    cts_stamp(a.ts, CTS_T_ARRIVE, g);
    if (!kv_arrives_last(&a.ctr[g], a.nb)) {
        if (a.dist) cts_rerank_slice<TK>(a, g, sq, U, (uint4 *)((char *)cts_sm + a.tile_off));
        return;
    }
    if (tid == 0) a.ctr[g] = 0;
    /* ---- the exact top C' of the kv head from the blocks' candidates ---- */
    const int nc = a.nb * a.cpb, tcap = a.cpe * a.rho;
    unsigned *mk = (unsigned *)U;
    int *ms = (int *)(mk + nc), *L = ms + nc, *M = L + tcap, *sset = M + tcap;
    float *sc = (float *)(sset + a.ncap), *f = sc + (size_t)G * a.ncap;
    int *sel = (int *)(f + a.ncap);
    unsigned *hist = (unsigned *)(sel + a.kmax);
#pragma unroll 1
    for (int i = tid; i < nc; i += CTS_TH) {
        mk[i] = __ldcg(a.ckey + (size_t)g * nc + i);
        ms[i] = __ldcg(a.cslot + (size_t)g * nc + i);
    }
    __syncthreads();
    cts_rank(mk, ms, nc, [&](int i, int r) {
        if (r < a.cpe) sslot[r] = ms[i];
    });
    __syncthreads();
    cts_stamp(a.ts, CTS_T_TOPC, g);
    /* ---- gather: the C' sorted lists (one round of loads), their lengths ---- */
#pragma unroll 1
    for (int e = tid; e < tcap; e += CTS_TH) {
        const int r = e / a.rho, x = e - r * a.rho;
        L[e] = __ldg(a.lsrt + ((size_t)g * a.C + sslot[r]) * a.rho + x);
    }
    if (tid < a.cpe) {
        const int slot = sslot[tid];
        slen[tid] = a.valid[slot] ? a.lcnt[(size_t)g * a.C + slot] : 0;
        a.top[(size_t)g * a.cpe + tid] = slot;
    }
    __syncthreads();
    cts_stamp(a.ts, CTS_T_GATHER, g);
    /* merge: entry x of list r goes to x + (entries of earlier lists <= it) + (of later lists < it); the
     * keys the rerank will read are asked for (L2) on the way */
    const TK *Kg = (const TK *)a.K + (size_t)g * a.T * D;
    const int rowb = D * (int)sizeof(TK);
    for (int i = a.gen_lo + tid; i < a.hi; i += CTS_TH)
        if (a.pf)
            for (int b = 0; b < rowb; b += 128) cts_prefetch((const char *)(Kg + (size_t)i * D) + b);
    int pw = 1;
    while (2 * pw <= a.rho) pw <<= 1;
    int total = 0;
    for (int r = 0; r < a.cpe; r++) total += slen[r];
#pragma unroll 1
    for (int e = tid; e < tcap; e += CTS_TH) {
        const int r = e / a.rho, x = e - r * a.rho;
        if (x >= slen[r]) continue;
        const int v = L[e];
        if (a.pf && v >= a.lo && v < a.gen_lo)
            for (int b = 0; b < rowb; b += 128) cts_prefetch((const char *)(Kg + (size_t)v * D) + b);
        M[x + cts_place(L, slen, a.cpe, a.rho, r, v, pw)] = v;
    }
    __syncthreads();
    cts_stamp(a.ts, CTS_T_MERGE, g);
    /* distinct entries in [lo, gen_lo), in order, then [gen_lo, hi) */
    const int per = (total + CTS_TH - 1) / CTS_TH, i0 = tid * per < total ? tid * per : total,
              i1 = i0 + per < total ? i0 + per : total;
    int mine = 0;
#pragma unroll 1
    for (int i = i0; i < i1; i++) {
        const int v = M[i];
        mine += v >= a.lo && v < a.gen_lo && (i == 0 || M[i - 1] != v);
    }
    int base;
    int o = kv_block_scan(mine, &base, sw);
#pragma unroll 1
    for (int i = i0; i < i1; i++) {
        const int v = M[i];
        if (v >= a.lo && v < a.gen_lo && (i == 0 || M[i - 1] != v)) sset[o++] = v;
    }
#pragma unroll 1
    for (int i = a.gen_lo + tid; i < a.hi; i += CTS_TH) sset[base + i - a.gen_lo] = i;
    const int n = base + (a.hi > a.gen_lo ? a.hi - a.gen_lo : 0);
    __syncthreads();
    int32_t *out = a.set + (size_t)g * a.setld;
#pragma unroll 1
    for (int i = tid; i < n; i += CTS_TH) out[i] = sset[i];
    if (tid == 0) a.nset[g] = n;
    if (a.dist) { /* the set is out: the kv head's other blocks score their slices of it */
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicExch(a.ctr + gridDim.y + g, (unsigned)n + 1u);
    }
    cts_stamp(a.ts, CTS_T_SET, g);
    /* ---- rerank: the set's scores (kv_dot_ref, bitwise), per head max and double sum of exp ---- */
    if (a.dist) { /* this block's slice here, the others' from gsc once all have counted themselves */
        const int i0 = cts_cut(n, bx, a.nb), i1 = cts_cut(n, bx + 1, a.nb);
        cts_rerank_tiled<TK>(sq, sset + i0, i1 - i0, Kg, G, D, a.scale, sc + i0, a.ncap,
                             (uint4 *)((char *)cts_sm + a.tile_off));
        if (tid == 0) {
            while (kv_ld_acquire(a.ctr + 2 * gridDim.y + g) < (unsigned)(a.nb - 1)) {
            }
            a.ctr[gridDim.y + g] = 0; /* every other block has read the flag: ready for the next launch */
            a.ctr[2 * gridDim.y + g] = 0;
        }
        __syncthreads();
#pragma unroll 1
        for (int hh = 0; hh < G; hh++)
#pragma unroll 1
            for (int i = tid; i < n; i += CTS_TH)
                if (i < i0 || i >= i1) sc[(size_t)hh * a.ncap + i] = __ldcg(a.gsc + (size_t)(g * G + hh) * a.gld + i);
    } else if (a.rr) { /* version 3 */
        cts_rerank_tiled<TK>(sq, sset, n, Kg, G, D, a.scale, sc, a.ncap, (uint4 *)((char *)cts_sm + a.tile_off));
    } else { /* version 2 */
        for (int i = tid; i < n; i += CTS_TH) {
            const TK *kr = Kg + (size_t)sset[i] * D;
            for (int h0 = 0; h0 < G; h0 += CTS_GM) {
                float d[CTS_GM];
                const int gm = G - h0 < CTS_GM ? G - h0 : CTS_GM;
                cts_key_dots(sq + h0 * D, D, gm, kr, d);
#pragma unroll
                for (int hh = 0; hh < CTS_GM; hh++)
                    if (hh < gm) sc[(size_t)(h0 + hh) * a.ncap + i] = __fmul_rn(a.scale, d[hh]);
            }
        }
    }
    __syncthreads();
    cts_stamp(a.ts, CTS_T_SCORES, g);
    const int lane = tid & 31, w = tid >> 5;
#pragma unroll 1
    for (int hh = 0; hh < G; hh++) {
        float mx = -INFINITY;
#pragma unroll 1
        for (int i = tid; i < n; i += CTS_TH) mx = fmaxf(mx, sc[(size_t)hh * a.ncap + i]);
        for (int o2 = 16; o2; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
        if (lane == 0) red[w * G + hh] = mx;
    }
    __syncthreads();
    if (tid < G) {
        float mx = -INFINITY;
        for (int x = 0; x < NW; x++) mx = fmaxf(mx, (float)red[x * G + tid]);
        smx[tid] = mx;
    }
    __syncthreads();
#pragma unroll 1
    for (int hh = 0; hh < G; hh++) {
        const double mx = (double)smx[hh];
        double z = 0;
#pragma unroll 1
        for (int i = tid; i < n; i += CTS_TH) z += exp((double)sc[(size_t)hh * a.ncap + i] - mx);
        for (int o2 = 16; o2; o2 >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o2);
        if (lane == 0) red[w * G + hh] = z;
    }
    __syncthreads();
    if (tid < G) {
        double z = 0;
        for (int x = 0; x < NW; x++) z += red[x * G + tid];
        slse[tid] = n > 0 ? (double)smx[tid] + log(z) : 0.0;
    }
    __syncthreads();
#pragma unroll 1
    for (int i = tid; i < n; i += CTS_TH) {
        float best = -INFINITY;
#pragma unroll 1
        for (int hh = 0; hh < G; hh++) {
            const float v = (float)((double)sc[(size_t)hh * a.ncap + i] - slse[hh]);
            best = v > best ? v : best;
        }
        f[i] = best;
    }
    __syncthreads();
    cts_stamp(a.ts, CTS_T_LSE, g);
    /* ---- top k and DCU's top rho (positions in the set): one ranking of the longer, the shorter its prefix
     * (the same strict order, larger first and ties to the smaller position; session 22: two selections
     * until then, the second 13 us of the run's search at 128K) ---- */
    const int kt = a.k < n ? a.k : n, kr = a.krho > 0 ? (a.krho < n ? a.krho : n) : 0;
    int32_t *ot = a.oidx + (size_t)g * KV_GPU_TOPK_MAX, *od = a.odcu + (size_t)g * a.rho;
    const bool rl = kr > kt; /* DCU's list is the longer */
    int32_t *full = rl ? od : ot, *pre = rl ? ot : od;
    const int npre = rl ? kt : kr;
    kv_block_topk(f, n, rl ? kr : kt, full, sel, hist, sw); /* ends with a barrier: full is visible */
    cts_stamp(a.ts, CTS_T_TOPK, g);
    for (int j = tid; j < npre; j += CTS_TH) pre[j] = full[j];
    cts_stamp(a.ts, CTS_T_END, g);
}

/* lsrt[g][slot] = lidx[g][slot]'s first lcnt entries in ascending order, for the slots slot0 + blockIdx.x
 * (grid (slots, Hkv)); rank counting, ties (none in a list) by position. Shared: CT_SL_SMEM(rho), rho ints
 * and 4 of slack: ptxas merges the counting loop's guarded tail loads into one 12-byte read that may reach
 * past the last entry (compute-sanitizer memcheck flagged it at rho = 50, H100, session 5). */
#define CT_SL_SMEM(rho) ((size_t)((rho) + 4) * sizeof(int32_t))
__global__ void ct_sort_lists(const int32_t *lidx, const int *lcnt, int C, int rho, int slot0, int32_t *lsrt) {
    extern __shared__ int32_t ct_sl[];
    const int g = blockIdx.y, slot = slot0 + blockIdx.x;
    const size_t base = ((size_t)g * C + slot) * rho;
    const int n = lcnt[(size_t)g * C + slot];
    for (int i = threadIdx.x; i < n; i += blockDim.x) ct_sl[i] = lidx[base + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int v = ct_sl[i];
        int r = 0;
        for (int u = 0; u < n; u++) r += ct_sl[u] < v || (ct_sl[u] == v && u < i);
        lsrt[base + r] = v;
    }
}
