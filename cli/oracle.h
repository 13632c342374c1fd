/* oracle.h: the exact attention of one decode step, the ground truth of
 * the evaluation protocol (cli/protocol.c). For each query head h at
 * step t it gives: m = max_i s_i and Z = sum_i exp(s_i - m) over [0, t];
 * thr = the kk-th largest s_i of the retrievable region [S, t+1-W)
 * (kk = min(k, region size)); o_full = sum_i softmax_i v_i (when the trace
 * has values); ntop_pre / ntop_gen = how many scores of the region at
 * positions < split / >= split are >= thr (the top-k's members by key
 * origin: split is the prefill length, so "generated" keys are those
 * appended after the retrievers built their index); and, on request, s_i
 * at any list of indices. Several budgets (kv_oracle_create_ks): one
 * step computes m, Z and o_full once; the region's scores are sorted once
 * (descending) and every k's threshold and origin counts are read from
 * that one order (kv_oracle_view picks k number i). The budget profile
 * (issue 11): per head the smallest number of region tokens, taken in
 * descending score order (which minimises the count), whose softmax mass
 * together with sink and local reaches p, for each p of KV_PROFILE_P.
 * CPU: C
 * reference (float scores from kernels/score_ref.c, double softmax sums).
 * GPU: the layer is uploaded once and every O(t) reduction runs on the
 * device; only the O(k) per-head results come back. */
#ifndef KV_ORACLE_H
#define KV_ORACLE_H

#include "../datasets/kv_trace.h"
#include "../kernels/ops/kv_gpu.h"

typedef struct kv_oracle kv_oracle;

/* The budget profile's mass targets. */
#define KV_NPROFILE 5
extern const double kv_profile_p[KV_NPROFILE]; /* 0.5, 0.8, 0.9, 0.95, 0.99 */

typedef struct {
    float *m, *Z, *thr; /* [Hq] */
    float *o_full;      /* [Hq][D], or NULL when the layer has no values */
    int *ntop_pre, *ntop_gen; /* [Hq] */
    int *budget;        /* [Hq][KV_NPROFILE] region tokens needed to reach each p (profile on), else NULL */
} kv_oracle_out;

kv_status kv_oracle_create(const kv_layer *L, float scale, int sink, int local, int k, int split, int use_gpu,
                           kv_oracle **out);
/* The same for budgets ks[0..nk) (distinct, each >= 1) and, when profile
 * is set, the budget profile of every step. kv_oracle_step's result holds
 * budget 0; kv_oracle_view gives budget i of the same step. */
kv_status kv_oracle_create_ks(const kv_layer *L, float scale, int sink, int local, const int *ks, int nk, int split,
                              int use_gpu, int profile, kv_oracle **out);
/* After kv_oracle_step: the result for budget ks[i] (shares m, Z, o_full). */
void kv_oracle_view(const kv_oracle *o, int i, kv_oracle_out *res);
/* The profile of one head from its scores s[0..t] (t = the step), with
 * m = max s and Z = sum exp(s - m): out[j] for kv_profile_p[j]. `sorted`
 * holds the n_sorted largest scores of the region [sink, t+1-local) in
 * descending order; returns 1 (out incomplete) when some p needs more of
 * them, else 0. */
int kv_profile_head(const float *s, int t, int sink, int local, double m, double Z, const float *sorted,
                    int n_sorted, int *out);
/* Names the trace and layer in error messages (optional). */
void kv_oracle_set_context(kv_oracle *o, const char *path, const char *layer);
/* Computes step t for queries q [Hq][D]; fills `res` (buffers owned by the
 * oracle). A score that is not finite is KV_ERR_INPUT naming the layer,
 * query head, step and key position. */
kv_status kv_oracle_step(kv_oracle *o, int t, const float *q, kv_oracle_out *res);
/* After kv_oracle_step: out[h*cap + j] = s at idx[h*cap + j], j < count[h]. */
kv_status kv_oracle_gather(kv_oracle *o, const int32_t *idx, const int *count, int cap, float *out);
const char *kv_oracle_device(const kv_oracle *o);
/* GPU oracle with several budgets or the profile: heads whose thresholds and
 * profile the host recomputed so far (the device's sums were within their
 * rounding bound of a profile target; kernels/ops/attn_eval.cu). */
long kv_oracle_host_heads(const kv_oracle *o);
/* 1: the GPU oracle evaluates on the device (thresholds, profile and, through
 * kv_protocol_submit, the protocol's diagnostics); 0 on the CPU and with
 * KVBENCH_HOST_EVAL=1, which keeps the host path (every score copied to the
 * host each step) as the reference to compare with. */
int kv_oracle_device_eval(const kv_oracle *o);
/* GPU oracle: its device copy of the layer's K (kv_gpu_attn_keys); NULL on the CPU. */
const kv_gpu_keys *kv_oracle_gpu_keys(const kv_oracle *o);
/* GPU oracle: device seconds of its steps, their evaluation and the diagnostics (kv_gpu_attn_times); 0 on the CPU. */
void kv_oracle_gpu_times(const kv_oracle *o, double *step_s, double *eval_s, double *diag_s);
/* GPU oracle only: the protocol's diagnostics on the device (kv_gpu.h
 * kv_gpu_attn_diag; cli/protocol.c kv_protocol_submit and _collect).
 * n slots, one per method record; a slot's rows are valid after
 * kv_oracle_diag_wait (or kv_oracle_diag_flush and then the next
 * kv_oracle_step, which waits too). */
kv_status kv_oracle_diag_slots(kv_oracle *o, int n);
kv_status kv_oracle_diag(kv_oracle *o, int slot, const kv_gpu_diag_in *in);
kv_status kv_oracle_diag_flush(kv_oracle *o); /* launches the packed slots (after a step's searches) */
kv_status kv_oracle_diag_wait(kv_oracle *o);
/* A slot's rows once, with their step and method scalar (kv_gpu_attn_diag_take); NULL: none held. */
const kv_gpu_diag_row *kv_oracle_diag_take(kv_oracle *o, int slot, int *t, float *metric);
void kv_oracle_destroy(kv_oracle *o);

#endif
