/* csattention_search.cuh: the host launchers of CSAttention's three
 * reduce-by-key variants (dense global accumulator, radix sort, tiled
 * shared-memory accumulator: the design of each is in csattention.cu's
 * header and in csattention_sort.cuh / csattention_tile.cuh), included by
 * csattention.cu inside its anonymous namespace after kv_cs_gpu. Each
 * launches on g->st with the query already on the device and never waits
 * on the host. */

/* The rows' nearest lists and weights (jl, wb) on g->st; nu0 and thr0 (nullable) zeroed on the way. */
kv_status cs_nearest_launch(kv_cs_gpu *g, int pool, int weight, int R, int *nu0, unsigned *thr0) {
    const kv_cs_gpu_config &c = g->c;
    cs_nearest<<<R * c.m, CS_NEAR_TH, 0, g->st>>>(g->q, pool, weight, g->G, R, c.D, c.m, c.C, g->ds, g->cent, g->jl,
                                                  g->wb, nu0, thr0);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* The dense paths' first launches: the nearest lists and weights, the dense rows of [sink, hi) = -inf. */
kv_status cs_nearest_fill(kv_cs_gpu *g, int pool, int weight, int hi) {
    const kv_cs_gpu_config &c = g->c;
    const int R = pool ? c.Hkv : c.Hq, lo = c.sink;
    KV_TRY(cs_nearest_launch(g, pool, weight, R, NULL, NULL));
    const long long fill = (long long)(hi - lo) * R;
    cs_fill<<<(int)((fill + 255) / 256 < 4096 ? (fill + 255) / 256 : 4096), 256, 0, g->st>>>(g->S, c.T, lo, hi, R,
                                                                                            -INFINITY);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* The dense paths' candidates: the finite entries of each row, u and nu. */
kv_status cs_compact_launch(kv_cs_gpu *g, int R, int hi) {
    const int lo = g->c.sink, n = hi - lo, bc = (n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024;
    KV_CUDA_TRY(cudaMemsetAsync(g->nu, 0, R * sizeof(int), g->st));
    cs_compact<<<dim3(bc, R), 256, 0, g->st>>>(g->S, g->c.T, lo, hi, g->u, g->nu);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* Stages of one search on g->st (q on the device): nearest + gather/reduce + compaction, then top-k. */
kv_status cs_reduce_launch(kv_cs_gpu *g, int pool, int missing, int weight, int hi) {
    const kv_cs_gpu_config &c = g->c;
    const int R = pool ? c.Hkv : c.Hq, lo = c.sink, m = c.m;
    KV_TRY(cs_nearest_fill(g, pool, weight, hi));
    const int bl = (c.L + 255) / 256 < 1024 ? (c.L + 255) / 256 : 1024;
    if (missing == 0) {
        for (int b = 0; b < m; b++) {
            cs_accum_zero<<<dim3(bl, R), 256, 0, g->st>>>(g->S, c.T, g->jl, g->wb, m, b, c.L, g->lidx, g->lval, g->lcnt,
                                                          lo, hi);
            KV_LAUNCH_CHECK();
        }
    } else {
        for (int b = 0; b < m; b++) {
            cs_mark<<<dim3(bl, R), 256, 0, g->st>>>(g->S, c.T, g->jl, m, b, c.L, g->lidx, g->lval, g->lcnt, lo, hi,
                                                    g->stamp, g->tmp, -1);
            KV_LAUNCH_CHECK();
        }
    }
    KV_TRY(cs_compact_launch(g, R, hi));
    if (missing == 1) {
        const int bu = (m * c.L + 255) / 256 < 1024 ? (m * c.L + 255) / 256 : 1024;
        for (int b = 0; b < m; b++) {
            const int e = ++g->epoch;
            cs_mark<<<dim3(bl, R), 256, 0, g->st>>>(g->S, c.T, g->jl, m, b, c.L, g->lidx, g->lval, g->lcnt, lo, hi,
                                                    g->stamp, g->tmp, e);
            KV_LAUNCH_CHECK();
            cs_accum_min<<<dim3(bu, R), 256, 0, g->st>>>(g->S, c.T, g->u, g->nu, g->jl, g->wb, m, b, c.L, g->lval,
                                                         g->lcnt, g->stamp, g->tmp, e);
            KV_LAUNCH_CHECK();
        }
    }
    return KV_OK;
}

/* The sort path (csattention_sort.cuh) on g->st, q on the device: the dense rows, nu and u as
 * cs_reduce_launch leaves them. The pairs and CUB's storage are allocated at the first call. */
kv_status cs_sort_launch(kv_cs_gpu *g, int pool, int missing, int weight, int hi) {
    const kv_cs_gpu_config &c = g->c;
    const int R = pool ? c.Hkv : c.Hq, lo = c.sink, m = c.m, n = hi - lo;
    const long long N = (long long)R * m * c.L, NM = (long long)c.Hq * m * c.L;
    if ((long long)c.Hq * c.T >= 0x7fffffffLL || NM >= 0x7fffffffLL)
        return kv_fail(KV_ERR_INPUT, "csattention GPU sort: %lld pairs, above the sort's int range", NM);
    if (n <= 0) return KV_OK;
    const unsigned sent = (unsigned)R * (unsigned)c.T;
    int bits = 1;
    while (bits < 32 && (sent >> bits)) bits++;
    size_t need = 0;
    KV_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, need, (const unsigned *)NULL, (unsigned *)NULL, (const int *)NULL,
                                                (int *)NULL, (int)N, 0, bits, g->st));
    if (!g->skey) {
        size_t most = 0;
        KV_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, most, (const unsigned *)NULL, (unsigned *)NULL,
                                                    (const int *)NULL, (int *)NULL, (int)NM, 0, 32, g->st));
        KV_CUDA_ALLOC(g->skey, 2 * NM * sizeof(unsigned), 0, "csattention sort keys");
        KV_CUDA_ALLOC(g->spay, 2 * NM * sizeof(int), 0, "csattention sort payloads");
        g->stmp_bytes = most > need ? most : need;
        KV_CUDA_ALLOC(g->stmp, g->stmp_bytes, 0, "csattention sort storage");
    }
    if (need > g->stmp_bytes) return kv_fail(KV_ERR_INTERNAL, "csattention GPU sort: storage %zu < %zu", g->stmp_bytes, need);
    KV_TRY(cs_nearest_fill(g, pool, weight, hi));
    const int bl = (m * c.L + 255) / 256 < 1024 ? (m * c.L + 255) / 256 : 1024;
    cs_sort_pairs<<<dim3(bl, R), 256, 0, g->st>>>(g->jl, m, c.L, g->lidx, g->lcnt, lo, hi, c.T, R, g->skey, g->spay);
    KV_LAUNCH_CHECK();
    unsigned *kout = g->skey + NM;
    int *pout = g->spay + NM;
    size_t tb = g->stmp_bytes;
    KV_CUDA_TRY(cub::DeviceRadixSort::SortPairs(g->stmp, tb, g->skey, kout, g->spay, pout, (int)N, 0, bits, g->st));
    const int br = (int)((N + 255) / 256 < 4096 ? (N + 255) / 256 : 4096);
    cs_sort_reduce<<<br, 256, 0, g->st>>>(kout, pout, N, c.T, R, g->jl, g->wb, m, c.L, g->lval, g->lcnt, missing, g->S,
                                          c.T);
    KV_LAUNCH_CHECK();
    KV_TRY(cs_compact_launch(g, R, hi));
    return KV_OK;
}

/* The tiles on g->st, q on the device: the nearest lists (nu zeroed), then per tile its accumulation, count
 * (and listing, when want_u) and top min(k, tile) into the candidate rows; variant 3 the staged kernel
 * (csattention_tile.cuh), otherwise the pipelined one (csattention_pipe.cuh). *nt gets the tiles per row. */
kv_status cs_tiles_launch(kv_cs_gpu *g, int variant, int pool, int missing, int weight, int hi, int k, int want_u,
                          int *nt) {
    const kv_cs_gpu_config &c = g->c;
    const int R = pool ? c.Hkv : c.Hq, lo = c.sink, m = c.m, n = hi - lo, tk = variant == 3 ? CS_TK : g->tkeys;
    *nt = (n + tk - 1) / tk;
    if (n <= 0) return KV_OK;
    unsigned *thr = variant != 3 && g->use_thr ? g->thr : NULL;
    const int *bnd = variant != 3 && g->use_bnd ? g->bnd : NULL;
    KV_TRY(cs_nearest_launch(g, pool, weight, R, g->nu, thr));
    if (bnd) {
        const long long warps = (long long)R * m * (*nt + 1);
        cs_bounds<<<(int)((warps + 3) / 4), 128, 0, g->st>>>(g->vidx, g->vcnt, g->VL, g->jl, R, m, lo, hi, tk, *nt + 1,
                                                              g->bnd);
        KV_LAUNCH_CHECK();
    }
    const cs_tile_args a = {g->vidx, g->vval, g->lval, g->wb, g->vcnt, g->lcnt, g->jl, g->VL, c.L, m, lo, hi, missing,
                            k, g->cv, g->ci, g->cld, g->nu, want_u ? g->u : NULL, c.T, tk, thr, bnd, *nt + 1,
                            g->nslot < *nt ? g->nslot : *nt}; /* no more slots than tiles */
    if (variant == 3) {
        cs_tile<<<dim3(*nt, R), CS_TTH, cs_tile_smem(missing), g->st>>>(a);
        KV_LAUNCH_CHECK();
        return KV_OK;
    }
    const dim3 grid(R, *nt);
    const size_t sm = cs_pipe_smem(tk, missing, g->ring);
    if (!g->bulk) cs_pipe<512, 1024, 4, false><<<grid, 512, sm, g->st>>>(a);
    else if (g->tth == 256) cs_pipe<256, 1024, 4, true><<<grid, 256, sm, g->st>>>(a);
    else if (g->ring == 1) cs_pipe<512, 2048, 3, true><<<grid, 512, sm, g->st>>>(a);
    else if (g->ring == 2) cs_pipe<512, 512, 6, true><<<grid, 512, sm, g->st>>>(a);
    else cs_pipe<512, 1024, 4, true><<<grid, 512, sm, g->st>>>(a);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* The top kk of the rows' nt x k candidates to oidx [R][kk]: cs_merge (segments of a row, then its last block)
 * when a segment fits in shared memory and variant != 3, else the shared top-k over the candidate rows and cs_map. */
kv_status cs_cand_launch(kv_cs_gpu *g, int variant, int R, int nt, int k, int kk) {
    const long long nc = (long long)nt * k;
    const int ns = cs_merge_nseg(nc);
    if (variant != 3 && cs_merge_smem(nc, ns, kk) <= g->merge_smax) {
        cs_merge<<<dim3(R, ns), CS_MTH, cs_merge_smem(nc, ns, kk), g->st>>>(g->cv, g->ci, g->cld, (int)nc, kk, g->mv,
                                                                          g->mk, g->mctr, g->oidx);
        KV_LAUNCH_CHECK();
        return KV_OK;
    }
    KV_TRY(kv_topk_launch(&g->tkc, g->cv, g->cld, 0, (int)nc, R, kk, 0, NULL, 1, g->opos, NULL, kk, NULL, g->st));
    cs_map<<<(R * kk + 127) / 128, 128, 0, g->st>>>(g->opos, g->ci, g->cld, kk, R, g->oidx);
    KV_LAUNCH_CHECK();
    return KV_OK;
}

/* The tiled search whole (variant 0 pipelined, 3 staged) on g->st, q on the device: the candidates' top
 * kk = min(k, hi - sink) to oidx [R][kk]; nu, and u when want_u. */
kv_status cs_tile_launch(kv_cs_gpu *g, int variant, int pool, int missing, int weight, int hi, int k, int want_u) {
    const int R = pool ? g->c.Hkv : g->c.Hq, n = hi - g->c.sink, kk = k < n ? k : n;
    if (n <= 0 || kk <= 0) return KV_OK;
    int nt;
    KV_TRY(cs_tiles_launch(g, variant, pool, missing, weight, hi, k, want_u, &nt));
    return cs_cand_launch(g, variant, R, nt, k, kk);
}

/* The bit-view kernels for missing=min (MIN) or zero and weight=none (W1) or not: cs_bsamp, and cs_bits's M8
 * instance when m = CS_BG, its NS one for a region without the sample. */
template <bool MIN, bool W1>
void cs_bits_kernels(int m, bool ns, void (**samp)(cs_bits_args), void (**main_k)(cs_bits_args)) {
    *samp = cs_bsamp<MIN, W1>;
    *main_k = m == CS_BG ? (ns ? cs_bits<MIN, W1, true, true> : cs_bits<MIN, W1, true, false>)
                         : (ns ? cs_bits<MIN, W1, false, true> : cs_bits<MIN, W1, false, false>);
}

/* The bit-view search (csattention_bits.cuh) on g->st, q on the device: cs_nearest, then cs_bsamp, cs_bits
 * and cs_bsel as programmatic dependent launches (unless KVBENCH_CS_PDL=0: cs_bits's blocks start beside
 * cs_bsamp's and wait for it only to read the bound): the top kk = min(k, hi - sink) to oidx [R][kk] and nu
 * (and u when want_u). The sample: a quarter of the region's chunks up to CS_BSMAXS = 64, CS_BSW = 16 a
 * cs_bsamp block; none for a region of at most CS_BSNONE = 64 chunks (KVBENCH_CS_SAMPLE=N: a block every N
 * region chunks, up to a quarter of them, at every length; 0: no sample). */
kv_status cs_bits_launch(kv_cs_gpu *g, int pool, int missing, int weight, int hi, int k, int want_u) {
    const kv_cs_gpu_config &c = g->c;
    const int R = pool ? c.Hkv : c.Hq, lo = c.sink, n = hi - lo, kk = k < n ? k : n;
    if (n <= 0 || kk <= 0) return KV_OK;
    const int clo = lo >> 10, nreg = ((hi - 1) >> 10) - clo + 1;
    const int quarter = nreg / 4 < 1 ? 1 : nreg / 4; /* the sample: S chunks over SB blocks a row, none if S = 0 */
    int S = 0, SB = 1;
    if (g->bsample < 0 && nreg > CS_BSNONE) { /* the default: a quarter of the region up to CS_BSMAXS chunks */
        S = quarter < CS_BSMAXS ? quarter : CS_BSMAXS;
        SB = (S + CS_BSW - 1) / CS_BSW;
    } else if (g->bsample > 0) { /* KVBENCH_CS_SAMPLE=N: a block every N region chunks, every region */
        SB = nreg / g->bsample > 1 ? nreg / g->bsample : 1;
        S = quarter < SB * CS_BSW ? quarter : SB * CS_BSW;
    }
    const cs_bits_args a = {g->bbits, g->bbase, g->bval, g->BW, g->NCH, g->BL, g->jl, g->wb, g->lval, g->lcnt, c.L,
                            c.m, lo, hi, k, clo, nreg, S, g->thr, g->bcnt, g->bcv, g->bck, g->bcap, g->bnu,
                            want_u ? g->u : NULL, c.T, g->bsmx, g->btick};
    KV_TRY(cs_nearest_launch(g, pool, weight, R, NULL, NULL));
    void (*samp)(cs_bits_args), (*main_k)(cs_bits_args);
    (missing == 1 ? (weight ? cs_bits_kernels<true, false> : cs_bits_kernels<true, true>)
                  : (weight ? cs_bits_kernels<false, false> : cs_bits_kernels<false, true>))(c.m, S == 0, &samp,
                                                                                               &main_k);
    if (S > 0) KV_TRY(kv_launch(&g->bpdl, "csattention GPU", samp, dim3(R, SB), dim3(CS_BSW * 32), cs_bits_smem(CS_BSW),
                                g->st, a));
    /* Without cs_bsamp, cs_bits is cs_nearest's programmatic dependent too, and its shared memory lets at most
       ceil(blocks / SMs) of its blocks share an SM. Without that, dependent blocks scheduled beside cs_nearest's
       took 13-16 us longer than a plain launch after it (session 39 call E; likely, not measured: several went to
       one SM); spread out, the dependent launch saves the plain one's gap: 23.1 / 24.6 / 27.5 -> 21.6 / 23.5 /
       26.1 us at 16K / 32K / 64K (session 40 call C, three interleaved rounds, H200). */
    const int by = (nreg + CS_BW - 1) / CS_BW, per = (R * by + g->dev.sm_count - 1) / g->dev.sm_count;
    size_t smem = cs_bits_smem(CS_BW);
    if (S == 0 && per < CS_BMINB) {
        const size_t cap = (size_t)g->dev.smem_optin - CS_BSTAT; /* cs_bits_attr's limit */
        /* per blocks fit an SM, each with the 1 KB the SM reserves a block */
        const size_t spread = ((size_t)g->dev.smem_per_sm / per - 1024 - CS_BSTAT) & ~(size_t)15;
        smem = spread > smem ? (spread < cap ? spread : cap) : smem;
    }
    KV_TRY(kv_launch(&g->bpdl, "csattention GPU", main_k, dim3(R, by), dim3(CS_BW * 32), smem, g->st, a));
    KV_TRY(kv_launch(&g->bpdl, "csattention GPU", cs_bsel, dim3(R), dim3(CS_BSEL), CS_BSELC * sizeof(unsigned long long),
                     g->st, (const unsigned *)g->bcv, (const int32_t *)g->bck, g->bcap, g->bcnt, kk, g->bnu, g->nu,
                     g->thr, g->oidx));
    return KV_OK;
}
