/* trace_check.h: the HDF5 checks of the kvtrace loader (trace_check.c),
 * shared by trace_read.c only. Each returns KV_ERR_INPUT with a message
 * naming PATH, the object, what was expected and what was found. */
#ifndef KV_TRACE_CHECK_H
#define KV_TRACE_CHECK_H

#include <hdf5.h>

#include "kv_trace.h"

/* "a scalar 8-byte float", "an array of 3 variable-length strings", ... */
void kv_h5_describe_value(hid_t type, hid_t space, char *buf, size_t cap);
/* loc/name when it is a dataset (kind 0) or group (kind 1) reached by a hard
 * or soft link inside the file; else -1 and *st says what is there. */
hid_t kv_h5_open_member(hid_t loc, const char *path, const char *obj, const char *name, int kind, kv_status *st);
kv_status kv_h5_attr_int(hid_t obj, const char *path, const char *obj_name, const char *name, int *out);
kv_status kv_h5_attr_float(hid_t obj, const char *path, const char *name, float *out);
kv_status kv_h5_attr_string(hid_t obj, const char *path, const char *name, char *out, size_t cap);
/* The element type from its bit fields; 0 (and a message naming them) otherwise. */
kv_dtype kv_h5_float_kind(hid_t type, const char *path, const char *obj);
/* Declared bytes (dims x esz) against the dataset's real storage in a file of file_bytes. */
kv_status kv_h5_check_storage(hid_t d, const char *path, const char *obj, const hsize_t *dims, int rank, size_t esz,
                              long long file_bytes);

#endif
