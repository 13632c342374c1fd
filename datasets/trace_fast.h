/* trace_fast.h: the parallel layer loader (datasets/trace_fast.c), shared
 * by trace_read.c only. The reader child (HDF5) makes a plan: where each
 * chunk of a dataset lies in the file, its size and which filters it went
 * through; the parent reads those bytes with pread and decodes them on
 * every OpenMP thread. A plan of mode KV_FAST_LIBRARY, or any anomaly
 * while decoding, sends the dataset to the HDF5 library's own read path. */
#ifndef KV_TRACE_FAST_H
#define KV_TRACE_FAST_H

#include <stdint.h>

#include "kv_trace.h"

enum { KV_FAST_LIBRARY = 0, KV_FAST_CONTIG = 1, KV_FAST_CHUNKED = 2 };
/* Larger chunks or more of them go to the library path: each thread holds
 * about three chunk buffers, and the plan is 32 bytes per chunk. */
#define KV_FAST_MAX_CHUNK_BYTES ((uint64_t)8 << 20)
#define KV_FAST_MAX_CHUNKS ((int64_t)1 << 22)

typedef struct {
    uint64_t addr, size; /* file offset and stored bytes */
    uint32_t c[3];       /* chunk origin [head, token, dim] */
    uint32_t pad;
} kv_fast_chunk;

typedef struct {
    int32_t mode, shuffle, deflate, esz, dtype;
    uint32_t cdim[3]; /* chunk shape (chunked) */
    int64_t n;        /* entries that follow */
    char why[120];    /* KV_FAST_LIBRARY: the reason, for KVBENCH_LOADER=verbose */
} kv_fast_hdr;

#ifdef H5_VERS_MAJOR
/* Child side: the plan of dataset d ([H, T, D], element type dt); *chunks malloc'd (or NULL). */
kv_status kv_fast_plan(hid_t d, const kv_trace_info *in, int H, kv_dtype dt, kv_fast_hdr *h, kv_fast_chunk **chunks);
#endif
/* Parent side: decodes the plan into out ([H][T][D]: float32, or with out16 the float16 bits of a float16
 * dataset as they are). 1: done; 0: use the library path (why says why: a filter mask, a bad stream, a
 * non-finite value, ...). */
int kv_fast_read(const kv_trace_info *in, int H, const kv_fast_hdr *h, const kv_fast_chunk *chunks, void *out,
                 int out16, char *why, size_t why_cap);
/* "parallel" (default), "library" (the HDF5 read path only), from KVBENCH_LOADER. */
int kv_fast_enabled(void);
/* Which decoder the last kv_fast_read used: "libdeflate", "zlib" or "none", then ", F16C" when float16
 * went through the F16C instruction (else a table), ", kept float16" for the float16 form, ", into place" /
 * ", pread in place" when the stored bytes went straight into the output. */
const char *kv_fast_inflater(void);

#endif
