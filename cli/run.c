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
    "  --device D          auto|cpu|gpu (default auto: the GPU when one is usable)\n"
    "  --out DIR           result directory (default results/<trace>-<layer>-<time>)\n"
    "  --force             replace DIR if it exists (otherwise an existing DIR is an error)\n"
    "  --quiet             no table on stdout\n"
    "Writes DIR/summary.json, DIR/drift.csv, DIR/steps.csv atomically and prints a summary table.\n";

typedef struct {
    const char *trace, *layer, *methods, *out;
    const char *params[64];
    int n_params;
    int k, sink, local, stride, max_steps, window, force, quiet;
    int seed;
    kv_device_choice device;
} run_opts;

static int parse_run(int argc, char **argv, run_opts *o) {
    static const struct option opts[] = {
        {"trace", 1, 0, 't'}, {"layer", 1, 0, 'l'}, {"method", 1, 0, 'm'}, {"param", 1, 0, 'p'},
        {"k", 1, 0, 'k'}, {"sink", 1, 0, 'S'}, {"local", 1, 0, 'W'}, {"stride", 1, 0, 's'},
        {"max-steps", 1, 0, 'n'}, {"window", 1, 0, 'w'}, {"seed", 1, 0, 'e'}, {"device", 1, 0, 'd'},
        {"out", 1, 0, 'o'}, {"force", 0, 0, 'f'}, {"quiet", 0, 0, 'q'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    *o = (run_opts){.k = 100, .sink = 4, .local = 64, .stride = 1, .max_steps = 0, .window = 128};
    optind = 1;
    int li = 0;
    for (int c; (c = getopt_long(argc, argv, "h", opts, &li)) != -1;) {
        int bad = 0;
        switch (c) {
        case 't': o->trace = optarg; break;
        case 'l': o->layer = optarg; break;
        case 'm': o->methods = optarg; break;
        case 'p':
            if (o->n_params >= 64) return kv_usage_error("run", "too many --param options (64 at most)");
            o->params[o->n_params++] = optarg;
            break;
        case 'k': bad = kv_parse_int(optarg, 1, 1 << 30, &o->k); break;
        case 'S': bad = kv_parse_int(optarg, 0, 1 << 30, &o->sink); break;
        case 'W': bad = kv_parse_int(optarg, 1, 1 << 30, &o->local); break;
        case 's': bad = kv_parse_int(optarg, 1, 1 << 30, &o->stride); break;
        case 'n': bad = kv_parse_int(optarg, 1, 1 << 30, &o->max_steps); break;
        case 'w': bad = kv_parse_int(optarg, 1, 1 << 30, &o->window); break;
        case 'e': bad = kv_parse_int(optarg, 0, 2147483647L, &o->seed); break;
        case 'd': bad = kv_parse_device(optarg, &o->device); break;
        case 'o': o->out = optarg; break;
        case 'f': o->force = 1; break;
        case 'q': o->quiet = 1; break;
        case 'h': fputs(run_help, stdout); return 0;
        default: return kv_usage_error("run", "unknown option");
        }
        if (bad)
            return kv_usage_error("run", "--%s: invalid value '%s'%s", opts[li].name, optarg,
                                  c == 'd' ? " (expected auto, cpu or gpu)" : c == 'W' ? " (expected an integer >= 1)"
                                                                                       : " (expected a non-negative integer)");
    }
    if (optind < argc) return kv_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!o->trace) return kv_usage_error("run", "--trace FILE is required");
    if (!o->methods) return kv_usage_error("run", "--method LIST is required (see kvbench list)");
    return -1; /* parsed: go on */
}


static void default_out(const kv_trace_info *in, const char *layer, char *out, size_t cap) {
    const char *base = strrchr(in->path, '/');
    base = base ? base + 1 : in->path;
    char stem[1024];
    snprintf(stem, sizeof stem, "%.255s", base); /* a file name: at most NAME_MAX (255) bytes */
    char *dot = strrchr(stem, '.');
    if (dot) *dot = 0;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, cap, "results/%s-%s-%s", stem, layer, ts);
}

/* Copies position t of [H][T][D] into [H][D]. */
static void gather_row(const float *x, int H, int T, int D, int t, float *out) {
    for (int h = 0; h < H; h++) memcpy(out + (size_t)h * D, x + ((size_t)h * T + t) * D, (size_t)D * sizeof(float));
}

/* Copies positions [0, n) of [H][T][D] into a tight [H][n][D]. */
static float *gather_prefix(const float *x, int H, int T, int D, int n) {
    float *out = kv_malloc((size_t)H * n * D * sizeof(float), "prefill copy");
    if (out)
        for (int h = 0; h < H; h++)
            memcpy(out + (size_t)h * n * D, x + (size_t)h * T * D, (size_t)n * D * sizeof(float));
    return out;
}

static kv_status build_all(const kv_layer *L, int P, int k, kv_method_run *runs, int n_runs, const kv_shape *sh) {
    kv_prefill pre = {.n = P};
    float *pk = gather_prefix(L->k, L->Hkv, L->T, L->D, P), *pq = gather_prefix(L->q, L->Hq, L->T, L->D, P);
    float *pv = L->v ? gather_prefix(L->v, L->Hkv, L->T, L->D, P) : NULL;
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
    int D = L->D, T = L->T, total = 0;
    for (int t = P; t < T; t += o->stride) total++;
    if (o->max_steps && total > o->max_steps) total = o->max_steps;
    float *q = kv_malloc((size_t)L->Hq * D * sizeof(float), "step queries");
    float *k = kv_malloc((size_t)L->Hkv * D * sizeof(float), "step keys");
    float *v = kv_malloc((size_t)L->Hkv * D * sizeof(float), "step values");
    kv_step_metric *rows = kv_malloc((size_t)L->Hq * sizeof *rows, "step metrics");
    for (int i = 0; i < n_runs; i++) runs[i].search_s = kv_malloc((size_t)(total + 1) * sizeof(double), "search times");
    kv_status st = (!q || !k || !v || !rows) ? KV_ERR_NOMEM : KV_OK;
    for (int i = 0; i < n_runs; i++) if (!runs[i].search_s) st = KV_ERR_NOMEM;
    double t_start = kv_now();
    int show = isatty(2), done = 0;
    for (int t = P; t < T && st == KV_OK && done < total; t++) {
        gather_row(L->k, L->Hkv, T, D, t, k);
        gather_row(L->q, L->Hq, T, D, t, q);
        if (L->v) gather_row(L->v, L->Hkv, T, D, t, v);
        for (int i = 0; i < n_runs && st == KV_OK; i++) {
            double a0 = kv_now();
            st = runs[i].m->append(runs[i].state, t, k, L->v ? v : NULL, q);
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
            st = r->m->search(r->state, t, q, o->k, &r->sel);
            r->search_s[r->n_steps++] = kv_now() - s0;
            if (st == KV_OK) st = kv_protocol_score(proto, orc, &ores, t, r->m, &r->sel, o->k, rows);
            if (st == KV_OK) st = kv_rows_push(r, rows, L->Hq);
        }
        meta->steps_evaluated++;
        if (show && (done % 16 == 0 || done == total)) progress(t_start, done, total, done == total && kv_now() - t_start > 2.0);
    }
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

    kv_run_meta meta = {.k = o.k, .sink = o.sink, .local = o.local, .stride = o.stride, .max_steps = o.max_steps,
                        .window = o.window, .seed = (uint64_t)o.seed};
    kv_command_line(argc + 1, argv - 1, meta.cmdline, sizeof meta.cmdline);
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in) return kv_report(KV_ERR_NOMEM);
    kv_status st = kv_trace_open(o.trace, in);
    if (st != KV_OK) { free(in); return kv_report(st); }
    int li = o.layer ? kv_trace_find_layer(in, o.layer) : 0;
    if (li < 0) {
        fprintf(stderr, "kvbench: %s: --layer %s: no such layer; the trace has:", in->path, o.layer);
        for (int i = 0; i < in->num_layers; i++) fprintf(stderr, " %s", in->layer_names[i]);
        fprintf(stderr, "\n");
        free(in);
        return 2;
    }
    meta.info = in;
    meta.layer = in->layer_names[li];
    char out[4096];
    if (o.out) snprintf(out, sizeof out, "%s", o.out);
    else default_out(in, meta.layer, out, sizeof out);
    struct stat sb;
    if (!o.force && stat(out, &sb) == 0) {
        fprintf(stderr, "kvbench: --out %s: already exists (use --force to replace it)\n", out);
        free(in);
        return 2;
    }
    if ((st = kv_resolve_device(o.device, &meta.gpu, &meta.use_gpu)) != KV_OK) { free(in); return kv_report(st); }
    time_t now = time(NULL);
    strftime(meta.started, sizeof meta.started, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
    char dev[600];
    if (meta.use_gpu) snprintf(dev, sizeof dev, "%s", meta.gpu.name);
    else snprintf(dev, sizeof dev, "cpu%s%s%s", meta.gpu.reason[0] ? " (no GPU: " : "", meta.gpu.reason,
                  meta.gpu.reason[0] ? ")" : "");
    fprintf(stderr, "kvbench %s (%s): trace %s layer %s: T=%d P=%d Hq=%d Hkv=%d D=%d; methods %s; k=%d S=%d W=%d; "
                    "seed %d; device %s\n",
            KVBENCH_VERSION, kv_git_sha(), in->path, meta.layer, in->num_tokens, in->prefill_len, in->num_q_heads,
            in->num_kv_heads, in->head_dim, o.methods, o.k, o.sink, o.local, o.seed, dev);

    double w0 = kv_now();
    kv_layer L;
    if ((st = kv_trace_load_layer(in, li, &L)) != KV_OK) { free(in); return kv_report(st); }
    kv_shape sh = {.num_q_heads = L.Hq, .num_kv_heads = L.Hkv, .head_dim = L.D, .group = L.Hq / L.Hkv,
                   .max_tokens = L.T, .prefill_len = in->prefill_len, .softmax_scale = in->softmax_scale,
                   .sink = o.sink, .local = o.local, .seed = (uint64_t)o.seed, .use_gpu = meta.use_gpu};
    kv_oracle *orc = NULL;
    kv_protocol *proto = NULL;
    st = build_all(&L, in->prefill_len, o.k, runs, n_runs, &sh);
    if (st == KV_OK)
        st = kv_oracle_create(&L, in->softmax_scale, o.sink, o.local, o.k, in->prefill_len, meta.use_gpu, &orc);
    if (st == KV_OK) st = kv_protocol_create(&L, o.sink, o.local, o.k, in->prefill_len, &proto);
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
    return rc;
}
