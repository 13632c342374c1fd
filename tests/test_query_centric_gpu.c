/* test_query_centric_gpu.c: the CUDA paths of CSAttention and CTKVR
 * (kernels/csattention.cu, kernels/ctkvr.cu) against their C references,
 * driven side by side over the same layer: the lists after the build and
 * after the decode keys (as sets for CSAttention, whose heap layout may
 * differ; in order for CTKVR), and at every evaluated step the selection
 * (in order), the candidate set (as a set) and the extras. Scores are
 * bitwise equal on both paths; CTKVR's log-sum-exp adds in another order,
 * so a selection could differ between keys whose ranking values tie to the
 * last bit: on the synthetic layers used here none does (a failure names
 * the step, head and rank). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../retrievers/query_centric.h"
#include "kv_test.h"

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* the two selections are equal (ordered idx, candidate sets, extras) */
static int same_selection(const kv_selection *a, const kv_selection *b, int t, const char *what) {
    int *x = malloc((size_t)a->cand_cap * sizeof(int)), *y = malloc((size_t)a->cand_cap * sizeof(int));
    for (int l = 0; l < a->n_lists; l++) {
        CHECK(a->count[l] == b->count[l], "%s t %d list %d: count cpu %d gpu %d", what, t, l, a->count[l], b->count[l]);
        for (int j = 0; j < a->count[l]; j++)
            CHECK(a->idx[(size_t)l * a->cap + j] == b->idx[(size_t)l * b->cap + j], "%s t %d list %d rank %d: cpu %d gpu %d",
                  what, t, l, j, a->idx[(size_t)l * a->cap + j], b->idx[(size_t)l * b->cap + j]);
        CHECK(a->n_cand[l] == b->n_cand[l], "%s t %d list %d: candidates cpu %d gpu %d", what, t, l, a->n_cand[l],
              b->n_cand[l]);
        int n = a->n_cand[l] > 0 ? a->n_cand[l] : 0;
        memcpy(x, a->cand + (size_t)l * a->cand_cap, (size_t)n * sizeof(int));
        memcpy(y, b->cand + (size_t)l * b->cand_cap, (size_t)n * sizeof(int));
        qsort(x, (size_t)n, sizeof(int), cmp_int);
        qsort(y, (size_t)n, sizeof(int), cmp_int);
        CHECK(!memcmp(x, y, (size_t)n * sizeof(int)), "%s t %d list %d: candidate sets differ", what, t, l);
    }
    for (int g = 0; g < a->n_kv; g++) {
        CHECK(a->n_extra[g] == b->n_extra[g], "%s t %d kv %d: extra cpu %d gpu %d", what, t, g, a->n_extra[g], b->n_extra[g]);
        CHECK(!memcmp(a->extra + (size_t)g * a->extra_cap, b->extra + (size_t)g * b->extra_cap,
                      (size_t)a->n_extra[g] * sizeof(int32_t)), "%s t %d kv %d: extras differ", what, t, g);
    }
    free(x); free(y);
    return KV_TEST_PASS;
}

static int cs_same_lists(const kv_cs_view *a, const kv_cs_view *b, int Hkv, const char *what) {
    int nl = Hkv * a->m * a->C;
    CHECK(!memcmp(a->cent, b->cent, (size_t)nl * a->ds * sizeof(float)), "%s: centroids differ", what);
    int *x = malloc((size_t)a->L * sizeof(int)), *y = malloc((size_t)a->L * sizeof(int));
    for (int li = 0; li < nl; li++) {
        CHECK(a->lcnt[li] == b->lcnt[li], "%s list %d: %d vs %d entries", what, li, a->lcnt[li], b->lcnt[li]);
        memcpy(x, a->lidx + (size_t)li * a->L, (size_t)a->lcnt[li] * sizeof(int));
        memcpy(y, b->lidx + (size_t)li * b->L, (size_t)b->lcnt[li] * sizeof(int));
        qsort(x, (size_t)a->lcnt[li], sizeof(int), cmp_int);
        qsort(y, (size_t)a->lcnt[li], sizeof(int), cmp_int);
        CHECK(!memcmp(x, y, (size_t)a->lcnt[li] * sizeof(int)), "%s list %d: key sets differ", what, li);
        /* the heap roots (the weakest entry) agree */
        CHECK(a->lcnt[li] == 0 || (a->lidx[(size_t)li * a->L] == b->lidx[(size_t)li * b->L] &&
                                    a->lval[(size_t)li * a->L] == b->lval[(size_t)li * b->L]),
              "%s list %d: roots differ", what, li);
    }
    free(x); free(y);
    return KV_TEST_PASS;
}

/* Each NAME=VALUE of the comma-separated list env set for the GPU's open (an empty VALUE unsets NAME), the
 * earlier state saved in ev[0 .. returned count) for cs_env_restore. */
enum { CS_ENVS = 8 };
static int cs_env(const char *env, char (*buf)[256], kv_test_env *ev) {
    int n = 0;
    snprintf(*buf, sizeof *buf, "%s", env ? env : "");
    for (char *tok = strtok(*buf, ","); tok && n < CS_ENVS; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        kv_test_env_set(&ev[n++], tok, eq[1] ? eq + 1 : NULL);
    }
    return n;
}
static void cs_env_restore(kv_test_env *ev, int n) {
    while (n > 0) kv_test_env_restore(&ev[--n]); /* the reverse order: a name given twice gets its first state */
}

/* Both paths from the same layer and centroids (kmeans=host), lists and selections compared at every
 * stride-th step; env: NULL the default (the bit view, kernels/csattention_bits.cuh), or settings for
 * the GPU's open such as KVBENCH_CS_REDUCE=dense (global accumulator), =sort (radix sort,
 * csattention_sort.cuh), =staged (the staged tiles, csattention_tile.cuh), =tiled (the pipelined tiles,
 * csattention_pipe.cuh) and their knobs KVBENCH_CS_TK, _TH, _RING, _BOUNDS, _THR, _SLOTS, or the bit view's
 * KVBENCH_CS_SAMPLE=0. */
static int cs_gpu_matches_cpu_at(int T, int P, int stride, const char *(*sets)[7], int nsets, const char *env) {
    int sink = 4, local = 16, k = 24;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 41, &L));
    for (int s = 0; s < nsets; s++) {
        kv_test_driver c, g;
        CHECK_OK(kv_test_driver_open(&c, "csattention", sets[s], 7, &L, P, sink, local, k));
        char buf[256]; /* kv_test_env keeps pointers to the names in it */
        kv_test_env ev[CS_ENVS];
        const int ne = cs_env(env, &buf, ev);
        kv_status st = kv_test_driver_open_gpu(&g, "csattention", sets[s], 7, &L, P, sink, local, k);
        cs_env_restore(ev, ne);
        CHECK(st == KV_OK, "gpu open: %s", kv_last_error());
        kv_cs_view vc, vg;
        kv_csattention_view(c.st, &vc);
        kv_csattention_view(g.st, &vg);
        if (cs_same_lists(&vc, &vg, 2, "build") != KV_TEST_PASS) return KV_TEST_FAIL;
        for (int t = P; t < T; t += stride) {
            CHECK_OK(kv_test_driver_step(&c, t, k));
            CHECK_OK(kv_test_driver_step(&g, t, k));
            if (same_selection(&c.sel, &g.sel, t, sets[s][4]) != KV_TEST_PASS) return KV_TEST_FAIL;
        }
        kv_csattention_view(c.st, &vc);
        kv_csattention_view(g.st, &vg);
        if (cs_same_lists(&vc, &vg, 2, "after decode") != KV_TEST_PASS) return KV_TEST_FAIL;
        kv_test_driver_close(&c);
        kv_test_driver_close(&g);
    }
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

static int cs_gpu_matches_cpu(int T, int P, int stride, const char *(*sets)[7], int nsets, const char *reduce) {
    char env[64];
    snprintf(env, sizeof env, "KVBENCH_CS_REDUCE=%s", reduce ? reduce : "");
    return cs_gpu_matches_cpu_at(T, P, stride, sets, nsets, reduce ? env : NULL);
}

/* kmeans=host: both paths share the centroids, so everything after is bitwise */
static const char *cs_sets[][7] = {
    {"m=4", "C=8", "alpha=0.1", "iters=3", "missing=zero", "pool=none", "kmeans=host"},
    {"m=4", "C=8", "alpha=0.2", "iters=3", "missing=min", "pool=mean", "kmeans=host"},
    {"m=8", "C=16", "alpha=0.25", "weight=qnorm", "missing=zero", "pool=mean", "kmeans=host"},
    {"m=2", "C=4", "alpha=0.3", "update=0", "missing=min", "weight=qnorm", "kmeans=host"},
};

int test_csattention_gpu_matches_cpu(void) { return cs_gpu_matches_cpu(640, 400, 16, cs_sets, 4, NULL); }
int test_csattention_gpu_dense_matches_cpu(void) { return cs_gpu_matches_cpu(640, 400, 16, cs_sets, 4, "dense"); }
int test_csattention_gpu_sort_matches_cpu(void) { return cs_gpu_matches_cpu(640, 400, 16, cs_sets, 4, "sort"); }

/* Several tiles of 4096 keys, a tile's entries above the staged kernel's 6144-entry window and above the
 * pipelined kernel's 2048-entry pieces (m = 8, alpha = 0.25: ~1000 per list and tile, ~8000 per tile), and
 * enough decode keys that lists evict past their views' slack (compaction: the by-key view's L/16 + 34 and
 * the bit view's L/8 + 64 slots; ~3800 decode keys, L = 2250). For the bit view: 13 chunks of 1024 keys,
 * at most CS_BSNONE = 64, so by default every chunk's warp bounds itself; under KVBENCH_CS_SAMPLE=512 3 of them
 * are sampled for the bound and every warp emits above it. */
static const char *cs_big[][7] = {
    {"m=8", "C=4", "alpha=0.25", "iters=2", "missing=zero", "pool=none", "kmeans=host"},
    {"m=8", "C=4", "alpha=0.25", "iters=2", "missing=min", "pool=mean", "kmeans=host"},
};
int test_csattention_gpu_tiles_match_cpu(void) { return cs_gpu_matches_cpu(12800, 9000, 200, cs_big, 2, NULL); }

/* The pipelined tiles (the default before session 11). */
int test_csattention_gpu_pipelined_match_cpu(void) { return cs_gpu_matches_cpu(12800, 9000, 200, cs_big, 2, "tiled"); }

/* Both sides of CS_BSNONE = 64 region chunks at a region of 65 to 66 chunks: the default samples it (cs_bsamp's
 * bound), KVBENCH_CS_SAMPLE=0 does not (every warp selects its own exact top k and raises the bound itself). Below
 * the threshold the default tests above already run the unsampled path. */
int test_csattention_gpu_bits_unsampled_match_cpu(void) {
    if (cs_gpu_matches_cpu_at(67584, 66560, 256, cs_big, 2, NULL) != KV_TEST_PASS) return KV_TEST_FAIL;
    return cs_gpu_matches_cpu_at(67584, 66560, 256, cs_big, 2, "KVBENCH_CS_SAMPLE=0");
}

/* The bit view's paths from global memory (csattention_bits.cuh, cs_bchunk): alpha = 0.8 puts ~800 of a
 * chunk's 1024 keys in each list, above a staging buffer's ~512 (every list has such a chunk: its 2397
 * entries over 3 chunks), so those lists are read where they lie, beside the region's edge words (the sink,
 * the last chunk); missing=min reads every key's value or the list's minimum on that path too. */
static const char *cs_long[][7] = {
    {"m=8", "C=4", "alpha=0.8", "iters=2", "missing=zero", "pool=none", "kmeans=host"},
    {"m=4", "C=4", "alpha=0.8", "iters=2", "missing=min", "pool=mean", "kmeans=host"},
};
int test_csattention_gpu_bits_long_runs_match_cpu(void) { return cs_gpu_matches_cpu(4000, 3000, 50, cs_long, 2, NULL); }

/* The sample blocks (cs_bsamp) at regions of at most CS_BSNONE = 64 chunks, where the default leaves them out:
 * KVBENCH_CS_SAMPLE set samples every region (1 to 13 chunks here), the bound from the sample's lane maxima. */
int test_csattention_gpu_bits_sampled_match_cpu(void) {
    static const char *env = "KVBENCH_CS_SAMPLE=512";
    if (cs_gpu_matches_cpu_at(640, 400, 16, cs_sets, 4, env) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (cs_gpu_matches_cpu_at(12800, 9000, 400, cs_big, 2, env) != KV_TEST_PASS) return KV_TEST_FAIL;
    return cs_gpu_matches_cpu_at(4000, 3000, 50, cs_long, 2, env);
}

/* A row's sample blocks pooled (cs_bpool, csattention_bits.cuh): KVBENCH_CS_SAMPLE=16 gives a region of 68 to
 * 69 chunks 4 cs_bsamp blocks a row, 17 sample chunks over the first two (the others' lanes have none), and the
 * last block to arrive takes the k-th largest of all their lane maxima for the bound. A bound above the row's
 * k-th best would drop keys of the top k, so the GPU's selections would differ from the CPU's. */
int test_csattention_gpu_bits_pooled_match_cpu(void) {
    return cs_gpu_matches_cpu_at(70656, 69632, 256, cs_big, 2, "KVBENCH_CS_SAMPLE=16");
}

/* The default sample at the same region (since session 36 a quarter of it up to 64 chunks, 16 a block): 17 chunks
 * in 2 blocks a row, pooled the same way. KVBENCH_CS_SAMPLE is unset for the open, whatever the run's environment. */
int test_csattention_gpu_bits_pooled_default_match_cpu(void) {
    return cs_gpu_matches_cpu_at(70656, 69632, 256, cs_big, 2, "KVBENCH_CS_SAMPLE=");
}

/* The other tilings: the staged kernel; the pipelined one at 2048 keys x 256 threads (ring 1024 x 4), 8192 x
 * 512 with searched ranges, 4096 x 512 with the 512 x 6 ring and no row bound, the single-slot row bound
 * (KVBENCH_CS_SLOTS=1, the previous one), 16 slots at 2048 keys, the ring 1024 x 4 with searched ranges (the
 * default before session 6) and the cp.async copies (KVBENCH_CS_BULK=0). */
int test_csattention_gpu_tile_variants_match_cpu(void) {
    static const char *envs[] = {
        "KVBENCH_CS_REDUCE=staged",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_TK=2048,KVBENCH_CS_TH=256",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_TK=8192,KVBENCH_CS_BOUNDS=0",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_RING=512x6,KVBENCH_CS_THR=0",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_SLOTS=1",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_TK=2048,KVBENCH_CS_SLOTS=16",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_RING=1024x4,KVBENCH_CS_BOUNDS=0",
        "KVBENCH_CS_REDUCE=tiled,KVBENCH_CS_BULK=0",
    };
    for (int e = 0; e < (int)(sizeof envs / sizeof envs[0]); e++)
        if (cs_gpu_matches_cpu_at(12800, 9000, 400, cs_big, 2, envs[e]) != KV_TEST_PASS) {
            fprintf(stderr, "    with %s\n", envs[e]);
            return KV_TEST_FAIL;
        }
    return KV_TEST_PASS;
}

/* path 0: the default device path (the one-launch search of
 * kernels/ctkvr_search.cuh, version 3 = version 2 with the tiled rerank,
 * whose limits these shapes are within);
 * 1: KVBENCH_CTKVR_STAGED=1, the staged kernels of kernels/ctkvr.cu;
 * 2: KVBENCH_CTKVR_FUSED=1, the one-launch search's version 1
 * (kernels/ctkvr_fused.cuh); 3: KVBENCH_CTKVR_V2=1, its version 2 (the
 * rerank one thread per key, untiled). */
static int ctkvr_gpu_matches_cpu(int path) {
    int T = 640, P = 400, sink = 4, local = 16, k = 24;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 43, &L));
    const char *sets[][5] = {
        {"C=20", "rho=60", "cp=4", "dcu=on", "gen=dense"},
        {"C=20", "rho=60", "cp=3", "dcu=off", "gen=rerank"},
        {"C=8", "rho=50", "cp=2", "dcu=oracle", "gen=dense"},
        {"C=0", "k_hint=24", "cp=4", "dcu=on", "gen=rerank"},
        {"C=16", "rho=40", "centroids=random", "dcu=on", "gen=dense"},
    };
    for (int s = 0; s < 5; s++) {
        kv_test_driver c, g;
        CHECK_OK(kv_test_driver_open(&c, "ctkvr", sets[s], 5, &L, P, sink, local, k));
        const char *env = path == 1 ? "KVBENCH_CTKVR_STAGED" : path == 2 ? "KVBENCH_CTKVR_FUSED"
                          : path == 3 ? "KVBENCH_CTKVR_V2" : NULL;
        if (env) setenv(env, "1", 1);
        kv_status st = kv_test_driver_open_gpu(&g, "ctkvr", sets[s], 5, &L, P, sink, local, k);
        if (env) unsetenv(env);
        CHECK(st == KV_OK, "gpu open: %s", kv_last_error());
        for (int t = P; t < T; t += 8) {
            kv_ctkvr_view vc, vg;
            kv_ctkvr_view_of(c.st, &vc);
            kv_ctkvr_view_of(g.st, &vg);
            CHECK(vc.next == vg.next, "set %d t %d: FIFO next %d vs %d", s, t, vc.next, vg.next);
            for (int a = 0; a < 2 * vc.C; a++) {
                CHECK(vc.lcnt[a] == vg.lcnt[a], "set %d t %d list %d: %d vs %d keys", s, t, a, vc.lcnt[a], vg.lcnt[a]);
                CHECK(!memcmp(vc.lidx + (size_t)a * vc.rho, vg.lidx + (size_t)a * vg.rho, (size_t)vc.lcnt[a] * sizeof(int32_t)),
                      "set %d t %d list %d differs", s, t, a);
            }
            CHECK_OK(kv_test_driver_step(&c, t, k));
            CHECK_OK(kv_test_driver_step(&g, t, k));
            if (same_selection(&c.sel, &g.sel, t, sets[s][3]) != KV_TEST_PASS) return KV_TEST_FAIL;
        }
        kv_test_driver_close(&c);
        kv_test_driver_close(&g);
    }
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_ctkvr_gpu_matches_cpu(void) { return ctkvr_gpu_matches_cpu(0); }
int test_ctkvr_gpu_staged_matches_cpu(void) { return ctkvr_gpu_matches_cpu(1); }
int test_ctkvr_gpu_fused_v1_matches_cpu(void) { return ctkvr_gpu_matches_cpu(2); }
int test_ctkvr_gpu_v2_matches_cpu(void) { return ctkvr_gpu_matches_cpu(3); }

/* kmeans=gpu: the device's k-means from the same points and uniforms; its
 * centroid sums add in another order, so a coordinate may differ in its
 * last bits (and then a list at a near tie): the centroids agree to 1e-6
 * and the selections to 99% of their entries. */
int test_csattention_gpu_kmeans_matches_cpu(void) {
    int T = 600, P = 400, sink = 4, local = 16, k = 24;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 47, &L));
    const char *ps[] = {"m=4", "C=16", "alpha=0.2", "iters=6", "kmeans=gpu"};
    kv_test_driver c, g;
    CHECK_OK(kv_test_driver_open(&c, "csattention", ps, 5, &L, P, sink, local, k));
    kv_status st = kv_test_driver_open_gpu(&g, "csattention", ps, 5, &L, P, sink, local, k);
    CHECK(st == KV_OK, "gpu open: %s", kv_last_error());
    kv_cs_view vc, vg;
    kv_csattention_view(c.st, &vc);
    kv_csattention_view(g.st, &vg);
    int n = 2 * vc.m * vc.C * vc.ds, same = 0;
    double worst = 0;
    for (int a = 0; a < n; a++) {
        double d = fabs((double)vc.cent[a] - vg.cent[a]);
        worst = d > worst ? d : worst;
        same += vc.cent[a] == vg.cent[a];
    }
    fprintf(stderr, "    k-means: %d of %d coordinates bitwise equal, max |diff| %.3g\n", same, n, worst);
    CHECK(worst <= 1e-6, "centroids differ by %.3g", worst);
    long tot = 0, hit = 0;
    for (int t = P; t < T; t += 20) {
        CHECK_OK(kv_test_driver_step(&c, t, k));
        CHECK_OK(kv_test_driver_step(&g, t, k));
        for (int h = 0; h < 4; h++)
            for (int a = 0; a < c.sel.count[h]; a++) {
                tot++;
                for (int b = 0; b < g.sel.count[h]; b++)
                    hit += c.sel.idx[(size_t)h * c.sel.cap + a] == g.sel.idx[(size_t)h * g.sel.cap + b];
            }
    }
    CHECK(hit >= 0.99 * tot, "selections overlap %ld of %ld", hit, tot);
    kv_test_driver_close(&c);
    kv_test_driver_close(&g);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}
