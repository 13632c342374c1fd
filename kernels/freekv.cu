/* freekv.cu: FreeKV's own CUDA pieces (issue 10; the CPU reference and the
 * paper's facts are in retrievers/freekv.c). The page summaries, the bound
 * scan, the group-mean softmax and the top-k over pages are Quest's kernels,
 * reached through Quest's launcher table (kernels/quest.h), so one copy of
 * the page code serves both methods; chosen over moving them into a shared
 * kernels/ops/pages.cu because Quest's table already exposes exactly the
 * operations FreeKV needs (create/build/append/search with pool=mean, and
 * select_flagged for the correction) and a move would duplicate nothing
 * less while touching Quest's file. The group-mean selection itself is
 * kernels/pages_pipe.cu (pipelined bound scan once per kv head for the
 * whole group, softmax partial sums, pooled scores and the page top-k,
 * merged by the last block of each kv head; kernels/pages_mean.cu is the
 * older path under KVBENCH_PAGES_PIPE=0), which quest.cu dispatches to.
 *
 * Here: the correction. The test: one block reads q_t and q_{t-1} into
 * shared memory, one thread per query head computes cos(q_h, qprev_h) in
 * double in channel order (__dmul_rn/__dadd_rn, no contraction, IEEE sqrt
 * and division), then one thread per kv head takes the group mean in head
 * order and compares with tau: the same operations in the same order as
 * kv_freekv_group_cosine, so the decision is bitwise the CPU's. The flags
 * stay on the device, and the re-selection with q_t follows in the same
 * stream for the kv heads that fire only (correct: Quest's select_flagged,
 * whose blocks of other kv heads return at once).
 * The bench (kvbench bench --method freekv) reports summary, bound_scan,
 * pool_topk and select_spec (= bound_scan + pool_topk: the speculative
 * selection with q_{t-1}, off the critical path), then what is on it:
 * cosine_test (the test alone), correct_none / correct_one / correct_all
 * (test + flagged re-selection with 0, 1 or all kv heads firing; every
 * repetition checks that exactly those heads fired). */
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

/* The whole test in one block: the queries are read coalesced into shared
 * memory (one DRAM round trip instead of D dependent ones per thread), then
 * one thread per query head sums in channel order and one thread per kv
 * head takes the group mean: bitwise kv_freekv_group_cosine's decision. */
constexpr int FK_TH = 256, FK_SMEM = 48 * 1024;

__device__ __forceinline__ double freekv_cos1(const float *x, const float *y, int D) {
    double dot = 0, nx = 0, ny = 0;
    for (int i = 0; i < D; i++) {
        double a = x[i], b = y[i];
        dot = __dadd_rn(dot, __dmul_rn(a, b));
        nx = __dadd_rn(nx, __dmul_rn(a, a));
        ny = __dadd_rn(ny, __dmul_rn(b, b));
    }
    return nx > 0 && ny > 0 ? __ddiv_rn(dot, __dmul_rn(sqrt(nx), sqrt(ny))) : 0.0;
}

__global__ void __launch_bounds__(FK_TH) freekv_test(const float *q, const float *qp, int Hq, int D, int G,
                                                     double tau, int insm, double *cos, int *flag) {
    extern __shared__ float fk_sq[];
    const int n = Hq * D;
    const float *x = q, *y = qp;
    if (insm) {
        for (int e = threadIdx.x; e < n; e += FK_TH) {
            fk_sq[e] = q[e];
            fk_sq[n + e] = qp[e];
        }
        __syncthreads();
        x = fk_sq;
        y = fk_sq + n;
    }
    for (int h = threadIdx.x; h < Hq; h += FK_TH) cos[h] = freekv_cos1(x + (long long)h * D, y + (long long)h * D, D);
    __syncthreads(); /* cos[] is read back by other threads: global writes of this block, visible after the barrier */
    for (int g = threadIdx.x; g < Hq / G; g += FK_TH) {
        double acc = 0;
        for (int h = 0; h < G; h++) acc = __dadd_rn(acc, __ldcg(cos + g * G + h));
        flag[g] = __ddiv_rn(acc, (double)G) < tau;
    }
}

kv_status freekv_cos_launch(kv_freekv_gpu *g, double tau, cudaStream_t st) {
    const size_t sm = 2 * (size_t)g->Hq * g->D * sizeof(float);
    const int insm = sm <= (size_t)FK_SMEM;
    freekv_test<<<1, FK_TH, insm ? sm : 0, st>>>(g->q, g->q + (size_t)g->Hq * g->D, g->Hq, g->D, g->G, tau, insm,
                                                 g->cos, g->flag);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

kv_status freekv_create_go(kv_freekv_gpu *g) {
    KV_CUDA_TRY(kv_stream_create(&g->st));
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

/* The correction in one step on the device: the test, then the flagged
 * re-selection with q_t (only the kv heads that fire run; no host round
 * trip between them); where the flagged path is not available (older pages
 * path, other shapes) the flags come back first and, if any fired, a full
 * pool=mean search runs. */
static kv_status kv_freekv_gpu_correct(kv_freekv_gpu *g, kv_quest_gpu *qg, const float *q, const float *qprev,
                                       double tau, float scale, int ncand, int kp, int *flag, int32_t *pages) {
    const size_t n = (size_t)g->Hq * g->D * sizeof(float);
    KV_CUDA_TRY(cudaMemcpyAsync(g->q, q, n, cudaMemcpyHostToDevice, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(g->q + (size_t)g->Hq * g->D, qprev, n, cudaMemcpyHostToDevice, g->st));
    KV_TRY(freekv_cos_launch(g, tau, g->st));
    const bool one = kp > 0 && ncand > 0 && kv_quest_cuda.flagged_ok(qg, kp);
    if (one) KV_TRY(kv_quest_cuda.select_flagged(qg, g->q, scale, ncand, kp, g->flag, g->st, pages));
    KV_CUDA_TRY(cudaMemcpyAsync(flag, g->flag, (size_t)g->Hkv * sizeof(int), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    if (one || kp <= 0 || ncand <= 0) return KV_OK;
    int any = 0;
    for (int k = 0; k < g->Hkv; k++) any |= flag[k];
    return any ? kv_quest_cuda.search(qg, q, scale, 1, ncand, kp, pages, NULL) : KV_OK;
}

/* ---- kvbench bench --method freekv ---- */
namespace {
struct freekv_bench_ctx {
    const kv_gpu_bench_spec *s;
    const float *q; /* host [Hq][D] */
};

/* qprev (host) = q with the query heads of the first nfire kv heads negated:
 * their group-mean cosine is -1, the others' 1. */
kv_status freekv_set_prev(kv_freekv_gpu *g, const float *q, int nfire, float *tmp) {
    const size_t n = (size_t)g->Hq * g->D;
    for (size_t e = 0; e < n; e++) tmp[e] = (int)(e / ((size_t)g->G * g->D)) < nfire ? -q[e] : q[e];
    KV_CUDA_TRY(cudaMemcpy(g->q + n, tmp, n * sizeof(float), cudaMemcpyHostToDevice));
    return KV_OK;
}

kv_status freekv_bench_stages(freekv_bench_ctx *c, kv_quest_gpu *qg, kv_bench_timer *tm, int np, int kp,
                              kv_freekv_gpu *g, float *tmp, kv_gpu_stages *out) {
    const kv_gpu_bench_spec *s = c->s;
    const size_t n = (size_t)s->Hq * s->D;
    KV_CUDA_TRY(cudaMemcpy(g->q, c->q, n * sizeof(float), cudaMemcpyHostToDevice));
    if (out->n + 4 > KV_GPU_MAX_STAGES) return kv_fail(KV_ERR_INTERNAL, "freekv GPU bench: too many stages");
    const double qb = 2.0 * n * 4 + s->Hkv * 4.0, summ1 = (double)np * 2 * s->D * 2, qg1 = (double)s->Hq / s->Hkv * s->D * 4;
    /* the test alone (no kv head fires), then test + flagged re-selection with 0, 1 and all kv heads firing */
    static const struct { const char *name; int fire; } st_[] = {
        {"cosine_test", -1}, {"correct_none", 0}, {"correct_one", 1}, {"correct_all", 1 << 30}};
    const bool flagged = kv_quest_cuda.flagged_ok(qg, kp);
    for (int i = 0; i < 4; i++) {
        if (i > 0 && !flagged) break; /* the older pages path (KVBENCH_PAGES_PIPE=0) has no flagged selection */
        const int fire = st_[i].fire < 0 ? 0 : st_[i].fire < s->Hkv ? st_[i].fire : s->Hkv;
        KV_TRY(freekv_set_prev(g, c->q, fire, tmp));
        kv_gpu_timing t = {};
        KV_TRY(kv_bench_time(tm, [&]() -> kv_status {
            KV_TRY(freekv_cos_launch(g, 0.9, tm->st));
            return i ? kv_quest_cuda.select_flagged(qg, g->q, s->scale, np, kp, g->flag, tm->st, NULL) : KV_OK;
        }, &t));
        int *fl = (int *)tmp; /* the flags the last repetition left: exactly the first `fire` kv heads */
        KV_CUDA_TRY(cudaMemcpy(fl, g->flag, s->Hkv * sizeof(int), cudaMemcpyDeviceToHost));
        for (int k = 0; k < s->Hkv; k++)
            if (fl[k] != (k < fire))
                return kv_fail(KV_ERR_INTERNAL, "freekv GPU bench: %s: kv head %d flag %d, expected %d", st_[i].name, k,
                               fl[k], k < fire);
        out->stage[out->n++] = kv_gpu_stage{st_[i].name, t, qb + (i ? s->Hkv * 4.0 + fire * (summ1 + qg1 + kp * 4.0) : 0)};
    }
    return KV_OK;
}

kv_status freekv_bench_hook(void *ctx, kv_quest_gpu *qg, void *timer, int np, int kp, kv_gpu_stages *out) {
    freekv_bench_ctx *c = (freekv_bench_ctx *)ctx;
    kv_freekv_gpu *g = NULL;
    float *tmp = (float *)kv_malloc((size_t)c->s->Hq * c->s->D * sizeof(float), "freekv bench queries");
    kv_status st = tmp ? kv_freekv_gpu_create(c->s->Hq, c->s->Hkv, c->s->D, &g) : KV_ERR_NOMEM;
    if (st == KV_OK) st = freekv_bench_stages(c, qg, (kv_bench_timer *)timer, np, kp, g, tmp, out);
    kv_freekv_gpu_destroy(g);
    free(tmp);
    return st;
}
}  // namespace

static kv_status kv_freekv_gpu_bench(const kv_gpu_bench_spec *s, int page, const kv_gpu_keys *K, const float *q,
                                     kv_gpu_stages *out) {
    KV_TRY(kv_gpu_table(&kv_quest_cuda));
    freekv_bench_ctx c = {s, q};
    /* summary, bound_scan, pool_topk, search (Quest pool=mean), then the hook's test and correction stages */
    KV_TRY(kv_quest_cuda.bench_with(s, page, 1, K, q, freekv_bench_hook, &c, out));
    for (int i = 0; i < out->n; i++)
        if (!strcmp(out->stage[i].name, "search")) out->stage[i].name = "select_spec";
    size_t len = strlen(out->bytes_note);
    snprintf(out->bytes_note + len, sizeof out->bytes_note - len,
             "; FreeKV: select_spec (q_{t-1}) is off the critical path; on it: cosine_test (2 x Hq x D x 4 B in, "
             "Hkv flags out), correct_none/one/all = test + flagged re-selection with q_t, 0/1/Hkv kv heads firing "
             "(+ their summaries)");
    return KV_OK;
}

extern "C" const kv_freekv_cuda_ops kv_freekv_cuda = {
    .create = kv_freekv_gpu_create,
    .cosine = kv_freekv_gpu_cosine,
    .correct = kv_freekv_gpu_correct,
    .destroy = kv_freekv_gpu_destroy,
    .bench = kv_freekv_gpu_bench,
};
