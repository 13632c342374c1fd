/* gpu.cu: the GPU probe and the CUDA error plumbing every .cu file uses
 * (issue 2, point 8). No kernels here. kv_gpu_probe treats any error of
 * cudaGetDeviceCount as "no GPU" and keeps the error's name as the reason
 * (on machines without a driver it is cudaErrorInsufficientDriver, not
 * cudaErrorNoDevice: STYLE.md point 6), and also refuses a device older
 * than the sm_90 code this binary carries, so `--device auto` falls back to
 * the CPU instead of failing at the first launch. Errors become statuses
 * with messages (kv_fail), never exits: only cli/ exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cuda.h"

extern "C" int kv_gpu_compiled(void) { return 1; }

extern "C" void kv_gpu_probe(kv_gpu_info *info) {
    memset(info, 0, sizeof *info);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(info->reason, sizeof info->reason, "%s", cudaGetErrorName(e));
        cudaGetLastError();
        return;
    }
    if (n == 0) { snprintf(info->reason, sizeof info->reason, "no CUDA device"); return; }
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        snprintf(info->reason, sizeof info->reason, "%s", cudaGetErrorName(e));
        cudaGetLastError();
        return;
    }
    snprintf(info->name, sizeof info->name, "%s", p.name);
    cudaDriverGetVersion(&info->driver_version);
    cudaRuntimeGetVersion(&info->runtime_version);
    info->sm_count = p.multiProcessorCount;
    info->mem_total = p.totalGlobalMem;
    if (p.major < 9) {
        snprintf(info->reason, sizeof info->reason, "%.120s is compute capability %d.%d; this kvbench carries sm_90 code",
                 p.name, p.major, p.minor);
        return;
    }
    info->available = 1;
}

size_t kv_gpu_mem_free(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fr;
}

kv_status kv_gpu_upload_ints(const int32_t *x, size_t n, int32_t **out) {
    *out = NULL;
    int32_t *d = NULL;
    KV_CUDA_ALLOC(d, (n ? n : 1) * sizeof(int32_t), 0, "device ints");
    if (n) {
        cudaError_t e = cudaMemcpy(d, x, n * sizeof(int32_t), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            cudaFree(d);
            return kv_cuda_error(e, "cudaMemcpy", __FILE__, __LINE__);
        }
    }
    *out = d;
    return KV_OK;
}

void kv_gpu_free(void *p) { cudaFree(p); }

int kv_gpu_host_pin(void *p, size_t bytes) {
    if (!p || !bytes) return 0;
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return 1;
    cudaGetLastError(); /* not locked: the copies go through the staging buffer, as before */
    return 0;
}

void kv_gpu_host_unpin(void *p) {
    if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

struct kv_gpu_mark {
    cudaEvent_t start, end;
    const kv_gpu_mark *after;
    int recorded; /* end recorded since the last kv_gpu_mark_after */
};

kv_status kv_gpu_mark_create(kv_gpu_mark **out) {
    kv_gpu_mark *m = (kv_gpu_mark *)kv_calloc(1, sizeof *m, "search marks");
    *out = NULL;
    if (!m) return KV_ERR_NOMEM;
    cudaError_t e = cudaEventCreate(&m->start);
    if (e == cudaSuccess) e = cudaEventCreate(&m->end);
    if (e != cudaSuccess) {
        kv_gpu_mark_destroy(m);
        return kv_cuda_error(e, "cudaEventCreate (search marks)", __FILE__, __LINE__);
    }
    *out = m;
    return KV_OK;
}

void kv_gpu_mark_destroy(kv_gpu_mark *m) {
    if (!m) return;
    if (m->start) cudaEventDestroy(m->start);
    if (m->end) cudaEventDestroy(m->end);
    free(m);
}

void kv_gpu_mark_after(kv_gpu_mark *m, const kv_gpu_mark *prev) {
    if (!m) return;
    m->after = prev;
    m->recorded = 0;
}

kv_status kv_gpu_mark_start(kv_gpu_mark *m, void *stream) {
    if (!m) return KV_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const kv_gpu_mark *a = m->after;
    while (a && !a->recorded) a = a->after; /* a search that queued nothing is skipped */
    if (a) KV_CUDA_TRY(cudaStreamWaitEvent(st, a->end, 0));
    KV_CUDA_TRY(cudaEventRecord(m->start, st));
    return KV_OK;
}

kv_status kv_gpu_mark_end(kv_gpu_mark *m, void *stream) {
    if (!m) return KV_OK;
    KV_CUDA_TRY(cudaEventRecord(m->end, (cudaStream_t)stream));
    m->recorded = 1;
    return KV_OK;
}

kv_status kv_gpu_mark_seconds(kv_gpu_mark *m, double *s) {
    *s = 0;
    if (!m || !m->recorded) return KV_OK; /* the search queued nothing */
    float ms = 0;
    KV_CUDA_TRY(cudaEventSynchronize(m->end));
    KV_CUDA_TRY(cudaEventElapsedTime(&ms, m->start, m->end));
    *s = 1e-3 * ms;
    return KV_OK;
}

kv_status kv_cuda_error(cudaError_t e, const char *expr, const char *file, int line) {
    /* a non-sticky error (out of memory, an invalid argument) also stays the thread's last error until read:
       clear it here, so the next KV_LAUNCH_CHECK does not report it again (a sticky one persists anyway) */
    cudaGetLastError();
    if (e == cudaErrorMemoryAllocation)
        return kv_fail(KV_ERR_NOMEM, "GPU out of memory in %s (%s:%d)", expr, file, line);
    return kv_fail(KV_ERR_GPU, "CUDA error %s (%s) in %s (%s:%d)", cudaGetErrorName(e), cudaGetErrorString(e), expr,
                   file, line);
}

kv_status kv_cuda_alloc(void **p, size_t bytes, int pinned, const char *what, const char *file, int line) {
    *p = NULL;
    cudaError_t e = pinned ? cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault) : cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaSuccess) return KV_OK;
    *p = NULL;
    cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) {
        size_t fr = 0, tot = 0;
        if (!pinned) cudaMemGetInfo(&fr, &tot);
        cudaGetLastError();
        if (pinned)
            return kv_fail(KV_ERR_NOMEM, "out of pinned host memory allocating %zu bytes for %s (%s:%d)", bytes, what,
                           file, line);
        return kv_fail(KV_ERR_NOMEM, "GPU out of memory allocating %zu bytes for %s (%.2f GiB free of %.2f GiB) (%s:%d)",
                       bytes, what, fr / 1073741824.0, tot / 1073741824.0, file, line);
    }
    return kv_cuda_error(e, pinned ? "cudaHostAlloc" : "cudaMalloc", file, line);
}

kv_status kv_cuda_dev_query(kv_cuda_dev *d) {
    int dev = 0, v = 0;
    KV_CUDA_TRY(cudaGetDevice(&dev));
    KV_CUDA_TRY(cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, dev));
    KV_CUDA_TRY(cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    KV_CUDA_TRY(cudaDeviceGetAttribute(&d->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    KV_CUDA_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
    d->l2_bytes = (size_t)v;
    d->score_hist = kv_env_is1("KVBENCH_SCORE_HIST");
    return KV_OK;
}
