/* test_protocol_gpu.c: the protocol's diagnostics on the device
 * (kv_protocol_submit / kv_protocol_collect, kernels/ops/attn_eval.cu)
 * against the host's kv_protocol_score with the same GPU oracle (so the
 * same scores, thresholds and softmax), row by row and bit for bit: random
 * selections per query head and per kv head, with and without log-weights,
 * extra indices (some already attended), candidate lists (some lists
 * without, and lists handed over on the device as a method's
 * candidates_dev does, with a row stride above their length, one length
 * for every list or a length a list), several
 * budgets and the one-budget oracle, with and without values, lists longer
 * than the kernel's shared-memory tile, a float16 layer (the value rows
 * staged in shared memory); and a device candidate outside
 * [0, t] is the method's error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/oracle.h"
#include "../cli/protocol.h"
#include "../kernels/ops/kv_gpu.h"
#include "kv_test.h"

static const kv_param_spec no_params[] = {{NULL}};

static int same_f(float a, float b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a); }

/* A random selection for step t: up to k distinct region indices per list,
 * log-weights, extras in [0, t] and candidates (list l without any when
 * l % 3 == 2). */
static void random_sel(kv_rng *r, kv_selection *sel, int t, int sink, int local, int k, int with_cand) {
    int lo = sink, hi = t + 1 - local, n = hi - lo;
    kv_selection_reset(sel);
    for (int l = 0; l < sel->n_lists; l++) {
        int c = 0;
        for (int tries = 0; c < k && c < n && tries < 4 * k; tries++) {
            int i = lo + (int)(kv_rng_u64(r) % (uint64_t)n), dup = 0;
            for (int j = 0; j < c; j++) dup |= sel->idx[(size_t)l * sel->cap + j] == i;
            if (dup) continue;
            sel->idx[(size_t)l * sel->cap + c] = i;
            sel->logw[(size_t)l * sel->cap + c] = (float)(kv_rng_u64(r) % 2001) / 1000.f - 1.f;
            c++;
        }
        sel->count[l] = c;
        if (with_cand >= 2 || (with_cand && l % 3 != 2)) { /* the device forms: 2 one length for every list, 3 any */
            int most = sel->cand_cap < 3 * k ? sel->cand_cap : 3 * k;
            int nc = with_cand == 2 && l ? sel->n_cand[0] : (int)(kv_rng_u64(r) % (uint64_t)most);
            for (int j = 0; j < nc; j++)
                sel->cand[(size_t)l * sel->cand_cap + j] = (int32_t)(kv_rng_u64(r) % (uint64_t)(t + 1));
            sel->n_cand[l] = nc;
        }
    }
    for (int g = 0; g < sel->n_kv; g++) {
        int ne = (int)(kv_rng_u64(r) % 6);
        for (int j = 0; j < ne; j++) sel->extra[(size_t)g * sel->extra_cap + j] = (int32_t)(kv_rng_u64(r) % (uint64_t)(t + 1));
        /* no duplicates within the extras: keep the distinct ones */
        int d = 0;
        for (int j = 0; j < ne; j++) {
            int x = sel->extra[(size_t)g * sel->extra_cap + j], dup = 0;
            for (int j2 = 0; j2 < d; j2++) dup |= sel->extra[(size_t)g * sel->extra_cap + j2] == x;
            if (!dup) sel->extra[(size_t)g * sel->extra_cap + d++] = x;
        }
        sel->n_extra[g] = d;
    }
    sel->metric = (float)(kv_rng_u64(r) % 100) / 100.f;
}

static int diag_case(kv_rng *r, int Hq, int Hkv, int T, int D, int with_v, int nk, int per_kv, int logw, int big,
                     int f16) {
    kv_layer L = {.Hq = Hq, .Hkv = Hkv, .T = T, .D = D, .half = f16};
    L.k = malloc(sizeof(float) * Hkv * T * D);
    L.v = with_v ? malloc(sizeof(float) * Hkv * T * D) : NULL;
    L.q = malloc(sizeof(float) * Hq * T * D);
    float *q = malloc(sizeof(float) * Hq * D);
    for (long i = 0; i < (long)Hkv * T * D; i++) {
        L.k[i] = (float)((long)(kv_rng_u64(r) % 2001) - 1000) / 500.f;
        if (with_v) L.v[i] = (float)((long)(kv_rng_u64(r) % 2001) - 1000) / 1000.f;
    }
    if (f16) { /* the layer's float16 form (the device's values in half: its staged tiles, ev_vstage) */
        L.k16 = malloc(sizeof(uint16_t) * Hkv * T * D);
        L.v16 = with_v ? malloc(sizeof(uint16_t) * Hkv * T * D) : NULL;
        for (long i = 0; i < (long)Hkv * T * D; i++) {
            L.k16[i] = kv_float_to_half(L.k[i]);
            if (with_v) L.v16[i] = kv_float_to_half(L.v[i]);
        }
        free(L.k); free(L.v);
        L.k = L.v = NULL;
    }
    int ks[2] = {big ? 200 : 24, big ? 700 : 90}, sink = 4, local = 32, split = T / 2, kmax = ks[nk - 1], last_t = 0;
    kv_method m = {.abi = KV_RETRIEVER_ABI, .name = "fake", .summary = "", .paper = "", .per_kv_head = per_kv,
                   .uses_logw = logw, .params = no_params, .metric_name = "x"};
    kv_oracle *o;
    kv_protocol *ph, *pg;
    kv_selection sel;
    int lists = per_kv ? Hkv : Hq;
    CHECK_OK(kv_oracle_create_ks(&L, 0.125f, sink, local, ks, nk, split, 1, nk > 1, &o));
    CHECK(!strcmp(kv_oracle_device(o), "gpu"), "the GPU oracle runs on %s", kv_oracle_device(o));
    CHECK_OK(kv_protocol_create(&L, sink, local, kmax, split, &ph));
    CHECK_OK(kv_protocol_create(&L, sink, local, kmax, split, &pg));
    CHECK_OK(kv_selection_alloc(&sel, lists, Hkv, kmax, T, T));
    /* every budget x (without candidates, with, on the device with one length, with a length a list) is one slot:
     * one flush launches them together */
    int ns = 4 * nk, dld = 0, dn[64];
    int32_t *dc[2][2] = {{NULL, NULL}, {NULL, NULL}}, *hc = NULL; /* per budget and device form: all read at the flush */
    CHECK_OK(kv_oracle_diag_slots(o, ns));
    kv_step_metric *a = malloc(sizeof *a * Hq * ns), *b = malloc(sizeof *b * Hq);
    for (int t = T / 2; t < T; t += T / 7) {
        for (int i = 0; i < Hq * D; i++) q[i] = (float)((long)(kv_rng_u64(r) % 2001) - 1000) / 250.f;
        kv_oracle_out res;
        CHECK_OK(kv_oracle_step(o, t, q, &res));
        last_t = t;
        for (int bi = 0; bi < nk; bi++)
            for (int with_cand = 0; with_cand < 4; with_cand++) {
                int slot = 4 * bi + with_cand;
                random_sel(r, &sel, t, sink, local, ks[bi], with_cand);
                kv_oracle_out ov;
                kv_oracle_view(o, bi, &ov);
                CHECK_OK(kv_protocol_score(ph, o, &ov, t, &m, &sel, ks[bi], a + (size_t)slot * Hq));
                kv_dev_cands d = {0};
                if (with_cand >= 2) { /* the lists on the device, rows dld apart, as a method leaves them */
                    int nc = sel.n_cand[0];
                    for (int l = 0; l < lists; l++) {
                        dn[l] = sel.n_cand[l];
                        nc = dn[l] > nc ? dn[l] : nc;
                    }
                    dld = nc + 5;
                    free(hc);
                    hc = malloc(sizeof *hc * (size_t)lists * dld);
                    for (int l = 0; l < lists; l++)
                        for (int j = 0; j < dld; j++)
                            hc[(size_t)l * dld + j] = j < dn[l] ? sel.cand[(size_t)l * sel.cand_cap + j] : -7;
                    int32_t **dp = &dc[bi][with_cand - 2];
                    kv_gpu_free(*dp);
                    CHECK_OK(kv_gpu_upload_ints(hc, (size_t)lists * dld, dp));
                    d = (kv_dev_cands){.idx = *dp, .ld = dld, .rows = lists, .count = nc,
                                       .counts = with_cand == 3 ? dn : NULL};
                    /* the host's lists withdrawn: read from sel, the row's cand_recall would be NaN, not the host's */
                    for (int l = 0; l < lists; l++) sel.n_cand[l] = -1;
                }
                CHECK_OK(kv_protocol_submit(pg, o, bi, t, &m, &sel, ks[bi], slot, with_cand >= 2 ? &d : NULL));
            }
        CHECK_OK(kv_oracle_diag_wait(o));
        for (int slot = 0; slot < ns; slot++) {
            CHECK(kv_protocol_collect(pg, o, slot, b, "fake") == 1, "step %d slot %d: no rows to collect", t, slot);
            CHECK(kv_protocol_collect(pg, o, slot, b, "fake") == 0, "step %d slot %d: rows collected twice", t, slot);
            for (int h = 0; h < Hq; h++) {
                const kv_step_metric *x = &a[(size_t)slot * Hq + h], *y = &b[h];
                int ok = x->step == y->step && x->head == y->head && x->n_sel == y->n_sel &&
                         x->n_extra == y->n_extra && same_f(x->recall, y->recall) &&
                         same_f(x->recall_sel, y->recall_sel) && same_f(x->cand_recall, y->cand_recall) &&
                         same_f(x->recall_pre, y->recall_pre) && same_f(x->recall_gen, y->recall_gen) &&
                         same_f(x->gen_share, y->gen_share) && same_f(x->mass, y->mass) &&
                         same_f(x->outerr, y->outerr) && same_f(x->metric, y->metric);
                CHECK(ok,
                      "Hq %d Hkv %d T %d D %d v %d nk %d per_kv %d logw %d, step %d head %d slot %d (budget %d, cand "
                      "%d): host recall %.9g sel %.9g cand %.9g pre %.9g gen %.9g share %.9g mass %.9g outerr %.9g "
                      "n %d/%d; device %.9g %.9g %.9g %.9g %.9g %.9g %.9g %.9g n %d/%d",
                      Hq, Hkv, T, D, with_v, nk, per_kv, logw, t, h, slot, ks[slot / 4], slot % 4, x->recall,
                      x->recall_sel, x->cand_recall, x->recall_pre, x->recall_gen, x->gen_share, x->mass, x->outerr,
                      x->n_sel, x->n_extra, y->recall, y->recall_sel, y->cand_recall, y->recall_pre, y->recall_gen,
                      y->gen_share, y->mass, y->outerr, y->n_sel, y->n_extra);
            }
        }
    }
    { /* a device candidate outside [0, t] (here t + 1) is reported as the method's error */
        int t = last_t, nc = 3;
        int32_t bad[3] = {0, t + 1, 2};
        free(hc);
        hc = malloc(sizeof *hc * (size_t)lists * nc);
        for (int l = 0; l < lists; l++) memcpy(hc + (size_t)l * nc, bad, sizeof bad);
        kv_gpu_free(dc[0][0]);
        CHECK_OK(kv_gpu_upload_ints(hc, (size_t)lists * nc, &dc[0][0]));
        random_sel(r, &sel, t, sink, local, ks[0], 0);
        kv_dev_cands d = {.idx = dc[0][0], .ld = nc, .rows = lists, .count = nc};
        CHECK_OK(kv_protocol_submit(pg, o, 0, t, &m, &sel, ks[0], 0, &d));
        CHECK_OK(kv_oracle_diag_wait(o));
        CHECK(kv_protocol_collect(pg, o, 0, b, "fake") == -1, "a device candidate at %d (step %d) was not reported",
              t + 1, t);
        CHECK(strstr(kv_last_error(), "method fake") && strstr(kv_last_error(), "outside"),
              "the out-of-range candidate's message: %s", kv_last_error());
    }
    for (int i = 0; i < 4; i++) kv_gpu_free(dc[i / 2][i % 2]);
    free(hc);
    free(a); free(b);
    kv_selection_free(&sel);
    kv_protocol_destroy(ph);
    kv_protocol_destroy(pg);
    kv_oracle_destroy(o);
    free(L.k); free(L.v); free(L.k16); free(L.v16); free(L.q); free(q);
    return KV_TEST_PASS;
}

int test_gpu_protocol_diag_matches_host(void) {
    uint64_t seed = kv_test_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    printf("    seed %llu (KVBENCH_TEST_SEED)\n", (unsigned long long)seed);
    for (int per_kv = 0; per_kv < 2; per_kv++)
        for (int logw = 0; logw < 2; logw++)
            for (int nk = 1; nk <= 2; nk++)
                if (diag_case(&r, 8, 2, 3000, 128, 1, nk, per_kv, logw, 0, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (diag_case(&r, 6, 3, 2000, 64, 0, 2, 0, 0, 0, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (diag_case(&r, 4, 4, 1500, 48, 1, 1, 1, 1, 0, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    /* lists of several shared-memory tiles (the kernel's sums run tile by tile), D above the block's 128 threads */
    if (diag_case(&r, 8, 2, 3000, 128, 1, 2, 0, 1, 1, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (diag_case(&r, 4, 2, 2500, 192, 1, 2, 1, 0, 1, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    /* the float16 layer: value rows staged in shared memory two tiles at a time (per kv head: one list packed
     * for the group's heads), and D = 64 */
    for (int per_kv = 0; per_kv < 2; per_kv++)
        if (diag_case(&r, 8, 2, 3000, 128, 1, 2, per_kv, !per_kv, 1, 1) != KV_TEST_PASS ||
            diag_case(&r, 4, 2, 2500, 64, 1, 1, per_kv, per_kv, 1, 1) != KV_TEST_PASS)
            return KV_TEST_FAIL;
    return KV_TEST_PASS;
}
