/* csattention_pipe.cuh: CSAttention's decode reduce-by-key as a PIPELINED
 * tiled shared-memory accumulator, the default search (issue 9, point 4;
 * included by csattention.cu inside its anonymous namespace after
 * csattention_tile.cuh, whose by-key views, range search cs_lower, argument
 * block and candidate layout it shares).
 *
 * Why: the staged tile kernel (csattention_tile.cuh, KVBENCH_CS_REDUCE=
 * staged) copies each tile's list entries through registers into a 48 KB
 * window, four 4-B loads per thread in flight, so a block spends most of its
 * life on a chain of dependent phases, and only 3 blocks of ~66 KB fit an
 * SM: 380 us for the tiles at 1M tokens on the H100, 24% of the copy rate,
 * plus 30 us for the shared cooperative top-k over the candidates.
 * Here the entries move by cp.async (16 B an instruction, global to shared
 * memory, no registers) through a ring of NB buffers of CAP entries (index
 * + score; 1024 x 4 by default, KVBENCH_CS_RING=2048x3|512x6): while the
 * block accumulates piece j, pieces j + 1 .. j + NB - 1 are in flight (24 KB
 * a block), and the smaller footprint (32 KB ring + the 16 KB accumulator at
 * 4096 keys) lets 4 blocks of 512 threads share an SM. The pieces cut the
 * flattened sequence of the m list ranges (range b = the positions [p0, p1)
 * of keys in [t0, t1), rounded out to 16 B; the rounded-in entries are never
 * read back and their copies stay inside the list's row, VL being a multiple
 * of 4). Entries are accumulated in subspace order with a barrier after
 * each subspace, so every key gets the CPU's additions in the CPU's order
 * (keys are distinct within a list: no atomics); missing=min first marks the
 * union (an index-only pass), then per subspace stamps the values and adds
 * w_b (v or the list's minimum) to every union key, as the staged kernel.
 * The ranges are searched by each block (cs_lower, ~4 dependent loads), or
 * precomputed for every tile by one launch (cs_bounds, KVBENCH_CS_BOUNDS=1).
 * Candidates: a per-row bound (thr, kv_f2key, zeroed by cs_nearest,
 * KVBENCH_CS_THR=0 turns it off) of the row's k-th best, the smallest of
 * ns slots (KVBENCH_CS_SLOTS, default 8; 1 = the previous single bound): a
 * tile that runs the full selection (kv_block_topk, the staged kernel's)
 * publishes its kq-th best (kq = ceil(k / ns)) into slot tile % ns by
 * atomicMax; the ns slots come from ns disjoint sets of tiles, so at least
 * ns x kq >= k keys of the row reach their smallest. Why: one tile's k-th
 * best (the single bound) is about the row's k x 256-th best at 256 tiles,
 * so a later tile still holds ~k keys above it and most tiles either emit
 * ~k candidates or run the selection; the 8 slots' bound is a tile's
 * 13th best instead (the device has not timed it yet: scripts/dev/s5-cs.sh
 * compares both in one call). A later tile
 * with at most k keys at or above the bound emits exactly those (a key
 * below it has k keys above it, so it is in no top k) in key order, and
 * skips the selection; tiles run row-fastest (grid (rows, tiles)) so every
 * row has finished tiles early. Exact whatever the timing: the bound only
 * ever rises and is always a true lower bound. The candidates' top k is one
 * block per row (cs_merge: the row's nt x k slots in shared memory,
 * kv_block_topk ranked, ties to the smaller position = the smaller key),
 * instead of the shared cooperative top-k, while the row fits in shared
 * memory. Tile and block size: KVBENCH_CS_TK (2048 | 4096 | 8192 keys) and
 * KVBENCH_CS_TH (256 | 512). Bytes per row: the staged kernel's, m x L x 8 B
 * (16 B per region key at m = 8, alpha = 0.25), plus at most 24 B of
 * rounding per list and tile (0.05 B per key at 4096 keys), the k x 8 B
 * candidate slots per tile written and read (0.4 B per key at k = 100), and
 * missing=min's second read of the indices (+4 B per entry). The defaults
 * (4096 x 512, ring 1024 x 4, bound on, ranges searched) are the design's
 * guess: KVBENCH_CS_SWEEP=1 (csattention_bench.cuh) times every variant
 * against the dense path, and no GPU run of this file has been made yet. */

constexpr int CS_KCAP = 2048, CS_MTH = 1024;
/* The row bound's slots: at most CS_SMAX a row (KVBENCH_CS_SLOTS, default CS_NSLOT; 1 = the single bound). */
constexpr int CS_SMAX = 16, CS_NSLOT = 8;
/* The ring geometries (entries a buffer x buffers) KVBENCH_CS_RING selects: 1024x4 (default), 2048x3, 512x6. */
constexpr int CS_RINGS[3][2] = {{1024, 4}, {2048, 3}, {512, 6}};

__device__ __forceinline__ void cs_cp16(void *s, const void *g) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g));
}
__device__ __forceinline__ void cs_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cs_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Dynamic shared memory of cs_pipe: the ring (index + score), acc [tk], val [tk] (missing=min), the histogram. */
inline size_t cs_pipe_smem(int tk, int missing, int ring) {
    return (size_t)CS_RINGS[ring][0] * CS_RINGS[ring][1] * 8 + (size_t)tk * (missing == 1 ? 8 : 4) + 260 * 4;
}

/* Per row, subspace and tile boundary t (key min(lo + t tk, hi), t <= nt): the first position of the gathered
 * list's view at or above it, bnd[(r m + b) nt1 + t], one warp each (KVBENCH_CS_BOUNDS=1: the tiles read
 * their ranges instead of searching). */
__global__ void cs_bounds(const int32_t *vidx, const int *vcnt, long long VL, const int *jl, int R, int m, int lo,
                          int hi, int tk, int nt1, int *bnd) {
    const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= R * m * nt1) return; /* whole warps */
    const int rb = w / nt1, t = w % nt1, li = jl[rb];
    const long long key = (long long)lo + (long long)t * tk;
    const int p = cs_lower(vidx + (size_t)li * VL, vcnt[li], key < hi ? (int)key : hi);
    if ((threadIdx.x & 31) == 0) bnd[w] = p;
}

template <int TH, int CAP, int NB> __global__ void __launch_bounds__(TH, 2048 / TH) cs_pipe(cs_tile_args a) {
    extern __shared__ __align__(16) float cs_psm[];
    int32_t *bidx = (int32_t *)cs_psm;
    float *bval = cs_psm + NB * CAP;
    float *acc = bval + NB * CAP, *val = acc + a.tk; /* val only with missing=min */
    unsigned *hist = (unsigned *)(acc + (a.missing == 1 ? 2 : 1) * a.tk);
    __shared__ int rng[2 * CS_MMAX], fq[CS_MMAX + 1], sli[CS_MMAX], sw[32], sbase;
    __shared__ unsigned sthr, smax;
    __shared__ float sws[CS_MMAX], smn[CS_MMAX];
    const int r = blockIdx.x, tile = blockIdx.y, tid = threadIdx.x, m = a.m, TK = a.tk;
    const int t0 = a.lo + tile * TK, t1 = t0 + TK < a.hi ? t0 + TK : a.hi, tl = t1 - t0;
    if (tid < m) {
        const int li = a.jl[r * m + tid];
        sli[tid] = li;
        sws[tid] = a.wb[r * m + tid];
        smn[tid] = a.lcnt[li] ? a.lval[(size_t)li * a.L] : 0.f; /* heap root = the list's minimum */
    }
    for (int x = tid; x < TK; x += TH) {
        acc[x] = -INFINITY;
        if (a.missing == 1) val[x] = NAN;
    }
    __syncthreads();
    if (a.bnd) {
        if (tid < 2 * m) rng[tid] = a.bnd[(size_t)(r * m + (tid >> 1)) * a.nt1 + tile + (tid & 1)];
    } else
        for (int s = tid >> 5; s < 2 * m; s += TH >> 5) {
            const int li = sli[s >> 1];
            const int p = cs_lower(a.vidx + (size_t)li * a.VL, a.vcnt[li], (s & 1) ? t1 : t0);
            if ((tid & 31) == 0) rng[s] = p;
        }
    __syncthreads();
    if (tid == 0) { /* the flattened sequence: list b's range rounded out to 4 entries at [fq[b], fq[b + 1]) */
        fq[0] = 0;
        for (int b = 0; b < m; b++) {
            const int p0 = rng[2 * b], p1 = rng[2 * b + 1];
            fq[b + 1] = fq[b] + (p1 > p0 ? ((p1 + 3) & ~3) - (p0 & ~3) : 0);
        }
    }
    __syncthreads();
    const int F = fq[m], np = (F + CAP - 1) / CAP, nv = (a.missing == 1 ? 2 : 1) * np;
    /* piece j = flattened entries [jj CAP, jj CAP + CAP) (jj = j, or j - np in missing=min's second pass,
     * whose first pass copies the indices alone), into buffer j % NBUF; one commit group a call */
    auto issue = [&](int j) {
        if (j < nv) {
            const int jj = j >= np ? j - np : j, f0 = jj * CAP, buf = j % NB;
            const int nq = (F - f0 < CAP ? F - f0 : CAP) >> 2, nall = a.missing == 1 && j < np ? nq : 2 * nq;
            int b = 0, fp = f0; /* f rises with q except at the index/score turn: the list walk resumes */
            for (int q = tid; q < nall; q += TH) {
                const int qq = q < nq ? q : q - nq, f = f0 + 4 * qq;
                if (f < fp) b = 0;
                fp = f;
                while (fq[b + 1] <= f) b++;
                const size_t src = (size_t)sli[b] * a.VL + (rng[2 * b] & ~3) + (f - fq[b]);
                if (q < nq) cs_cp16(bidx + buf * CAP + 4 * qq, a.vidx + src);
                else cs_cp16(bval + buf * CAP + 4 * qq, a.vval + src);
            }
        }
        cs_cp_commit();
    };
    int cur = -1;
    auto take = [&](int j) { /* piece j resident for everyone; earlier pieces done, their buffers refilled */
        while (cur < j) {
            ++cur;
            cs_cp_wait<NB - 2>();
            __syncthreads();
            issue(cur + NB - 1);
        }
    };
    for (int j = 0; j < NB - 1; j++) issue(j);
    for (int pass = a.missing == 1 ? 0 : 1; pass < 2; pass++) {
        const int poff = pass == 1 && a.missing == 1 ? np : 0;
        for (int b = 0; b < m; b++) {
            const int fb = fq[b], fe_b = fq[b + 1], A0 = rng[2 * b] & ~3;
            const int v0b = fb + rng[2 * b] - A0, v1b = fb + rng[2 * b + 1] - A0; /* the range proper */
            const float w = sws[b];
            for (int f = fb; f < fe_b;) {
                const int jj = f / CAP, fe = fe_b < (jj + 1) * CAP ? fe_b : (jj + 1) * CAP;
                take(poff + jj);
                const int buf = (poff + jj) % NB, v0 = f > v0b ? f : v0b, v1 = fe < v1b ? fe : v1b;
                const int32_t *si = bidx + buf * CAP;
                const float *sv = bval + buf * CAP;
                for (int x = v0 + tid - jj * CAP; x < v1 - jj * CAP; x += TH) {
                    const int32_t i = si[x];
                    if (i < 0) continue; /* tombstone */
                    if (pass == 0) acc[i - t0] = 0.f; /* missing=min: the union, acc = 0 */
                    else if (a.missing == 1) val[i - t0] = sv[x];
                    else {
                        const float o = acc[i - t0];
                        acc[i - t0] = __fadd_rn(o == -INFINITY ? 0.f : o, __fmul_rn(w, sv[x]));
                    }
                }
                f = fe;
            }
            if (pass == 1) {
                __syncthreads(); /* subspace order */
                if (a.missing == 1) {
                    const float mn = smn[b];
                    for (int x = tid; x < tl; x += TH) {
                        const float o = acc[x];
                        if (o != -INFINITY) acc[x] = __fadd_rn(o, __fmul_rn(w, isnan(val[x]) ? mn : val[x]));
                        val[x] = NAN;
                    }
                    __syncthreads();
                }
            }
        }
    }
    cs_cp_wait<0>();
    /* the gathered keys (counted, listed when asked) and those at or above the row's bound, each thread a
     * contiguous segment; both counts in one scan (each below 2^16) */
    if (tid == 0) { /* the row's bound: the smallest of its ns slots */
        unsigned t = a.thr ? 0xffffffffu : 0u;
        for (int s = 0; a.thr && s < a.ns; s++) {
            const unsigned v = *(volatile unsigned *)(a.thr + (size_t)r * CS_SMAX + s);
            t = v < t ? v : t;
        }
        sthr = t;
        smax = 0u;
    }
    __syncthreads();
    const unsigned T = sthr;
    const int kt = a.k < tl ? a.k : tl;
    const int per = (tl + TH - 1) / TH, x0 = tid * per, x1 = x0 + per < tl ? x0 + per : tl;
    int nf = 0, nc = 0;
    for (int x = x0; x < x1; x++) {
        const float v = acc[x];
        nf += v != -INFINITY;
        nc += kv_f2key(v) >= T;
    }
    int tot;
    const int ex = kv_block_scan(nf | nc << 16, &tot, sw), totf = tot & 0xffff, totc = tot >> 16;
    if (tid == 0) sbase = totf ? atomicAdd(a.nu + r, totf) : 0;
    __syncthreads();
    if (a.u)
        for (int x = x0, e = sbase + (ex & 0xffff); x < x1; x++)
            if (acc[x] != -INFINITY) a.u[(size_t)r * a.uld + e++] = t0 + x;
    float *ov = a.cv + (size_t)r * a.cld + (size_t)tile * a.k;
    int32_t *oi = a.ci + (size_t)r * a.cld + (size_t)tile * a.k;
    if (totc <= kt) { /* every key that can be in the row's top k: all of them, in key order */
        for (int x = x0, e = ex >> 16; x < x1; x++)
            if (kv_f2key(acc[x]) >= T) { ov[e] = acc[x]; oi[e] = t0 + x; e++; }
        for (int x = totc + tid; x < a.k; x += TH) { ov[x] = -INFINITY; oi[x] = -1; }
        return;
    }
    /* the tile's top min(k, tl), padded to k; its weakest bounds the row's k-th best from below */
    int32_t *pos = bidx + CS_KCAP;
    kv_block_topk(acc, tl, kt, pos, bidx, hist, sw, false); /* position order = key order */
    for (int x = tid; x < a.k; x += TH) {
        ov[x] = x < kt ? acc[pos[x]] : -INFINITY;
        oi[x] = x < kt ? t0 + pos[x] : -1;
    }
    if (!a.thr) return;
    /* the tile's kq-th best (kq = ceil(k / ns)): the largest selected key with at least kq selected keys at or
     * above it, into its class's slot (tile % ns) */
    const int kq = (a.k + a.ns - 1) / a.ns;
    for (int x = tid; x < kt; x += TH) {
        const unsigned kx = kv_f2key(acc[pos[x]]);
        int ge = 0;
        for (int i = 0; i < kt; i++) ge += kv_f2key(acc[pos[i]]) >= kx;
        if (ge >= kq) atomicMax(&smax, kx);
    }
    __syncthreads();
    if (tid == 0 && smax) atomicMax(a.thr + (size_t)r * CS_SMAX + tile % a.ns, smax);
}

/* Dynamic shared memory of cs_merge for nc candidates and kk outputs. */
inline size_t cs_merge_smem(long long nc, int kk) { return (size_t)nc * 4 + (size_t)kk * 8 + 260 * 4; }

/* One block per row: oidx[r*kk + j] = the key of the j-th best of the row's nc candidates (kv_topk_ref order:
 * ties to the smaller position, which is the smaller key). */
__global__ void __launch_bounds__(CS_MTH) cs_merge(const float *cv, const int32_t *ci, long long cld, int nc, int kk,
                                                   int32_t *oidx) {
    extern __shared__ __align__(16) float cs_msm[];
    float *v = cs_msm;
    int32_t *pos = (int32_t *)(v + nc), *sel = pos + kk;
    unsigned *hist = (unsigned *)(sel + kk);
    __shared__ int sw[32];
    const int r = blockIdx.x;
    const float *row = cv + (size_t)r * cld;
    if ((cld & 3) == 0 && (nc & 3) == 0)
        for (int i = threadIdx.x; i < nc / 4; i += CS_MTH) ((float4 *)v)[i] = __ldcg((const float4 *)row + i);
    else
        for (int i = threadIdx.x; i < nc; i += CS_MTH) v[i] = __ldcg(row + i);
    __syncthreads();
    kv_block_topk(v, nc, kk, pos, sel, hist, sw, true);
    for (int j = threadIdx.x; j < kk; j += CS_MTH) oidx[(size_t)r * kk + j] = ci[(size_t)r * cld + pos[j]];
}
