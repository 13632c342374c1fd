/* kv_test.h: the test runner's contract. A test is a function returning
 * KV_TEST_PASS, KV_TEST_FAIL or KV_TEST_SKIP; CHECK records a failure
 * with file:line and a message and fails the test; skips print a reason.
 * Tests live in tests/test_*.c and are listed in tests/run_tests.c. */
#ifndef KV_TEST_H
#define KV_TEST_H

#include <math.h>
#include <stdio.h>

#include "../kernels/ops/kv_common.h"
#include "../retrievers/kv_retriever.h"
#include "../datasets/kv_trace.h"

enum { KV_TEST_PASS = 0, KV_TEST_FAIL = 1, KV_TEST_SKIP = 2 };
enum { KV_NEEDS_GPU = 1, KV_NEEDS_SUBPROCESS = 2, KV_NEEDS_PYTHON = 4 };

typedef struct {
    const char *name;
    int (*fn)(void);
    unsigned needs;
} kv_test;

/* Set by a test before returning KV_TEST_SKIP. */
void kv_test_skip_reason(const char *fmt, ...);

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "    %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            return KV_TEST_FAIL;                                              \
        }                                                                     \
    } while (0)

/* |got - want| <= atol + rtol * |want| */
#define CHECK_CLOSE(got, want, atol, rtol)                                    \
    CHECK(fabs((double)(got) - (double)(want)) <= (atol) + (rtol) * fabs((double)(want)), \
          "got %.9g, want %.9g (atol %g, rtol %g)", (double)(got), (double)(want), (double)(atol), (double)(rtol))

#define CHECK_OK(call)                                                        \
    do {                                                                      \
        kv_status st_ = (call);                                               \
        CHECK(st_ == KV_OK, "status %d: %s", (int)st_, kv_last_error());      \
    } while (0)

/* Helpers (tests/util.c): a scratch directory per run, the kvbench binary
 * path (KVBENCH_BIN), running a command and capturing its exit code and
 * stderr. */
const char *kv_test_tmpdir(void);
const char *kv_test_bin(void);
/* The whole of a file as a malloc'd NUL-terminated string (free it), its size in *len (may be NULL); NULL when
 * it cannot be read. */
char *kv_test_read_file(const char *path, size_t *len);
/* Runs `cmd` via /bin/sh; returns the exit code; stderr (and stdout) go to
 * the buffers when given (truncated to cap). */
int kv_test_sh(const char *cmd, char *out, size_t out_cap, char *err, size_t err_cap);
/* 1 when a usable GPU is present (KVBENCH_REQUIRE_GPU=1 turns "no" into a failure). */
/* A fresh seed for tests with random inputs (time and pid), or the value of
 * KVBENCH_TEST_SEED when set, so a failing run's printed seed reproduces:
 * KVBENCH_TEST_SEED=1239212912984247 ./tests/run_tests pariskv_gpu_search_matches_cpu */
uint64_t kv_test_seed(void);
int kv_test_have_gpu(void);

/* An environment variable set for a stretch of a test: kv_test_env_set saves what was there (a value, or none)
 * and sets name to value (NULL: unsets it); kv_test_env_restore puts the saved state back. So a run under
 * device_check.sh's variants (KVBENCH_X=y ./tests/run_tests ...) keeps KVBENCH_X=y for the tests after the one
 * that changed it. */
typedef struct {
    const char *name;
    char *old; /* the earlier value (malloc'd), NULL when it was unset */
} kv_test_env;
void kv_test_env_set(kv_test_env *e, const char *name, const char *value);
void kv_test_env_restore(kv_test_env *e);

/* A small valid-looking trace (layer L3) with a NaN in v (test_loader.c). */
void kv_test_write_nan_trace(const char *path);

/* A retriever driven over a layer (tests/driver.c). open: create method
 * `name` with np "name=value" params, shape from L (scale 1/sqrt(32), seed
 * 11), build on [0, P); selection capacity k (T for variable budgets).
 * step: append positions up to t, then search step t into d->sel. */
typedef struct {
    const kv_method *m;
    void *st;
    kv_shape sh;
    const kv_layer *L;
    int n;            /* positions handed over so far */
    float *kr, *vr, *qr;
    kv_selection sel;
} kv_test_driver;
kv_status kv_test_driver_open(kv_test_driver *d, const char *name, const char *const *params, int np, const kv_layer *L,
                              int P, int sink, int local, int k);
/* The same with shape->use_gpu = 1 (the method's CUDA path). */
kv_status kv_test_driver_open_gpu(kv_test_driver *d, const char *name, const char *const *params, int np,
                                  const kv_layer *L, int P, int sink, int local, int k);
/* The same built from L's float16 form (kv_prefill.half, row stride T; for
 * a method with prefill_half; L's values should be float16-exact). */
kv_status kv_test_driver_open_half(kv_test_driver *d, const char *name, const char *const *params, int np,
                                   const kv_layer *L, int P, int sink, int local, int k, int use_gpu);
kv_status kv_test_driver_step(kv_test_driver *d, int t, int k);
void kv_test_driver_close(kv_test_driver *d);
/* A synthetic layer (datasets/synth.c: float32 q, k, v) of T positions; free with kv_layer_free. */
kv_status kv_test_synth_layer(int T, int P, int Hq, int Hkv, int D, uint64_t seed, kv_layer *L);

#endif
