/* protocol.c: per-step metrics of the evaluation protocol (README,
 * "Evaluation protocol"; the definitions are the contract every retriever
 * and every plot relies on). For query head h of kv head g = h / G at
 * step t, the attended set is sink [0, S) U local [t+1-W, t] U selected
 * (list h, or g for group-consistent methods) U extra (of g), without
 * duplicates. Scores of the attended set come from the oracle (the same
 * numbers its threshold was taken from), so a tie is judged consistently
 * on CPU and GPU. o_att applies the softmax over the attended logits
 * (plus the method's log-weights on selected tokens) to V, in double.
 * The recall split by key origin divides the hits at positions < split
 * (the prefill, indexed at build) and >= split (keys generated during
 * decoding) by the oracle's count of top-k members of each origin, so a
 * method whose index goes stale on decode-time keys shows it in
 * recall_gen directly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"
#include "../kernels/ops/score.h"

enum { F_REGION = 1, F_SEL = 2, F_EXTRA = 4 };

struct kv_protocol {
    const kv_layer *L;
    int sink, local, k, G, split;
    int cap;           /* per-head capacity of the attended lists */
    int32_t *att;      /* [Hq][cap] attended indices */
    uint8_t *flag;     /* [Hq][cap] */
    float *logw;       /* [Hq][cap] */
    float *score;      /* [Hq][cap] */
    int *count;        /* [Hq] */
    int *stamp;        /* [T]: position -> slot+1 in the current head's list, or 0 */
    uint64_t *pbits;   /* [T/64]: the positions of a long ascending prefix (prefix_bits), else all 0 */
    int ccap;          /* candidate gather capacity */
    float *cscore;     /* [Hq][ccap] */
    int32_t *cidx;     /* [Hq][ccap] */
    int *ccount;
    double *acc;       /* [Hq][D] the attended outputs (heads are scored in parallel) */
    double *ew;        /* [Hq][cap] exp(s - m) of each attended score, reused for the output's weights */
    /* Step cache (kv_protocol_new_step, issue 12): the sink and local entries
     * open every method's attended list of a head in the same order with the
     * same scores, so their exp terms, their partial mass and (when a method's
     * weights are those terms) their partial output sum are computed once per
     * step and head and continued from, which gives the same sums bit for bit. */
    int cache_t;       /* the step the cache is for; -1: off */
    int *c0;           /* [Hq] sink + local entries at the head of the list (build_lists) */
    uint8_t *cmass_ok, *cacc_ok; /* [Hq] */
    double *cew;       /* [Hq][sink + local] */
    double *cmass;     /* [Hq] */
    double *cacc;      /* [Hq][D + 1]: the partial output, then the partial weight sum */
    float *vrow;       /* [Hq][D]: a value row converted from the layer's float16 form (issue 12 goal 3) */
};

static kv_status grow(kv_protocol *p, int cap) {
    if (cap <= p->cap) return KV_OK;
    int Hq = p->L->Hq;
    free(p->att); free(p->flag); free(p->logw); free(p->score); free(p->ew);
    p->ew = kv_malloc((size_t)Hq * cap * sizeof(double), "attended weights");
    p->att = kv_malloc((size_t)Hq * cap * sizeof(int32_t), "attended indices");
    p->flag = kv_malloc((size_t)Hq * cap, "attended flags");
    p->logw = kv_malloc((size_t)Hq * cap * sizeof(float), "attended log-weights");
    p->score = kv_malloc((size_t)Hq * cap * sizeof(float), "attended scores");
    p->cap = cap;
    if (!p->att || !p->flag || !p->logw || !p->score || !p->ew) { p->cap = 0; return KV_ERR_NOMEM; }
    return KV_OK;
}

kv_status kv_protocol_create(const kv_layer *L, int sink, int local, int k, int split, kv_protocol **out) {
    kv_protocol *p = kv_calloc(1, sizeof *p, "protocol");
    if (!p) return KV_ERR_NOMEM;
    p->L = L; p->sink = sink; p->local = local; p->k = k; p->G = L->Hq / L->Hkv; p->split = split;
    p->count = kv_calloc((size_t)L->Hq, sizeof(int), "attended counts");
    p->ccount = kv_calloc((size_t)L->Hq, sizeof(int), "candidate counts");
    p->stamp = kv_calloc((size_t)L->T, sizeof(int), "attended stamps");
    p->pbits = kv_calloc(((size_t)L->T + 63) / 64, sizeof(uint64_t), "attended prefix bits");
    p->acc = kv_malloc((size_t)L->Hq * L->D * sizeof(double), "attended outputs");
    p->cache_t = -1;
    p->c0 = kv_calloc((size_t)L->Hq, sizeof(int), "protocol step cache");
    p->cmass_ok = kv_calloc((size_t)L->Hq, 2, "protocol step cache");
    p->cacc_ok = p->cmass_ok ? p->cmass_ok + L->Hq : NULL;
    p->cew = kv_malloc((size_t)L->Hq * (sink + local + 1) * sizeof(double), "protocol step cache");
    p->cmass = kv_malloc((size_t)L->Hq * sizeof(double), "protocol step cache");
    p->cacc = kv_malloc((size_t)L->Hq * (L->D + 1) * sizeof(double), "protocol step cache");
    p->vrow = kv_layer_is_f16(L) ? kv_malloc((size_t)L->Hq * L->D * sizeof(float), "protocol value rows") : NULL;
    /* sink, local and k are each at most T here (cli/run.c), so the sum fits */
    if (!p->count || !p->ccount || !p->stamp || !p->pbits || !p->acc || !p->c0 || !p->cmass_ok || !p->cew ||
        !p->cmass || !p->cacc || (kv_layer_is_f16(L) && !p->vrow) || grow(p, sink + local + k + 64) != KV_OK) {
        kv_protocol_destroy(p);
        return KV_ERR_NOMEM;
    }
    *out = p;
    return KV_OK;
}

void kv_protocol_destroy(kv_protocol *p) {
    if (!p) return;
    free(p->att); free(p->flag); free(p->logw); free(p->score); free(p->count); free(p->stamp); free(p->pbits);
    free(p->cscore); free(p->cidx); free(p->ccount); free(p->acc); free(p->ew);
    free(p->c0); free(p->cmass_ok); free(p->cew); free(p->cmass); free(p->cacc); free(p->vrow);
    free(p);
}

void kv_protocol_new_step(kv_protocol *p, int t) {
    p->cache_t = t;
    memset(p->cmass_ok, 0, 2 * (size_t)p->L->Hq);
}

/* Adds position i to head h's attended list (or ORs the flag in). */
static inline void add(kv_protocol *p, int h, int i, uint8_t f, float lw) {
    int *slot = &p->stamp[i];
    size_t base = (size_t)h * p->cap;
    if (*slot) { p->flag[base + *slot - 1] |= f; return; }
    int c = p->count[h]++;
    p->att[base + c] = i; p->flag[base + c] = f; p->logw[base + c] = lw;
    *slot = c + 1;
}

/* The length of the list's longest prefix that is strictly ascending inside [lo, hi) (MagicPIG's
 * compaction, page expansions: the whole list; RACC: its resident positions, then the few it retrieved).
 * Those entries can be neither duplicates nor sink or local positions (disjoint from the region), and
 * build_lists appends them as they are, without the stamp table's random access per entry (issue 12:
 * MagicPIG's host diagnostics, ~2000 entries a head at 128K, fell from 327 to 144 us a step; RACC's
 * resident set is most of the region); the rest of the list is checked entry by entry against that
 * prefix (a binary search) and itself (the stamps). The lists are the same. */
static int ascending_prefix(const int32_t *si, int n, int lo, int hi) {
    if (!n || si[0] < lo || si[0] >= hi) return 0;
    int j = 1;
    while (j < n && si[j] > si[j - 1] && si[j] < hi) j++;
    return j;
}

/* A prefix at least this long is looked up through the bit table (prefix_bits) rather than by binary search:
 * setting its bits is one sequential pass, where each binary search into it misses the cache about log2(n)
 * times (issue 12: RACC's ~1300 retrieved keys a list searched its tens of thousands of resident ones). */
enum { PREFIX_BITS_MIN = 1024 };

/* Sets (on = 1) or clears the bits of the ascending prefix si[0..n) in p->pbits. */
static void prefix_bits(kv_protocol *p, const int32_t *si, int n, int on) {
    if (!on) {
        memset(p->pbits + (si[0] >> 6), 0, (size_t)((si[n - 1] >> 6) - (si[0] >> 6) + 1) * sizeof(uint64_t));
        return;
    }
    for (int j = 0; j < n; j++) p->pbits[si[j] >> 6] |= 1ull << (si[j] & 63);
}

/* The slot of position i in an ascending list (ascending_prefix), or -1. */
static int find_sorted(const int32_t *si, int n, int i) {
    int a = 0, b = n;
    while (a < b) {
        int c = a + (b - a) / 2;
        if (si[c] < i) a = c + 1;
        else b = c;
    }
    return a < n && si[a] == i ? a : -1;
}

/* Position i's bit (i in [0, T)): 1 when it is in the prefix whose bits are set. */
static int prefix_has(const kv_protocol *p, int i) { return (int)((p->pbits[i >> 6] >> (i & 63)) & 1); }

/* Whether position i is in the prefix si[0..n): its bit when the bits are set (bits), else by binary search. */
static int in_prefix(const kv_protocol *p, const int32_t *si, int n, int bits, int i) {
    return bits ? prefix_has(p, i) : find_sorted(si, n, i) >= 0;
}

/* Clears what head h's list marked: the stamps of its entries outside the ascending prefix [c0, c0 + na) (the
 * prefix's have none) and, when they were set, the prefix's bits. Every exit from a head of build_lists, the
 * refusals included, leaves both tables clear for the next. */
static void unmark(kv_protocol *p, int h, const int32_t *si, int na, int bits) {
    for (int c = 0; c < p->count[h]; c++)
        if (c < p->c0[h] || c >= p->c0[h] + na) p->stamp[p->att[(size_t)h * p->cap + c]] = 0;
    if (bits) prefix_bits(p, si, na, 0);
}

/* Each query head's attended list; with share > 1 (the device path of a per-kv-head method, whose G heads
 * of a group attend one list) only the group's first head's, the others' counts copied from it. */
static kv_status build_lists(kv_protocol *p, int t, const kv_method *m, const kv_selection *sel, int k, int share) {
    const kv_layer *L = p->L;
    int lo = p->sink, hi = t + 1 - p->local, max_extra = 0, max_sel = 0;
    for (int g = 0; g < L->Hkv; g++) max_extra = sel->n_extra[g] > max_extra ? sel->n_extra[g] : max_extra;
    for (int l = 0; l < sel->n_lists; l++) max_sel = sel->count[l] > max_sel ? sel->count[l] : max_sel;
    if (!m->variable_budget && max_sel > k)
        return kv_fail(KV_ERR_INTERNAL, "method %s returned %d indices at step %d, above the budget k=%d", m->name,
                       max_sel, t, k);
    KV_TRY(grow(p, p->sink + p->local + max_sel + max_extra + 1));
    for (int h = 0; h < L->Hq; h++) {
        int list = m->per_kv_head ? h / p->G : h, g = h / p->G;
        if (share > 1 && h % share) {
            p->count[h] = p->count[h - 1];
            p->c0[h] = p->c0[h - 1];
            continue;
        }
        p->count[h] = 0;
        for (int i = 0; i < p->sink && i <= t; i++) add(p, h, i, i >= lo && i < hi ? F_REGION : 0, 0.f);
        for (int i = hi > 0 ? hi : 0; i <= t; i++) add(p, h, i, 0, 0.f);
        p->c0[h] = p->count[h];
        const int32_t *si = sel->idx + (size_t)list * sel->cap;
        const float *sw = sel->logw + (size_t)list * sel->cap;
        const int ns = sel->count[list], na = lo < hi ? ascending_prefix(si, ns, lo, hi) : 0;
        if (na) {
            size_t base = (size_t)h * p->cap + p->count[h];
            memcpy(p->att + base, si, (size_t)na * sizeof(int32_t));
            memset(p->flag + base, F_REGION | F_SEL, (size_t)na);
            if (m->uses_logw) memcpy(p->logw + base, sw, (size_t)na * sizeof(float));
            else memset(p->logw + base, 0, (size_t)na * sizeof(float));
            p->count[h] += na;
        }
        /* the prefix's bits, when the rest of the list (or an extra in the region) will look it up */
        const int bits = na >= PREFIX_BITS_MIN && (ns > na || sel->n_extra[g] > 0);
        if (bits) prefix_bits(p, si, na, 1);
        for (int j = na; j < ns; j++) {
            int i = si[j];
            if (i < lo || i >= hi) {
                unmark(p, h, si, na, bits);
                return kv_fail(KV_ERR_INTERNAL,
                    "method %s selected index %d at step %d, outside the retrievable region [%d, %d)", m->name, i, t,
                    lo, hi);
            }
            if (in_prefix(p, si, na, bits, i) ||
                (p->stamp[i] && (p->flag[(size_t)h * p->cap + p->stamp[i] - 1] & F_SEL))) {
                unmark(p, h, si, na, bits);
                return kv_fail(KV_ERR_INTERNAL, "method %s selected index %d twice at step %d (list %d)", m->name, i,
                               t, list);
            }
            add(p, h, i, F_REGION | F_SEL, m->uses_logw ? sw[j] : 0.f);
        }
        const int32_t *ei = sel->extra + (size_t)g * sel->extra_cap;
        for (int j = 0; j < sel->n_extra[g]; j++) {
            int i = ei[j], f = na && i >= lo && i < hi && (!bits || prefix_has(p, i)) ? find_sorted(si, na, i) : -1;
            if (i < 0 || i > t) {
                unmark(p, h, si, na, bits);
                return kv_fail(KV_ERR_INTERNAL, "method %s reported extra index %d at step %d, outside [0, %d]",
                               m->name, i, t, t);
            }
            if (f >= 0) p->flag[(size_t)h * p->cap + p->c0[h] + f] |= F_EXTRA; /* a selected entry (no stamp) */
            else add(p, h, i, (i >= lo && i < hi ? F_REGION : 0) | F_EXTRA, 0.f);
        }
        unmark(p, h, si, na, bits);
    }
    return KV_OK;
}

/* Each query head's candidate list (its own, or its kv head's) into
 * p->cidx, grown to need per head, and its count into p->ccount; with t >= 0
 * (the device path, which reads scores there) every position is checked
 * against [0, t]. copy = 0 (the device evaluation of a method with a list
 * per query head) only checks and counts: kv_protocol_submit then packs from
 * sel->cand itself, one copy fewer of lists that can hold a tenth of the
 * region per head (ParisKV). */
static kv_status gather_cands(kv_protocol *p, const kv_method *m, const kv_selection *sel, int need, int t, int copy) {
    const kv_layer *L = p->L;
    if (copy && need > p->ccap) {
        free(p->cscore); free(p->cidx);
        p->cscore = kv_malloc((size_t)L->Hq * need * sizeof(float), "candidate scores");
        p->cidx = kv_malloc((size_t)L->Hq * need * sizeof(int32_t), "candidate indices");
        p->ccap = need;
        if (!p->cscore || !p->cidx) { p->ccap = 0; return KV_ERR_NOMEM; }
    }
    for (int h = 0; h < L->Hq; h++) {
        int list = m->per_kv_head ? h / p->G : h;
        const int32_t *c = sel->cand + (size_t)list * sel->cand_cap;
        p->ccount[h] = sel->n_cand[list] > 0 ? sel->n_cand[list] : 0;
        for (int j = 0; t >= 0 && j < p->ccount[h]; j++)
            if (c[j] < 0 || c[j] > t)
                return kv_fail(KV_ERR_INTERNAL, "GPU oracle: gather of position %d outside the last step's [0, %d)",
                               c[j], t + 1);
        if (copy) memcpy(p->cidx + (size_t)h * p->ccap, c, (size_t)p->ccount[h] * sizeof(int32_t));
    }
    return KV_OK;
}

static kv_status candidate_recall(kv_protocol *p, kv_oracle *o, const kv_oracle_out *ores, const kv_method *m,
                                  const kv_selection *sel, int kk, kv_step_metric *rows) {
    const kv_layer *L = p->L;
    int need = 0, any = 0;
    for (int l = 0; l < sel->n_lists; l++) {
        if (sel->n_cand[l] >= 0) any = 1;
        need = sel->n_cand[l] > need ? sel->n_cand[l] : need;
    }
    for (int h = 0; h < L->Hq; h++) rows[h].cand_recall = NAN;
    if (!any || kk <= 0) return KV_OK;
    KV_TRY(gather_cands(p, m, sel, need, -1, 1));
    KV_TRY(kv_oracle_gather(o, p->cidx, p->ccount, p->ccap, p->cscore));
    for (int h = 0; h < L->Hq; h++) {
        int hits = 0;
        for (int j = 0; j < p->ccount[h]; j++) hits += p->cscore[(size_t)h * p->ccap + j] >= ores->thr[h];
        rows[h].cand_recall = (float)(hits < kk ? hits : kk) / (float)kk;
    }
    return KV_OK;
}

kv_status kv_protocol_score(kv_protocol *p, kv_oracle *o, const kv_oracle_out *ores, int t, const kv_method *m,
                            const kv_selection *sel, int k, kv_step_metric *rows) {
    const kv_layer *L = p->L;
    int D = L->D, T = L->T, nR = t + 1 - p->local - p->sink, kk = k < nR ? k : nR;
    KV_TRY(build_lists(p, t, m, sel, k, 1));
    KV_TRY(kv_oracle_gather(o, p->att, p->count, p->cap, p->score));
    long work = 0;
    for (int h = 0; h < L->Hq; h++) work += p->count[h];
    /* heads are independent from here on: in parallel when the caller is not
     * (the GPU path; on the CPU path the method instances already are) */
#pragma omp parallel for schedule(static) if (work * D >= 65536)
    for (int h = 0; h < L->Hq; h++) {
        size_t base = (size_t)h * p->cap;
        double *ew = p->ew + base;
        int hits = 0, hits_sel = 0, n_sel = 0, n_extra = 0, hits_pre = 0;
        double mass = 0, lmax = -INFINITY;
        /* the step cache: c0 sink/local entries, their exp terms and partial mass */
        int cached = p->cache_t == t && p->c0[h] <= p->sink + p->local, c0 = cached ? p->c0[h] : 0;
        double *cew = p->cew + (size_t)h * (p->sink + p->local + 1);
        if (cached && p->cmass_ok[h]) {
            memcpy(ew, cew, (size_t)c0 * sizeof(double));
            mass = p->cmass[h];
        }
        for (int c = 0; c < p->count[h]; c++) {
            uint8_t f = p->flag[base + c];
            float s = p->score[base + c];
            int good = (f & F_REGION) && s >= ores->thr[h];
            hits += good && (f & (F_SEL | F_EXTRA));
            hits_pre += good && (f & (F_SEL | F_EXTRA)) && p->att[base + c] < p->split;
            hits_sel += good && (f & F_SEL);
            n_sel += (f & F_SEL) != 0;
            n_extra += (f & F_EXTRA) && !(f & F_SEL) && (f & F_REGION);
            if (c >= c0 || !p->cmass_ok[h]) {
                ew[c] = exp((double)s - ores->m[h]);
                mass += ew[c];
            }
            if (cached && !p->cmass_ok[h] && c + 1 == c0) {
                memcpy(cew, ew, (size_t)c0 * sizeof(double));
                p->cmass[h] = mass;
                p->cmass_ok[h] = 1;
            }
            double l = (double)s + p->logw[base + c];
            lmax = l > lmax ? l : lmax;
        }
        kv_step_metric *r = &rows[h];
        r->step = t; r->head = h; r->n_sel = n_sel; r->n_extra = n_extra;
        r->metric = m->metric_name ? sel->metric : NAN;
        r->recall = (float)(hits < kk ? hits : kk) / (float)kk;
        r->recall_sel = (float)(hits_sel < kk ? hits_sel : kk) / (float)kk;
        int np = ores->ntop_pre[h], ng = ores->ntop_gen[h], hits_gen = hits - hits_pre;
        r->recall_pre = np > 0 ? (float)(hits_pre < np ? hits_pre : np) / (float)np : NAN;
        r->recall_gen = ng > 0 ? (float)(hits_gen < ng ? hits_gen : ng) / (float)ng : NAN;
        r->gen_share = np + ng > 0 ? (float)ng / (float)(np + ng) : NAN;
        r->mass = (float)(mass / ores->Z[h]);
        r->outerr = NAN;
        if ((L->v || L->v16) && ores->o_full) {
            double *acc = p->acc + (size_t)h * D, wsum = 0, num = 0, den = 0;
            const float *V = L->v ? L->v + (size_t)(h / p->G) * T * D : NULL; /* NULL: the float16 form (vrow) */
            /* exp(s + logw - lmax) is exp(s - m), already computed, when every
             * log-weight is 0 and the largest attended logit is the step's max
             * (the same double operands, so the same number) */
            int reuse = !m->uses_logw && lmax == (double)ores->m[h], c = 0;
            double *cacc = p->cacc + (size_t)h * (D + 1);
            for (int d = 0; d < D; d++) acc[d] = 0;
            if (reuse && cached && p->cacc_ok[h]) { /* continue from the step's sink/local sum */
                memcpy(acc, cacc, (size_t)D * sizeof(double));
                wsum = cacc[D];
                c = c0;
            }
            for (; c < p->count[h]; c++) {
                double w = reuse ? ew[c] : exp((double)p->score[base + c] + p->logw[base + c] - lmax);
                const float *v = V ? V + (size_t)p->att[base + c] * D : kv_layer_row(L, 'v', h / p->G, p->att[base + c], p->vrow + (size_t)h * D);
                wsum += w;
                kv_acc_row(acc, w, v, D);
                if (reuse && cached && c + 1 == c0 && !p->cacc_ok[h]) {
                    memcpy(cacc, acc, (size_t)D * sizeof(double));
                    cacc[D] = wsum;
                    p->cacc_ok[h] = 1;
                }
            }
            const float *of = ores->o_full + (size_t)h * D;
            for (int d = 0; d < D; d++) {
                double diff = acc[d] / wsum - of[d];
                num += diff * diff;
                den += (double)of[d] * of[d];
            }
            r->outerr = (float)(den > 0 ? sqrt(num / den) : sqrt(num));
        }
    }
    return candidate_recall(p, o, ores, m, sel, kk, rows);
}

/* The GPU oracle's path (issue 12): the lists of kv_protocol_score, built
 * and checked here, the arithmetic on the device (kernels/ops/attn_eval.cu).
 * The candidate lists are copied per head as candidate_recall does, each
 * position checked against [0, t] (the device reads scores there); a
 * method's device candidates (dc) are read on the device where they are,
 * and checked there (kv_protocol_collect reports a position out of range). */
kv_status kv_protocol_submit(kv_protocol *p, kv_oracle *o, int b, int t, const kv_method *m, const kv_selection *sel,
                             int k, int slot, const kv_dev_cands *dc) {
    int nR = t + 1 - p->local - p->sink, kk = k < nR ? k : nR, need = 0, any = 0;
    KV_TRY(build_lists(p, t, m, sel, k, m->per_kv_head ? p->G : 1));
    for (int l = 0; l < sel->n_lists; l++) {
        if (sel->n_cand[l] >= 0) any = 1;
        need = sel->n_cand[l] > need ? sel->n_cand[l] : need;
    }
    kv_gpu_diag_in in = {.b = b, .kk = kk, .split = p->split, .t = t, .metric = m->metric_name ? sel->metric : NAN,
                         .cap = p->cap, .count = p->count, .att = p->att, .flag = p->flag, .logw = p->logw,
                         .has_logw = m->uses_logw, .share = m->per_kv_head ? p->G : 1,
                         .has_cand = any && kk > 0};
    if (dc && dc->idx) {
        in.has_cand = kk > 0;
        in.dcidx = dc->idx; in.dld = dc->ld; in.drows = dc->rows; in.dcount = dc->count; in.dcounts = dc->counts;
    } else if (in.has_cand) {
        int direct = !m->per_kv_head; /* list h is head h's: packed from sel as it is */
        KV_TRY(gather_cands(p, m, sel, need, t, !direct));
        in.ccap = direct ? sel->cand_cap : p->ccap;
        in.ccount = p->ccount;
        in.cidx = direct ? sel->cand : p->cidx;
    }
    return kv_oracle_diag(o, slot, &in);
}

int kv_protocol_collect(const kv_protocol *p, kv_oracle *o, int slot, kv_step_metric *rows, const char *method) {
    int t;
    float metric;
    const kv_gpu_diag_row *g = kv_oracle_diag_take(o, slot, &t, &metric);
    if (!g) return 0;
    if (g[0].cand_bad) {
        kv_fail(KV_ERR_INTERNAL, "method %s reported a candidate position outside [0, %d] at step %d (device "
                "candidates)", method, t, t);
        return -1;
    }
    for (int h = 0; h < p->L->Hq; h++) {
        kv_step_metric *r = &rows[h];
        r->step = t; r->head = h; r->metric = metric;
        r->recall = g[h].recall; r->recall_sel = g[h].recall_sel; r->cand_recall = g[h].cand_recall;
        r->recall_pre = g[h].recall_pre; r->recall_gen = g[h].recall_gen; r->gen_share = g[h].gen_share;
        r->mass = g[h].mass; r->outerr = g[h].outerr; r->n_sel = g[h].n_sel; r->n_extra = g[h].n_extra;
    }
    return 1;
}
