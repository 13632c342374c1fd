/* kv_retriever.h: the retriever interface (vtable), its parameter tables,
 * the selection a search returns, and the static registry.
 *
 * Lifecycle, driven by the run loop (cli/run.c) for one layer:
 *   create(shape, params) -> build(prefill keys/values/queries, positions
 *   0..P-1) -> for each position t >= P in order: append(t, key, value,
 *   query of t) and, at evaluated steps, search(t, queries of t, k).
 * A retriever only ever sees positions <= t. It returns at most k indices
 * per list from the retrievable region [sink, t+1-local), optionally extra
 * indices it attends densely (an update buffer), optional per-index
 * log-weights, and optionally its coarse candidate set (for methods with a
 * coarse stage, so the protocol can report the coarse stage's recall).
 * Methods declare whether they select per query head or per kv head
 * (group-consistent: one list shared by the G query heads of a group). */
#ifndef KV_RETRIEVER_H
#define KV_RETRIEVER_H

#include <stdio.h>

#include "../kernels/ops/kv_common.h"
#include "../kernels/ops/kv_gpu.h"

#define KV_RETRIEVER_ABI 2 /* 2: search_updates_state, group_pool_param, metric_name (this session) */
#define KV_MAX_PARAMS 24

typedef struct {
    int num_q_heads, num_kv_heads, head_dim, group; /* group = Hq / Hkv */
    int max_tokens;      /* T: positions 0..T-1 will be seen at most */
    int prefill_len;     /* P */
    float softmax_scale;
    int sink, local;     /* the protocol's S and W */
    uint64_t seed;
    int use_gpu;         /* run the CUDA path (the method has one and a GPU is present) */
    /* `kvbench run` on the GPU: the layer's K on the device ([Hkv][T][D], every position: the oracle's copy,
     * issue 12 goal 3), else NULL. A method with reads_layer_keys reads the positions it has been handed from
     * it instead of keeping a device copy of its own; it never reads beyond them (no future key). Others may
     * read its form only (Quest and FreeKV: float16 keys, so float16 page summaries). */
    const kv_gpu_keys *layer_keys;
} kv_shape;

/* ---- parameters: data, read by list, --help and validation alike ---- */
typedef enum { KV_PARAM_INT, KV_PARAM_FLOAT, KV_PARAM_ENUM } kv_param_type;
typedef enum { KV_PARAM_BUILD, KV_PARAM_SEARCH } kv_param_stage;

typedef struct {
    const char *name;
    kv_param_type type;
    kv_param_stage stage;
    double def, min, max;   /* for ENUM: def is the index into choices */
    const char *choices;    /* ENUM only: "analytic|kmeans" */
    const char *help;
} kv_param_spec;            /* tables end with a {NULL} entry */

typedef struct {
    const kv_param_spec *spec;
    int n;
    double val[KV_MAX_PARAMS];
    int set[KV_MAX_PARAMS];  /* given explicitly on the command line */
} kv_param_set;

/* Defaults for every parameter of a table. */
void kv_params_init(kv_param_set *ps, const kv_param_spec *spec);
/* Apply "name=value"; KV_ERR_INPUT (message lists the accepted parameters)
 * for an unknown name, a malformed or out-of-range value. */
kv_status kv_params_set(kv_param_set *ps, const char *method, const char *assignment);
double kv_param(const kv_param_set *ps, const char *name);   /* aborts on a name not in the table */
int kv_param_int(const kv_param_set *ps, const char *name);
int kv_param_is_set(const kv_param_set *ps, const char *name);
/* "k1=v1,k2=v2" with every parameter (enums by name), for results. */
void kv_params_format(const kv_param_set *ps, char *buf, size_t cap);

/* ---- what a search returns ---- */
typedef struct {
    int n_lists;     /* Hq (per query head) or Hkv (per kv head) */
    int n_kv;        /* Hkv */
    int cap;         /* capacity of each list */
    int *count;      /* [n_lists] */
    int32_t *idx;    /* [n_lists][cap] */
    float *logw;     /* [n_lists][cap]; used only when the method sets uses_logw */
    int extra_cap;   /* capacity of each extra list */
    int *n_extra;    /* [Hkv]: tokens attended densely beyond the selection */
    int32_t *extra;  /* [Hkv][extra_cap] */
    int cand_cap;    /* capacity of each candidate list */
    int *n_cand;     /* [n_lists]: coarse candidates (-1, the reset value: none reported) */
    int32_t *cand;   /* [n_lists][cand_cap] */
    float metric;    /* the method's own per-step scalar (kv_method.metric_name), NAN (the reset value): none */
} kv_selection;

/* A search's coarse candidates on the device (kv_method.candidates_dev): rows lists of count key
 * positions, or counts[r] (host, nullable) when they differ, list r at idx + r*ld (device memory, valid
 * until the method's next search or append); one list per query head (rows = Hq) or per kv head (rows =
 * Hkv, shared by the group). */
typedef struct {
    const int32_t *idx;
    long long ld;
    int rows, count;
    const int *counts;
} kv_dev_cands;

kv_status kv_selection_alloc(kv_selection *s, int n_lists, int n_kv, int cap, int extra_cap, int cand_cap);
void kv_selection_reset(kv_selection *s);
void kv_selection_free(kv_selection *s);

/* ---- the prefill handed to build(): tight [H][n][D] float32 arrays ----
 * or, for a method that declares prefill_half, possibly the layer's float16
 * form in place (issue 12, goal 3: a float16 trace stays float16 in host
 * memory): half = 1, k/v/q NULL, k16/v16/q16 the float16 bits [H][ld][D]
 * of which rows 0..n-1 of each head are the prefill (ld, ldq >= n). */
typedef struct {
    int n;              /* positions 0..n-1 */
    const float *k;     /* [Hkv][n][D] */
    const float *v;     /* [Hkv][n][D] or NULL */
    const float *q;     /* [Hq][n][D] or NULL (kvbench bench hands none) */
    int half;           /* 1: the float16 form below instead */
    long long ld, ldq;  /* rows per head of k16 and v16, of q16 */
    const uint16_t *k16, *v16, *q16; /* [H][ld][D] float16 bits (v16, q16 may be NULL) */
} kv_prefill;

/* The prefill's keys in either form (kernels/ops/kv_common.h). */
static inline kv_host_rows kv_prefill_keys(const kv_prefill *pre) {
    kv_host_rows r = {pre->half ? NULL : pre->k, pre->half ? pre->k16 : NULL, pre->half ? pre->ld : pre->n};
    return r;
}
/* The prefill's keys as one tight float32 [H][n][D] array: pre->k itself, or
 * the float16 form widened into a new array *tmp that the caller frees
 * (the CPU paths of methods with prefill_half; NULL on no memory). */
const float *kv_prefill_k32(const kv_prefill *pre, int H, int D, float **tmp);

typedef struct kv_method {
    int abi;                 /* KV_RETRIEVER_ABI */
    const char *name;
    const char *summary;     /* one line for `kvbench list` */
    const char *paper;       /* where it comes from: title, authors, venue (and released code) */
    int per_kv_head;         /* 1: one list per kv head shared by its group */
    int variable_budget;     /* may return more than k (reports effective budget) */
    int uses_logw;           /* fills selection.logw */
    int has_gpu;             /* has a CUDA path */
    int search_updates_state; /* 1: search() changes the state (a second search at the same step, with another
                               * k, would see the first one's changes): `kvbench run --k LIST` then builds one
                               * instance per budget instead of searching one instance at every budget */
    const kv_param_spec *params;
    kv_status (*create)(const kv_shape *shape, const kv_param_set *params, void **state);
    kv_status (*build)(void *state, const kv_prefill *pre);
    /* Position t's key and value ([Hkv][D]) and query ([Hq][D]). */
    kv_status (*append)(void *state, int t, const float *k, const float *v, const float *q);
    /* Queries of step t ([Hq][D]); budget k; fills sel (already reset). */
    kv_status (*search)(void *state, int t, const float *q, int k, kv_selection *sel);
    size_t (*memory_bytes)(const void *state);
    void (*destroy)(void *state);
    /* Optional: extra lines for `kvbench list --verbose` (derived constants). */
    void (*describe)(FILE *f);
    /* Optional: `kvbench bench --method M` on a GPU. Builds the method's
     * index from keys K ([Hkv][>= n][D], on the device, float16; positions
     * 0..n-1 all indexed, shape->prefill_len = n; V the values alike, for a
     * method whose stages read them) and times each stage of one search for
     * queries q ([Hq][D], host) with budget spec->k, each with
     * kv_bench_time (kernels/kv_cuda.h), filling out->stage[] with the
     * bytes each stage must move and out->bytes_note with how they were
     * counted. Without it the GPU bench of the method is refused. */
    kv_status (*bench_gpu)(const kv_shape *shape, const kv_param_set *params, const kv_gpu_bench_spec *spec,
                           const kv_gpu_keys *K, const kv_gpu_keys *V, const float *q, kv_gpu_stages *out);
    /* Optional, for per_kv_head = 0: the name of an ENUM parameter whose
     * values other than "none" pool the queries of a kv group and write
     * one selection into the G query heads' lists of the group (pool=mean).
     * The storage is then per query head but the selections are
     * group-consistent; kv_method_group_consistent() reports that. */
    const char *group_pool_param;
    /* Optional: the name of a per-step scalar the method reports in
     * sel->metric (e.g. FreeKV's "correction_rate": the fraction of kv
     * heads re-selected at the step). The protocol copies it into every
     * row of the step; results give its mean overall (summary.json
     * "method_metric") and per drift window (drift.csv "method_metric").
     * NULL: the method reports none. */
    const char *metric_name;
    /* 1: build() takes the float16 form of the prefill (kv_prefill.half); 0: run hands it float32 copies. */
    int prefill_half;
    /* The prefill arrays build() reads (KV_PREFILL_Q | _K | _V); 0: all of them. A layer held as float16
     * widens only these for the methods without prefill_half (issue 12 goal 3). */
    unsigned prefill_reads;
    /* 1: on the GPU, reads shape->layer_keys when it is set instead of holding its own device copy of K
     * (the preflight counts no keys for it then). */
    int reads_layer_keys;
    /* Optional: the last search's coarse candidates into sel (n_cand, cand), for a method whose search()
     * leaves them out because copying them costs (ParisKV's GPU path: R C ids from the device). They feed
     * the protocol's candidate recall, not the selection, so `kvbench run` calls this after search(),
     * outside its timed region (issue 12 goal 1); kv_method_search() calls both. */
    kv_status (*candidates)(void *state, kv_selection *sel);
    /* Optional, GPU path: the same candidates where they are, on the device (kv_dev_cands), for the run's
     * device evaluation, so they never cross to the host (issue 12 goal 1); `kvbench run` calls it in place
     * of candidates() there. *out->idx NULL: none this search. */
    kv_status (*candidates_dev)(void *state, kv_dev_cands *out);
    /* Optional, GPU path: search() in two halves, so that `kvbench run` queues every method's search of a step
     * on the device before it waits for any (issue 12 goal 1). search_launch queues the search of step t (q read
     * before it returns), its device work between kv_gpu_mark_start and kv_gpu_mark_end of mark (NULL: not
     * queued, nothing to mark), and returns without waiting; search_finish waits for it and completes sel (reset
     * before the launch). Between the two the caller touches neither the state nor sel. On a state created
     * with shape->use_gpu only; search() there is search_launch with no mark, then search_finish. */
    kv_status (*search_launch)(void *state, int t, const float *q, int k, kv_selection *sel, kv_gpu_mark *mark);
    kv_status (*search_finish)(void *state, int t, int k, kv_selection *sel);
} kv_method;
/* search() and then, when the method has it, candidates(): a whole search as a caller outside the run's
 * timed loop wants it (tests, tools). */
kv_status kv_method_search(const kv_method *m, void *state, int t, const float *q, int k, kv_selection *sel);
enum { KV_PREFILL_Q = 1, KV_PREFILL_K = 2, KV_PREFILL_V = 4 };

/* 1 when the method's selections with parameters ps are one per kv head,
 * shared by the G query heads of the group (per_kv_head, or a pooling
 * parameter set to anything but "none"): what `kvbench list` and
 * summary.json report as per_kv_head (retrievers/registry.c). */
int kv_method_group_consistent(const kv_method *m, const kv_param_set *ps);

/* ---- registry (retrievers/registry.c) ---- */
const kv_method *kv_method_find(const char *name);
const kv_method *const *kv_methods(int *count);
/* Lines naming method families compiled out of this build (a library not
 * found at build time), NULL-terminated; `kvbench list` prints them. */
const char *const *kv_methods_absent(void);

#endif
