/* kv_common.h: the one header every layer of kvbench may include.
 *
 * Status codes, the thread-local last-error message (the Faiss C API's
 * pattern: library code returns a status and leaves a message; only cli/
 * prints and exits), checked allocation, a monotonic clock and a few
 * numeric helpers. It sits in kernels/ because kernels/ is the bottom layer
 * of the house (../shared/ARCHITECTURE.md): nothing here includes anything
 * from cli/, datasets/ or retrievers/. */
#ifndef KV_COMMON_H
#define KV_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVBENCH_VERSION "0.1.0"

typedef enum {
    KV_OK = 0,
    KV_ERR_INTERNAL = 1, /* a bug or an unexpected library failure: exit 1 */
    KV_ERR_INPUT = 2,    /* bad file, bad option, bad parameter: exit 2 */
    KV_ERR_NOMEM = 3,    /* host or GPU allocation failed: exit 1 */
    KV_ERR_GPU = 4,      /* CUDA runtime / cuBLAS failure: exit 1 */
    KV_ERR_IO = 5        /* read/write/rename failed: exit 1 */
} kv_status;

/* Set the calling thread's last error (printf-style) and return `st`, so
 * library code can write `return kv_fail(KV_ERR_INPUT, "...", ...)`. */
kv_status kv_fail(kv_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *kv_last_error(void);
void kv_clear_error(void);
/* Process exit code for a status: 0 ok, 2 bad input, 1 anything else. */
int kv_exit_code(kv_status st);

/* Allocation that records a message on failure (returns NULL). */
void *kv_malloc(size_t bytes, const char *what);
void *kv_calloc(size_t n, size_t size, const char *what);

#define KV_TRY(call)                          \
    do {                                      \
        kv_status kv_try_st_ = (call);        \
        if (kv_try_st_ != KV_OK) return kv_try_st_; \
    } while (0)

/* Monotonic wall clock in seconds. */
double kv_now(void);

/* 1 unless the environment variable is "0": the switches that turn a default off (KVBENCH_...=0). */
int kv_env_on(const char *name);
/* 1 when the environment variable is exactly "1": the switches that turn a non-default path on (KVBENCH_...=1). */
int kv_env_is1(const char *name);

/* Deterministic PRNG (splitmix64 seeding + xoshiro256**), one state per
 * user: no global state. */
typedef struct { uint64_t s[4]; } kv_rng;
void kv_rng_seed(kv_rng *r, uint64_t seed);
uint64_t kv_rng_u64(kv_rng *r);
double kv_rng_uniform(kv_rng *r);  /* [0, 1) */
double kv_rng_normal(kv_rng *r);   /* N(0, 1), Box-Muller */

/* IEEE half <-> float, for traces stored as float16. */
float kv_half_to_float(uint16_t h);
/* n halves to float32 (F16C when the CPU has it, else one at a time; the same bits either way). */
void kv_half_to_float_n(const uint16_t *src, float *dst, size_t n);
uint16_t kv_float_to_half(float f);

/* Rows of D floats on the host, H heads of them, held as float32 (f32) or as
 * float16 bits (f16; the other NULL): head h's row i at (h * ld + i) * D.
 * A layer held as float16 reaches a build in this form (issue 12, goal 3),
 * so a build widens only what it reads, a chunk at a time. */
typedef struct { const float *f32; const uint16_t *f16; long long ld; } kv_host_rows;
/* Positions a build widens at a time from the float16 form (one [H][8192][D] float buffer). */
#define KV_HOST_ROWS_CHUNK 8192
/* A walk over rows [at, end) of every head as float32, a chunk at a time: the
 * float32 form in place, as one chunk; the float16 form widened into the
 * walk's buffer ([H][KV_HOST_ROWS_CHUNK][D] floats) KV_HOST_ROWS_CHUNK
 * positions at a time (only the GPU paths keep the float16 form). ParisKV's,
 * PQCache's and MagicPIG's builds read their prefill keys this way;
 * setting at back walks the rows again with the same buffer. */
typedef struct {
    const kv_host_rows *x;
    int H, D, at, end;
    float *buf;
} kv_rows_walk;
/* Starts a walk over [a, end) (what names the buffer in an out-of-memory message). */
kv_status kv_rows_walk_start(kv_rows_walk *w, const kv_host_rows *x, int H, int D, int a, int end, const char *what);
/* The next chunk, rows [*a, *a + *n): head h's row i at ret + h * (*hstride) + (i - *a) * D; NULL once done. */
const float *kv_rows_walk_next(kv_rows_walk *w, int *a, int *n, size_t *hstride);
void kv_rows_walk_end(kv_rows_walk *w);
/* Rows [a, a+n) of head h as float32 into dst ([n][D]). */
void kv_host_rows_head(const kv_host_rows *x, int h, int D, int a, int n, float *dst);

/* Percentile (q in [0,1], linear interpolation) of n values; sorts `v`. */
double kv_percentile_inplace(float *v, size_t n, double q);

#ifdef __cplusplus
}
#endif
#endif
