/* csattention_tile.cuh: CSAttention's decode reduce-by-key as a TILED
 * SHARED-MEMORY accumulator (issue 9, point 4: the default; included by
 * csattention.cu inside its anonymous namespace, uses cs_weaker).
 *
 * The index: besides the heaps (the try-insert's structure, as the CPU's),
 * every list is kept a second time sorted by key index, the "view" vidx/vval
 * [nlists][VL] (VL = L + slack), vcnt[nlists]. The build copies the
 * selection's position-ordered lists into it; a try-insert that evicts the
 * root marks the evicted key a tombstone (bit 31 of its index, found by
 * binary search; the entry keeps its place so the view stays sorted) and
 * appends the new key at the end (keys arrive in increasing order; an
 * out-of-order key is inserted by shifting, never hit by the driver);
 * cs_vcompact squeezes the tombstones out of a list whose slack is used up
 * (one block per list, order kept), so a view holds at most VL entries and
 * at most L live ones, the heap's set exactly.
 * Search: grid (tiles of CS_TK keys of [lo, hi), rows). A block finds, per
 * subspace b, the range of its tile in the row's gathered list b (32-ary
 * warp search, ~4 dependent loads), stages the m ranges' (index, score)
 * entries into shared memory with independent 16 B loads (CS_SCAP at a
 * time), then accumulates them IN SUBSPACE ORDER (a barrier between
 * subspaces; keys are distinct within a list, so no atomics): missing=zero,
 * acc = (acc == -inf ? 0 : acc) + w_b v; missing=min, the tile's union is
 * marked 0 first, then per b acc += w_b (v or the list's minimum = its heap
 * root): the CPU's additions in the CPU's order, bitwise. Then the tile's
 * gathered keys are counted (and listed, when the caller wants the
 * candidates) and its top min(k, tile) by kv_block_topk go to a candidate
 * row (k slots per tile, in key order, padded with -inf); the shared top-k
 * over the candidate rows (tile-major and key-ordered, so position order
 * among equal values is key order) and cs_map give the final top k:
 * the global top k of a strict total order lies in the union of the tiles'.
 * Bytes per row the search must read: the m gathered lists, L entries of 8 B
 * (int32 index + float32 score) each = m x L x 8 B = 16 B per region key at
 * m = 8, alpha = 0.25; the accumulator lives in shared memory (no global
 * traffic), the candidates add k x 8 B per tile written and read (1.6% at
 * CS_TK = 4096, k = 100), the range searches ~4 x 2m probes per tile, the
 * tombstones at most slack/L more list bytes. */

constexpr int CS_TK = 4096, CS_SCAP = 6144, CS_TTH = 512, CS_MMAX = 32;

/* Row stride of the by-key views: a multiple of 4 entries, so every row starts on 16 B (cs_pipe's copies). */
inline long long cs_view_ld(int L) { return ((long long)L + L / 16 + 34 + 3) & ~3LL; }
/* Dynamic shared memory: acc [CS_TK], val [CS_TK] (missing=min only), the staging window, the histogram. */
inline size_t cs_tile_smem(int missing) { return (size_t)CS_TK * (missing == 1 ? 8 : 4) + (size_t)CS_SCAP * 8 + 260 * 4; }

/* First p in [0, n) with (v[p] & 0x7fffffff) >= x (n if none). Whole warp, result in every lane. */
__device__ __forceinline__ int cs_lower(const int32_t *v, int n, int x) {
    const int lane = threadIdx.x & 31;
    int lo = 0, hi = n;
    while (hi - lo > 32) {
        const int step = (hi - lo + 31) / 32, p = lo + lane * step;
        const bool pr = p < hi && (v[p] & 0x7fffffff) < x;
        const int c = __popc(__ballot_sync(0xffffffffu, pr));
        if (c == 0) hi = lo;
        else {
            const int nlo = lo + (c - 1) * step + 1;
            hi = hi < lo + c * step ? hi : lo + c * step;
            lo = nlo;
        }
    }
    const int p = lo + lane;
    const bool pr = p < hi && (v[p] & 0x7fffffff) < x;
    return lo + __popc(__ballot_sync(0xffffffffu, pr));
}

/* View of list li after the heap replaced the evicted key e (e < 0: nothing evicted) and took key t. */
__device__ void cs_view_update(int32_t *vi, float *vv, int *vcnt, int e, int t, float v) {
    int n = *vcnt;
    if (e >= 0) {
        int lo = 0, hi = n; /* binary search of e (tombstones keep their place and key) */
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if ((vi[mid] & 0x7fffffff) < e) lo = mid + 1;
            else hi = mid;
        }
        for (; lo < n && (vi[lo] & 0x7fffffff) <= e; lo++)
            if (vi[lo] == e) { vi[lo] = (int32_t)((unsigned)e | 0x80000000u); break; }
    }
    int p = n;
    while (p > 0 && (vi[p - 1] & 0x7fffffff) > t) { vi[p] = vi[p - 1]; vv[p] = vv[p - 1]; p--; }
    vi[p] = t;
    vv[p] = v;
    *vcnt = n + 1;
}

/* One block per list: drop the tombstones (order kept) when fewer than 2 free slots remain. */
__global__ void cs_vcompact(int32_t *vidx, float *vval, int *vcnt, long long VL) {
    __shared__ int sw[32];
    const int li = blockIdx.x, n = vcnt[li];
    if (n < VL - 1) return;
    int32_t *vi = vidx + (size_t)li * VL;
    float *vv = vval + (size_t)li * VL;
    int base = 0;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int i = c0 + threadIdx.x;
        const int32_t x = i < n ? vi[i] : -1;
        const float y = i < n ? vv[i] : 0.f;
        int tot;
        const int ex = kv_block_scan(x >= 0, &tot, sw); /* barriers: every read of this chunk is done */
        if (x >= 0) { vi[base + ex] = x; vv[base + ex] = y; }
        base += tot;
        __syncthreads();
    }
    if (threadIdx.x == 0) vcnt[li] = base;
}

struct cs_tile_args {
    const int32_t *vidx;
    const float *vval, *lval, *wb;
    const int *vcnt, *lcnt, *jl;
    long long VL;
    int L, m, lo, hi, missing, k;
    float *cv;
    int32_t *ci;
    long long cld;
    int *nu;
    int32_t *u; /* nullable */
    long long uld;
    int tk;        /* cs_pipe's tile (the staged kernel's is CS_TK) */
    unsigned *thr; /* cs_pipe: per row CS_SMAX slots whose smallest bounds the k-th best key (kv_f2key), or NULL */
    const int *bnd; /* cs_pipe: the tiles' ranges from cs_bounds [R][m][nt1], or NULL (searched) */
    int nt1;
    int ns; /* cs_pipe: the row bound's slots, 1 .. CS_SMAX */
};

__global__ void __launch_bounds__(CS_TTH, 3) cs_tile(cs_tile_args a) {
    extern __shared__ float cs_sm[];
    float *acc = cs_sm, *val = acc + CS_TK; /* val only with missing=min */
    int32_t *sidx = (int32_t *)(acc + (a.missing == 1 ? 2 : 1) * CS_TK);
    float *sval = (float *)(sidx + CS_SCAP);
    unsigned *hist = (unsigned *)(sval + CS_SCAP);
    __shared__ int rng[2 * CS_MMAX], pre[CS_MMAX + 1], sli[CS_MMAX], sw[32], sbase;
    __shared__ float sws[CS_MMAX], smn[CS_MMAX];
    const int r = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x, bd = blockDim.x, m = a.m;
    const int t0 = a.lo + tile * CS_TK, t1 = t0 + CS_TK < a.hi ? t0 + CS_TK : a.hi, tl = t1 - t0;
    if (tid < m) {
        const int li = a.jl[r * m + tid];
        sli[tid] = li;
        sws[tid] = a.wb[r * m + tid];
        smn[tid] = a.lcnt[li] ? a.lval[(size_t)li * a.L] : 0.f; /* heap root = the list's minimum */
    }
    for (int x = tid; x < CS_TK; x += bd) {
        acc[x] = -INFINITY;
        if (a.missing == 1) val[x] = NAN;
    }
    __syncthreads();
    for (int s = tid >> 5; s < 2 * m; s += bd >> 5) {
        const int li = sli[s >> 1];
        const int p = cs_lower(a.vidx + (size_t)li * a.VL, a.vcnt[li], (s & 1) ? t1 : t0);
        if ((tid & 31) == 0) rng[s] = p;
    }
    __syncthreads();
    if (tid == 0) {
        pre[0] = 0;
        for (int b = 0; b < m; b++) pre[b + 1] = pre[b] + rng[2 * b + 1] - rng[2 * b];
    }
    __syncthreads();
    const int total = pre[m];
    /* stage flattened entries [w0, w0 + CS_SCAP) of the m ranges into shared memory */
    auto stage = [&](int w0) {
        const int wend = w0 + CS_SCAP < total ? w0 + CS_SCAP : total;
        for (int e0 = w0 + tid; e0 < wend; e0 += 4 * bd) {
            int32_t ix[4];
            float vv[4];
#pragma unroll
            for (int uu = 0; uu < 4; uu++) {
                const int e = e0 + uu * bd;
                if (e < wend) {
                    int b = 0;
                    while (pre[b + 1] <= e) b++;
                    const size_t off = (size_t)sli[b] * a.VL + rng[2 * b] + (e - pre[b]);
                    ix[uu] = __ldg(a.vidx + off);
                    vv[uu] = __ldg(a.vval + off);
                }
            }
#pragma unroll
            for (int uu = 0; uu < 4; uu++) {
                const int e = e0 + uu * bd;
                if (e < wend) { sidx[e - w0] = ix[uu]; sval[e - w0] = vv[uu]; }
            }
        }
        __syncthreads();
    };
    int c0 = -1;
    if (a.missing == 1) /* the tile's union: every live key of the m ranges, acc = 0 */
        for (int w0 = 0; w0 < total; w0 += CS_SCAP) {
            stage(w0);
            c0 = w0;
            const int wend = w0 + CS_SCAP < total ? w0 + CS_SCAP : total;
            for (int e = w0 + tid; e < wend; e += bd) {
                const int32_t i = sidx[e - w0];
                if (i >= 0) acc[i - t0] = 0.f;
            }
            __syncthreads();
        }
    for (int b = 0; b < m; b++) {
        const float w = sws[b];
        for (int s = pre[b]; s < pre[b + 1];) {
            if (c0 < 0 || s < c0 || s >= c0 + CS_SCAP) {
                stage(s);
                c0 = s;
            }
            const int send = pre[b + 1] < c0 + CS_SCAP ? pre[b + 1] : c0 + CS_SCAP;
            for (int e = s + tid; e < send; e += bd) {
                const int32_t i = sidx[e - c0];
                if (i < 0) continue; /* tombstone */
                const float v = sval[e - c0];
                if (a.missing == 1) val[i - t0] = v;
                else {
                    const float o = acc[i - t0];
                    acc[i - t0] = __fadd_rn(o == -INFINITY ? 0.f : o, __fmul_rn(w, v));
                }
            }
            s = send;
            __syncthreads(); /* subspace order; the window may be restaged next */
        }
        if (a.missing == 1) {
            const float mn = smn[b];
            for (int x = tid; x < tl; x += bd) {
                const float o = acc[x];
                if (o != -INFINITY) acc[x] = __fadd_rn(o, __fmul_rn(w, isnan(val[x]) ? mn : val[x]));
                val[x] = NAN;
            }
            __syncthreads();
        }
    }
    /* the gathered keys: count (and list), each thread a contiguous segment */
    {
        const int per = (tl + bd - 1) / bd, x0 = tid * per, x1 = x0 + per < tl ? x0 + per : tl;
        int nf = 0;
        for (int x = x0; x < x1; x++) nf += acc[x] != -INFINITY;
        int tot;
        int ex = kv_block_scan(nf, &tot, sw);
        if (tid == 0) sbase = tot ? atomicAdd(a.nu + r, tot) : 0;
        __syncthreads();
        if (a.u)
            for (int x = x0; x < x1; x++)
                if (acc[x] != -INFINITY) a.u[(size_t)r * a.uld + sbase + ex++] = t0 + x;
    }
    /* the tile's top min(k, tl) to the candidate row, padded to k */
    const int kt = a.k < tl ? a.k : tl;
    int32_t *pos = sidx + CS_SCAP / 2;
    kv_block_topk(acc, tl, kt, pos, sidx, hist, sw, false); /* position order = key order */
    float *ov = a.cv + (size_t)r * a.cld + (size_t)tile * a.k;
    int32_t *oi = a.ci + (size_t)r * a.cld + (size_t)tile * a.k;
    for (int j = tid; j < a.k; j += bd) {
        ov[j] = j < kt ? acc[pos[j]] : -INFINITY;
        oi[j] = j < kt ? t0 + pos[j] : -1;
    }
}

/* oidx[r*kk + j] = the key of candidate opos[r*kk + j] of row r. */
__global__ void cs_map(const int32_t *opos, const int32_t *ci, long long cld, int kk, int R, int32_t *oidx) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= R * kk) return;
    oidx[t] = ci[(size_t)(t / kk) * cld + opos[t]];
}
