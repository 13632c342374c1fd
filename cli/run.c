/* run.c: `kvbench run`: one trace layer, several methods, the evaluation
 * protocol at every evaluated decode step (README, "Evaluation protocol").
 * The loop enforces causality: each retriever sees the prefill at build(),
 * then position t's key, value and query through append() before the
 * search of step t, and nothing later. The oracle's exact attention of a
 * step is computed once and shared by every method. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../datasets/kv_cleanup.h"
#include "../retrievers/kv_retriever.h"
#include "cli.h"
#include "results.h"

#define MAX_METHODS 32

static const char run_help[] =
    "usage: kvbench run --trace FILE [--layer L14] --method exact,streaming,random [options]\n"
    "  --trace FILE        kvtrace v1 file\n"
    "  --layer NAME        layer to evaluate (L14 or 14; default: the trace's first layer)\n"
    "  --method LIST       comma-separated methods (kvbench list)\n"
    "  --param [M.]N=V     set parameter N (of method M, or of every listed method that has N); repeatable\n"
    "  --k K               budget: indices per list from the retrievable region (default 100)\n"
    "  --sink S            always-attended first tokens (default 4)\n"
    "  --local W           always-attended local window, the current token included (default 64)\n"
    "  --stride s          evaluate every s-th decode step (default 1)\n"
    "  --max-steps N       evaluate at most N steps (default all)\n"
    "  --window N          decode steps per drift window (default 128)\n"
    "  --seed S            seed for seeded methods (default 0)\n"
    "  --lag d             hand every method the query of position t-d (at build, append and search; clamped at 0)\n"
    "                      while the protocol scores step t's exact attention (default 0: the query of t)\n"
    "  --device D          auto|cpu|gpu (default auto: the GPU when one is usable)\n"
    "  --threads N         CPU threads (OpenMP; default: one per core); recorded in summary.json with the\n"
    "                      load average at start (a warning when it is above the core count)\n"
    "  --out DIR           result directory (default results/<trace>-<layer>-<time>)\n"
    "  --force             replace DIR if it is a kvbench result directory (otherwise an existing DIR is an\n"
    "                      error); the old results stay in place until the new ones are complete\n"
    "  --quiet             no table on stdout\n"
    "Writes DIR/summary.json, DIR/drift.csv, DIR/steps.csv all-or-nothing (DIR.tmp.<pid>, then one rename;\n"
    "removed on failure, SIGINT or SIGTERM) and prints a summary table.\n";

typedef struct {
    const char *trace, *layer, *methods, *out;
    const char *params[64];
    int n_params;
    int k, sink, local, stride, max_steps, window, force, quiet, lag;
    int seed, threads;
    kv_device_choice device;
} run_opts;

static int parse_run(int argc, char **argv, run_opts *o) {
    static const struct option opts[] = {
        {"trace", 1, 0, 't'}, {"layer", 1, 0, 'l'}, {"method", 1, 0, 'm'}, {"param", 1, 0, 'p'},
        {"k", 1, 0, 'k'}, {"sink", 1, 0, 'S'}, {"local", 1, 0, 'W'}, {"stride", 1, 0, 's'},
        {"max-steps", 1, 0, 'n'}, {"window", 1, 0, 'w'}, {"seed", 1, 0, 'e'}, {"lag", 1, 0, 'L'}, {"device", 1, 0, 'd'},
        {"threads", 1, 0, 'j'}, {"out", 1, 0, 'o'}, {"force", 0, 0, 'f'}, {"quiet", 0, 0, 'q'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    *o = (run_opts){.k = 100, .sink = 4, .local = 64, .stride = 1, .max_steps = 0, .window = 128};
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
        case 'k': bad = kv_opt_int("run", "k", optarg, 1, big, &o->k); break;
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
        case 'h': fputs(run_help, stdout); return 0;
        default: return kv_opt_error("run", c, argv, opts);
        }
        if (bad) return bad;
    }
    if (optind < argc) return kv_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!o->trace) return kv_usage_error("run", "--trace FILE is required");
    if (!o->methods) return kv_usage_error("run", "--method LIST is required (see kvbench list)");
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

/* Copies position t of [H][T][D] into [H][D]. */
static void gather_row(const float *x, int H, int T, int D, int t, float *out) {
    for (int h = 0; h < H; h++) memcpy(out + (size_t)h * D, x + ((size_t)h * T + t) * D, (size_t)D * sizeof(float));
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

static kv_status build_all(const kv_layer *L, int P, int k, int lag, kv_method_run *runs, int n_runs,
                           const kv_shape *sh) {
    kv_prefill pre = {.n = P};
    float *pk = gather_prefix(L->k, L->Hkv, L->T, L->D, P, 0), *pq = gather_prefix(L->q, L->Hq, L->T, L->D, P, lag);
    float *pv = L->v ? gather_prefix(L->v, L->Hkv, L->T, L->D, P, 0) : NULL;
    kv_status st = (!pk || !pq || (L->v && !pv)) ? KV_ERR_NOMEM : KV_OK;
    pre.k = pk; pre.q = pq; pre.v = pv;
    for (int i = 0; i < n_runs && st == KV_OK; i++) {
        kv_method_run *r = &runs[i];
        kv_shape s = *sh;
        s.use_gpu = sh->use_gpu && r->m->has_gpu;
        r->on_gpu = s.use_gpu;
        int lists = r->m->per_kv_head ? L->Hkv : L->Hq, cap = r->m->variable_budget || k > L->T ? L->T : k;
        st = kv_selection_alloc(&r->sel, lists, L->Hkv, cap, L->T, L->T);
        if (st != KV_OK) break;
        double t0 = kv_now();
        st = r->m->create(&s, &r->ps, &r->state);
        if (st == KV_OK) st = r->m->build(r->state, &pre);
        r->build_s = kv_now() - t0;
        if (st != KV_OK) kv_fail(st, "method %s: build failed: %s", r->m->name, kv_last_error());
    }
    free(pk); free(pq); free(pv);
    return st;
}

static void progress(double t_start, int done, int total, int force) {
    double el = kv_now() - t_start;
    if (!force && el < 2.0) return;
    double rate = done / (el > 0 ? el : 1e-9), eta = rate > 0 ? (total - done) / rate : 0;
    fprintf(stderr, "\rrun: %d/%d steps  %.1f steps/s  ETA %.0fs   ", done, total, rate, eta);
    if (done == total) fputc('\n', stderr);
}

static kv_status run_loop(const kv_layer *L, const run_opts *o, int P, kv_method_run *runs, int n_runs,
                          kv_oracle *orc, kv_protocol *proto, kv_run_meta *meta) {
    int D = L->D, T = L->T, total = T > P ? (int)(((long long)T - P + o->stride - 1) / o->stride) : 0;
    if (o->max_steps && total > o->max_steps) total = o->max_steps;
    float *q = kv_malloc((size_t)L->Hq * D * sizeof(float), "step queries");
    /* --lag d: the methods get the query of t-d (mq), the oracle the query of t (q) */
    float *mq = o->lag ? kv_malloc((size_t)L->Hq * D * sizeof(float), "lagged queries") : q;
    float *k = kv_malloc((size_t)L->Hkv * D * sizeof(float), "step keys");
    float *v = kv_malloc((size_t)L->Hkv * D * sizeof(float), "step values");
    kv_step_metric *rows = kv_malloc((size_t)L->Hq * sizeof *rows, "step metrics");
    for (int i = 0; i < n_runs; i++) runs[i].search_s = kv_malloc((size_t)(total + 1) * sizeof(double), "search times");
    kv_status st = (!q || !mq || !k || !v || !rows) ? KV_ERR_NOMEM : KV_OK;
    for (int i = 0; i < n_runs; i++) if (!runs[i].search_s) st = KV_ERR_NOMEM;
    double t_start = kv_now();
    int show = isatty(2), done = 0;
    for (int t = P; t < T && st == KV_OK && done < total; t++) {
        gather_row(L->k, L->Hkv, T, D, t, k);
        gather_row(L->q, L->Hq, T, D, t, q);
        if (o->lag) gather_row(L->q, L->Hq, T, D, t - o->lag > 0 ? t - o->lag : 0, mq);
        if (L->v) gather_row(L->v, L->Hkv, T, D, t, v);
        for (int i = 0; i < n_runs && st == KV_OK; i++) {
            double a0 = kv_now();
            st = runs[i].m->append(runs[i].state, t, k, L->v ? v : NULL, mq);
            runs[i].append_s += kv_now() - a0;
        }
        if (st != KV_OK || (t - P) % o->stride) continue;
        done++;
        if (t + 1 - o->local - o->sink <= 0) { meta->steps_skipped++; continue; }
        kv_oracle_out ores;
        st = kv_oracle_step(orc, t, q, &ores);
        for (int i = 0; i < n_runs && st == KV_OK; i++) {
            kv_method_run *r = &runs[i];
            kv_selection_reset(&r->sel);
            double s0 = kv_now();
            st = r->m->search(r->state, t, mq, meta->k_effective, &r->sel);
            r->search_s[r->n_steps++] = kv_now() - s0;
            if (st == KV_OK) st = kv_protocol_score(proto, orc, &ores, t, r->m, &r->sel, meta->k_effective, rows);
            if (st == KV_OK) st = kv_rows_push(r, rows, L->Hq);
        }
        meta->steps_evaluated++;
        if (show && (done % 16 == 0 || done == total)) progress(t_start, done, total, done == total && kv_now() - t_start > 2.0);
    }
    if (mq != q) free(mq);
    free(q); free(k); free(v); free(rows);
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

    kv_run_meta meta = {.k = o.k, .sink = o.sink, .local = o.local, .stride = o.stride, .max_steps = o.max_steps,
                        .window = o.window, .seed = (uint64_t)o.seed, .force = o.force, .lag = o.lag};
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in || !(meta.cmdline = kv_command_line(argc + 1, argv - 1))) { free(in); free(out); return kv_report(KV_ERR_NOMEM); }
    st = kv_trace_open(o.trace, in);
    if (st != KV_OK) { free(in); free(out); free(meta.cmdline); return kv_report(st); }
    int li = o.layer ? kv_trace_find_layer(in, o.layer) : 0;
    if (li < 0) {
        fprintf(stderr, "kvbench: %s: --layer %s: no such layer; the trace has:", in->path, o.layer);
        for (int i = 0; i < in->num_layers; i++) fprintf(stderr, " %s", in->layer_names[i]);
        fprintf(stderr, "\n");
        free(in); free(out); free(meta.cmdline);
        return 2;
    }
    meta.info = in;
    meta.layer = in->layer_names[li];
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
    meta.k_effective = o.k < region ? o.k : (int)region;
    if (st == KV_OK && o.k > region)
        fprintf(stderr, "kvbench: warning: --k %d is larger than the largest retrievable region (T - sink - local = "
                        "%d - %d - %d = %lld): every step retrieves its whole region; the effective budget is %d "
                        "(min(k, region) at each step)\n", o.k, in->num_tokens, o.sink, o.local, region, meta.k_effective);
    if (st == KV_OK && !out) {
        out = default_out(in, meta.layer);
        st = !out ? KV_ERR_NOMEM : kv_check_parent("--out", "results/<trace>-<layer>-<time> (the default)");
        if (st == KV_OK) st = kv_results_check_out(out, o.force);
    }
    if (st == KV_OK) st = kv_resolve_device(o.device, &meta.gpu, &meta.use_gpu);
    if (st != KV_OK) { free(in); free(out); free(meta.cmdline); return kv_report(st); }
    kv_host_setup("run", o.threads, &meta.host);
    time_t now = time(NULL);
    strftime(meta.started, sizeof meta.started, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
    fprintf(stderr, "kvbench %s (%s): trace %s layer %s: T=%d P=%d Hq=%d Hkv=%d D=%d; methods %s; k=%d S=%d W=%d; "
                    "seed %d; device %s%s%s%s; %d CPU threads (OMP_WAIT_POLICY %s), load %.2f on %d cores\n",
            KVBENCH_VERSION, kv_git_sha(), in->path, meta.layer, in->num_tokens, in->prefill_len, in->num_q_heads,
            in->num_kv_heads, in->head_dim, o.methods, o.k, o.sink, o.local, o.seed, meta.use_gpu ? meta.gpu.name : "cpu",
            !meta.use_gpu && meta.gpu.reason[0] ? " (no GPU: " : "", meta.use_gpu ? "" : meta.gpu.reason,
            !meta.use_gpu && meta.gpu.reason[0] ? ")" : "", meta.host.threads, meta.host.wait_policy, meta.host.load[0],
            meta.host.cores);

    double w0 = kv_now();
    kv_layer L;
    if ((st = kv_trace_load_layer(in, li, &L)) != KV_OK) { free(in); free(out); free(meta.cmdline); return kv_report(st); }
    kv_shape sh = {.num_q_heads = L.Hq, .num_kv_heads = L.Hkv, .head_dim = L.D, .group = L.Hq / L.Hkv,
                   .max_tokens = L.T, .prefill_len = in->prefill_len, .softmax_scale = in->softmax_scale,
                   .sink = o.sink, .local = o.local, .seed = (uint64_t)o.seed, .use_gpu = meta.use_gpu};
    kv_oracle *orc = NULL;
    kv_protocol *proto = NULL;
    st = build_all(&L, in->prefill_len, meta.k_effective, o.lag, runs, n_runs, &sh);
    if (st == KV_OK)
        st = kv_oracle_create(&L, in->softmax_scale, o.sink, o.local, meta.k_effective, in->prefill_len, meta.use_gpu,
                              &orc);
    if (st == KV_OK) kv_oracle_set_context(orc, in->path, meta.layer);
    if (st == KV_OK) st = kv_protocol_create(&L, o.sink, o.local, meta.k_effective, in->prefill_len, &proto);
    if (st == KV_OK) st = run_loop(&L, &o, in->prefill_len, runs, n_runs, orc, proto, &meta);
    for (int i = 0; i < n_runs; i++)
        if (runs[i].state) runs[i].index_bytes = runs[i].m->memory_bytes(runs[i].state);
    meta.wall_s = kv_now() - w0;
    if (st == KV_OK && meta.steps_evaluated == 0)
        st = kv_fail(KV_ERR_INPUT, "%s: no decode step has a non-empty retrievable region (T=%d, P=%d, sink=%d, "
                     "local=%d): nothing to evaluate", in->path, in->num_tokens, in->prefill_len, o.sink, o.local);
    if (st == KV_OK) st = kv_results_write(out, &meta, runs, n_runs);
    if (st == KV_OK && !o.quiet) {
        kv_results_print(stdout, &meta, runs, n_runs);
        printf("results: %s/summary.json, %s/drift.csv, %s/steps.csv\n", out, out, out);
    }
    rc = st == KV_OK ? 0 : kv_report(st);
    for (int i = 0; i < n_runs; i++) {
        if (runs[i].state) runs[i].m->destroy(runs[i].state);
        kv_selection_free(&runs[i].sel);
        free(runs[i].rows);
        free(runs[i].search_s);
    }
    kv_protocol_destroy(proto);
    kv_oracle_destroy(orc);
    kv_layer_free(&L);
    free(in);
    free(out);
    free(meta.cmdline);
    return rc;
}
