/* pages_pipe.cu: the group-mean page selection (Quest's pool=mean, which is
 * FreeKV's speculative selection and its correction; issue 10, point 4) as
 * two short launches (1 and 3 below; three with KVBENCH_PAGES_FUSE=0); the default path of pm_launch (kernels/pages_mean.cu
 * keeps the older one, KVBENCH_PAGES_PIPE=0 selects it).
 *
 * 1. The bound scan, p2_rscan where its 512-page tiles give >= 256 blocks
 *    (from 524288 tokens at page 32 and 8 kv heads) and the launch is not a
 *    correction (that keeps the ring: p2_use_rscan says why; KVBENCH_PAGES_RSCAN=0|1
 *    forces the ring or the register scan):
 *    each thread loads its 4 pages' min and max rows straight into
 *    registers, 8 channels a batch, two batches in flight (see p2_rscan),
 *    no shared-memory ring and no block barrier; at 1M tokens its scan is
 *    ~6 us faster than the ring's and, capped at 96 registers, leaves room
 *    on every SM for one early (PDL) pool block. Below that, p2_scan:
 *    one block per tile of TP = 128 or 256 consecutive pages of
 *    one kv head (1024 blocks at 1M tokens, page 32, 8 kv heads, against
 *    512 for the older scan; KVBENCH_PAGES_PPT=1|2|4 forces 128, 256 or 512
 *    pages, to measure the choice): the tile's channel rows of min and max stream
 *    through a ring of P2_ST shared-memory stages of 8 KB by cp.async
 *    (P2_ST - 1 stages in flight per block all the time, ~4 blocks per SM,
 *    ~20 MB in flight on an H100 where ~4 MB keeps HBM busy; the older scan
 *    kept one batch of 8 channels per thread in flight and idled between
 *    batches: 61% of copy bandwidth at 1M); a block issues its first
 *    stages before it loads q. Each thread sums its 1 or 2
 *    pages over the channels in order for all the group's query heads (one
 *    read of the summaries per kv head), products and sums rounded as on
 *    the CPU (bitwise kv_pages_bound: one product per channel and head, of
 *    the row q's sign picks, p2_acc says why it is the CPU's max of two),
 *    then writes the bounds and the
 *    tile's max of scale * bound per query head. Pages past ncand are
 *    zero-filled, never read; channels past D are not summed.
 * 2. p2_zpart: per query head and chunk of P2_CHUNK pages, the chunk's sum
 *    of exp(scale * b - m_h) in double, m_h the max of the tile maxima; the
 *    bounds are loaded before m_h is reduced, so the two L2 round trips
 *    overlap.
 * 3. p2_pool_topk: per kv head and chunk, m_h, then Z_h = the sum of the
 *    chunk partials (every block of a head sums them in the same fixed
 *    order, so all use the same weight w_h = 1 / (G * Z_h)), the pooled
 *    score sum over h in head order of expf(scale * b - m_h) * w_h (as
 *    kv_pages_pool_mean), the chunk's top kp by rounds of block argmax
 *    (larger first, earlier page among equals: kv_topk_ref's order); the
 *    last block of the kv head copies the chunks' candidates to shared
 *    memory once and selects the head's kp from them. The older path read
 *    the partials in one thread's serial loop and the candidates again in
 *    every round, a chain of dependent L2 round trips.
 * By default 2 is not a launch and 3 has no barrier: each scan block also
 * writes its tile's softmax partial against its own maximum, z_t = the sum
 * over its pages of expf(scale * b - m_t) (double), and every p2_pool_topk
 * block of a kv head rescales them itself, Z_h = sum_t z_t exp(m_t - m_h)
 * (double; every block of the head in the same fixed order, so all use the
 * same w_h). m_h and the pooled terms expf(scale * b - m_h) are bitwise
 * those of the two-pass sums; Z_h differs from them in the last bits (expf
 * of a different argument), within the ~1e-7 the CPU comparison already
 * allows for CUDA's expf. What it removes from the critical path: the pool
 * blocks' barrier (an atomic, a spin on the slowest block of the head) and
 * the second L2 round trip for the chunk partials. KVBENCH_PAGES_FUSE=1
 * keeps that barrier path (the pool blocks compute the chunk partials
 * exactly as p2_zpart would and meet at ctr[g]; all blocks must be resident
 * at once: checked by the occupancy, else the two launches) and
 * KVBENCH_PAGES_FUSE=0 the separate p2_zpart launch.
 * 2 and 3 are launched with programmatic dependent launch (their blocks
 * are scheduled while the previous kernel drains and wait for its data in
 * griddepcontrol.wait; KVBENCH_PAGES_PDL=0 launches them plainly), which
 * hides most of the two launch gaps.
 * With flag non-NULL (the correction) the blocks of a kv head whose flag
 * is 0 return at once: only the corrected heads are re-selected, in the
 * same launches. Numerics as the older path (pages_mean.cu): bounds bitwise
 * the CPU's; CUDA's expf within 2 ulp of glibc's and the order of the
 * double sums may swap pages whose pooled scores agree to ~1e-7. Byte
 * floor of the whole: the summaries (2 x D x 2 B per page and kv head for
 * float16) + q + the page ids; the bounds (4 B per page and query head) go
 * out to L2 and come back from it.
 * Measured on the H100 (session 5, 1M tokens, `kvbench bench --method
 * freekv`, select_spec): the tile partials against the barrier path 67.6
 * vs 69.5 us; the 4 KB candidate array (PDL blocks resident early) 67.6 vs
 * 68.4 us without PDL; the 8-page row padding: bound scan 56.7 vs 58.0 us.
 * Tried and slower, not kept: scan tiles sized to one whole wave of block
 * slots (400 pages, 656 blocks: scan 63.7 us), summaries stored as
 * contiguous 256-page tiles (59.4 us), the pool as thread-block clusters
 * with a shared-memory merge (pool 14.4 vs 11.2 us) and warp-level argmax
 * rounds instead of block rounds (14.2 vs 11.2 us). Session 6: the whole
 * selection inside the scan (each warp keeps the pages that fewer than kp
 * of its pivot pages bound from above in every head, the last block of a
 * kv head ranks them: exact, no pool launch) made select_spec 78.5 us
 * against 66.5 (the pivot rounds cost the scan ~60% more instructions and
 * ~8 of 64 pages a warp survive); not kept. Where the pool's ~9 us after
 * the scan go (H100, 1M tokens, %globaltimer stamps, session 6): it starts
 * 0.7 us after the scan's last block, has m_h and w_h 2.2-2.5 us later
 * (the loads, two block reductions), its pooled scores and kp argmax rounds
 * 3.2-3.6 us after that, arrives 1.4 us later (the stores, the fence, the
 * atomic) and the last block ends 1.8 us after. The rounds are now one
 * merge network where kp <= P2_KM = 4 (p2_block_top: each thread's best 4,
 * butterfly merges of sorted lists within the warp, one barrier, warp 0
 * over the warps; the last block's merge the same way; the selection is the
 * rounds' exactly): pool 10.5 vs 11.2 us, select_spec 66.5-66.9 vs
 * 66.8-67.2 us at 1M, three interleaved runs (KVBENCH_PAGES_KNET=0 keeps
 * the rounds). The fence.acq_rel form of the arrival and a warp-0-only
 * final merge measured within noise (session 6). Session 7, tried and not
 * kept (select_spec at 1M, each against this path in the same call): the
 * whole selection as ONE cooperative launch, blocks resident for the whole
 * selection claiming scan tiles from a counter, the bounds kept on chip,
 * each kv head pooled by the blocks holding its tiles once its tiles were
 * counted done, the head's last block merging (exact: the FreeKV, Quest and
 * golden GPU tests passed): 75.1-77.8 against 64.5-64.9 us (16K 16.6-17.4
 * against 15.5-15.6; a correction of one kv head 40.3-46.5 against
 * 31.0-31.5). Its %globaltimer trace at 1M: the blocks' first stage lands
 * 2.9 / 6.3 / 14.1 us (min / median / max) after the first block starts,
 * the scans end 37.4 / 46.6 / 60.0 us in (this path's last scan block ends
 * at ~51), and a block holding tiles of two kv heads pools them one after
 * the other; 128-page tiles balanced the scan better (ends 42.5-55.2) but
 * made the merges longer (select_spec 91-93 us); a plain launch instead of
 * the cooperative one, 77.3 against 77.4. The pool with 2 or 4 pages a
 * thread instead of 8: 67.6-67.7 and 66.7-66.8 against 66.1-66.6 us (at 16K
 * 14.3-14.4 against 14.8-14.9). Ring shapes (stages x bytes) 7 x 8 KB, 4 x
 * 16 KB, 8 x 4 KB: 68.9-69.0, 66.2-66.5, 70.8-71.0 against 66.2 (5 x 8 KB).
 * Session 8 (1M tokens, H100, `kvbench bench --tokens 1048576`: 1M the
 * first length of the process; as a later length select_spec lost the ~2 us
 * the pool's PDL launch gains, 65.0-65.7 us, because the bench made a new
 * stream per length: session 9 below; two runs each in one call): the scan with one
 * product per channel and head (the row q's sign picks; it was two products,
 * a compare and a select) and its first stages issued before q is loaded:
 * bound scan 55.4-55.6 us, select_spec 63.1-63.3, against 56.1-56.3 and
 * 65.8-66.0 for the session 7 scan; the q-load move alone 55.3 and
 * 64.6-64.7; the one product alone (call 1, 1M after 16K and 128K) 57.6-57.8
 * and 68.5-68.8 against 56.4-56.7 and 66.1-66.4, so the gain needs both (as
 * a later length, on the stream made per length, 65.0-65.7). What is
 * left of the arithmetic: the same scan with it removed (wrong bounds, a
 * measurement) 53.8-54.0 and 61.9-62.0. A 3 x 16 KB ring: scan 54.6 us but
 * select_spec 63.8-64.0 (48 KB blocks leave no room for the pool's early
 * PDL blocks). The scan's access pattern alone (a dev microbenchmark, 134 MB,
 * the same ring with no arithmetic, 1024 blocks): 51.6 us, against 46.7 us
 * for a plain grid-stride read of the same bytes (4 x 16 B loads a thread in
 * flight, no barriers): not the layout (128 KB contiguous tiles 52.2 us,
 * 1 KB rows 51.1), and not the per-stage block barriers either, as session 9
 * found (the copy-engine ring below has none and scans as fast). A ring per
 * warp (a quarter of the bytes for its own 64 pages, a warp barrier per
 * stage, no block barrier) was slower: bound scan 58.4-58.5 us,
 * select_spec 66.3-66.4, against 55.5-55.7 and 63.5-63.8 for the block's ring
 * in the same call (three runs each; 128K 20.2 against 18.3).
 * Session 9 (H100, `kvbench bench --method freekv --tokens
 * 16384,131072,1048576`, three runs each in one call, select_spec at 1M):
 * the order effect was the benchmark's, not the kernels': a kv_bench_timer
 * made and destroyed its stream per length, and PDL gained nothing on the
 * streams made for the later lengths (why, inside the driver, is not known:
 * not device memory reuse, CUDA_DEVICE_MAX_CONNECTIONS or lazy module
 * loading, each tried); with one stream for the whole
 * process (kv_gpu_bench_stream_create) every length gets the overlap (1M
 * three times in one process: 63.4-63.6 us each, against 63.2-63.8 then
 * 64.8-65.8). Tried and not kept: the ring fed by the copy engine (a fifth
 * warp issuing one cp.async.bulk per channel row, full and empty mbarriers
 * per stage, no block barrier): bound scan 55.4-55.6 against 55.6-55.7, but
 * select_spec 63.8-64.1 against 63.4-63.8, and at 16K a 12.8-12.9 us scan
 * against 9.1; pool blocks of 512 threads x 8 or 4 pages a thread, or 256 x
 * 16, against 256 x 8: 66.0-66.2, 64.5-64.7, 65.4-65.6 against 63.5-63.7;
 * scan blocks of 256 threads (512-page tiles; or 256-page tiles, one page a
 * thread): 63.8-63.9 and 66.1-66.2 against 63.3-63.7 (16K 17.0-17.2 against
 * 15.2-15.3); 4 pages a scan thread (KVBENCH_PAGES_PPT=4, 512 blocks of
 * 512-page tiles): 63.1-64.2 at 1M but 21.3 us at 16K.
 * Session 10 (H100, `kvbench bench --method freekv`, three interleaved runs
 * each in one call, select_spec / bound scan in us): p2_rscan, the scan
 * without the ring. At 1M with 106 registers (4 blocks an SM): scan
 * 49.2-49.8 against the ring's 55.4-55.7, but select_spec only 61.7-62.2
 * against 63.4-63.8: its blocks filled the register file, so the pool's PDL
 * blocks waited for scan blocks to end (tail 12.3 us against 7.9). Capped at
 * 96 registers (__launch_bounds__ 5 blocks, 4 blocks an SM and one pool
 * block beside them): 56.8-57.4 at 1M (78-79% of copy bandwidth) against
 * 62.0-62.2 uncapped and 63.4-63.8 for the ring in the same call; 4-channel
 * batches (72 registers) 57.3-57.5; 2 pages a thread (1024 blocks, 4-byte
 * loads) scan 51.2-51.4; __ldg instead of the evict-first __ldcs: scan
 * 52.0-52.4, select_spec 64.5-64.8. The ring stays below 256 blocks: at
 * 262144 tokens (128 blocks) 22.3 against 26.5-26.6, at 524288 (256) the
 * register scan 34.8-35.1 against 38.0-38.5; at 16K and 128K it has too few
 * blocks (16.7-17.4 against 11.0-11.2 at 128K). The correction keeps the
 * ring (p2_use_rscan says why). The 2-page register scan was a knob
 * (KVBENCH_PAGES_RSCAN=2) for these calls, removed afterwards. The final
 * tree's device_check: select_spec 15.2 / 18.0 / 56.8 us at 16K / 128K / 1M
 * (79.2% at 1M), bound scan 49.4. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "ops/kv_cuda.h"
#include "pages_mean.cuh"

namespace {

constexpr int P2_TH = 128;        /* p2_scan threads per block */
constexpr int P2_ST = 5;          /* ring stages (P2_ST - 1 in flight) */
constexpr int P2_SB = 8192;       /* bytes per stage: CS channels x (min, max) x TP pages */
constexpr int P2_RT = 256;        /* p2_zpart / p2_pool_topk threads per block */
constexpr int P2_PPT = 8;         /* pages per thread there */
constexpr int P2_CHUNK = P2_RT * P2_PPT;
constexpr int P2_CCAP = 512;      /* candidates the last block holds in shared memory (4 KB: a pool block then fits
                                   beside 5 scan blocks on an SM, so its PDL launch is resident early) */

template <typename TS, int PPT> struct p2_cfg {
    static constexpr int TP = P2_TH * PPT;               /* pages per tile */
    static constexpr int ROWB = TP * (int)sizeof(TS);    /* bytes of one channel row of the tile */
    static constexpr int CS = P2_SB / (2 * ROWB);        /* channels per stage */
    static constexpr int CPR = ROWB / 16;                /* 16-byte chunks per row */
    static constexpr int EPC = 16 / (int)sizeof(TS);     /* pages per chunk */
    static_assert(CS >= 1 && (P2_SB / 16) % P2_TH == 0, "stage shape");
};

/* The register scan's loads: streaming (evict-first in L2, where the bounds the pool reads back live; __ldg
 * made the scan ~3 us slower at 1M, session 10). */
template <typename R> __device__ __forceinline__ R p2_ldr(const R *p) { return __ldcs(p); }

template <typename TS, int PPT> __device__ __forceinline__ void p2_lds(const unsigned char *p, float *o);
template <> __device__ __forceinline__ void p2_lds<__half, 1>(const unsigned char *p, float *o) {
    o[0] = __half2float(*(const __half *)p);
}
template <> __device__ __forceinline__ void p2_lds<__half, 2>(const unsigned char *p, float *o) {
    const __half2 v = *(const __half2 *)p;
    o[0] = __low2float(v); o[1] = __high2float(v);
}
template <> __device__ __forceinline__ void p2_lds<__half, 4>(const unsigned char *p, float *o) {
    const uint2 u = *(const uint2 *)p;
    const __half2 a = *(const __half2 *)&u.x, b = *(const __half2 *)&u.y;
    o[0] = __low2float(a); o[1] = __high2float(a); o[2] = __low2float(b); o[3] = __high2float(b);
}
template <> __device__ __forceinline__ void p2_lds<float, 1>(const unsigned char *p, float *o) { o[0] = *(const float *)p; }
template <> __device__ __forceinline__ void p2_lds<float, 2>(const unsigned char *p, float *o) {
    const float2 v = *(const float2 *)p;
    o[0] = v.x; o[1] = v.y;
}
template <> __device__ __forceinline__ void p2_lds<float, 4>(const unsigned char *p, float *o) {
    const float4 v = *(const float4 *)p;
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}

/* acc[h][p] += max(q_h[i] * mx[p], q_h[i] * mn[p]), rounded as the CPU (kv_pages_bound), as one product:
 * sq[h * D + i] holds q_h[i] and the byte offset in its stage of the row that wins, the max row of
 * channel i where q_h[i] > 0 and its min row otherwise. Bitwise the CPU's: rounding is monotone and a
 * summary's min <= max (or both NaN), so q > 0 gives q * mx >= q * mn and the CPU takes a = q * mx unless
 * they are equal (then b, the same value up to the sign of a zero, which acc, never -0, does not see);
 * q < 0 gives q * mn >= q * mx, and q = 0 or NaN leaves a > b false: the CPU takes b = q * mn, as here.
 * tests/test_temporal_gpu.c's edge cases (+0, -0, pages whose min is their max) check it. */
template <typename TS, int GT, int PPT>
__device__ __forceinline__ void p2_acc(float (&acc)[GT][PPT], const float2 *sq, int D, int i,
                                       const unsigned char *row) {
#pragma unroll
    for (int h = 0; h < GT; h++) {
        const float2 qs = sq[h * D + i];
        float v[PPT];
        p2_lds<TS, PPT>(row + __float_as_int(qs.y), v);
#pragma unroll
        for (int p = 0; p < PPT; p++) acc[h][p] = __fadd_rn(acc[h][p], __fmul_rn(qs.x, v[p]));
    }
}

template <typename TS, int GT, int PPT>
__global__ void __launch_bounds__(P2_TH) p2_scan(const TS *kmin, const TS *kmax, long long PS, const float *q, int D,
                                                 int ncand, float scale, const int *flag, float *bound, float *tmax,
                                                 double *tz, int ntile) {
    using C = p2_cfg<TS, PPT>;
    constexpr int K = P2_SB / 16 / P2_TH; /* 16-byte copies per thread and stage */
    extern __shared__ __align__(16) unsigned char p2_sm[];
    const int g = blockIdx.y, tile = blockIdx.x, j0 = tile * C::TP, t = threadIdx.x;
    kv_dep_launch(); /* p2_zpart's blocks may take free slots once every scan block has started */
    if (flag && !flag[g]) return; /* the whole block: this kv head is not corrected */
    float2 *sq = (float2 *)(p2_sm + P2_ST * P2_SB);
    /* this thread's K copies of every stage: the same row, column and shared offset each stage, the
     * source one stage (CS channel rows) further on; a copy past D or ncand zero-fills */
    const TS *src[K];
    int dst[K], chk[K];
    bool colok[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = t + k * P2_TH, r = c / C::CPR, col = c % C::CPR, ch = r % C::CS, jj = col * C::EPC;
        colok[k] = j0 + jj < ncand; /* PS is a multiple of 8 pages: no chunk crosses it */
        src[k] = (r < C::CS ? kmin : kmax) + (long long)g * D * PS + (long long)ch * PS + j0 + jj;
        dst[k] = r * C::ROWB + col * 16;
        chk[k] = ch;
    }
    const long long sstep = (long long)C::CS * PS;
    const int nst = (D + C::CS - 1) / C::CS;
    int ws = 0; /* the ring slot the next issue writes */
    auto issue = [&](int s) {
        unsigned char *dstb = p2_sm + ws * P2_SB;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const bool ok = colok[k] && s * C::CS + chk[k] < D;
            kv_cp16_n(dstb + dst[k], ok ? (const void *)(src[k] + s * sstep) : (const void *)kmin, ok ? 16 : 0);
        }
        ws = ws + 1 == P2_ST ? 0 : ws + 1;
    };
#pragma unroll
    for (int s = 0; s < P2_ST - 1; s++) {
        if (s < nst) issue(s);
        kv_cp_commit();
    }
    /* q after the copies are under way: its load's latency hides behind theirs (sq is read after the
     * loop's first barrier) */
    for (int e = t; e < GT * D; e += P2_TH) {
        const float qe = q[(long long)g * GT * D + e];
        sq[e] = make_float2(qe, __int_as_float(((qe > 0.f ? C::CS : 0) + e % D % C::CS) * C::ROWB));
    }
    float acc[GT][PPT];
#pragma unroll
    for (int h = 0; h < GT; h++)
#pragma unroll
        for (int p = 0; p < PPT; p++) acc[h][p] = 0.f;
    const int off = t * PPT * (int)sizeof(TS);
    int rs = 0; /* the ring slot stage s is in */
    for (int s = 0; s < nst; s++) {
        kv_cp_wait<P2_ST - 2>(); /* stage s has landed (this thread's copies) */
        __syncthreads();      /* everyone's copies of stage s, and everyone is done with stage s - 1 */
        if (s + P2_ST - 1 < nst) issue(s + P2_ST - 1); /* into stage s - 1's buffer */
        kv_cp_commit();
        const unsigned char *sb = p2_sm + rs * P2_SB + off;
        rs = rs + 1 == P2_ST ? 0 : rs + 1;
        const int i0 = s * C::CS;
        if (i0 + C::CS <= D) {
#pragma unroll
            for (int ch = 0; ch < C::CS; ch++) p2_acc<TS, GT, PPT>(acc, sq, D, i0 + ch, sb);
        } else {
            for (int ch = 0; ch < D - i0; ch++) p2_acc<TS, GT, PPT>(acc, sq, D, i0 + ch, sb);
        }
    }
    pm_tile_out<GT, PPT, P2_TH>(acc, g, tile, j0, PS, ncand, scale, bound, tmax, tz, ntile);
}

constexpr int P2_RPPT = 4; /* p2_rscan: pages per thread (a tile of P2_TH * P2_RPPT = 512 pages) */
constexpr int P2_RB = 64;  /* p2_rscan: bytes of min rows (and as many of max rows) per thread and load batch */
template <typename TS> __host__ __device__ constexpr int p2_rcb() { return P2_RB / (P2_RPPT * (int)sizeof(TS)); }
/* The register scan's raw loads: P2_RPPT summaries of one channel row (8 bytes of __half, 16 of float). */
template <typename TS> struct p2_raw;
template <> struct p2_raw<__half> { using type = uint2; };
template <> struct p2_raw<float> { using type = uint4; };

/* p2_rscan: the bound scan with the summaries loaded straight into registers (no shared-memory ring): a thread
 * owns PPT = P2_RPPT consecutive pages, a block of P2_TH threads a tile of P2_TH * PPT, and the thread reads
 * its pages' min and max rows CB = p2_rcb channels at a time into one of two register buffers while it sums
 * the other one, so 2 x CB rows of min and max per thread are in flight between the sums (no block barrier,
 * nothing staged in shared memory but q). Sums, products and the row the sign of q picks as p2_acc (bitwise the CPU's);
 * output as p2_scan (pm_tile_out). Needs D % (2 * CB) == 0. Pages past ncand in a thread's last load are
 * the summaries' padding (PS is a multiple of 8 pages), read and never written; a thread wholly past ncand
 * reads page 0's rows. At most 96 registers for groups of 2 (104 for 1, whose pool block is smaller): four
 * blocks an SM then leave room for one block of p2_pool_topk, whose PDL launch is resident before the scan
 * ends (the pool's ~8 us instead of ~12 after the scan at 1M; groups of 4 and 8 would spill). */
template <typename TS, int GT>
__global__ void __launch_bounds__(P2_TH, GT == 2 ? 5 : 4)
    p2_rscan(const TS *kmin, const TS *kmax, long long PS, const float *q, int D, int ncand, float scale,
             const int *flag, float *bound, float *tmax, double *tz, int ntile) {
    constexpr int PPT = P2_RPPT, CB = p2_rcb<TS>();
    using R = typename p2_raw<TS>::type;
    extern __shared__ __align__(16) unsigned char p2_sm[];
    float *sq = (float *)p2_sm; /* [GT][D] */
    const int g = blockIdx.y, tile = blockIdx.x, j0 = tile * P2_TH * PPT, t = threadIdx.x, jt = j0 + t * PPT;
    kv_dep_launch();
    if (flag && !flag[g]) return;
    const long long rs = PS / PPT, base = ((long long)g * D * PS + (jt < ncand ? jt : 0)) / PPT;
    const R *pn = (const R *)kmin + base, *px = (const R *)kmax + base;
    R n0[CB], x0[CB], n1[CB], x1[CB];
    auto load = [&](R (&n)[CB], R (&x)[CB], int i0) {
#pragma unroll
        for (int c = 0; c < CB; c++) {
            n[c] = p2_ldr(pn + (i0 + c) * rs);
            x[c] = p2_ldr(px + (i0 + c) * rs);
        }
    };
    float acc[GT][PPT];
    auto sum = [&](const R (&n)[CB], const R (&x)[CB], int i0) {
#pragma unroll
        for (int c = 0; c < CB; c++)
#pragma unroll
            for (int h = 0; h < GT; h++) {
                const float qh = sq[h * D + i0 + c];
                const R r = qh > 0.f ? x[c] : n[c];
                float v[PPT];
                p2_lds<TS, PPT>((const unsigned char *)&r, v);
#pragma unroll
                for (int p = 0; p < PPT; p++) acc[h][p] = __fadd_rn(acc[h][p], __fmul_rn(qh, v[p]));
            }
    };
    load(n0, x0, 0); /* the first rows before q: q's latency hides behind theirs */
    for (int e = t; e < GT * D; e += P2_TH) sq[e] = q[(long long)g * GT * D + e];
#pragma unroll
    for (int h = 0; h < GT; h++)
#pragma unroll
        for (int p = 0; p < PPT; p++) acc[h][p] = 0.f;
    __syncthreads();
    for (int i0 = 0; i0 < D; i0 += 2 * CB) {
        load(n1, x1, i0 + CB);
        sum(n0, x0, i0);
        if (i0 + 2 * CB < D) load(n0, x0, i0 + 2 * CB);
        sum(n1, x1, i0 + CB);
    }
    pm_tile_out<GT, PPT, P2_TH>(acc, g, tile, j0, PS, ncand, scale, bound, tmax, tz, ntile);
}

/* Block-wide max of v (every thread gets it). */
__device__ __forceinline__ float p2_bmax(float v, float *sw) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sw[0];
#pragma unroll
    for (int k = 1; k < P2_RT / 32; k++) v = fmaxf(v, sw[k]);
    __syncthreads();
    return v;
}
/* Block-wide sum of v in a fixed order (every thread gets it; the same inputs give the same bits). */
__device__ __forceinline__ double p2_bsum(double v, double *sw) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sw[0];
#pragma unroll
    for (int k = 1; k < P2_RT / 32; k++) v += sw[k];
    __syncthreads();
    return v;
}

/* Max of the ntile tile maxima of head h: this thread's share (strided). */
__device__ __forceinline__ float p2_tmax_part(const float *tmax, int ntile, int h) {
    float m = -INFINITY;
    for (int b = threadIdx.x; b < ntile; b += P2_RT) m = fmaxf(m, __ldcg(tmax + (long long)h * ntile + b));
    return m;
}

__global__ void __launch_bounds__(P2_RT) p2_zpart(const float *bound, long long PS, int ncand, float scale,
                                                  const int *flag, int G, const float *tmax, int ntile, double *zpart,
                                                  int nbz) {
    __shared__ float sw[P2_RT / 32];
    __shared__ double sd[P2_RT / 32];
    const int h = blockIdx.y, j0 = blockIdx.x * P2_CHUNK;
    kv_dep_launch();
    kv_dep_wait(); /* the scan's bounds and tile maxima */
    if (flag && !flag[h / G]) return;
    float b[P2_PPT];
#pragma unroll
    for (int p = 0; p < P2_PPT; p++) { /* issued before the max is known: both round trips at once */
        const int j = j0 + p * P2_RT + threadIdx.x;
        b[p] = j < ncand ? __ldcg(bound + (long long)h * PS + j) : 0.f;
    }
    const float m = p2_bmax(p2_tmax_part(tmax, ntile, h), sw);
    double z = 0;
#pragma unroll
    for (int p = 0; p < P2_PPT; p++)
        if (j0 + p * P2_RT + (int)threadIdx.x < ncand) z += (double)expf(__fmul_rn(scale, b[p]) - m);
    z = p2_bsum(z, sd);
    if (threadIdx.x == 0) zpart[(long long)h * nbz + blockIdx.x] = z;
}

struct p2_item {
    float v;
    int j; /* page; INT_MAX: none */
};
__device__ __forceinline__ bool p2_beats(p2_item a, p2_item b) { return a.v > b.v || (a.v == b.v && a.j < b.j); }
/* a comes after prev in the selection order (prev already taken). */
__device__ __forceinline__ bool p2_after(p2_item a, p2_item prev) {
    return a.j != INT_MAX && (a.v < prev.v || (a.v == prev.v && a.j > prev.j));
}
/* The block's best item (every thread gets it); p2_block_best1 leaves out the trailing barrier (the fused
 * pool's rounds alternate two shared arrays instead). */
__device__ __forceinline__ p2_item p2_block_best1(p2_item b, p2_item *sw) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        p2_item x;
        x.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        x.j = __shfl_xor_sync(0xffffffffu, b.j, o);
        if (p2_beats(x, b)) b = x;
    }
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = b;
    __syncthreads();
    b = sw[0];
#pragma unroll
    for (int k = 1; k < P2_RT / 32; k++)
        if (p2_beats(sw[k], b)) b = sw[k];
    return b;
}
__device__ __forceinline__ p2_item p2_block_best(p2_item b, p2_item *sw) {
    b = p2_block_best1(b, sw);
    __syncthreads();
    return b;
}

/* The fused pool's reductions: all GT heads at once, one __syncthreads each, no trailing one (every call
 * gets its own shared array, or the other half of a pair); per head the same order as p2_bmax / p2_bsum /
 * p2_block_best, so the same bits. */
template <int GT> __device__ __forceinline__ void p2_bmax_n(float (&v)[GT], float (*sw)[P2_RT / 32]) {
#pragma unroll
    for (int h = 0; h < GT; h++) {
#pragma unroll
        for (int o = 16; o; o >>= 1) v[h] = fmaxf(v[h], __shfl_xor_sync(0xffffffffu, v[h], o));
        if ((threadIdx.x & 31) == 0) sw[h][threadIdx.x >> 5] = v[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GT; h++) {
        v[h] = sw[h][0];
#pragma unroll
        for (int k = 1; k < P2_RT / 32; k++) v[h] = fmaxf(v[h], sw[h][k]);
    }
}
template <int GT> __device__ __forceinline__ void p2_bsum_n(double (&v)[GT], double (*sw)[P2_RT / 32]) {
#pragma unroll
    for (int h = 0; h < GT; h++) {
#pragma unroll
        for (int o = 16; o; o >>= 1) v[h] += __shfl_xor_sync(0xffffffffu, v[h], o);
        if ((threadIdx.x & 31) == 0) sw[h][threadIdx.x >> 5] = v[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GT; h++) {
        v[h] = sw[h][0];
#pragma unroll
        for (int k = 1; k < P2_RT / 32; k++) v[h] += sw[h][k];
    }
}
/* The best P2_KM items as a list sorted best first (p2_beats order); for kp <= P2_KM the pool's selections are
 * one merge network with one block barrier instead of kp rounds of block argmax with one each. */
constexpr int P2_KM = 4;
struct p2_top {
    p2_item e[P2_KM];
};
__device__ __forceinline__ void p2_cswap(p2_item &a, p2_item &b) { /* a the better afterwards */
    if (p2_beats(b, a)) {
        const p2_item t = a;
        a = b;
        b = t;
    }
}
__device__ __forceinline__ void p2_top_init(p2_top &t) {
#pragma unroll
    for (int i = 0; i < P2_KM; i++) t.e[i] = p2_item{-INFINITY, INT_MAX};
}
__device__ __forceinline__ void p2_top_add(p2_top &t, p2_item y) {
#pragma unroll
    for (int i = 0; i < P2_KM; i++) p2_cswap(t.e[i], y);
}
/* t = the best P2_KM of t and u (both sorted): the better of t[i] and u[P2_KM - 1 - i] is a bitonic sequence
 * holding them, then a bitonic clean-up sorts it. */
__device__ __forceinline__ void p2_top_merge(p2_top &t, const p2_top &u) {
#pragma unroll
    for (int i = 0; i < P2_KM; i++)
        if (p2_beats(u.e[P2_KM - 1 - i], t.e[i])) t.e[i] = u.e[P2_KM - 1 - i];
#pragma unroll
    for (int d = P2_KM / 2; d; d >>= 1)
#pragma unroll
        for (int i = 0; i < P2_KM; i++)
            if ((i & d) == 0) p2_cswap(t.e[i], t.e[i + d]);
}
/* Butterfly merges of the lanes' lists, lane distances o0, o0 / 2, .., 1 (whole warps). */
__device__ __forceinline__ void p2_warp_top(p2_top &t, int o0) {
    for (int o = o0; o; o >>= 1) {
        p2_top u;
#pragma unroll
        for (int i = 0; i < P2_KM; i++) {
            u.e[i].v = __shfl_xor_sync(0xffffffffu, t.e[i].v, o);
            u.e[i].j = __shfl_xor_sync(0xffffffffu, t.e[i].j, o);
        }
        p2_top_merge(t, u);
    }
}
/* The block's best P2_KM (valid in thread 0): butterfly merges in each warp, then warp 0 over the warps' lists
 * (one barrier). sw: P2_RT / 32 lists of shared scratch. */
__device__ __forceinline__ p2_top p2_block_top(p2_top t, p2_top *sw) {
    p2_warp_top(t, 16);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sw[w] = t;
    __syncthreads();
    if (w == 0) {
        if (lane < P2_RT / 32) t = sw[lane];
        else p2_top_init(t);
        p2_warp_top(t, P2_RT / 64);
    }
    return t;
}

/* Round r of a block argmax: p2_block_best, or (FZ) p2_block_best1 on the r-th half of sb2. */
template <bool FZ>
__device__ __forceinline__ p2_item p2_round_best(p2_item x, int r, p2_item *sbest, p2_item (*sb2)[P2_RT / 32]) {
    return FZ ? p2_block_best1(x, sb2[r & 1]) : p2_block_best(x, sbest);
}


/* ZM: where the softmax sums come from (p2_zmode). ZM 2 (the default): the scan's tile partials (above).
 * ZM 1 (fused softmax sums): the block computes its chunk's partials itself, exactly as
 * p2_zpart (same pages per thread, same m_h, same p2_bsum order, so the same bits), writes them, and
 * waits at a barrier of the kv head's blocks (ctr[g] counts to gridDim.x) instead of a kernel boundary;
 * the merge's last block is then the one that brings ctr[g] to 2 * gridDim.x. Needs all blocks resident
 * at once (p2_pool_go checks the occupancy, else launches p2_zpart and ZM 0). ZM 0: p2_zpart's partials. */
template <int GT, int ZM>
__global__ void __launch_bounds__(P2_RT) p2_pool_topk(const float *bound, long long PS, int ncand, float scale,
                                                      const int *flag, const float *tmax, int ntile, const double *tz,
                                                      double *zpart, int nbz, int kp, float *cv, int *cj,
                                                      unsigned *ctr, int32_t *pages, int knet) {
    constexpr bool FZ = ZM == 1, ALT = ZM != 0;
    __shared__ float swf[P2_RT / 32];
    __shared__ double swd[P2_RT / 32];
    __shared__ float sfm[ALT ? GT : 1][P2_RT / 32];  /* ZM 1, 2: m_h */
    __shared__ double sdz[ALT ? 2 * GT : 1][P2_RT / 32]; /* ZM 1: chunk partials, then Z_h; ZM 2: Z_h */
    __shared__ p2_item sbest[P2_RT / 32];
    __shared__ p2_item sb2[2][P2_RT / 32];          /* ZM 1, 2: the argmax rounds, alternating */
    __shared__ p2_item scand[P2_CCAP];
    const int g = blockIdx.y, j0 = blockIdx.x * P2_CHUNK;
    kv_dep_wait(); /* p2_zpart's partials (and, through it, the scan's bounds) */
    if (flag && !flag[g]) return;
    /* every load this block needs before its first reduction: bounds, tile maxima, softmax partials */
    float b[GT][P2_PPT], mp[GT], mt[GT];
    double zp[GT];
#pragma unroll
    for (int h = 0; h < GT; h++) {
        const long long hr = (long long)(g * GT + h);
#pragma unroll
        for (int p = 0; p < P2_PPT; p++) {
            const int j = j0 + p * P2_RT + threadIdx.x;
            b[h][p] = j < ncand ? __ldcg(bound + hr * PS + j) : 0.f;
        }
        if (ZM == 2) { /* this thread's first tile: its max and softmax partial, kept for the rescale */
            const bool has = (int)threadIdx.x < ntile;
            mt[h] = has ? __ldcg(tmax + hr * ntile + threadIdx.x) : -INFINITY;
            zp[h] = has ? __ldcg(tz + hr * ntile + threadIdx.x) : 0.0;
            mp[h] = mt[h];
            for (int c = threadIdx.x + P2_RT; c < ntile; c += P2_RT) mp[h] = fmaxf(mp[h], __ldcg(tmax + hr * ntile + c));
        } else {
            mp[h] = p2_tmax_part(tmax, ntile, g * GT + h);
            double z = 0;
            if (ZM == 0)
                for (int c = threadIdx.x; c < nbz; c += P2_RT) z += __ldcg(zpart + hr * nbz + c);
            zp[h] = z;
        }
    }
    float m[GT], w[GT];
    if (ALT) { /* ZM 1, 2: every head's m_h in one reduction */
#pragma unroll
        for (int h = 0; h < GT; h++) m[h] = mp[h];
        p2_bmax_n<GT>(m, sfm);
    }
    if (ZM == 2) { /* Z_h = sum over tiles of z_t exp(m_t - m_h), in tile order within a thread, then p2_bsum_n */
        double z[GT];
#pragma unroll
        for (int h = 0; h < GT; h++) {
            const long long hr = (long long)(g * GT + h) * ntile;
            z[h] = (int)threadIdx.x < ntile ? zp[h] * exp((double)mt[h] - (double)m[h]) : 0.0;
            for (int c = threadIdx.x + P2_RT; c < ntile; c += P2_RT)
                z[h] += __ldcg(tz + hr + c) * exp((double)__ldcg(tmax + hr + c) - (double)m[h]);
        }
        p2_bsum_n<GT>(z, sdz);
#pragma unroll
        for (int h = 0; h < GT; h++) w[h] = (float)(1.0 / (z[h] * GT));
    } else if (FZ) {
        /* b becomes expf(scale * b - m_h), the term of both the partial and the pooled score */
        double z[GT];
#pragma unroll
        for (int h = 0; h < GT; h++) {
            z[h] = 0;
#pragma unroll
            for (int p = 0; p < P2_PPT; p++) {
                b[h][p] = expf(__fmul_rn(scale, b[h][p]) - m[h]);
                if (j0 + p * P2_RT + (int)threadIdx.x < ncand) z[h] += (double)b[h][p];
            }
        }
        p2_bsum_n<GT>(z, sdz);
        if (threadIdx.x == 0) { /* the partials, then the barrier of the kv head's blocks */
#pragma unroll
            for (int h = 0; h < GT; h++) zpart[(long long)(g * GT + h) * nbz + blockIdx.x] = z[h];
            __threadfence();
            atomicAdd(ctr + g, 1u);
            while (kv_ld_acquire(ctr + g) < gridDim.x) {
            }
            __threadfence();
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < GT; h++) {
            z[h] = 0;
            for (int c = threadIdx.x; c < nbz; c += P2_RT) z[h] += __ldcg(zpart + (long long)(g * GT + h) * nbz + c);
        }
        p2_bsum_n<GT>(z, sdz + GT);
#pragma unroll
        for (int h = 0; h < GT; h++) w[h] = (float)(1.0 / (z[h] * GT));
    } else {
#pragma unroll
        for (int h = 0; h < GT; h++) {
            m[h] = p2_bmax(mp[h], swf);
            w[h] = (float)(1.0 / (p2_bsum(zp[h], swd) * GT));
        }
    }
    p2_item it[P2_PPT];
#pragma unroll
    for (int p = 0; p < P2_PPT; p++) {
        const int j = j0 + p * P2_RT + threadIdx.x;
        it[p].v = -INFINITY;
        it[p].j = INT_MAX;
        if (j < ncand) {
            float acc = 0.f;
#pragma unroll
            for (int h = 0; h < GT; h++) {
                const float e = FZ ? b[h][p] : expf(__fmul_rn(scale, b[h][p]) - m[h]);
                acc = __fadd_rn(acc, __fmul_rn(e, w[h]));
            }
            it[p].v = acc;
            it[p].j = j;
        }
    }
    __shared__ p2_top stop[P2_RT / 32];
    const bool net = kp <= P2_KM && knet; /* the merge network, else kp rounds */
    p2_item prev = {INFINITY, -1};
    const long long cb = ((long long)g * gridDim.x + blockIdx.x) * kp;
    if (net) {
        p2_top t;
        p2_top_init(t);
#pragma unroll
        for (int p = 0; p < P2_PPT; p++)
            if (it[p].j != INT_MAX) p2_top_add(t, it[p]);
        t = p2_block_top(t, stop);
        if (threadIdx.x == 0)
            for (int r = 0; r < kp; r++) { cv[cb + r] = t.e[r].v; cj[cb + r] = t.e[r].j; }
    } else {
        for (int r = 0; r < kp; r++) {
            p2_item x = {-INFINITY, INT_MAX};
#pragma unroll
            for (int p = 0; p < P2_PPT; p++)
                if (p2_after(it[p], prev) && (x.j == INT_MAX || p2_beats(it[p], x))) x = it[p];
            x = p2_round_best<ALT>(x, r, sbest, sb2);
            if (threadIdx.x == 0) { cv[cb + r] = x.v; cj[cb + r] = x.j; }
            prev = x;
        }
    }
    if (!kv_arrives_last(ctr + g, FZ ? 2 * gridDim.x : gridDim.x)) return;
    /* the last block of kv head g: the kp best of the chunks' candidates, read once */
    const int nc = gridDim.x * kp;
    const float *gv = cv + (long long)g * nc;
    const int *gj = cj + (long long)g * nc;
    if (net) { /* each thread its candidates, then the network */
        p2_top t;
        p2_top_init(t);
        for (int c = threadIdx.x; c < nc; c += P2_RT) p2_top_add(t, p2_item{__ldcg(gv + c), __ldcg(gj + c)});
        t = p2_block_top(t, stop);
        if (threadIdx.x == 0) {
            for (int r = 0; r < kp; r++) pages[(long long)g * kp + r] = t.e[r].j;
            ctr[g] = 0; /* ready for the next launch */
        }
        return;
    }
    const bool insm = nc <= P2_CCAP;
    if (insm)
        for (int c = threadIdx.x; c < nc; c += P2_RT) scand[c] = p2_item{__ldcg(gv + c), __ldcg(gj + c)};
    __syncthreads();
    prev = p2_item{INFINITY, -1};
    for (int r = 0; r < kp; r++) {
        p2_item x = {-INFINITY, INT_MAX};
        for (int c = threadIdx.x; c < nc; c += P2_RT) {
            const p2_item y = insm ? scand[c] : p2_item{__ldcg(gv + c), __ldcg(gj + c)};
            if (p2_after(y, prev) && (x.j == INT_MAX || p2_beats(y, x))) x = y;
        }
        x = p2_round_best<ALT>(x, r, sbest, sb2);
        if (threadIdx.x == 0) pages[(long long)g * kp + r] = x.j;
        prev = x;
    }
    if (threadIdx.x == 0) ctr[g] = 0; /* ready for the next launch */
}

/* The pool's selections by the top-P2_KM merge network where kp <= P2_KM (KVBENCH_PAGES_KNET=0: kp rounds of block
 * argmax; read once). */
int p2_knet() {
    static const int on = kv_env_on("KVBENCH_PAGES_KNET");
    return on;
}

/* Where the pool's softmax sums come from (read once): 2 (default) the scan's tile partials, rescaled in
 * every pool block; KVBENCH_PAGES_FUSE=1 the pool blocks' chunk partials behind a barrier of the kv head's
 * blocks (only when all of them fit on the device at once: the barrier spins; else 0); =0 p2_zpart's launch. */
int p2_zmode() {
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("KVBENCH_PAGES_FUSE");
        env = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : 2;
    }
    return env;
}

template <typename TS, int GT, int PPT> kv_status p2_scan_go(const pm_args *a, int ntile, cudaStream_t st) {
    const size_t sm = (size_t)P2_ST * P2_SB + (size_t)GT * a->D * sizeof(float2);
    static bool attr = false; /* one instantiation, one device: set once */
    if (!attr) {
        KV_CUDA_TRY(cudaFuncSetAttribute(p2_scan<TS, GT, PPT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         P2_ST * P2_SB + 48 * 1024));
        KV_CUDA_TRY(cudaFuncSetAttribute(p2_scan<TS, GT, PPT>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         (int)cudaSharedmemCarveoutMaxShared));
        attr = true;
    }
    p2_scan<TS, GT, PPT><<<dim3(ntile, a->Hkv), P2_TH, sm, st>>>((const TS *)a->kmin, (const TS *)a->kmax, a->PS, a->q,
                                                                  a->D, a->ncand, a->scale, a->flag, a->bound, a->bmax,
                                                                  p2_zmode() == 2 ? a->tz : nullptr, ntile);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

template <typename TS, int GT> kv_status p2_rscan_go(const pm_args *a, int ntile, cudaStream_t st) {
    p2_rscan<TS, GT><<<dim3(ntile, a->Hkv), P2_TH, (size_t)GT * a->D * sizeof(float), st>>>(
        (const TS *)a->kmin, (const TS *)a->kmax, a->PS, a->q, a->D, a->ncand, a->scale, a->flag, a->bound, a->bmax,
        p2_zmode() == 2 ? a->tz : nullptr, ntile);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* f(std::integral_constant<int, G>) for the group sizes the kernels are built for (1, 2, 4, 8). */
template <class F> kv_status p2_by_group(int G, F &&f) {
    switch (G) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return kv_fail(KV_ERR_INTERNAL, "pages GPU: group of %d", G);
    }
}

template <typename TS> kv_status p2_rscan_g(const pm_args *a, int ntile, cudaStream_t st) {
    return p2_by_group(a->G, [&](auto gt) { return p2_rscan_go<TS, decltype(gt)::value>(a, ntile, st); });
}

template <typename TS, int PPT> kv_status p2_scan_g(const pm_args *a, int ntile, cudaStream_t st) {
    return p2_by_group(a->G, [&](auto gt) { return p2_scan_go<TS, decltype(gt)::value, PPT>(a, ntile, st); });
}

/* Launch with programmatic stream serialization (PDL) unless KVBENCH_PAGES_PDL=0 (read once): the
 * kernel's launch and block scheduling overlap the previous kernel's tail, kv_dep_wait orders the
 * data. A launch the driver refuses with the attribute is retried plainly. */
template <typename... A, typename... B>
kv_status p2_launch_pdl(void (*k)(A...), dim3 grid, cudaStream_t st, B &&...args) {
    static int pdl = kv_env_on("KVBENCH_PAGES_PDL"); /* cleared if the driver refuses the attribute */
    return kv_launch(&pdl, "pages GPU", k, grid, dim3(P2_RT), 0, st, args...);
}

/* Pages per scan thread: KVBENCH_PAGES_PPT=1|2|4 (an experiment knob, read once), else 2 when that still
 * gives >= 512 blocks (1M tokens, page 32, 8 kv heads: 1024 blocks of 256 pages), else 1. */
int p2_ppt(int ncand, int Hkv) {
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("KVBENCH_PAGES_PPT");
        env = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4")) ? atoi(e) : 0;
    }
    if (env) return env;
    return (long long)((ncand + 2 * P2_TH - 1) / (2 * P2_TH)) * Hkv >= 512 ? 2 : 1;
}

/* 1: the scan is p2_rscan, 0: the ring (p2_scan). Never where D is not a multiple of two load batches; else
 * KVBENCH_PAGES_RSCAN=0|1 (an experiment knob, read once) decides, or by default the register scan where its
 * tiles give >= 256 blocks (1M tokens, page 32, 8 kv heads: 512 blocks of 512 pages) and the launch is not a
 * correction (flag non-NULL). There only the blocks of the kv heads that fire work, and one head's 64 tiles
 * of 512 pages scan slower than its 128 ring tiles of 256 (at 1M, one head corrected 34.9 us against 29.5,
 * all eight 67.0 against 73.5; session 10, one call); results/real-traces.md has the traces' correction
 * rates, at which few heads fire at once. */
int p2_use_rscan(int ncand, int Hkv, int D, int half, const int *flag) {
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("KVBENCH_PAGES_RSCAN");
        env = e && (!strcmp(e, "0") || !strcmp(e, "1")) ? atoi(e) : 2;
    }
    if (D % (2 * (half ? p2_rcb<__half>() : p2_rcb<float>()))) return 0;
    if (env != 2) return env;
    return !flag && (long long)((ncand + P2_RPPT * P2_TH - 1) / (P2_RPPT * P2_TH)) * Hkv >= 256;
}

template <int GT> kv_status p2_pool_go(const pm_args *a, int ntile, int nbz, cudaStream_t st) {
    static int cap = -1;
    int zm = p2_zmode();
    if (zm == 1 && cap < 0) {
        int dev, nsm, per;
        KV_CUDA_TRY(cudaGetDevice(&dev));
        KV_CUDA_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
        KV_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, p2_pool_topk<GT, 1>, P2_RT, 0));
        cap = nsm * per;
    }
    if (zm == 1 && nbz * a->Hkv > cap) zm = 0;
    const dim3 grid(nbz, a->Hkv);
    auto pool = zm == 2 ? p2_pool_topk<GT, 2> : zm == 1 ? p2_pool_topk<GT, 1> : p2_pool_topk<GT, 0>;
    if (zm == 0)
        KV_TRY(p2_launch_pdl(p2_zpart, dim3(nbz, a->Hkv * GT), st, (const float *)a->bound, a->PS, a->ncand,
                             a->scale, (const int *)a->flag, GT, (const float *)a->bmax, ntile, a->zpart, nbz));
    return p2_launch_pdl(pool, grid, st, (const float *)a->bound, a->PS, a->ncand, a->scale, (const int *)a->flag,
                         (const float *)a->bmax, ntile, (const double *)a->tz, a->zpart, nbz, a->kp, a->cv, a->cj,
                         a->ctr, a->pages, p2_knet());
}

}  // namespace

kv_status pm2_launch(const pm_args *a, int which, cudaStream_t st) {
    const int G = a->G, ncand = a->ncand;
    if (a->PS % 8) return kv_fail(KV_ERR_INTERNAL, "pages GPU: page stride %lld not a multiple of 8", a->PS);
    if ((size_t)G * a->D * sizeof(float2) > 48 * 1024)
        return kv_fail(KV_ERR_INPUT, "pages GPU: group x head_dim too large (%d x %d)", G, a->D);
    const int rscan = p2_use_rscan(ncand, a->Hkv, a->D, a->half, a->flag);
    const int ppt = rscan ? P2_RPPT : p2_ppt(ncand, a->Hkv);
    const int tp = P2_TH * ppt, ntile = (ncand + tp - 1) / tp, nbz = (ncand + P2_CHUNK - 1) / P2_CHUNK;
    if (which <= 0) {
        kv_status s;
        if (rscan)
            s = a->half ? p2_rscan_g<__half>(a, ntile, st) : p2_rscan_g<float>(a, ntile, st);
        else if (a->half)
            s = ppt == 4 ? p2_scan_g<__half, 4>(a, ntile, st)
                : ppt == 2 ? p2_scan_g<__half, 2>(a, ntile, st) : p2_scan_g<__half, 1>(a, ntile, st);
        else
            s = ppt == 4 ? p2_scan_g<float, 4>(a, ntile, st)
                : ppt == 2 ? p2_scan_g<float, 2>(a, ntile, st) : p2_scan_g<float, 1>(a, ntile, st);
        KV_TRY(s);
    }
    if (which != 0)
        return p2_by_group(G, [&](auto gt) { return p2_pool_go<decltype(gt)::value>(a, ntile, nbz, st); });
    return KV_OK;
}
