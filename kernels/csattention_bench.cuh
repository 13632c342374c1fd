/* csattention_bench.cuh: `kvbench bench --method csattention` (the hook of
 * kernels/csattention.h), included at the end of csattention.cu inside its
 * anonymous namespace. Stages: the list build; the dense global accumulator
 * (reduce_dense, topk_dense, search_dense); the radix-sort variant
 * (search_sort); the tiles (reduce_tiled) and the tiled search whole
 * (search_tiled: the pipelined tiles, or the staged ones under
 * KVBENCH_CS_REDUCE=staged); then `search`, the default search whole: the
 * bit view (csattention_bits.cuh; the tiles under KVBENCH_CS_REDUCE=tiled or
 * staged). After the timing the bit view's top k and union counts are
 * checked against the dense path's at the same length (a difference fails
 * the bench). The bytes each stage must move are printed under the table
 * (bytes_note): the bit view reads per row m lists x (L x 4 B + 1 bit a key
 * + 4 B a 1024-key chunk); the other rows' floor is the m gathered lists, L
 * entries of 8 B, per row. */

/* The checks below: the dense path's top kk and union counts (ref [R][kk], rnu [R]) and room for a
 * variant's (got, gnu), in one allocation at ref (the caller frees it, also on failure). */
struct cs_cmp {
    int32_t *ref, *got;
    int *rnu, *gnu;
};
/* The search just launched on g->st against the reference: its top k (no = R kk ranks) and union counts
 * into got, gnu; *bad = the first rank (row kk + rank) that differs, *badnu the first row whose union count
 * differs, -1 where none does. */
kv_status cs_cmp_run(kv_cs_gpu *g, cs_cmp *c, size_t no, int R, long *bad, int *badnu) {
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    KV_CUDA_TRY(cudaMemcpy(c->got, g->oidx, no * sizeof(int32_t), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy(c->gnu, g->nu, R * sizeof(int), cudaMemcpyDeviceToHost));
    *bad = -1;
    *badnu = -1;
    for (size_t i = 0; i < no && *bad < 0; i++)
        if (c->got[i] != c->ref[i]) *bad = (long)i;
    for (int r = 0; r < R && *badnu < 0; r++)
        if (c->gnu[r] != c->rnu[r]) *badnu = r;
    return KV_OK;
}
kv_status cs_bench_ref(kv_cs_gpu *g, const kv_cs_bench_params *bp, int n, int R, int kk, cs_cmp *c) {
    const size_t no = (size_t)R * kk;
    if (!(c->ref = (int32_t *)malloc(2 * no * sizeof(int32_t) + 2 * (size_t)R * sizeof(int))))
        return kv_fail(KV_ERR_NOMEM, "csattention bench reference");
    c->got = c->ref + no;
    c->rnu = (int *)(c->got + no);
    c->gnu = c->rnu + R;
    KV_TRY(cs_reduce_launch(g, bp->pool, bp->missing, bp->weight, n));
    KV_TRY(kv_topk_launch(&g->tk, g->S, n, 0, n, R, kk, 0, NULL, 1, g->oidx, NULL, kk, NULL, g->st));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    KV_CUDA_TRY(cudaMemcpy(c->ref, g->oidx, no * sizeof(int32_t), cudaMemcpyDeviceToHost));
    KV_CUDA_TRY(cudaMemcpy(c->rnu, g->nu, R * sizeof(int), cudaMemcpyDeviceToHost));
    return KV_OK;
}

/* The bit-view search's top k and union counts against the dense path's at the bench's length, printed to
 * stderr; a difference fails the bench. */
kv_status cs_bench_check(kv_cs_gpu *g, const kv_cs_bench_params *bp, int n, int k, int R, int kk) {
    const size_t no = (size_t)R * kk;
    cs_cmp cmp = {};
    kv_status st = cs_bench_ref(g, bp, n, R, kk, &cmp);
    long bad = -1;
    int badnu = -1;
    if (st == KV_OK) st = cs_bits_launch(g, bp->pool, bp->missing, bp->weight, n, k, 0);
    if (st == KV_OK) st = cs_cmp_run(g, &cmp, no, R, &bad, &badnu);
    if (st == KV_OK)
        fprintf(stderr, "csattention check n=%d: search (bit view) top %d %s, union counts %s\n", n, kk,
                bad < 0 ? "= dense" : "DIFFER from dense", badnu < 0 ? "= dense" : "DIFFER from dense");
    if (st == KV_OK && (bad >= 0 || badnu >= 0))
        st = kv_fail(KV_ERR_INTERNAL, "csattention GPU: the bit-view search differs from the dense path at n=%d "
                     "(row %ld rank %ld: %d vs %d; union row %d)", n, bad < 0 ? -1 : bad / kk, bad < 0 ? -1 : bad % kk,
                     bad < 0 ? 0 : cmp.got[bad], bad < 0 ? 0 : cmp.ref[bad], badnu);
    free(cmp.ref);
    return st;
}

/* KVBENCH_CS_SWEEP=1 (a development aid): after the bench's rows, time the tiled search whole in each
 * variant (staged; pipelined at 2048/4096/8192 keys x 256/512 threads, ring geometries, row bound on/off,
 * ranges searched per tile or precomputed by cs_bounds) and check each
 * one's top k and union counts against the dense path's, printed to stderr. */
kv_status cs_bench_sweep(kv_mbench<kv_cs_gpu> &x, kv_cs_gpu *g, const kv_cs_bench_params *bp, int n, int k, int R,
                         int kk) {
    const size_t no = (size_t)R * kk;
    cs_cmp cmp = {}; /* the reference: the dense path once more (the bench's reduce_dense + topk_dense) */
    kv_status st = cs_bench_ref(g, bp, n, R, kk, &cmp);
    int32_t *ref = cmp.ref, *got = cmp.got;
    const int tk0 = g->tkeys, th0 = g->tth, thr0 = g->use_thr, bnd0 = g->use_bnd, ring0 = g->ring;
    /* variant (3 staged, 0 pipelined), keys, threads, ring, row bound, precomputed ranges */
    static const int cf[][6] = {{3, 4096, 512, 0, 0, 0}, {0, 4096, 512, 0, 1, 0}, {0, 4096, 512, 0, 0, 0},
                                {0, 4096, 512, 0, 1, 1}, {0, 4096, 256, 0, 1, 0}, {0, 4096, 512, 1, 1, 0},
                                {0, 4096, 512, 2, 1, 0}, {0, 4096, 512, 1, 1, 1}, {0, 2048, 512, 0, 1, 0},
                                {0, 2048, 512, 0, 1, 1}, {0, 2048, 256, 0, 1, 1}, {0, 8192, 512, 0, 1, 0},
                                {0, 8192, 512, 1, 1, 1}, {0, 8192, 512, 0, 0, 0}};
    for (int c = 0; c < (int)(sizeof cf / sizeof cf[0]) && st == KV_OK; c++) {
        g->tkeys = cf[c][1];
        g->tth = cf[c][2];
        g->ring = cf[c][3];
        g->use_thr = cf[c][4];
        g->use_bnd = cf[c][5];
        const int v = cf[c][0], nt = (n + (v == 3 ? CS_TK : g->tkeys) - 1) / (v == 3 ? CS_TK : g->tkeys);
        kv_gpu_timing a, b, w;
        int ntl;
        st = x.time([&]() { return cs_tiles_launch(g, v, bp->pool, bp->missing, bp->weight, n, k, 0, &ntl); }, &a);
        if (st == KV_OK) st = x.time([&]() { return cs_cand_launch(g, v, R, nt, k, kk); }, &b);
        if (st == KV_OK) st = x.time([&]() { return cs_tile_launch(g, v, bp->pool, bp->missing, bp->weight, n, k, 0); }, &w);
        long bad;
        int badnu;
        if (st == KV_OK) st = cs_cmp_run(g, &cmp, no, R, &bad, &badnu);
        if (st != KV_OK) break;
        fprintf(stderr, "cs sweep n=%d %s tk=%d th=%d ring=%dx%d bound=%d ranges=%d: tiles %.1f us, merge %.1f us, "
                        "search %.1f us (p90 %.1f); top-k %s, union %s\n", n, v == 3 ? "staged" : "pipelined",
                v == 3 ? CS_TK : g->tkeys, v == 3 ? CS_TTH : g->tth, CS_RINGS[g->ring][0], CS_RINGS[g->ring][1],
                v == 3 ? 0 : g->use_thr, v == 3 ? 0 : g->use_bnd, a.med_us, b.med_us, w.med_us, w.p90_us,
                bad < 0 ? "= dense" : "DIFFERS from dense", badnu < 0 ? "= dense" : "DIFFERS from dense");
        if (bad >= 0) fprintf(stderr, "  first difference: row %ld rank %ld: %d vs dense %d\n", bad / kk, bad % kk,
                              got[bad], ref[bad]);
    }
    g->tkeys = tk0;
    g->tth = th0;
    g->use_thr = thr0;
    g->use_bnd = bnd0;
    g->ring = ring0;
    free(ref);
    return st;
}

/* ---- kvbench bench --method csattention ---- */
kv_status cs_bench_go(kv_mbench<kv_cs_gpu> &x, const kv_gpu_bench_spec *s, const kv_cs_bench_params *bp,
                      const kv_gpu_keys *K, const float *q, kv_gpu_stages *out) {
    const int n = s->n;
    int L = (int)ceil(bp->alpha * n - 1e-9);
    L = L < 1 ? 1 : L > n ? n : L;
    kv_cs_gpu_config cfg = {s->Hq, s->Hkv, n, s->D, bp->m, bp->C, L, 0, s->k};
    KV_TRY(cs_alloc(&cfg, 1, &x.g));
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
    kv_gpu_timing t[8];
    KV_TRY(x.begin(s->reps < 3 ? s->reps : 3, 0, s->stream)); /* the build is long: 3 runs */
    KV_TRY(x.time([&]() { return cs_build_lists(g, &K->a, n); }, &t[0]));
    KV_TRY(x.begin(s->reps, s->warmup, s->stream));
    KV_CUDA_TRY(cudaMemcpy(g->q, q, (size_t)s->Hq * s->D * sizeof(float), cudaMemcpyHostToDevice));
    const int R = bp->pool ? s->Hkv : s->Hq, kk = s->k < n ? s->k : n, nt = (n + g->tkeys - 1) / g->tkeys;
    if (s->k > g->kcap || bp->m > CS_MMAX)
        return kv_fail(KV_ERR_INPUT, "csattention GPU bench: k=%d or m=%d above the tiled searches'", s->k, bp->m);
    /* the bit view (default): sample, chunks, candidates' top-k; the pipelined tiles: nearest + tiles, then the
     * candidates' top-k; the dense global accumulator: reduce_dense, then the top-k over the dense rows */
    const int var = g->reduce == 3 ? 3 : 0; /* the tiles timed: pipelined, or staged when KVBENCH_CS_REDUCE=staged */
    const int ntv = var == 3 ? (n + CS_TK - 1) / CS_TK : nt;
    int ntl = ntv;
    auto tiles = [&]() { return cs_tiles_launch(g, var, bp->pool, bp->missing, bp->weight, n, s->k, 0, &ntl); };
    auto reduce = [&]() { return cs_reduce_launch(g, bp->pool, bp->missing, bp->weight, n); };
    auto topk = [&]() {
        return kv_topk_launch(&g->tk, g->S, n, 0, n, R, kk, 0, NULL, 1, g->oidx, NULL, kk, NULL, g->st);
    };
    KV_TRY(x.time(reduce, &t[1]));
    KV_TRY(x.time(topk, &t[2]));
    KV_TRY(x.time([&]() -> kv_status { KV_TRY(reduce()); return topk(); }, &t[3]));
    KV_TRY(x.time(tiles, &t[4]));
    KV_TRY(x.time([&]() { return cs_tile_launch(g, var, bp->pool, bp->missing, bp->weight, n, s->k, 0); }, &t[5]));
    KV_TRY(x.time([&]() -> kv_status { KV_TRY(cs_sort_launch(g, bp->pool, bp->missing, bp->weight, n)); return topk(); },
                  &t[7]));
    const bool bits = g->reduce == 4; /* `search`: the default path */
    KV_TRY(x.time([&]() {
        return bits ? cs_bits_launch(g, bp->pool, bp->missing, bp->weight, n, s->k, 0)
                    : cs_tile_launch(g, var, bp->pool, bp->missing, bp->weight, n, s->k, 0);
    }, &t[6]));
    KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    int nu[64];
    KV_CUDA_TRY(cudaMemcpy(nu, g->nu, (size_t)(R < 64 ? R : 64) * sizeof(int), cudaMemcpyDeviceToHost));
    double su = 0;
    for (int r = 0; r < R && r < 64; r++) su += nu[r];
    if (bits) KV_TRY(cs_bench_check(g, bp, n, s->k, R, kk));
    if (getenv("KVBENCH_CS_SWEEP")) { /* after the rows are timed: a failure here costs only the sweep */
        const kv_status ss = cs_bench_sweep(x, g, bp, n, s->k, R, kk);
        if (ss != KV_OK) fprintf(stderr, "cs sweep n=%d stopped: %s\n", n, kv_last_error());
        (void)cudaGetLastError();
        KV_CUDA_TRY(cudaStreamSynchronize(g->st));
    }
    const double es = K->a.half ? 2 : 4, lists = (double)R * bp->m * L * 8, dense = (double)R * n * 4,
                 cand = (double)R * ntv * s->k * 8, out_b = (double)R * kk * 4,
                 bview = (double)R * bp->m * ((double)L * 4 + ((n - 1) / 1024 + 1) * (128.0 + 4)),
                 build = (double)s->Hkv * bp->m *
                         ((double)((bp->C + CS_CHUNK - 1) / CS_CHUNK) * n * g->ds * es + (double)bp->C * n * 4 * 3 +
                          (double)bp->C * L * 8);
    out->n = 8;
    out->stage[0] = kv_gpu_stage{"build_lists", t[0], build};
    out->stage[1] = kv_gpu_stage{"reduce_dense", t[1], lists + 3 * dense};
    out->stage[2] = kv_gpu_stage{"topk_dense", t[2], dense + out_b};
    out->stage[3] = kv_gpu_stage{"search_dense", t[3], lists + out_b};
    out->stage[4] = kv_gpu_stage{"reduce_tiled", t[4], lists + cand};
    out->stage[5] = kv_gpu_stage{"search_tiled", t[5], lists + out_b};
    out->stage[6] = kv_gpu_stage{"search_sort", t[7], lists + out_b};
    out->stage[7] = kv_gpu_stage{"search", t[6], (bits ? bview : lists) + out_b};
    snprintf(out->bytes_note, sizeof out->bytes_note,
             "csattention m=%d C=%d L=%d pool=%s missing=%s; union %.0f/row; search (%s) reads m lists x (L x 4 B + "
             "1 bit a key + 4 B a 1024-key chunk) a row = %.2f B/key; the other rows' floor: m lists x L x 8 B (index + "
             "score) = %.1f B/key; reduce_dense: + 12 B/key; reduce_tiled: %s tiles of %d keys x %d threads, bound %s; "
             "search_tiled: + their top k; centroids = key sub-vectors",
             bp->m, bp->C, L, bp->pool ? "mean" : "none", bp->missing ? "min" : "zero", su / R,
             bits ? "bit view" : "tiles", bview / R / n, (double)bp->m * L * 8 / n, var == 3 ? "staged" : "pipelined",
             var == 3 ? CS_TK : g->tkeys, var == 3 ? CS_TTH : g->tth, var == 0 && g->use_thr ? "on" : "off");
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
