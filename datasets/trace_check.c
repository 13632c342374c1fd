/* trace_check.c: the HDF5 checks behind the kvtrace loader (trace_read.c):
 * attributes read by what they are (a scalar integer, a number, one string
 * of bounded length, each mismatch described as found: "a scalar 8-byte
 * float", "an array of 3 variable-length strings"); members opened only
 * when they are the expected kind of object inside the file (otherwise
 * "nothing (missing)", "a group", "a dangling soft link to X", "an external
 * link to F:X"); float types identified by their bit fields (float16,
 * bfloat16, float32, float64, either byte order); and a dataset's declared
 * size checked against its real storage before anything is read:
 * contiguous data inside the file, every chunk stored, chunks no larger
 * than the dataset (+1 MiB), only gzip/shuffle/fletcher32, no more
 * expansion than gzip's ~1032:1, no external or virtual storage. These
 * run in the reader child (isolate.c). */
#define _GNU_SOURCE
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_check.h"

#define BAD(...) kv_fail(KV_ERR_INPUT, __VA_ARGS__)
#define GZIP_MAX_RATIO 1100.0 /* deflate cannot expand more than 1032:1 */
#define CHUNK_SLACK (1u << 20) /* a chunk may exceed its dataset by this much */

const char *kv_dtype_name(kv_dtype t) {
    switch (t) {
    case KV_DTYPE_F16: return "float16";
    case KV_DTYPE_BF16: return "bfloat16";
    case KV_DTYPE_F32: return "float32";
    case KV_DTYPE_F64: return "float64";
    }
    return "none";
}

static const char *class_name(H5T_class_t c) {
    switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_TIME: return "time";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_ARRAY: return "array";
    default: return "unknown";
    }
}

/* "a scalar 8-byte float", "a 3-element 4-byte integer array", "an empty string attribute". */
void kv_h5_describe_value(hid_t t, hid_t sp, char *buf, size_t cap) {
    H5T_class_t c = H5Tget_class(t);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    char ty[64];
    if (c == H5T_STRING) snprintf(ty, sizeof ty, "%s string", H5Tis_variable_str(t) > 0 ? "variable-length" : "fixed-length");
    else snprintf(ty, sizeof ty, "%zu-byte %s", H5Tget_size(t), class_name(c));
    if (sc == H5S_NULL || n == 0) snprintf(buf, cap, "an empty %s", ty);
    else if (sc == H5S_SCALAR) snprintf(buf, cap, "a scalar %s", ty);
    else snprintf(buf, cap, "an array of %lld %ss", (long long)n, ty);
}

/* Says what `name` under loc is when it is not what was expected. */
static void describe_member(hid_t loc, const char *name, char *buf, size_t cap) {
    H5L_info_t li;
    if (H5Lexists(loc, name, H5P_DEFAULT) <= 0 || H5Lget_info(loc, name, &li, H5P_DEFAULT) < 0) {
        snprintf(buf, cap, "nothing (missing)");
        return;
    }
    if (li.type == H5L_TYPE_EXTERNAL) {
        char val[512] = "";
        const char *file = "?", *obj = "?";
        if (li.u.val_size <= sizeof val && H5Lget_val(loc, name, val, sizeof val, H5P_DEFAULT) >= 0)
            H5Lunpack_elink_val(val, li.u.val_size, NULL, &file, &obj);
        snprintf(buf, cap, "an external link to %s:%s (a trace must be self-contained)", file, obj);
        return;
    }
    if (li.type == H5L_TYPE_SOFT) {
        char val[512] = "";
        if (li.u.val_size > sizeof val || H5Lget_val(loc, name, val, sizeof val, H5P_DEFAULT) < 0) snprintf(val, sizeof val, "?");
        if (H5Oexists_by_name(loc, name, H5P_DEFAULT) <= 0) { snprintf(buf, cap, "a dangling soft link to %s", val); return; }
    } else if (li.type != H5L_TYPE_HARD) {
        snprintf(buf, cap, "a user-defined link");
        return;
    }
    H5O_info_t oi;
    if (H5Oget_info_by_name2(loc, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) snprintf(buf, cap, "an unreadable object");
    else snprintf(buf, cap, "%s", oi.type == H5O_TYPE_GROUP ? "a group" : oi.type == H5O_TYPE_DATASET ? "a dataset"
                                   : oi.type == H5O_TYPE_NAMED_DATATYPE ? "a named datatype" : "an unknown object");
}

/* Opens loc/name when it is a dataset (kind 0) or group (kind 1) reached by a
 * hard or soft link inside the file; otherwise a message saying what is there. */
hid_t kv_h5_open_member(hid_t loc, const char *path, const char *obj, const char *name, int kind, kv_status *st) {
    H5L_info_t li;
    H5O_info_t oi;
    const char *want = kind ? "a group" : "a dataset";
    char found[700];
    if (H5Lexists(loc, name, H5P_DEFAULT) > 0 && H5Lget_info(loc, name, &li, H5P_DEFAULT) >= 0 &&
        (li.type == H5L_TYPE_HARD || li.type == H5L_TYPE_SOFT) &&
        H5Oget_info_by_name2(loc, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 &&
        oi.type == (kind ? H5O_TYPE_GROUP : H5O_TYPE_DATASET)) {
        hid_t h = kind ? H5Gopen2(loc, name, H5P_DEFAULT) : H5Dopen2(loc, name, H5P_DEFAULT);
        if (h >= 0) return h;
        *st = BAD("%s: %s: expected %s, found one that cannot be opened (corrupt object header)", path, obj, want);
        return -1;
    }
    describe_member(loc, name, found, sizeof found);
    *st = BAD("%s: %s: expected %s, found %s", path, obj, want, found);
    return -1;
}

kv_status kv_h5_attr_int(hid_t obj, const char *path, const char *obj_name, const char *name, int *out) {
    *out = 0;
    if (H5Aexists(obj, name) <= 0)
        return BAD("%s: %s: missing attribute '%s' (expected a scalar integer)", path, obj_name, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return BAD("%s: %s: attribute '%s' cannot be opened (corrupt attribute)", path, obj_name, name);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    kv_status st = KV_OK;
    long long v = 0;
    char found[128];
    if (t < 0 || sp < 0) st = BAD("%s: %s: attribute '%s' has an unreadable type or shape", path, obj_name, name);
    else if (H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_npoints(sp) != 1) {
        kv_h5_describe_value(t, sp, found, sizeof found);
        st = BAD("%s: %s: attribute '%s' must be a scalar integer, found %s", path, obj_name, name, found);
    } else if (H5Aread(a, H5T_NATIVE_LLONG, &v) < 0)
        st = BAD("%s: %s: cannot read attribute '%s' (corrupt attribute data)", path, obj_name, name);
    else if (v < -2147483647LL || v > 2147483647LL)
        st = BAD("%s: %s: attribute '%s' = %lld does not fit in 32 bits", path, obj_name, name, v);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    *out = (int)v;
    return st;
}

kv_status kv_h5_attr_float(hid_t obj, const char *path, const char *name, float *out) {
    *out = 0;
    if (H5Aexists(obj, name) <= 0) return BAD("%s: missing root attribute '%s' (expected a scalar float)", path, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return BAD("%s: root attribute '%s' cannot be opened (corrupt attribute)", path, name);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    kv_status st = KV_OK;
    double v = 0;
    char found[128];
    H5T_class_t c = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    if (t < 0 || sp < 0) st = BAD("%s: root attribute '%s' has an unreadable type or shape", path, name);
    else if ((c != H5T_FLOAT && c != H5T_INTEGER) || H5Sget_simple_extent_npoints(sp) != 1) {
        kv_h5_describe_value(t, sp, found, sizeof found);
        st = BAD("%s: root attribute '%s' must be a scalar number, found %s", path, name, found);
    } else if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0)
        st = BAD("%s: cannot read root attribute '%s' (corrupt attribute data)", path, name);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    *out = (float)v;
    return st;
}

/* One string (a scalar, or an array of exactly one), fixed or variable
 * length, of at most cap-1 bytes; an array of several is refused (it used
 * to be read into room for one). */
kv_status kv_h5_attr_string(hid_t obj, const char *path, const char *name, char *out, size_t cap) {
    out[0] = 0;
    if (H5Aexists(obj, name) <= 0) return BAD("%s: missing root attribute '%s' (expected a string)", path, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return BAD("%s: root attribute '%s' cannot be opened (corrupt attribute)", path, name);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    kv_status st = KV_OK;
    char found[128];
    if (t < 0 || sp < 0) st = BAD("%s: root attribute '%s' has an unreadable type or shape", path, name);
    else if (H5Tget_class(t) != H5T_STRING || H5Sget_simple_extent_npoints(sp) != 1) {
        kv_h5_describe_value(t, sp, found, sizeof found);
        st = BAD("%s: root attribute '%s' must be a single string, found %s", path, name, found);
    } else if (H5Tis_variable_str(t) > 0) {
        char *s[1] = {NULL};
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t)); /* h5py writes UTF-8; HDF5 will not convert character sets */
        if (H5Aread(a, mt, s) < 0 || !s[0]) st = BAD("%s: cannot read root attribute '%s' (corrupt string)", path, name);
        else if (strlen(s[0]) >= cap)
            st = BAD("%s: root attribute '%s' is %zu bytes long; at most %zu are accepted", path, name, strlen(s[0]), cap - 1);
        else memcpy(out, s[0], strlen(s[0]) + 1);
        if (s[0]) H5free_memory(s[0]);
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(t);
        if (n >= cap) st = BAD("%s: root attribute '%s' is a %zu-byte string; at most %zu bytes are accepted", path, name, n, cap - 1);
        else {
            char buf[KV_TEXT_MAX + 1] = {0};
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, n + 1);
            H5Tset_cset(mt, H5Tget_cset(t));
            if (H5Aread(a, mt, buf) < 0) st = BAD("%s: cannot read root attribute '%s' (corrupt string)", path, name);
            else memcpy(out, buf, n + 1);
            H5Tclose(mt);
        }
    }
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    return st;
}

/* The element type from its real bit layout; 0 (and a message) otherwise. */
kv_dtype kv_h5_float_kind(hid_t t, const char *path, const char *obj) {
    H5T_class_t c = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    if (c != H5T_FLOAT) {
        BAD("%s: %s: expected float16, bfloat16, float32 or float64 values, found a %zu-byte %s type", path, obj, size,
            class_name(c));
        return 0;
    }
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize);
    size_t bias = H5Tget_ebias(t);
    H5T_order_t ord = H5Tget_order(t);
    int ieee_tail = mpos == 0 && epos == msize && spos == esize + msize && spos == size * 8 - 1 &&
                    H5Tget_offset(t) == 0 && H5Tget_precision(t) == size * 8 && H5Tget_norm(t) == H5T_NORM_IMPLIED &&
                    (ord == H5T_ORDER_LE || ord == H5T_ORDER_BE);
    if (ieee_tail && size == 2 && esize == 5 && bias == 15) return KV_DTYPE_F16;
    if (ieee_tail && size == 2 && esize == 8 && bias == 127) return KV_DTYPE_BF16;
    if (ieee_tail && size == 4 && esize == 8 && bias == 127) return KV_DTYPE_F32;
    if (ieee_tail && size == 8 && esize == 11 && bias == 1023) return KV_DTYPE_F64;
    BAD("%s: %s: expected float16, bfloat16, float32 or float64 values, found a %zu-byte float with %zu exponent bits "
        "(bias %zu) and %zu mantissa bits (sign at bit %zu, %s)", path, obj, size, esize, bias, msize, spos,
        ord == H5T_ORDER_LE ? "little-endian" : ord == H5T_ORDER_BE ? "big-endian" : "mixed byte order");
    return 0;
}

static const char *filter_name(H5Z_filter_t id) {
    switch (id) {
    case H5Z_FILTER_DEFLATE: return "gzip";
    case H5Z_FILTER_SHUFFLE: return "shuffle";
    case H5Z_FILTER_FLETCHER32: return "fletcher32";
    case H5Z_FILTER_SZIP: return "szip";
    case H5Z_FILTER_NBIT: return "nbit";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset";
    case 32000: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32015: return "zstd";
    default: return "unknown";
    }
}

/* Declared bytes against real storage (see the header); n elements of `esz` bytes. */
kv_status kv_h5_check_storage(hid_t d, const char *path, const char *obj, const hsize_t *dims, int rank, size_t esz,
                               long long file_bytes) {
    double declared = (double)esz;
    for (int i = 0; i < rank; i++) declared *= (double)dims[i];
    hid_t pl = H5Dget_create_plist(d);
    if (pl < 0) return BAD("%s: %s: unreadable storage properties (corrupt dataset header)", path, obj);
    kv_status st = KV_OK;
    H5D_layout_t lay = H5Pget_layout(pl);
    if (H5Pget_external_count(pl) > 0)
        st = BAD("%s: %s: expected data stored in the file, found external raw data files (a trace must be self-contained)",
                 path, obj);
    else if (lay == H5D_CONTIGUOUS) {
        haddr_t off = H5Dget_offset(d);
        if (off == HADDR_UNDEF)
            st = BAD("%s: %s: declares %.0f bytes but stores no data (never written)", path, obj, declared);
        else if ((double)off + declared > (double)file_bytes)
            st = BAD("%s: %s: declares %.0f bytes at offset %llu, past the end of the %lld-byte file (truncated or "
                     "corrupt)", path, obj, declared, (unsigned long long)off, file_bytes);
    } else if (lay == H5D_CHUNKED) {
        hsize_t cd[8] = {0};
        int cr = H5Pget_chunk(pl, 8, cd);
        double cbytes = (double)esz, grid = 1;
        for (int i = 0; i < cr && i < rank; i++) {
            cbytes *= (double)cd[i];
            grid *= cd[i] ? ceil((double)dims[i] / (double)cd[i]) : INFINITY;
        }
        int nf = H5Pget_nfilters(pl), deflate = 0;
        for (int i = 0; i < nf && st == KV_OK; i++) {
            unsigned flags = 0, cv[8];
            size_t ncv = 8;
            char nm[64] = "";
            H5Z_filter_t id = H5Pget_filter2(pl, (unsigned)i, &flags, &ncv, cv, sizeof nm, nm, NULL);
            if (id == H5Z_FILTER_DEFLATE) deflate = 1;
            else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32)
                st = BAD("%s: %s: expected gzip (optionally with shuffle or fletcher32) or no compression, found filter "
                         "%d (%s)", path, obj, (int)id, filter_name(id));
        }
        hsize_t nstored = 0;
        hid_t fsp = -1;
        if (st != KV_OK) {
        } else if (cr != rank)
            st = BAD("%s: %s: chunks of rank %d for a dataset of rank %d (corrupt layout)", path, obj, cr, rank);
        else if (cbytes > declared + CHUNK_SLACK)
            st = BAD("%s: %s: chunks of %.0f bytes ([%llu, %llu, %llu]) are larger than the whole dataset (%.0f bytes): "
                     "refused, reading one would cost the whole chunk", path, obj, cbytes, (unsigned long long)cd[0],
                     (unsigned long long)(rank > 1 ? cd[1] : 0), (unsigned long long)(rank > 2 ? cd[2] : 0), declared);
        else if (grid * 4 > (double)file_bytes) /* each stored chunk costs at least its address and its data */
            st = BAD("%s: %s: declares %.0f chunks, more than a %lld-byte file can index (truncated or corrupt)", path,
                     obj, grid, file_bytes);
        else if ((fsp = H5Dget_space(d)) < 0 || H5Dget_num_chunks(d, fsp, &nstored) < 0)
            st = BAD("%s: %s: cannot read the chunk index (corrupt)", path, obj);
        else if ((double)nstored != grid)
            st = BAD("%s: %s: %llu of its %.0f chunks are stored (a trace stores every value; unwritten chunks would "
                     "read as zeros)", path, obj, (unsigned long long)nstored, grid);
        else {
            double stored = (double)H5Dget_storage_size(d);
            double need = grid * cbytes; /* edge chunks are stored whole */
            if (stored > (double)file_bytes)
                st = BAD("%s: %s: its chunks claim %.0f bytes, more than the %lld-byte file (corrupt chunk index)", path,
                         obj, stored, file_bytes);
            else if (need > stored * (deflate ? GZIP_MAX_RATIO : 1.0))
                st = BAD("%s: %s: declares %.0f bytes in chunks that store only %.0f bytes%s (corrupt or a decompression "
                         "bomb)", path, obj, need, stored, deflate ? ", beyond gzip's maximum ratio" : " uncompressed");
        }
        if (fsp >= 0) H5Sclose(fsp);
    } else if (lay != H5D_COMPACT)
        st = BAD("%s: %s: expected contiguous, chunked or compact storage, found %s", path, obj,
                 lay == H5D_VIRTUAL ? "a virtual dataset (references other files)" : "an unknown layout");
    H5Pclose(pl);
    return st;
}
