/* kv_trace.h: reading, validating and writing kvtrace v1 files
 * (datasets/TRACE_FORMAT.md), and the synthetic trace generator.
 *
 * A trace is opened once (attributes, layer list, dataset dtypes, all
 * validated), then loaded one layer at a time into float32 arrays laid out
 * [H][T][D] as in the file. Every error names the file, the attribute or
 * dataset, what was expected and what was found, and returns KV_ERR_INPUT. */
#ifndef KV_TRACE_H
#define KV_TRACE_H

#include "../kernels/ops/kv_common.h"

#define KV_NAME_MAX 64
#define KV_TEXT_MAX 4096
#define KV_MAX_LAYERS 512
#define KV_PATH_MAX 4096 /* Linux's PATH_MAX: no longer path can be opened; longer ones are refused */

/* Stored element types of q/k/v (read as float32; bf16 and float16 exactly, float64 rounded). */
typedef enum { KV_DTYPE_F16 = 1, KV_DTYPE_BF16, KV_DTYPE_F32, KV_DTYPE_F64 } kv_dtype;
const char *kv_dtype_name(kv_dtype t);

typedef struct {
    char path[KV_PATH_MAX];
    int version;
    char model[KV_TEXT_MAX];
    char description[KV_TEXT_MAX];
    char rope[KV_NAME_MAX];
    int head_dim, num_q_heads, num_kv_heads, num_tokens, prefill_len;
    float softmax_scale;
    int has_tokens;
    long long file_bytes;
    int num_layers;
    char layer_names[KV_MAX_LAYERS][KV_NAME_MAX]; /* "L14", in index order */
    int layer_index[KV_MAX_LAYERS];
    int layer_has_v[KV_MAX_LAYERS];
    int layer_half[KV_MAX_LAYERS]; /* 1: k stored as float16 (exactly representable in half) */
    kv_dtype layer_dtype[KV_MAX_LAYERS][3]; /* q, k, v (v: 0 when absent) */
} kv_trace_info;

/* A layer in host memory, [H][T][D] per array, in one of two forms
 * (issue 12, goal 3): float32 (q, k, v; q16, k16, v16 NULL), or, loaded
 * with KV_LAYER_F16 from a trace whose q, k and v are all float16, the
 * file's float16 bits as they are (q16, k16, v16; q, k, v NULL): half the
 * bytes, uploaded to the GPU as they are, converted per row where the
 * host needs float32 (kv_layer_rows, kv_layer_row). */
typedef struct {
    int Hq, Hkv, T, D;
    float *q; /* [Hq][T][D] */
    float *k; /* [Hkv][T][D] */
    float *v; /* [Hkv][T][D], NULL when the trace has no values */
    int half; /* the file stored k as float16 (so k is exactly representable in half) */
    uint16_t *q16, *k16, *v16; /* the float16 form (v16 NULL without values) */
} kv_layer;

/* Which form kv_trace_load_layer_as loads: float32, or float16 kept when the
 * layer's q, k and v are all float16 (float32 otherwise). */
enum { KV_LAYER_F32 = 0, KV_LAYER_F16 = 1 };
/* 1 when the layer holds the float16 form. */
static inline int kv_layer_is_f16(const kv_layer *L) { return L->k16 != NULL; }
/* 1 when layer `layer`'s q, k (and v) are all stored as float16. */
int kv_trace_layer_f16(const kv_trace_info *info, int layer);
/* Position t of array which ('q', 'k' or 'v') of every head as float32 [H][D] (converted in the float16 form). */
void kv_layer_rows(const kv_layer *L, char which, int t, float *out);
/* Row (head h, position t) of array which as float32: a pointer into the layer (float32 form) or tmp ([D],
 * converted: float16 form). */
const float *kv_layer_row(const kv_layer *L, char which, int h, int t, float *tmp);
/* The float16 form to float32 (the CPU consumers that read whole arrays); no-op in the float32 form. */
kv_status kv_layer_widen(kv_layer *L);
/* Host bytes of the layer's arrays in the form it is held. */
double kv_layer_bytes(const kv_layer *L);

/* Open and validate the root attributes and the layer groups' dataset
 * shapes, types and storage (values are checked when a layer is loaded).
 * Refuses paths of KV_PATH_MAX characters or more and anything but a
 * regular file. Every HDF5 call runs in a child process (datasets/isolate.c):
 * a crash or hang of the library is "FILE: corrupt or unreadable HDF5
 * metadata", KV_ERR_INPUT. */
kv_status kv_trace_open(const char *path, kv_trace_info *info);
/* Host memory available now in bytes (MemAvailable; KVBENCH_MEM_LIMIT, then KVBENCH_MEM_AVAILABLE override it),
 * or -1 when unknown; kv_env_bytes: an environment variable as a number of bytes, -1 when unset or not one. */
double kv_mem_available(void);
double kv_env_bytes(const char *name);
/* Find a layer by name ("L14") or by plain index ("14"); -1 if absent. */
int kv_trace_find_layer(const kv_trace_info *info, const char *name);
/* Load one layer as float32 (converting float16), checking every value is finite. */
kv_status kv_trace_load_layer(const kv_trace_info *info, int layer, kv_layer *out);
/* The same in form KV_LAYER_F32 or KV_LAYER_F16 (the float16 form when the layer is all float16). */
kv_status kv_trace_load_layer_as(const kv_trace_info *info, int layer, int form, kv_layer *out);
void kv_layer_free(kv_layer *l);
/* Token ids, [T]; NULL + KV_OK when the trace has none. */
kv_status kv_trace_load_tokens(const kv_trace_info *info, int **tokens);
/* The same steps in the calling process, without the child (the fuzz
 * harness's entry points: a crash there is what the fuzzer looks for). */
kv_status kv_trace_open_direct(const char *path, kv_trace_info *info);
kv_status kv_trace_load_layer_direct(const kv_trace_info *info, int layer, kv_layer *out);
kv_status kv_trace_load_layer_direct_as(const kv_trace_info *info, int layer, int form, kv_layer *out);
/* How the last load read each dataset: "q: parallel (libdeflate); k: ...; v: library (WHY)".
 * KVBENCH_LOADER=library forces the HDF5 library's read path; KVBENCH_LOADER_VERBOSE=1 prints it with the
 * load's seconds and MB/s. */
const char *kv_trace_last_load(void);
kv_status kv_trace_load_tokens_direct(const kv_trace_info *info, int **tokens);

/* ---- process isolation (datasets/isolate.c) ---- */
/* Runs fn(arg, out) in a forked child with `timeout_s` seconds and
 * `mem_budget` bytes of address space beyond the current size; copies
 * out_bytes of its result back. The child's death or timeout is
 * KV_ERR_INPUT "PATH: corrupt or unreadable HDF5 metadata (WHAT ...)". */
kv_status kv_isolated(const char *path, const char *what, double timeout_s, size_t mem_budget,
                      kv_status (*fn)(void *arg, void *out), void *arg, void *out, size_t out_bytes);
/* The same with a pipe: fn gets its write end, and consume(read end) runs
 * in the parent meanwhile (it must read until it has all or gets EOF). */
kv_status kv_isolated_stream(const char *path, const char *what, double timeout_s, size_t mem_budget,
                             kv_status (*fn)(void *arg, void *out, int fd), void *arg, void *out, size_t out_bytes,
                             kv_status (*consume)(int fd, void *carg), void *carg);
kv_status kv_write_all(int fd, const void *buf, size_t bytes);
kv_status kv_read_all(int fd, void *buf, size_t bytes); /* KV_ERR_IO (no message) at EOF */
/* Anonymous shared memory (visible to the parent after the child writes it). */
void *kv_shared_alloc(size_t bytes, const char *what);
void kv_shared_free(void *p, size_t bytes);

/* ---- writing (synth, slice) ---- */
typedef struct kv_trace_writer kv_trace_writer;
typedef struct {
    const char *model, *description, *rope;
    int head_dim, num_q_heads, num_kv_heads, num_tokens, prefill_len;
    float softmax_scale;
    int half;   /* store q/k/v as float16 */
    int gzip;   /* gzip level 0..9 (0: none) */
    int shuffle, fletcher32; /* HDF5's byte shuffle before gzip; checksum filter after it */
    int contiguous; /* no chunks (gzip 0 only) */
    int chunk_tokens; /* chunk length along T */
} kv_trace_spec;

/* Creates `path` (written to a temp file, renamed into place on close). */
kv_status kv_trace_writer_open(const char *path, const kv_trace_spec *spec, kv_trace_writer **w);
kv_status kv_trace_writer_tokens(kv_trace_writer *w, const int *tokens);
/* Starts layer `index` (group "L<index>"); has_v: whether v is written. */
kv_status kv_trace_writer_layer(kv_trace_writer *w, int index, int has_v);
/* Writes tokens [t0, t0+n) of the current layer; each array is [H][n][D]
 * (NULL v allowed when the layer has no v). */
kv_status kv_trace_writer_rows(kv_trace_writer *w, int t0, int n, const float *q, const float *k,
                               const float *v);
/* Finishes the file and renames it into place (commit=1) or removes it. */
kv_status kv_trace_writer_close(kv_trace_writer *w, int commit);

/* ---- synthetic traces (datasets/synth.c) ---- */
typedef struct {
    int tokens, prefill, q_heads, kv_heads, dim, layers;
    uint64_t seed;
    int half;
    int with_v;
    int gzip, shuffle, fletcher32, contiguous, chunk_tokens; /* storage (0: the defaults, no filter, 4096 tokens) */
} kv_synth_spec;
kv_status kv_synth_write(const char *path, const kv_synth_spec *spec);
/* In-memory generation of one layer's rows [t0, t0+n) into [H][n][D]
 * buffers (the same generator the writer streams), for benchmarks. */
typedef struct kv_synth kv_synth;
kv_status kv_synth_create(const kv_synth_spec *spec, int layer, kv_synth **out);
void kv_synth_rows(kv_synth *s, int t0, int n, float *q, float *k, float *v);
void kv_synth_destroy(kv_synth *s);

#endif
