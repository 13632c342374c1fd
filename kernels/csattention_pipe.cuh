/* csattention_pipe.cuh: CSAttention's decode reduce-by-key as a PIPELINED
 * tiled shared-memory accumulator, the default search until session 11,
 * KVBENCH_CS_REDUCE=tiled since (the bit view of csattention_bits.cuh
 * replaced it; issue 9, point 4; included by csattention.cu inside its
 * anonymous namespace after csattention_tile.cuh, whose by-key views, range
 * search cs_lower, argument block and candidate layout it shares).
 *
 * Why: the staged tile kernel (csattention_tile.cuh, KVBENCH_CS_REDUCE=
 * staged) copies each tile's list entries through registers into a 48 KB
 * window, four 4-B loads per thread in flight, so a block spends most of its
 * life on a chain of dependent phases, and only 3 blocks of ~66 KB fit an
 * SM: 380 us for the tiles at 1M tokens on the H100, 24% of the copy rate,
 * plus 30 us for the shared cooperative top-k over the candidates.
 * Here the entries move by the bulk copy engine (cp.async.bulk, global to
 * shared memory completing on the buffer's mbarrier: thread 0 issues one
 * copy per list range and array a piece meets, instead of one 16-B cp.async
 * per thread and chunk, whose source address search was ~35% of the
 * kernel's instructions; KVBENCH_CS_BULK=0 keeps the cp.async form, ring
 * 1024 x 4 and 512 threads only) through a ring of NB buffers of CAP
 * entries (index + score; 2048 x 3 by default, KVBENCH_CS_RING=1024x4|
 * 512x6): while the
 * block accumulates piece j, pieces j + 1 .. j + NB - 1 are in flight (32 KB
 * a block at 2048 x 3), and the footprint (48 KB ring + the 16 KB
 * accumulator at 4096 keys) lets 3 blocks of 512 threads share an SM (4 with
 * the 32 KB ring of 1024 x 4). The pieces cut the
 * flattened sequence of the m list ranges (range b = the positions [p0, p1)
 * of keys in [t0, t1), rounded out to 16 B; the rounded-in entries are never
 * read back and their copies stay inside the list's row, VL being a multiple
 * of 4). Entries are accumulated in subspace order with a barrier after
 * each subspace, so every key gets the CPU's additions in the CPU's order
 * (keys are distinct within a list: no atomics); missing=min first marks the
 * union (an index-only pass), then per subspace stamps the values and adds
 * w_b (v or the list's minimum) to every union key, as the staged kernel.
 * The ranges are precomputed for every tile by one launch (cs_bounds), or
 * searched by each block (cs_lower, ~4 dependent loads; KVBENCH_CS_BOUNDS=0).
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
 * 13th best instead (H100, 1M tokens, session 6: search 296.3 vs 295.0 us
 * with one slot, the same within noise; kept, it is never looser). A
 * later tile
 * with at most k keys at or above the bound emits exactly those (a key
 * below it has k keys above it, so it is in no top k) in key order, and
 * skips the selection; tiles run row-fastest (grid (rows, tiles)) so every
 * row has finished tiles early. Exact whatever the timing: the bound only
 * ever rises and is always a true lower bound. The candidates' top k is
 * cs_merge (segments of ~1024 of a row's nt x k slots, one block each, then
 * the row's last block ranks the segments' winners; ties to the smaller
 * position = the smaller key) instead of the shared cooperative top-k.
 * Tile and block size: KVBENCH_CS_TK (2048 | 4096 | 8192 keys) and
 * KVBENCH_CS_TH (256 | 512). Bytes per row: the staged kernel's, m x L x 8 B
 * (16 B per region key at m = 8, alpha = 0.25), plus at most 24 B of
 * rounding per list and tile (0.05 B per key at 4096 keys), the k x 8 B
 * candidate slots per tile written and read (0.4 B per key at k = 100), and
 * missing=min's second read of the indices (+4 B per entry). The defaults
 * (4096 keys x 512 threads, ring 2048 x 3, bound on, ranges precomputed
 * by cs_bounds) are the fastest of KVBENCH_CS_SWEEP=1's variants
 * (csattention_bench.cuh, every tiling timed against the dense path) at 1M
 * tokens, and no slower at 16K and 128K (H100, session 6: 51.1 / 81.5 /
 * 256.0 us against ring 1024 x 4 with searched ranges' 51.3 / 82.5 /
 * 268.8 in the same call; KVBENCH_CS_RING, KVBENCH_CS_BOUNDS=0 restore it). Where the time is (ncu, session 6,
 * 1M tokens): the tiles 234 us, issue-bound (2.7 IPC, DRAM 21%), most of
 * it the per-(list, piece) loop set-up and the subspace barriers; the merge
 * ~27 us whatever its block shape (one block a row of 1024 threads, or
 * segments of 1024 or 256 threads: 29.2 / 27.2 us), not yet understood.
 * Tried and slower (session 6): tiles whose threads each own a run of keys
 * and add them barrier-free after the whole tile's lists are copied (415
 * against 260 us at 1M: the copies no longer stream; results/
 * gpu-cost-h100.md, session 6 call 10). */

constexpr int CS_KCAP = 2048, CS_MTH = 256; /* cs_merge threads a block */
/* The row bound's slots: at most CS_SMAX a row (KVBENCH_CS_SLOTS, default CS_NSLOT; 1 = the single bound). */
constexpr int CS_SMAX = 16, CS_NSLOT = 8;
/* The ring geometries (entries a buffer x buffers) KVBENCH_CS_RING selects: 1024x4, 2048x3 (the default at 512
 * threads with bulk copies), 512x6. */
constexpr int CS_RINGS[3][2] = {{1024, 4}, {2048, 3}, {512, 6}};

__device__ __forceinline__ void cs_cp16(void *s, const void *g) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g));
}
__device__ __forceinline__ void cs_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cs_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
/* The bulk copy engine (cs_pipe's BULK form): one thread copies a list range's piece of any multiple of 16 B,
 * completing on the buffer's mbarrier (expect_tx of the piece's bytes, then parity waits). */
__device__ __forceinline__ unsigned cs_sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cs_bar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(cs_sa(bar)) : "memory");
}
__device__ __forceinline__ void cs_bar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(cs_sa(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cs_bulk(void *s, const void *g, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     cs_sa(s)),
                 "l"(g), "r"(bytes), "r"(cs_sa(bar))
                 : "memory");
}
__device__ __forceinline__ void cs_bar_wait(uint64_t *bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(cs_sa(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}

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

template <int TH, int CAP, int NB, bool BULK> __global__ void __launch_bounds__(TH, 2048 / TH) cs_pipe(cs_tile_args a) {
    extern __shared__ __align__(16) float cs_psm[];
    int32_t *bidx = (int32_t *)cs_psm;
    float *bval = cs_psm + NB * CAP;
    float *acc = bval + NB * CAP, *val = acc + a.tk; /* val only with missing=min */
    unsigned *hist = (unsigned *)(acc + (a.missing == 1 ? 2 : 1) * a.tk);
    __shared__ int rng[2 * CS_MMAX], fq[CS_MMAX + 1], sli[CS_MMAX], sw[32], sbase;
    __shared__ unsigned sthr, smax;
    __shared__ float sws[CS_MMAX], smn[CS_MMAX];
    __shared__ uint64_t sbar[NB];
    const int r = blockIdx.x, tile = blockIdx.y, tid = threadIdx.x, m = a.m, TK = a.tk;
    const int t0 = a.lo + tile * TK, t1 = t0 + TK < a.hi ? t0 + TK : a.hi, tl = t1 - t0;
    if (BULK && tid == 0) {
        for (int i = 0; i < NB; i++) cs_bar_init(sbar + i);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
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
     * whose first pass copies the indices alone), into buffer j % NBUF; cp.async: one commit group a call */
    auto issue = [&](int j) {
        if (BULK) { /* thread 0: one bulk copy per list range (and array) the piece meets */
            if (j >= nv || tid != 0) return;
            const int jj = j >= np ? j - np : j, f0 = jj * CAP, buf = j % NB, fe = F - f0 < CAP ? F : f0 + CAP;
            const bool ionly = a.missing == 1 && j < np;
            cs_bar_expect(sbar + buf, (unsigned)(fe - f0) * (ionly ? 4u : 8u));
            for (int b = 0; b < m; b++) {
                const int x0 = fq[b] > f0 ? fq[b] : f0, x1 = fq[b + 1] < fe ? fq[b + 1] : fe;
                if (x0 >= x1) continue;
                const size_t src = (size_t)sli[b] * a.VL + (rng[2 * b] & ~3) + (x0 - fq[b]);
                cs_bulk(bidx + buf * CAP + (x0 - f0), a.vidx + src, 4u * (x1 - x0), sbar + buf);
                if (!ionly) cs_bulk(bval + buf * CAP + (x0 - f0), a.vval + src, 4u * (x1 - x0), sbar + buf);
            }
            return;
        }
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
            if (BULK) cs_bar_wait(sbar + cur % NB, (cur / NB) & 1);
            else cs_cp_wait<NB - 2>();
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
#pragma unroll 1 /* about len / TH entries a thread: an unrolled loop's set-up costs more than it saves */
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
    if (BULK) /* the pieces issued and never taken */
        for (int j = cur + 1; j < nv && j < cur + NB; j++) cs_bar_wait(sbar + j % NB, (j / NB) & 1);
    else cs_cp_wait<0>();
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

/* cs_merge's segments a row: about 1024 candidates each, at most CS_MSEG. */
constexpr int CS_MSEG = 32;
inline int cs_merge_nseg(long long nc) {
    const long long s = nc / 1024;
    return s < 1 ? 1 : s > CS_MSEG ? CS_MSEG : (int)s;
}
/* Dynamic shared memory of cs_merge for nc candidates in ns segments and kk outputs. */
inline size_t cs_merge_smem(long long nc, int ns, int kk) {
    const long long seg = (nc + ns - 1) / ns, last = (long long)ns * kk;
    return (size_t)(seg > last ? seg : last) * 4 + (size_t)kk * 8 + 260 * 4;
}

/* Blocks (r, s), ns a row: oidx[r*kk + j] = the key of the j-th best of row r's nc candidates (kv_topk_ref
 * order: ties to the smaller position, which is the smaller key). Block s selects the kk best of its segment
 * of the row in position order (mv/mk [r][s][kk]); the last block of the row to finish (mctr[r], back to zero
 * after) ranks the ns x kk, whose concatenation keeps the row's position order. Why: one block per row had
 * the row's 256 x k candidates at 1M tokens to rank on 16 SMs; measured, the segments gain little (27.2 against
 * 29.2 us, H100, session 6) but no row has to fit one block's shared memory any more. */
__global__ void __launch_bounds__(CS_MTH) cs_merge(const float *cv, const int32_t *ci, long long cld, int nc, int kk,
                                                   float *mv, int32_t *mk, unsigned *mctr, int32_t *oidx) {
    extern __shared__ __align__(16) float cs_msm[];
    __shared__ int sw[32];
    const int r = blockIdx.x, s = blockIdx.y, ns = gridDim.y, tid = threadIdx.x;
    const int seg = (nc + ns - 1) / ns, a0 = s * seg, n = nc - a0 < seg ? nc - a0 : seg;
    const int ks = kk < n ? kk : n, nl = ns * kk;
    float *v = cs_msm;
    int32_t *pos = (int32_t *)(v + (seg > nl ? seg : nl)), *sel = pos + kk;
    unsigned *hist = (unsigned *)(sel + kk);
    const float *row = cv + (size_t)r * cld + a0;
    const int32_t *crow = ci + (size_t)r * cld + a0;
    for (int i = tid; i < n; i += CS_MTH) v[i] = __ldcg(row + i);
    __syncthreads();
    kv_block_topk(v, n, ks, pos, sel, hist, sw, false);
    const size_t o = ((size_t)r * ns + s) * kk;
    for (int j = tid; j < kk; j += CS_MTH) {
        mv[o + j] = j < ks ? v[pos[j]] : -INFINITY;
        mk[o + j] = j < ks ? __ldcg(crow + pos[j]) : -1;
    }
    if (!kv_arrives_last(mctr + r, ns)) return;
    for (int i = tid; i < nl; i += CS_MTH) v[i] = __ldcg(mv + (size_t)r * nl + i);
    __syncthreads();
    kv_block_topk(v, nl, kk, pos, sel, hist, sw, true);
    for (int j = tid; j < kk; j += CS_MTH) oidx[(size_t)r * kk + j] = __ldcg(mk + (size_t)r * nl + pos[j]);
    if (tid == 0) mctr[r] = 0;
}
