/* bench_method.cuh: the frame a method's `kvbench bench` hook runs in
 * (kernels/csattention.cu and kernels/ctkvr.cu share it; issue 9 asked to
 * fold their copies). The method state S has a stream member `st` its
 * launchers use; a timing phase borrows it: begin() makes a kv_bench_timer
 * (reps, warm-up; on the bench process's stream) and
 * points g->st at the timer's stream, end() puts the state's own stream back
 * and frees the timer. kv_mbench_run zeroes the output, runs the hook's body
 * and then, whether it failed or not, ends the open phase and destroys the
 * state. */
#ifndef KV_BENCH_METHOD_CUH
#define KV_BENCH_METHOD_CUH

#include <string.h>

#include "kv_cuda.h"

template <class S> struct kv_mbench {
    S *g = nullptr;
    kv_bench_timer tm = {};
    cudaStream_t own = nullptr;
    bool on = false;

    kv_status begin(int reps, int warmup, void *stream) {
        end();
        KV_TRY(kv_bench_timer_init(&tm, reps, warmup, stream));
        own = g->st;
        g->st = tm.st;
        on = true;
        return KV_OK;
    }
    void end() {
        if (on) g->st = own;
        on = false;
        own = nullptr;
        kv_bench_timer_free(&tm);
    }
    /* Times f (a callable returning kv_status, launching on g->st) in the open phase. */
    template <class F> kv_status time(F &&f, kv_gpu_timing *out) { return kv_bench_time(&tm, f, out); }
};

template <class S, class Go> kv_status kv_mbench_run(kv_gpu_stages *out, void (*destroy)(void *), Go &&go) {
    memset(out, 0, sizeof *out);
    kv_mbench<S> x;
    const kv_status st = go(x);
    if (st == KV_OK) {
        out->l2_bytes = x.tm.dev.l2_bytes;
        out->flush_bytes = x.tm.flush_n * sizeof(uint4);
    }
    x.end();
    destroy(x.g);
    return st;
}

#endif
