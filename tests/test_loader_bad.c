/* test_loader_bad.c: the loader against the hostile inputs of issue 13.
 * Each case would have caught the bug it is named after: string
 * attributes stored as arrays (an overflow), long paths (silently cut),
 * resource bombs (huge declared T, huge chunks, a named pipe), types by
 * their real layout (bfloat16 read as float16, float64 called
 * "non-float", big-endian float16 refused), strict layer names
 * (L4294967310 taken as L14), unknown /layers members (rejected against
 * the spec), messages that say what was found, and the regression corpus
 * tests/corpus/loader/ (inputs that crashed or hung libhdf5 or the
 * loader), replayed in process and through the binary. Files are written
 * here with the HDF5 API directly. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../datasets/kv_trace.h"
#include "kv_test.h"

enum { HQ = 2, HKV = 1, T = 8, P = 4, D = 4 };

typedef struct {
    const char *skip;            /* root attribute or dataset ("k") left out */
    hid_t dtype;                 /* file type of q/k/v (default IEEE float32 LE) */
    void (*tweak)(hid_t f, hid_t layers, hid_t g); /* adds or changes members */
} spec;

static float val(int h, int t, int d) { return 0.25f * (h + 1) - 0.125f * t + 0.5f * d; } /* exact in bf16/f16 */

static void attr_i(hid_t o, const char *n, long long v) {
    hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(o, n, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_LLONG, &v);
    H5Aclose(a);
    H5Sclose(sp);
}

static void attr_vs(hid_t o, const char *n, const char *v) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(o, n, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, &v);
    H5Aclose(a); H5Sclose(sp); H5Tclose(t);
}

static void dset(hid_t g, const char *name, int H, hid_t ft) {
    hsize_t dims[3] = {(hsize_t)H, T, D};
    float x[HQ * T * D];
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int d = 0; d < D; d++) x[(h * T + t) * D + d] = val(h, t, d);
    hid_t sp = H5Screate_simple(3, dims, NULL);
    hid_t ds = H5Dcreate2(g, name, ft, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    H5Dclose(ds); H5Sclose(sp);
}

static int skip(const spec *s, const char *n) { return s->skip && !strcmp(s->skip, n); }

static void build(const char *path, const spec *s) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const char *ints[] = {"kvtrace_version", "head_dim", "num_q_heads", "num_kv_heads", "num_tokens", "prefill_len"};
    long long iv[] = {1, D, HQ, HKV, T, P};
    for (int i = 0; i < 6; i++)
        if (!skip(s, ints[i])) attr_i(f, ints[i], iv[i]);
    if (!skip(s, "model")) attr_vs(f, "model", "m");
    if (!skip(s, "description")) attr_vs(f, "description", "d");
    if (!skip(s, "rope")) attr_vs(f, "rope", "none");
    if (!skip(s, "softmax_scale")) {
        hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(f, "softmax_scale", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        float sc = 0.5f;
        H5Awrite(a, H5T_NATIVE_FLOAT, &sc);
        H5Aclose(a); H5Sclose(sp);
    }
    hid_t lg = H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t g = H5Gcreate2(lg, "L1", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    attr_i(g, "layer_index", 1);
    hid_t ft = s->dtype > 0 ? s->dtype : H5T_IEEE_F32LE;
    if (!skip(s, "q")) dset(g, "q", HQ, ft);
    if (!skip(s, "k")) dset(g, "k", HKV, ft);
    if (!skip(s, "v")) dset(g, "v", HKV, ft);
    if (s->tweak) s->tweak(f, lg, g);
    H5Gclose(g); H5Gclose(lg); H5Fclose(f);
}

static const char *tp(const char *name) {
    static char buf[4][700];
    static int i;
    char *p = buf[i++ % 4];
    snprintf(p, sizeof buf[0], "%s/bad-%s", kv_test_tmpdir(), name);
    return p;
}

/* Opens and loads every layer; the first failure's status. */
static kv_status open_load(const char *path, kv_trace_info *in) {
    kv_status st = kv_trace_open(path, in);
    for (int i = 0; st == KV_OK && i < in->num_layers; i++) {
        kv_layer L;
        st = kv_trace_load_layer(in, i, &L);
        if (st == KV_OK) kv_layer_free(&L);
    }
    int *tok = NULL;
    if (st == KV_OK) st = kv_trace_load_tokens(in, &tok);
    free(tok);
    return st;
}

static int expect(const char *name, const spec *s, const char *needle) {
    static kv_trace_info in;
    const char *p = tp(name);
    build(p, s);
    kv_status st = open_load(p, &in);
    CHECK(st == KV_ERR_INPUT, "%s: status %d (%s), want a refusal containing '%s'", name, st,
          st ? kv_last_error() : "accepted", needle);
    CHECK(strstr(kv_last_error(), p), "%s: message does not name the file: %s", name, kv_last_error());
    CHECK(strstr(kv_last_error(), needle), "%s: message '%s' lacks '%s'", name, kv_last_error(), needle);
    return KV_TEST_PASS;
}

/* ---- 1: string attributes stored as arrays ---- */
static void model_vlen_array(hid_t f, hid_t l, hid_t g) {
    (void)l; (void)g;
    H5Adelete(f, "model");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hsize_t n = 3;
    const char *v[3] = {"a", "b", "c"};
    hid_t sp = H5Screate_simple(1, &n, NULL), a = H5Acreate2(f, "model", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, v);
    H5Aclose(a); H5Sclose(sp); H5Tclose(t);
}
static void rope_fixed_array(hid_t f, hid_t l, hid_t g) {
    (void)l; (void)g;
    H5Adelete(f, "rope");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 8);
    hsize_t n = 64; /* 512 bytes of strings into a 9-byte buffer, before the fix */
    char v[64][8];
    memset(v, 'x', sizeof v);
    hid_t sp = H5Screate_simple(1, &n, NULL), a = H5Acreate2(f, "rope", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, v);
    H5Aclose(a); H5Sclose(sp); H5Tclose(t);
}
static void desc_one_element(hid_t f, hid_t l, hid_t g) {
    (void)l; (void)g;
    H5Adelete(f, "description");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 5);
    hsize_t n = 1;
    hid_t sp = H5Screate_simple(1, &n, NULL), a = H5Acreate2(f, "description", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, "hello");
    H5Aclose(a); H5Sclose(sp); H5Tclose(t);
}
static void desc_too_long(hid_t f, hid_t l, hid_t g) {
    (void)l; (void)g;
    H5Adelete(f, "description");
    static char big[6000];
    memset(big, 'y', sizeof big - 1);
    attr_vs(f, "description", big);
}

int test_loader_string_attr_arrays(void) {
    spec s = {.tweak = model_vlen_array};
    if (expect("vlen-array.h5", &s, "root attribute 'model' must be a single string, found an array of 3 "
                                    "variable-length strings")) return KV_TEST_FAIL;
    s.tweak = rope_fixed_array;
    if (expect("fixed-array.h5", &s, "root attribute 'rope' must be a single string, found an array of 64 "
                                     "fixed-length strings")) return KV_TEST_FAIL;
    s.tweak = desc_too_long;
    if (expect("long-desc.h5", &s, "root attribute 'description' is 5999 bytes long; at most 4095 are accepted"))
        return KV_TEST_FAIL;
    s.tweak = desc_one_element; /* an array of exactly one string is one string */
    const char *p = tp("one-elem.h5");
    build(p, &s);
    static kv_trace_info in;
    CHECK_OK(kv_trace_open(p, &in));
    CHECK(!strcmp(in.description, "hello") && !strcmp(in.model, "m") && !strcmp(in.rope, "none"), "strings '%s' '%s'",
          in.description, in.model);
    return KV_TEST_PASS;
}

/* ---- 1: paths longer than the old 1024-byte buffer work; longer than PATH_MAX are refused ---- */
int test_loader_long_paths(void) {
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", kv_test_tmpdir());
    while (strlen(dir) < 1100) { /* components of 200 characters */
        size_t n = strlen(dir);
        dir[n] = '/';
        memset(dir + n + 1, 'd', 200);
        dir[n + 201] = 0;
        CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s", dir);
    }
    char path[2100];
    snprintf(path, sizeof path, "%s/t.h5", dir);
    spec s = {0};
    build(path, &s);
    static kv_trace_info in;
    CHECK_OK(open_load(path, &in)); /* the old reader cut in->path at 1023 characters and failed (or read another file) */
    CHECK(!strcmp(in.path, path), "path kept whole (%zu characters)", strlen(path));
    /* the writer (synth, slice) at the same length, and refusing what it cannot write whole */
    char wpath[2100];
    snprintf(wpath, sizeof wpath, "%s/w.h5", dir);
    kv_trace_spec ws = {.model = "m", .description = "d", .rope = "none", .head_dim = 2, .num_q_heads = 1,
                        .num_kv_heads = 1, .num_tokens = 2, .prefill_len = 1, .softmax_scale = 1, .chunk_tokens = 2};
    kv_trace_writer *w = NULL;
    float x[4] = {1, 2, 3, 4};
    CHECK_OK(kv_trace_writer_open(wpath, &ws, &w));
    CHECK_OK(kv_trace_writer_layer(w, 0, 0));
    CHECK_OK(kv_trace_writer_rows(w, 0, 2, x, x, NULL));
    CHECK_OK(kv_trace_writer_close(w, 1));
    CHECK_OK(kv_trace_open(wpath, &in));
    static char huge[KV_PATH_MAX + 100];
    memset(huge, 'p', sizeof huge - 1);
    kv_status st = kv_trace_open(huge, &in);
    CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), "trace path is 4195 characters long; at most 4095"), "%s",
          kv_last_error());
    st = kv_trace_writer_open(huge, &ws, &w); /* refused, whatever the wording */
    if (st == KV_OK) kv_trace_writer_close(w, 0);
    CHECK(st != KV_OK, "a %zu-character output path was accepted", strlen(huge));
    return KV_TEST_PASS;
}

/* ---- 3: resource bombs ---- */
static hsize_t bomb_chunk = 256;
static void huge_t_unwritten(hid_t f, hid_t l, hid_t g) {
    (void)l;
    long long big = 4194304;
    hid_t a = H5Aopen(f, "num_tokens", H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_LLONG, &big);
    H5Aclose(a);
    const char *names[] = {"q", "k", "v"};
    int heads[] = {HQ, HKV, HKV};
    for (int i = 0; i < 3; i++) { /* declared [H, 4M, D], chunked, nothing written: a few KB on disk */
        H5Ldelete(g, names[i], H5P_DEFAULT);
        hsize_t dims[3] = {(hsize_t)heads[i], (hsize_t)big, D}, ch[3] = {1, bomb_chunk, D};
        hid_t sp = H5Screate_simple(3, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(pl, 3, ch);
        H5Pset_deflate(pl, 1);
        hid_t d = H5Dcreate2(g, names[i], H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
        H5Dclose(d); H5Pclose(pl); H5Sclose(sp);
    }
}
static void contiguous_unwritten(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)l;
    H5Ldelete(g, "k", H5P_DEFAULT);
    hsize_t dims[3] = {HKV, T, D};
    hid_t sp = H5Screate_simple(3, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_alloc_time(pl, H5D_ALLOC_TIME_LATE);
    hid_t d = H5Dcreate2(g, "k", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Dclose(d); H5Pclose(pl); H5Sclose(sp);
}
static void huge_chunk(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)l;
    H5Ldelete(g, "v", H5P_DEFAULT);
    hsize_t dims[3] = {HKV, T, D}, maxd[3] = {H5S_UNLIMITED, H5S_UNLIMITED, H5S_UNLIMITED}, ch[3] = {1, 1 << 26, D};
    hid_t sp = H5Screate_simple(3, dims, maxd), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 3, ch); /* 1 GiB chunks for a 128-byte dataset */
    H5Pset_deflate(pl, 1);
    hid_t d = H5Dcreate2(g, "v", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Dclose(d); H5Pclose(pl); H5Sclose(sp);
}

static void gzip_bomb(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)l;
    H5Ldelete(g, "v", H5P_DEFAULT);
    hsize_t dims[3] = {HKV, T, D}, maxd[3] = {H5S_UNLIMITED, H5S_UNLIMITED, H5S_UNLIMITED}, ch[3] = {1, 4096, D};
    hid_t sp = H5Screate_simple(3, dims, maxd), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 3, ch); /* 64 KiB chunks, within the 1 MiB allowance over the dataset */
    H5Pset_deflate(pl, 1);
    hid_t d = H5Dcreate2(g, "v", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    hsize_t off[3] = {0, 0, 0};
    const char raw[10] = {0x78, 0x9c}; /* 10 bytes claimed to inflate to 64 KiB: more than gzip can */
    H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, sizeof raw, raw);
    H5Dclose(d); H5Pclose(pl); H5Sclose(sp);
}

int test_loader_resource_bombs(void) {
    spec s = {.tweak = huge_t_unwritten};
    /* 32768 chunks declared: more than the file could index */
    if (expect("huge-t.h5", &s, "/layers/L1/q: declares 32768 chunks, more than a")) return KV_TEST_FAIL;
    bomb_chunk = 1 << 20; /* 8 chunks: indexable, but none stored */
    if (expect("huge-t2.h5", &s, "/layers/L1/q: 0 of its 8 chunks are stored")) return KV_TEST_FAIL;
    struct stat sb;
    CHECK(stat(tp("huge-t.h5"), &sb) == 0 && sb.st_size < 100000, "the bomb is small: %lld bytes", (long long)sb.st_size);
    s.tweak = contiguous_unwritten;
    if (expect("unwritten.h5", &s, "/layers/L1/k: declares 128 bytes but stores no data")) return KV_TEST_FAIL;
    s.tweak = gzip_bomb;
    if (expect("gzip-bomb.h5", &s, "/layers/L1/v: declares 65536 bytes in chunks that store only 10 bytes, beyond "
                                   "gzip's maximum ratio")) return KV_TEST_FAIL;
    s.tweak = huge_chunk;
    if (expect("huge-chunk.h5", &s, "/layers/L1/v: chunks of 1073741824 bytes ([1, 67108864, 4]) are larger than the "
                                    "whole dataset (128 bytes)")) return KV_TEST_FAIL;
    /* a named pipe: refused at once (HDF5 would block opening it forever) */
    const char *fifo = tp("fifo.h5");
    unlink(fifo);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    static kv_trace_info in;
    double t0 = kv_now();
    kv_status st = kv_trace_open(fifo, &in);
    CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), "expected a regular file, found a named pipe"), "%s",
          kv_last_error());
    CHECK(kv_now() - t0 < 1, "refused in %.1f s", kv_now() - t0);
    st = kv_trace_open(kv_test_tmpdir(), &in);
    CHECK(st == KV_ERR_INPUT && strstr(kv_last_error(), "found a directory"), "%s", kv_last_error());
    /* a layer bigger than the memory available is refused before allocating, with both numbers */
    const char *ok = tp("ok.h5");
    s = (spec){0};
    build(ok, &s);
    CHECK_OK(kv_trace_open(ok, &in));
    kv_test_env ev;
    kv_test_env_set(&ev, "KVBENCH_MEM_AVAILABLE", "100"); /* the layer needs 512 bytes */
    kv_layer L;
    st = kv_trace_load_layer(&in, 0, &L);
    kv_test_env_restore(&ev);
    if (st == KV_OK) kv_layer_free(&L);
    CHECK(st == KV_ERR_NOMEM && strstr(kv_last_error(), "/layers/L1: loading it needs 512 bytes (0.00 GB: q, k, v as "
                                       "float32: 2+2 heads x 8 tokens x 4 dims) but only 0.00 GB"), "%s", kv_last_error());
    /* asked for the float16 form, a float32 trace still loads (and is counted) as float32 */
    kv_test_env_set(&ev, "KVBENCH_MEM_AVAILABLE", "100");
    st = kv_trace_load_layer_as(&in, 0, KV_LAYER_F16, &L);
    kv_test_env_restore(&ev);
    if (st == KV_OK) kv_layer_free(&L);
    CHECK(st == KV_ERR_NOMEM && strstr(kv_last_error(), "needs 512 bytes (0.00 GB: q, k, v as float32"), "%s",
          kv_last_error());
    return KV_TEST_PASS;
}

/* ---- 4: types by their real layout, strict names, unknown members ---- */
static hid_t float_type(size_t size, size_t spos, size_t epos, size_t esize, size_t msize, size_t bias, H5T_order_t o) {
    hid_t t = H5Tcopy(size == 8 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE);
    if (size < H5Tget_size(t)) {
        H5Tset_fields(t, spos, epos, esize, 0, msize);
        H5Tset_precision(t, size * 8);
        H5Tset_size(t, size);
    } else {
        H5Tset_size(t, size);
        H5Tset_precision(t, size * 8);
        H5Tset_fields(t, spos, epos, esize, 0, msize);
    }
    H5Tset_ebias(t, bias);
    H5Tset_order(t, o);
    return t;
}

static int load_as(const char *name, hid_t ft, kv_dtype want, const char *info_name) {
    spec s = {.dtype = ft};
    const char *p = tp(name);
    build(p, &s);
    static kv_trace_info in;
    CHECK_OK(kv_trace_open(p, &in));
    CHECK(in.layer_dtype[0][0] == want && in.layer_dtype[0][1] == want && in.layer_dtype[0][2] == want,
          "%s: dtype %d, want %d", name, in.layer_dtype[0][1], want);
    CHECK(!strcmp(kv_dtype_name(in.layer_dtype[0][1]), info_name), "%s: named %s", name, kv_dtype_name(in.layer_dtype[0][1]));
    CHECK(in.layer_half[0] == (want == KV_DTYPE_F16), "%s: layer_half", name);
    kv_layer L;
    CHECK_OK(kv_trace_load_layer(&in, 0, &L));
    for (int h = 0; h < HQ; h++)
        for (int t = 0; t < T; t++)
            for (int d = 0; d < D; d++)
                CHECK(L.q[(h * T + t) * D + d] == val(h, t, d), "%s: q[%d][%d][%d] = %g, want %g", name, h, t, d,
                      L.q[(h * T + t) * D + d], val(h, t, d));
    CHECK(L.k[3 * D + 2] == val(0, 3, 2) && L.v[7 * D + 3] == val(0, 7, 3), "%s: k/v", name);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

static void v_f64_huge(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)l;
    H5Ldelete(g, "v", H5P_DEFAULT);
    hsize_t dims[3] = {HKV, T, D};
    double x[HKV * T * D] = {0};
    x[2 * D + 1] = 1e300; /* finite in float64, not in float32 */
    hid_t sp = H5Screate_simple(3, dims, NULL);
    hid_t d = H5Dcreate2(g, "v", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    H5Dclose(d); H5Sclose(sp);
}

static void layer_overflow_name(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)g;
    hid_t x = H5Gcreate2(l, "L4294967310", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT); /* atoi: 14 */
    attr_i(x, "layer_index", 14);
    H5Gclose(x);
}
static void layer_padded(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)g;
    hid_t x = H5Gcreate2(l, "L03", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(x);
}
static void unknown_members(hid_t f, hid_t l, hid_t g) {
    (void)f; (void)g;
    hid_t x = H5Gcreate2(l, "notes", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(x);
    hsize_t n = 3;
    hid_t sp = H5Screate_simple(1, &n, NULL), d = H5Dcreate2(l, "Lmeta", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d); H5Sclose(sp);
    H5Lcreate_soft("/nowhere", l, "readme", H5P_DEFAULT, H5P_DEFAULT);
}

int test_loader_types_and_names(void) {
    /* bfloat16: 1 sign, 8 exponent, 7 mantissa bits; was read as float16 (wrong values, "float16" in info) */
    hid_t bf16 = float_type(2, 15, 7, 8, 7, 127, H5T_ORDER_LE);
    if (load_as("bf16.h5", bf16, KV_DTYPE_BF16, "bfloat16")) return KV_TEST_FAIL;
    H5Tclose(bf16);
    hid_t bf16be = float_type(2, 15, 7, 8, 7, 127, H5T_ORDER_BE);
    if (load_as("bf16be.h5", bf16be, KV_DTYPE_BF16, "bfloat16")) return KV_TEST_FAIL;
    H5Tclose(bf16be);
    hid_t f16be = float_type(2, 15, 10, 5, 10, 15, H5T_ORDER_BE); /* was refused: "must be little-endian" */
    if (load_as("f16be.h5", f16be, KV_DTYPE_F16, "float16")) return KV_TEST_FAIL;
    H5Tclose(f16be);
    if (load_as("f64.h5", H5T_IEEE_F64LE, KV_DTYPE_F64, "float64")) return KV_TEST_FAIL; /* was "non-float" */
    if (load_as("f32be.h5", H5T_IEEE_F32BE, KV_DTYPE_F32, "float32")) return KV_TEST_FAIL;
    hid_t odd = float_type(2, 15, 9, 6, 9, 31, H5T_ORDER_LE); /* 6-bit exponent: no known format */
    spec s = {.dtype = odd};
    if (expect("odd-float.h5", &s, "found a 2-byte float with 6 exponent bits (bias 31) and 9 mantissa bits"))
        return KV_TEST_FAIL;
    H5Tclose(odd);
    s = (spec){.dtype = H5T_IEEE_F64LE, .tweak = v_f64_huge}; /* beyond float32: an error, not inf */
    if (expect("f64-huge.h5", &s, "/layers/L1/v: non-finite value inf at [head 0, token 2, dim 1] (values must be "
                                  "finite; float64 values must also fit in float32)")) return KV_TEST_FAIL;
    /* info names the real type */
    char cmd[800], out[4096], err[4096];
    snprintf(cmd, sizeof cmd, "%s info %s", kv_test_bin(), tp("bf16.h5"));
    CHECK(kv_test_sh(cmd, out, sizeof out, err, sizeof err) == 0 && strstr(out, "layers        1: L1(bfloat16)"),
          "info: %s%s", out, err);
    snprintf(cmd, sizeof cmd, "%s info %s", kv_test_bin(), tp("f64.h5"));
    CHECK(kv_test_sh(cmd, out, sizeof out, err, sizeof err) == 0 && strstr(out, "L1(float64)"), "info: %s%s", out, err);
    /* strict names */
    s = (spec){.tweak = layer_overflow_name};
    if (expect("l-overflow.h5", &s, "/layers/L4294967310: expected a layer group named L<index> with no padding"))
        return KV_TEST_FAIL;
    s.tweak = layer_padded;
    if (expect("l-padded.h5", &s, "/layers/L03: expected a layer group named L<index>")) return KV_TEST_FAIL;
    /* unknown members are ignored (TRACE_FORMAT.md) */
    s.tweak = unknown_members;
    const char *p = tp("unknown.h5");
    build(p, &s);
    static kv_trace_info in;
    CHECK_OK(open_load(p, &in));
    CHECK(in.num_layers == 1 && !strcmp(in.layer_names[0], "L1"), "layers: %d", in.num_layers);
    CHECK(kv_trace_find_layer(&in, "1") == 0 && kv_trace_find_layer(&in, "L1") == 0 &&
          kv_trace_find_layer(&in, "L01") < 0 && kv_trace_find_layer(&in, "") < 0, "find layer");
    return KV_TEST_PASS;
}

/* ---- 7: messages say what was expected and what was found ---- */
static void head_dim_float(hid_t f, hid_t l, hid_t g) {
    (void)l; (void)g;
    H5Adelete(f, "head_dim");
    hid_t sp = H5Screate(H5S_SCALAR), a = H5Acreate2(f, "head_dim", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    double v = 4;
    H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a); H5Sclose(sp);
}
static void k_group(hid_t f, hid_t l, hid_t g) { (void)f; (void)l; H5Gclose(H5Gcreate2(g, "k", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)); }
static void k_dangling(hid_t f, hid_t l, hid_t g) { (void)f; (void)l; H5Lcreate_soft("/layers/L1/gone", g, "k", H5P_DEFAULT, H5P_DEFAULT); }
static void k_external(hid_t f, hid_t l, hid_t g) { (void)f; (void)l; H5Lcreate_external("other.h5", "/secret", g, "k", H5P_DEFAULT, H5P_DEFAULT); }
static void k_soft_ok(hid_t f, hid_t l, hid_t g) { (void)f; (void)l; H5Lcreate_soft("/layers/L1/q2", g, "k", H5P_DEFAULT, H5P_DEFAULT); dset(g, "q2", HKV, H5T_IEEE_F32LE); }
static void no_layers(hid_t f, hid_t l, hid_t g) { (void)l; (void)g; H5Ldelete(f, "layers", H5P_DEFAULT); }

int test_loader_messages(void) {
    spec s = {.tweak = head_dim_float};
    if (expect("hd-float.h5", &s, "root: attribute 'head_dim' must be a scalar integer, found a scalar 8-byte float"))
        return KV_TEST_FAIL;
    s = (spec){.skip = "k"};
    if (expect("k-missing.h5", &s, "/layers/L1/k: expected a dataset, found nothing (missing)")) return KV_TEST_FAIL;
    s = (spec){.skip = "k", .tweak = k_group};
    if (expect("k-group.h5", &s, "/layers/L1/k: expected a dataset, found a group")) return KV_TEST_FAIL;
    s.tweak = k_dangling;
    if (expect("k-dangling.h5", &s, "/layers/L1/k: expected a dataset, found a dangling soft link to /layers/L1/gone"))
        return KV_TEST_FAIL;
    s.tweak = k_external;
    if (expect("k-external.h5", &s, "/layers/L1/k: expected a dataset, found an external link to other.h5:/secret"))
        return KV_TEST_FAIL;
    s.tweak = no_layers;
    if (expect("no-layers.h5", &s, "/layers: expected a group, found nothing (missing)")) return KV_TEST_FAIL;
    s.tweak = k_soft_ok; /* a soft link to a dataset in the file is fine */
    const char *p = tp("k-soft.h5");
    build(p, &s);
    static kv_trace_info in;
    CHECK_OK(open_load(p, &in));
    return KV_TEST_PASS;
}

/* ---- 5/6: the regression corpus: each input is refused cleanly ---- */
#ifndef KV_CORPUS_DIR
#define KV_CORPUS_DIR "tests/corpus/loader"
#endif

int test_loader_corpus(void) {
    DIR *dir = opendir(KV_CORPUS_DIR);
    CHECK(dir, "cannot open %s (run from the repository root)", KV_CORPUS_DIR);
    int n = 0;
    static kv_trace_info in;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.' || !strstr(e->d_name, ".h5")) continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", KV_CORPUS_DIR, e->d_name);
        double t0 = kv_now();
        kv_status st = open_load(p, &in);
        double dt = kv_now() - t0;
        CHECK(st == KV_ERR_INPUT, "%s: status %d (%s)", p, st, st ? kv_last_error() : "accepted");
        CHECK(strstr(kv_last_error(), p), "%s: message does not name the file: %s", p, kv_last_error());
        CHECK(dt < 12, "%s: took %.1f s", p, dt);
        n++;
    }
    closedir(dir);
    CHECK(n > 0, "no corpus inputs in %s", KV_CORPUS_DIR);
    return KV_TEST_PASS;
}

/* The same corpus through the binary: exit 2, one "kvbench: FILE: ..." line, in seconds. */
int test_cli_corpus(void) {
    char cmd[1024], out[4096], err[4096];
    snprintf(cmd, sizeof cmd, "ls %s/*.h5", KV_CORPUS_DIR);
    static char list[1 << 16];
    CHECK(kv_test_sh(cmd, list, sizeof list, err, sizeof err) == 0, "ls: %s", err);
    int n = 0;
    for (char *s = strtok(list, "\n"); s; s = strtok(NULL, "\n")) {
        snprintf(cmd, sizeof cmd, "timeout 20 %s info %s", kv_test_bin(), s);
        int rc = kv_test_sh(cmd, out, sizeof out, err, sizeof err);
        CHECK(rc == 2, "kvbench info %s: exit %d (124: hung; 139: segfault); stderr: %s", s, rc, err);
        char want[700];
        snprintf(want, sizeof want, "kvbench: %s: ", s);
        CHECK(strstr(err, want), "kvbench info %s: stderr lacks '%s': %s", s, want, err);
        n++;
    }
    CHECK(n > 0, "empty corpus");
    return KV_TEST_PASS;
}

/* The option-parser fuzz corpus (tests/corpus/cli/): each input, run through
 * the fuzz target in a child (so a crash fails this test, not the runner),
 * must end normally within 5 s. */
int kv_fuzz_cli(const uint8_t *data, size_t size);

int test_cli_fuzz_corpus(void) {
    DIR *dir = opendir("tests/corpus/cli");
    if (!dir) return KV_TEST_PASS; /* nothing found yet */
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "SIGNATURES")) continue;
        char p[600];
        snprintf(p, sizeof p, "tests/corpus/cli/%s", e->d_name);
        static unsigned char buf[1 << 16];
        FILE *f = fopen(p, "rb");
        CHECK(f, "open %s", p);
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stderr)) _exit(3);
            alarm(5);
            kv_fuzz_cli(buf, len);
            _exit(0);
        }
        int ws = 0;
        waitpid(pid, &ws, 0);
        CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s: the option parsers %s %d", p,
              WIFSIGNALED(ws) ? "died of signal" : "exited with", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
        n++;
    }
    closedir(dir);
    return KV_TEST_PASS;
}
