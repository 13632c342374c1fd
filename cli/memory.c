/* memory.c: the memory a `kvbench run` needs, computed from the trace's
 * shape before anything is allocated (issue 12, goal 3), so that a run
 * that cannot fit is refused at once with the bytes it needs, and so that
 * the largest context that fits a machine can be stated from the same
 * formula (tests/test_cli.c: run_memory_formula). Per layer (layers are
 * evaluated one at a time, all of one shape), with e = 2 for the float16
 * form of the layer, 4 for float32, rows = Hq + Hkv (1 + has_v):
 * Host
 *   layer     e rows T D (with KVBENCH_LAYER=f16 on the CPU path both forms:
 *             the float16 layer is widened after the builds)
 *   prefill   float32 form: the decode rows set aside while the builds read
 *             the prefill in place, 4 rows (T - P) D (with --lag: k, v's
 *             rows and a copy of q's shifted prefix, 4 (Hkv (1 + has_v) (T - P)
 *             + Hq P) D); float16 form: float32 copies of the arrays that
 *             the methods without prefill_half read, 4 P D per head, and
 *             with --lag a float16 copy of q's prefix, 2 Hq P D
 *   methods   per instance on the host one float32 copy of K and a score row
 *             per q head, 4 Hkv T D + 4 Hq T (what exact, the reference,
 *             holds: the vtable cannot tell an index's size before create()
 *             allocates it, so this is the documented estimate; compressed
 *             indexes hold less)
 *   selections every instance's selection buffers, at most: per list indices
 *             and log-weights (up to T each: a variable budget) and candidates
 *             (T), per kv head extras (T), 4 (3 lists + Hkv) T (an upper bound:
 *             most of it is never touched, so it is address space more than RSS)
 *   oracle    CPU: its scores, scratch (float) and softmax terms (double),
 *             16 Hq T; GPU: the pinned host copy of the step's scores, 4 Hq T;
 *             either, with several budgets or the profile, each head's sorted
 *             region, 4 Hq T, and with the profile the radix sort's buffer, 4 Hq T
 *   rows      the per-step metrics kept for the results, records x steps x Hq
 *             x sizeof(kv_step_metric)
 * Device (--device gpu)
 *   oracle    K and V as e' = 2 (k stored as float16) or 4, e' (1 + has_v) Hkv T D,
 *             its scores 4 Hq T, and with several budgets or the profile the
 *             device evaluation's sort keys, two [Hq][T] of 8 bytes, 16 Hq T
 *   methods   per instance on the GPU e' Hkv T D + 4 Hq T (the estimate), without the e' Hkv T D of
 *             keys for a method that reads the oracle's (reads_layer_keys: exact). */
#include <math.h>

#include "memory.h"
#include "protocol.h"

unsigned kv_prefill_widened(const kv_method *m) {
    if (m->prefill_half) return 0;
    return m->prefill_reads ? m->prefill_reads : KV_PREFILL_Q | KV_PREFILL_K | KV_PREFILL_V;
}

void kv_mem_estimate(const kv_mem_shape *s, kv_mem_need *n) {
    double Hq = s->Hq, Hkv = s->Hkv, T = s->T, P = s->P, D = s->D, hv = s->has_v ? 1 : 0;
    double rows = Hq + Hkv * (1 + hv), e = s->layer_f16 ? 2 : 4, ed = s->k_half ? 2 : 4;
    *n = (kv_mem_need){0};
    n->layer = e * rows * T * D;
    if (s->layer_f16 && !s->use_gpu) n->layer += 4 * rows * T * D;
    if (!s->layer_f16)
        n->prefill = s->lag ? 4 * (Hkv * (1 + hv) * (T - P) + Hq * P) * D : 4 * rows * (T - P) * D;
    else
        n->prefill = 4 * P * D * ((s->widen & KV_PREFILL_Q ? Hq : 0) + (s->widen & KV_PREFILL_K ? Hkv : 0) +
                                  (s->widen & KV_PREFILL_V ? Hkv * hv : 0)) + (s->lag ? 2 * Hq * P * D : 0);
    n->methods = s->n_cpu * (4 * Hkv * T * D + 4 * Hq * T);
    n->selections = 4 * T * (3 * s->sel_lists + Hkv * (s->n_cpu + s->n_gpu));
    int multi = s->nk > 1 || s->profile;
    n->oracle = (s->use_gpu ? 4 : 16) * Hq * T + (multi ? 4 * Hq * T : 0) + (s->profile ? 4 * Hq * T : 0);
    n->rows = (double)s->n_recs * s->steps * Hq * sizeof(kv_step_metric);
    n->host = n->layer + n->prefill + n->methods + n->selections + n->oracle + n->rows;
    if (s->use_gpu) {
        n->dev_oracle = ed * (1 + hv) * Hkv * T * D + 4 * Hq * T + (multi ? 16 * Hq * T : 0);
        n->dev_methods = s->n_gpu * (ed * Hkv * T * D + 4 * Hq * T) - s->n_gpu_lent * ed * Hkv * T * D;
        n->dev = n->dev_oracle + n->dev_methods;
    }
}

void kv_mem_add_method(kv_mem_shape *s, const kv_method *m, int copies, int budgets, int use_gpu) {
    if (use_gpu && m->has_gpu) s->n_gpu += copies;
    else s->n_cpu += copies;
    if (use_gpu && m->has_gpu && m->reads_layer_keys) s->n_gpu_lent += copies;
    s->n_recs += copies * budgets;
    s->sel_lists += (double)copies * (m->per_kv_head ? s->Hkv : s->Hq);
    s->widen |= kv_prefill_widened(m);
}

double kv_mem_largest_context(kv_mem_shape s, const kv_method *const *ms, int n_ms, double decode, double host_bytes,
                              double dev_bytes, kv_mem_need *at) {
    s.n_cpu = s.n_gpu = s.n_gpu_lent = s.n_recs = 0;
    s.sel_lists = 0;
    s.widen = 0;
    for (int i = 0; i < n_ms; i++) kv_mem_add_method(&s, ms[i], 1, s.nk, s.use_gpu);
    double lo = 0, hi = (double)(1 << 30) / 1024; /* in units of 1024 tokens; every term grows with T */
    while (hi - lo > 1) {
        double mid = floor((lo + hi) / 2);
        kv_mem_need n;
        s.T = mid * 1024;
        s.P = s.T - decode > 1 ? s.T - decode : 1;
        s.steps = (int)(s.T - s.P);
        kv_mem_estimate(&s, &n);
        if (n.host <= host_bytes && (!s.use_gpu || n.dev <= dev_bytes)) lo = mid;
        else hi = mid;
    }
    s.T = lo * 1024;
    s.P = s.T - decode > 1 ? s.T - decode : 1;
    s.steps = (int)(s.T - s.P);
    if (at) kv_mem_estimate(&s, at);
    return s.T;
}
