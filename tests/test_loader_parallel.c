/* test_loader_parallel.c: the parallel layer loader (datasets/trace_fast.c)
 * returns arrays byte-identical to the HDF5 library's read path
 * (KVBENCH_LOADER=library) on every storage kvbench synth writes: gzip,
 * shuffle+gzip, chunked without filters, contiguous, chunks that do not
 * divide T or D, float32; with libdeflate and with zlib; in the reader
 * child and in process. A filter it does not handle (fletcher32) must go to
 * the library path, and say so. The library path is the reference: it is
 * the code every earlier result was loaded with. */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/kv_trace.h"
#include "kv_test.h"

typedef struct { const char *name; int gzip, shuffle, fletcher32, contiguous, chunk, half, want_parallel; } store;

static int load(const char *p, const char *mode, kv_layer *L, char *how, size_t cap) {
    kv_test_env ev;
    kv_test_env_set(&ev, "KVBENCH_LOADER", mode);
    kv_trace_info *in = malloc(sizeof *in);
    kv_status st = in ? kv_trace_open(p, in) : KV_ERR_NOMEM;
    if (st == KV_OK) st = kv_trace_load_layer(in, 0, L);
    snprintf(how, cap, "%s", kv_trace_last_load());
    free(in);
    kv_test_env_restore(&ev);
    if (st != KV_OK) fprintf(stderr, "    %s: %s\n", p, kv_last_error());
    return st == KV_OK;
}

static int same(const kv_layer *a, const kv_layer *b) {
    size_t nq = (size_t)a->Hq * a->T * a->D, nk = (size_t)a->Hkv * a->T * a->D;
    return a->Hq == b->Hq && a->Hkv == b->Hkv && a->T == b->T && a->D == b->D && a->half == b->half &&
           !memcmp(a->q, b->q, nq * 4) && !memcmp(a->k, b->k, nk * 4) && (!a->v) == (!b->v) &&
           (!a->v || !memcmp(a->v, b->v, nk * 4));
}

int test_loader_parallel_matches_library(void) {
    static const store S[] = {
        {"gzip", 4, 0, 0, 0, 0, 1, 1},         {"shuffle-gzip", 4, 1, 0, 0, 0, 1, 1},
        {"plain-chunks", 0, 0, 0, 0, 0, 1, 1}, {"contiguous", 0, 0, 0, 1, 0, 1, 1},
        {"odd-chunks", 1, 1, 0, 0, 333, 1, 1}, {"f32-shuffle-gzip", 6, 1, 0, 0, 700, 0, 1},
        {"fletcher32", 4, 1, 1, 0, 0, 1, 0},   {"f32-contiguous", 0, 0, 0, 1, 0, 0, 1},
    };
    int old_threads = omp_get_max_threads();
    omp_set_num_threads(3); /* more tasks in flight than cores here: interleaving is exercised */
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        char p[1024], how[512], how2[512];
        snprintf(p, sizeof p, "%s/par-%s.h5", kv_test_tmpdir(), S[i].name);
        kv_synth_spec sp = {.tokens = 2000, .prefill = 1500, .q_heads = 4, .kv_heads = 2, .dim = 48, .layers = 1,
                            .seed = 7 + i, .half = S[i].half, .with_v = 1, .gzip = S[i].gzip, .shuffle = S[i].shuffle,
                            .fletcher32 = S[i].fletcher32, .contiguous = S[i].contiguous, .chunk_tokens = S[i].chunk};
        CHECK_OK(kv_synth_write(p, &sp));
        kv_layer ref, par, zl, dir;
        CHECK(load(p, "library", &ref, how, sizeof how), "%s: library load", S[i].name);
        CHECK(load(p, NULL, &par, how, sizeof how), "%s: parallel load", S[i].name);
        int n_par = 0;
        for (const char *q = how; (q = strstr(q, "parallel")); q++) n_par++;
        CHECK(n_par == (S[i].want_parallel ? 3 : 0), "%s: expected %s for q, k and v, the loader said '%s'",
              S[i].name, S[i].want_parallel ? "the parallel path" : "the library path", how);
        if (S[i].gzip && S[i].want_parallel) CHECK(strstr(how, "deflate") || strstr(how, "zlib"), "%s: %s", S[i].name, how);
        if (!S[i].want_parallel) CHECK(strstr(how, "a filter other than"), "%s: fallback reason: %s", S[i].name, how);
        CHECK(same(&ref, &par), "%s: parallel arrays differ from the library's (%s)", S[i].name, how);
        kv_test_env ev;
        kv_test_env_set(&ev, "KVBENCH_NO_LIBDEFLATE", "1");
        int okz = load(p, NULL, &zl, how2, sizeof how2);
        kv_test_env_restore(&ev);
        CHECK(okz, "%s: zlib load", S[i].name);
        if (S[i].gzip && S[i].want_parallel) CHECK(strstr(how2, "zlib"), "%s: KVBENCH_NO_LIBDEFLATE=1: %s", S[i].name, how2);
        CHECK(same(&ref, &zl), "%s: zlib-inflated arrays differ from the library's", S[i].name);
        kv_test_env_set(&ev, "KVBENCH_LOADER_IN_PROCESS", "1");
        int okd = load(p, NULL, &dir, how2, sizeof how2);
        kv_test_env_restore(&ev);
        CHECK(okd, "%s: in-process load", S[i].name);
        CHECK(same(&ref, &dir), "%s: in-process arrays differ from the library's", S[i].name);
        kv_layer_free(&ref); kv_layer_free(&par); kv_layer_free(&zl); kv_layer_free(&dir);
    }
    omp_set_num_threads(old_threads);
    return KV_TEST_PASS;
}

/* The CPU's own flags, independently of the loader's cpuid test. */
static int cpu_has_f16c(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int yes = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) { yes = strstr(line, " f16c") && strstr(line, " avx"); break; }
    if (f) fclose(f);
    return yes;
}

/* Every finite float16 value (subnormals, -0, the largest) through the
 * F16C conversion, the table, and the library: the same bits. */
int test_loader_parallel_all_halves(void) {
    enum { H = 2, T = 1024, D = 64 }; /* k, v: 131072 values = every 16-bit pattern twice */
    float *q = malloc(sizeof(float) * H * 2 * T * D), *k = malloc(sizeof(float) * H * T * D);
    float *v = malloc(sizeof(float) * H * T * D);
    CHECK(q && k && v, "out of memory");
    for (size_t i = 0; i < (size_t)H * T * D; i++) {
        uint16_t u = (uint16_t)i;
        if ((u & 0x7c00) == 0x7c00) u &= 0x83ff; /* inf/nan patterns -> a finite one */
        k[i] = kv_half_to_float(u);
        v[i] = kv_half_to_float((uint16_t)(u ^ 0x8000));
    }
    for (size_t i = 0; i < (size_t)H * 2 * T * D; i++) q[i] = k[i % ((size_t)H * T * D)];
    for (int gz = 0; gz < 2; gz++) {
        char p[1024], how[512];
        snprintf(p, sizeof p, "%s/halves-%d.h5", kv_test_tmpdir(), gz);
        kv_trace_spec ts = {.model = "test", .description = "every half", .rope = "none", .head_dim = D,
                            .num_q_heads = 2 * H, .num_kv_heads = H, .num_tokens = T, .prefill_len = T / 2,
                            .softmax_scale = 0.125f, .half = 1, .gzip = gz ? 3 : 0, .shuffle = gz,
                            .contiguous = !gz, .chunk_tokens = 100};
        kv_trace_writer *w;
        CHECK_OK(kv_trace_writer_open(p, &ts, &w));
        CHECK_OK(kv_trace_writer_layer(w, 0, 1));
        CHECK_OK(kv_trace_writer_rows(w, 0, T, q, k, v));
        CHECK_OK(kv_trace_writer_close(w, 1));
        kv_layer ref, par, tab;
        CHECK(load(p, "library", &ref, how, sizeof how), "library load");
        CHECK(load(p, NULL, &par, how, sizeof how), "parallel load");
        CHECK(strstr(how, "q: parallel") && strstr(how, "v: parallel"), "%s", how);
        CHECK(!strstr(how, "F16C") == !cpu_has_f16c(), "F16C use (%s) against /proc/cpuinfo (%d)", how, cpu_has_f16c());
        kv_test_env ev;
        kv_test_env_set(&ev, "KVBENCH_NO_F16C", "1");
        int ok = load(p, NULL, &tab, how, sizeof how);
        kv_test_env_restore(&ev);
        CHECK(ok, "table load");
        for (size_t i = 0; i < (size_t)H * T * D; i++)
            CHECK(!memcmp(&ref.k[i], &k[i], 4), "library k[%zu] = %a, want %a", i, ref.k[i], k[i]);
        CHECK(same(&ref, &par), "gzip %d: F16C arrays differ from the library's", gz);
        CHECK(same(&ref, &tab), "gzip %d: table arrays differ from the library's", gz);
        kv_layer_free(&ref); kv_layer_free(&par); kv_layer_free(&tab);
    }
    free(q); free(k); free(v);
    return KV_TEST_PASS;
}

/* Issue 12 goal 3: the float16 form (KV_LAYER_F16) holds the file's float16
 * bits, on every path (parallel with libdeflate and zlib, the library, in
 * the reader child and in process), and widened it is bit for bit the float32
 * form the library path reads; its rows (kv_layer_rows, kv_layer_row) are
 * those of the float32 form; a float32 dataset stays float32; a non-finite
 * half is refused in the float16 form as in the float32 one. */
static int load_as(const char *p, const char *mode, int form, kv_layer *L, char *how, size_t cap) {
    kv_test_env ev;
    kv_test_env_set(&ev, "KVBENCH_LOADER", mode);
    kv_trace_info *in = malloc(sizeof *in);
    kv_status st = in ? kv_trace_open(p, in) : KV_ERR_NOMEM;
    if (st == KV_OK) st = kv_trace_load_layer_as(in, 0, form, L);
    snprintf(how, cap, "%s", kv_trace_last_load());
    free(in);
    kv_test_env_restore(&ev);
    return st;
}

int test_loader_float16_form(void) {
    static const store S[] = {
        {"gzip", 4, 0, 0, 0, 0, 1, 1},         {"shuffle-gzip", 4, 1, 0, 0, 0, 1, 1},
        {"plain-chunks", 0, 0, 0, 0, 0, 1, 1}, {"contiguous", 0, 0, 0, 1, 0, 1, 1},
        {"odd-chunks", 1, 1, 0, 0, 333, 1, 1}, {"fletcher32", 4, 1, 1, 0, 0, 1, 0},
        {"f32-shuffle-gzip", 6, 1, 0, 0, 700, 0, 1},
    };
    int old_threads = omp_get_max_threads();
    omp_set_num_threads(3);
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        char p[1024], how[512];
        snprintf(p, sizeof p, "%s/f16form-%s.h5", kv_test_tmpdir(), S[i].name);
        kv_synth_spec sp = {.tokens = 1100, .prefill = 1000, .q_heads = 4, .kv_heads = 2, .dim = 40, .layers = 1,
                            .seed = 31 + i, .half = S[i].half, .with_v = 1, .gzip = S[i].gzip, .shuffle = S[i].shuffle,
                            .fletcher32 = S[i].fletcher32, .contiguous = S[i].contiguous, .chunk_tokens = S[i].chunk};
        CHECK_OK(kv_synth_write(p, &sp));
        kv_layer ref;
        CHECK(load_as(p, "library", KV_LAYER_F32, &ref, how, sizeof how) == KV_OK, "%s: library float32 load", S[i].name);
        const char *modes[4] = {"library", NULL, "zlib", "inproc"};
        for (int m = 0; m < 4; m++) {
            kv_layer L;
            kv_test_env ev;
            if (m >= 2) kv_test_env_set(&ev, m == 2 ? "KVBENCH_NO_LIBDEFLATE" : "KVBENCH_LOADER_IN_PROCESS", "1");
            kv_status st = load_as(p, m == 0 ? "library" : NULL, KV_LAYER_F16, &L, how, sizeof how);
            if (m >= 2) kv_test_env_restore(&ev);
            CHECK(st == KV_OK, "%s: float16-form load (%s): %s", S[i].name, modes[m] ? modes[m] : "parallel", kv_last_error());
            CHECK(kv_layer_is_f16(&L) == S[i].half, "%s: float16 form %d for a %s trace", S[i].name, kv_layer_is_f16(&L),
                  S[i].half ? "float16" : "float32");
            if (m == 1 && S[i].want_parallel && S[i].half) CHECK(strstr(how, "kept float16"), "%s: %s", S[i].name, how);
            if (S[i].half) {
                CHECK(kv_layer_bytes(&L) * 2 == kv_layer_bytes(&ref), "%s: float16 form of %.0f bytes, float32 %.0f",
                      S[i].name, kv_layer_bytes(&L), kv_layer_bytes(&ref));
                size_t nk = (size_t)L.Hkv * L.T * L.D;
                for (size_t e = 0; e < nk; e += 97) /* the stored bits: the half of the float32 value */
                    CHECK(L.k16[e] == kv_float_to_half(ref.k[e]), "%s: k16[%zu] = %04x, want the half of %a", S[i].name,
                          e, L.k16[e], ref.k[e]);
                float a[4 * 40], b[4 * 40], tmp[40];
                for (int t = 0; t < L.T; t += 137) {
                    kv_layer_rows(&L, 'q', t, a);
                    kv_layer_rows(&ref, 'q', t, b);
                    CHECK(!memcmp(a, b, sizeof a), "%s: q rows of position %d differ", S[i].name, t);
                    const float *r = kv_layer_row(&L, 'v', 1, t, tmp), *r0 = kv_layer_row(&ref, 'v', 1, t, NULL);
                    CHECK(!memcmp(r, r0, 40 * sizeof(float)), "%s: v row of head 1, position %d differs", S[i].name, t);
                }
            }
            CHECK_OK(kv_layer_widen(&L));
            CHECK(!kv_layer_is_f16(&L) && same(&ref, &L), "%s (%s): widened float16 form differs from the float32 form",
                  S[i].name, modes[m] ? modes[m] : "parallel");
            kv_layer_free(&L);
        }
        kv_layer_free(&ref);
    }
    /* a non-finite half: refused in the float16 form too, naming the position */
    enum { H = 1, T = 64, D = 8 };
    float q[2 * H * T * D], k[H * T * D], v[H * T * D];
    for (int i = 0; i < H * T * D; i++) k[i] = v[i] = (float)(i % 7) * 0.25f;
    for (int i = 0; i < 2 * H * T * D; i++) q[i] = 0.5f;
    k[5 * D + 3] = 1.0f / 0.0f;
    for (int gz = 0; gz < 2; gz++) {
        char p[1024], how[512];
        snprintf(p, sizeof p, "%s/f16form-inf-%d.h5", kv_test_tmpdir(), gz);
        kv_trace_spec ts = {.model = "test", .description = "an inf", .rope = "none", .head_dim = D, .num_q_heads = 2 * H,
                            .num_kv_heads = H, .num_tokens = T, .prefill_len = T / 2, .softmax_scale = 0.125f, .half = 1,
                            .gzip = gz ? 3 : 0, .contiguous = !gz, .chunk_tokens = 16};
        kv_trace_writer *w;
        CHECK_OK(kv_trace_writer_open(p, &ts, &w));
        CHECK_OK(kv_trace_writer_layer(w, 0, 1));
        CHECK_OK(kv_trace_writer_rows(w, 0, T, q, k, v));
        CHECK_OK(kv_trace_writer_close(w, 1));
        for (int m = 0; m < 2; m++) {
            kv_layer L;
            kv_status st = load_as(p, m ? "library" : NULL, KV_LAYER_F16, &L, how, sizeof how);
            CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), "non-finite") && strstr(kv_last_error(), "token 5, dim 3"),
                  "gzip %d, %s: expected the non-finite error at token 5, dim 3, got %d: %s", gz, m ? "library" : "parallel",
                  st, kv_last_error());
        }
    }
    omp_set_num_threads(old_threads);
    return KV_TEST_PASS;
}
