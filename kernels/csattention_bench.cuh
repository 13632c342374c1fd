/* csattention_bench.cuh: `kvbench bench --method csattention` (the hook of
 * kernels/csattention.h), included at the end of csattention.cu inside its
 * anonymous namespace. Stages: the list build; the dense global accumulator
 * (search_dense), the radix-sort variant (search_sort) and the staged tiles
 * (search_staged), each whole; the pipelined tiles (reduce_tiled) and their
 * candidates' top k (topk_tiled); then `search`, the default (pipelined
 * tiles) search whole. The bytes
 * each stage must move are printed under the table (bytes_note): the floor
 * of a search is the m gathered lists, L entries of 8 B, per row. */

/* ---- kvbench bench --method csattention ---- */
kv_status cs_bench_go(kv_mbench<kv_cs_gpu> &x, const kv_gpu_bench_spec *s, const kv_cs_bench_params *bp,
                      const kv_gpu_keys *K, const float *q, kv_gpu_stages *out) {
    const int n = s->n;
    int L = (int)ceil(bp->alpha * n - 1e-9);
    L = L < 1 ? 1 : L > n ? n : L;
    kv_cs_gpu_config cfg = {s->Hq, s->Hkv, n, s->D, bp->m, bp->C, L, 0, s->k};
    KV_TRY(cs_alloc(&cfg, &x.g));
    kv_cs_gpu *g = x.g;
    const int tot = s->Hkv * bp->m * bp->C;
    if (K->a.half)
        cs_cent_from_keys<__half><<<(tot + 127) / 128, 128, 0, g->st>>>((const __half *)K->a.p, K->a.T, s->D, bp->m,
                                                                       bp->C, g->ds, s->Hkv, n, g->cent);
    else
        cs_cent_from_keys<float><<<(tot + 127) / 128, 128, 0, g->st>>>((const float *)K->a.p, K->a.T, s->D, bp->m,
                                                                      bp->C, g->ds, s->Hkv, n, g->cent);
    KV_LAUNCH_CHECK();
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    kv_gpu_timing t[9];
    KV_TRY(x.begin(s->reps < 3 ? s->reps : 3, 0)); /* the build is long: 3 runs */
    KV_TRY(x.time([&]() { return cs_build_lists(g, &K->a, n); }, &t[0]));
    KV_TRY(x.begin(s->reps, s->warmup));
    KV_CUDA_TRY(cudaMemcpy(g->q, q, (size_t)s->Hq * s->D * sizeof(float), cudaMemcpyHostToDevice));
    const int R = bp->pool ? s->Hkv : s->Hq, kk = s->k < n ? s->k : n, nt = (n + g->tkeys - 1) / g->tkeys;
    if (!cs_tiled(g, s->k)) return kv_fail(KV_ERR_INPUT, "csattention GPU bench: k=%d above the tiled search's", s->k);
    /* the pipelined tiles (default): nearest + tiles, then the candidates' top-k; the dense global
     * accumulator (KVBENCH_CS_REDUCE=dense): reduce_dense, then the top-k over the dense rows */
    int ntl = nt;
    auto tiles = [&]() { return cs_tiles_launch(g, 0, bp->pool, bp->missing, bp->weight, n, s->k, 0, &ntl); };
    auto cand_topk = [&]() { return cs_cand_launch(g, 0, R, nt, s->k, kk); };
    auto reduce = [&]() { return cs_reduce_launch(g, bp->pool, bp->missing, bp->weight, n); };
    auto topk = [&]() {
        return kv_topk_launch(&g->tk, g->S, n, 0, n, R, kk, 0, NULL, 1, g->oidx, NULL, kk, NULL, g->st);
    };
    KV_TRY(x.time([&]() -> kv_status { KV_TRY(reduce()); return topk(); }, &t[3]));
    KV_TRY(x.time(tiles, &t[4]));
    KV_TRY(x.time(cand_topk, &t[5]));
    KV_TRY(x.time([&]() -> kv_status { KV_TRY(cs_sort_launch(g, bp->pool, bp->missing, bp->weight, n)); return topk(); },
                  &t[7]));
    KV_TRY(x.time([&]() { return cs_tile_launch(g, 3, bp->pool, bp->missing, bp->weight, n, s->k, 0); }, &t[8]));
    KV_TRY(x.time([&]() { return cs_tile_launch(g, 0, bp->pool, bp->missing, bp->weight, n, s->k, 0); }, &t[6]));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    int nu[64];
    KV_CUDA_TRY(cudaMemcpy(nu, g->nu, (size_t)(R < 64 ? R : 64) * sizeof(int), cudaMemcpyDeviceToHost));
    double su = 0;
    for (int r = 0; r < R && r < 64; r++) su += nu[r];
    const double es = K->a.half ? 2 : 4, lists = (double)R * bp->m * L * 8, dense = (double)R * n * 4,
                 cand = (double)R * nt * s->k * 8, out_b = (double)R * kk * 4,
                 build = (double)s->Hkv * bp->m *
                         ((double)((bp->C + CS_CHUNK - 1) / CS_CHUNK) * n * g->ds * es + (double)bp->C * n * 4 * 3 +
                          (double)bp->C * L * 8);
    out->n = 7;
    out->stage[0] = kv_gpu_stage{"build_lists", t[0], build};
    out->stage[1] = kv_gpu_stage{"search_dense", t[3], lists + out_b};
    out->stage[2] = kv_gpu_stage{"search_sort", t[7], lists + out_b};
    out->stage[3] = kv_gpu_stage{"search_staged", t[8], lists + out_b};
    out->stage[4] = kv_gpu_stage{"reduce_tiled", t[4], lists + cand};
    out->stage[5] = kv_gpu_stage{"topk_tiled", t[5], cand + out_b};
    out->stage[6] = kv_gpu_stage{"search", t[6], lists + out_b};
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "csattention m=%d C=%d L=%d pool=%s missing=%s; centroids = key sub-vectors at even positions; "
             "union %.0f/row; floor = m lists x L x 8 B (int32 + f32) per row = %.1f B per region key; "
             "search_dense: + 3 x 4 B/key global accumulator; search_sort: radix sort + run sums; search_staged: "
             "staged tiles of %d keys; reduce_tiled: pipelined tiles of %d keys x %d threads, row bound %s, k x 8 B "
             "candidates a tile; topk_tiled: their top k; search = pipelined (default), candidates counted",
             bp->m, bp->C, L, bp->pool ? "mean" : "none", bp->missing ? "min" : "zero", su / R,
             (double)bp->m * L * 8 / n, CS_TK, g->tkeys, g->tth, g->use_thr ? "on" : "off");
    return KV_OK;
}

kv_status cs_bench(const kv_gpu_bench_spec *s, const kv_cs_bench_params *bp, const kv_gpu_keys *K, const float *q,
                   kv_gpu_stages *out) {
    if (s->n < 1 || s->n > K->a.T || K->a.H != s->Hkv || K->a.D != s->D || s->D % bp->m) {
        memset(out, 0, sizeof *out);
        return kv_fail(KV_ERR_INPUT, "csattention GPU bench: inconsistent spec (n=%d, m=%d)", s->n, bp->m);
    }
    return kv_mbench_run<kv_cs_gpu>(out, cs_destroy,
                                    [&](kv_mbench<kv_cs_gpu> &x) { return cs_bench_go(x, s, bp, K, q, out); });
}
