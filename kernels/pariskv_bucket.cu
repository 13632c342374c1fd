/* pariskv_bucket.cu: ParisKV's bucket top-k on the GPU (kernels/pariskv.cu
 * runs it between the collision vote and the rerank): multi-block and
 * deterministic. The tile histograms come from the collision kernel (fused)
 * or from pk_hist_kernel; the row's threshold score comes from the row
 * histogram as kv_pariskv_bucket_topk finds it (retrievers/pariskv_codec.c),
 * each tile's output offset and share of the threshold ties from the tiles
 * before it (ties go to the smallest positions: the first `take` ties in
 * index order), then each tile compacts in index order with a block scan.
 * Either a scan kernel (one block per row) finds the threshold and offsets
 * for the compaction, or (fold) each tile's compaction block finds them
 * itself. The output equals the CPU's exactly. */
#include "pariskv_dev.cuh"

namespace {

/* Tile t of row r (positions base + t*TILE + [0, TILE) within [lo, end)):
 * its histogram (the bucket top-k on scores it did not compute itself). */
__global__ void pk_hist_kernel(const uint16_t *scores, long long ld, int base, int lo, int end, int nbins, int ntiles,
                               int *thist, int *ghist) {
    extern __shared__ int sh[]; /* [warps][nbins + 1] (pk_hist_smem) */
    kv_dep_wait();
    kv_dep_launch();
    uint16_t v[PK_PER_TH];
    pk_load16(scores + blockIdx.y * ld, base + (long long)blockIdx.x * PK_TILE + threadIdx.x * PK_PER_TH, lo, end, v);
    pk_tile_hist(v, sh, nbins, blockIdx.y, blockIdx.x, ntiles, thist, ghist);
}

/* One block per row (1024 threads): pk_scan_row (pariskv_dev.cuh). */
__global__ void pk_scan_kernel(const int *thist, const int *ghist, int nbins, int ntiles, int C, int *toff, int *teq,
                               int *thr_out) {
    extern __shared__ int hs[]; /* [nbins] */
    __shared__ int wsum[32];
    kv_dep_wait();
    kv_dep_launch();
    pk_scan_row(blockIdx.x, thist, ghist, nbins, ntiles, C, toff, teq, thr_out, hs, wsum);
}

/* Tile t of row r: its selected positions, in index order, at the tile's
 * offset. The threshold, the offset and the tile's share of the ties come
 * from pk_scan_kernel (toff, teq, thr_arr) or, FOLD, the block finds them
 * itself: the row's threshold and take by pk_row_thr
 * (every tile of the row finds the same), then from the tiles before it A
 * = their keys above the threshold and E = their keys at it (their suffix
 * sums): the offset is A + min(take, E), the first take ties in index
 * order going first, and the tile takes the first max(take - E, 0) of its
 * own. Folding saves the scan kernel's launch where the grid is one wave
 * (16K: search 41 -> 33 us with session 26's other changes); at 1M its 2048
 * blocks each redoing the row's scan cost 5 us more than the scan kernel
 * (session 26, call B), and the unfolded kernel is a template instance of
 * its own: the fold's code in it took 5 more registers, 4 blocks an SM
 * instead of 5, and 1M's search 1.5 us (call C). */
template <bool FOLD>
__global__ void pk_compact_kernel(const uint16_t *scores, long long ld, int base, int lo, int end, int nbins,
                                  int ntiles, int C, const int *thist, const int *ghist, const int *toff,
                                  const int *teq, const int *thr_arr, int32_t *cand, long long cand_ld) {
    extern __shared__ int hs[]; /* FOLD: [nbins] */
    __shared__ int wsum[32];
    __shared__ unsigned long long wae[32];
    kv_dep_wait();
    kv_dep_launch();
    const int r = blockIdx.y, t = blockIdx.x;
    const long long i0 = base + (long long)t * PK_TILE + threadIdx.x * PK_PER_TH;
    unsigned v[PK_PER_TH / 2];
    pk_load_w(scores + r * ld, i0, lo, end, v);
    int thr, off, take;
    if constexpr (!FOLD) {
        thr = thr_arr[r];
        off = toff[(long long)r * ntiles + t];
        take = teq[(long long)r * ntiles + t];
    } else {
        int rtake;
        pk_row_thr(r, ghist, nbins, C, hs, wsum, &thr, &rtake);
        unsigned long long ae = 0; /* A << 32 | E (each < 2^31) */
        for (int u = threadIdx.x; u < t; u += blockDim.x) {
            const int *tt = thist + ((long long)r * ntiles + u) * nbins;
            const int above = thr + 1 < nbins ? tt[thr + 1] : 0;
            ae += (unsigned long long)above << 32 | (unsigned)(tt[thr] - above);
        }
        ae = kv_block_reduce_w(ae, wae, [](unsigned long long x) {
            for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
            return x;
        }, 0ULL);
        const int A = (int)(ae >> 32), E = (int)(unsigned)ae;
        off = A + min(rtake, E);
        take = max(rtake - E, 0);
    }
    int32_t *out = cand + r * cand_ld + off;
    pk_tile_select(v, thr, take, i0, wsum, [&](int l, long long i) { out[l] = (int32_t)i; });
}

}  // namespace

/* The bucket top-k of rows of scores[r*ld + i], i in [lo, end) (base = lo
 * rounded down to 16): C positions per row to cand[r*cand_ld + j]; the
 * tile histograms are built here when with_hist, else the collision kernel
 * built them. */
kv_status pk_bucket(const uint16_t *scores, long long ld, int base, int lo, int end, int nbins, int ntiles, int R,
                    int C, int *thist, int *ghist, int *toff, int *teq, int *thr, int32_t *cand, long long cand_ld,
                    int with_hist, int fold, int *pdl, cudaStream_t st) {
    if (with_hist)
        KV_TRY(kv_launch(pdl, "pariskv GPU", pk_hist_kernel, dim3(ntiles, R), dim3(PK_TH),
                         pk_hist_smem(nbins), st, scores, ld, base, lo, end, nbins, ntiles, thist, ghist));
    if (!fold)
        KV_TRY(kv_launch(pdl, "pariskv GPU", pk_scan_kernel, dim3(R), dim3(1024), (size_t)nbins * 4, st,
                         (const int *)thist, (const int *)ghist, nbins, ntiles, C, toff, teq, thr));
    return kv_launch(pdl, "pariskv GPU", fold ? pk_compact_kernel<true> : pk_compact_kernel<false>, dim3(ntiles, R),
                     dim3(PK_TH), fold ? (size_t)nbins * 4 : 0, st, scores, ld, base, lo, end, nbins, ntiles, C,
                     (const int *)thist, (const int *)ghist, (const int *)toff, (const int *)teq, (const int *)thr,
                     cand, cand_ld);
}


namespace {
struct pk_topk_host {
    uint16_t *s;
    int *thist, *ghist, *toff, *teq, *thr;
    int32_t *cand;
    cudaStream_t st;
};
kv_status pk_topk_host_go(pk_topk_host *h, const uint16_t *score, int R, int n, int max_score, int c, int fold,
                          int32_t *out) {
    const int nbins = max_score + 1, ntiles = (n + PK_TILE - 1) / PK_TILE;
    const long long ld = ((long long)n + 15) & ~15LL;
    KV_CUDA_TRY(kv_stream_create(&h->st));
    KV_CUDA_ALLOC(h->s, (size_t)R * ld * 2, 0, "test scores");
    KV_CUDA_ALLOC(h->thist, (size_t)R * ntiles * nbins * 4, 0, "test tile histograms");
    KV_CUDA_ALLOC(h->ghist, (size_t)R * nbins * 4, 0, "test row histograms");
    KV_CUDA_ALLOC(h->toff, (size_t)R * ntiles * 4, 0, "test tile offsets");
    KV_CUDA_ALLOC(h->teq, (size_t)R * ntiles * 4, 0, "test tile ties");
    KV_CUDA_ALLOC(h->thr, (size_t)R * 4, 0, "test thresholds");
    KV_CUDA_ALLOC(h->cand, (size_t)R * c * 4, 0, "test candidates");
    /* on h->st, like every copy of this helper */
    KV_CUDA_TRY(cudaMemsetAsync(h->ghist, 0, (size_t)R * nbins * 4, h->st));
    KV_CUDA_TRY(cudaMemcpy2DAsync(h->s, (size_t)ld * 2, score, (size_t)n * 2, (size_t)n * 2, (size_t)R,
                                  cudaMemcpyHostToDevice, h->st));
    /* -1 everywhere first: a form that wrote nothing must not pass on an earlier call's memory */
    KV_CUDA_TRY(cudaMemsetAsync(h->cand, 0xff, (size_t)R * c * 4, h->st));
    int pdl = kv_env_on("KVBENCH_PK_PDL"); /* as the search launches them */
    KV_TRY(pk_bucket(h->s, ld, 0, 0, n, nbins, ntiles, R, c, h->thist, h->ghist, h->toff, h->teq, h->thr, h->cand, c,
                     1, fold, &pdl, h->st));
    KV_CUDA_TRY(cudaMemcpyAsync(out, h->cand, (size_t)R * c * 4, cudaMemcpyDeviceToHost, h->st));
    KV_CUDA_TRY(cudaStreamSynchronize(h->st));
    return KV_OK;
}
}  // namespace

kv_status pk_bucket_topk_host(const uint16_t *score, int R, int n, int max_score, int c, int fold, int32_t *out) {
    if (R < 1 || n < 1 || c < 1 || c > n || max_score < 0 || max_score > 4095)
        return kv_fail(KV_ERR_INPUT, "pariskv GPU bucket top-k: bad arguments (R %d n %d c %d)", R, n, c);
    pk_topk_host h = {};
    kv_status st = pk_topk_host_go(&h, score, R, n, max_score, c, fold, out);
    cudaFree(h.s); cudaFree(h.thist); cudaFree(h.ghist); cudaFree(h.toff); cudaFree(h.teq); cudaFree(h.thr); cudaFree(h.cand);
    if (h.st) cudaStreamDestroy(h.st);
    return st;
}
