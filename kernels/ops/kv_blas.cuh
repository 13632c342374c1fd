/* kv_blas.cuh: the cuBLAS entry points kvbench uses, through a table that
 * kernels/ops/blas.cu fills by dlopen at the first kv_blas_load() (every
 * path that creates a cuBLAS handle calls it first). Including this header
 * redirects the cuBLAS names below to the table, so kernel files call
 * cuBLAS as usual. Device-side code only (nvcc). */
#ifndef KV_BLAS_CUH
#define KV_BLAS_CUH

#include <cublas_v2.h>

#include "kv_common.h"

struct kv_blas_api {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_math)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*sgemm_sb)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float *,
                               const float *, int, long long, const float *, int, long long, const float *, float *,
                               int, long long, int);
};
extern kv_blas_api kv_blas;
/* Loads cuBLAS once (thread-safe); KV_ERR_GPU naming the library when it cannot. */
kv_status kv_blas_load(void);

#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#define cublasCreate(h) kv_blas.create(h)
#define cublasDestroy(h) kv_blas.destroy(h)
#define cublasSetStream(h, s) kv_blas.set_stream(h, s)
#define cublasSetMathMode(h, m) kv_blas.set_math(h, m)
#define cublasSgemmStridedBatched(...) kv_blas.sgemm_sb(__VA_ARGS__)

#endif
