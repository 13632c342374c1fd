// roundtrip.cu: what one host-synchronous GPU search costs beyond its kernels
// (issue 12, goal 1: in-run search within 1.3x of the bench's). The run
// loop's searches each upload a query, launch their kernels, copy their
// result back and wait; `kvbench bench` times the kernels alone, back to
// back. This program times that round trip with stand-in kernels that spin
// for fixed times (13 + 18 us, Quest's bound scan and top-k at 128K), the
// GPU idle and L2 flushed before each repetition as in a run, in the
// variants a method could use: pageable or page-locked host buffers, plain
// launches, a CUDA graph, and an empty search (one tiny kernel: the floor);
// plus a MagicPIG-sized result (16 rows of 5000 ints, a 2-D copy) into
// pageable and page-locked memory. Then what `kvbench run`'s queued searches
// measure (session 20): the kernels bracketed by CUDA events while queued
// behind a 40 us kernel on the same stream (the bench's case) or on another
// stream the search's stream waits for (the run's: each method has its own).
// Medians of 2000 repetitions, host clock (the event rows: CUDA events). Built and run by
// scripts/device_check.sh (RUNLOOP=1); by hand:
//   nvcc -O2 -arch=sm_90 -o /tmp/roundtrip scripts/roundtrip.cu && /tmp/roundtrip
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "roundtrip: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(2);                                                                                \
        }                                                                                           \
    } while (0)

static double now_s() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

__global__ void spin(long long ns, float *x) { /* busy for ns nanoseconds */
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
    if (threadIdx.x == 0) x[blockIdx.x] += 1.f;
}

__global__ void flush(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1.f;
}

int main() {
    const int N = 2000, ROWS = 16, WIDE = 5000;
    const long long K1 = 13000, K2 = 18000; /* ns */
    const size_t qb = 16 * 128 * 4, rb = 16 * 6 * 4, wide = (size_t)ROWS * WIDE * 4, fn = (size_t)64 << 20;
    float *hq = (float *)calloc(1, qb), *hr = (float *)calloc(1, wide), *pq, *pr, *dq, *dr, *dx, *fb;
    CK(cudaHostAlloc(&pq, qb, 0));
    CK(cudaHostAlloc(&pr, wide, 0));
    CK(cudaMalloc(&dq, qb));
    CK(cudaMalloc(&dr, (size_t)ROWS * 131072 * 4));
    CK(cudaMalloc(&dx, 1024 * 4));
    CK(cudaMalloc(&fb, fn * 4));
    CK(cudaMemset(dr, 0, (size_t)ROWS * 131072 * 4));
    CK(cudaMemset(dx, 0, 1024 * 4));
    CK(cudaMemset(fb, 0, fn * 4));
    cudaStream_t st, st2;
    CK(cudaStreamCreate(&st));
    CK(cudaStreamCreate(&st2));
    cudaEvent_t e0, e1, ep;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&ep));
    auto kernels = [&]() {
        spin<<<132, 128, 0, st>>>(K1, dx);
        spin<<<16, 1024, 0, st>>>(K2, dx);
        CK(cudaGetLastError());
    };
    auto search = [&](float *q, float *r) {
        CK(cudaMemcpyAsync(dq, q, qb, cudaMemcpyHostToDevice, st));
        kernels();
        CK(cudaMemcpyAsync(r, dr, rb, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
    };
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemcpyAsync(dq, pq, qb, cudaMemcpyHostToDevice, st));
    kernels();
    CK(cudaMemcpyAsync(pr, dr, rb, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    struct variant { const char *name; int what; };
    const variant vs[] = {
        {"kernels alone (CUDA events)", 0},
        {"pageable query and result, 2 launches, synchronise", 1},
        {"page-locked query and result, 2 launches, synchronise", 2},
        {"the same as one CUDA graph", 3},
        {"empty search: page-locked copies, one tiny kernel (the floor)", 4},
        {"16 x 5000-int result, 2-D copy into pageable memory", 5},
        {"16 x 5000-int result, 2-D copy into page-locked memory", 6},
        {"kernels queued behind a 40 us kernel, same stream (CUDA events)", 7},
        {"kernels queued behind a 40 us kernel, other stream + event wait (events)", 8},
    };
    printf("round trip of one synchronous search, H2D 8 KB + kernels (%lld + %lld us) + D2H, GPU idle and L2 flushed "
           "before each; medians of %d\n", K1 / 1000, K2 / 1000, N);
    for (const variant &v : vs) {
        std::vector<double> w;
        for (int i = 0; i < N; i++) {
            flush<<<264, 1024, 0, st>>>(fb, fn);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(st));
            usleep(50);
            double t0 = now_s(), t;
            switch (v.what) {
            case 0:
            case 7:
            case 8: { /* the kernels between events: on the idle GPU (0), or queued behind a 40 us kernel on st (7)
                       * or on st2, which st waits for (8) */
                if (v.what) {
                    spin<<<132, 128, 0, v.what == 7 ? st : st2>>>(40000, dx);
                    CK(cudaGetLastError());
                }
                if (v.what == 8) {
                    CK(cudaEventRecord(ep, st2));
                    CK(cudaStreamWaitEvent(st, ep, 0));
                }
                CK(cudaEventRecord(e0, st));
                kernels();
                CK(cudaEventRecord(e1, st));
                CK(cudaStreamSynchronize(st));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t = 1e-3 * ms;
                break;
            }
            case 1: search(hq, hr); break;
            case 2: search(pq, pr); break;
            case 3: CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st)); break;
            case 4:
                CK(cudaMemcpyAsync(dq, pq, qb, cudaMemcpyHostToDevice, st));
                spin<<<1, 32, 0, st>>>(0, dx);
                CK(cudaGetLastError());
                CK(cudaMemcpyAsync(pr, dr, rb, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
                break;
            default: {
                float *q = v.what == 5 ? hq : pq, *r = v.what == 5 ? hr : pr;
                CK(cudaMemcpyAsync(dq, q, qb, cudaMemcpyHostToDevice, st));
                kernels();
                CK(cudaMemcpy2DAsync(r, WIDE * 4, dr, 131072 * 4, WIDE * 4, ROWS, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
            }
            }
            if (v.what > 0 && v.what < 7) t = now_s() - t0;
            w.push_back(1e6 * t);
        }
        std::sort(w.begin(), w.end());
        printf("  %-64s median %6.1f us (p10 %6.1f, p90 %6.1f)\n", v.name, w[N / 2], w[N / 10], w[9 * N / 10]);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    return 0;
}
