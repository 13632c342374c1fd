/* protocol.h: the evaluation protocol (README "Evaluation protocol"): from
 * one step's selection and the oracle's exact attention, the per query
 * head metrics. Raw per-(step, head) rows are kept; windows and overall
 * means are computed from them afterwards (cli/results.c), so a new
 * aggregate needs no rerun. */
#ifndef KV_PROTOCOL_H
#define KV_PROTOCOL_H

#include "../retrievers/kv_retriever.h"
#include "oracle.h"

typedef struct {
    int step, head;
    float recall;      /* hits of selected U extra in the region / min(k, |region|) */
    float recall_sel;  /* the same over the selected indices alone */
    float cand_recall; /* over the method's coarse candidates; NAN if it has none */
    float recall_pre;  /* recall over the top-k members at positions < split (keys of the prefill) */
    float recall_gen;  /* ... at positions >= split (generated after the index was built); NAN if none */
    float gen_share;   /* the fraction of the top-k members that are generated keys */
    float mass;        /* full-softmax probability of the attended set */
    float outerr;      /* |o_att - o_full| / |o_full|; NAN without values */
    int n_sel;         /* distinct selected indices */
    int n_extra;       /* extra indices not already attended as sink/local/selected */
    float metric;      /* the method's own per-step scalar (sel->metric), NAN if it reports none */
} kv_step_metric;

typedef struct kv_protocol kv_protocol;

/* split: the first position of the generated keys (the prefill length),
 * for the recall split by key origin. */
kv_status kv_protocol_create(const kv_layer *L, int sink, int local, int k, int split, kv_protocol **out);
/* Scores step t of `method` (whose search filled `sel`) against the
 * oracle's step result; writes Hq rows to `rows`. Errors (KV_ERR_INTERNAL)
 * when the method broke the contract: an index outside the region, a
 * duplicate, more than k without a variable budget. */
kv_status kv_protocol_score(kv_protocol *p, kv_oracle *o, const kv_oracle_out *ores, int t, const kv_method *m,
                            const kv_selection *sel, int k, kv_step_metric *rows);
/* Declares that the following scores are of step t of one oracle step
 * (the run loop calls it after each kv_oracle_step): the sink/local part of
 * every head's sums is then computed once and shared by the methods scored
 * at t (same numbers). Without it every score computes everything. */
void kv_protocol_new_step(kv_protocol *p, int t);
/* The same scoring with the GPU oracle (issue 12): the attended and
 * candidate lists are built and checked here (the same errors), the
 * arithmetic runs on the device into `slot` (kv_oracle_diag; b = the budget's
 * index in the oracle's list); after kv_oracle_diag_wait (or the next
 * kv_oracle_step), kv_protocol_collect writes the Hq rows of that submission
 * (its step, the method's scalar) and returns 1, once; 0 when the slot holds
 * none; -1 (KV_ERR_INTERNAL set, naming `method`) when the method's device
 * candidates held a position outside [0, t]. dc: the method's candidates on
 * the device (kv_method.candidates_dev), or NULL: those of sel. */
kv_status kv_protocol_submit(kv_protocol *p, kv_oracle *o, int b, int t, const kv_method *m, const kv_selection *sel,
                             int k, int slot, const kv_dev_cands *dc);
int kv_protocol_collect(const kv_protocol *p, kv_oracle *o, int slot, kv_step_metric *rows, const char *method);
void kv_protocol_destroy(kv_protocol *p);

#endif
