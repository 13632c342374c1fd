/* kv_gpu.h: the C-callable face of the CUDA code (extern "C" launchers
 * and device-resident objects) of the shared primitives in kernels/ops/.
 * Built from the kernels/ops/ .cu files when nvcc is found; otherwise
 * kernels/ops/gpu_stub.c provides the same symbols, each reporting that this
 * binary has no CUDA. Nothing here knows which method
 * or which protocol calls it. */
#ifndef KV_GPU_H
#define KV_GPU_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int available;        /* a usable GPU is present */
    char name[256];       /* device name */
    char reason[256];     /* why not available (the CUDA error name), or "" */
    int driver_version;   /* cudaDriverGetVersion, e.g. 13000 */
    int runtime_version;
    int sm_count;
    size_t mem_total;
} kv_gpu_info;

/* Never fails: any error from cudaGetDeviceCount means "no GPU" and its
 * name becomes info->reason. */
void kv_gpu_probe(kv_gpu_info *info);
/* Free device memory in bytes (cudaMemGetInfo on device 0); 0 when unknown or without CUDA. */
size_t kv_gpu_mem_free(void);
/* What every GPU path of a build without nvcc reports. */
#define KV_NO_CUDA "this kvbench was built without CUDA (nvcc was not found at build time)"

/* A method's CUDA path is one table of launchers, declared in its
 * kernels/<m>.h as `extern const kv_<m>_cuda_ops kv_<m>_cuda KV_GPU_TABLE;`
 * and defined in its kernels/<m>.cu. Outside nvcc the declaration is weak,
 * so a build without nvcc links with the table absent (its address is
 * NULL): no per-method stub file repeats the launchers' signatures. The
 * retriever asks once, at create(), with kv_gpu_table(&kv_<m>_cuda). */
#ifdef __CUDACC__
#define KV_GPU_TABLE
#else
#define KV_GPU_TABLE __attribute__((weak))
#endif
static inline kv_status kv_gpu_table(const void *table) {
    return table ? KV_OK : kv_fail(KV_ERR_GPU, KV_NO_CUDA);
}

/* 1 when this binary was compiled with CUDA kernels. */
int kv_gpu_compiled(void);

/* ---- exact attention of one step over a device-resident layer (oracle) ---- */
typedef struct kv_gpu_attn kv_gpu_attn;
typedef struct kv_gpu_keys kv_gpu_keys; /* the device key/value store (below) */
typedef struct kv_gpu_mark kv_gpu_mark; /* a queued search's events (below) */
/* Uploads K (as float16 when half=1, exactly representable then; else
 * float32) and V ([Hkv][T][D]); V may be NULL. */
kv_status kv_gpu_attn_create(int Hq, int Hkv, int T, int D, int half, const float *K, const float *V,
                             kv_gpu_attn **out);
/* The same from a layer's float16 form: K, V float16 bits [Hkv][T][D] (V may be NULL), uploaded as they are. */
kv_status kv_gpu_attn_create_half(int Hq, int Hkv, int T, int D, const uint16_t *K, const uint16_t *V,
                                  kv_gpu_attn **out);
/* Step t, queries q [Hq][D] (host): per head m, Z, thr (k-th largest of
 * [lo, hi)) and o_full [Hq][D] (skipped when V is NULL), all to host; ntop
 * (nullable, [2][Hq]): how many scores of [lo, split) and of [split, hi)
 * are >= thr (the top-k's members by key origin). */
kv_status kv_gpu_attn_step(kv_gpu_attn *a, int t, const float *q, float scale, int lo, int hi, int k, float *m,
                           float *Z, float *thr, float *o_full, int split, int *ntop);
/* Scores of the last step at idx[h*cap + j], j < count[h], to host out. */
kv_status kv_gpu_attn_gather(kv_gpu_attn *a, const int32_t *idx, const int *count, int cap, float *out);
/* Every score of the last step, [Hq][0, t] with row stride T, copied once
 * (one 2-D copy into pinned host memory owned by the oracle) to *rows; *n
 * = t + 1: the host evaluation (KVBENCH_HOST_EVAL=1, cli/oracle.c), the
 * reference the device evaluation below is checked against. */
kv_status kv_gpu_attn_scores(kv_gpu_attn *a, const float **rows, int *n);
void kv_gpu_attn_destroy(kv_gpu_attn *a);
/* The oracle's device copy of K ([Hkv][T][D], every position, written once
 * at create): `kvbench run` lends it to a method that reads the layer's keys
 * instead of holding its own (kv_shape.layer_keys). */
const kv_gpu_keys *kv_gpu_attn_keys(const kv_gpu_attn *a);
/* Several budgets and the budget profile on the device (issue 12; host
 * version: cli/oracle.c multi_head). kv_gpu_attn_multi_init once: budgets
 * ks[0..nk) and whether the profile is wanted. Then after each
 * kv_gpu_attn_step (called with k = 0: no threshold of its own), for the
 * region [lo, hi) of that step: each head's region sorted descending on the
 * device; thr[b*Hq + h] = the min(ks[b], n)-th largest (INFINITY for n = 0);
 * ntop[b*2*Hq + h] / [b*2*Hq + Hq + h] the top-k members at positions <
 * split / >= split; with the profile, budget[h*5 + j] the region tokens
 * needed for mass ptarget[j] (kv_profile_head's definition). The profile's
 * sums are taken in another order than the host's, so each crossing is
 * checked against a bound on both rounding errors (and on one ulp of exp per
 * term); uncertain[h] = 1 when some crossing of head h is within it: the
 * caller recomputes that head on the host (kv_gpu_attn_row). Synchronous. */
kv_status kv_gpu_attn_multi_init(kv_gpu_attn *a, const int *ks, int nk, int profile);
kv_status kv_gpu_attn_multi(kv_gpu_attn *a, int lo, int hi, int split, const double *ptarget, float *thr, int *ntop,
                            int *budget, int *uncertain);
/* Head h's scores of the last step, [0, t], to host out (t + 1 floats). */
kv_status kv_gpu_attn_row(kv_gpu_attn *a, int h, float *out);

/* The protocol's per-head diagnostics of one method-step on the device
 * (cli/protocol.c kv_protocol_submit: the attended lists are built and
 * checked on the host, the O(k D) arithmetic runs here): the same
 * definitions and the same double operations in the same order as
 * kv_protocol_score (no FMA contraction), reading the oracle's scores, V,
 * m, Z, o_full and budget b's threshold and origin counts of the last step.
 * Asynchronous on the oracle's stream: the rows of a slot are valid after
 * kv_gpu_attn_diag_wait (or a flush and then the next kv_gpu_attn_step,
 * which waits too). */
typedef struct {
    float recall, recall_sel, cand_recall, recall_pre, recall_gen, gen_share, mass, outerr;
    int n_sel, n_extra;
    int cand_bad; /* a candidate position outside [0, t] (device candidates: the method's error) */
} kv_gpu_diag_row;
typedef struct {
    int b;           /* budget index (kv_gpu_attn_multi's), 0 without it */
    int kk, split;   /* min(k, region size); the prefill length */
    int t;           /* the step, and the method's own scalar (NAN: none): kept with the rows */
    float metric;
    int cap;         /* row stride of att, flag, logw */
    const int *count;
    const int32_t *att;
    const uint8_t *flag; /* 1: in the region, 2: selected, 4: extra */
    const float *logw;
    int has_logw;    /* 0: every log-weight is 0 (logw is not read) */
    int share;       /* > 1: the heads of each run of `share` have one list, head h - h % share's (its count[],
                      * att, flag and logw; the others' are not read) */
    int has_cand;    /* 0: cand_recall NAN */
    int ccap;
    const int *ccount;
    const int32_t *cidx;
    /* or the candidates on the device (dcidx not NULL; ccount, cidx unused): drows lists (Hq: one per query
     * head; Hkv: one per kv head, shared by its group), list r at dcidx + r*dld, dcount positions each, or
     * dcounts[r] (host, nullable) when the lists differ in length; read where they are, copied first (on the
     * oracle's stream) only when several budgets search in a step */
    const int32_t *dcidx;
    long long dld;
    int drows, dcount;
    const int *dcounts;
} kv_gpu_diag_in;
kv_status kv_gpu_attn_diag_slots(kv_gpu_attn *a, int n_slots);
/* Packs one method-step into `slot` (host only); kv_gpu_attn_diag_flush
 * launches every packed slot on the oracle's stream (the run loop flushes
 * after the step's searches, so the diagnostics never share the GPU with a
 * timed search); _wait flushes and waits. */
kv_status kv_gpu_attn_diag(kv_gpu_attn *a, int slot, const kv_gpu_diag_in *in);
kv_status kv_gpu_attn_diag_flush(kv_gpu_attn *a);
kv_status kv_gpu_attn_diag_wait(kv_gpu_attn *a);
/* Device seconds so far (CUDA events on the oracle's stream): the steps
 * (query upload, scores, threshold, softmax + PV, results back), their
 * several-budget / profile evaluation (sort, profile, counts, back), the
 * diagnostics (uploads, kernels, rows back). */
void kv_gpu_attn_times(const kv_gpu_attn *a, double *step_s, double *eval_s, double *diag_s);
/* After kv_gpu_attn_diag_wait (or the next step): the [Hq] rows of slot's
 * last packing, with its step and scalar, once; NULL when the slot holds
 * none (nothing packed, or already taken). */
const kv_gpu_diag_row *kv_gpu_attn_diag_take(kv_gpu_attn *a, int slot, int *t, float *metric);

/* ---- device-resident keys (or values) [H][T][D] ---- */
/* Largest k the GPU top-k returns indices for (its final stage sorts in
 * shared memory); thresholds alone have no limit. */
#define KV_GPU_TOPK_MAX 8192
/* half = 1: stored as float16 while every written value is exactly
 * representable (the trace stored float16); the first value that is not
 * widens the store to float32 on the device, so storage is always lossless.
 * half = 0: float32. Allocates all device memory here. */
kv_status kv_gpu_keys_create(int H, int T, int D, int half, kv_gpu_keys **out);
/* Writes positions [t0, t0+n) from x [H][n][D]. Synchronous. */
kv_status kv_gpu_keys_write(kv_gpu_keys *k, int t0, int n, const float *x);
/* Same from float16 bits [H][n][D] (a float16 store only). */
kv_status kv_gpu_keys_write_half(kv_gpu_keys *k, int t0, int n, const uint16_t *x);
/* Same from float16 bits [H][ld][D], rows [0, n) of each head (a layer's float16 form in place, ld = T). */
kv_status kv_gpu_keys_write_half_ld(kv_gpu_keys *k, int t0, int n, const uint16_t *x, long long ld);
/* Bytes per stored element (2 or 4). */
int kv_gpu_keys_elem_bytes(const kv_gpu_keys *k);
void kv_gpu_keys_destroy(kv_gpu_keys *k);

/* ---- exact search: scores + top-k per query head, fused ---- */
typedef struct kv_gpu_search kv_gpu_search;
kv_status kv_gpu_search_create(int Hq, int Hkv, int T, int D, kv_gpu_search **out);
/* For each query head h (kv head h/G), the top min(k, hi-lo) positions i in
 * [lo, hi) of scale * <q_h, K[i]> in kv_topk_ref order (scores bitwise equal
 * to kv_scores_ref). q [Hq][D] on the host (read before launch returns). launch queues the search (mark: see
 * kv_gpu_mark, NULL when not queued by the run); fetch waits for it and writes idx[h*ld + j], count[h]. */
kv_status kv_gpu_search_launch(kv_gpu_search *s, const kv_gpu_keys *K, const float *q, float scale, int lo, int hi,
                               int k, kv_gpu_mark *mark);
kv_status kv_gpu_search_fetch(kv_gpu_search *s, int32_t *idx, int ld, int *count);
void kv_gpu_search_destroy(kv_gpu_search *s);

/* ---- host-array entry points (tests, tools) ---- */
/* out[h][i - lo] = scale * <q_h, K_{h/G}[i]>, i in [lo, hi); K [Hkv][T][D]
 * uploaded as float16 when half = 1 (and exact), else float32. */
kv_status kv_gpu_scores_host(const float *q, const float *K, int Hq, int Hkv, int T, int D, int half, float scale,
                             int lo, int hi, float *out);
/* Per row r of scores [R][n]: kv_topk_ref(row, n, k, base, idx + r*min(k,n), val + ...)
 * and kth[r] = the min(k, n)-th largest; val, kth nullable; idx NULL: kth only. */
kv_status kv_gpu_topk_host(const float *scores, int R, int n, int k, int base, int32_t *idx, float *val,
                           float *kth);

/* ---- timing of the shared kernels (kvbench bench) ---- */
typedef struct {
    int Hq, Hkv, n, D, k, reps, warmup;
    float scale;
    void *stream; /* the bench process's stream (kv_gpu_bench_stream_create), on which every timer of every
                     length and method launches (required) */
} kv_gpu_bench_spec;
/* One CUDA stream (kv_stream_create) for a whole `kvbench bench` process. A decode
 * loop launches on one long-lived stream; a stream destroyed and created
 * again per length lost FreeKV's programmatic-dependent-launch overlap on
 * every length after the first (about 2 us of 65 at 1M, session 9). */
kv_status kv_gpu_bench_stream_create(void **out);
void kv_gpu_bench_stream_destroy(void *st);
typedef struct {
    double med_us, p90_us;
} kv_gpu_timing;
typedef struct {
    kv_gpu_timing score;  /* scores of all Hq heads over n keys */
    kv_gpu_timing topk;   /* top-k of the Hq score rows (given the scores) */
    kv_gpu_timing attn;   /* softmax + PV over the n tokens (given the scores) */
    kv_gpu_timing exact;  /* the exact search on the device: fused scores + top-k */
    kv_gpu_timing exact_scores; /* its first launch alone: scores + tile maxima (+ the top-k's histogram if built) */
    size_t l2_bytes, flush_bytes;
} kv_gpu_bench_out;
/* K, V: [Hkv][>=n][D] stores; q [Hq][D] host. Before every timed repetition
 * a buffer of flush_bytes (>= 3x L2) is read, so no stage finds its inputs
 * in L2; CUDA events around each stage; median and p90 over reps. */
kv_status kv_gpu_bench_run(const kv_gpu_bench_spec *s, const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q,
                           kv_gpu_bench_out *out);
/* Per-stage timings of one method's search (kvbench bench --method M, the
 * retriever's bench_gpu hook): each stage timed like the exact stages above
 * (kv_bench_timer in kv_cuda.h: L2 flushed before every repetition, CUDA
 * events, median and p90), with the bytes it must move at least. */
#define KV_GPU_MAX_STAGES 9
typedef struct {
    const char *name;  /* static string, e.g. "collision" */
    kv_gpu_timing t;
    double bytes;      /* bytes the stage must read + write at least */
} kv_gpu_stage;
typedef struct {
    int n;                               /* stages filled */
    kv_gpu_stage stage[KV_GPU_MAX_STAGES];
    char bytes_note[512];                /* how the bytes were counted (per key), printed under the table */
    size_t l2_bytes, flush_bytes;
} kv_gpu_stages;

/* Device-to-device cudaMemcpy of `bytes`, median of reps: GB/s counting
 * bytes read plus bytes written. */
kv_status kv_gpu_copy_bandwidth(size_t bytes, int reps, double *gbs);

/* Page-locks host memory [p, p + bytes) in place (cudaHostRegister), so that device-to-host copies into it
 * go straight to it instead of through the driver's staging buffer; 1 when locked, 0 otherwise (no GPU, or
 * the driver refused: copies then stay correct, only slower). kv_gpu_host_unpin undoes it. */
int kv_gpu_host_pin(void *p, size_t bytes);
void kv_gpu_host_unpin(void *p);
/* ---- a search queued by `kvbench run` (issue 12 goal 1) ----
 * The run queues every method's search of a step before it waits for any (kv_method.search_launch), one after
 * another on the device: a mark's search uploads its query, waits for the previous mark's end
 * (kv_gpu_mark_after), then records its start; its end is recorded after its last kernel, before its result
 * is copied back. Its time is the device time between the two (CUDA events): its kernels over device-resident
 * inputs, queued, as `kvbench bench` times a search (query uploaded before, kernels queued behind its L2
 * flush). In a model the query is on the device already and the selection stays there.
 * Every function takes a NULL mark as "not queued" and does nothing. */
kv_status kv_gpu_mark_create(kv_gpu_mark **out);
void kv_gpu_mark_destroy(kv_gpu_mark *m);
void kv_gpu_mark_after(kv_gpu_mark *m, const kv_gpu_mark *prev);   /* prev NULL: waits for nothing */
kv_status kv_gpu_mark_start(kv_gpu_mark *m, void *stream);         /* stream: the search's cudaStream_t */
kv_status kv_gpu_mark_end(kv_gpu_mark *m, void *stream);
/* Seconds from start to end (waits for the end); 0 when the search queued nothing. */
kv_status kv_gpu_mark_seconds(kv_gpu_mark *m, double *s);
/* A device copy of n ints (tests: a method's device candidate lists); kv_gpu_free releases it. */
kv_status kv_gpu_upload_ints(const int32_t *x, size_t n, int32_t **out);
void kv_gpu_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
