/* profile.c: `kvbench info --profile`: the oracle budget profile of a trace
 * (issue 11), independent of any method: per evaluated step and query head
 * the smallest number of retrievable-region tokens whose attention mass,
 * with sink and local, reaches p (p = 0.5, 0.8, 0.9, 0.95, 0.99: the
 * "top-p" budget adaptive methods such as Twilight aim for), printed per
 * layer overall and per drift window. The same oracle and the same
 * aggregation as `kvbench run` (which writes it to profile.csv), so both
 * print the same numbers for the same protocol options. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "oracle.h"
#include "results.h"

static const char profile_help[] =
    "usage: kvbench info --profile TRACE [--layer L14|L3,L14|all] [--sink 4] [--local 64] [--stride 1]\n"
    "                    [--max-steps N] [--window 128] [--device auto|cpu|gpu]\n"
    "Prints the oracle budget profile: per layer, the region tokens each query head needs (with sink and\n"
    "local) for attention mass p = 0.5 .. 0.99, mean (median) over steps and heads, overall and per window.\n";

static kv_status profile_layer(kv_trace_info *in, int li, int sink, int local, int stride, int max_steps, int window,
                               int use_gpu) {
    kv_layer L;
    KV_TRY(kv_trace_load_layer(in, li, &L));
    kv_oracle *o = NULL;
    int one = 1, P = in->prefill_len;
    kv_profile_rows pr = {.Hq = L.Hq};
    float *q = kv_malloc((size_t)L.Hq * L.D * sizeof(float), "step queries");
    kv_status st = q ? kv_oracle_create_ks(&L, in->softmax_scale, sink, local, &one, 1, P, use_gpu, 1, &o) : KV_ERR_NOMEM;
    if (st == KV_OK) kv_oracle_set_context(o, in->path, in->layer_names[li]);
    int done = 0;
    for (int t = P; t < L.T && st == KV_OK && (!max_steps || done < max_steps); t += stride) {
        done++;
        if (t + 1 - local - sink <= 0) continue;
        for (int h = 0; h < L.Hq; h++) memcpy(q + (size_t)h * L.D, L.q + ((size_t)h * L.T + t) * L.D, (size_t)L.D * sizeof(float));
        kv_oracle_out res;
        st = kv_oracle_step(o, t, q, &res);
        if (st == KV_OK) st = kv_profile_push(&pr, t, res.budget);
    }
    if (st == KV_OK) kv_profile_print(stdout, in->layer_names[li], &pr, P, window, sink, local);
    kv_profile_free(&pr);
    kv_oracle_destroy(o);
    free(q);
    kv_layer_free(&L);
    return st;
}

int kv_info_profile(int argc, char **argv) {
    static const struct option opts[] = {
        {"profile", 0, 0, 'p'}, {"layer", 1, 0, 'l'}, {"sink", 1, 0, 'S'}, {"local", 1, 0, 'W'}, {"stride", 1, 0, 's'},
        {"max-steps", 1, 0, 'n'}, {"window", 1, 0, 'w'}, {"device", 1, 0, 'd'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *layer = NULL;
    int sink = 4, local = 64, stride = 1, max_steps = 0, window = 128;
    const long big = 1L << 30;
    kv_device_choice dev = KV_DEVICE_AUTO;
    optind = 1;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, KV_OPTSTRING, opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'p': break;
        case 'l': layer = optarg; break;
        case 'S': bad = kv_opt_int("info", "sink", optarg, 0, big, &sink); break;
        case 'W': bad = kv_opt_int("info", "local", optarg, 1, big, &local); break;
        case 's': bad = kv_opt_int("info", "stride", optarg, 1, big, &stride); break;
        case 'n': bad = kv_opt_int("info", "max-steps", optarg, 1, big, &max_steps); break;
        case 'w': bad = kv_opt_int("info", "window", optarg, 1, big, &window); break;
        case 'd':
            if (kv_parse_device(optarg, &dev)) return kv_usage_error("info", "--device: expected auto, cpu or gpu, found '%s'", optarg);
            break;
        case 'h': fputs(profile_help, stdout); return 0;
        default: return kv_opt_error("info", c, argv, opts);
        }
        if (bad) return bad;
    }
    if (optind != argc - 1) return kv_usage_error("info", "--profile: expected exactly one trace file, found %d", argc - optind);
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in) return kv_report(KV_ERR_NOMEM);
    kv_status st = kv_trace_open(argv[optind], in);
    if (st != KV_OK) { free(in); return kv_report(st); }
    int *idx = kv_malloc((size_t)(in->num_layers + 1) * sizeof(int), "layers"), n = 0;
    if (!idx) { free(in); return kv_report(KV_ERR_NOMEM); }
    if (!layer) idx[n++] = 0;
    else if (!strcmp(layer, "all")) for (; n < in->num_layers; n++) idx[n] = n;
    else {
        char *copy = kv_strfmt("%s", layer), *save = NULL;
        for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok; tok = strtok_r(NULL, ",", &save)) {
            int li = kv_trace_find_layer(in, tok);
            if (li < 0 || n >= in->num_layers) {
                fprintf(stderr, "kvbench: %s: --layer %s: no such layer; the trace has:", in->path, tok);
                for (int i = 0; i < in->num_layers; i++) fprintf(stderr, " %s", in->layer_names[i]);
                fprintf(stderr, " (or --layer all)\n");
                free(copy); free(idx); free(in);
                return 2;
            }
            idx[n++] = li;
        }
        free(copy);
    }
    if ((long long)in->num_tokens - sink - local < 1)
        st = kv_fail(KV_ERR_INPUT, "%s: --sink %d + --local %d leave no retrievable region in the trace's %d tokens",
                     in->path, sink, local, in->num_tokens);
    kv_gpu_info gi;
    int use_gpu = 0;
    if (st == KV_OK) st = kv_resolve_device(dev, &gi, &use_gpu);
    for (int i = 0; i < n && st == KV_OK; i++) {
        if (i) putchar('\n');
        st = profile_layer(in, idx[i], sink, local, stride, max_steps, window, use_gpu);
    }
    free(idx);
    free(in);
    return st == KV_OK ? 0 : kv_report(st);
}
