/* keys.cu: the device-resident [H][T][D] store that keys (and values) live
 * in on the GPU (issue 2, points 8-9: "keep keys on the device, upload at
 * build, append one key per step"). Layout [H][T][D], as in the trace and
 * the CPU retrievers, so one kv head's keys are one contiguous run that the
 * score kernel streams with 16-byte loads. float16 is used while it is
 * lossless: a trace stored as float16 converts exactly, halving the bytes
 * every step must read; the first written value that float16 cannot hold
 * exactly widens the store to float32 on the device, so results never
 * depend on the storage type. Writes go through a pinned staging buffer of
 * a few thousand tokens and are synchronous, so the caller may reuse its
 * buffer and any later launch sees the data. */
#include <string.h>

#include "kv_cuda.h"

#define KV_STAGE_TOKENS 4096

/* 1 when f converts to float16 and back unchanged. */
static inline int kv_half_exact(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t a = u & 0x7fffffffu;
    if (a == 0) return 1;
    if (a >= 0x7f800000u) return a == 0x7f800000u;
    int e = (int)(a >> 23) - 127;
    if (e > 15) return 0;
    if (e >= -14) return (a & 0x1fffu) == 0;  /* normal float16: 10 mantissa bits */
    if (e < -24) return 0;
    int drop = 13 + (-14 - e);                 /* subnormal float16: fewer bits */
    return (a & ((1u << drop) - 1)) == 0;
}

__global__ void kv_widen_kernel(const __half *in, float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __half2float(in[i]);
}

static kv_status kv_keys_widen(kv_gpu_keys *k) {
    size_t n = (size_t)k->a.H * k->a.T * k->a.D;
    float *w = NULL;
    KV_CUDA_ALLOC(w, n * sizeof(float), 0, "the float32 key store (widened: a value is not exact in float16)");
    kv_widen_kernel<<<1024, 256>>>((const __half *)k->a.p, w, n);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { cudaFree(w); return kv_cuda_error(e, "kv_widen_kernel", __FILE__, __LINE__); }
    KV_CUDA_TRY(cudaFree(k->a.p));
    k->a.p = w;
    k->a.half = 0;
    return KV_OK;
}

static kv_status kv_keys_init(kv_gpu_keys *k, int H, int T, int D, int half) {
    k->a.H = H; k->a.T = T; k->a.D = D; k->a.half = half; k->lossless_half = half;
    char what[160];
    snprintf(what, sizeof what, "a [%d][%d][%d] %s key/value store", H, T, D, half ? "float16" : "float32");
    KV_CUDA_ALLOC(k->a.p, (size_t)H * T * D * (half ? 2 : 4), 0, what);
    k->stage_tokens = T < KV_STAGE_TOKENS ? T : KV_STAGE_TOKENS;
    KV_CUDA_ALLOC(k->stage, (size_t)H * k->stage_tokens * D * sizeof(float), 1, "key upload staging");
    return KV_OK;
}

extern "C" kv_status kv_gpu_keys_create(int H, int T, int D, int half, kv_gpu_keys **out) {
    *out = NULL;
    if (H <= 0 || T <= 0 || D <= 0)
        return kv_fail(KV_ERR_INPUT, "GPU key store: invalid shape [%d][%d][%d]", H, T, D);
    kv_gpu_keys *k = (kv_gpu_keys *)kv_calloc(1, sizeof *k, "GPU key store");
    if (!k) return KV_ERR_NOMEM;
    kv_status st = kv_keys_init(k, H, T, D, half);
    if (st != KV_OK) { kv_gpu_keys_destroy(k); return st; }
    *out = k;
    return KV_OK;
}

static kv_status kv_keys_check(const kv_gpu_keys *k, int t0, int n) {
    if (t0 < 0 || n < 0 || t0 + n > k->a.T)
        return kv_fail(KV_ERR_INTERNAL, "GPU key store: write of positions [%d, %d) outside [0, %d)", t0, t0 + n,
                       k->a.T);
    return KV_OK;
}

/* Copies the staged [H][c][D] chunk to positions [t, t+c). */
static kv_status kv_keys_put(kv_gpu_keys *k, int t, int c) {
    size_t es = k->a.half ? 2 : 4, row = (size_t)k->a.D * es;
    KV_CUDA_TRY(cudaMemcpy2D((char *)k->a.p + (size_t)t * row, (size_t)k->a.T * row, k->stage, (size_t)c * row,
                             (size_t)c * row, (size_t)k->a.H, cudaMemcpyHostToDevice));
    return KV_OK;
}

extern "C" kv_status kv_gpu_keys_write(kv_gpu_keys *k, int t0, int n, const float *x) {
    KV_TRY(kv_keys_check(k, t0, n));
    int H = k->a.H, D = k->a.D;
    for (int c0 = 0; c0 < n; c0 += k->stage_tokens) {
        int c = n - c0 < k->stage_tokens ? n - c0 : k->stage_tokens;
        if (k->a.half) {
            int exact = 1;
            for (int h = 0; h < H && exact; h++) {
                const float *src = x + ((size_t)h * n + c0) * D;
                for (size_t i = 0; i < (size_t)c * D; i++) exact &= kv_half_exact(src[i]);
            }
            if (!exact) KV_TRY(kv_keys_widen(k));
        }
        for (int h = 0; h < H; h++) {
            const float *src = x + ((size_t)h * n + c0) * D;
            if (k->a.half) {
                __half *dst = (__half *)k->stage + (size_t)h * c * D;
                for (size_t i = 0; i < (size_t)c * D; i++) dst[i] = __float2half_rn(src[i]);
            } else {
                memcpy((float *)k->stage + (size_t)h * c * D, src, (size_t)c * D * sizeof(float));
            }
        }
        KV_TRY(kv_keys_put(k, t0 + c0, c));
    }
    return KV_OK;
}

extern "C" kv_status kv_gpu_keys_write_half_ld(kv_gpu_keys *k, int t0, int n, const uint16_t *x, long long ld) {
    KV_TRY(kv_keys_check(k, t0, n));
    if (!k->a.half) return kv_fail(KV_ERR_INTERNAL, "GPU key store: float16 write into a float32 store");
    if (ld < n) return kv_fail(KV_ERR_INTERNAL, "GPU key store: row stride %lld below %d rows", ld, n);
    int H = k->a.H, D = k->a.D;
    for (int c0 = 0; c0 < n; c0 += k->stage_tokens) {
        int c = n - c0 < k->stage_tokens ? n - c0 : k->stage_tokens;
        for (int h = 0; h < H; h++)
            memcpy((uint16_t *)k->stage + (size_t)h * c * D, x + ((size_t)h * ld + c0) * D, (size_t)c * D * 2);
        KV_TRY(kv_keys_put(k, t0 + c0, c));
    }
    return KV_OK;
}

extern "C" kv_status kv_gpu_keys_write_half(kv_gpu_keys *k, int t0, int n, const uint16_t *x) {
    return kv_gpu_keys_write_half_ld(k, t0, n, x, n);
}

extern "C" int kv_gpu_keys_elem_bytes(const kv_gpu_keys *k) { return k->a.half ? 2 : 4; }

extern "C" void kv_gpu_keys_destroy(kv_gpu_keys *k) {
    if (!k) return;
    if (k->a.p) cudaFree(k->a.p);
    if (k->stage) cudaFreeHost(k->stage);
    free(k);
}
