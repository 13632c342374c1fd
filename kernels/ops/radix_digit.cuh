/* radix_digit.cuh: one step of a most-significant-digit radix select, shared by
 * ParisKV's one-block top-k (kernels/pariskv.cu) and PQCache's tuple threshold
 * (kernels/pqcache.cu). Given a 256-bin histogram rh of the current digit of the
 * keys still in play, one warp finds the digit, counted from the top, at which
 * the number of keys at or above it reaches need: lane l holds digits
 * 255-8l .. 248-8l and an inclusive warp scan from the top gives each lane its
 * range, so exactly one lane writes sel[0] = the digit and sel[1] = how many
 * keys of that digit are still needed. Call from the block's first warp (all 32
 * lanes), then __syncthreads() before reading sel. */
#pragma once

__device__ __forceinline__ void kv_radix_pick_digit(const unsigned *rh, unsigned need, int lane, unsigned *sel) {
    unsigned v[8], s = 0;
    for (int j = 0; j < 8; j++) { v[j] = rh[255 - 8 * lane - j]; s += v[j]; }
    unsigned inc = s;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    unsigned c = inc - s;
    if (c < need && need <= inc) { /* exactly one lane: the digit where the count reaches need */
        int j = 0;
        while (c + v[j] < need) c += v[j++];
        sel[0] = (unsigned)(255 - 8 * lane - j);
        sel[1] = need - c;
    }
}
