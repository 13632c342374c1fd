/* blas.cu: cuBLAS, loaded at run time (dlopen) the first time a GPU path
 * needs it, not linked: the binary then starts, and runs every CPU path, on
 * a machine without the CUDA libraries (issue 16; this toolkit ships no
 * libcublas_static.a). kv_blas holds the few entry points kvbench calls;
 * kv_blas.cuh redirects the cuBLAS names to it. */
#include <dlfcn.h>
#include <stdio.h>

#include "kv_blas.cuh"

kv_blas_api kv_blas;
static char kv_blas_err[512];

#ifndef KV_CUDA_HOME /* the Makefile passes $(CUDA_HOME) */
#define KV_CUDA_HOME "/usr/local/cuda"
#endif
#define KV_STR2(x) #x
#define KV_STR(x) KV_STR2(x)
static bool kv_blas_open() {
    const char *names[] = {"libcublas.so." KV_STR(CUBLAS_VER_MAJOR), /* the loader's path, as a link would */
                           KV_CUDA_HOME "/lib64/libcublas.so." KV_STR(CUBLAS_VER_MAJOR),
                           KV_CUDA_HOME "/lib/libcublas.so." KV_STR(CUBLAS_VER_MAJOR)};
    void *h = NULL;
    for (const char *n : names)
        if ((h = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) {
        snprintf(kv_blas_err, sizeof kv_blas_err, "cannot load cuBLAS (libcublas.so.%d, needed by the GPU k-means of "
                 "PQCache): %s", CUBLAS_VER_MAJOR, dlerror());
        return false;
    }
    const char *syms[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetMathMode",
                          "cublasSgemmStridedBatched"};
    void **slots[] = {(void **)&kv_blas.create, (void **)&kv_blas.destroy, (void **)&kv_blas.set_stream,
                      (void **)&kv_blas.set_math, (void **)&kv_blas.sgemm_sb};
    for (int i = 0; i < 5; i++)
        if (!(*slots[i] = dlsym(h, syms[i]))) {
            snprintf(kv_blas_err, sizeof kv_blas_err, "cuBLAS loaded but %s is missing: %s", syms[i], dlerror());
            return false;
        }
    return true;
}
kv_status kv_blas_load(void) {
    static const bool ok = kv_blas_open(); /* once, thread-safe */
    return ok ? KV_OK : kv_fail(KV_ERR_GPU, "%s", kv_blas_err);
}
