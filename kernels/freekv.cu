/* freekv.cu: FreeKV's own CUDA pieces (issue 10; the CPU reference and the
 * paper's facts are in retrievers/freekv.c). The page summaries, the bound
 * scan, the group-mean softmax and the top-k over pages are Quest's kernels,
 * reached through Quest's launcher table (kernels/quest.h), so one copy of
 * the page code serves both methods; chosen over moving them into a shared
 * kernels/ops/pages.cu because Quest's table already exposes exactly the
 * operations FreeKV needs (create/build/append/search with pool=mean) and a
 * move would duplicate nothing less while touching Quest's file. The
 * group-mean selection itself (pool=mean: bound scan once per kv head for
 * the whole group, softmax partial sums, pooled scores and the page top-k
 * fused, merged by the last block of each kv head) is kernels/pages_mean.cu,
 * which quest.cu dispatches to; the bench reports its stages as
 * bound_scan, pool_topk and select_spec (= both).
 *
 * Here: the correction test. One thread per query head computes
 * cos(q_h, qprev_h) in double in channel order (__dmul_rn/__dadd_rn, no
 * contraction, IEEE sqrt and division), then one thread per kv head takes
 * the group mean in head order and compares with tau: the same operations
 * in the same order as kv_freekv_group_cosine, so the decision is bitwise
 * the CPU's. The bench times Quest's pool=mean selection (the speculative
 * selection, off the critical path) and this test (on it). */
#include <string.h>

#include "freekv.h"
#include "ops/kv_cuda.h"
#include "quest.h"

struct kv_freekv_gpu {
    int Hq, Hkv, D, G;
    cudaStream_t st;
    float *q;      /* [2][Hq][D]: q_t, then q_{t-1} */
    double *cos;   /* [Hq] */
    int *flag;     /* [Hkv] */
};

namespace {

__global__ void freekv_head_cos(const float *q, const float *qp, int Hq, int D, double *cos) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= Hq) return;
    const float *x = q + (long long)h * D, *y = qp + (long long)h * D;
    double dot = 0, nx = 0, ny = 0;
    for (int i = 0; i < D; i++) {
        double a = x[i], b = y[i];
        dot = __dadd_rn(dot, __dmul_rn(a, b));
        nx = __dadd_rn(nx, __dmul_rn(a, a));
        ny = __dadd_rn(ny, __dmul_rn(b, b));
    }
    cos[h] = nx > 0 && ny > 0 ? __ddiv_rn(dot, __dmul_rn(sqrt(nx), sqrt(ny))) : 0.0;
}

__global__ void freekv_group_flag(const double *cos, int Hkv, int G, double tau, int *flag) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= Hkv) return;
    double acc = 0;
    for (int h = 0; h < G; h++) acc = __dadd_rn(acc, cos[g * G + h]);
    flag[g] = __ddiv_rn(acc, (double)G) < tau;
}

kv_status freekv_cos_launch(kv_freekv_gpu *g, double tau, cudaStream_t st) {
    freekv_head_cos<<<(g->Hq + 127) / 128, 128, 0, st>>>(g->q, g->q + (size_t)g->Hq * g->D, g->Hq, g->D, g->cos);
    KV_LAUNCH_CHECK();
    freekv_group_flag<<<(g->Hkv + 127) / 128, 128, 0, st>>>(g->cos, g->Hkv, g->G, tau, g->flag);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

kv_status freekv_create_go(kv_freekv_gpu *g) {
    KV_CUDA_TRY(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking));
    KV_CUDA_ALLOC(g->q, 2 * (size_t)g->Hq * g->D * sizeof(float), 0, "freekv queries");
    KV_CUDA_ALLOC(g->cos, (size_t)g->Hq * sizeof(double), 0, "freekv cosines");
    KV_CUDA_ALLOC(g->flag, (size_t)g->Hkv * sizeof(int), 0, "freekv correction flags");
    return KV_OK;
}

}  // namespace

static void kv_freekv_gpu_destroy(kv_freekv_gpu *g) {
    if (!g) return;
    cudaFree(g->q); cudaFree(g->cos); cudaFree(g->flag);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

static kv_status kv_freekv_gpu_create(int Hq, int Hkv, int D, kv_freekv_gpu **out) {
    *out = NULL;
    if (Hq < 1 || Hkv < 1 || Hq % Hkv || D < 1) return kv_fail(KV_ERR_INPUT, "freekv GPU: bad shape Hq=%d Hkv=%d D=%d", Hq, Hkv, D);
    kv_freekv_gpu *g = (kv_freekv_gpu *)kv_calloc(1, sizeof *g, "freekv GPU state");
    if (!g) return KV_ERR_NOMEM;
    g->Hq = Hq; g->Hkv = Hkv; g->D = D; g->G = Hq / Hkv;
    kv_status st = freekv_create_go(g);
    if (st != KV_OK) { kv_freekv_gpu_destroy(g); return st; }
    *out = g;
    return KV_OK;
}

static kv_status kv_freekv_gpu_cosine(kv_freekv_gpu *g, const float *q, const float *qprev, double tau, int *flag) {
    const size_t n = (size_t)g->Hq * g->D * sizeof(float);
    KV_CUDA_TRY(cudaMemcpyAsync(g->q, q, n, cudaMemcpyHostToDevice, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(g->q + (size_t)g->Hq * g->D, qprev, n, cudaMemcpyHostToDevice, g->st));
    KV_TRY(freekv_cos_launch(g, tau, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(flag, g->flag, (size_t)g->Hkv * sizeof(int), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

/* ---- kvbench bench --method freekv ---- */
static kv_status kv_freekv_gpu_bench(const kv_gpu_bench_spec *s, int page, const kv_gpu_keys *K, const float *q,
                                     kv_gpu_stages *out) {
    KV_TRY(kv_gpu_table(&kv_quest_cuda));
    KV_TRY(kv_quest_cuda.bench(s, page, 1, K, q, out)); /* summary, bound_scan, topk, search (pool=mean) */
    if (out->n + 1 > KV_GPU_MAX_STAGES) return kv_fail(KV_ERR_INTERNAL, "freekv GPU bench: too many stages");
    kv_freekv_gpu *g = NULL;
    kv_bench_timer tm = {};
    kv_status st = kv_freekv_gpu_create(s->Hq, s->Hkv, s->D, &g);
    if (st == KV_OK) st = kv_bench_timer_init(&tm, s->reps, s->warmup);
    if (st == KV_OK) {
        const size_t n = (size_t)s->Hq * s->D * sizeof(float);
        cudaError_t e = cudaMemcpy(g->q, q, n, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(g->q + (size_t)s->Hq * s->D, q, n, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) st = kv_cuda_error(e, "cudaMemcpy", __FILE__, __LINE__);
    }
    kv_gpu_timing t = {};
    if (st == KV_OK) st = kv_bench_time(&tm, [&]() { return freekv_cos_launch(g, 0.9, tm.st); }, &t);
    if (st == KV_OK) {
        for (int i = 0; i < out->n; i++)
            if (!strcmp(out->stage[i].name, "search")) out->stage[i].name = "select_spec";
        out->stage[out->n++] = kv_gpu_stage{"cosine_test", t, 2.0 * s->Hq * s->D * 4 + s->Hkv * 4.0};
        size_t len = strlen(out->bytes_note);
        snprintf(out->bytes_note + len, sizeof out->bytes_note - len,
                 "; FreeKV: select_spec (Quest pool=mean search, q_{t-1}) runs off the critical path; on it: "
                 "cosine_test always (q_t, q_{t-1} in, Hkv flags out), plus select_spec again when a head is corrected");
    }
    kv_bench_timer_free(&tm);
    kv_freekv_gpu_destroy(g);
    return st;
}

extern "C" const kv_freekv_cuda_ops kv_freekv_cuda = {
    .create = kv_freekv_gpu_create,
    .cosine = kv_freekv_gpu_cosine,
    .destroy = kv_freekv_gpu_destroy,
    .bench = kv_freekv_gpu_bench,
};
