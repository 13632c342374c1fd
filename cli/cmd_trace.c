/* cmd_trace.c: the trace subcommands: info (what a trace holds), synth
 * (seeded synthetic trace) and slice (a smaller valid trace: fewer tokens,
 * chosen layers, optionally a shorter prefill), all through datasets/. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "../datasets/kv_trace.h"
#include "cli.h"

/* Prints `text` after `label`, wrapped at spaces to lines of at most
 * `width` columns with a hanging indent; a word longer than a line is
 * printed whole on its own line (never cut). */
static void print_wrapped(const char *label, const char *text, int width) {
    int indent = (int)strlen(label), col = indent;
    fputs(label, stdout);
    const char *p = text;
    while (*p == ' ') p++;
    int first = 1;
    while (*p) {
        const char *e = p;
        while (*e && *e != ' ' && *e != '\n') e++;
        int len = (int)(e - p);
        if (!first && col + 1 + len > width) { printf("\n%*s", indent, ""); col = indent; first = 1; }
        if (!first) { putchar(' '); col++; }
        fwrite(p, 1, (size_t)len, stdout);
        col += len;
        first = 0;
        p = e;
        if (*p == '\n') { printf("\n%*s", indent, ""); col = indent; first = 1; p++; }
        while (*p == ' ') p++;
    }
    putchar('\n');
}

static const char info_help[] =
    "usage: kvbench info TRACE\n"
    "       kvbench info --profile TRACE [--layer L|all] [--sink S] [--local W] [--stride s] [--max-steps N] [--window N]\n"
    "Prints the trace's model, description, T, P, heads, D, layers with their dtypes, and file size; with\n"
    "--profile, the oracle budget profile (kvbench info --profile --help).\n";

int cmd_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--profile")) return kv_info_profile(argc, argv);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { fputs(info_help, stdout); return 0; }
    if (argc != 2) return kv_usage_error("info", "expected exactly one trace file, found %d arguments", argc - 1);
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in) return kv_report(KV_ERR_NOMEM);
    kv_status st = kv_trace_open(argv[1], in);
    if (st != KV_OK) { free(in); return kv_report(st); }
    printf("file          %s (%.2f MB)\n", in->path, in->file_bytes / 1e6);
    printf("model         %s\n", in->model);
    print_wrapped("description   ", in->description, 100);
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
    "                     [--layers 1] [--seed S] [--dtype float16|float32] [--no-values] [--force]\n"
    "                     [--gzip LEVEL] [--shuffle] [--fletcher32] [--chunk-tokens N | --contiguous]\n"
    "Writes a seeded synthetic kvtrace (sinks, RoPE, locality, clustered keys, heavy hitters, and a decode-time\n"
    "shift of keys and queries). Streams to disk: T up to millions in bounded memory. For tests and scale\n"
    "benchmarks only: report results on real traces. An existing FILE is replaced only with --force (the new\n"
    "trace is written to FILE.tmp.<pid> and renamed over it when complete).\n"
    "Storage (default: chunks of 4096 tokens of one head, no filter): --gzip 1..9 deflates each chunk, --shuffle\n"
    "adds HDF5's byte shuffle before it, --fletcher32 a checksum after it (a filter the parallel loader leaves to\n"
    "the HDF5 library), --chunk-tokens N sets the chunk length, --contiguous stores each dataset unchunked.\n";

/* The trace's size (uncompressed: synth writes no gzip) against the free
 * space of the output's filesystem, before anything is written. */
static kv_status check_space(const char *out, const kv_synth_spec *sp) {
    double per_layer = (double)(sp->q_heads + (sp->with_v ? 2 : 1) * sp->kv_heads) * sp->dim * (sp->half ? 2 : 4);
    double bytes = (double)sp->layers * per_layer * sp->tokens + 4.0 * sp->tokens;
    const char *slash = strrchr(out, '/');
    char *dir = slash ? kv_strfmt("%.*s", slash == out ? 1 : (int)(slash - out), out) : kv_strfmt(".");
    if (!dir) return KV_ERR_NOMEM;
    struct statvfs fs;
    kv_status st = KV_OK;
    if (statvfs(dir, &fs) == 0 && bytes > (double)fs.f_bavail * fs.f_frsize)
        st = kv_fail(KV_ERR_INPUT, "synth --out %s: the trace (T=%d, P=%d, %d layer(s), %d+%d heads, D=%d, %s) takes "
                     "%.1f GB, but the filesystem of '%s' has %.1f GB free", out, sp->tokens, sp->prefill, sp->layers,
                     sp->q_heads, sp->kv_heads, sp->dim, sp->half ? "float16" : "float32", bytes / 1e9, dir,
                     (double)fs.f_bavail * fs.f_frsize / 1e9);
    free(dir);
    return st;
}

int cmd_synth(int argc, char **argv) {
    kv_synth_spec sp = {.tokens = 4096, .prefill = 3072, .q_heads = 16, .kv_heads = 8, .dim = 128, .layers = 1,
                        .seed = 0, .half = 1, .with_v = 1};
    const char *out = NULL;
    int prefill_set = 0, force = 0;
    static const struct option opts[] = {
        {"out", 1, 0, 'o'}, {"tokens", 1, 0, 't'}, {"prefill", 1, 0, 'p'}, {"q-heads", 1, 0, 'q'},
        {"kv-heads", 1, 0, 'k'}, {"dim", 1, 0, 'd'}, {"layers", 1, 0, 'l'}, {"seed", 1, 0, 's'},
        {"dtype", 1, 0, 'y'}, {"no-values", 0, 0, 'n'}, {"force", 0, 0, 'f'}, {"help", 0, 0, 'h'},
        {"gzip", 1, 0, 'z'}, {"shuffle", 0, 0, 'S'}, {"fletcher32", 0, 0, 'F'}, {"chunk-tokens", 1, 0, 'c'},
        {"contiguous", 0, 0, 'C'}, {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, KV_OPTSTRING, opts, NULL)) != -1;) {
        int bad = 0, seed;
        switch (c) {
        case 'o': out = optarg; break;
        /* T <= 2^30: positions and T + block stay within int; sizes are size_t */
        case 't': bad = kv_opt_int("synth", "tokens", optarg, 2, 1L << 30, &sp.tokens); break;
        case 'p': bad = kv_opt_int("synth", "prefill", optarg, 1, 1L << 30, &sp.prefill); prefill_set = 1; break;
        case 'q': bad = kv_opt_int("synth", "q-heads", optarg, 1, 1024, &sp.q_heads); break;
        case 'k': bad = kv_opt_int("synth", "kv-heads", optarg, 1, 1024, &sp.kv_heads); break;
        case 'd': bad = kv_opt_int("synth", "dim", optarg, 2, 1024, &sp.dim); break;
        case 'l': bad = kv_opt_int("synth", "layers", optarg, 1, KV_MAX_LAYERS, &sp.layers); break;
        case 's': bad = kv_opt_int("synth", "seed", optarg, 0, 2147483647L, &seed); sp.seed = (uint64_t)seed; break;
        case 'y':
            if (!strcmp(optarg, "float16")) sp.half = 1;
            else if (!strcmp(optarg, "float32")) sp.half = 0;
            else return kv_usage_error("synth", "--dtype: expected float16 or float32, found '%s'", optarg);
            break;
        case 'n': sp.with_v = 0; break;
        case 'f': force = 1; break;
        case 'z': bad = kv_opt_int("synth", "gzip", optarg, 0, 9, &sp.gzip); break;
        case 'S': sp.shuffle = 1; break;
        case 'F': sp.fletcher32 = 1; break;
        case 'c': bad = kv_opt_int("synth", "chunk-tokens", optarg, 1, 1L << 30, &sp.chunk_tokens); break;
        case 'C': sp.contiguous = 1; break;
        case 'h': fputs(synth_help, stdout); return 0;
        default: return kv_opt_error("synth", c, argv, opts);
        }
        if (bad) return bad;
    }
    if (optind < argc) return kv_usage_error("synth", "unexpected argument '%s'", argv[optind]);
    if (!out) return kv_usage_error("synth", "--out FILE is required");
    if (!prefill_set) sp.prefill = (int)((long long)sp.tokens * 3 / 4); /* 64-bit: T up to 2^30 */
    if (sp.prefill < 1) sp.prefill = 1;
    if (sp.prefill > sp.tokens)
        return kv_usage_error("synth", "--prefill %d: expected at most --tokens %d", sp.prefill, sp.tokens);
    if (sp.q_heads % sp.kv_heads) return kv_usage_error("synth", "--q-heads %d is not a multiple of --kv-heads %d", sp.q_heads, sp.kv_heads);
    if (sp.contiguous && (sp.gzip || sp.shuffle || sp.fletcher32 || sp.chunk_tokens))
        return kv_usage_error("synth", "--contiguous: HDF5 filters and --chunk-tokens need chunked storage");
    if (sp.dim % 2) return kv_usage_error("synth", "--dim must be even (RoPE rotates pairs), found %d", sp.dim);
    kv_status st = kv_check_out_file("--out", out, force, NULL);
    if (st == KV_OK) st = check_space(out, &sp);
    if (st == KV_OK) st = kv_synth_write(out, &sp);
    if (st != KV_OK) return kv_report(st);
    fprintf(stderr, "synth: wrote %s (T=%d, P=%d, %d/%d heads, D=%d, %d layer(s), seed %llu)\n", out, sp.tokens,
            sp.prefill, sp.q_heads, sp.kv_heads, sp.dim, sp.layers, (unsigned long long)sp.seed);
    return 0;
}

static const char slice_help[] =
    "usage: kvbench slice --in A --out B [--tokens N] [--layers L14,L20] [--prefill P] [--dtype float16|float32]\n"
    "                     [--force]\n"
    "Writes a smaller valid kvtrace: the first N positions (default all) of the chosen layers (default all).\n"
    "--prefill defaults to min(P, N-1) of the source (at least 1), so the slice keeps decode steps.\n"
    "An existing B is replaced only with --force (written to B.tmp.<pid>, renamed over B when complete).\n";

int cmd_slice(int argc, char **argv) {
    const char *in_path = NULL, *out = NULL, *layers = NULL;
    int tokens = 0, prefill = 0, dtype = -1, force = 0;
    static const struct option opts[] = {{"in", 1, 0, 'i'}, {"out", 1, 0, 'o'}, {"tokens", 1, 0, 't'},
                                         {"layers", 1, 0, 'l'}, {"prefill", 1, 0, 'p'}, {"dtype", 1, 0, 'y'},
                                         {"force", 0, 0, 'f'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, KV_OPTSTRING, opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'i': in_path = optarg; break;
        case 'o': out = optarg; break;
        case 'l': layers = optarg; break;
        case 't': bad = kv_opt_int("slice", "tokens", optarg, 1, 1L << 30, &tokens); break;
        case 'p': bad = kv_opt_int("slice", "prefill", optarg, 1, 1L << 30, &prefill); break;
        case 'y':
            if (!strcmp(optarg, "float16")) dtype = 1;
            else if (!strcmp(optarg, "float32")) dtype = 0;
            else return kv_usage_error("slice", "--dtype: expected float16 or float32, found '%s'", optarg);
            break;
        case 'f': force = 1; break;
        case 'h': fputs(slice_help, stdout); return 0;
        default: return kv_opt_error("slice", c, argv, opts);
        }
        if (bad) return bad;
    }
    if (optind < argc) return kv_usage_error("slice", "unexpected argument '%s'", argv[optind]);
    if (!in_path || !out) return kv_usage_error("slice", "--in and --out are required");
    kv_status st = kv_check_out_file("--out", out, force, in_path);
    if (st != KV_OK) return kv_report(st);
    kv_trace_info *in = kv_malloc(sizeof *in, "trace info");
    if (!in) return kv_report(KV_ERR_NOMEM);
    st = kv_trace_open(in_path, in);
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
        const char *p0 = layers;
        for (;;) {
            const char *c = strchr(p0, ',');
            size_t len = c ? (size_t)(c - p0) : strlen(p0);
            char *tok = kv_strfmt("%.*s", (int)(len < 4096 ? len : 4096), p0);
            if (!tok) { free(in); return kv_report(KV_ERR_NOMEM); }
            int li = len && len < 4096 ? kv_trace_find_layer(in, tok) : -1;
            if (li < 0) {
                fprintf(stderr, "kvbench: %s: --layers: no layer '%s' (expected comma-separated names; the trace has "
                        "%d layers, e.g. %s)\n", in_path, tok, in->num_layers, in->layer_names[0]);
                free(tok); free(in);
                return 2;
            }
            for (int i = 0; i < nl; i++)
                if (chosen[i] == li) {
                    fprintf(stderr, "kvbench: %s: --layers: layer '%s' listed twice\n", in_path, tok);
                    free(tok); free(in);
                    return 2;
                }
            free(tok);
            chosen[nl++] = li; /* distinct layers of the trace: nl <= num_layers <= KV_MAX_LAYERS */
            if (!c) break;
            p0 = c + 1;
        }
    } else for (int i = 0; i < in->num_layers; i++) chosen[nl++] = i;
    /* the source's description and what was cut; a description too long for
     * the format's text limit loses its tail at a word boundary, marked "..." */
    char note[96];
    snprintf(note, sizeof note, " [slice: first %d tokens, prefill %d]", T, P);
    int keep = (int)strlen(in->description), room = KV_TEXT_MAX - 1 - (int)strlen(note);
    const char *more = "";
    if (keep > room) {
        keep = room - 4;
        while (keep > 0 && in->description[keep] != ' ') keep--;
        more = " ...";
    }
    char *desc = kv_strfmt("%.*s%s%s", keep, in->description, more, note);
    if (!desc) { free(in); return kv_report(KV_ERR_NOMEM); }
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
    free(desc);
    if (st != KV_OK) { free(in); return kv_report(st); }
    fprintf(stderr, "slice: wrote %s (T=%d, P=%d, %d layer(s))\n", out, T, P, nl);
    free(in);
    return 0;
}
