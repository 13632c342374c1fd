/* run.c: `kvbench run`: one trace, one or several layers, several methods,
 * budgets and seeds, the evaluation protocol at every evaluated decode step
 * (README, "Evaluation protocol"). The loop enforces causality: each
 * retriever sees the prefill at build(), then position t's key, value and
 * query through append() before the search of step t, and nothing later.
 * Sharing (issue 11): layers are evaluated one after another, each loaded
 * once; the oracle's exact attention of a step is computed once and its
 * sorted region gives every budget's threshold; a method instance is built
 * once per (layer, seed) and searches once per budget at each step (search
 * is a pure function of the state and k: the multi-budget run equals the
 * single runs, tests/test_sweep.py; a method whose search changes its state
 * declares search_updates_state and gets one instance per budget). A method is seeded when it has a
 * `seed` parameter; with --seeds N it runs as N instances with shape seeds
 * seed .. seed+N-1, every other method once. On the GPU a step's searches
 * are queued on the device one behind the other and timed there
 * (step_queued, kv_method.search_launch: issue 12 goal 1). */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../datasets/kv_cleanup.h"
#include "../retrievers/kv_retriever.h"
#include "cli.h"
#include "memory.h"
#include "results.h"

#define MAX_METHODS 32
#define MAX_KS 64
#define MAX_SEEDS 64

static const char run_help[] =
    "usage: kvbench run --trace FILE [--layer L14] --method exact,streaming,random [options]\n"
    "  --trace FILE        kvtrace v1 file\n"
    "  --layer LIST        layers to evaluate: L14 or 14, a list L3,L14, or all (default: the trace's first layer);\n"
    "                      each is loaded once and evaluated in turn\n"
    "  --method LIST       comma-separated methods (kvbench list)\n"
    "  --param [M.]N=V     set parameter N (of method M, or of every listed method that has N); repeatable\n"
    "  --k K[,K...]        budgets: indices per list from the retrievable region (default 100); several budgets\n"
    "                      share the oracle and each method's index (one search per budget)\n"
    "  --sink S            always-attended first tokens (default 4)\n"
    "  --local W           always-attended local window, the current token included (default 64)\n"
    "  --stride s          evaluate every s-th decode step (default 1)\n"
    "  --max-steps N       evaluate at most N steps (default all)\n"
    "  --window N          decode steps per drift window (default 128)\n"
    "  --seed S            seed for seeded methods (default 0)\n"
    "  --seeds N           run each seeded method (one with a `seed` parameter) with seeds S .. S+N-1, sharing the\n"
    "                      oracle; the table shows mean and standard deviation (default 1)\n"
    "  --no-profile        skip the oracle budget profile (profile.csv, summary.json budget_profile)\n"
    "  --lag d             hand every method the query of position t-d (at build, append and search; clamped at 0)\n"
    "                      while the protocol scores step t's exact attention (default 0: the query of t)\n"
    "  --device D          auto|cpu|gpu (default auto: the GPU when one is usable)\n"
    "  --threads N         CPU threads (OpenMP; default: one per core); recorded in summary.json with the\n"
    "                      load average at start (a warning when it is above the core count)\n"
    "  --out DIR           result directory (default results/<trace>-<layer>-<time>)\n"
    "  --force             replace DIR if it is a kvbench result directory (otherwise an existing DIR is an\n"
    "                      error); the old results stay in place until the new ones are complete\n"
    "  --quiet             no table on stdout\n"
    "  --verbose           print where the wall time went (load, build, append, oracle, search, diagnostics,\n"
    "                      bookkeeping, output; summary.json phase_seconds) and each method's total search time\n"
    "Writes DIR/summary.json, DIR/drift.csv, DIR/steps.csv, DIR/profile.csv all-or-nothing (DIR.tmp.<pid>, then one rename;\n"
    "removed on failure, SIGINT or SIGTERM) and prints a summary table.\n";

typedef struct {
    const char *trace, *layer, *methods, *out;
    const char *params[64];
    int n_params;
    int k, sink, local, stride, max_steps, window, force, quiet, lag;
    int seed, threads, seeds, no_profile, verbose;
    int ks[MAX_KS], nk;
    kv_device_choice device;
} run_opts;

static int parse_run(int argc, char **argv, run_opts *o) {
    static const struct option opts[] = {
        {"trace", 1, 0, 't'}, {"layer", 1, 0, 'l'}, {"method", 1, 0, 'm'}, {"param", 1, 0, 'p'},
        {"k", 1, 0, 'k'}, {"sink", 1, 0, 'S'}, {"local", 1, 0, 'W'}, {"stride", 1, 0, 's'},
        {"max-steps", 1, 0, 'n'}, {"window", 1, 0, 'w'}, {"seed", 1, 0, 'e'}, {"lag", 1, 0, 'L'}, {"device", 1, 0, 'd'},
        {"threads", 1, 0, 'j'}, {"seeds", 1, 0, 'N'}, {"no-profile", 0, 0, 'P'}, {"out", 1, 0, 'o'}, {"force", 0, 0, 'f'}, {"quiet", 0, 0, 'q'}, {"verbose", 0, 0, 'v'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    *o = (run_opts){.k = 100, .sink = 4, .local = 64, .stride = 1, .max_steps = 0, .window = 128, .seeds = 1,
                    .ks = {100}, .nk = 1};
    optind = 1;
    opterr = 0;
    /* Every count is at most 2^30, so sums of two of them (sink + local,
     * t + stride) stay within int; each is checked against the trace later. */
    const long big = 1L << 30;
    for (int c; (c = getopt_long(argc, argv, KV_OPTSTRING, opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 't': o->trace = optarg; break;
        case 'l': o->layer = optarg; break;
        case 'm': o->methods = optarg; break;
        case 'p':
            if (o->n_params >= 64) return kv_usage_error("run", "too many --param options (64 at most)");
            o->params[o->n_params++] = optarg;
            break;
        case 'k': /* one budget keeps kv_opt_int's message; a list is checked item by item */
            if (!strchr(optarg, ',')) { o->nk = 1; bad = kv_opt_int("run", "k", optarg, 1, big, &o->ks[0]); break; }
            o->nk = kv_opt_int_list("run", "k", optarg, 1, big, o->ks, MAX_KS);
            if (o->nk < 0) return 2;
            break;
        case 'N': bad = kv_opt_int("run", "seeds", optarg, 1, MAX_SEEDS, &o->seeds); break;
        case 'P': o->no_profile = 1; break;
        case 'S': bad = kv_opt_int("run", "sink", optarg, 0, big, &o->sink); break;
        case 'W': bad = kv_opt_int("run", "local", optarg, 1, big, &o->local); break;
        case 's': bad = kv_opt_int("run", "stride", optarg, 1, big, &o->stride); break;
        case 'n': bad = kv_opt_int("run", "max-steps", optarg, 1, big, &o->max_steps); break;
        case 'w': bad = kv_opt_int("run", "window", optarg, 1, big, &o->window); break;
        case 'e': bad = kv_opt_int("run", "seed", optarg, 0, 2147483647L, &o->seed); break;
        case 'd':
            if (kv_parse_device(optarg, &o->device))
                return kv_usage_error("run", "--device: expected auto, cpu or gpu, found '%s'", optarg);
            break;
        case 'j': bad = kv_opt_int("run", "threads", optarg, 1, 4096, &o->threads); break;
        case 'L': bad = kv_opt_int("run", "lag", optarg, 0, big, &o->lag); break;
        case 'o': o->out = optarg; break;
        case 'f': o->force = 1; break;
        case 'q': o->quiet = 1; break;
        case 'v': o->verbose = 1; break;
        case 'h': fputs(run_help, stdout); return 0;
        default: return kv_opt_error("run", c, argv, opts);
        }
        if (bad) return bad;
    }
    if (optind < argc) return kv_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!o->trace) return kv_usage_error("run", "--trace FILE is required");
    if (!o->methods) return kv_usage_error("run", "--method LIST is required (see kvbench list)");
    for (int i = 1; i < o->nk; i++) /* ascending, for the tables; a repeated budget is a mistake */
        for (int j = i; j > 0 && o->ks[j] < o->ks[j - 1]; j--) { int x = o->ks[j]; o->ks[j] = o->ks[j - 1]; o->ks[j - 1] = x; }
    for (int i = 1; i < o->nk; i++)
        if (o->ks[i] == o->ks[i - 1]) return kv_usage_error("run", "--k: the budget %d is listed twice", o->ks[i]);
    o->k = o->ks[o->nk - 1];
    return -1; /* parsed: go on */
}

/* results/<trace stem>-<layer>-<time>, malloc'd. */
static char *default_out(const kv_trace_info *in, const char *layer) {
    const char *base = strrchr(in->path, '/');
    base = base ? base + 1 : in->path;
    const char *dot = strrchr(base, '.');
    int stem = dot && dot > base ? (int)(dot - base) : (int)strlen(base);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", &tm);
    return kv_strfmt("results/%.*s-%s-%s", stem, base, layer, ts);
}

/* Copies positions [0, n) of [H][T][D] into a tight [H][n][D]; with lag
 * d > 0, position i gets row max(i - d, 0) (--lag: the methods' queries). */
static float *gather_prefix(const float *x, int H, int T, int D, int n, int lag) {
    float *out = kv_malloc((size_t)H * n * D * sizeof(float), "prefill copy");
    if (out)
        for (int h = 0; h < H; h++) {
            if (!lag) {
                memcpy(out + (size_t)h * n * D, x + (size_t)h * T * D, (size_t)n * D * sizeof(float));
                continue;
            }
            for (int i = 0; i < n; i++)
                memcpy(out + ((size_t)h * n + i) * D, x + ((size_t)h * T + (i - lag > 0 ? i - lag : 0)) * D,
                       (size_t)D * sizeof(float));
        }
    return out;
}

/* The prefill view without a copy (issue 12: the copies were 3/4 of the
 * float32 layer again at P = 3T/4): the rows [n, T) of every head are moved
 * aside, each head's rows [0, n) moved left in place so [H][T][D] becomes a
 * tight [H][n][D], and expand() undoes both after the builds. Heads move in
 * increasing order to the left and in decreasing order back to the right,
 * so no source is overwritten before it is moved. Methods must not keep
 * pointers into the prefill after build() (the copies were freed there
 * before, so none does). Returns the moved-aside rows, NULL when out of memory. */
static float *compact_prefix(float *x, int H, int T, int D, int n) {
    size_t tail = (size_t)(T - n) * D, head = (size_t)n * D;
    float *saved = kv_malloc((size_t)H * tail * sizeof(float) + 1, "decode rows set aside during the builds");
    if (!saved) return NULL;
    for (int h = 0; h < H; h++) memcpy(saved + h * tail, x + (size_t)h * T * D + head, tail * sizeof(float));
    for (int h = 1; h < H; h++) memmove(x + h * head, x + (size_t)h * T * D, head * sizeof(float));
    return saved;
}

static void expand_prefix(float *x, int H, int T, int D, int n, float *saved) {
    size_t tail = (size_t)(T - n) * D, head = (size_t)n * D;
    for (int h = H - 1; h >= 1; h--) memmove(x + (size_t)h * T * D, x + h * head, head * sizeof(float));
    for (int h = 0; h < H; h++) memcpy(x + (size_t)h * T * D + head, saved + h * tail, tail * sizeof(float));
    free(saved);
}

/* A method instance: one built index, searched at budgets b0 .. b0+nb-1
 * (every budget, or one for a method whose search updates its state). */
typedef struct {
    kv_method_run r;    /* m, ps, params, state, sel, on_gpu, build_s, append_s, index_bytes, seed */
    int b0, nb;         /* its budgets */
    int first_rec;      /* its records: recs[first_rec + b - b0] for budget b */
} run_inst;

/* ---- issue 12 goal 3: the prefill of a layer held as float16 (hook for build_all) ----
 * Methods with prefill_half get the layer's float16 arrays in place (q's
 * rows shifted into a float16 copy with --lag); the others share tight
 * float32 copies of k, v and q made once for them (counted by the
 * preflight) and freed after the builds. */
typedef struct { kv_prefill half, f32; float *bufs[3]; uint16_t *q16; } prefill16;

static uint16_t *gather_prefix16(const uint16_t *x, int H, int T, int D, int n, int lag) {
    uint16_t *out = kv_malloc((size_t)H * n * D * sizeof(uint16_t) + 1, "prefill queries (float16, --lag)");
    for (int h = 0; out && h < H; h++)
        for (int i = 0; i < n; i++)
            memcpy(out + ((size_t)h * n + i) * D, x + ((size_t)h * T + (i - lag > 0 ? i - lag : 0)) * D, (size_t)D * 2);
    return out;
}

static float *widen_prefix(const uint16_t *x, int H, int T, int D, int n, int lag) {
    float *out = kv_malloc((size_t)H * n * D * sizeof(float) + 1, "prefill copy (float32)");
    for (int h = 0; out && h < H; h++) {
        if (!lag) { kv_half_to_float_n(x + (size_t)h * T * D, out + (size_t)h * n * D, (size_t)n * D); continue; }
        for (int i = 0; i < n; i++)
            kv_half_to_float_n(x + ((size_t)h * T + (i - lag > 0 ? i - lag : 0)) * D, out + ((size_t)h * n + i) * D, (size_t)D);
    }
    return out;
}

static kv_status prefill16_open(const kv_layer *L, int P, int lag, const run_inst *inst, int n_inst, prefill16 *p) {
    memset(p, 0, sizeof *p);
    p->half = (kv_prefill){.n = P, .half = 1, .ld = L->T, .ldq = L->T, .k16 = L->k16, .v16 = L->v16, .q16 = L->q16};
    if (lag) { /* q's rows shifted: a tight float16 copy */
        if (!(p->q16 = gather_prefix16(L->q16, L->Hq, L->T, L->D, P, lag))) return KV_ERR_NOMEM;
        p->half.q16 = p->q16;
        p->half.ldq = P;
    }
    unsigned need = 0;
    for (int i = 0; i < n_inst; i++) need |= kv_prefill_widened(inst[i].r.m);
    p->f32.n = P;
    if ((need & KV_PREFILL_K) && !(p->bufs[0] = widen_prefix(L->k16, L->Hkv, L->T, L->D, P, 0))) return KV_ERR_NOMEM;
    if ((need & KV_PREFILL_V) && L->v16 && !(p->bufs[1] = widen_prefix(L->v16, L->Hkv, L->T, L->D, P, 0))) return KV_ERR_NOMEM;
    if ((need & KV_PREFILL_Q) && !(p->bufs[2] = widen_prefix(L->q16, L->Hq, L->T, L->D, P, lag))) return KV_ERR_NOMEM;
    p->f32.k = p->bufs[0]; p->f32.v = p->bufs[1]; p->f32.q = p->bufs[2];
    return KV_OK;
}

static void prefill16_close(prefill16 *p) {
    for (int i = 0; i < 3; i++) free(p->bufs[i]);
    free(p->q16);
    memset(p, 0, sizeof *p);
}

/* Page-locks (on = 1) or unlocks (0) the lists a GPU method's search copies its result into: a device-to-host
 * copy into pageable memory goes through the driver's staging buffer (scripts/roundtrip.cu: 88.1 against
 * 57.8 us for a search returning 16 rows of 5000 ints, H200, session 18), and MagicPIG returns two such lists,
 * every sampled key and its weight. The log-weights only for a method that fills them (uses_logw). Returns
 * whether the lists are locked. */
static int pin_selection(kv_selection *s, const kv_method *m, int on) {
    const size_t bytes = (size_t)s->n_lists * (size_t)s->cap * sizeof(int32_t);
    if (!on) {
        kv_gpu_host_unpin(s->idx);
        if (m->uses_logw) kv_gpu_host_unpin(s->logw);
        return 0;
    }
    if (!kv_gpu_host_pin(s->idx, bytes)) return 0;
    if (!m->uses_logw || kv_gpu_host_pin(s->logw, bytes)) return 1;
    kv_gpu_host_unpin(s->idx);
    return 0;
}

/* Creates and builds every instance on the prefill (pre_half for a method
 * that takes the float16 form); sel holds up to kmax. The CPU path builds
 * them in parallel (issue 12, goal 5), as it runs their steps: each builds
 * its own state from the read-only prefill, and a method's internal OpenMP
 * loops give the same numbers on any thread count (tests: run_golden_cpu
 * with 1 and 2 threads). The first failure in instance order is reported,
 * as a serial loop would. */
static kv_status build_each(const kv_layer *L, const int *keff, run_inst *inst, int n_inst, const kv_shape *sh,
                            const kv_prefill *pre, const kv_prefill *pre_half) {
    int par = !sh->use_gpu && n_inst > 1 && omp_get_max_threads() > 1;
    kv_status *ist = calloc((size_t)n_inst + 1, sizeof *ist);
    char (*msg)[512] = calloc((size_t)n_inst + 1, sizeof *msg);
    if (!ist || !msg) {
        free(ist);
        free(msg);
        return kv_fail(KV_ERR_NOMEM, "build status (%d instances)", n_inst);
    }
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int i = 0; i < n_inst; i++) {
        kv_method_run *r = &inst[i].r;
        kv_shape s = *sh;
        s.use_gpu = sh->use_gpu && r->m->has_gpu;
        s.seed = r->seed;
        r->on_gpu = s.use_gpu;
        int kmax = keff[inst[i].b0 + inst[i].nb - 1];
        int lists = r->m->per_kv_head ? L->Hkv : L->Hq, cap = r->m->variable_budget || kmax > L->T ? L->T : kmax;
        kv_status si = kv_selection_alloc(&r->sel, lists, L->Hkv, cap, L->T, L->T);
        if (si == KV_OK && s.use_gpu) r->sel_pinned = pin_selection(&r->sel, r->m, 1);
        double t0 = kv_now();
        if (si == KV_OK) si = r->m->create(&s, &r->ps, &r->state);
        if (si == KV_OK) si = r->m->build(r->state, r->m->prefill_half ? pre_half : pre);
        r->build_s = kv_now() - t0;
        if (si != KV_OK) snprintf(msg[i], sizeof msg[i], "method %s: build failed: %s", r->m->name, kv_last_error());
        ist[i] = si;
    }
    kv_status st = KV_OK;
    for (int i = 0; i < n_inst && st == KV_OK; i++)
        if (ist[i] != KV_OK) st = kv_fail(ist[i], "%s", msg[i]);
    free(ist);
    free(msg);
    return st;
}

/* Builds every instance on the prefill of layer L. */
static kv_status build_all(kv_layer *L, int P, int lag, const int *keff, run_inst *inst, int n_inst,
                           const kv_shape *sh) {
    kv_prefill pre = {.n = P};
    if (kv_layer_is_f16(L)) { /* the float16 form: no in-place compaction */
        prefill16 p16;
        kv_status st = prefill16_open(L, P, lag, inst, n_inst, &p16);
        if (st == KV_OK) st = build_each(L, keff, inst, n_inst, sh, &p16.f32, &p16.half);
        prefill16_close(&p16);
        return st;
    }
    /* k, v (and q without --lag) viewed in place; q with --lag copied (its rows are shifted) */
    float *sk = compact_prefix(L->k, L->Hkv, L->T, L->D, P);
    float *sv = sk && L->v ? compact_prefix(L->v, L->Hkv, L->T, L->D, P) : NULL;
    float *sq = sk && (!L->v || sv) && !lag ? compact_prefix(L->q, L->Hq, L->T, L->D, P) : NULL;
    float *pq = lag ? gather_prefix(L->q, L->Hq, L->T, L->D, P, lag) : NULL;
    kv_status st = (!sk || (L->v && !sv) || (!lag && !sq) || (lag && !pq)) ? KV_ERR_NOMEM : KV_OK;
    pre.k = L->k; pre.q = lag ? pq : L->q; pre.v = L->v;
    if (st == KV_OK) st = build_each(L, keff, inst, n_inst, sh, &pre, &pre);
    if (sq) expand_prefix(L->q, L->Hq, L->T, L->D, P, sq);
    if (sv) expand_prefix(L->v, L->Hkv, L->T, L->D, P, sv);
    if (sk) expand_prefix(L->k, L->Hkv, L->T, L->D, P, sk);
    free(pq);
    return st;
}

static void progress(double t_start, int done, int total, int force, const char *layer) {
    double el = kv_now() - t_start;
    if (!force && el < 2.0) return;
    double rate = done / (el > 0 ? el : 1e-9), eta = rate > 0 ? (total - done) / rate : 0;
    fprintf(stderr, "\rrun: layer %s: %d/%d steps  %.1f steps/s  ETA %.0fs   ", layer, done, total, rate, eta);
    if (done == total) fputc('\n', stderr);
}

/* The scoring of record rec's search of step t at budget b (already in
 * r->sel): its candidates, then the protocol's scoring on the host or its
 * packing for the device. Adds the seconds to rec->diag_s and *diag. */
static kv_status inst_score(kv_method_run *r, kv_method_run *rec, int slot, int t, int b, const int *keff,
                            kv_oracle *orc, const kv_oracle_out *ores, kv_protocol *proto, kv_step_metric *rows, int Hq,
                            double *diag) {
    double s1 = kv_now();
    /* with the GPU oracle the scoring is packed for the device and its rows collected later (collect_rows) */
    int dev = kv_oracle_device_eval(orc), dcand = dev && r->on_gpu && r->m->candidates_dev;
    kv_dev_cands dc = {0};
    kv_status st = KV_OK;
    /* the candidates feed the diagnostics: copied outside the timed search (issue 12 goal 1), or left on
     * the device for the device evaluation */
    if (dcand) st = r->m->candidates_dev(r->state, &dc);
    else if (r->m->candidates) st = r->m->candidates(r->state, &r->sel);
    if (st == KV_OK && dev)
        st = kv_protocol_submit(proto, orc, b, t, r->m, &r->sel, keff[b], slot, dcand ? &dc : NULL);
    if (st == KV_OK && !dev) st = kv_protocol_score(proto, orc, ores, t, r->m, &r->sel, keff[b], rows);
    if (st == KV_OK && !dev) st = kv_rows_push(rec, rows, Hq);
    double s2 = kv_now();
    rec->diag_s += s2 - s1;
    *diag += s2 - s1;
    return st;
}

static void push_search_time(kv_method_run *rec, double s) {
    rec->search_s[rec->n_steps++] = s;
    rec->search_total_s += s;
}

/* Runs append (stage 0) or search + scoring (stage 1, budget b) of
 * instance i; returns its status, keeping the message (kv_fail's buffer is
 * per thread) in msg. Adds the search and diagnostics seconds to *srch and
 * *diag. */
static kv_status inst_work(run_inst *in, int stage, int t, int b, const float *k, const float *v, const float *mq,
                           const int *keff, kv_method_run *recs, kv_oracle *orc, const kv_oracle_out *ores,
                           kv_protocol *proto, kv_step_metric *rows, int Hq, double *srch, double *diag,
                           char *msg, size_t msg_cap) {
    kv_method_run *r = &in->r;
    kv_status st;
    if (stage == 0) {
        double a0 = kv_now();
        st = r->m->append(r->state, t, k, v, mq);
        r->append_s += kv_now() - a0;
    } else {
        kv_method_run *rec = &recs[in->first_rec + b - in->b0];
        kv_selection_reset(&r->sel);
        double s0 = kv_now();
        st = r->m->search(r->state, t, mq, keff[b], &r->sel);
        double s1 = kv_now();
        push_search_time(rec, s1 - s0);
        *srch += s1 - s0;
        if (st == KV_OK) st = inst_score(r, rec, in->first_rec + b - in->b0, t, b, keff, orc, ores, proto, rows, Hq, diag);
    }
    if (st != KV_OK) snprintf(msg, msg_cap, "%s", kv_last_error());
    return st;
}

/* Budget b's search of a queued instance (mark set): launched behind prev
 * (NULL: behind nothing), not waited for. */
static kv_status inst_launch(run_inst *in, int t, int b, const float *mq, const int *keff, kv_gpu_mark *mark,
                             const kv_gpu_mark *prev, double *srch) {
    kv_method_run *r = &in->r;
    kv_selection_reset(&r->sel);
    kv_gpu_mark_after(mark, prev);
    double s0 = kv_now();
    kv_status st = r->m->search_launch(r->state, t, mq, keff[b], &r->sel, mark);
    *srch += kv_now() - s0;
    return st;
}

/* Waits for it; its time is the device time between its marks. */
static kv_status inst_finish(run_inst *in, kv_method_run *rec, int t, int b, const int *keff, kv_gpu_mark *mark,
                             double *srch) {
    kv_method_run *r = &in->r;
    double s0 = kv_now(), ds = 0;
    kv_status st = r->m->search_finish(r->state, t, keff[b], &r->sel);
    *srch += kv_now() - s0;
    if (st == KV_OK) st = kv_gpu_mark_seconds(mark, &ds);
    push_search_time(rec, ds);
    return st;
}

/* One step of the GPU path with queued searches (issue 12 goal 1: a search
 * that waits for the device on its own costs a round trip, 14.7 us with no
 * work at all on the H200, session 20 call C): every instance appends; the first
 * budget of each queued instance (mark set: on the GPU, with
 * search_launch) is launched, one behind the other on the device; the
 * instances off the GPU search and are scored meanwhile; then each queued
 * instance is finished and scored, its further budgets launched and
 * finished one at a time; then the GPU instances that cannot queue search
 * as before. Each search's time is the device time between its marks (the
 * bench's measure: kernels queued behind other work), its result's copy
 * back excluded. Every number is the serial loop's (tests: run_golden_gpu
 * with and without KVBENCH_RUN_QUEUE=0). */
static kv_status step_queued(run_inst *inst, int n_inst, kv_gpu_mark **mark, int t, int score, const float *k,
                             const float *v, const float *mq, const int *keff, kv_method_run *recs, kv_oracle *orc,
                             kv_protocol *proto, kv_step_metric *rows, int Hq, double *app, double *srch,
                             double *diag) {
    char msg[8]; /* kv_last_error() keeps the message: this loop is serial */
    for (int i = 0; i < n_inst; i++) {
        double a0 = kv_now();
        kv_status st = inst_work(&inst[i], 0, t, 0, k, v, mq, keff, recs, NULL, NULL, NULL, NULL, Hq, srch, diag, msg,
                                 sizeof msg);
        *app += kv_now() - a0;
        if (st != KV_OK) return st;
    }
    if (!score) return KV_OK;
    const kv_gpu_mark *prev = NULL;
    for (int i = 0; i < n_inst; i++) {
        kv_gpu_mark *mk = mark[inst[i].first_rec];
        if (!mk) continue;
        KV_TRY(inst_launch(&inst[i], t, inst[i].b0, mq, keff, mk, prev, srch));
        prev = mk;
    }
    for (int pass = 0; pass < 3; pass++) /* off the GPU, queued, the GPU's others */
        for (int i = 0; i < n_inst; i++) {
            run_inst *in = &inst[i];
            int queued = mark[in->first_rec] != NULL;
            if (pass != (queued ? 1 : in->r.on_gpu ? 2 : 0)) continue;
            for (int b = in->b0; b < in->b0 + in->nb; b++) {
                int slot = in->first_rec + b - in->b0;
                kv_oracle_out ov;
                kv_oracle_view(orc, b, &ov);
                if (!queued) {
                    KV_TRY(inst_work(in, 1, t, b, NULL, NULL, mq, keff, recs, orc, &ov, proto, rows, Hq, srch, diag,
                                     msg, sizeof msg));
                    continue;
                }
                if (b > in->b0) KV_TRY(inst_launch(in, t, b, mq, keff, mark[slot], NULL, srch));
                KV_TRY(inst_finish(in, &recs[slot], t, b, keff, mark[slot], srch));
                KV_TRY(inst_score(&in->r, &recs[slot], slot, t, b, keff, orc, &ov, proto, rows, Hq, diag));
            }
        }
    return KV_OK;
}

/* The rows of every device scoring not collected yet, into their records
 * (record i is diagnostics slot i; after kv_oracle_diag_wait or a
 * kv_oracle_step, which waits for the oracle's stream). */
static kv_status collect_rows(kv_oracle *orc, kv_protocol *proto, kv_method_run *recs, int n_recs,
                              kv_step_metric *rows, int Hq) {
    for (int i = 0; i < n_recs; i++) {
        int got = kv_protocol_collect(proto, orc, i, rows, recs[i].m->name);
        if (got < 0) return KV_ERR_INTERNAL;
        if (got) KV_TRY(kv_rows_push(&recs[i], rows, Hq));
    }
    return KV_OK;
}

/* One layer's decode loop: the oracle once per evaluated step, then every
 * instance appends position t and (at an evaluated step) searches at each
 * of its budgets b and is scored into its record recs[inst.first_rec + b].
 * On the CPU path with several threads
 * (issue 12) the instances of a step are independent (each its own state,
 * selection and records; the oracle's results are read-only by then), so
 * they run in parallel, one instance per thread at a time, each scored
 * with its thread's own protocol scratch; a method's internal OpenMP loops
 * then run single-threaded inside. Every number is the serial loop's
 * (tests: run_golden_cpu). The GPU path stays serial: the GPU oracle's
 * gather buffers are shared. With the GPU oracle the protocol's arithmetic
 * runs on the device (kv_protocol_submit; issue 12: it was 1.2 ms per
 * method-step on the host): a step's scorings are packed as the methods
 * search, launched on the oracle's stream after the last search of the step
 * (so none shares the GPU with a timed search), and their rows read back
 * after the next oracle step (which waits for them) or at the end: the host
 * never waits on them. */
static kv_status run_loop(const kv_layer *L, const run_opts *o, int P, run_inst *inst, int n_inst, kv_method_run *recs,
                          const int *keff, kv_oracle *orc, kv_run_meta *meta, kv_profile_rows *prof,
                          const char *layer) {
    int D = L->D, T = L->T, total = T > P ? (int)(((long long)T - P + o->stride - 1) / o->stride) : 0;
    if (o->max_steps && total > o->max_steps) total = o->max_steps;
    double *ph = meta->phase_s;
    int par = !meta->use_gpu && n_inst > 1 && omp_get_max_threads() > 1;
    int nth = par ? omp_get_max_threads() : 1;
    meta->parallel_methods |= par;
    float *q = kv_malloc((size_t)L->Hq * D * sizeof(float), "step queries");
    /* --lag d: the methods get the query of t-d (mq), the oracle the query of t (q) */
    float *mq = o->lag ? kv_malloc((size_t)L->Hq * D * sizeof(float), "lagged queries") : q;
    float *k = kv_malloc((size_t)L->Hkv * D * sizeof(float), "step keys");
    float *v = kv_malloc((size_t)L->Hkv * D * sizeof(float), "step values");
    kv_step_metric *rows = kv_malloc((size_t)nth * L->Hq * sizeof *rows, "step metrics");
    kv_protocol **proto = kv_calloc((size_t)nth, sizeof *proto, "protocol scratch");
    kv_status *ist = kv_calloc((size_t)n_inst + 1, sizeof *ist, "instance status");
    enum { MSG = 1024 };
    char *msg = kv_malloc((size_t)(n_inst + 1) * MSG, "instance messages");
    int *order = kv_malloc((size_t)(n_inst + 1) * sizeof *order, "instance order");
    double *cost = kv_calloc((size_t)n_inst + 1, sizeof *cost, "instance costs");
    kv_status st = (!q || !mq || !k || !v || !rows || !proto || !ist || !msg || !order || !cost) ? KV_ERR_NOMEM : KV_OK;
    for (int i = 0; order && i < n_inst; i++) order[i] = i;
    for (int i = 0; i < nth && st == KV_OK; i++)
        st = kv_protocol_create(L, o->sink, o->local, keff[o->nk - 1], P, &proto[i]);
    int n_recs = n_inst ? inst[n_inst - 1].first_rec + inst[n_inst - 1].nb : 0;
    for (int i = 0; i < n_recs && st == KV_OK; i++)
        if (!(recs[i].search_s = kv_malloc((size_t)(total + 1) * sizeof(double), "search times"))) st = KV_ERR_NOMEM;
    for (int i = 0; i < n_inst; i++) /* the method, for messages (the rest of the record is filled after the loop) */
        for (int b = 0; b < inst[i].nb; b++) recs[inst[i].first_rec + b].m = inst[i].r.m;
    int dev = st == KV_OK && kv_oracle_device_eval(orc); /* the device scores every record (a slot each) */
    if (dev) st = kv_oracle_diag_slots(orc, n_recs);
    /* the GPU path queues the searches of a step (step_queued): a mark per record of a queued instance */
    int queue = st == KV_OK && meta->use_gpu && !par && kv_env_on("KVBENCH_RUN_QUEUE");
    kv_gpu_mark **mark = queue ? kv_calloc((size_t)n_recs + 1, sizeof *mark, "search marks") : NULL;
    if (queue && !mark) st = KV_ERR_NOMEM;
    for (int i = 0; mark && i < n_inst && st == KV_OK; i++)
        for (int b = 0; inst[i].r.on_gpu && inst[i].r.m->search_launch && b < inst[i].nb && st == KV_OK; b++) {
            st = kv_gpu_mark_create(&mark[inst[i].first_rec + b]);
            recs[inst[i].first_rec + b].search_dev = 1;
        }
    /* the step's queries page-locked, so the queued searches' uploads of them are asynchronous */
    int qpin = queue && kv_gpu_host_pin(q, (size_t)L->Hq * D * sizeof(float));
    int mqpin = queue && mq != q && kv_gpu_host_pin(mq, (size_t)L->Hq * D * sizeof(float));
    double t_start = kv_now();
    int show = isatty(2), done = 0;
    meta->steps_evaluated = meta->steps_skipped = 0;
    for (int t = P; t < T && st == KV_OK && done < total; t++) {
        double c0 = kv_now();
        kv_layer_rows(L, 'k', t, k); /* float32 rows of either form (issue 12 goal 3) */
        kv_layer_rows(L, 'q', t, q);
        if (o->lag) kv_layer_rows(L, 'q', t - o->lag > 0 ? t - o->lag : 0, mq);
        if (L->v || L->v16) kv_layer_rows(L, 'v', t, v);
        double c1 = kv_now();
        ph[KV_PH_BOOK] += c1 - c0;
        /* the oracle first (it reads the layer, not the methods), then one
         * parallel section per step: each instance appends position t and,
         * at an evaluated step, searches and is scored at each of its budgets */
        int eval = (t - P) % o->stride == 0, score = eval && t + 1 - o->local - o->sink > 0;
        if (score) {
            kv_oracle_out ores;
            st = kv_oracle_step(orc, t, q, &ores);
            double c2 = kv_now();
            ph[KV_PH_ORACLE] += c2 - c1;
            if (st == KV_OK && dev) { /* the previous step's device scorings are done: the oracle waited */
                st = collect_rows(orc, proto[0], recs, n_recs, rows, L->Hq);
                ph[KV_PH_DIAG] += kv_now() - c2;
                c2 = kv_now();
            }
            if (st == KV_OK && prof && ores.budget) st = kv_profile_push(prof, t, ores.budget);
            for (int i = 0; i < nth; i++) kv_protocol_new_step(proto[i], t);
            ph[KV_PH_BOOK] += kv_now() - c2;
            if (st != KV_OK) break;
        }
        double m0 = kv_now(), app = 0, srch = 0, diag = 0;
        if (mark) {
            st = step_queued(inst, n_inst, mark, t, score, k, L->v || L->v16 ? v : NULL, mq, keff, recs, orc, proto[0],
                             rows, L->Hq, &app, &srch, &diag);
        } else {
            /* longest first (by the instance's previous step): the step's
             * barrier then waits on short tails, not on one long method started
             * last (issue 12, goal 5); the order changes no number */
            for (int j = 1; par && j < n_inst; j++)
                for (int x = order[j], y = j; y > 0 && cost[order[y - 1]] < cost[x]; y--) {
                    order[y] = order[y - 1];
                    order[y - 1] = x;
                }
#pragma omp parallel for schedule(dynamic, 1) if (par) reduction(+ : app, srch, diag)
            for (int j = 0; j < n_inst; j++) {
                int i = order[j], th = par ? omp_get_thread_num() : 0;
                char *im = msg + (size_t)i * MSG;
                double a0 = kv_now();
                ist[i] = inst_work(&inst[i], 0, t, 0, k, L->v || L->v16 ? v : NULL, mq, keff, recs, NULL, NULL, NULL,
                                   NULL, L->Hq, &srch, &diag, im, MSG);
                app += kv_now() - a0;
                for (int b = inst[i].b0; score && ist[i] == KV_OK && b < inst[i].b0 + inst[i].nb; b++) {
                    kv_oracle_out ov;
                    kv_oracle_view(orc, b, &ov);
                    ist[i] = inst_work(&inst[i], 1, t, b, NULL, NULL, mq, keff, recs, orc, &ov, proto[th],
                                       rows + (size_t)th * L->Hq, L->Hq, &srch, &diag, im, MSG);
                }
                cost[i] = kv_now() - a0;
            }
            for (int i = 0; i < n_inst && st == KV_OK; i++)
                if (ist[i] != KV_OK) st = kv_fail(ist[i], "%s", msg + (size_t)i * MSG);
        }
        if (st == KV_OK && dev && score) { /* the step's device scorings, after its searches */
            double f0 = kv_now();
            st = kv_oracle_diag_flush(orc);
            diag += kv_now() - f0;
        }
        ph[KV_PH_APPEND] += app;
        ph[KV_PH_SEARCH] += srch;
        ph[KV_PH_DIAG] += diag;
        ph[KV_PH_METHODS_WALL] += kv_now() - m0;
        if (st != KV_OK || !eval) continue;
        done++;
        if (!score) { meta->steps_skipped++; continue; }
        meta->steps_evaluated++;
        double c4 = kv_now();
        if (show && (done % 16 == 0 || done == total))
            progress(t_start, done, total, done == total && kv_now() - t_start > 2.0, layer);
        ph[KV_PH_BOOK] += kv_now() - c4;
    }
    if (st == KV_OK && dev) { /* the last step's device scorings */
        double c0 = kv_now();
        st = kv_oracle_diag_wait(orc);
        if (st == KV_OK) st = collect_rows(orc, proto[0], recs, n_recs, rows, L->Hq);
        ph[KV_PH_DIAG] += kv_now() - c0;
    }
    if (qpin) kv_gpu_host_unpin(q);
    if (mqpin) kv_gpu_host_unpin(mq);
    for (int i = 0; mark && i < n_recs; i++) kv_gpu_mark_destroy(mark[i]);
    free(mark);
    if (mq != q) free(mq);
    for (int i = 0; proto && i < nth; i++) kv_protocol_destroy(proto[i]);
    free(proto); free(ist); free(msg); free(order); free(cost);
    free(q); free(k); free(v); free(rows);
    return st;
}

static int has_seed_param(const kv_method *m) {
    for (const kv_param_spec *s = m->params; s && s->name; s++)
        if (!strcmp(s->name, "seed")) return 1;
    return 0;
}

/* Parses --layer (NULL: the first layer; "all"; or a comma list) into
 * indices; returns the count, or -1 after printing the error (exit 2). */
/* ---- memory needed by a run, before anything is allocated (issue 12) ----
 * The formula is kv_mem_estimate (cli/memory.c); here the run's counts.
 * Available: MemAvailable of /proc/meminfo (KVBENCH_MEM_LIMIT=BYTES, or
 * the loader's KVBENCH_MEM_AVAILABLE, overrides it) and the device's free memory (KVBENCH_GPU_MEM_LIMIT). */
static int layer_form_f16(int use_gpu) {
    const char *e = getenv("KVBENCH_LAYER");
    return e && !strcmp(e, "f32") ? 0 : e && !strcmp(e, "f16") ? 1 : use_gpu;
}

static kv_status check_memory(const run_opts *o, const kv_trace_info *in, const int *lidx, int n_layers,
                              const kv_method_run *picked, int n_picked, int use_gpu) {
    kv_mem_shape ms = {.Hq = in->num_q_heads, .Hkv = in->num_kv_heads, .T = in->num_tokens, .P = in->prefill_len,
                       .D = in->head_dim, .f16_trace = 1, .use_gpu = use_gpu, .lag = o->lag > 0, .nk = o->nk,
                       .profile = !o->no_profile};
    int half = 1;
    for (int i = 0; i < n_layers; i++) {
        ms.has_v |= in->layer_has_v[lidx[i]];
        half &= in->layer_half[lidx[i]];
        ms.f16_trace &= kv_trace_layer_f16(in, lidx[i]);
    }
    ms.layer_f16 = ms.f16_trace && layer_form_f16(use_gpu);
    long long steps = in->num_tokens > in->prefill_len ? ((long long)in->num_tokens - in->prefill_len + o->stride - 1) / o->stride : 0;
    ms.steps = (int)(o->max_steps && steps > o->max_steps ? o->max_steps : steps);
    for (int i = 0; i < n_picked; i++) {
        const kv_method *m = picked[i].m;
        int per_k = m->search_updates_state && o->nk > 1;
        kv_mem_add_method(&ms, m, (has_seed_param(m) ? o->seeds : 1) * (per_k ? o->nk : 1), per_k ? 1 : o->nk, use_gpu);
    }
    ms.k_half = half;
    kv_mem_need nd;
    kv_mem_estimate(&ms, &nd);
    double avail = kv_mem_available();
    const char *form = ms.layer_f16 ? "float16" : "float32";
    if (avail >= 0 && nd.host > avail)
        return kv_fail(KV_ERR_INPUT, "%s: this run needs %.0f bytes (%.2f GB) of host memory but %.0f bytes (%.2f GB) "
                       "are available%s: the layer as %s %.0f + the builds' prefill %.0f + %d CPU method instance(s) "
                       "%.0f (a float32 copy of K and a score row per q head each, the estimate) + selection buffers "
                       "%.0f + the oracle's host buffers %.0f + result rows %.0f (T=%d, P=%d, Hq=%d, Hkv=%d, D=%d%s); "
                       "use a shorter trace (kvbench slice --tokens) or fewer methods", in->path, nd.host,
                       nd.host / 1e9, avail, avail / 1e9,
                       kv_env_bytes("KVBENCH_MEM_LIMIT") >= 0       ? " (KVBENCH_MEM_LIMIT)"
                       : kv_env_bytes("KVBENCH_MEM_AVAILABLE") >= 0 ? " (KVBENCH_MEM_AVAILABLE)"
                                                                 : " (MemAvailable)",
                       form, nd.layer, nd.prefill, ms.n_cpu, nd.methods, nd.selections, nd.oracle, nd.rows,
                       in->num_tokens, in->prefill_len, in->num_q_heads, in->num_kv_heads, in->head_dim,
                       ms.has_v ? ", with v" : "");
    if (use_gpu) {
        double glim = kv_env_bytes("KVBENCH_GPU_MEM_LIMIT"), gfree = glim >= 0 ? glim : (double)kv_gpu_mem_free();
        if (gfree > 0 && nd.dev > gfree)
            return kv_fail(KV_ERR_INPUT, "%s: this run needs %.0f bytes (%.2f GB) of GPU memory but %.0f bytes "
                           "(%.2f GB) are free%s: the oracle's K%s as %s and its scores %.0f + %d GPU method instance(s) "
                           "%.0f (K and a score row per q head each, the estimate; %d of them read the oracle's K) "
                           "(T=%d, Hq=%d, Hkv=%d, D=%d); use a shorter trace or fewer methods",
                           in->path, nd.dev, nd.dev / 1e9, gfree, gfree / 1e9,
                           glim >= 0 ? " (KVBENCH_GPU_MEM_LIMIT)" : " (cudaMemGetInfo)", ms.has_v ? ", V" : "",
                           half ? "float16" : "float32", nd.dev_oracle, ms.n_gpu, nd.dev_methods,
                           ms.n_gpu_lent, in->num_tokens, in->num_q_heads, in->num_kv_heads, in->head_dim);
    }
    if (kv_env_is1("KVBENCH_MEM_VERBOSE"))
        fprintf(stderr, "kvbench: memory estimate: host %.0f bytes (available %.0f; layer as %s %.0f, prefill %.0f, "
                "methods %.0f, selections %.0f, oracle %.0f, rows %.0f), device %.0f bytes (oracle %.0f, methods %.0f)\n",
                nd.host, avail, form, nd.layer, nd.prefill, nd.methods, nd.selections, nd.oracle, nd.rows, nd.dev,
                nd.dev_oracle, nd.dev_methods);
    return KV_OK;
}

static int pick_layers(const kv_trace_info *in, const char *spec, int *idx) {
    if (!spec) { idx[0] = 0; return 1; }
    if (!strcmp(spec, "all")) {
        for (int i = 0; i < in->num_layers; i++) idx[i] = i;
        return in->num_layers;
    }
    int n = 0;
    for (const char *p = spec;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char name[64];
        int li = -1;
        if (len > 0 && len < sizeof name) {
            memcpy(name, p, len);
            name[len] = 0;
            li = kv_trace_find_layer(in, name);
        }
        if (li < 0) {
            fprintf(stderr, "kvbench: %s: --layer %.*s: no such layer; the trace has:", in->path, (int)len, p);
            for (int i = 0; i < in->num_layers; i++) fprintf(stderr, " %s", in->layer_names[i]);
            fprintf(stderr, " (or --layer all)\n");
            return -1;
        }
        for (int j = 0; j < n; j++)
            if (idx[j] == li) {
                fprintf(stderr, "kvbench run: --layer: layer %s is listed twice in '%s'\n", in->layer_names[li], spec);
                return -1;
            }
        if (n >= in->num_layers) return -1;
        idx[n++] = li;
        if (!c) break;
        p = c + 1;
    }
    return n;
}

/* The layer's host form (issue 12 goal 3): on the GPU path a float16 trace
 * stays float16 (uploaded as it is, rows converted where the host needs
 * float32); the CPU path's oracle and methods read whole float32 arrays at
 * every step, so there it is float32. KVBENCH_LAYER=f16 loads float16 on
 * the CPU path too, builds the indexes from it and widens it before the
 * oracle (to measure the float16 load, and to test the float16 builds
 * against the float32 ones on a machine without a GPU); KVBENCH_LAYER=f32
 * keeps float32 everywhere. */
static kv_status load_layer_form(const kv_trace_info *in, int li, int use_gpu, kv_layer *L) {
    return kv_trace_load_layer_as(in, li, layer_form_f16(use_gpu) ? KV_LAYER_F16 : KV_LAYER_F32, L);
}

/* The layer's oracle; its setup time (GPU: the layer's upload) is the oracle phase's. */
static kv_status open_oracle(const kv_layer *L, const kv_trace_info *in, const run_opts *o, const int *keff,
                             kv_run_meta *meta, kv_oracle **orc) {
    double t0 = kv_now();
    kv_status st = kv_oracle_create_ks(L, in->softmax_scale, o->sink, o->local, keff, o->nk, in->prefill_len,
                                       meta->use_gpu, !o->no_profile, orc);
    if (st == KV_OK) kv_oracle_set_context(*orc, in->path, meta->layer);
    meta->phase_s[KV_PH_ORACLE] += kv_now() - t0;
    return st;
}

/* Evaluates layer li: load, build every instance, the loop, then renders
 * its records into acc and frees them (one layer's rows in memory). */
static kv_status run_layer(const run_opts *o, kv_trace_info *in, int li, kv_run_meta *meta, const kv_method_run *picked,
                           int n_picked, const int *keff, kv_results_acc *acc) {
    kv_layer L;
    double l0 = kv_now();
    KV_TRY(load_layer_form(in, li, meta->use_gpu, &L));
    meta->phase_s[KV_PH_LOAD] += kv_now() - l0;
    meta->layer = in->layer_names[li];
    run_inst *inst = kv_calloc((size_t)n_picked * o->seeds * o->nk, sizeof *inst, "method instances");
    int n_inst = 0, n_recs = 0;
    if (!inst) { kv_layer_free(&L); return KV_ERR_NOMEM; }
    for (int i = 0; i < n_picked; i++) {
        int seeded = has_seed_param(picked[i].m), n = seeded ? o->seeds : 1;
        int per_k = picked[i].m->search_updates_state && o->nk > 1;
        for (int s = 0; s < n; s++)
            for (int b = 0; b < (per_k ? o->nk : 1); b++, n_inst++) {
                inst[n_inst].r = picked[i];
                inst[n_inst].r.seed = (uint64_t)o->seed + (uint64_t)s;
                inst[n_inst].r.seeded = seeded;
                inst[n_inst].b0 = per_k ? b : 0;
                inst[n_inst].nb = per_k ? 1 : o->nk;
                inst[n_inst].first_rec = n_recs;
                n_recs += inst[n_inst].nb;
            }
    }
    kv_method_run *recs = kv_calloc((size_t)n_recs, sizeof *recs, "run records");
    kv_profile_rows prof = {.Hq = L.Hq};
    kv_shape sh = {.num_q_heads = L.Hq, .num_kv_heads = L.Hkv, .head_dim = L.D, .group = L.Hq / L.Hkv,
                   .max_tokens = L.T, .prefill_len = in->prefill_len, .softmax_scale = in->softmax_scale,
                   .sink = o->sink, .local = o->local, .seed = (uint64_t)o->seed, .use_gpu = meta->use_gpu};
    kv_oracle *orc = NULL;
    kv_status st = recs ? KV_OK : KV_ERR_NOMEM;
    /* On the GPU the oracle comes first and lends its device K to the methods that read the layer's keys (exact:
     * one device copy of K, issue 12 goal 3); on the CPU it comes after the builds, which read the layer in place
     * before it is widened for the oracle. */
    if (st == KV_OK && meta->use_gpu) {
        st = open_oracle(&L, in, o, keff, meta, &orc);
        if (st == KV_OK) sh.layer_keys = kv_oracle_gpu_keys(orc);
    }
    double b0 = kv_now();
    if (st == KV_OK) st = build_all(&L, in->prefill_len, o->lag, keff, inst, n_inst, &sh);
    meta->phase_s[KV_PH_BUILD] += kv_now() - b0;
    if (st == KV_OK && !meta->use_gpu) st = kv_layer_widen(&L); /* the CPU oracle reads float32 arrays */
    if (st == KV_OK && !meta->use_gpu) st = open_oracle(&L, in, o, keff, meta, &orc);
    if (st == KV_OK)
        st = run_loop(&L, o, in->prefill_len, inst, n_inst, recs, keff, orc, meta, &prof, meta->layer);
    b0 = kv_now();
    for (int i = 0; i < n_inst; i++) {
        kv_method_run *r = &inst[i].r;
        if (r->state) r->index_bytes = r->m->memory_bytes(r->state);
        for (int b = inst[i].b0; recs && b < inst[i].b0 + inst[i].nb; b++) {
            kv_method_run *rec = &recs[inst[i].first_rec + b - inst[i].b0];
            kv_step_metric *rows = rec->rows;
            double *ss = rec->search_s;
            size_t nr = rec->n_rows;
            int ns = rec->n_steps;
            double stot = rec->search_total_s, dg = rec->diag_s;
            int sdev = rec->search_dev;
            *rec = *r; /* the instance's identity and timings, then the record's own */
            rec->rows = rows; rec->search_s = ss; rec->n_rows = nr; rec->n_steps = ns; rec->search_total_s = stot;
            rec->diag_s = dg;
            rec->search_dev = sdev;
            rec->layer = meta->layer;
            rec->k = o->ks[b];
            rec->k_eff = keff[b];
        }
    }
    if (st == KV_OK && meta->steps_evaluated == 0)
        st = kv_fail(KV_ERR_INPUT, "%s: no decode step has a non-empty retrievable region (T=%d, P=%d, sink=%d, "
                     "local=%d): nothing to evaluate", in->path, in->num_tokens, in->prefill_len, o->sink, o->local);
    if (o->verbose && orc && kv_oracle_device_eval(orc)) {
        double ds, de, dd;
        kv_oracle_gpu_times(orc, &ds, &de, &dd);
        fprintf(stderr, "oracle: layer %s: device seconds (CUDA events): steps %.3f, thresholds and profile %.3f, "
                "diagnostics %.3f; %ld head-steps' thresholds and profile redone on the host (a profile sum within "
                "its rounding bound of a target)\n", meta->layer, ds, de, dd, kv_oracle_host_heads(orc));
    }
    for (int i = 0; o->verbose && recs && i < n_recs; i++)
        fprintf(stderr, "search %-12s layer %s k %d: %.3f s over %d steps, mean %.1f us (%s)\n",
                recs[i].m->name, meta->layer, recs[i].k, recs[i].search_total_s, recs[i].n_steps,
                recs[i].n_steps ? 1e6 * recs[i].search_total_s / recs[i].n_steps : 0.0,
                recs[i].search_dev ? "device time, queued" : "host timer");
    if (st == KV_OK) st = kv_results_add(acc, meta, recs, n_recs, o->no_profile ? NULL : &prof);
    if (st == KV_OK && !o->no_profile && !o->quiet)
        kv_profile_print(stderr, meta->layer, &prof, in->prefill_len, o->window, o->sink, o->local);
    for (int i = 0; i < n_inst; i++) {
        if (inst[i].r.state) inst[i].r.m->destroy(inst[i].r.state);
        if (inst[i].r.sel_pinned) pin_selection(&inst[i].r.sel, inst[i].r.m, 0);
        kv_selection_free(&inst[i].r.sel);
    }
    for (int i = 0; recs && i < n_recs; i++) { free(recs[i].rows); free(recs[i].search_s); }
    free(recs);
    free(inst);
    kv_profile_free(&prof);
    kv_oracle_destroy(orc);
    kv_layer_free(&L);
    meta->phase_s[KV_PH_OUTPUT] += kv_now() - b0;
    return st;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_run(argc, argv, &o);
    if (rc >= 0) return rc;
    kv_method_run runs[MAX_METHODS];
    int n_runs = 0;
    if ((rc = kv_pick_methods("run", o.methods, o.params, o.n_params, runs, MAX_METHODS, &n_runs)) >= 0) return rc;
    kv_cleanup_install(); /* from here on, SIGINT/SIGTERM remove whatever temporary path is being written */
    /* the output is checked before the trace is read: a run never ends on "cannot create --out" */
    char *out = o.out ? kv_strfmt("%s", o.out) : NULL;
    if (o.out && !out) return kv_report(KV_ERR_NOMEM);
    for (size_t n = out ? strlen(out) : 0; n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0; /* "dir/" is "dir" */
    kv_status st = out ? kv_results_check_out(out, o.force) : KV_OK; /* the default: once the trace is open */
    if (st != KV_OK) { free(out); return kv_report(st); }

    int keff[MAX_KS];
    kv_run_meta meta = {.k = o.k, .sink = o.sink, .local = o.local, .stride = o.stride, .max_steps = o.max_steps,
                        .window = o.window, .seed = (uint64_t)o.seed, .force = o.force, .ks = o.ks, .nk = o.nk,
                        .seeds = o.seeds, .lag = o.lag};
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in || !(meta.cmdline = kv_command_line(argc + 1, argv - 1))) { free(in); free(out); return kv_report(KV_ERR_NOMEM); }
    st = kv_trace_open(o.trace, in);
    if (st != KV_OK) { free(in); free(out); free(meta.cmdline); return kv_report(st); }
    int *lidx = kv_malloc((size_t)(in->num_layers + 1) * sizeof(int), "layer list");
    int n_layers = lidx ? pick_layers(in, o.layer, lidx) : -1;
    char *layers = NULL;
    for (int i = 0; i < n_layers; i++) {
        char *x = kv_strfmt("%s%s%s", layers ? layers : "", i ? "," : "", in->layer_names[lidx[i]]);
        free(layers);
        layers = x;
    }
    if (n_layers < 0 || (n_layers > 0 && !layers)) {
        free(lidx); free(layers); free(in); free(out); free(meta.cmdline);
        return lidx ? 2 : kv_report(KV_ERR_NOMEM);
    }
    meta.info = in;
    meta.layer = in->layer_names[lidx[0]];
    meta.layers = layers;
    /* The protocol's counts against the trace: the last step's retrievable
     * region [sink, T - local) must be non-empty, and a budget above it
     * retrieves the whole region at every step, so it is clamped there
     * (min(k, region) is what every step uses either way). */
    long long region = (long long)in->num_tokens - o.sink - o.local;
    if (region < 1) st = kv_fail(KV_ERR_INPUT, "%s: --sink %d + --local %d leave no retrievable region in the "
                                 "trace's %d tokens (expected sink + local < T): nothing to evaluate", in->path,
                                 o.sink, o.local, in->num_tokens);
    else if (in->prefill_len >= in->num_tokens)
        st = kv_fail(KV_ERR_INPUT, "%s: prefill_len %d leaves no decode step in the trace's %d tokens", in->path,
                     in->prefill_len, in->num_tokens);
    for (int b = 0; b < o.nk; b++) {
        keff[b] = o.ks[b] < region ? o.ks[b] : (int)(region > 0 ? region : 1);
        if (st == KV_OK && o.ks[b] > region)
            fprintf(stderr, "kvbench: warning: --k %d is larger than the largest retrievable region (T - sink - local = "
                            "%d - %d - %d = %lld): every step retrieves its whole region; the effective budget is %d "
                            "(min(k, region) at each step)\n", o.ks[b], in->num_tokens, o.sink, o.local, region, keff[b]);
    }
    meta.k_effective = keff[o.nk - 1];
    if (st == KV_OK && !out) {
        out = default_out(in, n_layers == 1 ? meta.layer : n_layers == in->num_layers ? "all" : "layers");
        st = !out ? KV_ERR_NOMEM : kv_check_parent("--out", "results/<trace>-<layer>-<time> (the default)");
        if (st == KV_OK) st = kv_results_check_out(out, o.force);
    }
    if (st == KV_OK) st = kv_resolve_device(o.device, &meta.gpu, &meta.use_gpu);
    if (st == KV_OK) st = check_memory(&o, in, lidx, n_layers, runs, n_runs, meta.use_gpu);
    if (st != KV_OK) { free(lidx); free(layers); free(in); free(out); free(meta.cmdline); return kv_report(st); }
    kv_host_setup("run", o.threads, &meta.host);
    time_t now = time(NULL);
    strftime(meta.started, sizeof meta.started, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
    char kl[16 * MAX_KS] = "", sd[48] = "";
    if (o.seeds > 1) snprintf(sd, sizeof sd, " (x%d seeds for seeded methods)", o.seeds);
    for (int b = 0; b < o.nk; b++) snprintf(kl + strlen(kl), sizeof kl - strlen(kl), "%s%d", b ? "," : "", o.ks[b]);
    fprintf(stderr, "kvbench %s (%s): trace %s layer %s: T=%d P=%d Hq=%d Hkv=%d D=%d; methods %s; k=%s S=%d W=%d; "
                    "seed %d%s; device %s%s%s%s; %d CPU threads (OMP_WAIT_POLICY %s), load %.2f on %d cores\n",
            KVBENCH_VERSION, kv_git_sha(), in->path, layers, in->num_tokens, in->prefill_len, in->num_q_heads,
            in->num_kv_heads, in->head_dim, o.methods, kl, o.sink, o.local, o.seed,
            sd,
            meta.use_gpu ? meta.gpu.name : "cpu",
            !meta.use_gpu && meta.gpu.reason[0] ? " (no GPU: " : "", meta.use_gpu ? "" : meta.gpu.reason,
            !meta.use_gpu && meta.gpu.reason[0] ? ")" : "", meta.host.threads, meta.host.wait_policy, meta.host.load[0],
            meta.host.cores);

    double w0 = kv_now();
    kv_results_acc acc;
    st = kv_results_begin(&acc);
    for (int i = 0; i < n_layers && st == KV_OK; i++) st = run_layer(&o, in, lidx[i], &meta, runs, n_runs, keff, &acc);
    meta.layer = in->layer_names[lidx[0]];
    meta.wall_s = kv_now() - w0;
    double o0 = kv_now();
    if (st == KV_OK) st = kv_results_write(out, &meta, &acc);
    meta.phase_s[KV_PH_OUTPUT] += kv_now() - o0;
    if (st == KV_OK && o.verbose) kv_phases_print(stderr, &meta);
    if (st == KV_OK && !o.quiet) {
        kv_results_print(stdout, &meta, &acc);
        printf("results: %s/summary.json, %s/drift.csv, %s/steps.csv, %s/profile.csv\n", out, out, out, out);
    }
    rc = st == KV_OK ? 0 : kv_report(st);
    kv_results_end(&acc);
    free(lidx);
    free(layers);
    free(in);
    free(out);
    free(meta.cmdline);
    return rc;
}
