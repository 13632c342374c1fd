/* csattention_kmeans.cuh: CSAttention's device k-means kernels (kmeans=gpu;
 * the design and its arithmetic are in csattention.cu's header comment),
 * included by csattention.cu inside its anonymous namespace (uses cs_dot). */

/* ---- cosine k-means, all (kv head, subspace) jobs at once (blockIdx.y = job) ---- */
/* pick[j] = (int)(draw0 * n) (the CPU's first centre). */
__global__ void km_first(const double *draws, int C, const int *npts, int jobs, int *pick) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < jobs) pick[j] = npts[j] > 0 ? (int)(draws[(size_t)j * C] * npts[j]) : 0;
}

/* centre c of job j <- point pick[j]. */
__global__ void km_set(const float *pts, int maxn, int ds, int C, int c, const int *pick, float *cent) {
    const int j = blockIdx.x;
    for (int d = threadIdx.x; d < ds; d += blockDim.x)
        cent[((size_t)j * C + c) * ds + d] = pts[((size_t)j * maxn + pick[j]) * ds + d];
}

/* dist[i] = min(dist[i], ||x_i - centre c||^2) in double, the CPU's order (c = 0: assign). */
__global__ void km_dist(const float *pts, int maxn, const int *npts, int ds, int C, int c, const float *cent,
                        double *dist) {
    const int j = blockIdx.y, n = npts[j];
    const float *cc = cent + ((size_t)j * C + c) * ds;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float *x = pts + ((size_t)j * maxn + i) * ds;
        double s = 0;
        for (int d = 0; d < ds; d++) {
            const double e = __dsub_rn((double)x[d], (double)cc[d]);
            s = __dadd_rn(s, __dmul_rn(e, e));
        }
        double *o = dist + (size_t)j * maxn + i;
        *o = c == 0 || s < *o ? s : *o;
    }
}

__device__ __forceinline__ double km_block_sum(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < nw; i++) t += sh[i];
    __syncthreads();
    return t;
}

/* One block per job: the next centre, the first i with dist > 0 whose inclusive prefix sum of dist
 * exceeds u * total (the last i with dist > 0 when rounding runs past the end); total == 0: fallback. */
__global__ void km_pick(const double *dist, int maxn, const int *npts, const double *draws, int C, int round,
                        int *pick, int *fallback) {
    __shared__ double sh[32], wsum[32];
    __shared__ int found, lastpos;
    const int j = blockIdx.x, n = npts[j], lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const double *dv = dist + (size_t)j * maxn;
    double part = 0;
    int lastp = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        part += dv[i];
        if (dv[i] > 0) lastp = i;
    }
    const double total = km_block_sum(part, sh);
    if (threadIdx.x == 0) { found = 0x7fffffff; lastpos = -1; }
    __syncthreads();
    atomicMax(&lastpos, lastp);
    __syncthreads();
    if (!(total > 0)) {
        if (threadIdx.x == 0) { fallback[j] = 1; pick[j] = 0; }
        return;
    }
    const double u = draws[(size_t)j * C + round + 1] * total;
    double carry = 0;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int i = c0 + threadIdx.x;
        const double v = i < n ? dv[i] : 0.0;
        double x = v;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) wsum[w] = x;
        __syncthreads();
        double pre = carry;
        for (int k = 0; k < w; k++) pre += wsum[k];
        double tot = carry;
        for (int k = 0; k < nw; k++) tot += wsum[k];
        const double run = pre + x;
        if (i < n && v > 0 && run > u) atomicMin(&found, i);
        __syncthreads();
        carry = tot;
        if (found != 0x7fffffff) break;
    }
    if (threadIdx.x == 0) pick[j] = found != 0x7fffffff ? found : lastpos;
}

/* asg[i] = the centre with the largest kv_dot_ref (ties: smaller). */
__global__ void km_assign(const float *pts, int maxn, const int *npts, int ds, int C, const float *cent, int *asg) {
    const int j = blockIdx.y, n = npts[j];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float *x = pts + ((size_t)j * maxn + i) * ds;
        int best = 0;
        float bv = -INFINITY;
        for (int c = 0; c < C; c++) {
            const float v = cs_dot(x, cent + ((size_t)j * C + c) * ds, ds);
            if (v > bv) { bv = v; best = c; }
        }
        asg[(size_t)j * maxn + i] = best;
    }
}

/* One block per (centre, job): the normalised sum of its points (double); empty: unchanged. */
__global__ void km_update(const float *pts, int maxn, const int *npts, int ds, int C, const int *asg, float *cent) {
    __shared__ double sh[32];
    __shared__ double ssum[128];
    const int c = blockIdx.x, j = blockIdx.y, n = npts[j];
    int cnt = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) cnt += asg[(size_t)j * maxn + i] == c;
    const double tc = km_block_sum((double)cnt, sh);
    if (tc == 0) return;
    for (int d = 0; d < ds; d++) {
        double a = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (asg[(size_t)j * maxn + i] == c) a += pts[((size_t)j * maxn + i) * ds + d];
        const double t = km_block_sum(a, sh);
        if (threadIdx.x == 0) ssum[d] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double nn = 0;
        for (int d = 0; d < ds; d++) nn = __dadd_rn(nn, __dmul_rn(ssum[d], ssum[d]));
        if (nn > 0) {
            const double inv = 1.0 / sqrt(nn);
            for (int d = 0; d < ds; d++) cent[((size_t)j * C + c) * ds + d] = (float)__dmul_rn(ssum[d], inv);
        }
    }
}
