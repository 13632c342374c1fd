/* racc.cu: RACC's CUDA path (issue 10; the CPU reference and the paper's
 * facts are in retrievers/racc.c).
 *
 * Vote. For D 64, 128, 256 while the window x resident-keys score matrix
 * fits 4 GiB (every model here): kernels/racc_scores.cu, one register-tiled
 * score sweep (scores bitwise kv_dot_ref's, kept in memory), the row sums
 * and the votes streamed from them. KVBENCH_RACC_VOTE=fused, or other
 * D % 8 == 0 up to 256: the fused two-sweep kernels of kernels/racc_vote.cu
 * (row max and sum of exp in one sweep, the votes in a second; the score
 * matrix never reaches memory; half as fast). Other shapes: the older
 * path kept here: the G*window queries of every kv head are R = Hkv*G*window rows of
 * the shared score kernel (kv_scores_launch, bitwise kv_scores_ref: row r
 * reads kv head r / (G*window)) over the context in chunks of C tokens (C
 * chosen so R*C floats stay under 64M: the score matrix of a long context
 * never exists whole). Three sweeps over the chunks recompute the scores:
 * the row maxima over the resident tokens (atomicMax on order-preserving
 * keys: exact), the row sums of exp(s - m) in double (one partial per
 * (row, chunk) from a fixed block tree, then summed in chunk order:
 * deterministic), and the vote of each token, the sum over its kv head's
 * rows in the CPU's order of exp(s - m) / z, in double, stored as float.
 * Both paths: CUDA's exp and the order of z's sum differ from the CPU's, so votes
 * agree to ~1e-12 relative and the kept set can differ only between votes
 * that are equal as floats up to that; the ranking of the kept set (once
 * every L_n tokens, nc floats) is done on the host by retrievers/racc.c with
 * the CPU's code.
 * Retrieval. The group-mean previous query of each kv head is one row of
 * kv_scores_launch over the region, the resident tokens are masked to -inf,
 * and the shared top-k (kv_topk_launch) returns the top r in kv_topk_ref
 * order: bitwise the CPU's selection for the same eviction flags. r is
 * limited to KV_GPU_TOPK_MAX (8192, the shared top-k's index limit): at
 * beta = 1% that is 819K tokens of context; longer contexts are refused
 * with a message. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/kv_cuda.h"
#include "racc.h"
#include "racc_dev.cuh"

struct kv_racc_gpu {
    int Hq, Hkv, T, D, W, G, R;
    long long C;        /* chunk of tokens per vote sweep */
    int nch;            /* chunks at most */
    kv_cuda_dev dev;
    cudaStream_t st;
    kv_gpu_keys *keys;  /* own keys (retriever), or NULL (bench: external) */
    uint8_t *ev;        /* [Hkv][T] */
    float *qw;          /* [R][D] */
    float *qm;          /* [Hkv][D] */
    float *S;           /* [R][C] vote scores of one chunk; also [Hkv][T] retrieval scores when larger */
    unsigned *mkey;     /* [R] */
    double *zpart;      /* [R][nch] */
    double *z;          /* [R] */
    float *vote;        /* [Hkv][T] */
    int32_t *idx;       /* [Hkv][KV_GPU_TOPK_MAX] */
    int32_t *hidx;      /* pinned [Hkv][KV_GPU_TOPK_MAX]: a queued retrieval's result (retrieve_launch) */
    int rk;             /* the queued retrieval's k (0: none queued) */
    kv_topk_ws tk;
    int fused;          /* the fused two-sweep vote (racc_vote.cu) */
    int tiled;          /* the tiled vote (racc_scores.cu; default where it fits) */
    racc_vote_scratch fw;
};

namespace {

constexpr long long RACC_SCORE_BUDGET = 64LL << 20; /* floats of one chunk's score matrix */
constexpr long long RACC_TILED_MAX = 1LL << 30;     /* floats of the tiled vote's whole score matrix (4 GiB) */

__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double r = 0;
    if (threadIdx.x == 0)
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) r += sh[i];
    __syncthreads();
    return r; /* valid in thread 0 */
}

/* Row maxima over the resident tokens of chunk [a, a+n). Block per row. */
__global__ void racc_row_max(const float *S, long long ld, int n, int a, const uint8_t *ev, int T, int rows_per_g,
                             unsigned *mkey) {
    const int r = blockIdx.x, g = r / rows_per_g;
    const float *s = S + (long long)r * ld;
    const uint8_t *e = ev + (long long)g * T + a;
    unsigned best = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (!e[i]) best = max(best, kv_f2key(s[i]));
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_down_sync(0xffffffffu, best, o));
    if ((threadIdx.x & 31) == 0 && best) atomicMax(mkey + r, best);
}

/* zpart[r*nch + c] = sum over the resident tokens of chunk c of exp(s - m_r). */
__global__ void racc_row_z(const float *S, long long ld, int n, int a, const uint8_t *ev, int T, int rows_per_g,
                           const unsigned *mkey, double *zpart, int nch, int c) {
    __shared__ double sh[32];
    const int r = blockIdx.x, g = r / rows_per_g;
    const float *s = S + (long long)r * ld;
    const uint8_t *e = ev + (long long)g * T + a;
    const double m = mkey[r] ? (double)kv_key2f(mkey[r]) : 0.0;
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (!e[i]) acc += exp((double)s[i] - m);
    double t = block_sum_d(acc, sh);
    if (threadIdx.x == 0) zpart[(long long)r * nch + c] = t;
}

__global__ void racc_z_final(const double *zpart, int nch, int used, int R, double *z) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    double acc = 0;
    for (int c = 0; c < used; c++) acc += zpart[(long long)r * nch + c];
    z[r] = acc;
}

/* vote[g*span + a - lo + i] over the rows of kv head g, in row order. */
__global__ void racc_vote_chunk(const float *S, long long ld, int n, int a, int lo, int span, const uint8_t *ev, int T,
                                int Hkv, int rows_per_g, const unsigned *mkey, const double *z, float *vote) {
    long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (e >= (long long)Hkv * n) return;
    const int g = (int)(e / n), i = (int)(e % n);
    float *out = vote + (long long)g * span + (a - lo) + i;
    if (ev[(long long)g * T + a + i]) { *out = -INFINITY; return; }
    double acc = 0;
    for (int r = g * rows_per_g; r < (g + 1) * rows_per_g; r++)
        acc += exp((double)S[(long long)r * ld + i] - (double)kv_key2f(mkey[r])) / z[r];
    *out = (float)acc;
}

/* Retrieval scores of the resident tokens to -inf. */
__global__ void racc_mask_resident(float *S, long long ld, int n, int lo, const uint8_t *ev, int T, int Hkv) {
    long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (e >= (long long)Hkv * n) return;
    const int g = (int)(e / n), i = (int)(e % n);
    if (!ev[(long long)g * T + lo + i]) S[(long long)g * ld + i] = -INFINITY;
}

kv_status racc_create_go(kv_racc_gpu *g, int own_keys) {
    KV_TRY(kv_cuda_dev_query(&g->dev));
    KV_CUDA_TRY(kv_stream_create(&g->st));
    if (own_keys) KV_TRY(kv_gpu_keys_create(g->Hkv, g->T, g->D, 0, &g->keys));
    const size_t Hkv = g->Hkv, T = g->T, D = g->D, R = g->R;
    long long C = RACC_SCORE_BUDGET / (long long)R;
    C = C < 1024 ? 1024 : C > (long long)T ? (long long)T : C;
    g->C = C;
    g->nch = (int)((T + C - 1) / C);
    g->fused = racc_vote_fused_ok(g->D);
    /* KVBENCH_RACC_VOTE=fused keeps the two-sweep kernel (the comparison in docs; the tiled one is the default) */
    const char *env = getenv("KVBENCH_RACC_VOTE");
    if (env && *env && strcmp(env, "tiled") && strcmp(env, "fused"))
        return kv_fail(KV_ERR_INPUT, "KVBENCH_RACC_VOTE: expected tiled or fused, found '%s'", env);
    const long long lds = ((long long)T + 3) / 4 * 4;
    g->tiled = racc_vote_tiled_ok(g->D) && (long long)R * lds <= RACC_TILED_MAX && !(env && !strcmp(env, "fused"));
    size_t sfl = !g->fused && (size_t)R * C > Hkv * T ? (size_t)R * C : Hkv * T; /* the fused vote needs no S */
    KV_CUDA_ALLOC(g->ev, Hkv * T, 0, "racc eviction flags");
    KV_CUDA_TRY(cudaMemset(g->ev, 0, Hkv * T));
    KV_CUDA_ALLOC(g->qw, R * D * sizeof(float), 0, "racc window queries");
    KV_CUDA_ALLOC(g->qm, Hkv * D * sizeof(float), 0, "racc retrieval queries");
    KV_CUDA_ALLOC(g->S, sfl * sizeof(float), 0, "racc scores");
    KV_CUDA_ALLOC(g->mkey, R * sizeof(unsigned), 0, "racc row maxima");
    KV_CUDA_ALLOC(g->zpart, R * g->nch * sizeof(double), 0, "racc row sums");
    KV_CUDA_ALLOC(g->z, R * sizeof(double), 0, "racc row sums");
    KV_CUDA_ALLOC(g->vote, Hkv * T * sizeof(float), 0, "racc votes");
    KV_CUDA_ALLOC(g->idx, Hkv * KV_GPU_TOPK_MAX * sizeof(int32_t), 0, "racc retrieved");
    if (own_keys) KV_CUDA_ALLOC(g->hidx, Hkv * KV_GPU_TOPK_MAX * sizeof(int32_t), 1, "racc retrieved (host)");
    KV_TRY(kv_topk_ws_create(&g->tk, g->Hkv, g->T, &g->dev));
    if (g->fused) {
        racc_vote_scratch *w = &g->fw;
        w->nblk_cap = racc_vote_blocks(g->Hkv, g->T, &g->dev);
        KV_CUDA_ALLOC(w->part_m, R * (w->nblk_cap + 1) * sizeof(float), 0, "racc vote partial maxima");
        KV_CUDA_ALLOC(w->part_z, R * (w->nblk_cap + 1) * sizeof(double), 0, "racc vote partial sums");
        KV_CUDA_ALLOC(w->rpos, Hkv * T * sizeof(int32_t), 0, "racc resident positions");
        KV_CUDA_ALLOC(w->ccnt, Hkv * racc_vote_chunks(g->T) * sizeof(int), 0, "racc resident counts");
        KV_CUDA_ALLOC(w->rcnt, Hkv * sizeof(int), 0, "racc resident counts");
    }
    if (g->tiled) {
        racc_vote_scratch *w = &g->fw;
        w->lds = lds;
        KV_CUDA_ALLOC(w->S, R * (size_t)lds * sizeof(float), 0, "racc vote scores (tiled vote)");
        KV_CUDA_ALLOC(w->mrow, R * sizeof(double), 0, "racc vote row maxima");
        w->mkey = g->mkey;
        w->rz = g->z;
        w->zld = racc_vote_zchunks(g->T);
        KV_CUDA_ALLOC(w->zp, R * (size_t)w->zld * sizeof(double), 0, "racc vote row-sum partials");
        w->prefetch = kv_env_on("KVBENCH_RACC_PREFETCH"); /* 0: no L2 prefetch of the next key tile (comparison) */
    }
    return KV_OK;
}

/* The vote over [lo, hi) of the window queries already in g->qw, keys K: to g->vote. */
kv_status racc_vote_launch(kv_racc_gpu *g, const kv_dev_kv *K, float scale, int lo, int hi) {
    const int span = hi - lo, rpg = g->G * g->W;
    if (span <= 0) return KV_OK;
    if (g->tiled) return racc_vote_tiled(K, g->ev, g->T, g->qw, g->Hkv, rpg, scale, lo, hi, &g->fw, g->vote, span,
                                         &g->dev, g->st);
    if (g->fused) return racc_vote_fused(K, g->ev, g->T, g->qw, g->Hkv, rpg, scale, lo, hi, &g->fw, g->vote, span,
                                         &g->dev, g->st);
    KV_CUDA_TRY(cudaMemsetAsync(g->mkey, 0, (size_t)g->R * sizeof(unsigned), g->st));
    int used = 0;
    for (int pass = 0; pass < 3; pass++) {
        int c = 0;
        for (long long a = lo; a < hi; a += g->C, c++) {
            const int n = (int)(hi - a < g->C ? hi - a : g->C);
            KV_TRY(kv_scores_launch(K, g->qw, g->R, scale, (int)a, n, g->S, g->C, NULL, &g->dev, g->st));
            if (pass == 0) racc_row_max<<<g->R, 256, 0, g->st>>>(g->S, g->C, n, (int)a, g->ev, g->T, rpg, g->mkey);
            else if (pass == 1)
                racc_row_z<<<g->R, 256, 0, g->st>>>(g->S, g->C, n, (int)a, g->ev, g->T, rpg, g->mkey, g->zpart, g->nch, c);
            else {
                const long long e = (long long)g->Hkv * n;
                racc_vote_chunk<<<(unsigned)((e + 255) / 256), 256, 0, g->st>>>(g->S, g->C, n, (int)a, lo, span, g->ev,
                                                                                g->T, g->Hkv, rpg, g->mkey, g->z, g->vote);
            }
            KV_LAUNCH_CHECK();
        }
        used = c;
        if (pass == 1) {
            racc_z_final<<<(g->R + 127) / 128, 128, 0, g->st>>>(g->zpart, g->nch, used, g->R, g->z);
            KV_LAUNCH_CHECK();
        }
    }
    return KV_OK;
}

/* Retrieval of the top k of each row (qm in g->qm) over the evicted tokens of [lo, hi): to g->idx [Hkv][k]. */
kv_status racc_retrieve_launch(kv_racc_gpu *g, const kv_dev_kv *K, float scale, int lo, int hi, int k) {
    const int n = hi - lo;
    KV_TRY(kv_scores_launch(K, g->qm, g->Hkv, scale, lo, n, g->S, g->T, NULL, &g->dev, g->st));
    const long long e = (long long)g->Hkv * n;
    racc_mask_resident<<<(unsigned)((e + 255) / 256), 256, 0, g->st>>>(g->S, g->T, n, lo, g->ev, g->T, g->Hkv);
    KV_LAUNCH_CHECK();
    return kv_topk_launch(&g->tk, g->S, g->T, 0, n, g->Hkv, k, lo, NULL, 1, g->idx, NULL, k, NULL, g->st);
}

}  // namespace

static void kv_racc_gpu_destroy(kv_racc_gpu *g) {
    if (!g) return;
    if (g->st) cudaStreamSynchronize(g->st);
    kv_gpu_keys_destroy(g->keys);
    cudaFree(g->ev); cudaFree(g->qw); cudaFree(g->qm); cudaFree(g->S); cudaFree(g->mkey); cudaFree(g->zpart);
    cudaFree(g->z); cudaFree(g->vote); cudaFree(g->idx); cudaFreeHost(g->hidx); cudaFree(g->fw.part_m);
    cudaFree(g->fw.part_z);
    cudaFree(g->fw.rpos); cudaFree(g->fw.ccnt); cudaFree(g->fw.rcnt); cudaFree(g->fw.S); cudaFree(g->fw.mrow);
    cudaFree(g->fw.zp);
    kv_topk_ws_destroy(&g->tk);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

static kv_status racc_create(int Hq, int Hkv, int T, int D, int window, int own_keys, kv_racc_gpu **out) {
    *out = NULL;
    if (Hq < 1 || Hkv < 1 || Hq % Hkv || T < 1 || D < 1 || window < 1)
        return kv_fail(KV_ERR_INPUT, "racc GPU: bad shape Hq=%d Hkv=%d T=%d D=%d window=%d", Hq, Hkv, T, D, window);
    kv_racc_gpu *g = (kv_racc_gpu *)kv_calloc(1, sizeof *g, "racc GPU state");
    if (!g) return KV_ERR_NOMEM;
    g->Hq = Hq; g->Hkv = Hkv; g->T = T; g->D = D; g->W = window; g->G = Hq / Hkv; g->R = Hq * window;
    kv_status st = racc_create_go(g, own_keys);
    if (st != KV_OK) { kv_racc_gpu_destroy(g); return st; }
    *out = g;
    return KV_OK;
}

static kv_status kv_racc_gpu_create(int Hq, int Hkv, int T, int D, int window, kv_racc_gpu **out) {
    return racc_create(Hq, Hkv, T, D, window, 1, out);
}

static kv_status kv_racc_gpu_write_keys(kv_racc_gpu *g, int t0, int n, const float *x) {
    return kv_gpu_keys_write(g->keys, t0, n, x);
}

static kv_status kv_racc_gpu_set_evicted(kv_racc_gpu *g, int n, const uint8_t *ev) {
    for (int h = 0; h < g->Hkv; h++)
        KV_CUDA_TRY(cudaMemcpyAsync(g->ev + (size_t)h * g->T, ev + (size_t)h * g->T, (size_t)n, cudaMemcpyHostToDevice,
                                    g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

static kv_status kv_racc_gpu_vote(kv_racc_gpu *g, const float *qw, float scale, int lo, int hi, float *vote) {
    if (lo < 0 || hi > g->T || hi <= lo) return kv_fail(KV_ERR_INPUT, "racc GPU vote: bad range [%d, %d)", lo, hi);
    KV_CUDA_TRY(cudaMemcpyAsync(g->qw, qw, (size_t)g->R * g->D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    KV_TRY(racc_vote_launch(g, &g->keys->a, scale, lo, hi));
    KV_CUDA_TRY(cudaMemcpyAsync(vote, g->vote, (size_t)g->Hkv * (hi - lo) * sizeof(float), cudaMemcpyDeviceToHost, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    return KV_OK;
}

static kv_status kv_racc_gpu_retrieve_launch(kv_racc_gpu *g, const float *qm, float scale, int lo, int hi, const int *r,
                                             kv_gpu_mark *mark) {
    int k = 0;
    g->rk = 0;
    for (int h = 0; h < g->Hkv; h++) k = r[h] > k ? r[h] : k;
    if (k <= 0 || hi <= lo) return KV_OK;
    if (k > KV_GPU_TOPK_MAX)
        return kv_fail(KV_ERR_INPUT, "racc GPU: %d keys to retrieve exceed the GPU top-k's limit of %d (lower beta, or "
                       "--device cpu)", k, KV_GPU_TOPK_MAX);
    if (k > hi - lo) k = hi - lo;
    KV_CUDA_TRY(cudaMemcpyAsync(g->qm, qm, (size_t)g->Hkv * g->D * sizeof(float), cudaMemcpyHostToDevice, g->st));
    KV_TRY(kv_gpu_mark_start(mark, g->st));
    KV_TRY(racc_retrieve_launch(g, &g->keys->a, scale, lo, hi, k));
    KV_TRY(kv_gpu_mark_end(mark, g->st));
    KV_CUDA_TRY(cudaMemcpyAsync(g->hidx, g->idx, (size_t)g->Hkv * k * sizeof(int32_t), cudaMemcpyDeviceToHost, g->st));
    g->rk = k;
    return KV_OK;
}

static kv_status kv_racc_gpu_retrieve_fetch(kv_racc_gpu *g, int32_t *idx, int ld) {
    if (g->rk <= 0) return KV_OK;
    if (ld < g->rk) return kv_fail(KV_ERR_INTERNAL, "racc GPU: retrieval list stride %d < k %d", ld, g->rk);
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    for (int h = 0; h < g->Hkv; h++)
        memcpy(idx + (size_t)h * ld, g->hidx + (size_t)h * g->rk, (size_t)g->rk * sizeof(int32_t));
    g->rk = 0;
    return KV_OK;
}

/* ---- kvbench bench --method racc ---- */
static kv_status racc_bench_go(kv_racc_gpu *g, const kv_gpu_bench_spec *s, double beta, const kv_gpu_keys *K,
                               const float *q, kv_gpu_stages *out) {
    const int n = s->n, W = g->W, D = s->D;
    /* window queries: the bench's query of each head repeated over the window; alternate positions evicted */
    float *qw = (float *)malloc((size_t)g->R * D * sizeof(float));
    uint8_t *ev = (uint8_t *)malloc((size_t)s->Hkv * g->T);
    if (!qw || !ev) { free(qw); free(ev); return kv_fail(KV_ERR_NOMEM, "racc GPU bench: host scratch"); }
    for (int h = 0; h < s->Hq; h++)
        for (int w = 0; w < W; w++) memcpy(qw + ((size_t)h * W + w) * D, q + (size_t)h * D, D * sizeof(float));
    for (int h = 0; h < s->Hkv; h++)
        for (int i = 0; i < g->T; i++) ev[(size_t)h * g->T + i] = i & 1;
    kv_status st = kv_racc_gpu_set_evicted(g, g->T, ev);
    if (st == KV_OK) {
        cudaError_t e = cudaMemcpy(g->qw, qw, (size_t)g->R * D * sizeof(float), cudaMemcpyHostToDevice);
        for (int h = 0; h < s->Hkv && e == cudaSuccess; h++) /* retrieval query: the group's first head */
            e = cudaMemcpy(g->qm + (size_t)h * D, q + (size_t)h * g->G * D, D * sizeof(float), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) st = kv_cuda_error(e, "cudaMemcpy", __FILE__, __LINE__);
    }
    free(qw); free(ev);
    KV_TRY(st);
    int r = (int)ceil(beta * n);
    r = r < 1 ? 1 : r > n / 2 ? n / 2 : r;
    if (r > KV_GPU_TOPK_MAX) r = KV_GPU_TOPK_MAX;
    kv_bench_timer tm = {};
    st = kv_bench_timer_init(&tm, s->reps, s->warmup, s->stream);
    cudaStream_t own = g->st;
    g->st = tm.st;
    kv_gpu_timing t[2] = {};
    if (st == KV_OK) st = kv_bench_time(&tm, [&]() { return racc_vote_launch(g, &K->a, s->scale, 0, n); }, &t[0]);
    if (st == KV_OK) st = kv_bench_time(&tm, [&]() { return racc_retrieve_launch(g, &K->a, s->scale, 0, n, r); }, &t[1]);
    g->st = own;
    if (st == KV_OK) {
        const double es = K->a.half ? 2 : 4, keys = (double)s->Hkv * n * D * es;
        out->n = 2;
        const double nres = (double)(n - n / 2); /* resident tokens per kv head: odd positions are evicted */
        const double vkeys = keys * nres / n, flags = (double)s->Hkv * n, sbytes = (double)g->R * nres * 4;
        double vbytes;
        if (g->tiled) /* keys once, flags twice + positions written and read, S written once and read twice, votes */
            vbytes = vkeys + 2 * flags + (double)s->Hkv * nres * 8 + 3 * sbytes + flags * 4;
        else if (g->fused) /* keys twice (two sweeps recompute the scores) */
            vbytes = 2 * vkeys + 2 * flags + (double)s->Hkv * nres * 8 + flags * 4;
        else
            vbytes = 3 * keys + flags * 7;
        out->stage[0] = kv_gpu_stage{"vote", t[0], vbytes};
        out->stage[1] = kv_gpu_stage{"retrieve", t[1], keys + (double)s->Hkv * n * (1 + 4 + 4) + (double)s->Hkv * r * 4};
        const char *how = g->tiled ? "tiled: one score sweep (FP32 FMUL+FADD, bitwise kv_dot_ref), the scores kept (4 "
                                     "bytes x rows x resident keys, written once, read twice: row sums, votes)"
                          : g->fused ? "fused: two sweeps recompute the scores (the resident keys read twice)"
                                     : "three sweeps over chunks through the shared score kernel";
        snprintf(out->bytes_note, sizeof out->bytes_note,
                 "racc window=%d beta=%g (r=%d of n=%d; half the keys evicted): vote (%s; %d window-query rows, "
                 "%.3g G multiply-adds per score sweep) once every L_n tokens; retrieve = keys + flags + scores out and "
                 "back + r ids (lag 1: off the critical path in the paper)",
                 W, beta, r, n, how, g->R, (double)g->R * nres * D / 1e9);
        out->l2_bytes = tm.dev.l2_bytes;
        out->flush_bytes = tm.flush_n * sizeof(uint4);
    }
    kv_bench_timer_free(&tm);
    return st;
}

static kv_status kv_racc_gpu_bench(const kv_gpu_bench_spec *s, int window, double beta, const kv_gpu_keys *K,
                                   const float *q, kv_gpu_stages *out) {
    memset(out, 0, sizeof *out);
    if (s->n < 2 || s->n > K->a.T || K->a.H != s->Hkv || K->a.D != s->D)
        return kv_fail(KV_ERR_INPUT, "racc GPU bench: inconsistent spec (n=%d)", s->n);
    kv_racc_gpu *g = NULL;
    kv_status st = racc_create(s->Hq, s->Hkv, s->n, s->D, window, 0, &g);
    if (st == KV_OK) st = racc_bench_go(g, s, beta, K, q, out);
    kv_racc_gpu_destroy(g);
    return st;
}

extern "C" const kv_racc_cuda_ops kv_racc_cuda = {
    .create = kv_racc_gpu_create,
    .write_keys = kv_racc_gpu_write_keys,
    .set_evicted = kv_racc_gpu_set_evicted,
    .vote = kv_racc_gpu_vote,
    .retrieve_launch = kv_racc_gpu_retrieve_launch,
    .retrieve_fetch = kv_racc_gpu_retrieve_fetch,
    .destroy = kv_racc_gpu_destroy,
    .bench = kv_racc_gpu_bench,
};
