/* test_protocol.c: the evaluation protocol on a case small enough to work
 * out by hand, its refusal of retrievers that break the contract, and the
 * conformance suite every registered method must pass (budget, region,
 * no duplicates, determinism, never reading the future). */
#include <stdlib.h>
#include <string.h>

#include "../cli/oracle.h"
#include "../cli/protocol.h"
#include "kv_test.h"

/* A scripted method: search returns the indices in `script`. */
static int script_idx[8], script_n;
static float script_logw[8];
static kv_status fake_create(const kv_shape *s, const kv_param_set *p, void **o) { (void)s; (void)p; *o = NULL; return KV_OK; }
static kv_status fake_build(void *s, const kv_prefill *p) { (void)s; (void)p; return KV_OK; }
static kv_status fake_append(void *s, int t, const float *k, const float *v, const float *q) {
    (void)s; (void)t; (void)k; (void)v; (void)q;
    return KV_OK;
}
static kv_status fake_search(void *s, int t, const float *q, int k, kv_selection *sel) {
    (void)s; (void)t; (void)q; (void)k;
    for (int l = 0; l < sel->n_lists; l++) {
        for (int j = 0; j < script_n; j++) {
            sel->idx[l * sel->cap + j] = script_idx[j];
            sel->logw[l * sel->cap + j] = script_logw[j];
        }
        sel->count[l] = script_n;
    }
    return KV_OK;
}
static size_t fake_mem(const void *s) { (void)s; return 0; }
static void fake_destroy(void *s) { (void)s; }
static const kv_param_spec no_params[] = {{NULL}};
static kv_method fake = {.abi = KV_RETRIEVER_ABI, .name = "fake", .summary = "", .paper = "", .per_kv_head = 1,
                         .params = no_params, .create = fake_create, .build = fake_build, .append = fake_append,
                         .search = fake_search, .memory_bytes = fake_mem, .destroy = fake_destroy};

/* D = 1, one kv head, two query heads (q = 1 and q = -1), T = 6, scale 1:
 * keys 0 1 2 3 0.5 0 so head 0's scores are the keys. S = 1, W = 2, step
 * t = 5: region [1, 4) = {1, 2, 3}; k = 2: the true top-2 is {3, 2}. */
static float hand_K[6] = {0, 1, 2, 3, 0.5f, 0}, hand_V[6] = {1, 2, 3, 4, 5, 6}, hand_Q[12];
static const kv_layer hand_L = {.Hq = 2, .Hkv = 1, .T = 6, .D = 1, .q = hand_Q, .k = hand_K, .v = hand_V};
static float hand_q[2] = {1, -1}; /* the queries of step 5 */

/* The oracle (S = 1, W = 2, k = 2), protocol and a selection of capacity cap, at step 5. */
static kv_status hand_setup(int cap, kv_oracle **o, kv_protocol **p, kv_selection *sel, kv_oracle_out *res) {
    KV_TRY(kv_oracle_create(&hand_L, 1.0f, 1, 2, 2, 3, 0, o)); /* split 3: positions 3.. are "generated" */
    KV_TRY(kv_protocol_create(&hand_L, 1, 2, 2, 3, p));
    KV_TRY(kv_selection_alloc(sel, 1, 1, cap, 6, 6));
    return kv_oracle_step(*o, 5, hand_q, res);
}

int test_protocol_hand_case(void) {
    kv_oracle *o;
    kv_protocol *p;
    kv_selection sel;
    kv_oracle_out res;
    float *q = hand_q;
    CHECK_OK(hand_setup(2, &o, &p, &sel, &res));
    /* head 0 by hand: Z = e^0+e^1+e^2+e^3+e^.5+e^0, thr = 2 */
    double Z0 = 1 + exp(1) + exp(2) + exp(3) + exp(0.5) + 1;
    CHECK_CLOSE(res.m[0], 3.0, 0, 0);
    CHECK_CLOSE(res.Z[0], Z0 / exp(3), 1e-6, 1e-6);
    CHECK_CLOSE(res.thr[0], 2.0, 0, 0);
    double of0 = (1 * 1 + exp(1) * 2 + exp(2) * 3 + exp(3) * 4 + exp(0.5) * 5 + 1 * 6) / Z0;
    CHECK_CLOSE(res.o_full[0], of0, 1e-6, 1e-6);
    /* head 1 (q = -1): scores are minus the keys; region scores -1 -2 -3: top-2 {1, 2}, thr = -2 */
    CHECK_CLOSE(res.thr[1], -2.0, 0, 0);
    /* by key origin (split 3): head 0's top-2 {3, 2} is one generated, one prefill; head 1's {1, 2} both prefill */
    CHECK(res.ntop_pre[0] == 1 && res.ntop_gen[0] == 1, "head 0: %d prefill, %d generated", res.ntop_pre[0],
          res.ntop_gen[0]);
    CHECK(res.ntop_pre[1] == 2 && res.ntop_gen[1] == 0, "head 1: %d prefill, %d generated", res.ntop_pre[1],
          res.ntop_gen[1]);

    script_n = 2; script_idx[0] = 1; script_idx[1] = 3; script_logw[0] = script_logw[1] = 0;
    kv_selection_reset(&sel);
    CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
    kv_step_metric rows[2];
    CHECK_OK(kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows));
    /* head 0: {1, 3} holds one of {3, 2}: recall 1/2; attended {0,1,3,4,5} misses only 2 */
    CHECK_CLOSE(rows[0].recall, 0.5, 0, 0);
    CHECK_CLOSE(rows[0].recall_sel, 0.5, 0, 0);
    CHECK_CLOSE(rows[0].mass, (Z0 - exp(2)) / Z0, 1e-6, 1e-6);
    double wa = 1 + exp(1) + exp(3) + exp(0.5) + 1;
    double oa = (1 * 1 + exp(1) * 2 + exp(3) * 4 + exp(0.5) * 5 + 1 * 6) / wa;
    CHECK_CLOSE(rows[0].outerr, fabs(oa - of0) / fabs(of0), 1e-6, 1e-5);
    CHECK(rows[0].n_sel == 2 && rows[0].n_extra == 0 && isnan(rows[0].cand_recall), "counts");
    CHECK(rows[0].recall_pre == 0.0f && rows[0].recall_gen == 1.0f, "head 0 by origin: %g %g", rows[0].recall_pre,
          rows[0].recall_gen); /* found 3 (generated), missed 2 (prefill) */
    CHECK(rows[1].recall_pre == 0.5f && isnan(rows[1].recall_gen), "head 1 by origin: %g %g", rows[1].recall_pre,
          rows[1].recall_gen);
    /* head 1 shares the list (per kv head): {1, 3} holds 1 of its top-2 {1, 2} */
    CHECK_CLOSE(rows[1].recall, 0.5, 0, 0);
    double Z1 = 1 + exp(-1) + exp(-2) + exp(-3) + exp(-0.5) + 1;
    CHECK_CLOSE(rows[1].mass, (Z1 - exp(-2)) / Z1, 1e-6, 1e-6);

    /* log-weights: a weight of log 2 on index 3 doubles its attended logit weight */
    fake.uses_logw = 1;
    script_logw[1] = (float)log(2.0);
    kv_selection_reset(&sel);
    CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
    CHECK_OK(kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows));
    double wl = 1 + exp(1) + 2 * exp(3) + exp(0.5) + 1;
    double ol = (1 * 1 + exp(1) * 2 + 2 * exp(3) * 4 + exp(0.5) * 5 + 1 * 6) / wl;
    CHECK_CLOSE(rows[0].outerr, fabs(ol - of0) / fabs(of0), 1e-6, 1e-5);
    CHECK_CLOSE(rows[0].mass, (Z0 - exp(2)) / Z0, 1e-6, 1e-6); /* mass ignores weights */
    fake.uses_logw = 0;

    /* extra indices: index 2 attended densely; recall counts it, recall_sel does not */
    script_n = 1; script_idx[0] = 3;
    kv_selection_reset(&sel);
    CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
    sel.n_extra[0] = 2; sel.extra[0] = 2; sel.extra[1] = 5; /* 5 is local already: not counted as extra */
    CHECK_OK(kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows));
    CHECK_CLOSE(rows[0].recall, 1.0, 0, 0);
    CHECK_CLOSE(rows[0].recall_sel, 0.5, 0, 0);
    CHECK(rows[0].recall_pre == 1.0f && rows[0].recall_gen == 1.0f, "by origin with extra: %g %g",
          rows[0].recall_pre, rows[0].recall_gen);
    CHECK(rows[0].n_extra == 1 && rows[0].n_sel == 1, "extra %d sel %d", rows[0].n_extra, rows[0].n_sel);
    CHECK_CLOSE(rows[0].mass, (Z0 - exp(1)) / Z0, 1e-6, 1e-6);

    /* extras that repeat a selected index (3, or 1 in order 2), a sink index (0) and each other (2, 2),
     * with the selection ascending (build_lists appends it without stamps) and then descending (an
     * ascending prefix of one entry, then the stamp path; in order 2 the repeated extra is that tail's
     * entry): the same counts, and every position attended once (mass 1) */
    for (int order = 0; order < 3; order++) {
        script_n = 2; script_idx[0] = order ? 3 : 1; script_idx[1] = order ? 1 : 3;
        kv_selection_reset(&sel);
        CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
        sel.n_extra[0] = 4; sel.extra[0] = order == 2 ? 1 : 3; sel.extra[1] = 0; sel.extra[2] = 2; sel.extra[3] = 2;
        CHECK_OK(kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows));
        CHECK(rows[0].n_sel == 2 && rows[0].n_extra == 1, "order %d: sel %d extra %d (want 2, 1)", order,
              rows[0].n_sel, rows[0].n_extra);
        CHECK_CLOSE(rows[0].recall, 1.0, 0, 0);
        CHECK_CLOSE(rows[0].recall_sel, 0.5, 0, 0);
        CHECK_CLOSE(rows[0].mass, 1.0, 1e-6, 1e-6);
        CHECK_CLOSE(rows[0].outerr, 0.0, 1e-6, 1e-6);
    }

    /* candidates: {1, 2} as the coarse set holds one of {3, 2} for head 0 and both of {1, 2} for head 1 */
    kv_selection_reset(&sel);
    CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
    sel.n_cand[0] = 2; sel.cand[0] = 1; sel.cand[1] = 2;
    CHECK_OK(kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows));
    CHECK_CLOSE(rows[0].cand_recall, 0.5, 0, 0);
    CHECK_CLOSE(rows[1].cand_recall, 1.0, 0, 0);
    kv_selection_free(&sel);
    kv_protocol_destroy(p);
    kv_oracle_destroy(o);
    return KV_TEST_PASS;
}

int test_protocol_rejects_contract_breaks(void) {
    kv_oracle *o;
    kv_protocol *p;
    kv_selection sel;
    kv_oracle_out res;
    kv_step_metric rows[2];
    float *q = hand_q;
    CHECK_OK(hand_setup(6, &o, &p, &sel, &res));
    struct { int n, idx[4]; const char *needle; } cases[] = {
        {1, {4}, "outside the retrievable region [1, 4)"}, /* local window */
        {1, {0}, "outside the retrievable region"},       /* sink */
        {2, {2, 2}, "twice"},
        {2, {3, 3}, "twice"},                             /* the ascending prefix's entry again */
        {2, {2, 0}, "outside the retrievable region"},    /* after the ascending prefix */
        {3, {1, 2, 3}, "above the budget k=2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        script_n = cases[c].n;
        memcpy(script_idx, cases[c].idx, sizeof cases[c].idx);
        kv_selection_reset(&sel);
        CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
        kv_status st = kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows);
        CHECK(st == KV_ERR_INTERNAL && strstr(kv_last_error(), cases[c].needle), "case %zu: status %d, '%s'", c, st,
              kv_last_error());
    }
    /* after a rejected step, a valid one still scores correctly (no stale marks) */
    script_n = 2; script_idx[0] = 3; script_idx[1] = 2;
    kv_selection_reset(&sel);
    CHECK_OK(fake.search(NULL, 5, q, 2, &sel));
    CHECK_OK(kv_protocol_score(p, o, &res, 5, &fake, &sel, 2, rows));
    CHECK_CLOSE(rows[0].recall, 1.0, 0, 0);
    CHECK_CLOSE(rows[0].mass, 1.0 - 1.0 * exp(1) / (1 + exp(1) + exp(2) + exp(3) + exp(0.5) + 1), 1e-6, 1e-6);
    kv_selection_free(&sel);
    kv_protocol_destroy(p);
    kv_oracle_destroy(o);
    return KV_TEST_PASS;
}

/* A long list (issue 12: RACC's resident part, then its retrieved keys): an ascending prefix of 1500 even
 * positions, past the length whose lookups go through the bit table, then 300 odd positions in descending
 * order; and the same 1800 positions sorted (one ascending prefix). Both give the same counts and hits, the
 * same mass and output error up to the order of their sums, with extras that repeat a prefix entry, a tail
 * entry and nothing; a tail entry that repeats a prefix entry is refused, and afterwards a list whose tail
 * lies in the refused one's prefix is not (no bit left set). */
static int32_t long_list[1800];
static int long_n;
static kv_status long_search(void *s, int t, const float *q, int k, kv_selection *sel) {
    (void)s; (void)t; (void)q; (void)k;
    memcpy(sel->idx, long_list, (size_t)long_n * sizeof(int32_t));
    sel->count[0] = long_n;
    return KV_OK;
}

int test_protocol_long_prefix_and_tail(void) {
    kv_layer L;
    const int T = 4096, t = 4000, sink = 4, local = 16;
    CHECK_OK(kv_test_synth_layer(T, 2048, 2, 1, 8, 5, &L));
    kv_method m = fake;
    m.search = long_search;
    m.variable_budget = 1;
    kv_oracle *o;
    kv_protocol *p;
    kv_selection sel;
    kv_oracle_out res;
    kv_step_metric rows[3][2];
    CHECK_OK(kv_oracle_create(&L, 0.35f, sink, local, 100, 2048, 0, &o));
    CHECK_OK(kv_protocol_create(&L, sink, local, 100, 2048, &p));
    CHECK_OK(kv_selection_alloc(&sel, 1, 1, 1800, 8, 8));
    float q[2 * 8];
    for (int h = 0; h < 2; h++) memcpy(q + h * 8, L.q + ((size_t)h * T + t) * 8, 8 * sizeof(float));
    CHECK_OK(kv_oracle_step(o, t, q, &res));
    for (int form = 0; form < 3; form++) { /* 0: prefix + tail, 1: sorted, 2: a tail entry repeats the prefix */
        long_n = 1800;
        for (int j = 0; j < 1500; j++) long_list[j] = 10 + 2 * j;        /* 10 .. 3008, even */
        for (int j = 0; j < 300; j++) long_list[1500 + j] = 3009 - 2 * j; /* 3009 .. 2411, odd, descending */
        if (form == 1) /* the same 1800 positions in ascending order */
            for (int i = 10, j = 0; i <= 3009; i++)
                if (i % 2 == 0 || i >= 2411) long_list[j++] = i;
        if (form == 2) long_list[1700] = 1000;
        kv_selection_reset(&sel);
        CHECK_OK(m.search(NULL, t, q, 100, &sel));
        sel.n_extra[0] = 3; sel.extra[0] = 2000; sel.extra[1] = 2411; sel.extra[2] = 3500;
        kv_status st = kv_protocol_score(p, o, &res, t, &m, &sel, 100, rows[form]);
        if (form == 2) {
            CHECK(st == KV_ERR_INTERNAL && strstr(kv_last_error(), "selected index 1000 twice"), "form 2: status %d, "
                  "'%s'", st, kv_last_error());
            continue;
        }
        CHECK_OK(st);
    }
    for (int h = 0; h < 2; h++) {
        const kv_step_metric *x = &rows[0][h], *y = &rows[1][h];
        CHECK(x->n_sel == 1800 && y->n_sel == 1800 && x->n_extra == 1 && y->n_extra == 1,
              "head %d: selected %d / %d, extra %d / %d (want 1800, 1)", h, x->n_sel, y->n_sel, x->n_extra, y->n_extra);
        CHECK(x->recall == y->recall && x->recall_sel == y->recall_sel && x->recall_gen == y->recall_gen,
              "head %d: recall %g / %g", h, x->recall, y->recall);
        CHECK_CLOSE(x->mass, y->mass, 1e-6, 1e-6);
        CHECK_CLOSE(x->outerr, y->outerr, 1e-6, 1e-5);
    }
    /* after the refusal: a list whose tail lies in the refused list's prefix (odd prefix, even tail) */
    for (int j = 0; j < 1500; j++) long_list[j] = 11 + 2 * j;
    for (int j = 0; j < 300; j++) long_list[1500 + j] = 3008 - 2 * j;
    kv_selection_reset(&sel);
    CHECK_OK(m.search(NULL, t, q, 100, &sel));
    CHECK_OK(kv_protocol_score(p, o, &res, t, &m, &sel, 100, rows[2]));
    CHECK(rows[2][0].n_sel == 1800 && rows[2][1].n_sel == 1800, "after the refusal: %d, %d selected (want 1800)",
          rows[2][0].n_sel, rows[2][1].n_sel);
    kv_selection_free(&sel);
    kv_protocol_destroy(p);
    kv_oracle_destroy(o);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

/* ---- conformance: every registered method ---- */
typedef struct { int n_steps, lists, cap; int32_t *idx; int *count; } sel_log;

/* Drives method m over layer L (tests/driver.c), logging selections of
 * steps P + j*stride; with check=1, verifies the budget, the region and
 * that no index repeats. */
static kv_status drive(const kv_method *m, const kv_layer *L, int P, int k, int stride, sel_log *log, int check) {
    kv_test_driver d;
    int sink = 4, local = 16;
    kv_status rc = kv_test_driver_open(&d, m->name, NULL, 0, L, P, sink, local, k);
    const kv_selection *sel = &d.sel;
    log->lists = sel->n_lists; log->cap = sel->cap; log->n_steps = 0;
    for (int t = P; t < L->T && rc == KV_OK; t += stride) {
        rc = kv_test_driver_step(&d, t, k);
        int s = log->n_steps++;
        for (int l = 0; l < sel->n_lists && rc == KV_OK; l++) {
            log->count[s * sel->n_lists + l] = sel->count[l];
            memcpy(log->idx + ((size_t)s * sel->n_lists + l) * sel->cap, sel->idx + (size_t)l * sel->cap,
                   sel->count[l] * sizeof(int32_t));
            if (!check) continue;
            if (!m->variable_budget && sel->count[l] > k)
                rc = kv_fail(KV_ERR_INTERNAL, "%s: %d indices > k=%d at step %d", m->name, sel->count[l], k, t);
            for (int j = 0; j < sel->count[l] && rc == KV_OK; j++) {
                int i = sel->idx[(size_t)l * sel->cap + j];
                if (i < sink || i >= t + 1 - local)
                    rc = kv_fail(KV_ERR_INTERNAL, "%s: index %d outside [%d, %d) at step %d", m->name, i, sink,
                                 t + 1 - local, t);
                for (int j2 = 0; j2 < j && rc == KV_OK; j2++)
                    if (sel->idx[(size_t)l * sel->cap + j2] == i)
                        rc = kv_fail(KV_ERR_INTERNAL, "%s: index %d twice at step %d", m->name, i, t);
            }
        }
    }
    kv_test_driver_close(&d);
    return rc;
}

static int same_log(const sel_log *a, const sel_log *b, int upto_steps) {
    for (int s = 0; s < upto_steps; s++)
        for (int l = 0; l < a->lists; l++) {
            int c = a->count[s * a->lists + l];
            if (c != b->count[s * b->lists + l]) return 0;
            if (memcmp(a->idx + ((size_t)s * a->lists + l) * a->cap, b->idx + ((size_t)s * b->lists + l) * b->cap,
                       (size_t)c * sizeof(int32_t)))
                return 0;
        }
    return 1;
}

int test_conformance_all_methods(void) {
    int T = 700, P = 400, k = 64, stride = 20, cut = 560; /* steps up to `cut` must not depend on later positions;
                                                           k = 2 pages of FreeKV (floor(k/32) pages) */
    kv_layer L, F;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 21, &L));
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 21, &F));
    kv_rng r;
    kv_rng_seed(&r, 99);
    for (int g = 0; g < 2; g++) /* a different future: positions after `cut` replaced by noise */
        for (int t = cut + 1; t < T; t++)
            for (int d = 0; d < 32; d++) {
                F.k[((size_t)g * T + t) * 32 + d] = (float)kv_rng_normal(&r) * 3;
                F.v[((size_t)g * T + t) * 32 + d] = (float)kv_rng_normal(&r);
            }
    for (int h = 0; h < 4; h++)
        for (int t = cut + 1; t < T; t++)
            for (int d = 0; d < 32; d++) F.q[((size_t)h * T + t) * 32 + d] = (float)kv_rng_normal(&r) * 3;
    int n_steps = (T - P + stride - 1) / stride, steps_before_cut = (cut - P) / stride + 1;
    int n;
    const kv_method *const *all = kv_methods(&n);
    int result = KV_TEST_PASS;
    for (int i = 0; i < n && result == KV_TEST_PASS; i++) {
        const kv_method *m = all[i];
        int lists = m->per_kv_head ? 2 : 4, cap = m->variable_budget ? T : k;
        sel_log a = {0}, b = {0}, c = {0};
        a.idx = malloc((size_t)n_steps * lists * cap * sizeof(int32_t)); a.count = calloc(n_steps * lists, sizeof(int));
        b.idx = malloc((size_t)n_steps * lists * cap * sizeof(int32_t)); b.count = calloc(n_steps * lists, sizeof(int));
        c.idx = malloc((size_t)n_steps * lists * cap * sizeof(int32_t)); c.count = calloc(n_steps * lists, sizeof(int));
        kv_status st = drive(m, &L, P, k, stride, &a, 1);
        if (st == KV_OK) st = drive(m, &L, P, k, stride, &b, 0);
        if (st == KV_OK) st = drive(m, &F, P, k, stride, &c, 1);
        if (st != KV_OK) { fprintf(stderr, "    %s: %s\n", m->name, kv_last_error()); result = KV_TEST_FAIL; }
        else if (!same_log(&a, &b, n_steps)) { fprintf(stderr, "    %s: two runs differ (not deterministic)\n", m->name); result = KV_TEST_FAIL; }
        else if (!same_log(&a, &c, steps_before_cut)) {
            fprintf(stderr, "    %s: selections before step %d depend on later positions (sees the future)\n", m->name, cut);
            result = KV_TEST_FAIL;
        } else {
            int nonempty = 0;
            for (int s = 0; s < n_steps * lists; s++) nonempty += a.count[s] > 0;
            if (!nonempty) { fprintf(stderr, "    %s: never selected anything\n", m->name); result = KV_TEST_FAIL; }
        }
        free(a.idx); free(a.count); free(b.idx); free(b.count); free(c.idx); free(c.count);
    }
    kv_layer_free(&L);
    kv_layer_free(&F);
    return result;
}
