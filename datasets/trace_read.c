/* trace_read.c: opening, validating and loading kvtrace v1 files
 * (datasets/TRACE_FORMAT.md). The HDF5 library's own error stack is
 * silenced; each failure becomes one message naming the file, the object,
 * what was expected and what was found. float16 data is read as raw
 * 16-bit words and converted through a 65536-entry table, one head at a
 * time, so loading costs one pass and one head of scratch. */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv_trace.h"

#define BAD(...) kv_fail(KV_ERR_INPUT, __VA_ARGS__)

static void silence_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

static kv_status attr_int(hid_t obj, const char *path, const char *obj_name, const char *name, int *out) {
    if (H5Aexists(obj, name) <= 0)
        return BAD("%s: %s: missing attribute '%s' (expected an integer)", path, obj_name, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT), t = H5Aget_type(a), sp = H5Aget_space(a);
    kv_status st = KV_OK;
    long long v = 0;
    if (H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_npoints(sp) != 1)
        st = BAD("%s: %s: attribute '%s' must be a scalar integer", path, obj_name, name);
    else if (H5Aread(a, H5T_NATIVE_LLONG, &v) < 0)
        st = BAD("%s: %s: cannot read attribute '%s'", path, obj_name, name);
    else if (v < -2147483647LL || v > 2147483647LL)
        st = BAD("%s: %s: attribute '%s' = %lld does not fit in 32 bits", path, obj_name, name, v);
    H5Sclose(sp); H5Tclose(t); H5Aclose(a);
    *out = (int)v;
    return st;
}

static kv_status attr_float(hid_t obj, const char *path, const char *name, float *out) {
    if (H5Aexists(obj, name) <= 0) return BAD("%s: missing root attribute '%s' (expected a float)", path, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT), t = H5Aget_type(a), sp = H5Aget_space(a);
    kv_status st = KV_OK;
    double v = 0;
    H5T_class_t c = H5Tget_class(t);
    if ((c != H5T_FLOAT && c != H5T_INTEGER) || H5Sget_simple_extent_npoints(sp) != 1)
        st = BAD("%s: root attribute '%s' must be a scalar number", path, name);
    else if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0) st = BAD("%s: cannot read root attribute '%s'", path, name);
    H5Sclose(sp); H5Tclose(t); H5Aclose(a);
    *out = (float)v;
    return st;
}

static kv_status attr_string(hid_t obj, const char *path, const char *name, char *out, size_t cap) {
    if (H5Aexists(obj, name) <= 0) return BAD("%s: missing root attribute '%s' (expected a string)", path, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT), t = H5Aget_type(a);
    kv_status st = KV_OK;
    out[0] = 0;
    if (H5Tget_class(t) != H5T_STRING) st = BAD("%s: root attribute '%s' must be a string", path, name);
    else if (H5Tis_variable_str(t) > 0) {
        char *s = NULL;
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t)); /* h5py writes UTF-8; HDF5 will not convert character sets */
        if (H5Aread(a, mt, &s) < 0 || !s) st = BAD("%s: cannot read root attribute '%s'", path, name);
        else { snprintf(out, cap, "%s", s); H5free_memory(s); }
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(t);
        char *buf = kv_calloc(n + 1, 1, "string attribute");
        if (!buf) st = KV_ERR_NOMEM;
        else {
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, n + 1);
            H5Tset_cset(mt, H5Tget_cset(t));
            if (H5Aread(a, mt, buf) < 0) st = BAD("%s: cannot read root attribute '%s'", path, name);
            else snprintf(out, cap, "%s", buf);
            H5Tclose(mt);
            free(buf);
        }
    }
    H5Tclose(t); H5Aclose(a);
    return st;
}

/* dtype: 2 float16, 4 float32; checks rank-3 shape [H, T, D]. */
static kv_status check_dataset(hid_t g, const char *path, const char *lname, const char *dname, int H, int T, int D,
                               int *dtype_size) {
    hid_t d = H5Dopen2(g, dname, H5P_DEFAULT);
    if (d < 0) return BAD("%s: /layers/%s/%s: cannot open dataset", path, lname, dname);
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    kv_status st = KV_OK;
    hsize_t dims[8] = {0};
    int rank = H5Sget_simple_extent_ndims(sp);
    size_t size = H5Tget_size(t);
    if (H5Tget_class(t) != H5T_FLOAT || (size != 2 && size != 4))
        st = BAD("%s: /layers/%s/%s: expected float16 or float32, found a %zu-byte %s type", path, lname, dname,
                 size, H5Tget_class(t) == H5T_INTEGER ? "integer" : "non-float");
    else if (size == 2 && H5Tget_order(t) != H5T_ORDER_LE)
        st = BAD("%s: /layers/%s/%s: float16 data must be little-endian", path, lname, dname);
    else if (rank != 3 || H5Sget_simple_extent_dims(sp, dims, NULL) != 3 || dims[0] != (hsize_t)H ||
             dims[1] != (hsize_t)T || dims[2] != (hsize_t)D) {
        char found[128];
        if (rank == 3) snprintf(found, sizeof found, "[%llu, %llu, %llu]", (unsigned long long)dims[0],
                                (unsigned long long)dims[1], (unsigned long long)dims[2]);
        else snprintf(found, sizeof found, "rank %d", rank);
        st = BAD("%s: /layers/%s/%s: expected shape [%d, %d, %d] ([heads, num_tokens, head_dim]), found %s", path,
                 lname, dname, H, T, D, found);
    }
    *dtype_size = (int)size;
    H5Sclose(sp); H5Tclose(t); H5Dclose(d);
    return st;
}

static int layer_number(const char *name) {
    if (name[0] != 'L' || !name[1]) return -1;
    for (const char *p = name + 1; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    if (name[1] == '0' && name[2]) return -1; /* no padding */
    return atoi(name + 1);
}

typedef struct { kv_trace_info *info; kv_status st; hid_t layers; } scan_ctx;

static herr_t scan_layer(hid_t grp, const char *name, const H5L_info_t *li, void *op) {
    (void)grp; (void)li;
    scan_ctx *c = op;
    kv_trace_info *in = c->info;
    const char *path = in->path;
    int idx = layer_number(name);
    if (idx < 0) { c->st = BAD("%s: /layers/%s: expected a layer group named L<index> (e.g. L14)", path, name); return 1; }
    if (in->num_layers >= KV_MAX_LAYERS) { c->st = BAD("%s: more than %d layers", path, KV_MAX_LAYERS); return 1; }
    hid_t g = H5Gopen2(c->layers, name, H5P_DEFAULT);
    if (g < 0) { c->st = BAD("%s: /layers/%s: expected a group", path, name); return 1; }
    int n = in->num_layers, li_attr, qs, ks, vs = 0;
    char obj[128];
    snprintf(obj, sizeof obj, "/layers/%s", name);
    kv_status st = attr_int(g, path, obj, "layer_index", &li_attr);
    if (st == KV_OK && li_attr != idx)
        st = BAD("%s: /layers/%s: attribute layer_index is %d, expected %d (the group's name)", path, name, li_attr, idx);
    if (st == KV_OK) st = check_dataset(g, path, name, "q", in->num_q_heads, in->num_tokens, in->head_dim, &qs);
    if (st == KV_OK) st = check_dataset(g, path, name, "k", in->num_kv_heads, in->num_tokens, in->head_dim, &ks);
    int has_v = H5Lexists(g, "v", H5P_DEFAULT) > 0;
    if (st == KV_OK && has_v) st = check_dataset(g, path, name, "v", in->num_kv_heads, in->num_tokens, in->head_dim, &vs);
    H5Gclose(g);
    if (st != KV_OK) { c->st = st; return 1; }
    snprintf(in->layer_names[n], KV_NAME_MAX, "%s", name);
    in->layer_index[n] = idx;
    in->layer_has_v[n] = has_v;
    in->layer_half[n] = ks == 2;
    in->num_layers++;
    return 0;
}

static int cmp_layer(const void *a, const void *b) {
    return layer_number((const char *)a) - layer_number((const char *)b);
}

static kv_status check_tokens(hid_t f, kv_trace_info *in) {
    in->has_tokens = H5Lexists(f, "tokens", H5P_DEFAULT) > 0;
    if (!in->has_tokens) return KV_OK;
    hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
    if (d < 0) return BAD("%s: /tokens: cannot open dataset", in->path);
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    hsize_t dims[4] = {0};
    int rank = H5Sget_simple_extent_ndims(sp);
    kv_status st = KV_OK;
    if (H5Tget_class(t) != H5T_INTEGER) st = BAD("%s: /tokens: expected int32 token ids, found a non-integer type", in->path);
    else if (rank != 1 || H5Sget_simple_extent_dims(sp, dims, NULL) != 1 || dims[0] != (hsize_t)in->num_tokens)
        st = BAD("%s: /tokens: expected shape [%d] (num_tokens), found rank %d length %llu", in->path,
                 in->num_tokens, rank, (unsigned long long)dims[0]);
    H5Sclose(sp); H5Tclose(t); H5Dclose(d);
    return st;
}

kv_status kv_trace_open(const char *path, kv_trace_info *in) {
    memset(in, 0, sizeof *in);
    snprintf(in->path, sizeof in->path, "%s", path);
    silence_hdf5();
    struct stat sb;
    if (stat(path, &sb) != 0) return BAD("%s: no such file", path);
    in->file_bytes = (long long)sb.st_size;
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) return BAD("%s: not an HDF5 file (expected a kvtrace v1 HDF5 file)", path);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return BAD("%s: cannot open as HDF5 (the file is truncated or corrupt)", path);
    kv_status st = attr_int(f, path, "root", "kvtrace_version", &in->version);
    if (st == KV_OK && in->version != 1)
        st = BAD("%s: root attribute kvtrace_version: expected 1, found %d", path, in->version);
    if (st == KV_OK) st = attr_string(f, path, "model", in->model, sizeof in->model);
    if (st == KV_OK) st = attr_string(f, path, "description", in->description, sizeof in->description);
    if (st == KV_OK) st = attr_int(f, path, "root", "head_dim", &in->head_dim);
    if (st == KV_OK) st = attr_int(f, path, "root", "num_q_heads", &in->num_q_heads);
    if (st == KV_OK) st = attr_int(f, path, "root", "num_kv_heads", &in->num_kv_heads);
    if (st == KV_OK) st = attr_int(f, path, "root", "num_tokens", &in->num_tokens);
    if (st == KV_OK) st = attr_int(f, path, "root", "prefill_len", &in->prefill_len);
    if (st == KV_OK) st = attr_string(f, path, "rope", in->rope, sizeof in->rope);
    if (st == KV_OK) st = attr_float(f, path, "softmax_scale", &in->softmax_scale);
    if (st == KV_OK) {
        if (in->head_dim < 1 || in->head_dim > 1024)
            st = BAD("%s: root attribute head_dim: expected 1..1024, found %d", path, in->head_dim);
        else if (in->num_kv_heads < 1 || in->num_q_heads < 1)
            st = BAD("%s: root attributes num_q_heads=%d, num_kv_heads=%d: expected both >= 1", path,
                     in->num_q_heads, in->num_kv_heads);
        else if (in->num_q_heads % in->num_kv_heads)
            st = BAD("%s: num_q_heads=%d is not a multiple of num_kv_heads=%d", path, in->num_q_heads,
                     in->num_kv_heads);
        else if (in->num_tokens < 1)
            st = BAD("%s: root attribute num_tokens: expected >= 1, found %d", path, in->num_tokens);
        else if (in->prefill_len < 1 || in->prefill_len > in->num_tokens)
            st = BAD("%s: root attribute prefill_len: expected 1 <= prefill_len <= num_tokens (%d), found %d", path,
                     in->num_tokens, in->prefill_len);
        else if (strcmp(in->rope, "applied") && strcmp(in->rope, "none"))
            st = BAD("%s: root attribute rope: expected 'applied' or 'none', found '%s'", path, in->rope);
        else if (!isfinite(in->softmax_scale) || in->softmax_scale <= 0)
            st = BAD("%s: root attribute softmax_scale: expected a finite positive number, found %g", path,
                     in->softmax_scale);
    }
    if (st == KV_OK) st = check_tokens(f, in);
    if (st == KV_OK) {
        hid_t layers = H5Lexists(f, "layers", H5P_DEFAULT) > 0 ? H5Gopen2(f, "layers", H5P_DEFAULT) : -1;
        if (layers < 0) st = BAD("%s: missing group /layers (expected at least one /layers/L<i>)", path);
        else {
            scan_ctx c = {in, KV_OK, layers};
            hsize_t it = 0;
            if (H5Literate(layers, H5_INDEX_NAME, H5_ITER_INC, &it, scan_layer, &c) < 0 && c.st == KV_OK)
                c.st = BAD("%s: cannot list /layers", path);
            st = c.st;
            if (st == KV_OK && in->num_layers == 0) st = BAD("%s: /layers is empty (expected at least one L<i>)", path);
            H5Gclose(layers);
        }
    }
    if (st == KV_OK) { /* numeric order: L2 before L10 */
        for (int i = 1; i < in->num_layers; i++)
            for (int j = i; j > 0 && cmp_layer(in->layer_names[j - 1], in->layer_names[j]) > 0; j--) {
                char tmp[KV_NAME_MAX];
                memcpy(tmp, in->layer_names[j], KV_NAME_MAX);
                memcpy(in->layer_names[j], in->layer_names[j - 1], KV_NAME_MAX);
                memcpy(in->layer_names[j - 1], tmp, KV_NAME_MAX);
                int ti = in->layer_index[j]; in->layer_index[j] = in->layer_index[j - 1]; in->layer_index[j - 1] = ti;
                ti = in->layer_has_v[j]; in->layer_has_v[j] = in->layer_has_v[j - 1]; in->layer_has_v[j - 1] = ti;
                ti = in->layer_half[j]; in->layer_half[j] = in->layer_half[j - 1]; in->layer_half[j - 1] = ti;
            }
    }
    H5Fclose(f);
    return st;
}

int kv_trace_find_layer(const kv_trace_info *in, const char *name) {
    char want[KV_NAME_MAX];
    snprintf(want, sizeof want, "%s%s", name[0] == 'L' ? "" : "L", name);
    for (int i = 0; i < in->num_layers; i++)
        if (strcmp(in->layer_names[i], want) == 0) return i;
    return -1;
}

/* Reads dataset [H, T, D] into float32 out, one head at a time. */
static kv_status read_dataset(hid_t g, const kv_trace_info *in, const char *lname, const char *dname, int H,
                              float *out) {
    int T = in->num_tokens, D = in->head_dim;
    size_t per_head = (size_t)T * D;
    hid_t d = H5Dopen2(g, dname, H5P_DEFAULT);
    if (d < 0) return BAD("%s: /layers/%s/%s: cannot open dataset", in->path, lname, dname);
    hid_t ft = H5Dget_type(d), fsp = H5Dget_space(d);
    int half = H5Tget_size(ft) == 2;
    hsize_t cnt[3] = {1, (hsize_t)T, (hsize_t)D};
    hid_t msp = H5Screate_simple(3, cnt, NULL);
    uint16_t *raw = half ? kv_malloc(per_head * sizeof(uint16_t), "float16 read buffer") : NULL;
    float *lut = half ? kv_malloc(65536 * sizeof(float), "float16 table") : NULL;
    kv_status st = (half && (!raw || !lut)) ? KV_ERR_NOMEM : KV_OK;
    if (lut) for (uint32_t u = 0; u < 65536; u++) lut[u] = kv_half_to_float((uint16_t)u);
    for (int h = 0; h < H && st == KV_OK; h++) {
        hsize_t off[3] = {(hsize_t)h, 0, 0};
        float *dst = out + (size_t)h * per_head;
        H5Sselect_hyperslab(fsp, H5S_SELECT_SET, off, NULL, cnt, NULL);
        herr_t rc = half ? H5Dread(d, ft, msp, fsp, H5P_DEFAULT, raw)
                         : H5Dread(d, H5T_NATIVE_FLOAT, msp, fsp, H5P_DEFAULT, dst);
        if (rc < 0) {
            st = BAD("%s: /layers/%s/%s: read failed at head %d (truncated or corrupt data)", in->path, lname, dname, h);
            break;
        }
        if (half) for (size_t i = 0; i < per_head; i++) dst[i] = lut[raw[i]];
        for (size_t i = 0; i < per_head; i++)
            if (!isfinite(dst[i])) {
                st = BAD("%s: /layers/%s/%s: non-finite value %g at [head %d, token %zu, dim %zu] (values must be "
                         "finite)", in->path, lname, dname, dst[i], h, i / D, i % D);
                break;
            }
    }
    free(raw); free(lut);
    H5Sclose(msp); H5Sclose(fsp); H5Tclose(ft); H5Dclose(d);
    return st;
}

kv_status kv_trace_load_layer(const kv_trace_info *in, int layer, kv_layer *L) {
    memset(L, 0, sizeof *L);
    if (layer < 0 || layer >= in->num_layers) return kv_fail(KV_ERR_INTERNAL, "layer slot %d out of range", layer);
    silence_hdf5();
    const char *ln = in->layer_names[layer];
    L->Hq = in->num_q_heads; L->Hkv = in->num_kv_heads; L->T = in->num_tokens; L->D = in->head_dim;
    L->half = in->layer_half[layer];
    size_t nq = (size_t)L->Hq * L->T * L->D, nk = (size_t)L->Hkv * L->T * L->D;
    L->q = kv_malloc(nq * sizeof(float), "layer queries");
    L->k = kv_malloc(nk * sizeof(float), "layer keys");
    if (in->layer_has_v[layer]) L->v = kv_malloc(nk * sizeof(float), "layer values");
    if (!L->q || !L->k || (in->layer_has_v[layer] && !L->v)) { kv_layer_free(L); return KV_ERR_NOMEM; }
    hid_t f = H5Fopen(in->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) { kv_layer_free(L); return BAD("%s: cannot open as HDF5", in->path); }
    char gp[KV_NAME_MAX + 16];
    snprintf(gp, sizeof gp, "/layers/%s", ln);
    hid_t g = H5Gopen2(f, gp, H5P_DEFAULT);
    kv_status st = g < 0 ? BAD("%s: %s: cannot open group", in->path, gp) : KV_OK;
    if (st == KV_OK) st = read_dataset(g, in, ln, "q", L->Hq, L->q);
    if (st == KV_OK) st = read_dataset(g, in, ln, "k", L->Hkv, L->k);
    if (st == KV_OK && L->v) st = read_dataset(g, in, ln, "v", L->Hkv, L->v);
    if (g >= 0) H5Gclose(g);
    H5Fclose(f);
    if (st != KV_OK) kv_layer_free(L);
    return st;
}

void kv_layer_free(kv_layer *L) {
    free(L->q); free(L->k); free(L->v);
    L->q = L->k = L->v = NULL;
}

kv_status kv_trace_load_tokens(const kv_trace_info *in, int **tokens) {
    *tokens = NULL;
    if (!in->has_tokens) return KV_OK;
    silence_hdf5();
    int *t = kv_malloc((size_t)in->num_tokens * sizeof(int), "tokens");
    if (!t) return KV_ERR_NOMEM;
    hid_t f = H5Fopen(in->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = f >= 0 ? H5Dopen2(f, "tokens", H5P_DEFAULT) : -1;
    kv_status st = KV_OK;
    if (d < 0 || H5Dread(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t) < 0)
        st = BAD("%s: /tokens: read failed", in->path);
    if (d >= 0) H5Dclose(d);
    if (f >= 0) H5Fclose(f);
    if (st != KV_OK) { free(t); return st; }
    *tokens = t;
    return KV_OK;
}
