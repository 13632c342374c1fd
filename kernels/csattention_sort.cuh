/* csattention_sort.cuh: CSAttention's reduce-by-key by RADIX SORT (issue 9,
 * point 4: the variant the issue asks to measure against the accumulator;
 * KVBENCH_CS_REDUCE=sort, bench stage search_sort; included by
 * csattention.cu inside its anonymous namespace, after <cub/cub.cuh>).
 *
 * Per search: every (row r, subspace b, entry e) of the m gathered lists
 * becomes a pair (key r*T + index, payload b*L + e) (a sentinel key R*T for
 * entries outside [lo, hi) or past the list's count), one stable
 * cub::DeviceRadixSort::SortPairs over all rows orders them by key (equal
 * keys keep their subspace order), and the first entry of each run sums its
 * run in subspace order (missing=zero: from 0, w_b v; missing=min: the
 * list's minimum for every subspace the run lacks): the CPU's additions in
 * the CPU's order, bitwise. The sums land in the dense rows (-inf = not
 * gathered) that the dense path's compaction and top-k read. Bytes: the
 * lists (8 B/entry) read once, the pairs (8 B) written, sorted (radix passes
 * read and write 16 B each), read again: about 5x the lists' bytes plus the
 * dense rows; the temporary storage is allocated once, at the first use. */

/* Pairs of row r's lists, in subspace order: key r*T + i (i in [lo, hi)) or the sentinel R*T. */
__global__ void cs_sort_pairs(const int *jl, int m, int L, const int32_t *lidx, const int *lcnt, int lo, int hi, int T,
                              int R, unsigned *key, int *pay) {
    const int r = blockIdx.y;
    const size_t base = (size_t)r * m * L;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < m * L; t += gridDim.x * blockDim.x) {
        const int b = t / L, e = t % L, li = jl[r * m + b];
        unsigned k = (unsigned)R * (unsigned)T;
        if (e < lcnt[li]) {
            const int i = lidx[(size_t)li * L + e];
            if (i >= lo && i < hi) k = (unsigned)r * (unsigned)T + (unsigned)i;
        }
        key[base + t] = k;
        pay[base + t] = t;
    }
}

/* The first entry of every run sums it: S[r*ld + i]. */
__global__ void cs_sort_reduce(const unsigned *key, const int *pay, long long N, int T, int R, const int *jl,
                               const float *wb, int m, int L, const float *lval, const int *lcnt, int missing,
                               float *S, long long ld) {
    const unsigned sent = (unsigned)R * (unsigned)T;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < N; p += (long long)gridDim.x * blockDim.x) {
        const unsigned k = key[p];
        if (k >= sent || (p > 0 && key[p - 1] == k)) continue;
        const int r = (int)(k / (unsigned)T), i = (int)(k % (unsigned)T);
        float acc = 0.f;
        long long q = p;
        if (missing == 1) {
            for (int b = 0; b < m; b++) {
                const int li = jl[r * m + b];
                float v = lcnt[li] ? lval[(size_t)li * L] : 0.f; /* heap root = the minimum */
                if (q < N && key[q] == k && pay[q] / L == b) v = lval[(size_t)li * L + pay[q++] % L];
                acc = __fadd_rn(acc, __fmul_rn(wb[r * m + b], v));
            }
        } else
            for (; q < N && key[q] == k; q++) {
                const int b = pay[q] / L, li = jl[r * m + b];
                acc = __fadd_rn(acc, __fmul_rn(wb[r * m + b], lval[(size_t)li * L + pay[q] % L]));
            }
        S[(size_t)r * ld + i] = acc;
    }
}
