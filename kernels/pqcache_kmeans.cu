/* pqcache_kmeans.cu: PQCache's CUDA build path (issue 5, point 1; the CPU
 * reference and the paper's facts are in retrievers/pqcache.c).
 *
 * k-means (build). Per (kv head g, sub-vector m) Lloyd from the CPU's seeded
 * picks: assignment = one cuBLAS SGEMM per sub-vector, batched over the kv
 * heads (S = X_m C_m, chunks of 2^18 keys), then an argmin kernel over
 * ||c||^2 - 2<x, c> (ties to the smaller centroid); update = per-block
 * partial sums in shared memory (double) flushed with double atomics, then
 * mean per centroid (an empty cluster keeps its centroid, as the CPU). The
 * sums are double as on the CPU, so equal assignments give the CPU's
 * centroids up to the last bit of a double sum; the assignment is where the
 * two can differ: the GEMM form rounds differently from the CPU's
 * sum_j (x_j - c_j)^2, so a key almost equidistant from two centroids (gap
 * ~1e-6 of |x|^2) may go to the other one, and from then on both runs may
 * drift. On well-separated data the codes are equal (tests).
 * Appended keys are encoded by a direct kernel that computes exactly
 * kv_pq_assign's float sums (no contraction), so equal centroids give equal
 * codes. recluster=N runs on the CPU (retrievers/pqcache.c) and uploads. */
#include "pqcache_dev.cuh"

namespace {

__device__ __forceinline__ void argmin_merge(float &d, int &c, float d2, int c2) {
    if (d2 < d || (d2 == d && c2 < c)) { d = d2; c = c2; }
}

/* ---- k-means ---- */
__global__ void pq_init(const float *x, long long xs, int D, int lo, int M, int dsub, int C, const int32_t *pick,
                        float *cent) {
    int gm = blockIdx.x, g = gm / M, m = gm % M;
    for (int e = threadIdx.x; e < dsub * C; e += blockDim.x) {
        int j = e / C, c = e % C;
        cent[(long long)gm * dsub * C + e] = x[g * xs + (long long)(lo + pick[gm * C + c]) * D + m * dsub + j];
    }
}

__global__ void pq_norms(const float *cent, int dsub, int C, float *cn) {
    int gm = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float a = 0.f;
        for (int j = 0; j < dsub; j++) {
            float v = cent[((long long)gm * dsub + j) * C + c];
            a = fmaf(v, v, a);
        }
        cn[gm * C + c] = a;
    }
}

/* One warp per key: code = argmin_c cn[c] - 2 S[i][c]. */
__global__ void pq_argmin(const float *S, long long sstride, const float *cn, int M, int m, int C, int np, int p0,
                          uint8_t *codes, long long TM) {
    int g = blockIdx.y, lane = threadIdx.x & 31;
    int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (i >= np) return;
    const float *s = S + g * sstride + (long long)i * C, *n = cn + (g * M + m) * C;
    float bd = INFINITY;
    int bc = 0x7fffffff;
    for (int c = lane; c < C; c += 32) argmin_merge(bd, bc, fmaf(-2.f, s[c], n[c]), c);
    for (int o = 16; o; o >>= 1) argmin_merge(bd, bc, __shfl_xor_sync(0xffffffffu, bd, o), __shfl_xor_sync(0xffffffffu, bc, o));
    if (lane == 0) codes[g * TM + (long long)(p0 + i) * M + m] = (uint8_t)bc;
}

/* Sums and counts per centroid; block = PQ_UPD keys of one (g, m). */
__global__ void pq_accum(const float *x, long long xs, int D, int lo, int cnt, int upd, int M, int dsub, int C,
                         const uint8_t *codes, long long TM, int use_smem, double *sum, int *count) {
    extern __shared__ double sm[];
    int gm = blockIdx.y, g = gm / M, m = gm % M;
    double *ssum = use_smem ? sm : sum + (long long)gm * C * dsub;
    int *scnt = use_smem ? (int *)(sm + C * dsub) : count + gm * C;
    if (use_smem) {
        for (int e = threadIdx.x; e < C * dsub; e += blockDim.x) sm[e] = 0;
        for (int e = threadIdx.x; e < C; e += blockDim.x) scnt[e] = 0;
        __syncthreads();
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int i0 = blockIdx.x * upd, i1 = min(cnt, i0 + upd);
    for (int i = i0 + w; i < i1; i += nw) {
        int c = codes[g * TM + (long long)(lo + i) * M + m];
        const float *xi = x + g * xs + (long long)(lo + i) * D + m * dsub;
        for (int j = lane; j < dsub; j += 32) atomicAdd(&ssum[c * dsub + j], (double)xi[j]);
        if (lane == 0) atomicAdd(&scnt[c], 1);
    }
    if (!use_smem) return;
    __syncthreads();
    for (int e = threadIdx.x; e < C * dsub; e += blockDim.x)
        if (sm[e] != 0) atomicAdd(&sum[(long long)gm * C * dsub + e], sm[e]);
    for (int e = threadIdx.x; e < C; e += blockDim.x)
        if (scnt[e]) atomicAdd(&count[gm * C + e], scnt[e]);
}

__global__ void pq_mean(const double *sum, const int *count, int dsub, int C, float *cent) {
    int gm = blockIdx.x;
    for (int e = threadIdx.x; e < C * dsub; e += blockDim.x) {
        int c = e / dsub, j = e % dsub, n = count[gm * C + c];
        if (n) cent[((long long)gm * dsub + j) * C + c] = (float)(sum[(long long)gm * C * dsub + e] / n);
    }
}

/* ---- encoding of one appended key: kv_pq_assign's sums, bitwise ---- */
__global__ void pq_encode(const float *key, const float *cent, int D, int M, int dsub, int C, int t, uint8_t *codes,
                          long long TM, uint8_t *code1) {
    __shared__ float bd_s[32];
    __shared__ int bc_s[32];
    int gm = blockIdx.x, g = gm / M, m = gm % M;
    const float *x = key + g * D + m * dsub, *cm = cent + (long long)gm * dsub * C;
    float bd = INFINITY;
    int bc = 0x7fffffff;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float d = 0.f;
        for (int j = 0; j < dsub; j++) {
            float e = __fsub_rn(x[j], cm[(long long)j * C + c]);
            d = __fadd_rn(d, __fmul_rn(e, e));
        }
        argmin_merge(bd, bc, d, c);
    }
    for (int o = 16; o; o >>= 1) argmin_merge(bd, bc, __shfl_xor_sync(0xffffffffu, bd, o), __shfl_xor_sync(0xffffffffu, bc, o));
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { bd_s[w] = bd; bc_s[w] = bc; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)(blockDim.x >> 5); i++) argmin_merge(bd, bc, bd_s[i], bc_s[i]);
        codes[g * TM + (long long)t * M + m] = (uint8_t)bc;
        code1[gm] = (uint8_t)bc;
    }
}


/* Codes of keys [lo, lo+cnt) of x ([Hkv][..][D], head stride xs) for the current centroids. */
kv_status pq_assign_all(kv_pq_gpu *p, pq_build_ws *w, long long xs, int lo, int cnt) {
    const float one = 1.f, zero = 0.f;
    const int M = p->M, C = p->C, ds = p->dsub;
    pq_norms<<<p->Hkv * M, 64, 0, p->st>>>(p->cent, ds, C, w->cn);
    KV_LAUNCH_CHECK();
    const long long sstride = (long long)(cnt < PQ_CHUNK ? cnt : PQ_CHUNK) * C;
    for (int m = 0; m < M; m++)
        for (int p0 = 0; p0 < cnt; p0 += PQ_CHUNK) {
            int np = cnt - p0 < PQ_CHUNK ? cnt - p0 : PQ_CHUNK;
            KV_CUBLAS_TRY(cublasSgemmStridedBatched(p->blas, CUBLAS_OP_N, CUBLAS_OP_N, C, np, ds, &one,
                                                    p->cent + (long long)m * ds * C, C, (long long)M * ds * C,
                                                    w->x + (long long)(lo + p0) * p->D + m * ds, p->D, xs, &zero,
                                                    w->S, C, sstride, p->Hkv));
            pq_argmin<<<dim3((np + 7) / 8, p->Hkv), 256, 0, p->st>>>(w->S, sstride, w->cn, M, m, C, np, lo + p0,
                                                                      p->codes, p->TM);
            KV_LAUNCH_CHECK();
        }
    return KV_OK;
}

}  // namespace

void pq_build_ws_free(pq_build_ws *w) {
    cudaFree(w->x); cudaFree(w->S); cudaFree(w->cn); cudaFree(w->sum); cudaFree(w->cnt); cudaFree(w->pick);
    *w = pq_build_ws{};
}

kv_status pq_alloc_ws(kv_pq_gpu *p, pq_build_ws *w, int cnt) {
    const size_t Hkv = p->Hkv, GM = Hkv * p->M, ch = cnt < PQ_CHUNK ? cnt : PQ_CHUNK;
    KV_CUDA_ALLOC(w->S, Hkv * ch * p->C * sizeof(float), 0, "k-means distance products");
    KV_CUDA_ALLOC(w->cn, GM * p->C * sizeof(float), 0, "k-means centroid norms");
    KV_CUDA_ALLOC(w->sum, GM * p->C * p->dsub * sizeof(double), 0, "k-means sums");
    KV_CUDA_ALLOC(w->cnt, GM * p->C * sizeof(int), 0, "k-means counts");
    KV_CUDA_ALLOC(w->pick, GM * p->C * sizeof(int32_t), 0, "k-means initial picks");
    return KV_OK;
}

kv_status pq_kmeans(kv_pq_gpu *p, pq_build_ws *w, long long xs, int lo, int cnt, int iters, const int32_t *picks) {
    const int GM = p->Hkv * p->M, C = p->C, ds = p->dsub;
    KV_CUDA_TRY(cudaMemcpyAsync(w->pick, picks, (size_t)GM * C * sizeof(int32_t), cudaMemcpyHostToDevice, p->st));
    pq_init<<<GM, 256, 0, p->st>>>(w->x, xs, p->D, lo, p->M, ds, C, w->pick, p->cent);
    KV_LAUNCH_CHECK();
    size_t sm = (size_t)C * ds * sizeof(double) + (size_t)C * sizeof(int);
    int use_smem = sm <= (size_t)p->dev.smem_optin;
    if (use_smem && sm > 48 * 1024)
        KV_CUDA_TRY(cudaFuncSetAttribute(pq_accum, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    /* keys per update block: enough blocks for every SM (the double atomics are slow), 256 .. PQ_UPD */
    long long u = (long long)cnt * GM / (4LL * p->dev.sm_count);
    const int upd = (int)(u < 256 ? 256 : u > PQ_UPD ? PQ_UPD : u);
    for (int it = 0; it < iters; it++) {
        KV_TRY(pq_assign_all(p, w, xs, lo, cnt));
        KV_CUDA_TRY(cudaMemsetAsync(w->sum, 0, (size_t)GM * C * ds * sizeof(double), p->st));
        KV_CUDA_TRY(cudaMemsetAsync(w->cnt, 0, (size_t)GM * C * sizeof(int), p->st));
        pq_accum<<<dim3((cnt + upd - 1) / upd, GM), 256, use_smem ? sm : 0, p->st>>>(
            w->x, xs, p->D, lo, cnt, upd, p->M, ds, C, p->codes, p->TM, use_smem, w->sum, w->cnt);
        KV_LAUNCH_CHECK();
        pq_mean<<<GM, 256, 0, p->st>>>(w->sum, w->cnt, ds, C, p->cent);
        KV_LAUNCH_CHECK();
    }
    return pq_assign_all(p, w, xs, lo, cnt);
}

namespace {

kv_status pq_copy_back(kv_pq_gpu *p, int lo, int n, float *cent, uint8_t *codes) {
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    if (cent) KV_CUDA_TRY(cudaMemcpy(cent, p->cent, (size_t)p->Hkv * p->D * p->C * sizeof(float), cudaMemcpyDeviceToHost));
    if (codes && n > lo)
        KV_CUDA_TRY(cudaMemcpy2D(codes + (size_t)lo * p->M, (size_t)p->T * p->M, p->codes + (size_t)lo * p->M,
                                 (size_t)p->TM, (size_t)(n - lo) * p->M, p->Hkv, cudaMemcpyDeviceToHost));
    return KV_OK;
}

/* Rows [0, n) of every kv head of k into the device's [Hkv][n][D] float32
 * array x: the float32 form in one copy, the float16 form widened on the
 * host a chunk of KV_HOST_ROWS_CHUNK positions at a time (no float32 copy of the layer
 * on the host: issue 12, goal 3; the widening is exact). */
kv_status pq_upload_keys(kv_pq_gpu *p, const kv_host_rows *k, int n, float *x) {
    const int H = p->Hkv, D = p->D;
    kv_rows_walk w;
    kv_status st = kv_rows_walk_start(&w, k, H, D, 0, n, "pqcache prefill chunk");
    const float *src;
    int a, c;
    size_t hs;
    while (st == KV_OK && (src = kv_rows_walk_next(&w, &a, &c, &hs))) {
        cudaError_t e = cudaMemcpy2DAsync(x + (size_t)a * D, (size_t)n * D * 4, src, hs * 4, (size_t)c * D * 4,
                                          (size_t)H, cudaMemcpyHostToDevice, p->st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(p->st); /* the walk's buffer is reused */
        if (e != cudaSuccess) st = kv_cuda_error(e, "uploading the prefill keys", __FILE__, __LINE__);
    }
    kv_rows_walk_end(&w);
    return st;
}

kv_status pq_build_go(kv_pq_gpu *p, pq_build_ws *w, const kv_host_rows *k, int n, int lo, int iters,
                      const int32_t *picks, float *cent, uint8_t *codes) {
    KV_CUDA_TRY(cudaMemsetAsync(p->cent, 0, (size_t)p->Hkv * p->D * p->C * sizeof(float), p->st));
    if (n > lo) {
        KV_CUDA_ALLOC(w->x, (size_t)p->Hkv * n * p->D * sizeof(float), 0, "k-means keys");
        KV_TRY(pq_upload_keys(p, k, n, w->x));
        KV_TRY(pq_alloc_ws(p, w, n - lo));
        KV_TRY(pq_kmeans(p, w, (long long)n * p->D, lo, n - lo, iters, picks));
    }
    return pq_copy_back(p, lo, n, cent, codes);
}

/* Keys per block of the tuple path's passes over the codes: about two
 * blocks per SM over all kv heads, 4096 .. 65536. */

}  // namespace

kv_status pq_gpu_build(kv_pq_gpu *p, const kv_host_rows *k, int n, int lo, int iters, const int32_t *picks,
                       float *cent, uint8_t *codes) {
    pq_build_ws w = {};
    kv_status st = pq_build_go(p, &w, k, n, lo, iters, picks, cent, codes);
    cudaStreamSynchronize(p->st);
    pq_build_ws_free(&w);
    return st;
}

kv_status pq_gpu_encode(kv_pq_gpu *p, int t, const float *key, uint8_t *codes) {
    KV_CUDA_TRY(cudaMemcpyAsync(p->key1, key, (size_t)p->Hkv * p->D * sizeof(float), cudaMemcpyHostToDevice, p->st));
    pq_encode<<<p->Hkv * p->M, p->C < 256 ? ((p->C + 31) / 32) * 32 : 256, 0, p->st>>>(
        p->key1, p->cent, p->D, p->M, p->dsub, p->C, t, p->codes, p->TM, p->code1);
    KV_LAUNCH_CHECK();
    if (codes) KV_CUDA_TRY(cudaMemcpyAsync(codes, p->code1, (size_t)p->Hkv * p->M, cudaMemcpyDeviceToHost, p->st));
    KV_CUDA_TRY(cudaStreamSynchronize(p->st));
    return KV_OK;
}

kv_status pq_gpu_upload(kv_pq_gpu *p, const float *cent, const uint8_t *codes, int lo, int n) {
    KV_CUDA_TRY(cudaMemcpy(p->cent, cent, (size_t)p->Hkv * p->D * p->C * sizeof(float), cudaMemcpyHostToDevice));
    if (n > lo)
        KV_CUDA_TRY(cudaMemcpy2D(p->codes + (size_t)lo * p->M, (size_t)p->TM, codes + (size_t)lo * p->M,
                                 (size_t)p->T * p->M, (size_t)(n - lo) * p->M, p->Hkv, cudaMemcpyHostToDevice));
    return KV_OK;
}

