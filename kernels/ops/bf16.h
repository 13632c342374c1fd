/* bf16.h: bfloat16 storage shared bit for bit by the C references and the
 * CUDA kernels (issue 12: ParisKV stores its RSQ-IP weights as bf16, as the
 * released code does). A bf16 is the upper 16 bits of a float32, held in a
 * uint16_t (kv_bf16). float -> bf16 rounds to nearest, ties to even, on the
 * bits (finite values that overflow become +-inf, a NaN stays a quiet NaN
 * with its sign); bf16 -> float is exact (the bits shifted back). Arithmetic
 * on bf16 values is defined as: widen to float32 exactly, compute in float32
 * (each operation correctly rounded, no contraction), round back only where
 * a value is stored. The same inline functions compile for the host and the
 * device (no cuda_bf16.h: its rounding of NaN payloads is not ours to rely
 * on), so both sides produce the same bits by construction. */
#ifndef KV_BF16_H
#define KV_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KV_HD static __host__ __device__ __forceinline__
#else
#define KV_HD static inline
#endif

typedef uint16_t kv_bf16;

KV_HD uint32_t kv_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

KV_HD float kv_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Round to nearest even. */
KV_HD kv_bf16 kv_bf16_from_f32(float f) {
    uint32_t u = kv_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (kv_bf16)((u >> 16) | 0x0040u); /* NaN: keep it quiet */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (kv_bf16)(u >> 16);
}

KV_HD float kv_bf16_to_f32(kv_bf16 h) { return kv_bits_f32((uint32_t)h << 16); }

#endif
