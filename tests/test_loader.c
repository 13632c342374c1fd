/* test_loader.c: the kvtrace loader on a good file and on each kind of
 * malformed file (missing attribute, wrong shape, P > T, Hq not a multiple
 * of Hkv, NaN value, wrong dtype, truncated file, not HDF5 at all). The
 * files are written here with the HDF5 API directly, independently of
 * datasets/trace_write.c, so a bug shared by our reader and writer cannot
 * hide. */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/kv_trace.h"
#include "kv_test.h"

typedef struct {
    int Hq, Hkv, T, P, D;
    const char *skip_attr;   /* omit this root attribute */
    int bad_k_tokens;        /* k gets T+1 tokens */
    int nan_at;              /* index into v where a NaN goes (-1: none) */
    int int_k;               /* k stored as int32 */
    int gzip, f32;
} bad_spec;

static void attr_i(hid_t o, const char *n, int v, const bad_spec *s) {
    if (s->skip_attr && !strcmp(s->skip_attr, n)) return;
    hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(o, n, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    long long x = v;
    H5Awrite(a, H5T_NATIVE_LLONG, &x);
    H5Aclose(a);
    H5Sclose(sp);
}

static void attr_s(hid_t o, const char *n, const char *v, const bad_spec *s) {
    if (s->skip_attr && !strcmp(s->skip_attr, n)) return;
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE); /* variable-length UTF-8, as h5py writes str attributes */
    H5Tset_cset(t, H5T_CSET_UTF8);
    hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(o, n, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, &v);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
}

/* Values: x[h][t][d] = 0.01*(h+1) + 0.001*t - 0.1*d, exactly as stored (float16 or float32). */
static float value_at(int h, int t, int d) { return 0.01f * (h + 1) + 0.001f * t - 0.1f * d; }

static void dataset(hid_t g, const char *name, int H, int T, int D, const bad_spec *s, int nan_at) {
    hsize_t dims[3] = {(hsize_t)H, (hsize_t)T, (hsize_t)D}, chunk[3] = {1, 4, (hsize_t)D};
    hid_t sp = H5Screate_simple(3, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    if (s->gzip) { H5Pset_chunk(pl, 3, chunk); H5Pset_deflate(pl, 6); }
    size_t n = (size_t)H * T * D;
    float *x = malloc(n * sizeof *x);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int d = 0; d < D; d++) x[((size_t)h * T + t) * D + d] = value_at(h, t, d);
    if (nan_at >= 0) x[nan_at] = NAN;
    hid_t ft;
    if (s->int_k && !strcmp(name, "k")) ft = H5Tcopy(H5T_STD_I32LE);
    else if (s->f32) ft = H5Tcopy(H5T_IEEE_F32LE);
    else { ft = H5Tcopy(H5T_IEEE_F32LE); H5Tset_fields(ft, 15, 10, 5, 0, 10); H5Tset_size(ft, 2); H5Tset_ebias(ft, 15); }
    hid_t d = H5Dcreate2(g, name, ft, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x); /* HDF5 converts to the file type */
    H5Dclose(d);
    H5Tclose(ft);
    H5Pclose(pl);
    H5Sclose(sp);
    free(x);
}

static void write_trace(const char *path, const bad_spec *s) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    attr_i(f, "kvtrace_version", 1, s);
    attr_s(f, "model", "test-model", s);
    attr_s(f, "description", "loader test", s);
    attr_i(f, "head_dim", s->D, s);
    attr_i(f, "num_q_heads", s->Hq, s);
    attr_i(f, "num_kv_heads", s->Hkv, s);
    attr_i(f, "num_tokens", s->T, s);
    attr_i(f, "prefill_len", s->P, s);
    attr_s(f, "rope", "applied", s);
    if (!(s->skip_attr && !strcmp(s->skip_attr, "softmax_scale"))) {
        hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(f, "softmax_scale", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        double sc = 0.125;
        H5Awrite(a, H5T_NATIVE_DOUBLE, &sc);
        H5Aclose(a);
        H5Sclose(sp);
    }
    hid_t lg = H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t g = H5Gcreate2(lg, "L3", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad_spec none = {0};
    attr_i(g, "layer_index", 3, &none);
    dataset(g, "q", s->Hq, s->T, s->D, s, -1);
    dataset(g, "k", s->Hkv, s->T + s->bad_k_tokens, s->D, s, -1);
    dataset(g, "v", s->Hkv, s->T, s->D, s, s->nan_at);
    H5Gclose(g);
    H5Gclose(lg);
    H5Fclose(f);
}

static bad_spec good(void) { return (bad_spec){.Hq = 4, .Hkv = 2, .T = 20, .P = 12, .D = 8, .nan_at = -1}; }

void kv_test_write_nan_trace(const char *path) {
    bad_spec s = good();
    s.T = 200;
    s.P = 100;
    s.nan_at = 7;
    write_trace(path, &s);
}

static char *tpath(const char *name) {
    static char buf[8][600];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 600, "%s/%s", kv_test_tmpdir(), name);
    return p;
}

int test_loader_good_file(void) {
    bad_spec s = good();
    const char *p = tpath("good.h5");
    write_trace(p, &s);
    kv_trace_info in;
    CHECK_OK(kv_trace_open(p, &in));
    CHECK(in.num_q_heads == 4 && in.num_kv_heads == 2 && in.num_tokens == 20 && in.prefill_len == 12 && in.head_dim == 8,
          "shape attributes");
    CHECK(!strcmp(in.model, "test-model") && !strcmp(in.rope, "applied"), "strings: '%s' '%s'", in.model, in.rope);
    CHECK_CLOSE(in.softmax_scale, 0.125, 0, 0);
    CHECK(in.num_layers == 1 && !strcmp(in.layer_names[0], "L3") && in.layer_index[0] == 3 && in.layer_half[0] == 1,
          "layer list");
    CHECK(kv_trace_find_layer(&in, "L3") == 0 && kv_trace_find_layer(&in, "3") == 0 && kv_trace_find_layer(&in, "L4") < 0,
          "find layer");
    kv_layer L;
    CHECK_OK(kv_trace_load_layer(&in, 0, &L));
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 20; t++)
            for (int d = 0; d < 8; d++) {
                float want = kv_half_to_float(kv_float_to_half(value_at(h, t, d)));
                CHECK(L.k[((size_t)h * 20 + t) * 8 + d] == want, "k[%d][%d][%d]", h, t, d);
                CHECK(L.v[((size_t)h * 20 + t) * 8 + d] == want, "v[%d][%d][%d]", h, t, d);
            }
    CHECK(L.q[((size_t)3 * 20 + 19) * 8 + 7] == kv_half_to_float(kv_float_to_half(value_at(3, 19, 7))), "q corner");
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_loader_float32_and_gzip(void) {
    bad_spec s = good();
    s.f32 = 1;
    s.gzip = 1;
    const char *p = tpath("f32gz.h5");
    write_trace(p, &s);
    kv_trace_info in;
    CHECK_OK(kv_trace_open(p, &in));
    CHECK(in.layer_half[0] == 0, "float32 detected");
    kv_layer L;
    CHECK_OK(kv_trace_load_layer(&in, 0, &L));
    CHECK(L.k[(size_t)(1 * 20 + 5) * 8 + 2] == value_at(1, 5, 2), "float32 value exact");
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

static int expect_bad(const char *name, bad_spec s, int at_load, const char *needle) {
    const char *p = tpath(name);
    write_trace(p, &s);
    kv_trace_info in;
    kv_status st = kv_trace_open(p, &in);
    if (at_load && st == KV_OK) {
        kv_layer L;
        st = kv_trace_load_layer(&in, 0, &L);
        if (st == KV_OK) kv_layer_free(&L);
    }
    CHECK(st == KV_ERR_INPUT, "%s: accepted (status %d)", name, st);
    CHECK(strstr(kv_last_error(), p), "%s: message does not name the file: %s", name, kv_last_error());
    CHECK(strstr(kv_last_error(), needle), "%s: message '%s' lacks '%s'", name, kv_last_error(), needle);
    return KV_TEST_PASS;
}

int test_loader_rejects_malformed(void) {
    bad_spec s = good();
    s.skip_attr = "num_kv_heads";
    if (expect_bad("noattr.h5", s, 0, "missing attribute 'num_kv_heads'")) return KV_TEST_FAIL;
    s = good(); s.skip_attr = "rope";
    if (expect_bad("norope.h5", s, 0, "missing root attribute 'rope'")) return KV_TEST_FAIL;
    s = good(); s.bad_k_tokens = 1;
    if (expect_bad("shape.h5", s, 0, "/layers/L3/k: expected shape [2, 20, 8]")) return KV_TEST_FAIL;
    s = good(); s.P = 21;
    if (expect_bad("p_gt_t.h5", s, 0, "prefill_len")) return KV_TEST_FAIL;
    s = good(); s.Hq = 3; s.Hkv = 2;
    if (expect_bad("group.h5", s, 0, "not a multiple")) return KV_TEST_FAIL;
    s = good(); s.nan_at = 2 * 8 + 5; /* head 0, token 2, dim 5 */
    if (expect_bad("nan.h5", s, 1, "/layers/L3/v: non-finite value nan at [head 0, token 2, dim 5]")) return KV_TEST_FAIL;
    s = good(); s.int_k = 1;
    if (expect_bad("intk.h5", s, 0, "expected float16, bfloat16, float32 or float64 values, found a 4-byte integer type")) return KV_TEST_FAIL;
    /* truncated: a good file cut to half its size */
    s = good(); s.T = 400;
    const char *full = tpath("full.h5"), *cut = tpath("truncated.h5");
    write_trace(full, &s);
    FILE *f = fopen(full, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n);
    CHECK(fread(buf, 1, n, f) == (size_t)n, "read back");
    fclose(f);
    f = fopen(cut, "wb");
    fwrite(buf, 1, n / 2, f);
    fclose(f);
    free(buf);
    kv_trace_info in;
    kv_status st = kv_trace_open(cut, &in);
    if (st == KV_OK) {
        kv_layer L;
        st = kv_trace_load_layer(&in, 0, &L);
        if (st == KV_OK) kv_layer_free(&L);
    }
    CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), cut), "truncated file accepted or unnamed: %s", kv_last_error());
    /* not HDF5 at all */
    const char *txt = tpath("text.h5");
    f = fopen(txt, "w");
    fputs("this is not an HDF5 file\n", f);
    fclose(f);
    st = kv_trace_open(txt, &in);
    CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), "not an HDF5 file"), "text file: %s", kv_last_error());
    st = kv_trace_open(tpath("missing.h5"), &in);
    CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), "no such file"), "missing file: %s", kv_last_error());
    return KV_TEST_PASS;
}
