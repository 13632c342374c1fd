/* bench.c: `kvbench bench`: the per-step cost of each listed method's
 * stages at given context lengths, on synthetic data generated in memory
 * (issue 2, point 9; STYLE.md point 10). This file knows no method. On a
 * GPU it hands the device-resident keys and values to the method's
 * bench_gpu hook, which times each stage (CUDA events, warm-up, median and
 * p90, L2 flushed before every repetition: kv_bench_time) and states the
 * bytes each stage must move; the report adds GB/s and the percentage of
 * the device-to-device copy bandwidth measured in the same run. Without a
 * GPU it times the C reference through the vtable: build once, then
 * search of the last position, wall clock, at most 5 repetitions.
 *
 * Data: keys and values come from the synthetic generator (datasets/
 * synth.c) as independent segments of 65536 tokens generated in parallel
 * (a sequential 1M-token trace would take ~20 s to generate); positions
 * restart at 0 in each segment, which changes nothing a timing depends on.
 * K and V are float16 on the GPU, like a trace stored as float16. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../datasets/kv_cleanup.h"
#include "../datasets/kv_trace.h"
#include "../retrievers/kv_retriever.h"
#include "cli.h"
#include "results.h"

#define BENCH_SEG 65536
#define BENCH_CHUNK 2048
#define BENCH_MAX_LENGTHS 32

static const char bench_help[] =
    "usage: kvbench bench --method LIST --tokens 16384,131072,1048576 [options]\n"
    "  --method LIST     methods to time, comma-separated (every method on the CPU; on a GPU, the methods\n"
    "                    with CUDA kernels)\n"
    "  --param [M.]N=V   set a method parameter, as in kvbench run; repeatable\n"
    "  --tokens LIST     context lengths, comma-separated (default on a GPU 16384,131072,1048576; on the CPU\n"
    "                    16384,65536: about 1 GB of RAM with the default shape, where 1048576 needs 13 GB)\n"
    "  --q-heads N       query heads (default 16)\n"
    "  --kv-heads N      kv heads (default 8)\n"
    "  --dim D           head dimension (default 128)\n"
    "  --k K             top-k budget (default 100)\n"
    "  --reps N          timed repetitions per stage (default 50; CPU: at most 5)\n"
    "  --warmup N        untimed repetitions before them (default 10; CPU: 1)\n"
    "  --seed S          seed of the synthetic data (default 0)\n"
    "  --device D        auto|cpu|gpu (default auto: the GPU when one is usable)\n"
    "  --threads N       CPU threads (OpenMP; default: one per core); printed with the load average, with a\n"
    "                    warning when the load is above the core count (CPU timings are then inflated)\n"
    "  --csv FILE        also write the rows as CSV (with the CPU threads and the 1-minute load at start; an\n"
    "                    existing FILE is replaced only with --force)\n"
    "  --force           replace an existing --csv FILE\n"
    "Prints one row per (length, stage): median and p90 microseconds per decode step per layer (all heads),\n"
    "the bytes the stage must move, the achieved GB/s and, on a GPU, the percentage of the copy bandwidth.\n";

typedef struct {
    const char *methods, *csv;
    const char *params[64];
    int n_params;
    int tokens[BENCH_MAX_LENGTHS], n_tokens;
    int Hq, Hkv, D, k, reps, warmup, seed, force, threads;
    kv_device_choice device;
} bench_opts;

static int parse_bench(int argc, char **argv, bench_opts *o) {
    static const struct option opts[] = {
        {"method", 1, 0, 'm'}, {"param", 1, 0, 'p'}, {"tokens", 1, 0, 't'}, {"q-heads", 1, 0, 'q'}, {"kv-heads", 1, 0, 'K'},
        {"dim", 1, 0, 'd'}, {"k", 1, 0, 'k'}, {"reps", 1, 0, 'r'}, {"warmup", 1, 0, 'w'}, {"seed", 1, 0, 's'},
        {"device", 1, 0, 'D'}, {"threads", 1, 0, 'j'}, {"csv", 1, 0, 'c'}, {"force", 0, 0, 'f'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (bench_opts){.Hq = 16, .Hkv = 8, .D = 128, .k = 100, .reps = 50, .warmup = 10};
    o->n_tokens = 0; /* the default depends on the device: cmd_bench */
    optind = 1;
    opterr = 0;
    /* lengths <= 2^30 keep T + BENCH_SEG and every position within int; sizes are size_t */
    for (int c; (c = getopt_long(argc, argv, KV_OPTSTRING, opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'm': o->methods = optarg; break;
        case 'p':
            if (o->n_params >= 64) return kv_usage_error("bench", "too many --param options (64 at most)");
            o->params[o->n_params++] = optarg;
            break;
        case 't':
            o->n_tokens = kv_opt_int_list("bench", "tokens", optarg, 2, 1L << 30, o->tokens, BENCH_MAX_LENGTHS);
            if (o->n_tokens < 0) return 2;
            break;
        case 'q': bad = kv_opt_int("bench", "q-heads", optarg, 1, 4096, &o->Hq); break;
        case 'K': bad = kv_opt_int("bench", "kv-heads", optarg, 1, 4096, &o->Hkv); break;
        case 'd': bad = kv_opt_int("bench", "dim", optarg, 2, 1024, &o->D); break;
        case 'k': bad = kv_opt_int("bench", "k", optarg, 1, 1L << 30, &o->k); break;
        case 'r': bad = kv_opt_int("bench", "reps", optarg, 1, 100000, &o->reps); break;
        case 'w': bad = kv_opt_int("bench", "warmup", optarg, 0, 100000, &o->warmup); break;
        case 's': bad = kv_opt_int("bench", "seed", optarg, 0, 2147483647L, &o->seed); break;
        case 'D':
            if (kv_parse_device(optarg, &o->device))
                return kv_usage_error("bench", "--device: expected auto, cpu or gpu, found '%s'", optarg);
            break;
        case 'j': bad = kv_opt_int("bench", "threads", optarg, 1, 4096, &o->threads); break;
        case 'c': o->csv = optarg; break;
        case 'f': o->force = 1; break;
        case 'h': fputs(bench_help, stdout); return 0;
        default: return kv_opt_error("bench", c, argv, opts);
        }
        if (bad) return bad;
    }
    if (optind < argc) return kv_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (!o->methods) return kv_usage_error("bench", "--method is required (kvbench list shows the methods)");
    if (o->Hq % o->Hkv) return kv_usage_error("bench", "--q-heads %d is not a multiple of --kv-heads %d", o->Hq, o->Hkv);
    if (o->D % 2) return kv_usage_error("bench", "--dim must be even (the generator applies RoPE), found %d", o->D);
    return -1;
}

/* ---- synthetic data ---- */
typedef struct {
    const bench_opts *o;
    int T;
    kv_gpu_keys *K, *V; /* GPU: float16 stores */
    float *hk, *hv;     /* CPU: [Hkv][T][D] */
    void *stream;       /* GPU: the one stream every length and method is timed on (kv_gpu_bench_stream_create) */
} bench_data;

/* Generates segment `seg` (tokens [seg*SEG, ...)) chunk by chunk into the stores. */
static kv_status gen_segment(bench_data *bd, int seg, float *k, float *v, uint16_t *k16, uint16_t *v16) {
    const bench_opts *o = bd->o;
    int t0 = seg * BENCH_SEG, len = bd->T - t0 < BENCH_SEG ? bd->T - t0 : BENCH_SEG, D = o->D, H = o->Hkv;
    kv_synth_spec sp = {.tokens = len, .prefill = len, .q_heads = o->Hq, .kv_heads = H, .dim = D, .layers = 1,
                        .seed = (uint64_t)o->seed, .half = 1, .with_v = 1};
    kv_synth *s;
    KV_TRY(kv_synth_create(&sp, seg, &s));
    kv_status st = KV_OK;
    for (int c0 = 0; c0 < len && st == KV_OK; c0 += BENCH_CHUNK) {
        int c = len - c0 < BENCH_CHUNK ? len - c0 : BENCH_CHUNK;
        kv_synth_rows(s, c0, c, NULL, k, v);
        size_t n = (size_t)H * c * D;
        if (bd->K) {
            for (size_t i = 0; i < n; i++) { k16[i] = kv_float_to_half(k[i]); v16[i] = kv_float_to_half(v[i]); }
#pragma omp critical(bench_upload)
            {
                st = kv_gpu_keys_write_half(bd->K, t0 + c0, c, k16);
                if (st == KV_OK) st = kv_gpu_keys_write_half(bd->V, t0 + c0, c, v16);
            }
        } else {
            for (int h = 0; h < H; h++) {
                memcpy(bd->hk + ((size_t)h * bd->T + t0 + c0) * D, k + (size_t)h * c * D, (size_t)c * D * 4);
                memcpy(bd->hv + ((size_t)h * bd->T + t0 + c0) * D, v + (size_t)h * c * D, (size_t)c * D * 4);
            }
        }
    }
    kv_synth_destroy(s);
    return st;
}

static kv_status gen_data(bench_data *bd) {
    const bench_opts *o = bd->o;
    int nseg = (bd->T + BENCH_SEG - 1) / BENCH_SEG;
    size_t n = (size_t)o->Hkv * BENCH_CHUNK * o->D;
    kv_status st = KV_OK;
#pragma omp parallel
    {
        float *k = kv_malloc(n * sizeof(float), "bench key chunk"), *v = kv_malloc(n * sizeof(float), "bench value chunk");
        uint16_t *k16 = kv_malloc(n * 2, "bench key chunk"), *v16 = kv_malloc(n * 2, "bench value chunk");
        kv_status my = (!k || !v || !k16 || !v16) ? KV_ERR_NOMEM : KV_OK;
#pragma omp for schedule(dynamic, 1)
        for (int seg = 0; seg < nseg; seg++)
            if (my == KV_OK) my = gen_segment(bd, seg, k, v, k16, v16);
#pragma omp critical(bench_status)
        if (my != KV_OK && st == KV_OK) st = my;
        free(k); free(v); free(k16); free(v16);
    }
    return st;
}

/* One query per head: the last position of a short synthetic sequence. */
static kv_status gen_query(const bench_opts *o, float *q) {
    int n = 64, D = o->D;
    kv_synth_spec sp = {.tokens = n, .prefill = n, .q_heads = o->Hq, .kv_heads = o->Hkv, .dim = D, .layers = 1,
                        .seed = (uint64_t)o->seed + 7777, .half = 1};
    kv_synth *s;
    KV_TRY(kv_synth_create(&sp, 0, &s));
    float *qa = kv_malloc((size_t)o->Hq * n * D * sizeof(float), "bench queries");
    float *ka = kv_malloc((size_t)o->Hkv * n * D * sizeof(float), "bench query keys");
    kv_status st = (!qa || !ka) ? KV_ERR_NOMEM : KV_OK;
    if (st == KV_OK) {
        kv_synth_rows(s, 0, n, qa, ka, NULL);
        for (int h = 0; h < o->Hq; h++) memcpy(q + (size_t)h * D, qa + ((size_t)h * n + n - 1) * D, (size_t)D * 4);
    }
    free(qa); free(ka);
    kv_synth_destroy(s);
    return st;
}

static kv_shape bench_shape(const bench_opts *o, int T, int use_gpu) {
    return (kv_shape){.num_q_heads = o->Hq, .num_kv_heads = o->Hkv, .head_dim = o->D, .group = o->Hq / o->Hkv,
                      .max_tokens = T, .prefill_len = T, .softmax_scale = 1.0f / sqrtf((float)o->D),
                      .seed = (uint64_t)o->seed, .use_gpu = use_gpu};
}

/* Any method on the CPU, through its vtable: build from the first T-1
 * keys (timed once), append the last position, then time search(T-1) as
 * the protocol calls it (retrievable region [0, T)). Bytes: the index
 * (memory_bytes), which a search reads at most. */
static kv_status bench_cpu_method(const bench_opts *o, const bench_data *bd, const float *q, kv_method_run *r,
                                  kv_gpu_stages *out) {
    int T = bd->T, D = o->D, H = o->Hkv, reps = o->reps < 5 ? o->reps : 5;
    kv_shape sh = bench_shape(o, T, 0);
    sh.prefill_len = T - 1;
    float *kl = kv_malloc((size_t)H * D * sizeof(float), "bench last key"), *vl = kv_malloc((size_t)H * D * 4, "bench last value");
    float *pk = kv_malloc((size_t)H * (T - 1) * D * sizeof(float), "bench prefill keys");
    float ts[8];
    kv_status st = (!kl || !vl || !pk) ? KV_ERR_NOMEM : KV_OK;
    void *state = NULL;
    kv_selection sel = {0};
    if (st == KV_OK) {
        for (int h = 0; h < H; h++) {
            memcpy(pk + (size_t)h * (T - 1) * D, bd->hk + (size_t)h * T * D, (size_t)(T - 1) * D * 4);
            memcpy(kl + (size_t)h * D, bd->hk + ((size_t)h * T + T - 1) * D, (size_t)D * 4);
            memcpy(vl + (size_t)h * D, bd->hv + ((size_t)h * T + T - 1) * D, (size_t)D * 4);
        }
        st = r->m->create(&sh, &r->ps, &state);
    }
    double t0 = kv_now();
    if (st == KV_OK) st = r->m->build(state, &(kv_prefill){.n = T - 1, .k = pk});
    double build_us = 1e6 * (kv_now() - t0);
    if (st == KV_OK) st = r->m->append(state, T - 1, kl, vl, q);
    int lists = r->m->per_kv_head ? H : o->Hq, cap = r->m->variable_budget ? T : o->k;
    if (st == KV_OK) st = kv_selection_alloc(&sel, lists, H, cap, T, T);
    for (int i = 0; i < 1 + reps && st == KV_OK; i++) { /* the first run is the warm-up */
        kv_selection_reset(&sel);
        t0 = kv_now();
        st = r->m->search(state, T - 1, q, o->k, &sel);
        if (i) ts[i - 1] = (float)(1e6 * (kv_now() - t0));
    }
    if (st == KV_OK) {
        double idx = (double)r->m->memory_bytes(state);
        out->n = 2;
        out->stage[0] = (kv_gpu_stage){"build", {build_us, build_us}, idx};
        out->stage[1] = (kv_gpu_stage){"search", {kv_percentile_inplace(ts, (size_t)reps, 0.5),
                                                  kv_percentile_inplace(ts, (size_t)reps, 0.9)}, idx};
        snprintf(out->bytes_note, sizeof out->bytes_note, "build and search = the index (memory_bytes, %.0f B "
                 "per token and kv head); build is one run", idx / ((double)T * H));
    }
    if (state) r->m->destroy(state);
    kv_selection_free(&sel);
    free(kl); free(vl); free(pk);
    return st;
}

static kv_status bench_method(const bench_opts *o, const bench_data *bd, const float *q, int use_gpu,
                              kv_method_run *r, kv_gpu_stages *out) {
    memset(out, 0, sizeof *out);
    if (!use_gpu) return bench_cpu_method(o, bd, q, r, out);
    if (!r->m->bench_gpu)
        return kv_fail(KV_ERR_INPUT, "bench --method %s: this method has no GPU bench (its CUDA path is missing); "
                                     "--device cpu times its C reference", r->m->name);
    kv_gpu_bench_spec spec = {.Hq = o->Hq, .Hkv = o->Hkv, .n = bd->T, .D = o->D, .k = o->k, .reps = o->reps,
                              .warmup = o->warmup, .scale = 1.0f / sqrtf((float)o->D), .stream = bd->stream};
    kv_shape sh = bench_shape(o, bd->T, 1);
    return r->m->bench_gpu(&sh, &r->ps, &spec, bd->K, bd->V, q, out);
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_bench(argc, argv, &o);
    if (rc >= 0) return rc;
    kv_method_run runs[16];
    int n_runs = 0;
    if ((rc = kv_pick_methods("bench", o.methods, o.params, o.n_params, runs, 16, &n_runs)) >= 0) return rc;
    kv_cleanup_install();
    kv_gpu_info gi;
    int use_gpu;
    kv_status st = o.csv ? kv_check_out_file("--csv", o.csv, o.force, NULL) : KV_OK; /* before any work */
    if (st == KV_OK) st = kv_resolve_device(o.device, &gi, &use_gpu);
    if (st != KV_OK) return kv_report(st);
    for (int i = 0; i < n_runs && use_gpu; i++)
        if (!runs[i].m->bench_gpu)
            return kv_usage_error("bench", "--method %s has no GPU bench (no CUDA kernels); --device cpu times its "
                                           "C reference", runs[i].m->name);
    if (o.n_tokens == 0) { /* a laptop survives the CPU default: ~1 GB at 65536 tokens with 8 kv heads of 128 */
        static const int gpu_lengths[] = {16384, 131072, 1048576}, cpu_lengths[] = {16384, 65536};
        o.n_tokens = use_gpu ? 3 : 2;
        memcpy(o.tokens, use_gpu ? gpu_lengths : cpu_lengths, (size_t)o.n_tokens * sizeof(int));
    }
    kv_host_info host;
    kv_host_setup("bench", o.threads, &host);
    int threads = host.threads;
    double copy = 0;
    if (use_gpu) {
        if ((st = kv_gpu_copy_bandwidth((size_t)1 << 30, 20, &copy)) != KV_OK) return kv_report(st);
        fprintf(stderr, "kvbench %s (%s): bench %s, Hq=%d Hkv=%d D=%d k=%d, float16 K and V; device %s (driver %d, "
                        "runtime %d, %d SMs); %d reps after %d warm-up\n",
                KVBENCH_VERSION, kv_git_sha(), o.methods, o.Hq, o.Hkv, o.D, o.k, gi.name, gi.driver_version,
                gi.runtime_version, gi.sm_count, o.reps, o.warmup);
    } else {
        fprintf(stderr, "kvbench %s (%s): bench %s, Hq=%d Hkv=%d D=%d k=%d on the CPU (%s): the C reference, %d "
                        "OpenMP threads (OMP_WAIT_POLICY %s; load %.2f on %d cores), wall clock, at most 5 reps "
                        "after 1 warm-up\n",
                KVBENCH_VERSION, kv_git_sha(), o.methods, o.Hq, o.Hkv, o.D, o.k,
                gi.reason[0] ? gi.reason : "--device cpu", threads, host.wait_policy, host.load[0], host.cores);
    }
    /* the CSV goes to FILE.tmp.<pid> (removed on failure or a signal) and is renamed over FILE when complete */
    FILE *csv = NULL;
    char *csv_tmp = o.csv ? kv_strfmt("%s.tmp.%d", o.csv, (int)getpid()) : NULL;
    int csv_id = csv_tmp ? kv_cleanup_add(KV_CLEAN_FILE, csv_tmp, NULL) : -1;
    if (o.csv && (!csv_tmp || csv_id < 0)) { free(csv_tmp); return kv_report(csv_tmp ? KV_ERR_INPUT : KV_ERR_NOMEM); }
    if (o.csv && !(csv = fopen(csv_tmp, "wx"))) {
        st = kv_fail(KV_ERR_IO, "--csv %s: cannot create %s: %s", o.csv, csv_tmp, strerror(errno));
        kv_cleanup_remove(csv_id);
        free(csv_tmp);
        return kv_report(st);
    }
    if (csv)
        fprintf(csv, "method,device,tokens,q_heads,kv_heads,dim,k,stage,median_us,p90_us,bytes,gbps,pct_copy,"
                     "copy_gbps,fits_l2,reps,params,cpu_threads,load1\n");
    printf("%s bench on %s%s\n", o.methods, use_gpu ? gi.name : "the CPU (C reference, wall clock)",
           use_gpu ? "" : ": no GPU timings");
    if (use_gpu) printf("copy bandwidth (cudaMemcpy device-to-device, read + write): %.0f GB/s\n", copy);
    printf("%-10s %9s  %-11s %11s %11s %10s %8s %7s  %s\n", "method", "tokens", "stage", "median_us", "p90_us", "MB",
           "GB/s", use_gpu ? "%copy" : "", "note");
    size_t l2 = 0, flush = 0;
    char notes[16][sizeof ((kv_gpu_stages *)0)->bytes_note] = {{0}}; /* one per method (at most 16), as long as the hook's */
    void *stream = NULL; /* one for the process, as a decode loop has: see kv_gpu_bench_stream_create */
    if (use_gpu) st = kv_gpu_bench_stream_create(&stream);
    for (int li = 0; li < o.n_tokens && st == KV_OK; li++) {
        bench_opts ol = o; /* this length's options: k clamped to the retrievable region [0, T) */
        if (ol.k > o.tokens[li]) {
            ol.k = o.tokens[li];
            fprintf(stderr, "kvbench: warning: --k %d is larger than --tokens %d: the search retrieves every position; "
                            "the effective budget at this length is %d\n", o.k, o.tokens[li], ol.k);
        }
        bench_data bd = {.o = &ol, .T = o.tokens[li], .stream = stream};
        float *q = kv_malloc((size_t)o.Hq * o.D * sizeof(float), "bench queries");
        double g0 = kv_now();
        st = q ? gen_query(&o, q) : KV_ERR_NOMEM;
        if (st == KV_OK && use_gpu) {
            st = kv_gpu_keys_create(o.Hkv, bd.T, o.D, 1, &bd.K);
            if (st == KV_OK) st = kv_gpu_keys_create(o.Hkv, bd.T, o.D, 1, &bd.V);
        } else if (st == KV_OK) {
            bd.hk = kv_malloc((size_t)o.Hkv * bd.T * o.D * sizeof(float), "bench keys");
            bd.hv = kv_malloc((size_t)o.Hkv * bd.T * o.D * sizeof(float), "bench values");
            if (!bd.hk || !bd.hv) st = KV_ERR_NOMEM;
        }
        if (st == KV_OK) st = gen_data(&bd);
        fprintf(stderr, "bench: %d tokens generated in %.1f s\n", bd.T, kv_now() - g0);
        for (int mi = 0; mi < n_runs && st == KV_OK; mi++) {
            kv_gpu_stages sg;
            st = bench_method(&ol, &bd, q, use_gpu, &runs[mi], &sg);
            if (st != KV_OK) break;
            snprintf(notes[mi], sizeof notes[mi], "%s", sg.bytes_note);
            if (sg.l2_bytes) { l2 = sg.l2_bytes; flush = sg.flush_bytes; }
            for (int w = 0; w < sg.n; w++) {
                const kv_gpu_stage *g = &sg.stage[w];
                double gbs = g->bytes / (g->t.med_us * 1e-6) / 1e9;
                if (use_gpu)
                    printf("%-10s %9d  %-11s %11.1f %11.1f %10.1f %8.0f %6.1f%%\n", runs[mi].m->name, bd.T, g->name,
                           g->t.med_us, g->t.p90_us, g->bytes / 1e6, gbs, 100 * gbs / copy);
                else
                    printf("%-10s %9d  %-11s %11.1f %11.1f %10.1f %8.1f\n", runs[mi].m->name, bd.T, g->name,
                           g->t.med_us, g->t.p90_us, g->bytes / 1e6, gbs);
                if (csv)
                    fprintf(csv, "%s,%s,%d,%d,%d,%d,%d,%s,%.3f,%.3f,%.0f,%.2f,%.2f,%.1f,%d,%d,\"%s\",%d,%.2f\n",
                            runs[mi].m->name, use_gpu ? "gpu" : "cpu", bd.T, o.Hq, o.Hkv, o.D, ol.k, g->name,
                            g->t.med_us, g->t.p90_us, g->bytes, gbs, use_gpu ? 100 * gbs / copy : 0.0, copy,
                            use_gpu && (double)o.Hkv * bd.T * o.D * 2 <= (double)l2,
                            use_gpu ? o.reps : (o.reps < 5 ? o.reps : 5), runs[mi].params, threads, host.load[0]);
            }
            fflush(stdout);
        }
        kv_gpu_keys_destroy(bd.K);
        kv_gpu_keys_destroy(bd.V);
        free(bd.hk); free(bd.hv); free(q);
    }
    kv_gpu_bench_stream_destroy(stream);
    for (int mi = 0; mi < n_runs && st == KV_OK; mi++)
        printf("bytes, %s: %s\n", runs[mi].m->name, notes[mi]);
    if (st == KV_OK && use_gpu)
        printf("L2 is %.0f MB; every timed repetition follows a read of a %.0f MB buffer, so each stage reads its "
               "inputs from HBM, as in decode where the other layers evict them\n", l2 / 1e6, flush / 1e6);
    if (csv) {
        int bad = ferror(csv);
        if ((fclose(csv) != 0 || bad) && st == KV_OK) st = kv_fail(KV_ERR_IO, "--csv %s: write failed", o.csv);
        if (st == KV_OK && rename(csv_tmp, o.csv) != 0)
            st = kv_fail(KV_ERR_IO, "--csv %s: cannot rename %s into place: %s", o.csv, csv_tmp, strerror(errno));
        if (st != KV_OK) unlink(csv_tmp);
        kv_cleanup_remove(csv_id);
        free(csv_tmp);
    }
    return st == KV_OK ? 0 : kv_report(st);
}
