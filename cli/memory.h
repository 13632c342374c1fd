/* memory.h: what `kvbench run` needs in host and GPU memory, before
 * anything is allocated (cli/memory.c; issue 12, goal 3). */
#ifndef KV_MEMORY_H
#define KV_MEMORY_H

#include "../retrievers/kv_retriever.h"

/* One run's sizes: the trace's shape, the layer's host form and what runs. */
typedef struct {
    double Hq, Hkv, T, P, D;
    int has_v;          /* a selected layer has values */
    int f16_trace;      /* every selected layer's q, k, v stored as float16 */
    int k_half;         /* every selected layer's k stored as float16 (the GPU stores K and V as float16) */
    int layer_f16;      /* the layer is held in the float16 form (kv_layer) */
    int use_gpu;
    int lag, nk, profile; /* --lag > 0, budgets, the budget profile on */
    int steps;          /* decode steps evaluated (rows kept for the results) */
    int n_cpu, n_gpu;   /* method instances on the host, on the GPU */
    int n_gpu_lent;     /* of the GPU instances, those reading the oracle's device K (reads_layer_keys) */
    int n_recs;         /* records (instances x budgets searched) */
    unsigned widen;     /* prefill arrays widened to float32 for methods without prefill_half (KV_PREFILL_*) */
    double sel_lists;   /* the instances' selection lists, all of them ([lists] each) */
} kv_mem_shape;

/* Bytes by item; host and dev the totals. */
typedef struct {
    double layer, prefill, methods, selections, oracle, rows, host;
    double dev_oracle, dev_methods, dev;
} kv_mem_need;

void kv_mem_estimate(const kv_mem_shape *s, kv_mem_need *n);
/* Counts method m into s: `copies` instances (seeds, and budgets for a method whose search updates its state),
 * each searched at `budgets` budgets, on the GPU when use_gpu and it has a CUDA path. */
void kv_mem_add_method(kv_mem_shape *s, const kv_method *m, int copies, int budgets, int use_gpu);
/* The largest T (a multiple of 1024) with P = T - decode whose estimate fits host_bytes and dev_bytes (dev_bytes
 * ignored without use_gpu); s gives the rest of the shape and the methods (its T, P, steps are set here). */
double kv_mem_largest_context(kv_mem_shape s, const kv_method *const *ms, int n_ms, double decode, double host_bytes,
                              double dev_bytes, kv_mem_need *at);
/* The prefill arrays a method needs widened from a float16 layer (0 when it takes the float16 form). */
unsigned kv_prefill_widened(const kv_method *m);

#endif
