/* ctkvr_fused.cuh: CTKVR's whole search as ONE kernel launch (issue 9,
 * point 4: the search is < 40 us at every length only without the
 * launch-and-latency cost of the staged path in ctkvr.cu). Included by
 * ctkvr.cu inside its anonymous namespace (it uses ct_dot, ct_tof).
 *
 * Grid (nb, Hkv), nb = ceil(C / CTF_SPB), 1024 threads. Every block scores
 * CTF_SPB slots of its kv head: each (slot, query head) cosine numerator is
 * a kv_dot_ref computed by 8 lanes (lane j sums the elements i = j mod 8 in
 * ascending order, as the reference's partial sum j; the 8 partials are
 * combined by width-8 shuffles in the reference's tree), so the cosines are
 * bitwise the staged ct_cos's. Each block ranks its slots (order-preserving
 * keys, ties to the smaller slot: kv_topk_ref's order) and writes its best
 * min(C', CTF_SPB); the kv head's last block to arrive (threadfence
 * reduction, counter reset by it) merges those into the exact top C' (the
 * union of per-block top C' holds the global top C' under a strict total
 * order), gathers the C' lists into shared memory, bitonic-sorts and
 * deduplicates them (ascending, as the CPU's qsort), appends [gen_lo, hi),
 * then reranks in the same block: per query head the set's scores
 * (kv_dot_ref order, bitwise), the row's max (float) and sum of exp
 * (double, block tree: another order than the CPU's, the documented tie),
 * the ranking max over the group of float(s - lse), and the top k (and
 * DCU's top rho) by a shared-memory radix select on kv_f2key (ties at the
 * threshold to the smaller set position = smaller key, as kv_topk_ref),
 * the selected ones ordered by counting. No host round trip, no allocation,
 * no memset. Limits (else ctkvr.cu runs the staged path): the set <=
 * CTF_CAP keys, the per-block candidates <= CTF_CAP, the shared memory
 * within the device's opt-in. Bytes the search must read: the slot queries
 * (C x Hq x D x 4 B), the C' lists (4 B/entry) and the union's keys
 * (D x 2 B each in float16): about 17 MB at C = 2048, i.e. ~6 us at 3 TB/s;
 * the rest is latency. */

constexpr int CTF_TH = 1024, CTF_SPB = 128, CTF_CAP = 4096;

struct ctf_args {
    const float *q, *cq, *cnorm;
    const int *valid;
    int C, G, Hq, D, cpe, nb, cpb;
    unsigned *ckey, *ctr;
    int *cslot;
    const int32_t *lidx;
    const int *lcnt;
    int rho, lo, gen_lo, hi, gcap;
    const void *K;
    int T;
    float scale;
    int32_t *top, *set;
    long long setld;
    int *nset;
    int k, krho;
    int32_t *oidx, *odcu;
};

/* Lane j of an aligned 8-lane group: kv_dot_ref(a, b, d) in lane j == 0. Call from all 32 lanes. */
template <typename TB> __device__ __forceinline__ float ctf_dot8(const float *a, const TB *b, int d, int j) {
    float acc = 0.f;
    for (int i = j; i < d; i += 8) acc = __fadd_rn(acc, __fmul_rn(a[i], ct_tof(b[i])));
    const float t = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 4, 8)); /* j < 4: s_j + s_{j+4} */
    const float u = __fadd_rn(t, __shfl_down_sync(0xffffffffu, t, 1, 8));     /* j = 0: t0+t1, j = 2: t2+t3 */
    return __fadd_rn(u, __shfl_down_sync(0xffffffffu, u, 2, 8));
}

/* kv_dot_ref of a float query (shared) and a float16 key: 16-byte loads, same partial sums. */
__device__ __forceinline__ float ctf_dot_key(const float *a, const __half *b, int d) {
    if ((d & 7) || ((size_t)b & 15)) return ct_dot(a, b, d);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const uint4 *b4 = (const uint4 *)b;
    for (int c = 0; c < d / 8; c++) {
        const uint4 u = __ldg(b4 + c);
        const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = __half22float2(h2[j]);
            acc[2 * j] = __fadd_rn(acc[2 * j], __fmul_rn(a[8 * c + 2 * j], f.x));
            acc[2 * j + 1] = __fadd_rn(acc[2 * j + 1], __fmul_rn(a[8 * c + 2 * j + 1], f.y));
        }
    }
    return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                     __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7])));
}
__device__ __forceinline__ float ctf_dot_key(const float *a, const float *b, int d) { return ct_dot(a, b, d); }

__device__ float ctf_block_max(float v, float *sf) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sf[w] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int i = 0; i < nw; i++) r = fmaxf(r, sf[i]);
    __syncthreads();
    return r;
}

__device__ double ctf_block_sum(double v, double *sd) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sd[w] = v;
    __syncthreads();
    double r = 0;
    for (int i = 0; i < nw; i++) r += sd[i];
    __syncthreads();
    return r;
}

/* Dynamic shared memory of one launch (bytes). */
inline size_t ctf_smem(int G, int D, int gcap) {
    return ((size_t)G * D + G + gcap + 3 * (size_t)CTF_CAP) * 4 + 260 * 4;
}

template <typename TK> __global__ void __launch_bounds__(CTF_TH) ctf_search(ctf_args a) {
    extern __shared__ float ctf_sm[];
    __shared__ int sw[32], scount;
    __shared__ float sf[32];
    __shared__ double sd[32];
    const int g = blockIdx.y, bx = blockIdx.x, tid = threadIdx.x, G = a.G, D = a.D;
    float *sq = ctf_sm, *qn = sq + G * D;
    int *sv = (int *)(qn + G), *sset = sv + a.gcap;
    float *f1 = (float *)(sset + CTF_CAP), *f2 = f1 + CTF_CAP;
    unsigned *hist = (unsigned *)(f2 + CTF_CAP);
    for (int i = tid; i < G * D; i += blockDim.x) sq[i] = a.q[(size_t)g * G * D + i];
    __syncthreads();
    /* recall: numerators of the block's (slot, head) pairs and the G query norms, 8 lanes each */
    const int s0 = bx * CTF_SPB, ns = a.C - s0 < CTF_SPB ? a.C - s0 : CTF_SPB, np = G + ns * G;
    for (int p0 = 0; p0 < np; p0 += CTF_TH / 8) {
        const int p = p0 + tid / 8, j = tid & 7;
        const float *pa = sq, *pb = sq;
        int dd = 0;
        if (p < G) {
            pa = pb = sq + p * D;
            dd = D;
        } else if (p < np) {
            const int pp = p - G;
            pa = sq + (pp % G) * D;
            pb = a.cq + ((size_t)(s0 + pp / G) * a.Hq + g * G + pp % G) * D;
            dd = D;
        }
        const float r = ctf_dot8(pa, pb, dd, j); /* every lane calls it: the shuffles need the whole warp */
        if (j == 0 && p < np) {
            if (p < G) qn[p] = __fsqrt_rn(r);
            else f1[p - G] = r;
        }
    }
    __syncthreads();
    unsigned *bkey = (unsigned *)f2;
    if (tid < ns) {
        const int slot = s0 + tid;
        float best = -INFINITY;
        if (a.valid[slot])
            for (int hh = 0; hh < G; hh++) {
                const float den = __fmul_rn(a.cnorm[(size_t)slot * a.Hq + g * G + hh], qn[hh]);
                const float cv = den > 0 ? __fdiv_rn(f1[tid * G + hh], den) : 0.f;
                best = cv > best ? cv : best;
            }
        bkey[tid] = kv_f2key(best);
    }
    __syncthreads();
    const size_t cbase = ((size_t)g * a.nb + bx) * a.cpb;
    if (tid < a.cpb) { a.ckey[cbase + tid] = 0u; a.cslot[cbase + tid] = 0x7fffffff; }
    __syncthreads();
    if (tid < ns) {
        const unsigned kt = bkey[tid];
        int r = 0;
        for (int u = 0; u < ns; u++) r += bkey[u] > kt || (bkey[u] == kt && u < tid);
        if (r < a.cpb) { a.ckey[cbase + r] = kt; a.cslot[cbase + r] = s0 + tid; }
    }
    if (!kv_arrives_last(&a.ctr[g], a.nb)) return;
    if (tid == 0) a.ctr[g] = 0;
    /* the exact top C' of the kv head from the blocks' candidates */
    const int nc = a.nb * a.cpb;
    unsigned *mk = (unsigned *)f1;
    int *ms = (int *)f2;
    for (int i = tid; i < nc; i += blockDim.x) {
        mk[i] = __ldcg(a.ckey + (size_t)g * nc + i);
        ms[i] = __ldcg(a.cslot + (size_t)g * nc + i);
    }
    if (tid == 0) scount = 0;
    __syncthreads();
    int32_t *top = a.top + (size_t)g * a.cpe;
    for (int i = tid; i < nc; i += blockDim.x) {
        const unsigned kt = mk[i];
        const int st = ms[i];
        int r = 0;
        for (int u = 0; u < nc; u++) r += mk[u] > kt || (mk[u] == kt && ms[u] < st);
        if (r < a.cpe) sset[r] = st;
    }
    __syncthreads();
    for (int i = tid; i < a.cpe; i += blockDim.x) top[i] = sset[i];
    /* gather: the C' lists' entries in [lo, gen_lo), sorted, distinct */
    for (int r = 0; r < a.cpe; r++) {
        const int slot = sset[r];
        if (!a.valid[slot]) continue;
        const int n = a.lcnt[(size_t)g * a.C + slot];
        const int32_t *li = a.lidx + ((size_t)g * a.C + slot) * a.rho;
        for (int x0 = 0; x0 < n; x0 += blockDim.x) { /* warp-aggregated appends (any order: sorted next) */
            const int x = x0 + tid, v = x < n ? li[x] : -1;
            const bool take = x < n && v >= a.lo && v < a.gen_lo;
            const int at = kv_warp_append(take, &scount);
            if (take) sv[at] = v;
        }
    }
    __syncthreads();
    const int cnt = scount;
    int p2 = 1;
    while (p2 < cnt) p2 <<= 1;
    for (int x = cnt + tid; x < p2; x += blockDim.x) sv[x] = 0x7fffffff;
    __syncthreads();
    for (int kb = 2; kb <= p2; kb <<= 1)
        for (int jb = kb >> 1; jb > 0; jb >>= 1) {
            for (int i = tid; i < p2; i += blockDim.x) {
                const int l = i ^ jb;
                if (l > i) {
                    const int x = sv[i], y = sv[l];
                    if ((x > y) == ((i & kb) == 0)) { sv[i] = y; sv[l] = x; }
                }
            }
            __syncthreads();
        }
    int base = 0;
    for (int c0 = 0; c0 < cnt; c0 += blockDim.x) {
        const int i = c0 + tid;
        const int take = i < cnt && (i == 0 || sv[i] != sv[i - 1]);
        int total;
        const int ex = kv_block_scan(take, &total, sw);
        if (take) sset[base + ex] = sv[i];
        base += total;
    }
    for (int i = a.gen_lo + tid; i < a.hi; i += blockDim.x) sset[base + i - a.gen_lo] = i;
    const int n = base + (a.hi > a.gen_lo ? a.hi - a.gen_lo : 0);
    __syncthreads();
    int32_t *out = a.set + (size_t)g * a.setld;
    for (int i = tid; i < n; i += blockDim.x) out[i] = sset[i];
    if (tid == 0) a.nset[g] = n;
    /* rerank: per head scores, lse, ranking (max over the group) */
    const TK *Kg = (const TK *)a.K + (size_t)g * a.T * D;
    for (int i = tid; i < n; i += blockDim.x) f2[i] = -INFINITY;
    for (int hh = 0; hh < G; hh++) {
        float mx = -INFINITY;
        for (int i = tid; i < n; i += blockDim.x) {
            const float s = __fmul_rn(a.scale, ctf_dot_key(sq + hh * D, Kg + (size_t)sset[i] * D, D));
            f1[i] = s;
            mx = fmaxf(mx, s);
        }
        mx = ctf_block_max(mx, sf);
        double z = 0;
        for (int i = tid; i < n; i += blockDim.x) z += exp((double)f1[i] - (double)mx);
        z = ctf_block_sum(z, sd);
        const double lse = n > 0 ? (double)mx + log(z) : 0.0;
        for (int i = tid; i < n; i += blockDim.x) {
            const float v = (float)((double)f1[i] - lse);
            f2[i] = v > f2[i] ? v : f2[i];
        }
        __syncthreads();
    }
    /* top k (positions in the set), then DCU's top rho */
    kv_block_topk(f2, n, a.k < n ? a.k : n, a.oidx + (size_t)g * KV_GPU_TOPK_MAX, sset, hist, sw);
    if (a.krho > 0) kv_block_topk(f2, n, a.krho < n ? a.krho : n, a.odcu + (size_t)g * a.rho, sset, hist, sw);
}
