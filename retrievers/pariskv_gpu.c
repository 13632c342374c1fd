/* pariskv_gpu.c: the host-side glue of ParisKV's CUDA path
 * (kernels/pariskv.cu; issue 4, points 5 and 6): which parameter settings
 * run on the GPU, the device index's configuration, Stage I's candidate
 * count (shared with the CPU path so both keep the same C), and the
 * `kvbench bench --method pariskv` hook. The GPU path covers the paper's
 * method as configured by default (normalise + SRHT, analytic sign
 * centroids, RSQ-IP rerank) with any m, pool, tiers, lloyd, beta, rho and
 * update; the ablations centroids=kmeans, rotation=none, normalize=0 and
 * rerank=exact|none stay on the CPU path even under --device gpu (they are
 * study switches, not the method, and the CPU path is exact for them). */
#include <math.h>

#include "pariskv.h"

int kv_pariskv_gpu_ok(const kv_param_set *ps, int head_dim) {
    int dp = 1;
    while (dp < head_dim) dp *= 2;
    return kv_param_int(ps, "centroids") == 0 && kv_param_int(ps, "rotation") == 0 &&
           kv_param_int(ps, "normalize") == 1 && kv_param_int(ps, "rerank") == 0 && dp >= 32 && dp <= 256;
}

kv_pariskv_gpu_cfg kv_pariskv_gpu_config(const kv_pariskv_codec *cx, const kv_shape *sh, int pool_mean, int update) {
    return (kv_pariskv_gpu_cfg){.Hq = sh->num_q_heads, .Hkv = sh->num_kv_heads, .T = sh->max_tokens,
                                .D = sh->head_dim, .dp = cx->dp, .m = cx->m, .nb = cx->nb,
                                .rows = pool_mean ? sh->num_kv_heads : sh->num_q_heads, .max_update = update,
                                .signs = cx->signs, .level = cx->level, .thr = cx->thr};
}

int kv_pariskv_candidates(int n, double beta, int k) {
    int C = (int)ceil((double)n * beta), kn = k < n ? k : n;
    if (C < kn) C = kn;
    return C > n ? n : C;
}

kv_status kv_pariskv_bench_gpu(const kv_shape *shape, const kv_param_set *params, const kv_gpu_bench_spec *spec,
                               const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q,
                              kv_gpu_stages *out) {
    if (!kv_pariskv_gpu_ok(params, shape->head_dim))
        return kv_fail(KV_ERR_INPUT, "pariskv: the GPU bench runs the GPU path only (centroids=analytic, "
                                     "rotation=srht, normalize=1, rerank=rsqip, 32 <= D' <= 256); --device cpu times the rest");
    kv_pariskv_codec cx;
    KV_TRY(kv_pariskv_codec_init(&cx, shape->head_dim, kv_param_int(params, "m"), 1, 1, kv_param_int(params, "lloyd"),
                                 shape->seed + (uint64_t)kv_param_int(params, "seed")));
    double beta, rho;
    kv_pariskv_adaptive_ratios(spec->n, &beta, &rho);
    if (kv_param_is_set(params, "beta") && kv_param(params, "beta") > 0) beta = kv_param(params, "beta");
    if (kv_param_is_set(params, "rho") && kv_param(params, "rho") > 0) rho = kv_param(params, "rho");
    kv_pariskv_gpu_cfg cfg = kv_pariskv_gpu_config(&cx, shape, kv_param_int(params, "pool") == 0,
                                                   kv_param_int(params, "update"));
    cfg.T = spec->n;
    kv_status st = kv_pariskv_gpu_bench(&cfg, spec, K, q, beta, rho, kv_param_int(params, "tiers") == 0, out);
    kv_pariskv_codec_free(&cx);
    return st;
}
