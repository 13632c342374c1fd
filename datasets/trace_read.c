/* trace_read.c: opening, validating and loading kvtrace v1 files
 * (datasets/TRACE_FORMAT.md). The HDF5 library's own error stack is
 * silenced; each failure becomes one message naming the file, the object,
 * what was expected and what was found. Every HDF5 call runs in a child
 * process (isolate.c), so corrupt metadata that crashes or hangs libhdf5
 * is an input error. Before anything is allocated, each dataset's declared
 * size is checked against its real storage and its type identified by its
 * bit layout (trace_check.c), and a layer's float32 copy is checked
 * against the memory available. float16 and bfloat16 convert exactly,
 * float64 is rounded to float32 (out of range: an error).
 * 16-bit data is read as raw words (byte order converted by HDF5) and
 * converted through a 65536-entry table, one head at a time. Unknown
 * members under /layers are ignored, as the spec requires; a name of the
 * form L<digits> must be a canonical, in-range layer group. */
#define _GNU_SOURCE
#include <errno.h>
#include <hdf5.h>
#include <omp.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trace_check.h"
#include "trace_fast.h"

#define BAD(...) kv_fail(KV_ERR_INPUT, __VA_ARGS__)

static void silence_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* Checks a rank-3 [H, T, D] float dataset; *dt its element type. */
static kv_status check_dataset(hid_t g, const kv_trace_info *in, const char *lname, const char *dname, int H,
                               kv_dtype *dt) {
    char obj[KV_NAME_MAX + 16];
    snprintf(obj, sizeof obj, "/layers/%s/%s", lname, dname);
    kv_status st = KV_OK;
    const char *path = in->path;
    int T = in->num_tokens, D = in->head_dim;
    hid_t d = kv_h5_open_member(g, path, obj, dname, 0, &st);
    if (d < 0) return st;
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    hsize_t dims[8] = {0};
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (t < 0 || sp < 0) st = BAD("%s: %s: unreadable type or shape (corrupt dataset header)", path, obj);
    else if (!(*dt = kv_h5_float_kind(t, path, obj))) st = KV_ERR_INPUT;
    else if (rank != 3 || H5Sget_simple_extent_dims(sp, dims, NULL) != 3 || dims[0] != (hsize_t)H ||
             dims[1] != (hsize_t)T || dims[2] != (hsize_t)D) {
        char found[128];
        if (rank == 3) snprintf(found, sizeof found, "[%llu, %llu, %llu]", (unsigned long long)dims[0],
                                (unsigned long long)dims[1], (unsigned long long)dims[2]);
        else snprintf(found, sizeof found, "rank %d", rank);
        st = BAD("%s: %s: expected shape [%d, %d, %d] ([heads, num_tokens, head_dim]), found %s", path, obj, H, T, D,
                 found);
    } else st = kv_h5_check_storage(d, path, obj, dims, 3, H5Tget_size(t), in->file_bytes);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Dclose(d);
    return st;
}

/* L<index>: 1 and the index when canonical and in range; 0 when the name is
 * not of that form (an unknown member); -1 when it is but malformed. */
static int layer_name(const char *name, int *idx) {
    if (name[0] != 'L' || !name[1]) return 0;
    for (const char *p = name + 1; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    if (name[1] == '0' && name[2]) return -1; /* padding */
    if (strlen(name + 1) > 10) return -1;
    long long v = strtoll(name + 1, NULL, 10);
    if (v > INT_MAX) return -1;
    *idx = (int)v;
    return 1;
}

typedef struct { kv_trace_info *info; kv_status st; hid_t layers; } scan_ctx;

static herr_t scan_layer(hid_t grp, const char *name, const H5L_info_t *li, void *op) {
    (void)grp; (void)li;
    scan_ctx *c = op;
    kv_trace_info *in = c->info;
    const char *path = in->path;
    int idx = -1, form = layer_name(name, &idx);
    if (form == 0) return 0; /* unknown member: readers ignore it (TRACE_FORMAT.md) */
    if (form < 0) {
        c->st = BAD("%s: /layers/%.80s: expected a layer group named L<index> with no padding and an index of at most "
                    "%d (e.g. L14)", path, name, INT_MAX);
        return 1;
    }
    if (in->num_layers >= KV_MAX_LAYERS) { c->st = BAD("%s: more than %d layers (the most this reader takes)", path, KV_MAX_LAYERS); return 1; }
    char obj[KV_NAME_MAX + 16];
    snprintf(obj, sizeof obj, "/layers/%s", name);
    kv_status st = KV_OK;
    hid_t g = kv_h5_open_member(c->layers, path, obj, name, 1, &st);
    if (g < 0) { c->st = st; return 1; }
    int n = in->num_layers, li_attr;
    kv_dtype qd = 0, kd = 0, vd = 0;
    st = kv_h5_attr_int(g, path, obj, "layer_index", &li_attr);
    if (st == KV_OK && li_attr != idx)
        st = BAD("%s: %s: attribute layer_index is %d, expected %d (the group's name)", path, obj, li_attr, idx);
    if (st == KV_OK) st = check_dataset(g, in, name, "q", in->num_q_heads, &qd);
    if (st == KV_OK) st = check_dataset(g, in, name, "k", in->num_kv_heads, &kd);
    int has_v = H5Lexists(g, "v", H5P_DEFAULT) > 0;
    if (st == KV_OK && has_v) st = check_dataset(g, in, name, "v", in->num_kv_heads, &vd);
    H5Gclose(g);
    if (st != KV_OK) { c->st = st; return 1; }
    snprintf(in->layer_names[n], KV_NAME_MAX, "%s", name);
    in->layer_index[n] = idx;
    in->layer_has_v[n] = has_v;
    in->layer_half[n] = kd == KV_DTYPE_F16;
    in->layer_dtype[n][0] = qd;
    in->layer_dtype[n][1] = kd;
    in->layer_dtype[n][2] = vd;
    in->num_layers++;
    return 0;
}

static kv_status check_tokens(hid_t f, kv_trace_info *in) {
    in->has_tokens = H5Lexists(f, "tokens", H5P_DEFAULT) > 0;
    if (!in->has_tokens) return KV_OK;
    kv_status st = KV_OK;
    hid_t d = kv_h5_open_member(f, in->path, "/tokens", "tokens", 0, &st);
    if (d < 0) return st;
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    hsize_t dims[4] = {0};
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    char found[128];
    if (t < 0 || sp < 0) st = BAD("%s: /tokens: unreadable type or shape (corrupt dataset header)", in->path);
    else if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) > 8) {
        kv_h5_describe_value(t, sp, found, sizeof found);
        st = BAD("%s: /tokens: expected int32 token ids, found %s", in->path, found);
    } else if (rank != 1 || H5Sget_simple_extent_dims(sp, dims, NULL) != 1 || dims[0] != (hsize_t)in->num_tokens)
        st = BAD("%s: /tokens: expected shape [%d] (num_tokens), found rank %d length %llu", in->path,
                 in->num_tokens, rank, (unsigned long long)dims[0]);
    else st = kv_h5_check_storage(d, in->path, "/tokens", dims, 1, H5Tget_size(t), in->file_bytes);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Dclose(d);
    return st;
}

static int cmp_layer_slot(const void *a, const void *b, void *ctx) {
    const kv_trace_info *in = ctx;
    int x = in->layer_index[*(const int *)a], y = in->layer_index[*(const int *)b];
    return (x > y) - (x < y);
}

static kv_status sort_layers(kv_trace_info *in) { /* numeric order: L2 before L10 */
    kv_trace_info *tmp = kv_malloc(sizeof *tmp, "layer list"); /* large: not on the stack */
    int order[KV_MAX_LAYERS];
    if (!tmp) return KV_ERR_NOMEM;
    for (int i = 0; i < in->num_layers; i++) order[i] = i;
    qsort_r(order, in->num_layers, sizeof(int), cmp_layer_slot, in);
    memcpy(tmp, in, sizeof *tmp);
    for (int i = 0; i < in->num_layers; i++) {
        int s = order[i];
        memcpy(in->layer_names[i], tmp->layer_names[s], KV_NAME_MAX);
        in->layer_index[i] = tmp->layer_index[s];
        in->layer_has_v[i] = tmp->layer_has_v[s];
        in->layer_half[i] = tmp->layer_half[s];
        memcpy(in->layer_dtype[i], tmp->layer_dtype[s], sizeof tmp->layer_dtype[s]);
    }
    free(tmp);
    return KV_OK;
}

/* Everything after the file checks, in the calling process. */
static kv_status open_hdf5(kv_trace_info *in) {
    const char *path = in->path;
    silence_hdf5();
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) return BAD("%s: not an HDF5 file (expected a kvtrace v1 HDF5 file)", path);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return BAD("%s: cannot open as HDF5 (the file is truncated or corrupt)", path);
    kv_status st = kv_h5_attr_int(f, path, "root", "kvtrace_version", &in->version);
    if (st == KV_OK && in->version != 1)
        st = BAD("%s: root attribute kvtrace_version: expected 1, found %d", path, in->version);
    if (st == KV_OK) st = kv_h5_attr_string(f, path, "model", in->model, sizeof in->model);
    if (st == KV_OK) st = kv_h5_attr_string(f, path, "description", in->description, sizeof in->description);
    if (st == KV_OK) st = kv_h5_attr_int(f, path, "root", "head_dim", &in->head_dim);
    if (st == KV_OK) st = kv_h5_attr_int(f, path, "root", "num_q_heads", &in->num_q_heads);
    if (st == KV_OK) st = kv_h5_attr_int(f, path, "root", "num_kv_heads", &in->num_kv_heads);
    if (st == KV_OK) st = kv_h5_attr_int(f, path, "root", "num_tokens", &in->num_tokens);
    if (st == KV_OK) st = kv_h5_attr_int(f, path, "root", "prefill_len", &in->prefill_len);
    if (st == KV_OK) st = kv_h5_attr_string(f, path, "rope", in->rope, sizeof in->rope);
    if (st == KV_OK) st = kv_h5_attr_float(f, path, "softmax_scale", &in->softmax_scale);
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
            st = BAD("%s: root attribute rope: expected 'applied' or 'none', found '%.64s'", path, in->rope);
        else if (!isfinite(in->softmax_scale) || in->softmax_scale <= 0)
            st = BAD("%s: root attribute softmax_scale: expected a finite positive number, found %g", path,
                     in->softmax_scale);
    }
    if (st == KV_OK) st = check_tokens(f, in);
    if (st == KV_OK) {
        hid_t layers = kv_h5_open_member(f, path, "/layers", "layers", 1, &st);
        if (layers >= 0) {
            scan_ctx c = {in, KV_OK, layers};
            hsize_t it = 0;
            if (H5Literate(layers, H5_INDEX_NAME, H5_ITER_INC, &it, scan_layer, &c) < 0 && c.st == KV_OK)
                c.st = BAD("%s: /layers: cannot list its members (corrupt group)", path);
            st = c.st;
            if (st == KV_OK && in->num_layers == 0)
                st = BAD("%s: /layers has no layer group (expected at least one L<index>, e.g. L14)", path);
            H5Gclose(layers);
        }
    }
    if (st == KV_OK) st = sort_layers(in);
    H5Fclose(f);
    return st;
}

/* The checks that need no HDF5: path length, regular file. */
static kv_status check_file(const char *path, kv_trace_info *in) {
    memset(in, 0, sizeof *in);
    size_t len = strlen(path);
    if (len >= sizeof in->path)
        return BAD("%.200s...: trace path is %zu characters long; at most %zu are accepted", path, len, sizeof in->path - 1);
    memcpy(in->path, path, len + 1);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return errno == ENOENT ? BAD("%s: no such file", path) : BAD("%s: cannot access: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return BAD("%s: expected a regular file, found %s", path, S_ISDIR(sb.st_mode) ? "a directory"
                   : S_ISFIFO(sb.st_mode) ? "a named pipe" : S_ISCHR(sb.st_mode) ? "a character device"
                   : S_ISBLK(sb.st_mode) ? "a block device" : S_ISSOCK(sb.st_mode) ? "a socket" : "a special file");
    in->file_bytes = (long long)sb.st_size;
    return KV_OK;
}

kv_status kv_trace_open_direct(const char *path, kv_trace_info *in) {
    KV_TRY(check_file(path, in));
    return open_hdf5(in);
}

static kv_status open_child(void *arg, void *out) {
    kv_trace_info *in = out;
    memcpy(in, arg, sizeof *in);
    return open_hdf5(in);
}

/* Seconds the reader child may take: a few for any small file, more for big ones. */
static double child_timeout(long long bytes) { return 5.0 + (double)bytes / 20e6; }

/* KVBENCH_LOADER_IN_PROCESS=1: no reader child (to measure what the
 * isolation costs, or to debug the library in process); a crash of
 * libhdf5 then takes kvbench down with it. */
static int in_process(void) {
    return kv_env_is1("KVBENCH_LOADER_IN_PROCESS");
}

kv_status kv_trace_open(const char *path, kv_trace_info *in) {
    if (in_process()) return kv_trace_open_direct(path, in);
    KV_TRY(check_file(path, in));
    return kv_isolated(in->path, "reading it", child_timeout(in->file_bytes), (size_t)1 << 30, open_child, in, in,
                       sizeof *in);
}

int kv_trace_find_layer(const kv_trace_info *in, const char *name) {
    const char *want = name[0] == 'L' ? name + 1 : name;
    for (int i = 0; i < in->num_layers; i++)
        if (strcmp(in->layer_names[i] + 1, want) == 0) return i;
    return -1;
}

/* Reads dataset [H, T, D] as float32, one head at a time, into out or
 * (fd >= 0: in the reader child) down the pipe fd; out16 (a float16
 * dataset, the layer's float16 form): the raw bits into out16 or down the pipe. */
static kv_status read_dataset(hid_t g, const kv_trace_info *in, const char *lname, const char *dname, int H,
                              kv_dtype dt, float *out, uint16_t *out16, int fd) {
    int T = in->num_tokens, D = in->head_dim;
    size_t per_head = (size_t)T * D;
    char obj[KV_NAME_MAX + 16];
    snprintf(obj, sizeof obj, "/layers/%s/%s", lname, dname);
    kv_status st = KV_OK;
    hid_t d = kv_h5_open_member(g, in->path, obj, dname, 0, &st);
    if (d < 0) return st;
    hid_t ft = H5Dget_type(d), fsp = H5Dget_space(d);
    int half = dt == KV_DTYPE_F16 || dt == KV_DTYPE_BF16;
    hsize_t cnt[3] = {1, (hsize_t)T, (hsize_t)D};
    hid_t msp = H5Screate_simple(3, cnt, NULL);
    hid_t mt = -1;
    int keep = out16 != NULL && dt == KV_DTYPE_F16;
    if (half) { mt = H5Tcopy(ft); H5Tset_order(mt, H5T_ORDER_LE); } /* same layout, host byte order */
    uint16_t *raw = half ? kv_malloc(per_head * sizeof(uint16_t), "16-bit read buffer") : NULL;
    float *lut = half ? kv_malloc(65536 * sizeof(float), "16-bit float table") : NULL;
    float *head = fd >= 0 && !keep ? kv_malloc(per_head * sizeof(float), "one head") : NULL;
    if (ft < 0 || fsp < 0) st = BAD("%s: %s: unreadable type or shape (corrupt dataset header)", in->path, obj);
    else if ((half && (!raw || !lut)) || (fd >= 0 && !keep && !head)) st = KV_ERR_NOMEM;
    if (lut)
        for (uint32_t u = 0; u < 65536; u++) {
            if (dt == KV_DTYPE_F16) lut[u] = kv_half_to_float((uint16_t)u);
            else { uint32_t w = u << 16; memcpy(&lut[u], &w, 4); } /* bfloat16: the top half of a float32 */
        }
    for (int h = 0; h < H && st == KV_OK; h++) {
        hsize_t off[3] = {(hsize_t)h, 0, 0};
        float *dst = fd >= 0 || keep ? head : out + (size_t)h * per_head;
        uint16_t *r16 = keep && fd < 0 ? out16 + (size_t)h * per_head : raw;
        H5Sselect_hyperslab(fsp, H5S_SELECT_SET, off, NULL, cnt, NULL);
        herr_t rc = half ? H5Dread(d, mt, msp, fsp, H5P_DEFAULT, r16)
                         : H5Dread(d, H5T_NATIVE_FLOAT, msp, fsp, H5P_DEFAULT, dst);
        if (rc < 0) {
            st = BAD("%s: %s: read failed at head %d (truncated or corrupt data)", in->path, obj, h);
            break;
        }
        if (keep) { /* the bits as they are; only the finiteness check looks at the values */
            for (size_t i = 0; i < per_head && st == KV_OK; i++)
                if ((r16[i] & 0x7c00u) == 0x7c00u)
                    st = BAD("%s: %s: non-finite value %g at [head %d, token %zu, dim %zu] (values must be finite)",
                             in->path, obj, lut[r16[i]], h, i / D, i % D);
            if (st == KV_OK && fd >= 0) st = kv_write_all(fd, r16, per_head * sizeof(uint16_t));
            continue;
        }
        if (half) for (size_t i = 0; i < per_head; i++) dst[i] = lut[r16[i]];
        for (size_t i = 0; i < per_head; i++)
            if (!isfinite(dst[i])) {
                st = BAD("%s: %s: non-finite value %g at [head %d, token %zu, dim %zu] (values must be finite%s)",
                         in->path, obj, dst[i], h, i / D, i % D,
                         dt == KV_DTYPE_F64 ? "; float64 values must also fit in float32" : "");
                break;
            }
        if (st == KV_OK && fd >= 0) st = kv_write_all(fd, head, per_head * sizeof(float));
    }
    free(raw); free(lut); free(head);
    if (mt >= 0) H5Tclose(mt);
    H5Sclose(msp);
    if (fsp >= 0) H5Sclose(fsp);
    if (ft >= 0) H5Tclose(ft);
    H5Dclose(d);
    return st;
}

/* Reads layer `layer`'s datasets in `mask` (1 q, 2 k, 4 v) into L's already
 * allocated arrays, or down the pipe fd. */
static kv_status read_layer(const kv_trace_info *in, int layer, kv_layer *L, int fd, int mask) {
    silence_hdf5();
    const char *ln = in->layer_names[layer];
    hid_t f = H5Fopen(in->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return BAD("%s: cannot open as HDF5 (the file changed since it was opened, or is corrupt)", in->path);
    char gp[KV_NAME_MAX + 16];
    snprintf(gp, sizeof gp, "/layers/%s", ln);
    kv_status st = KV_OK;
    hid_t lg = kv_h5_open_member(f, in->path, "/layers", "layers", 1, &st);
    hid_t g = lg >= 0 ? kv_h5_open_member(lg, in->path, gp, ln, 1, &st) : -1;
    if (g >= 0 && (mask & 1)) st = read_dataset(g, in, ln, "q", L->Hq, in->layer_dtype[layer][0], L->q, L->q16, fd);
    if (g >= 0 && st == KV_OK && (mask & 2))
        st = read_dataset(g, in, ln, "k", L->Hkv, in->layer_dtype[layer][1], L->k, L->k16, fd);
    if (g >= 0 && st == KV_OK && (L->v || L->v16) && (mask & 4))
        st = read_dataset(g, in, ln, "v", L->Hkv, in->layer_dtype[layer][2], L->v, L->v16, fd);
    if (g >= 0) H5Gclose(g);
    if (lg >= 0) H5Gclose(lg);
    H5Fclose(f);
    return st;
}

/* Bytes of memory available now (MemAvailable), or -1 when unknown;
 * KVBENCH_MEM_LIMIT or KVBENCH_MEM_AVAILABLE (bytes) overrides it, for tests
 * (a value that is not a number of bytes is ignored). The loader's check and
 * kvbench run's preflight both ask here. */
double kv_env_bytes(const char *name) {
    const char *e = getenv(name);
    if (!e || !*e) return -1;
    char *end;
    double v = strtod(e, &end);
    return end != e && v >= 0 ? v : -1;
}

double kv_mem_available(void) {
    double lim = kv_env_bytes("KVBENCH_MEM_LIMIT");
    if (lim < 0) lim = kv_env_bytes("KVBENCH_MEM_AVAILABLE");
    if (lim >= 0) return lim;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : kb * 1024.0;
}

int kv_trace_layer_f16(const kv_trace_info *in, int layer) {
    return layer >= 0 && layer < in->num_layers && in->layer_dtype[layer][0] == KV_DTYPE_F16 &&
           in->layer_dtype[layer][1] == KV_DTYPE_F16 && (!in->layer_has_v[layer] || in->layer_dtype[layer][2] == KV_DTYPE_F16);
}

static kv_status layer_alloc(const kv_trace_info *in, int layer, int form, kv_layer *L) {
    memset(L, 0, sizeof *L);
    if (layer < 0 || layer >= in->num_layers) return kv_fail(KV_ERR_INTERNAL, "layer slot %d out of range", layer);
    L->Hq = in->num_q_heads; L->Hkv = in->num_kv_heads; L->T = in->num_tokens; L->D = in->head_dim;
    L->half = in->layer_half[layer];
    int f16 = form == KV_LAYER_F16 && kv_trace_layer_f16(in, layer);
    size_t nq = (size_t)L->Hq * L->T * L->D, nk = (size_t)L->Hkv * L->T * L->D, e = f16 ? 2 : 4;
    int has_v = in->layer_has_v[layer];
    double need = (double)e * ((double)nq + (double)nk * (has_v ? 2 : 1)), avail = kv_mem_available();
    if (avail >= 0 && need > avail)
        return kv_fail(KV_ERR_NOMEM, "%s: /layers/%s: loading it needs %.0f bytes (%.2f GB: q, k%s as %s: %d+%d heads x "
                       "%d tokens x %d dims) but only %.2f GB of memory is available", in->path, in->layer_names[layer],
                       need, need / 1e9, has_v ? ", v" : "", f16 ? "float16" : "float32", L->Hq,
                       L->Hkv * (has_v ? 2 : 1), L->T, L->D, avail / 1e9);
    if (f16) {
        L->q16 = kv_malloc(nq * e, "layer queries (float16)");
        L->k16 = kv_malloc(nk * e, "layer keys (float16)");
        if (has_v) L->v16 = kv_malloc(nk * e, "layer values (float16)");
        if (!L->q16 || !L->k16 || (has_v && !L->v16)) { kv_layer_free(L); return KV_ERR_NOMEM; }
        return KV_OK;
    }
    L->q = kv_malloc(nq * sizeof(float), "layer queries");
    L->k = kv_malloc(nk * sizeof(float), "layer keys");
    if (has_v) L->v = kv_malloc(nk * sizeof(float), "layer values");
    if (!L->q || !L->k || (has_v && !L->v)) { kv_layer_free(L); return KV_ERR_NOMEM; }
    return KV_OK;
}

/* ---- the parallel path (trace_fast.c): plans from the child, decoding here ---- */

typedef struct { kv_fast_hdr h[3]; kv_fast_chunk *c[3]; int n; } layer_plan;

static void plan_free(layer_plan *p) {
    for (int i = 0; i < 3; i++) free(p->c[i]);
    memset(p, 0, sizeof *p);
}

/* The plans of q, k (and v) in the calling process, or (fd >= 0) down the pipe. */
static kv_status plan_layer(const kv_trace_info *in, int layer, layer_plan *P, int fd) {
    silence_hdf5();
    const char *ln = in->layer_names[layer];
    static const char *names[3] = {"q", "k", "v"};
    int n = in->layer_has_v[layer] ? 3 : 2;
    hid_t f = H5Fopen(in->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return BAD("%s: cannot open as HDF5 (the file changed since it was opened, or is corrupt)", in->path);
    char gp[KV_NAME_MAX + 16], obj[KV_NAME_MAX + 16];
    snprintf(gp, sizeof gp, "/layers/%s", ln);
    kv_status st = KV_OK;
    hid_t lg = kv_h5_open_member(f, in->path, "/layers", "layers", 1, &st);
    hid_t g = lg >= 0 ? kv_h5_open_member(lg, in->path, gp, ln, 1, &st) : -1;
    for (int i = 0; i < n && g >= 0 && st == KV_OK; i++) {
        snprintf(obj, sizeof obj, "/layers/%s/%s", ln, names[i]);
        hid_t d = kv_h5_open_member(g, in->path, obj, names[i], 0, &st);
        if (d < 0) break;
        kv_fast_hdr h;
        kv_fast_chunk *c = NULL;
        st = kv_fast_plan(d, in, i ? in->num_kv_heads : in->num_q_heads, in->layer_dtype[layer][i], &h, &c);
        H5Dclose(d);
        if (st == KV_OK && fd >= 0) {
            st = kv_write_all(fd, &h, sizeof h);
            if (st == KV_OK && h.n > 0) st = kv_write_all(fd, c, (size_t)h.n * sizeof *c);
            free(c);
        } else if (st == KV_OK) { P->h[i] = h; P->c[i] = c; P->n = i + 1; }
        else free(c);
    }
    if (g >= 0) H5Gclose(g);
    if (lg >= 0) H5Gclose(lg);
    H5Fclose(f);
    return st;
}

typedef struct { const kv_trace_info *in; int layer; kv_layer *L; int mask; } load_arg;

static kv_status plan_child(void *arg, void *out, int fd) {
    (void)out;
    load_arg *a = arg;
    return plan_layer(a->in, a->layer, NULL, fd);
}

typedef struct { layer_plan *P; int n; } plan_sink;

static kv_status plan_consume(int fd, void *arg) {
    plan_sink *s = arg;
    for (int i = 0; i < s->n; i++) {
        kv_fast_hdr *h = &s->P->h[i];
        KV_TRY(kv_read_all(fd, h, sizeof *h));
        h->why[sizeof h->why - 1] = 0;
        if (h->n < 0 || h->n > KV_FAST_MAX_CHUNKS) return KV_ERR_IO;
        if (h->n > 0) {
            if (!(s->P->c[i] = malloc((size_t)h->n * sizeof(kv_fast_chunk)))) return KV_ERR_IO;
            KV_TRY(kv_read_all(fd, s->P->c[i], (size_t)h->n * sizeof(kv_fast_chunk)));
        }
        s->P->n = i + 1;
    }
    return KV_OK;
}

static char last_load[512];
const char *kv_trace_last_load(void) { return last_load; }

/* Decodes the planned datasets; returns the mask of those left to the library path. */
static int fast_decode(const kv_trace_info *in, const layer_plan *P, kv_layer *L) {
    static const char *names[3] = {"q", "k", "v"};
    int f16 = kv_layer_is_f16(L);
    void *dst[3] = {f16 ? (void *)L->q16 : L->q, f16 ? (void *)L->k16 : L->k, f16 ? (void *)L->v16 : L->v};
    int left = 0;
    size_t used = 0;
    last_load[0] = 0;
    for (int i = 0; i < (dst[2] ? 3 : 2); i++) {
        char why[160] = "";
        int ok = i < P->n && kv_fast_read(in, i ? L->Hkv : L->Hq, &P->h[i], P->c[i], dst[i], f16, why, sizeof why);
        if (!ok) left |= 1 << i;
        if (!ok && !why[0]) snprintf(why, sizeof why, "no plan");
        int w = snprintf(last_load + used, sizeof last_load - used, "%s%s: %s%s%s%s", i ? "; " : "", names[i],
                         ok ? "parallel" : "library", ok ? " (" : " (", ok ? kv_fast_inflater() : why, ")");
        if (w > 0 && (size_t)w < sizeof last_load - used) used += (size_t)w;
    }
    return left;
}

static void note_library(int mask) {
    snprintf(last_load, sizeof last_load, "q: %s; k: %s; v: %s", mask & 1 ? "library" : "-", mask & 2 ? "library" : "-",
             mask & 4 ? "library" : "-");
}

kv_status kv_trace_load_layer_direct(const kv_trace_info *in, int layer, kv_layer *L) {
    return kv_trace_load_layer_direct_as(in, layer, KV_LAYER_F32, L);
}

kv_status kv_trace_load_layer_direct_as(const kv_trace_info *in, int layer, int form, kv_layer *L) {
    KV_TRY(layer_alloc(in, layer, form, L));
    int mask = 7;
    if (kv_fast_enabled()) {
        layer_plan P = {0};
        kv_status st = plan_layer(in, layer, &P, -1);
        if (st == KV_OK) mask = fast_decode(in, &P, L);
        plan_free(&P);
        if (st != KV_OK) { kv_layer_free(L); return st; }
    } else note_library(mask);
    kv_status st = mask ? read_layer(in, layer, L, -1, mask) : KV_OK;
    if (st != KV_OK) kv_layer_free(L);
    return st;
}

static kv_status load_child(void *arg, void *out, int fd) {
    (void)out;
    load_arg *a = arg;
    return read_layer(a->in, a->layer, a->L, fd, a->mask);
}

static kv_status load_consume(int fd, void *arg) {
    load_arg *a = arg;
    kv_layer *L = a->L;
    size_t nq = (size_t)L->Hq * L->T * L->D, nk = (size_t)L->Hkv * L->T * L->D;
    if (kv_layer_is_f16(L)) {
        if (a->mask & 1) KV_TRY(kv_read_all(fd, L->q16, nq * sizeof(uint16_t)));
        if (a->mask & 2) KV_TRY(kv_read_all(fd, L->k16, nk * sizeof(uint16_t)));
        return L->v16 && (a->mask & 4) ? kv_read_all(fd, L->v16, nk * sizeof(uint16_t)) : KV_OK;
    }
    if (a->mask & 1) KV_TRY(kv_read_all(fd, L->q, nq * sizeof(float)));
    if (a->mask & 2) KV_TRY(kv_read_all(fd, L->k, nk * sizeof(float)));
    return L->v && (a->mask & 4) ? kv_read_all(fd, L->v, nk * sizeof(float)) : KV_OK;
}

static kv_status load_layer_isolated(const kv_trace_info *in, int layer, int form, kv_layer *L);
static double plan_s; /* the last load's planning seconds (the reader child), for KVBENCH_LOADER_VERBOSE */

kv_status kv_trace_load_layer(const kv_trace_info *in, int layer, kv_layer *L) {
    return kv_trace_load_layer_as(in, layer, KV_LAYER_F32, L);
}

/* KVBENCH_LOADER_VERBOSE=1: one line per layer on stderr with the path taken, the form, seconds and MB/s of file. */
kv_status kv_trace_load_layer_as(const kv_trace_info *in, int layer, int form, kv_layer *L) {
    double t0 = kv_now();
    plan_s = 0;
    kv_status st = in_process() ? kv_trace_load_layer_direct_as(in, layer, form, L)
                                : load_layer_isolated(in, layer, form, L);
    double dt = kv_now() - t0;
    if (st == KV_OK && kv_env_is1("KVBENCH_LOADER_VERBOSE"))
        fprintf(stderr, "kvbench: %s: /layers/%s loaded in %.3f s (%.0f MB/s of a %.1f MB file, %d threads, as %s; "
                "planning %.3f s): %s\n", in->path, in->layer_names[layer], dt, in->file_bytes / 1e6 / in->num_layers / dt,
                in->file_bytes / 1e6, omp_get_max_threads(), kv_layer_is_f16(L) ? "float16" : "float32", plan_s, last_load);
    return st;
}

static kv_status load_layer_isolated(const kv_trace_info *in, int layer, int form, kv_layer *L) {
    KV_TRY(layer_alloc(in, layer, form, L));
    load_arg a = {in, layer, L, 7};
    kv_status st = KV_OK;
    if (kv_fast_enabled()) {
        layer_plan P = {0};
        plan_sink ps = {&P, in->layer_has_v[layer] ? 3 : 2};
        double p0 = kv_now();
        st = kv_isolated_stream(in->path, "locating its data", child_timeout(in->file_bytes), (size_t)1 << 30,
                                plan_child, &a, NULL, 0, plan_consume, &ps);
        plan_s = kv_now() - p0;
        if (st == KV_OK) a.mask = fast_decode(in, &P, L);
        plan_free(&P);
    } else note_library(a.mask);
    size_t scratch = (size_t)in->num_tokens * in->head_dim * 6 + 65536 * 4;
    if (st == KV_OK && a.mask)
        st = kv_isolated_stream(in->path, "reading its data", child_timeout(in->file_bytes) + 25.0,
                                ((size_t)1 << 30) + scratch, load_child, &a, NULL, 0, load_consume, &a);
    if (st != KV_OK) kv_layer_free(L);
    return st;
}

void kv_layer_free(kv_layer *L) {
    free(L->q); free(L->k); free(L->v);
    free(L->q16); free(L->k16); free(L->v16);
    L->q = L->k = L->v = NULL;
    L->q16 = L->k16 = L->v16 = NULL;
}

typedef struct { const kv_trace_info *in; int *t; } tok_arg;

/* Token ids as int into t, or (fd >= 0) down the pipe. */
static kv_status read_tokens(const kv_trace_info *in, int *t, int fd) {
    silence_hdf5();
    kv_status st = KV_OK;
    long long *wide = kv_malloc((size_t)in->num_tokens * sizeof(long long), "token ids");
    if (!wide) return KV_ERR_NOMEM;
    hid_t f = H5Fopen(in->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = f >= 0 ? kv_h5_open_member(f, in->path, "/tokens", "tokens", 0, &st) : -1;
    if (f < 0) st = BAD("%s: cannot open as HDF5 (the file changed since it was opened, or is corrupt)", in->path);
    else if (d >= 0 && H5Dread(d, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, wide) < 0)
        st = BAD("%s: /tokens: read failed (truncated or corrupt data)", in->path);
    int *ids = (int *)wide; /* narrowed in place: ids[i] is written after wide[i] is read */
    for (int i = 0; i < in->num_tokens && st == KV_OK; i++) {
        long long w = wide[i];
        if (w < INT_MIN || w > INT_MAX)
            st = BAD("%s: /tokens: token id %lld at position %d does not fit in int32", in->path, w, i);
        ids[i] = (int)w;
    }
    if (st == KV_OK) {
        if (fd >= 0) st = kv_write_all(fd, ids, (size_t)in->num_tokens * sizeof(int));
        else memcpy(t, ids, (size_t)in->num_tokens * sizeof(int));
    }
    free(wide);
    if (d >= 0) H5Dclose(d);
    if (f >= 0) H5Fclose(f);
    return st;
}

static kv_status tokens_child(void *arg, void *out, int fd) {
    (void)out;
    return read_tokens(arg, NULL, fd);
}

typedef struct { int *t; size_t bytes; } tok_sink;
static kv_status tokens_consume(int fd, void *arg) {
    tok_sink *s = arg;
    return kv_read_all(fd, s->t, s->bytes);
}

kv_status kv_trace_load_tokens(const kv_trace_info *in, int **tokens) {
    if (in_process()) return kv_trace_load_tokens_direct(in, tokens);
    *tokens = NULL;
    if (!in->has_tokens) return KV_OK;
    tok_sink s = {kv_malloc((size_t)in->num_tokens * sizeof(int), "token ids"), (size_t)in->num_tokens * sizeof(int)};
    if (!s.t) return KV_ERR_NOMEM;
    kv_status st = kv_isolated_stream(in->path, "reading its token ids", child_timeout(in->file_bytes),
                                      ((size_t)1 << 30) + (size_t)in->num_tokens * 8, tokens_child, (void *)in, NULL, 0,
                                      tokens_consume, &s);
    if (st != KV_OK) { free(s.t); return st; }
    *tokens = s.t;
    return KV_OK;
}

kv_status kv_trace_load_tokens_direct(const kv_trace_info *in, int **tokens) {
    *tokens = NULL;
    if (!in->has_tokens) return KV_OK;
    int *t = kv_malloc((size_t)in->num_tokens * sizeof(int), "token ids");
    if (!t) return KV_ERR_NOMEM;
    kv_status st = read_tokens(in, t, -1);
    if (st != KV_OK) { free(t); return st; }
    *tokens = t;
    return KV_OK;
}
