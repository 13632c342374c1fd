/* oracle.h: the exact attention of one decode step, the ground truth of
 * the evaluation protocol (cli/protocol.c). For each query head h at
 * step t it gives: m = max_i s_i and Z = sum_i exp(s_i - m) over [0, t];
 * thr = the kk-th largest s_i of the retrievable region [S, t+1-W)
 * (kk = min(k, region size)); o_full = sum_i softmax_i v_i (when the trace
 * has values); ntop_pre / ntop_gen = how many scores of the region at
 * positions < split / >= split are >= thr (the top-k's members by key
 * origin: split is the prefill length, so "generated" keys are those
 * appended after the retrievers built their index); and, on request, s_i
 * at any list of indices. CPU: C
 * reference (float scores from kernels/score_ref.c, double softmax sums).
 * GPU: the layer is uploaded once and every O(t) reduction runs on the
 * device; only the O(k) per-head results come back. */
#ifndef KV_ORACLE_H
#define KV_ORACLE_H

#include "../datasets/kv_trace.h"

typedef struct kv_oracle kv_oracle;

typedef struct {
    float *m, *Z, *thr; /* [Hq] */
    float *o_full;      /* [Hq][D], or NULL when the layer has no values */
    int *ntop_pre, *ntop_gen; /* [Hq] */
} kv_oracle_out;

kv_status kv_oracle_create(const kv_layer *L, float scale, int sink, int local, int k, int split, int use_gpu,
                           kv_oracle **out);
/* Names the trace and layer in error messages (optional). */
void kv_oracle_set_context(kv_oracle *o, const char *path, const char *layer);
/* Computes step t for queries q [Hq][D]; fills `res` (buffers owned by the
 * oracle). A score that is not finite is KV_ERR_INPUT naming the layer,
 * query head, step and key position. */
kv_status kv_oracle_step(kv_oracle *o, int t, const float *q, kv_oracle_out *res);
/* After kv_oracle_step: out[h*cap + j] = s at idx[h*cap + j], j < count[h]. */
kv_status kv_oracle_gather(kv_oracle *o, const int32_t *idx, const int *count, int cap, float *out);
const char *kv_oracle_device(const kv_oracle *o);
void kv_oracle_destroy(kv_oracle *o);

#endif
