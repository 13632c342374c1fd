/* csattention_bits.cuh: CSAttention's decode reduce-by-key over a BIT VIEW
 * of the lists, the default search since session 11 (issue 9, point 4;
 * included by csattention.cu inside its anonymous namespace after
 * cs_nearest; its launcher is cs_bits_launch in csattention_search.cuh).
 *
 * The view: per list, a bitmap over the key positions (bit i of word w =
 * key 32 w + i is in the list), the scores in key order, and per chunk of
 * 1024 keys the slot of its first score (chunk c's scores are at
 * val[base[c] .. base[c] + popc(chunk c)), chunks in order, holes allowed
 * after a chunk's scores). A search reads per row and list 1 bit per
 * region key, 4 B per entry and 4 B per chunk: m x (n / 8 + L x 4 + n / 256)
 * B, 9.03 B per region key at m = 8, alpha = 0.25, against 16 B for the
 * (index, score) entries the tiled kernels read (csattention_pipe.cuh,
 * KVBENCH_CS_REDUCE=tiled). Why: those kernels were bound by instruction
 * issue in their per-(list, piece) set-up and subspace barriers (257 us =
 * 35% of their byte floor at 1M tokens, H100); here a lane owns a word of 32
 * keys and adds its keys' partial scores in registers in the CPU's subspace
 * order (bitwise the CPU's sums), no atomics, no block barrier, about four
 * SASS instructions per (key, list) for missing=zero, w = 1 (cs_badd_sh).
 * Lane l's scores start about 8 l slots into the staged run, so the adds' loads fall
 * on the banks at random; session 14 measured them three ways conflicted
 * (12.5 M wavefronts where 4.15 M would do, ncu at 1M tokens: about 63 of
 * cs_bits's 85 us). Session 15 predicated the loads on the key's bit, so
 * only the quarter of the lanes whose key is in the list touch the banks:
 * 9.9 M wavefronts in all (16.3 M before), cs_bits 71 us, the search 114 ->
 * 91 us with cs_nearest's change. What bounds it since is instruction issue
 * (51.5 M warp instructions, issue slots 69% busy; the add loop 37% of
 * them, the per-chunk set-up 18%). Session 16 took 7 SASS instructions a
 * list off the add loop (for missing=zero, w = 1 a lane whose key is not
 * in the list loads a dummy word, the buffer's first, instead of skipping
 * the load: ptxas folds the bit tests into R2P again, 132 instructions a
 * list against 142) and about 20 off its staging copies (one address, the
 * five copies at constant offsets from it): cs_bits 65.4 us under ncu
 * (session 16 call A), the search 90.0 -> 87.8 us (call B, interleaved).
 * Search, four launches on one stream. cs_nearest: the rows' lists and
 * weights. cs_bsamp (rows x SB blocks of 16 warps): S sample chunks spread
 * over the region; a lane's largest gathered sum is one key of its 32, so
 * when k lanes have one, the k-th largest of those maxima is at most the
 * row's k-th best: it becomes the row's bound thr (atomicMax of kv_f2key;
 * over all of a row's blocks at once, cs_bpool, since session 35).
 * cs_bits (rows x chunks / 4 blocks, a warp per chunk): every chunk's sums;
 * the warp counts its gathered keys (nu, and lists them when asked: u),
 * then emits those at or above the bound, or, when more than k are, its own
 * exact top k (warp bisection of kv_f2key, ties to the smaller key), whose
 * k-th raises the bound (in a region without the sample, cs_bits's NS
 * instance: 16 bits bisected first and the few keys at or above emitted,
 * cs_btopk). cs_bsel (a block per row): the top k of the row's
 * candidates by the pair (kv_f2key(sum), ~key): kv_topk_ref's order (larger
 * first, ties to the smaller key) whatever order the atomics emitted them
 * in; it publishes nu and clears the row's counters for the next search.
 * cs_bsamp, cs_bits and cs_bsel are programmatic dependent launches
 * (KVBENCH_CS_PDL=0: plain): cs_bits's blocks start beside cs_bsamp's and
 * wait for it only before reading the bound, so the sample costs little
 * more than its bytes at long contexts. In a region of at most CS_BSNONE
 * chunks its latency would be the search's critical path, so there it is
 * left out, and KVBENCH_CS_SAMPLE=0 drops it everywhere (every warp then
 * bounds itself: the top-k path); cs_bits is then cs_nearest's
 * programmatic dependent, its blocks spread over the SMs by their shared
 * memory (cs_bits_launch).
 * Staging: per group of 8 lists a warp loads every word and base at once,
 * then copies each list's scores for its chunk (16 B cp.async from the 16-B
 * boundary below the base) into one of CS_BNB buffers, CS_BNA lists ahead of
 * the one it adds; a chunk with more than ~512 entries of one list (twice
 * the mean at alpha = 0.25; possible on real traces, whose lists cluster)
 * is read from global memory where it lies (the slow path, same sums), as
 * are the words at the region's edges (the sink's chunk, the last one).
 * Update (cs_bappend, a warp per list, after cs_try_insert recorded what
 * each heap did): an evicted key's score leaves its chunk's run (the run's
 * later scores move down one slot, its bit clears, a hole stays at the run's
 * end); the appended key (keys arrive in increasing order: the host checks)
 * goes after the last chunk's run. A list whose scores reach the end of its
 * row (L + L/8 + 64 slots) is compacted in place by the same warp. */

constexpr int CS_BW = 4;           /* warps (chunks of 1024 keys) a block of cs_bits */
constexpr int CS_BMINB = 6;        /* cs_bits's blocks an SM (its launch bounds: 80 registers) */
constexpr int CS_BSW = 16;         /* warps (sample chunks) a block of cs_bsamp */
constexpr int CS_BSNONE = 64;      /* a region of at most this many chunks is searched without the sample (unless
                                      KVBENCH_CS_SAMPLE is set): there the sample's latency is on the search's critical
                                      path. Search with / without it, session 33 call C: 29.9 / 27.2 us at 16K, 30.6 /
                                      28.6 at 32K, 32.5 / 31.2 at 64K; call B at 128K: 33.4 / 39.5 */
constexpr int CS_BSMAXS = 64;      /* sample chunks a row at most (a quarter of the region up to this, CS_BSW a block,
                                      their maxima pooled; unless KVBENCH_CS_SAMPLE is set). Against a block every 256
                                      region chunks (16 chunks below 512): 29.3 against 33.7 us at 128K, 71.9 both at 1M
                                      (the same 64 chunks in 4 blocks; session 36 call B, three interleaved rounds);
                                      call A, with another select in cs_bpool too: 30.2 / 39.7 against 33.6 / 44.1 at
                                      96K / 256K. At 1M 64 chunks won against 128 in 8 blocks (71.8 against 73.2 us,
                                      session 35 call E) */
constexpr int CS_BNB = 3;          /* staging buffers a warp (4: 130.1 against 123.1 us at 1M, session 11 call 4) */
constexpr int CS_BNA = CS_BNB - 1; /* lists whose copies are in flight while list b is added */
constexpr int CS_BBUF = 512 + 8;   /* a staging buffer (floats): up to 512 scores + the 16-B rounding */
constexpr int CS_BG = 8;           /* lists whose words are loaded at once */
constexpr int CS_BTKS = 32;        /* keys beyond k a warp's top k may emit (cs_btopk); the candidate rows hold them */
constexpr int CS_BSTAT = 1024;     /* bytes kept for cs_bits's static shared memory (its dynamic limit) */
constexpr int CS_BSEL = 1024;      /* threads of cs_bsel */
constexpr int CS_BSELC = 16384;    /* candidates cs_bsel keeps in shared memory (more are read from L2; 8192 sent
                                      the 1M search's rows to the radix path, session 14 call B) */
/* A warp's shared memory (4-B words): the buffers, then (cs_bchunk) per list of the group its words, the
 * lanes' first slots and the 64-bit address its run is copied from. */
constexpr int CS_BWS = CS_BNB * CS_BBUF + 2 * CS_BG * 32 + 2 * CS_BG;

/* Row stride of the view's scores: L + slack for the holes evictions leave, a multiple of 4. */
inline long long cs_bview_ld(int L) { return ((long long)L + L / 8 + 64 + 3) & ~3LL; }
/* Dynamic shared memory of a block of `warps` warps of cs_bits or cs_bsamp. */
inline size_t cs_bits_smem(int warps) { return (size_t)warps * CS_BWS * 4; }

struct cs_bits_args {
    const uint32_t *bits; /* [nlists][BW] */
    const int *base;      /* [nlists][NCH] */
    const float *val;     /* [nlists][BL] */
    long long BW, NCH, BL;
    const int *jl;
    const float *wb, *lval;
    const int *lcnt;
    int L, m, lo, hi, k;
    int clo, nreg, S;     /* the region's chunks [clo, clo + nreg); S of them sampled */
    unsigned *thr;        /* the row's bound at thr[r * CS_SMAX] (kv_f2key; 0 = none) */
    int *bcnt;            /* candidates a row */
    unsigned *bcv;        /* [R][bcap]: kv_f2key of the candidates' sums */
    int32_t *bck;
    long long bcap;
    int *bnu;             /* gathered keys a row, accumulating */
    int32_t *u;           /* nullable: the gathered keys [R][uld] */
    long long uld;
    unsigned *smx;        /* [R][BW]: the lane maxima of a row's cs_bsamp blocks, when it has more than one */
    int *tick;            /* [R]: cs_bsamp's blocks of the row done (zero between searches) */
};

/* A lane's 16-B staging copy O bytes past its first (when p): the offset in the instruction, so a list's
 * five copies share one address; ptxas computed each copy's 64-bit address anew (session 16). */
template <int O> __device__ __forceinline__ void cs_bcp16_at(unsigned dst, const float *src, bool p) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t"
                 "@p cp.async.cg.shared.global [%0+%3], [%1+%3], 16;\n\t}" ::"r"(dst), "l"(src), "r"((unsigned)p),
                 "n"(O) : "memory");
}

/* Warp sum, and exclusive warp prefix with *tot the sum (lane order). */
__device__ __forceinline__ int cs_wsum(int v) { return __reduce_add_sync(0xffffffffu, v); }
__device__ __forceinline__ int cs_wscan(int v, int *tot) {
    const int lane = threadIdx.x & 31;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    *tot = __shfl_sync(0xffffffffu, x, 31);
    return x - v;
}
/* Inclusive warp scan (lane order) in two instructions a step: shfl.up's in-range predicate guards the add.
 * cs_bchunk scans two lists' 16-bit counts at once in one word (the sums stay below 2^16). */
__device__ __forceinline__ unsigned cs_wscan_in(unsigned v) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        asm("{\n\t.reg .pred p;\n\t.reg .b32 r;\n\tshfl.sync.up.b32 r|p, %0, %1, 0, 0xffffffff;\n\t"
            "@p add.u32 %0, %0, r;\n\t}"
            : "+r"(v) : "r"(o));
    return v;
}

/* Keys j of this lane's word with u[j] >= x (u: kv_f2key of a gathered key's sum, 0 for the others). */
__device__ __forceinline__ int cs_bge(const unsigned (&u)[32], unsigned x) {
    if (x == 0) x = 1; /* kv_f2key of a float is never 0: the gathered keys alone */
    int c = 0;
#pragma unroll
    for (int j = 0; j < 32; j++) c += u[j] >= x;
    return c;
}

/* Add one list's scores of the lane's word wc (p: its first score, in global memory: a list too long to
 * stage, or a word at the region's edge) to s, in the CPU's arithmetic: missing=zero adds w v for the keys
 * in the list, missing=min w (v or mn) for every key of the region (km); W1: w = 1 exactly, the product is
 * v. Branch-free: every step loads *p (the next lane's first score, or the slack after the last one, once
 * the lane's own are done) and moves p by the key's bit. */
template <bool MIN, bool W1>
__device__ __forceinline__ void cs_badd(const float *p, unsigned wc, unsigned km, float w, float mn, float (&s)[32]) {
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const unsigned in = (wc >> j) & 1u;
        float v = *p;
        p += in;
        if (MIN) {
            v = in ? v : mn;
            if ((km >> j) & 1u) s[j] = __fadd_rn(s[j], W1 ? v : __fmul_rn(w, v));
        } else {
            const float t = __fadd_rn(s[j], W1 ? v : __fmul_rn(w, v));
            s[j] = in && ((km >> j) & 1u) ? t : s[j];
        }
    }
}
/* The same for a word whose keys are all in the region, its scores in shared memory at address sa: about
 * four SASS instructions a key for missing=zero, w = 1 (the address chosen by the key's bit, the load, the
 * predicated address step and add; ptxas tests seven bits in one R2P), written in PTX because the
 * compiler's selects took twice as many. A lane whose key is not in the list loads the warp-uniform dummy
 * address (its buffer's first word) and drops the value, so only the lanes whose key is in the list spread
 * over the banks (about a quarter at alpha = 0.25; the dummy is one broadcast word); session 15 predicated
 * the load instead, which cost ptxas's R2P and 16 register moves a list. The other forms predicate their
 * load; its value goes to one of four registers in turn (vr), never undefined on the path that skips it:
 * a fresh register a key, defined only under its predicate, kept 32 of them live and spilled. */
template <bool MIN, bool W1>
__device__ __forceinline__ void cs_badd_sh(unsigned sa, unsigned wc, float w, float mn, float (&s)[32],
                                           unsigned dummy) {
    float vr[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 32; j++) {
        if (!MIN && W1)
            asm volatile("{\n\t.reg .pred p;\n\t.reg .b32 t, ad;\n\t.reg .f32 v;\n\t"
                         "and.b32 t, %2, %3;\n\tsetp.ne.u32 p, t, 0;\n\tselp.b32 ad, %1, %4, p;\n\t"
                         "ld.shared.f32 v, [ad];\n\t@p add.u32 %1, %1, 4;\n\t@p add.rn.f32 %0, %0, v;\n\t}"
                         : "+f"(s[j]), "+r"(sa) : "r"(wc), "r"(1u << j), "r"(dummy));
        else if (!MIN)
            asm volatile("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\t"
                         "and.b32 t, %3, %4;\n\tsetp.ne.u32 p, t, 0;\n\t@p ld.shared.f32 %2, [%1];\n\t"
                         "@p add.u32 %1, %1, 4;\n\t@p mul.rn.f32 %2, %5, %2;\n\t@p add.rn.f32 %0, %0, %2;\n\t}"
                         : "+f"(s[j]), "+r"(sa), "+f"(vr[j & 3]) : "r"(wc), "r"(1u << j), "f"(w));
        else if (W1)
            asm volatile("{\n\t.reg .pred p;\n\t.reg .f32 v;\n\t.reg .b32 t;\n\t"
                         "and.b32 t, %2, %3;\n\tsetp.ne.u32 p, t, 0;\n\tmov.f32 v, %4;\n\t@p ld.shared.f32 v, [%1];\n\t"
                         "@p add.u32 %1, %1, 4;\n\tadd.rn.f32 %0, %0, v;\n\t}"
                         : "+f"(s[j]), "+r"(sa) : "r"(wc), "r"(1u << j), "f"(mn));
        else
            asm volatile("{\n\t.reg .pred p;\n\t.reg .f32 v;\n\t.reg .b32 t;\n\t"
                         "and.b32 t, %2, %3;\n\tsetp.ne.u32 p, t, 0;\n\tmov.f32 v, %5;\n\t@p ld.shared.f32 v, [%1];\n\t"
                         "@p add.u32 %1, %1, 4;\n\tmul.rn.f32 v, %4, v;\n\t"
                         "add.rn.f32 %0, %0, v;\n\t}"
                         : "+f"(s[j]), "+r"(sa) : "r"(wc), "r"(1u << j), "f"(w), "f"(mn));
    }
}

/* The sums of region chunk c for the row whose lists are sli (weights sws, missing=min defaults smn) into
 * s[32] (key c*1024 + 32 lane + j), lists in the CPU's subspace order; returns the lane's gathered keys (in
 * a list and in [lo, hi)). ws: the warp's CS_BWS words of shared memory. Per group of CS_BG lists: every
 * word and base loaded at once, the lanes' first slots by one scan per two lists (pk: the slot | the list's
 * count << 16); the words, the slots (from the run's 16-B boundary) and each list's run address go to
 * shared memory, list i's 16-B pieces stay with lane i (read by a shuffle); then each list's scores are
 * copied (16-B cp.async, CS_BNA lists ahead) into a buffer and added, or, when a chunk holds more than a
 * buffer (> ~512 keys of the list: never at alpha = 0.25 on uniform lists; slowm) or for a word at the
 * region's edge (km), read from global memory where they are (the slow path). Row offsets are 32-bit
 * products widened once (the view's strides are below 2^32: cs_bview_ld of an int L). Session 14 tried the
 * group's loop unrolled with everything in registers: 128 registers, or spills at 80, and 102 us against 94
 * (call C). M8: m = CS_BG known at compile time (cs_bits at the default m = 8: one group, no run-time bound
 * on its loads and issues); the buffer of list b is a rotating index (b % CS_BNB was a division a list).
 * Session 31 call F, three rounds against the run-time m: search 82.0-82.3 -> 80.8-81.1 us at 1M, 30.6 ->
 * 30.2 at 16K, 34.3 -> 33.5 at 128K (the static SASS before the list loop about 390 instructions against
 * 610). Session 32: the list loop twice, FAST (every list staged, every word in the region: the shared-memory
 * adds alone) and the general one, chosen per chunk; km kept in a register (ptxas recomputed its 30
 * instructions for every list) and the run addresses computed once a chunk. By Nsight Compute's source
 * counters (call A) cs_bits spent about 256 warp instructions a list at 1M tokens, 132 of them the adds; the
 * FAST loop has about 180 (static SASS). Kept rolled (#pragma unroll 1): unrolled, its 1379 straight-line
 * instructions took 16K from 30.5 to 31.8 us and 128K from 33.9 to 37.3 (call D; call C's whole-chunk
 * template copy likewise: 32.5 and 37.5). Call D, three rounds each: search 81.3-81.4 -> 74.8-75.1 us at 1M,
 * 30.4-30.6 -> 29.9-30.0 at 16K, 33.8-34.0 -> 33.5-33.7 at 128K; cs_bits alone under ncu 62.2 -> 55.3 us
 * at 1M, 18.5 -> 17.8 at 128K. */
template <bool MIN, bool W1, bool M8 = false>
__device__ __forceinline__ unsigned cs_bchunk(const cs_bits_args &a, const int *sli, const float *sws,
                                             const float *smn, int c, float *ws, float (&s)[32]) {
    const int lane = threadIdx.x & 31;
    const long long wi = (long long)c * 32 + lane, k0 = wi * 32, d0 = a.lo - k0, d1 = a.hi - k0;
    const unsigned km0 = (d0 <= 0 ? 0xffffffffu : d0 >= 32 ? 0u : 0xffffffffu << d0) &
                         (d1 >= 32 ? 0xffffffffu : d1 <= 0 ? 0u : 0xffffffffu >> (32 - d1));
    unsigned km; /* through a volatile move: ptxas otherwise recomputed it for every list (30 SASS instructions) */
    asm volatile("mov.b32 %0, %1;" : "=r"(km) : "r"(km0));
    const unsigned BW = (unsigned)a.BW, NCH = (unsigned)a.NCH, BL = (unsigned)a.BL;
    const unsigned wsa = (unsigned)__cvta_generic_to_shared(ws); /* the buffers' shared-memory address */
    unsigned *swd = (unsigned *)(ws + CS_BNB * CS_BBUF);
    int *sof = (int *)(swd + CS_BG * 32);
    const float **ssrc = (const float **)(sof + CS_BG * 32);
#pragma unroll
    for (int j = 0; j < 32; j++) s[j] = 0.f;
    unsigned g = 0;
    const int m = M8 ? CS_BG : a.m;
    for (int g0 = 0; g0 < m; g0 += CS_BG) {
        const int mg = M8 ? CS_BG : m - g0 < CS_BG ? m - g0 : CS_BG;
        unsigned wv[CS_BG], pk[CS_BG];
        int bv[CS_BG];
#pragma unroll
        for (int i = 0; i < CS_BG; i++) {
            wv[i] = 0;
            bv[i] = 0;
            if (i < mg) {
                const unsigned li = (unsigned)sli[g0 + i];
                wv[i] = __ldcs(a.bits + ((size_t)li * BW + (size_t)wi));
                bv[i] = __ldcs(a.base + ((size_t)li * NCH + (unsigned)c));
            }
        }
#pragma unroll
        for (int i = 0; i < CS_BG; i += 2) {
            const unsigned p = (unsigned)__popc(wv[i]) | (unsigned)__popc(wv[i + 1]) << 16;
            const unsigned in = cs_wscan_in(p), tot = __shfl_sync(0xffffffffu, in, 31), ex = in - p;
            pk[i] = (ex & 0xffffu) | tot << 16;
            pk[i + 1] = ex >> 16 | (tot & 0xffff0000u);
        }
        /* the words and first slots (from the run's 16-B boundary) to shared memory; lane i < mg: list g0 + i's
           run start (that boundary, ssrc) and its 16-B pieces; slowm: the lists too long to stage (bit i) */
#pragma unroll
        for (int i = 0; i < CS_BG; i++) {
            swd[i * 32 + lane] = wv[i];
            sof[i * 32 + lane] = (int)(pk[i] & 0xffffu) + (bv[i] & 3);
        }
        int mybs = 0;
        unsigned mypk = 0;
#pragma unroll
        for (int i = 0; i < CS_BG; i++)
            if (lane == i) { mybs = bv[i]; mypk = pk[i]; }
        const int myn16 = ((mybs & 3) + (int)(mypk >> 16) + 3) >> 2;
        const unsigned slowm = __ballot_sync(0xffffffffu, lane < mg && (mybs & 3) + (int)(mypk >> 16) > CS_BBUF - 4);
        if (lane < mg) ssrc[lane] = a.val + ((size_t)(unsigned)sli[g0 + lane] * BL + (unsigned)(mybs & ~3));
        const unsigned dst0 = wsa + 16 * lane;
        __syncwarp();
        auto issue_any = [&](int i, int buf) { /* list g0 + i's scores into buffer buf */
            if (i < mg && !((slowm >> i) & 1u)) {
                const float *src = ssrc[i] + 4 * lane;
                const int r = __shfl_sync(0xffffffffu, myn16, i & 31) - lane;
                const unsigned dst = dst0 + buf * (CS_BBUF * 4);
                /* r + lane <= (CS_BBUF - 1) / 4 = 129 pieces off the slow path: five predicated copies a lane, no
                   loop (the loop took 2.2 us more at 1M, session 15 call C) */
                cs_bcp16_at<0>(dst, src, r > 0);
                cs_bcp16_at<512>(dst, src, r > 32);
                cs_bcp16_at<1024>(dst, src, r > 64);
                cs_bcp16_at<1536>(dst, src, r > 96);
                cs_bcp16_at<2048>(dst, src, r > 128);
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory"); /* one group a list, empty or not */
        };
        for (int i = 0; i < CS_BNA; i++) issue_any(i, i);
        /* bb = b % CS_BNB, the buffer list b is added from; list b + CS_BNA goes to the one before it. FAST: every
           list staged and every word in the region (warp-uniform), the shared-memory adds alone */
        auto lists = [&](auto fast) {
#pragma unroll 1
            for (int b = 0, bb = 0; b < mg; b++, bb = bb == CS_BNB - 1 ? 0 : bb + 1) {
                issue_any(b + CS_BNA, bb == 0 ? CS_BNB - 1 : bb - 1);
                asm volatile("cp.async.wait_group %0;\n" ::"n"(CS_BNA) : "memory");
                __syncwarp();
                const unsigned wc = swd[b * 32 + lane];
                const int o = sof[b * 32 + lane];
                if (decltype(fast)::value || (!((slowm >> b) & 1u) && km == 0xffffffffu))
                    cs_badd_sh<MIN, W1>(wsa + (bb * CS_BBUF + o) * 4, wc, sws[g0 + b], smn[g0 + b], s,
                                        wsa + bb * CS_BBUF * 4);
                else /* a list too long to stage, or a word at the region's edge: from global memory */
                    cs_badd<MIN, W1>(ssrc[b] + o, wc, km, sws[g0 + b], smn[g0 + b], s);
                g |= wc & km;
                __syncwarp(); /* buffer bb is refilled next */
            }
        };
        if (!slowm && __all_sync(0xffffffffu, km == 0xffffffffu)) lists(std::true_type{});
        else lists(std::false_type{});
    }
    return g;
}

/* The gathered keys of the lane's word: counted into bnu[r], listed into u when asked (any order). */
__device__ __forceinline__ void cs_bunion(const cs_bits_args &a, int r, unsigned g, int key0) {
    if (!a.u) { /* the count alone: a reduction, the atomic's result unused (no round trip) */
        const int n = cs_wsum(__popc(g));
        if ((threadIdx.x & 31) == 0 && n) atomicAdd(a.bnu + r, n);
        return;
    }
    int tot;
    const int ex = cs_wscan(__popc(g), &tot);
    if (!tot) return;
    int at = 0;
    if ((threadIdx.x & 31) == 0) at = atomicAdd(a.bnu + r, tot);
    at = __shfl_sync(0xffffffffu, at, 0) + ex;
    if (a.u)
        for (unsigned x = g; x; x &= x - 1) a.u[(size_t)r * a.uld + at++] = key0 + __ffs(x) - 1;
}

/* The warp's top k (u: kv_f2key of the sums, 0 = not gathered): the bisection of the k-th key X, then the
 * keys above it and the first ties in key order (lanes and j run in key order); X raises the row's bound.
 * NS (a region without the sample, where every warp ends here): the bisection runs over the high 16 bits
 * first; the X found has at least k keys at or above it and is at most the k-th, so when at most k + CS_BTKS
 * keys are at or above it they are all emitted (a superset of the warp's top k, its ties included; cs_bsel
 * takes the row's exact top k) and X raises the bound; otherwise the bisection goes on to the exact k-th.
 * Session 40 (H200, three interleaved rounds): searches of 25.8 / 27.2 / 30.6 us at 16K / 32K / 64K with the
 * 32 steps, 23.1 / 24.6 / 27.5 with 16 first (call C). The same code in the sampled regions' kernel cost 128K
 * and 1M 0.5 and 1.5 us, where this path hardly runs, so the sampled kernel keeps the 32 steps. */
template <bool NS> __device__ void cs_btopk(const cs_bits_args &a, int r, const unsigned (&u)[32], int key0) {
    unsigned X = 0; /* the largest X with k keys at or above it */
    int bit = 31;
    if (NS) {
        for (; bit >= 16; bit--)
            if (cs_wsum(cs_bge(u, X | (1u << bit))) >= a.k) X |= 1u << bit;
        const unsigned Xe = X ? X : 1u; /* 0: the gathered keys alone */
        int c = 0;
#pragma unroll
        for (int j = 0; j < 32; j++) c += u[j] >= Xe;
        int tot;
        const int ex = cs_wscan(c, &tot);
        /* warp-uniform. The emission below repeats the exact path's in shape on purpose: one shared emission
           (the superset as E = Xe with no tie limit) took 22.3-22.4 / 24.2-24.3 / 26.7 us at 16K / 32K / 64K
           against these 21.6-21.8 / 23.1-23.5 / 25.9-26.1 (session 41 call E, two interleaved rounds, H200) */
        if (tot <= a.k + CS_BTKS) {
            int at = 0;
            if ((threadIdx.x & 31) == 0) at = atomicAdd(a.bcnt + r, tot);
            at = __shfl_sync(0xffffffffu, at, 0) + ex;
            unsigned *ov = a.bcv + (size_t)r * a.bcap;
            int32_t *ok = a.bck + (size_t)r * a.bcap;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                if (u[j] < Xe) continue;
                ov[at] = u[j];
                ok[at] = key0 + j;
                at++;
            }
            if ((threadIdx.x & 31) == 0 && X) atomicMax(a.thr + (size_t)r * CS_SMAX, X);
            return;
        }
    }
    for (; bit >= 0; bit--)
        if (cs_wsum(cs_bge(u, X | (1u << bit))) >= a.k) X |= 1u << bit;
    const int need = a.k - (X == 0xffffffffu ? 0 : cs_wsum(cs_bge(u, X + 1)));
    int te = 0, gt = 0;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        te += u[j] == X;
        gt += u[j] > X;
    }
    int ttot, otot;
    int tr = cs_wscan(te, &ttot); /* ties before this lane's, in key order */
    const int take = gt + (need - tr > 0 ? (need - tr < te ? need - tr : te) : 0);
    const int ex = cs_wscan(take, &otot);
    int at = 0;
    if ((threadIdx.x & 31) == 0) at = atomicAdd(a.bcnt + r, otot);
    at = __shfl_sync(0xffffffffu, at, 0) + ex;
    unsigned *ov = a.bcv + (size_t)r * a.bcap;
    int32_t *ok = a.bck + (size_t)r * a.bcap;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        if (u[j] < X || (u[j] == X && tr++ >= need)) continue;
        ov[at] = u[j];
        ok[at] = key0 + j;
        at++;
    }
    if ((threadIdx.x & 31) == 0) atomicMax(a.thr + (size_t)r * CS_SMAX, X);
}

/* The sums' keys: u[j] = kv_f2key(s[j]) for the gathered keys, 0 for the others. */
__device__ __forceinline__ void cs_bkeys(const float (&s)[32], unsigned g, unsigned (&u)[32]) {
#pragma unroll
    for (int j = 0; j < 32; j++) u[j] = (g >> j) & 1u ? kv_f2key(s[j]) : 0u;
}

/* The warp's candidates for row r: its gathered keys at or above the bound T (a kv_f2key; compared as the
 * float it is the key of) or, when more than k are, its exact top k (cs_btopk). key0: the key of s[0]. A lane
 * with keys to emit puts its 32 sums in its own row of the warp's shared memory ws (free once cs_bchunk has
 * returned: rows of CS_BER words, so the 16-B stores of 8 lanes fall on distinct banks) and walks its emitted
 * keys by their bits, in key order as before; the sums are the same floats, so the output is the same.
 * Session 31: the loop over all 32 keys (a branch around each key's two stores) cost about 26 SASS
 * instructions a key that any lane of the warp emitted and 3 one that none did; at 1M tokens a chunk emits
 * about 14 (cs_bsel's 13.7-14.9 K candidates a row over 1024 chunks, call B). The search (H200, call C, three
 * rounds, each timing the loop's build and this one in turn): 85.1-85.4 -> 82.0-82.1 us at 1M, 33.0 -> 30.5 at
 * 16K, 37.8 -> 34.7 at 128K. */
constexpr int CS_BER = 36;
static_assert(32 * CS_BER <= CS_BWS, "csattention: the emit rows fit a warp's shared memory");
template <bool NS>
__device__ __forceinline__ void cs_bemit(const cs_bits_args &a, int r, const float (&s)[32], unsigned g, int key0,
                                         unsigned T, float *ws) {
    const float tf = T ? kv_key2f(T) : -INFINITY;
    unsigned e = 0; /* the lane's keys to emit */
#pragma unroll
    for (int j = 0; j < 32; j++) e |= (s[j] >= tf ? 1u : 0u) << j;
    e &= g;
    const int c = __popc(e), tot = cs_wsum(c);
    if (tot > a.k) {
        unsigned u[32];
        cs_bkeys(s, g, u);
        cs_btopk<NS>(a, r, u, key0);
        return;
    }
    if (!tot) return;
    int at0 = 0;
    if ((threadIdx.x & 31) == 0) at0 = atomicAdd(a.bcnt + r, tot);
    int at = (int)cs_wscan_in((unsigned)c) - c; /* while the atomic is in flight */
    at += __shfl_sync(0xffffffffu, at0, 0);
    if (!c) return;
    float *row = ws + CS_BER * (threadIdx.x & 31);
#pragma unroll
    for (int q = 0; q < 8; q++) ((float4 *)row)[q] = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
    unsigned *ov = a.bcv + (size_t)r * a.bcap + at;
    int32_t *ok = a.bck + (size_t)r * a.bcap + at;
    for (unsigned x = e; x; x &= x - 1) {
        const int j = __ffs(x) - 1;
        *ov++ = kv_f2key(row[j]);
        *ok++ = key0 + j;
    }
}

/* The row's per-list set-up (tid < m): the list, its weight and its missing-key default. */
__device__ __forceinline__ void cs_brow(const cs_bits_args &a, int r, bool MIN, int *sli, float *sws, float *smn) {
    const int t = threadIdx.x;
    if (t < a.m) {
        const int li = a.jl[r * a.m + t];
        sli[t] = li;
        sws[t] = a.wb[r * a.m + t];
        smn[t] = MIN && a.lcnt[li] ? a.lval[(size_t)li * a.L] : 0.f; /* heap root = the list's minimum */
    }
}

/* cs_bsamp's rows of SB > 1 blocks: the block's lane maxima go to smx, and the row's last block to arrive
 * (tick) takes the k-th largest of all SB x 512 of them (a radix select, 8 bits a pass, in the staging
 * buffers sv when they fit) for the bound: one k-th over the whole sample rather than the largest of SB
 * blocks' own. With 4 blocks a row (64 chunks) the 1M search took 72.1 us against 74.9 with 2 blocks a row,
 * each bounding the row with its own maxima (session 35 call C, three interleaved rounds, H200). A block has at
 * least 256 threads: one a histogram bin (session 38's 4-warp sample blocks failed three tests without them). */
static_assert(CS_BSW * 32 >= 256, "csattention: cs_bpool zeroes its 256 bins with one thread each");
__device__ void cs_bpool(const cs_bits_args &a, int r, unsigned mx, unsigned *sv) {
    __shared__ unsigned hist[256], s_bin;
    __shared__ int s_last, s_above, s_exact, s_nz;
    const int tid = threadIdx.x, nv = gridDim.y * blockDim.x;
    const bool staged = nv <= CS_BSW * CS_BWS;
    unsigned *gx = a.smx + (size_t)r * a.BW; /* nv <= BW: SB <= NCH / 16 */
    gx[blockIdx.y * blockDim.x + tid] = mx;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        s_last = atomicAdd(a.tick + r, 1) == (int)gridDim.y - 1;
        s_nz = 0;
    }
    __syncthreads();
    if (!s_last) return; /* uniform */
    __threadfence();
    int nz = 0;
    for (int i = tid; i < nv; i += blockDim.x) {
        const unsigned v = __ldcg(gx + i);
        if (staged) sv[i] = v;
        nz += v != 0;
    }
    nz = cs_wsum(nz);
    if ((tid & 31) == 0 && nz) atomicAdd(&s_nz, nz);
    if (tid == 0) a.tick[r] = 0; /* for the next search */
    __syncthreads();
    if (s_nz < a.k) return; /* uniform: fewer than k gathered lanes, no bound */
    unsigned pre = 0;
    int rem = a.k;
    for (int sh = 24; sh >= 0; sh -= 8) {
        if (tid < 256) hist[tid] = 0;
        __syncthreads();
        for (int i = tid; i < nv; i += blockDim.x) {
            const unsigned v = staged ? sv[i] : __ldcg(gx + i);
            if (sh == 24 || (v >> (sh + 8)) == (pre >> (sh + 8))) atomicAdd(&hist[(v >> sh) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) kv_pick_bin(hist, rem, &s_bin, &s_above, &s_exact);
        __syncthreads();
        pre |= s_bin << sh;
        rem -= s_above;
        if (s_exact) break; /* uniform: the whole bin is in, so its lower edge is at most the k-th */
        __syncthreads();     /* the bin read before the next pass rewrites it */
    }
    if (tid == 0) atomicMax(a.thr + (size_t)r * CS_SMAX, pre);
}

/* Grid (R, SB), CS_BSW warps, after cs_nearest: sample chunks y*CS_BSW + w of S (spread over the region);
 * each lane's largest gathered key is one key of its own 32, so when k lanes have one, the k-th largest of
 * those maxima is at most the row's k-th best: it raises the row's bound (pooled over the row's blocks by
 * cs_bpool when SB > 1). cs_bits may start beside it (programmatic dependent launch) and waits for it only
 * to read the bound. */
template <bool MIN, bool W1> __global__ void __launch_bounds__(CS_BSW * 32) cs_bsamp(cs_bits_args a) {
    extern __shared__ __align__(16) float cs_bsm[];
    __shared__ int sli[CS_MMAX];
    __shared__ float sws[CS_MMAX], smn[CS_MMAX];
    kv_dep_wait();   /* cs_nearest's lists */
    kv_dep_launch(); /* cs_bits's blocks may take the other SMs now (cs_nearest is done) */
    const int r = blockIdx.x, w = threadIdx.x >> 5;
    cs_brow(a, r, MIN, sli, sws, smn);
    __syncthreads();
    const int si = blockIdx.y * CS_BSW + w;
    unsigned mx = 0; /* kv_f2key of a gathered key is never 0 */
    if (si < a.S) {
        float s[32];
        const unsigned g = cs_bchunk<MIN, W1>(a, sli, sws, smn, a.clo + (int)((long long)si * a.nreg / a.S),
                                              cs_bsm + (size_t)w * CS_BWS, s);
        unsigned u[32];
        cs_bkeys(s, g, u);
#pragma unroll
        for (int j = 0; j < 32; j++) mx = max(mx, u[j]);
    }
    if (gridDim.y > 1) {
        cs_bpool(a, r, mx, (unsigned *)cs_bsm);
        return;
    }
    /* A one-block row (65-67 region chunks by default; more under KVBENCH_CS_SAMPLE) bisects its own maxima, with
       no exchange. cs_bpool's select for these rows too is untested for speed: session 37 call C's rework measured
       it only at lengths of 2 or more blocks a row */
    if (__syncthreads_count(mx != 0) < a.k) return; /* uniform */
    unsigned X = 0;
    for (int bit = 31; bit >= 0; bit--)
        if (__syncthreads_count(mx >= (X | (1u << bit))) >= a.k) X |= 1u << bit;
    if (threadIdx.x == 0) atomicMax(a.thr + (size_t)r * CS_SMAX, X);
}

/* Grid (R, ceil(nreg / CS_BW)), a warp per region chunk; CS_BMINB blocks an SM (80 registers), as many as the
 * blocks' shared memory allows. M8: m = CS_BG, known at compile time (cs_bits_launch picks it; cs_bchunk).
 * NS: the region has no sample; the kernel is then cs_nearest's programmatic dependent (it waits for the lists
 * first) and its warps' top k bisect 16 bits first (cs_btopk). */
template <bool MIN, bool W1, bool M8, bool NS>
__global__ void __launch_bounds__(CS_BW * 32, CS_BMINB) cs_bits(cs_bits_args a) {
    extern __shared__ __align__(16) float cs_bsm[];
    __shared__ int sli[CS_MMAX];
    __shared__ float sws[CS_MMAX], smn[CS_MMAX];
    const int r = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (NS) kv_dep_wait(); /* cs_nearest's lists */
    cs_brow(a, r, MIN, sli, sws, smn);
    __syncthreads();
    const int cr = blockIdx.y * CS_BW + w;
    if (cr >= a.nreg) return; /* whole warps: no barrier follows */
    const int c = a.clo + cr;
    float s[32];
    const unsigned g = cs_bchunk<MIN, W1, M8>(a, sli, sws, smn, c, cs_bsm + (size_t)w * CS_BWS, s);
    kv_dep_wait(); /* cs_bsamp's bound (NS: returns at once) */
    const unsigned T = *(volatile unsigned *)(a.thr + (size_t)r * CS_SMAX);
    cs_bunion(a, r, g, c * 1024 + lane * 32); /* while the bound is read */
    cs_bemit<NS>(a, r, s, g, c * 1024 + lane * 32, T, cs_bsm + (size_t)w * CS_BWS);
    kv_dep_launch(); /* cs_bsel may be scheduled once every block is here */
}

/* A block per row: oidx[r*kk + j] = the j-th best of its bcnt[r] candidates (kv_topk_ref order), j < min(kk,
 * bcnt[r]); then nu[r] = the union count, and the row's counters and bound back to zero. Candidates are
 * ordered by the pair (key of the sum, ~key). Fast path (the pairs fit in shared memory, CS_BSELC): one
 * histogram of 2048 bins over the range of the sums' keys finds the bin b of the want-th; the candidates
 * above b are in, and those in b (the group) are ranked among themselves; each selected one's rank is then
 * counted directly. Otherwise (or a group too large to rank) a radix select of the pair, 8 bits a pass,
 * stopping once the chosen bin holds exactly the ones still needed. */
__global__ void __launch_bounds__(CS_BSEL) cs_bsel(const unsigned *bcv, const int32_t *bck, long long bcap, int *bcnt,
                                                   int kk, int *bnu, int *nu, unsigned *thr, int32_t *oidx) {
    extern __shared__ __align__(16) unsigned long long cs_bsc[]; /* [CS_BSELC] */
    __shared__ unsigned hist[2048], s_hi, s_lo;
    __shared__ unsigned long long sc[CS_KCAP];
    __shared__ int sk[CS_KCAP], sw[32];
    __shared__ unsigned s_bin;
    __shared__ int s_above, s_exact, s_n, s_g;
    kv_dep_wait(); /* cs_bits's candidates */
    const int r = blockIdx.x, tid = threadIdx.x, n = bcnt[r], want = kk < n ? kk : n;
    const unsigned *cv = bcv + (size_t)r * bcap;
    const int32_t *ck = bck + (size_t)r * bcap;
    const bool kept = n <= CS_BSELC;
    auto comp = [&](int i) { return (unsigned long long)cv[i] << 32 | (unsigned long long)(~(unsigned)ck[i]); };
    if (tid == 0) { s_hi = 0; s_lo = 0xffffffffu; s_n = 0; s_g = 0; }
    for (int i = tid; i < 2048; i += CS_BSEL) hist[i] = 0;
    __syncthreads();
    unsigned hi = 0, lo = 0xffffffffu;
    for (int i = tid; i < n && kept; i += CS_BSEL) {
        const unsigned long long x = comp(i);
        cs_bsc[i] = x;
        hi = max(hi, (unsigned)(x >> 32));
        lo = min(lo, (unsigned)(x >> 32));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    }
    if ((tid & 31) == 0 && n && kept) { atomicMax(&s_hi, hi); atomicMin(&s_lo, lo); }
    __syncthreads();
    bool fast = kept && want > 0;
    if (fast) {
        const unsigned base = s_lo;
        int sh = 0;
        while (((s_hi - base) >> sh) >= 2048u) sh++;
        for (int i = tid; i < n; i += CS_BSEL) atomicAdd(&hist[((unsigned)(cs_bsc[i] >> 32) - base) >> sh], 1u);
        __syncthreads();
        /* thread t: bins 2047 - 2t, 2046 - 2t; the counts above them by one block scan */
        const int c1 = (int)hist[2047 - 2 * tid], c0 = (int)hist[2046 - 2 * tid];
        int tot;
        const int above = kv_block_scan(c1 + c0, &tot, sw);
        if (above < want && above + c1 >= want) { s_bin = 2047u - 2 * tid; s_above = above; }
        else if (above + c1 < want && above + c1 + c0 >= want) { s_bin = 2046u - 2 * tid; s_above = above + c1; }
        __syncthreads();
        const unsigned bin = (unsigned)s_bin;
        const int A = s_above, G = (int)hist[bin];
        fast = A + G <= CS_KCAP;
        if (fast) {
            for (int i = tid; i < n; i += CS_BSEL) {
                const unsigned long long x = cs_bsc[i];
                const unsigned b = ((unsigned)(x >> 32) - base) >> sh;
                if (b < bin) continue;
                const int p = b > bin ? atomicAdd(&s_n, 1) : A + atomicAdd(&s_g, 1);
                sc[p] = x;
                sk[p] = ~(unsigned)x;
            }
            __syncthreads();
            for (int p = tid; p < A + G; p += CS_BSEL) { /* above: ranked among themselves; the group: among it */
                const int q0 = p < A ? 0 : A, q1 = p < A ? A : A + G;
                int rank = 0;
                for (int q = q0; q < q1; q++) rank += sc[q] > sc[p];
                if (p >= A && rank >= want - A) continue;
                oidx[(size_t)r * kk + (p < A ? rank : A + rank)] = sk[p];
            }
        }
    }
    if (!fast && want > 0) {
        unsigned long long prefix = 0, pmask = 0;
        int rem = want;
        for (int shift = 56; shift >= 0; shift -= 8) {
            __syncthreads();
            if (tid < 256) hist[tid] = 0;
            __syncthreads();
            for (int i = tid; i < n; i += CS_BSEL) {
                const unsigned long long x = kept ? cs_bsc[i] : comp(i);
                if ((x & pmask) == prefix) atomicAdd(&hist[(unsigned)(x >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid < 32) kv_pick_bin(hist, rem, &s_bin, &s_above, &s_exact);
            __syncthreads();
            prefix |= (unsigned long long)s_bin << shift;
            pmask |= 0xffull << shift;
            rem -= s_above;
            if (s_exact) break; /* the whole bin is in: the top want are (x & pmask) >= prefix */
        }
        if (tid == 0) s_n = 0;
        __syncthreads();
        for (int i = tid; i < n; i += CS_BSEL) {
            const unsigned long long x = kept ? cs_bsc[i] : comp(i);
            if ((x & pmask) >= prefix) {
                const int p = atomicAdd(&s_n, 1);
                sc[p] = x;
                sk[p] = ~(unsigned)x;
            }
        }
        __syncthreads();
        for (int p = tid; p < want; p += CS_BSEL) {
            int rank = 0;
            for (int j = 0; j < want; j++) rank += sc[j] > sc[p];
            oidx[(size_t)r * kk + rank] = sk[p];
        }
    }
    if (tid == 0) {
        nu[r] = bnu[r];
        bnu[r] = 0;
        bcnt[r] = 0;
        thr[(size_t)r * CS_SMAX] = 0;
    }
}

/* The gathered keys of row r (the union of its m lists jl[r*m ..] within [lo, hi)) listed into u[r*uld ..], any
 * order, from the view's words: cs_candidates runs it after the search (a diagnostic, candidate recall, kept out
 * of the timed search; cs_bits then only counts them). Grid (R, ceil(words / 256)), 256 threads, a thread a
 * word of 32 keys, in whole warps; cur[r] is the row's cursor (zero before; the caller zeroes it after). */
__global__ void cs_blist(const uint32_t *bits, long long BW, const int *jl, int m, int lo, int hi, int *cur,
                         int32_t *u, long long uld) {
    const int r = blockIdx.x;
    const long long w0 = lo >> 5, nw = ((hi - 1) >> 5) - w0 + 1,
                    wi = w0 + (long long)blockIdx.y * blockDim.x + threadIdx.x, d0 = lo - wi * 32, d1 = hi - wi * 32;
    unsigned g = 0;
    if (wi - w0 < nw) {
        for (int i = 0; i < m; i++) g |= bits[(size_t)jl[r * m + i] * BW + wi];
        g &= (d0 <= 0 ? 0xffffffffu : d0 >= 32 ? 0u : 0xffffffffu << d0) &
             (d1 >= 32 ? 0xffffffffu : d1 <= 0 ? 0u : 0xffffffffu >> (32 - d1));
    }
    int tot;
    const int ex = cs_wscan(__popc(g), &tot);
    if (!tot) return; /* warp-uniform */
    int at = 0;
    if ((threadIdx.x & 31) == 0) at = atomicAdd(cur + r, tot);
    at = __shfl_sync(0xffffffffu, at, 0) + ex;
    for (unsigned x = g; x; x &= x - 1) u[(size_t)r * uld + at++] = (int32_t)(wi * 32 + __ffs(x) - 1);
}

/* ---- the view's build and update ---- */

/* A block per list: the view from the selection's position-ordered list (n entries, keys increasing; bits
 * zeroed before), every chunk's base (the first entry at or past it), the tail and the last chunk. */
__global__ void cs_bbuild(const int32_t *lidx, const float *lval, long long lst, int n, uint32_t *bits, int *base,
                          float *val, long long BW, long long NCH, long long BL, int *btl, int *blast) {
    const int li = blockIdx.x;
    const int32_t *ki = lidx + (size_t)li * lst;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int key = ki[i];
        atomicOr(bits + (size_t)li * BW + (key >> 5), 1u << (key & 31));
        val[(size_t)li * BL + i] = lval[(size_t)li * lst + i];
    }
    for (long long c = threadIdx.x; c < NCH; c += blockDim.x) {
        int lo = 0, hi = n;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (ki[mid] < c * 1024) lo = mid + 1;
            else hi = mid;
        }
        base[(size_t)li * NCH + c] = lo;
    }
    if (threadIdx.x == 0) {
        btl[li] = n;
        blast[li] = n ? ki[n - 1] >> 10 : -1;
    }
}

/* A warp per list: apply what cs_try_insert did to the list's heap (act[li]: -2 nothing, -1 key t inserted,
 * e >= 0 key t inserted in place of e, score nv[li]) to its view; compact the list when its scores reach the
 * end of the row. Keys arrive in increasing order (the host checks). */
__global__ void cs_bappend(const int *act, const float *nv, int t, int nlists, uint32_t *bits, int *base, float *val,
                           long long BW, long long NCH, long long BL, int *btl, int *blast) {
    const int li = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (li >= nlists) return;
    const int e = act[li];
    if (e == -2) return;
    uint32_t *bi = bits + (size_t)li * BW;
    int *ba = base + (size_t)li * NCH;
    float *va = val + (size_t)li * BL;
    int tl = btl[li], last = blast[li];
    if (e >= 0) { /* the evicted key's score leaves its chunk's run */
        const int ce = e >> 10, el = (e >> 5) & 31;
        const unsigned wd = bi[(size_t)ce * 32 + lane];
        int tot;
        const int ex = cs_wscan(__popc(wd), &tot);
        const unsigned we = __shfl_sync(0xffffffffu, wd, el);
        const int b0 = ba[ce], rank = b0 + __shfl_sync(0xffffffffu, ex, el) + __popc(we & ((1u << (e & 31)) - 1u)),
                  end = b0 + tot;
        for (int i0 = rank; i0 < end - 1; i0 += 32) {
            const int i = i0 + lane;
            const float x = i < end - 1 ? va[i + 1] : 0.f;
            __syncwarp();
            if (i < end - 1) va[i] = x;
            __syncwarp();
        }
        if (lane == el) bi[(size_t)ce * 32 + el] = wd & ~(1u << (e & 31));
        if (ce == last) tl--;
        __syncwarp();
    }
    const int ct = t >> 10;
    if (ct > last) { /* new chunks start at the tail */
        for (int c = last + 1 + lane; c <= ct; c += 32) ba[c] = tl;
        last = ct;
    }
    if (lane == 0) {
        va[tl] = nv[li];
        bi[t >> 5] |= 1u << (t & 31);
    }
    tl++;
    __syncwarp();
    if (tl >= BL - 1) { /* compaction: the chunk runs moved down in order (a destination never passes a source) */
        int dst = 0;
        for (int c = 0; c <= last; c++) {
            int tot;
            cs_wscan(__popc(bi[(size_t)c * 32 + lane]), &tot);
            const int src = ba[c];
            for (int i0 = 0; i0 < tot && src != dst; i0 += 32) {
                const int i = i0 + lane;
                const float x = i < tot ? va[src + i] : 0.f;
                __syncwarp();
                if (i < tot) va[dst + i] = x;
                __syncwarp();
            }
            if (lane == 0) ba[c] = dst;
            dst += tot;
        }
        tl = dst;
    }
    if (lane == 0) { btl[li] = tl; blast[li] = last; }
}
