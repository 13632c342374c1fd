/* kv_gpu.h: the C-callable face of the CUDA code (extern "C" launchers
 * and device-resident objects). Built from the kernels/ .cu files when nvcc is
 * found; otherwise kernels/gpu_stub.c provides the same symbols, each
 * reporting that this binary has no CUDA. Nothing here knows which method
 * or which protocol calls it. */
#ifndef KV_GPU_H
#define KV_GPU_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int available;        /* a usable GPU is present */
    char name[256];       /* device name */
    char reason[256];     /* why not available (the CUDA error name), or "" */
    int driver_version;   /* cudaDriverGetVersion, e.g. 13000 */
    int runtime_version;
    int sm_count;
    size_t mem_total;
} kv_gpu_info;

/* Never fails: any error from cudaGetDeviceCount means "no GPU" and its
 * name becomes info->reason. */
void kv_gpu_probe(kv_gpu_info *info);
/* 1 when this binary was compiled with CUDA kernels. */
int kv_gpu_compiled(void);

/* ---- exact attention of one step over a device-resident layer (oracle) ---- */
typedef struct kv_gpu_attn kv_gpu_attn;
/* Uploads K (as float16 when half=1, exactly representable then; else
 * float32) and V ([Hkv][T][D]); V may be NULL. */
kv_status kv_gpu_attn_create(int Hq, int Hkv, int T, int D, int half, const float *K, const float *V,
                             kv_gpu_attn **out);
/* Step t, queries q [Hq][D] (host): per head m, Z, thr (k-th largest of
 * [lo, hi)) and o_full [Hq][D] (skipped when V is NULL), all to host. */
kv_status kv_gpu_attn_step(kv_gpu_attn *a, int t, const float *q, float scale, int lo, int hi, int k, float *m,
                           float *Z, float *thr, float *o_full);
/* Scores of the last step at idx[h*cap + j], j < count[h], to host out. */
kv_status kv_gpu_attn_gather(kv_gpu_attn *a, const int32_t *idx, const int *count, int cap, float *out);
void kv_gpu_attn_destroy(kv_gpu_attn *a);

#ifdef __cplusplus
}
#endif
#endif
