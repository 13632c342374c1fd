/* trace_write.c: writing kvtrace v1 files (synth, slice). Rows are written
 * as they come (hyperslabs along T), so a 1M-token trace never needs more
 * than one block of rows in memory. The file is created as
 * "<path>.tmp.<pid>" and renamed into place only on a successful close, so
 * an interrupted write leaves no half-written trace: the temp file is
 * created exclusively (never truncating a file that is already there) and
 * registered for removal on SIGINT/SIGTERM (datasets/kv_cleanup.h). The
 * caller decides whether <path> may be replaced (cli: --force); rename
 * replaces it atomically. float16 uses the IEEE binary16 layout (the one
 * h5py and numpy write). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_cleanup.h"
#include "kv_trace.h"

struct kv_trace_writer {
    char *path, *tmp;
    int clean_id;
    kv_trace_spec spec;
    hid_t file, layer, dq, dk, dv, ftype;
    uint16_t *hbuf;
    size_t hcap;
};

static kv_status wfail(kv_trace_writer *w, const char *what) {
    return kv_fail(KV_ERR_IO, "%s: cannot write %s (disk full or not writable?)", w->path, what);
}

static hid_t half_type(void) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

static int put_attr(hid_t obj, const char *name, hid_t mtype, const void *val) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, mtype, sp, H5P_DEFAULT, H5P_DEFAULT);
    int ok = a >= 0 && H5Awrite(a, mtype, val) >= 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return ok;
}

static int put_str(hid_t obj, const char *name, const char *s) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(s) + 1);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    int ok = put_attr(obj, name, t, s);
    H5Tclose(t);
    return ok;
}

kv_status kv_trace_writer_open(const char *path, const kv_trace_spec *s, kv_trace_writer **out) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    kv_trace_writer *w = kv_calloc(1, sizeof *w, "trace writer");
    if (!w) return KV_ERR_NOMEM;
    size_t n = strlen(path) + 32;
    w->path = kv_malloc(strlen(path) + 1, "trace path");
    w->tmp = kv_malloc(n, "trace temp path");
    if (!w->path || !w->tmp) { free(w->path); free(w->tmp); free(w); return KV_ERR_NOMEM; }
    memcpy(w->path, path, strlen(path) + 1);
    snprintf(w->tmp, n, "%s.tmp.%d", path, (int)getpid());
    w->spec = *s;
    w->layer = w->dq = w->dk = w->dv = -1;
    kv_cleanup_install();
    w->clean_id = kv_cleanup_add(KV_CLEAN_FILE, w->tmp, NULL);
    if (w->clean_id < 0) { kv_status st = KV_ERR_INPUT; free(w->path); free(w->tmp); free(w); return st; }
    w->ftype = s->half ? half_type() : H5Tcopy(H5T_IEEE_F32LE);
    w->file = H5Fcreate(w->tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (w->file < 0) {
        kv_status st = access(w->tmp, F_OK) == 0
            ? kv_fail(KV_ERR_IO, "%s: cannot create the temporary file %s: it already exists (left by another "
                      "process? remove it)", path, w->tmp)
            : kv_fail(KV_ERR_IO, "%s: cannot create %s (directory missing or not writable?)", path, w->tmp);
        kv_cleanup_remove(w->clean_id); /* an existing one is not ours: never removed */
        H5Tclose(w->ftype);
        free(w->path); free(w->tmp);
        free(w);
        return st;
    }
    kv_cleanup_test_point("trace-created");
    int one = 1, ok = 1;
    ok &= put_attr(w->file, "kvtrace_version", H5T_NATIVE_INT, &one);
    ok &= put_str(w->file, "model", s->model ? s->model : "");
    ok &= put_str(w->file, "description", s->description ? s->description : "");
    ok &= put_attr(w->file, "head_dim", H5T_NATIVE_INT, &s->head_dim);
    ok &= put_attr(w->file, "num_q_heads", H5T_NATIVE_INT, &s->num_q_heads);
    ok &= put_attr(w->file, "num_kv_heads", H5T_NATIVE_INT, &s->num_kv_heads);
    ok &= put_attr(w->file, "num_tokens", H5T_NATIVE_INT, &s->num_tokens);
    ok &= put_attr(w->file, "prefill_len", H5T_NATIVE_INT, &s->prefill_len);
    ok &= put_str(w->file, "rope", s->rope ? s->rope : "none");
    ok &= put_attr(w->file, "softmax_scale", H5T_NATIVE_FLOAT, &s->softmax_scale);
    hid_t lg = H5Gcreate2(w->file, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ok &= lg >= 0;
    if (lg >= 0) H5Gclose(lg);
    if (!ok) {
        kv_status st = wfail(w, "root attributes");
        kv_trace_writer_close(w, 0);
        return st;
    }
    *out = w;
    return KV_OK;
}

kv_status kv_trace_writer_tokens(kv_trace_writer *w, const int *tokens) {
    hsize_t n = (hsize_t)w->spec.num_tokens;
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(w->file, "tokens", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = d >= 0 && H5Dwrite(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) >= 0;
    if (d >= 0) H5Dclose(d);
    H5Sclose(sp);
    return ok ? KV_OK : wfail(w, "/tokens");
}

static void close_layer(kv_trace_writer *w) {
    if (w->dq >= 0) H5Dclose(w->dq);
    if (w->dk >= 0) H5Dclose(w->dk);
    if (w->dv >= 0) H5Dclose(w->dv);
    if (w->layer >= 0) H5Gclose(w->layer);
    w->layer = w->dq = w->dk = w->dv = -1;
}

static hid_t make_dataset(kv_trace_writer *w, const char *name, int H) {
    const kv_trace_spec *s = &w->spec;
    hsize_t dims[3] = {(hsize_t)H, (hsize_t)s->num_tokens, (hsize_t)s->head_dim};
    hsize_t chunk[3] = {1, (hsize_t)(s->chunk_tokens > 0 ? s->chunk_tokens : 1024), (hsize_t)s->head_dim};
    if (chunk[1] > dims[1]) chunk[1] = dims[1];
    hid_t sp = H5Screate_simple(3, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    if (s->contiguous && !s->gzip && !s->shuffle && !s->fletcher32) H5Pset_layout(pl, H5D_CONTIGUOUS);
    else H5Pset_chunk(pl, 3, chunk);
    if (s->shuffle) H5Pset_shuffle(pl);
    if (s->gzip > 0) H5Pset_deflate(pl, (unsigned)s->gzip);
    if (s->fletcher32) H5Pset_fletcher32(pl);
    hid_t d = H5Dcreate2(w->layer, name, w->ftype, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Pclose(pl);
    H5Sclose(sp);
    return d;
}

kv_status kv_trace_writer_layer(kv_trace_writer *w, int index, int has_v) {
    close_layer(w);
    char name[64];
    snprintf(name, sizeof name, "/layers/L%d", index);
    w->layer = H5Gcreate2(w->file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (w->layer < 0 || !put_attr(w->layer, "layer_index", H5T_NATIVE_INT, &index)) return wfail(w, name);
    w->dq = make_dataset(w, "q", w->spec.num_q_heads);
    w->dk = make_dataset(w, "k", w->spec.num_kv_heads);
    if (has_v) w->dv = make_dataset(w, "v", w->spec.num_kv_heads);
    if (w->dq < 0 || w->dk < 0 || (has_v && w->dv < 0)) return wfail(w, name);
    return KV_OK;
}

static kv_status write_rows(kv_trace_writer *w, hid_t d, int H, int t0, int n, const float *x) {
    int D = w->spec.head_dim;
    hsize_t off[3] = {0, (hsize_t)t0, 0}, cnt[3] = {(hsize_t)H, (hsize_t)n, (hsize_t)D};
    hid_t fsp = H5Dget_space(d), msp = H5Screate_simple(3, cnt, NULL);
    H5Sselect_hyperslab(fsp, H5S_SELECT_SET, off, NULL, cnt, NULL);
    size_t total = (size_t)H * n * D;
    herr_t rc;
    if (w->spec.half) {
        if (total > w->hcap) {
            free(w->hbuf);
            w->hbuf = kv_malloc(total * sizeof(uint16_t), "float16 write buffer");
            w->hcap = w->hbuf ? total : 0;
            if (!w->hbuf) { H5Sclose(msp); H5Sclose(fsp); return KV_ERR_NOMEM; }
        }
        for (size_t i = 0; i < total; i++) w->hbuf[i] = kv_float_to_half(x[i]);
        rc = H5Dwrite(d, w->ftype, msp, fsp, H5P_DEFAULT, w->hbuf);
    } else rc = H5Dwrite(d, H5T_NATIVE_FLOAT, msp, fsp, H5P_DEFAULT, x);
    H5Sclose(msp);
    H5Sclose(fsp);
    return rc < 0 ? wfail(w, "layer rows") : KV_OK;
}

kv_status kv_trace_writer_rows(kv_trace_writer *w, int t0, int n, const float *q, const float *k, const float *v) {
    if (w->layer < 0) return kv_fail(KV_ERR_INTERNAL, "trace writer: rows before a layer");
    KV_TRY(write_rows(w, w->dq, w->spec.num_q_heads, t0, n, q));
    KV_TRY(write_rows(w, w->dk, w->spec.num_kv_heads, t0, n, k));
    if (w->dv >= 0 && v) KV_TRY(write_rows(w, w->dv, w->spec.num_kv_heads, t0, n, v));
    return KV_OK;
}

kv_status kv_trace_writer_close(kv_trace_writer *w, int commit) {
    if (!w) return KV_OK;
    close_layer(w);
    kv_status st = KV_OK;
    if (H5Fclose(w->file) < 0 && commit) st = wfail(w, "the file");
    H5Tclose(w->ftype);
    if (commit && st == KV_OK && rename(w->tmp, w->path) != 0)
        st = kv_fail(KV_ERR_IO, "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(errno));
    if (!commit || st != KV_OK) remove(w->tmp);
    kv_cleanup_remove(w->clean_id);
    free(w->hbuf);
    free(w->path); free(w->tmp);
    free(w);
    return st;
}
