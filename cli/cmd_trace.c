/* cmd_trace.c: the trace subcommands: info (what a trace holds), synth
 * (seeded synthetic trace) and slice (a smaller valid trace: fewer tokens,
 * chosen layers, optionally a shorter prefill), all through datasets/. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/kv_trace.h"
#include "cli.h"

static const char info_help[] =
    "usage: kvbench info TRACE\n"
    "Prints the trace's model, description, T, P, heads, D, layers with their dtypes, and file size.\n";

int cmd_info(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { fputs(info_help, stdout); return 0; }
    if (argc != 2) return kv_usage_error("info", "expected exactly one trace file");
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in) return kv_report(KV_ERR_NOMEM);
    kv_status st = kv_trace_open(argv[1], in);
    if (st != KV_OK) { free(in); return kv_report(st); }
    printf("file          %s (%.2f MB)\n", in->path, in->file_bytes / 1e6);
    printf("model         %s\n", in->model);
    printf("description   %s\n", in->description);
    printf("tokens (T)    %d\n", in->num_tokens);
    printf("prefill (P)   %d   (decode steps: %d)\n", in->prefill_len, in->num_tokens - in->prefill_len);
    printf("heads         %d query, %d kv (group %d)\n", in->num_q_heads, in->num_kv_heads,
           in->num_q_heads / in->num_kv_heads);
    printf("head_dim (D)  %d\n", in->head_dim);
    printf("rope          %s\n", in->rope);
    printf("softmax_scale %g\n", in->softmax_scale);
    printf("tokens ids    %s\n", in->has_tokens ? "yes" : "no");
    printf("layers        %d:", in->num_layers);
    for (int i = 0; i < in->num_layers; i++)
    {
        const kv_dtype *t = in->layer_dtype[i];
        if (t[0] == t[1] && (!in->layer_has_v[i] || t[2] == t[1]))
            printf(" %s(%s%s)", in->layer_names[i], kv_dtype_name(t[1]), in->layer_has_v[i] ? "" : ", no v");
        else if (in->layer_has_v[i])
            printf(" %s(q %s, k %s, v %s)", in->layer_names[i], kv_dtype_name(t[0]), kv_dtype_name(t[1]), kv_dtype_name(t[2]));
        else printf(" %s(q %s, k %s, no v)", in->layer_names[i], kv_dtype_name(t[0]), kv_dtype_name(t[1]));
    }
    printf("\n");
    free(in);
    return 0;
}

static const char synth_help[] =
    "usage: kvbench synth --out FILE [--tokens T] [--prefill P] [--q-heads 16] [--kv-heads 8] [--dim 128]\n"
    "                     [--layers 1] [--seed S] [--dtype float16|float32] [--no-values]\n"
    "Writes a seeded synthetic kvtrace (sinks, RoPE, locality, clustered keys, heavy hitters, and a decode-time\n"
    "shift of keys and queries). Streams to disk: T up to millions in bounded memory. For tests and scale\n"
    "benchmarks only: report results on real traces.\n";

int cmd_synth(int argc, char **argv) {
    kv_synth_spec sp = {.tokens = 4096, .prefill = 3072, .q_heads = 16, .kv_heads = 8, .dim = 128, .layers = 1,
                        .seed = 0, .half = 1, .with_v = 1};
    const char *out = NULL;
    int prefill_set = 0;
    static const struct option opts[] = {
        {"out", 1, 0, 'o'}, {"tokens", 1, 0, 't'}, {"prefill", 1, 0, 'p'}, {"q-heads", 1, 0, 'q'},
        {"kv-heads", 1, 0, 'k'}, {"dim", 1, 0, 'd'}, {"layers", 1, 0, 'l'}, {"seed", 1, 0, 's'},
        {"dtype", 1, 0, 'y'}, {"no-values", 0, 0, 'n'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    int li = 0;
    for (int c; (c = getopt_long(argc, argv, "h", opts, &li)) != -1;) {
        int bad = 0, seed;
        switch (c) {
        case 'o': out = optarg; break;
        case 't': bad = kv_parse_int(optarg, 2, 1 << 30, &sp.tokens); break;
        case 'p': bad = kv_parse_int(optarg, 1, 1 << 30, &sp.prefill); prefill_set = 1; break;
        case 'q': bad = kv_parse_int(optarg, 1, 1024, &sp.q_heads); break;
        case 'k': bad = kv_parse_int(optarg, 1, 1024, &sp.kv_heads); break;
        case 'd': bad = kv_parse_int(optarg, 2, 1024, &sp.dim); break;
        case 'l': bad = kv_parse_int(optarg, 1, KV_MAX_LAYERS, &sp.layers); break;
        case 's': bad = kv_parse_int(optarg, 0, 2147483647L, &seed); sp.seed = (uint64_t)seed; break;
        case 'y':
            if (!strcmp(optarg, "float16")) sp.half = 1;
            else if (!strcmp(optarg, "float32")) sp.half = 0;
            else bad = 1;
            break;
        case 'n': sp.with_v = 0; break;
        case 'h': fputs(synth_help, stdout); return 0;
        default: return kv_usage_error("synth", "unknown option");
        }
        if (bad) return kv_usage_error("synth", "--%s: invalid value '%s'", opts[li].name, optarg);
    }
    if (optind < argc) return kv_usage_error("synth", "unexpected argument '%s'", argv[optind]);
    if (!out) return kv_usage_error("synth", "--out FILE is required");
    if (!prefill_set) sp.prefill = sp.tokens * 3 / 4;
    if (sp.prefill > sp.tokens) return kv_usage_error("synth", "--prefill %d exceeds --tokens %d", sp.prefill, sp.tokens);
    if (sp.q_heads % sp.kv_heads) return kv_usage_error("synth", "--q-heads %d is not a multiple of --kv-heads %d", sp.q_heads, sp.kv_heads);
    if (sp.dim % 2) return kv_usage_error("synth", "--dim must be even (RoPE rotates pairs), found %d", sp.dim);
    kv_status st = kv_synth_write(out, &sp);
    if (st != KV_OK) return kv_report(st);
    fprintf(stderr, "synth: wrote %s (T=%d, P=%d, %d/%d heads, D=%d, %d layer(s), seed %llu)\n", out, sp.tokens,
            sp.prefill, sp.q_heads, sp.kv_heads, sp.dim, sp.layers, (unsigned long long)sp.seed);
    return 0;
}

static const char slice_help[] =
    "usage: kvbench slice --in A --out B [--tokens N] [--layers L14,L20] [--prefill P] [--dtype float16|float32]\n"
    "Writes a smaller valid kvtrace: the first N positions (default all) of the chosen layers (default all).\n"
    "--prefill defaults to min(P, N-1) of the source (at least 1), so the slice keeps decode steps.\n";

int cmd_slice(int argc, char **argv) {
    const char *in_path = NULL, *out = NULL, *layers = NULL;
    int tokens = 0, prefill = 0, dtype = -1;
    static const struct option opts[] = {{"in", 1, 0, 'i'}, {"out", 1, 0, 'o'}, {"tokens", 1, 0, 't'},
                                         {"layers", 1, 0, 'l'}, {"prefill", 1, 0, 'p'}, {"dtype", 1, 0, 'y'},
                                         {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        switch (c) {
        case 'i': in_path = optarg; break;
        case 'o': out = optarg; break;
        case 'l': layers = optarg; break;
        case 't': if (kv_parse_int(optarg, 1, 1 << 30, &tokens)) return kv_usage_error("slice", "--tokens: expected a positive integer, found '%s'", optarg); break;
        case 'p': if (kv_parse_int(optarg, 1, 1 << 30, &prefill)) return kv_usage_error("slice", "--prefill: expected a positive integer, found '%s'", optarg); break;
        case 'y':
            if (!strcmp(optarg, "float16")) dtype = 1;
            else if (!strcmp(optarg, "float32")) dtype = 0;
            else return kv_usage_error("slice", "--dtype: expected float16 or float32, found '%s'", optarg);
            break;
        case 'h': fputs(slice_help, stdout); return 0;
        default: return kv_usage_error("slice", "unknown option");
        }
    }
    if (optind < argc) return kv_usage_error("slice", "unexpected argument '%s'", argv[optind]);
    if (!in_path || !out) return kv_usage_error("slice", "--in and --out are required");
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in) return kv_report(KV_ERR_NOMEM);
    kv_status st = kv_trace_open(in_path, in);
    if (st != KV_OK) { free(in); return kv_report(st); }
    int T = tokens ? tokens : in->num_tokens;
    if (T > in->num_tokens) {
        int have = in->num_tokens;
        free(in);
        return kv_usage_error("slice", "--tokens %d exceeds the trace's %d tokens", T, have);
    }
    int P = prefill ? prefill : (in->prefill_len < T ? in->prefill_len : (T > 1 ? T - 1 : 1));
    if (P > T) { free(in); return kv_usage_error("slice", "--prefill %d exceeds --tokens %d", P, T); }
    int chosen[KV_MAX_LAYERS], nl = 0;
    if (layers) {
        char buf[1024];
        if (strlen(layers) >= sizeof buf) {
            free(in);
            return kv_usage_error("slice", "--layers: the list is %zu characters long; at most %zu are accepted",
                                  strlen(layers), sizeof buf - 1);
        }
        snprintf(buf, sizeof buf, "%s", layers);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            int li = kv_trace_find_layer(in, tok);
            for (int j = 0; li >= 0 && j < nl; j++)
                if (chosen[j] == li) { free(in); return kv_usage_error("slice", "--layers: '%s' listed twice", tok); }
            if (li < 0) { fprintf(stderr, "kvbench: %s: no layer '%s' (the trace has %d layers, e.g. %s)\n", in_path, tok, in->num_layers, in->layer_names[0]); free(in); return 2; }
            chosen[nl++] = li;
        }
    } else for (int i = 0; i < in->num_layers; i++) chosen[nl++] = i;
    /* the source's description plus what was cut, within what the reader accepts
     * (KV_TEXT_MAX - 1 bytes): a long description is shortened visibly ("..."),
     * at a UTF-8 character boundary */
    char desc[KV_TEXT_MAX], suffix[96];
    snprintf(suffix, sizeof suffix, " [slice: first %d tokens, prefill %d]", T, P);
    size_t keep = strlen(in->description), room = sizeof desc - 1 - strlen(suffix);
    const char *dots = "";
    if (keep > room) {
        keep = room - 3;
        while (keep > 0 && (in->description[keep] & 0xC0) == 0x80) keep--;
        dots = "...";
    }
    snprintf(desc, sizeof desc, "%.*s%s%s", (int)keep, in->description, dots, suffix);
    kv_trace_spec ts = {.model = in->model, .description = desc, .rope = in->rope, .head_dim = in->head_dim,
                        .num_q_heads = in->num_q_heads, .num_kv_heads = in->num_kv_heads, .num_tokens = T,
                        .prefill_len = P, .softmax_scale = in->softmax_scale,
                        .half = dtype >= 0 ? dtype : in->layer_half[chosen[0]], .gzip = 4, .chunk_tokens = 256};
    kv_trace_writer *w = NULL;
    st = kv_trace_writer_open(out, &ts, &w);
    int *tok = NULL;
    if (st == KV_OK) st = kv_trace_load_tokens(in, &tok);
    if (st == KV_OK && tok) st = kv_trace_writer_tokens(w, tok);
    free(tok);
    int D = in->head_dim;
    for (int i = 0; i < nl && st == KV_OK; i++) {
        kv_layer L;
        st = kv_trace_load_layer(in, chosen[i], &L);
        if (st != KV_OK) break;
        float *q = kv_malloc((size_t)L.Hq * T * D * sizeof(float), "slice q");
        float *k = kv_malloc((size_t)L.Hkv * T * D * sizeof(float), "slice k");
        float *v = L.v ? kv_malloc((size_t)L.Hkv * T * D * sizeof(float), "slice v") : NULL;
        if (!q || !k || (L.v && !v)) st = KV_ERR_NOMEM;
        for (int h = 0; h < L.Hq && st == KV_OK; h++)
            memcpy(q + (size_t)h * T * D, L.q + (size_t)h * L.T * D, (size_t)T * D * sizeof(float));
        for (int g = 0; g < L.Hkv && st == KV_OK; g++) {
            memcpy(k + (size_t)g * T * D, L.k + (size_t)g * L.T * D, (size_t)T * D * sizeof(float));
            if (v) memcpy(v + (size_t)g * T * D, L.v + (size_t)g * L.T * D, (size_t)T * D * sizeof(float));
        }
        if (st == KV_OK) st = kv_trace_writer_layer(w, in->layer_index[chosen[i]], L.v != NULL);
        if (st == KV_OK) st = kv_trace_writer_rows(w, 0, T, q, k, v);
        free(q); free(k); free(v);
        kv_layer_free(&L);
    }
    kv_status cst = w ? kv_trace_writer_close(w, st == KV_OK) : KV_OK;
    if (st == KV_OK) st = cst;
    if (st != KV_OK) { free(in); return kv_report(st); }
    fprintf(stderr, "slice: wrote %s (T=%d, P=%d, %d layer(s))\n", out, T, P, nl);
    free(in);
    return 0;
}
