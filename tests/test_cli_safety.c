/* test_cli_safety.c: the command line and file safety (issue 13, items 1,
 * 2, 4 and 7; issue 16, item 6): checked option values and their messages,
 * nothing cut at a fixed length, the --force rule for every command that
 * writes, all-or-nothing replacement of a result directory (also when a
 * signal arrives at each phase of the final write), temp files removed on
 * SIGINT/SIGTERM, output checks before the trace is read, non-finite
 * attention scores as an input error (CPU and GPU oracle), and valid JSON
 * from non-UTF-8 trace strings. Every test here failed on the code before
 * these fixes. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli/oracle.h"
#include "../datasets/kv_trace.h"
#include "kv_test.h"

#define DEMO "datasets/demo.h5"
static char out[1 << 16], err[1 << 16];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    static char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return kv_test_sh(cmd, out, sizeof out, err, sizeof err);
}

static int exists(const char *p) { struct stat sb; return stat(p, &sb) == 0; }

/* A fresh empty directory under the test tmpdir. */
static const char *fresh(const char *name) {
    static char buf[8][700];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 700, "%s/%s", kv_test_tmpdir(), name);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", p, p);
    if (system(cmd) != 0) return NULL;
    return p;
}

/* Entries of dir whose name contains `needle`. */
static int count_entries(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, needle) != NULL;
    closedir(d);
    return n;
}

/* 1 when dir a and dir b hold the same three result files, byte for byte. */
static int same_result(const char *a, const char *b) {
    static const char *names[] = {"summary.json", "drift.csv", "steps.csv"};
    for (int i = 0; i < 3; i++) {
        char pa[800], pb[800];
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        size_t na, nb;
        char *x = kv_test_read_file(pa, &na), *y = kv_test_read_file(pb, &nb);
        int same = x && y && na == nb && !memcmp(x, y, na);
        free(x); free(y);
        if (!same) return 0;
    }
    return 1;
}

/* A float32 trace of one layer L0 from the synthetic generator, with q and k
 * multiplied by `mul`, softmax_scale `scale` and description `desc`. */
static kv_status write_trace(const char *path, const char *desc, float scale, float mul) {
    kv_layer L;
    KV_TRY(kv_test_synth_layer(300, 200, 2, 1, 16, 5, &L));
    for (size_t i = 0; i < (size_t)L.Hq * L.T * L.D; i++) L.q[i] *= mul;
    for (size_t i = 0; i < (size_t)L.Hkv * L.T * L.D; i++) L.k[i] *= mul;
    kv_trace_spec ts = {.model = "test", .description = desc, .rope = "applied", .head_dim = 16, .num_q_heads = 2,
                        .num_kv_heads = 1, .num_tokens = 300, .prefill_len = 200, .softmax_scale = scale, .half = 0,
                        .chunk_tokens = 64};
    kv_trace_writer *w;
    kv_status st = kv_trace_writer_open(path, &ts, &w);
    if (st == KV_OK) {
        st = kv_trace_writer_layer(w, 0, 1);
        if (st == KV_OK) st = kv_trace_writer_rows(w, 0, 300, L.q, L.k, L.v);
        kv_status c = kv_trace_writer_close(w, st == KV_OK);
        if (st == KV_OK) st = c;
    }
    kv_layer_free(&L);
    return st;
}

int test_cli_option_errors(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    char *longname = malloc(1600), *zeros = malloc(1600);
    memset(longname, 'x', 1500);
    strcpy(longname + 1500, "END");
    memset(zeros, '0', 1500);
    strcpy(zeros + 1500, "64");
    char longneedle[64], method_long[1700], tokens_long[1700];
    snprintf(longneedle, sizeof longneedle, "xxxxEND' (kvbench list");
    snprintf(method_long, sizeof method_long, "exact,%s", longname);
    snprintf(tokens_long, sizeof tokens_long, "%s", zeros);
    struct { const char *args, *arg2; int rc; const char *needle; } cases[] = {
        /* issue 13.1: empty method lists */
        {"run --trace " DEMO " --param M=3 --method ,", NULL, 2, "found an empty name in ','"},
        {"run --trace " DEMO " --method ''", NULL, 2, "found nothing in ''"},
        {"run --trace " DEMO " --method exact,", NULL, 2, "found an empty name in 'exact,'"},
        {"bench --method , --param M=3", NULL, 2, "found an empty name"},
        /* issue 16.6: ranges in the message; a missing value; unknown options named */
        {"run --trace " DEMO " --method exact --k 0", NULL, 2, "--k: expected an integer in [1, 1073741824], found '0'"},
        {"run --trace " DEMO " --method exact --k", NULL, 2, "option --k needs a value"},
        {"run --trace " DEMO " --method exact --sink -1", NULL, 2, "--sink: expected an integer in [0, 1073741824]"},
        {"run --trace " DEMO " --method exact --seed 99999999999", NULL, 2, "--seed: expected an integer in [0, 2147483647], found '99999999999'"},
        {"run --trace " DEMO " --method exact --frob", NULL, 2, "unknown or ambiguous option '--frob'"},
        {"run --trace " DEMO " --method exact --quiet=1", NULL, 2, "option --quiet takes no value"},
        {"synth --out x.h5 --tokens", NULL, 2, "option --tokens needs a value"},
        {"synth --out x.h5 --tokens 2147483648", NULL, 2, "--tokens: expected an integer in [2, 1073741824], found '2147483648'"},
        {"slice --in " DEMO " --out x.h5 --tokens 0", NULL, 2, "--tokens: expected an integer in [1, 1073741824], found '0'"},
        {"bench --method exact --tokens 1024,,2048", NULL, 2, "found an empty item in '1024,,2048'"},
        {"bench --method exact --tokens 1024,4294967297", NULL, 2, "found '4294967297'"},
        {"bench --method exact --k", NULL, 2, "option --k needs a value"},
        {"info", NULL, 2, "expected exactly one trace file, found 0 arguments"},
        {"help nope", NULL, 2, "unknown command 'nope'"},
        /* issue 13.1: a value of 1500+ characters is read whole, never cut at 1023 */
        {"run --trace " DEMO " --method", method_long, 2, longneedle},
        {"bench --method", method_long, 2, longneedle},
        /* issue 13.1: synth's default prefill at T > 715 million (T * 3 / 4 overflowed int) */
        {"synth --out big.h5 --tokens 1073741824", NULL, 2, "T=1073741824, P=805306368"},
        /* issue 13.7 / 16.5: a missing output directory is bad input (exit 2), named */
        {"synth --out /nonexistent-dir/x.h5 --tokens 100", NULL, 2, "its directory '/nonexistent-dir' does not exist"},
        {"bench --method exact --csv /nonexistent-dir/b.csv", NULL, 2, "--csv /nonexistent-dir/b.csv: its directory '/nonexistent-dir' does not exist"},
    };
    char big[700];
    snprintf(big, sizeof big, "%s/big.h5", tmp);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *a = cases[i].args, *q = cases[i].arg2 ? " '" : "", *a2 = cases[i].arg2 ? cases[i].arg2 : "",
                   *qe = cases[i].arg2 ? "'" : "";
        int rc = strstr(a, DEMO) ? sh("%s %s%s%s%s", B, a, q, a2, qe) /* DEMO is relative to the repo */
                                 : sh("cd %s && %s%s %s%s%s%s", tmp, B[0] == '/' ? "" : "$OLDPWD/", B, a, q, a2, qe);
        CHECK(rc == cases[i].rc, "'kvbench %s': exit %d, want %d; stderr: %.400s", a, rc, cases[i].rc, err);
        CHECK(strstr(err, cases[i].needle), "'kvbench %s': stderr lacks '%s': %.600s", a, cases[i].needle, err);
        CHECK(!exists(big), "synth left %s", big);
    }
    CHECK(count_entries(tmp, ".tmp.") == 0, "temporary files left in %s", tmp);
    /* a 1500-digit --tokens value that is 64 with leading zeros: read whole (cut at 1023 it was 0) */
    int rc = sh("%s bench --method exact --device cpu --tokens %s --q-heads 2 --kv-heads 1 --dim 16 --reps 1 --warmup 0",
                B, tokens_long);
    CHECK(rc == 0 && strstr(out, "exact") && strstr(out, "       64  "), "bench --tokens 000..064: exit %d: %s %s", rc,
          out, err);
    free(longname);
    free(zeros);
    return KV_TEST_PASS;
}

/* `kvbench help run` prints run's help; info wraps the description at word
 * boundaries (lines of at most 100 columns) and loses no word of it. */
int test_cli_help_and_info(void) {
    const char *B = kv_test_bin();
    CHECK(sh("%s help run", B) == 0 && !strncmp(out, "usage: kvbench run --trace", 26), "help run: %.200s", out);
    CHECK(sh("%s help synth", B) == 0 && strstr(out, "--force"), "help synth: %.200s", out);
    CHECK(sh("%s help", B) == 0 && strstr(out, "commands:"), "help: %.200s", out);
    CHECK(sh("%s info %s", B, DEMO) == 0, "info: %s", err);
    kv_trace_info in;
    CHECK_OK(kv_trace_open(DEMO, &in));
    char *desc = strstr(out, "description   ");
    CHECK(desc, "no description line: %s", out);
    char *end = strstr(desc, "\ntokens (T)");
    CHECK(end, "description not followed by tokens");
    *end = 0;
    /* every line at most 100 columns */
    for (char *l = desc; l;) {
        char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        CHECK(len <= 100, "info line of %zu columns: %.120s", len, l);
        l = nl ? nl + 1 : NULL;
    }
    /* the words, in order, are the description's words */
    char *printed = desc + 14, words[2][KV_TEXT_MAX];
    size_t a = 0, b = 0;
    for (char *p = printed; *p; p++)
        if (*p != ' ' && *p != '\n') words[0][a++] = *p;
        else if (a && words[0][a - 1] != ' ') words[0][a++] = ' ';
    for (char *p = in.description; *p; p++)
        if (*p != ' ' && *p != '\n') words[1][b++] = *p;
        else if (b && words[1][b - 1] != ' ') words[1][b++] = ' ';
    while (a && words[0][a - 1] == ' ') a--;
    while (b && words[1][b - 1] == ' ') b--;
    words[0][a] = words[1][b] = 0;
    CHECK(!strcmp(words[0], words[1]), "info's description differs from the trace's:\n%s\n%s", words[0], words[1]);
    return KV_TEST_PASS;
}

/* A method's build failure: its own message once, not garbled (kv_fail used
 * to format "build failed: %s" from the buffer it was writing). */
int test_cli_build_failure_message(void) {
    const char *B = kv_test_bin();
    char dir[700];
    snprintf(dir, sizeof dir, "%s/buildfail", kv_test_tmpdir());
    int rc = sh("%s run --trace %s --method pqcache --param M=3 --max-steps 2 --device cpu --out %s", B, DEMO, dir);
    CHECK(rc == 2 && strstr(err, "method pqcache: build failed: ") && strstr(err, "M=3 must divide head_dim 64"),
          "pqcache M=3: exit %d: %s", rc, err);
    char *first = strstr(err, "build failed");
    CHECK(!strstr(first + 1, "build failed"), "'build failed' twice: %s", err);
    rc = sh("%s run --trace %s --method magicpig --param magicpig.min_collisions=1024 --max-steps 2 --device cpu --out %s",
            B, DEMO, dir);
    CHECK(rc == 2 && strstr(err, "kvbench: method magicpig: build failed: --param min_collisions for method magicpig: "
                                 "1024 is above L="),
          "magicpig min_collisions=1024: exit %d: %s", rc, err);
    CHECK(!exists(dir), "a failed run left %s", dir);
    /* the same through kv_fail directly */
    kv_fail(KV_ERR_INPUT, "inner %d", 7);
    kv_fail(KV_ERR_INPUT, "outer: %s", kv_last_error());
    CHECK(!strcmp(kv_last_error(), "outer: inner 7"), "kv_fail from its own buffer: '%s'", kv_last_error());
    return KV_TEST_PASS;
}

/* --k above the largest retrievable region: a warning with the effective
 * budget, recorded in summary.json; exact still has recall 1. */
int test_cli_k_above_context(void) {
    const char *B = kv_test_bin();
    char dir[700], p[800];
    snprintf(dir, sizeof dir, "%s/bigk", kv_test_tmpdir());
    int rc = sh("%s run --trace %s --method exact --k 5000 --max-steps 3 --stride 200 --device cpu --out %s --force --quiet",
                B, DEMO, dir);
    CHECK(rc == 0, "run --k 5000: exit %d: %s", rc, err);
    /* demo: T = 1536, sink 4, local 64 -> the last step's region has 1468 positions */
    CHECK(strstr(err, "warning: --k 5000 is larger than the largest retrievable region") &&
          strstr(err, "the effective budget is 1468"), "no warning: %s", err);
    snprintf(p, sizeof p, "%s/summary.json", dir);
    char *s = kv_test_read_file(p, NULL);
    CHECK(s && strstr(s, "\"k\": 5000, \"k_effective\": 1468,"), "summary.json: %.300s", s ? s : "(none)");
    CHECK(strstr(s, "\"recall\": 1,"), "exact's recall is not 1: %.2000s", s);
    free(s);
    return KV_TEST_PASS;
}

/* One rule for every command that writes: an existing output is replaced
 * only with --force; never a file kvbench did not write. */
int test_cli_force_rule(void) {
    const char *B = kv_test_bin(), *d = fresh("force");
    CHECK(d, "mkdir");
    char tr[800], sl[800], csv[1000];
    snprintf(tr, sizeof tr, "%s/s.h5", d);
    snprintf(sl, sizeof sl, "%s/sl.h5", d);
    snprintf(csv, sizeof csv, "%s/b.csv", d);
    const char *small = "--tokens 300 --q-heads 2 --kv-heads 1 --dim 16";
    CHECK(sh("%s synth --out %s %s", B, tr, small) == 0, "synth: %s", err);
    int rc = sh("%s synth --out %s %s --seed 3", B, tr, small);
    CHECK(rc == 2 && strstr(err, "already exists (use --force to replace it)"), "synth over a file: %d %s", rc, err);
    CHECK(sh("%s synth --out %s %s --seed 3 --force", B, tr, small) == 0, "synth --force: %s", err);
    CHECK(strstr((sh("%s info %s", B, tr), out), "seed=3"), "synth --force did not replace: %s", out);
    rc = sh("%s synth --out %s %s --force", B, d, small);
    CHECK(rc == 2 && strstr(err, "not a regular file"), "synth --force over a directory: %d %s", rc, err);

    CHECK(sh("%s slice --in %s --out %s --tokens 200", B, tr, sl) == 0, "slice: %s", err);
    rc = sh("%s slice --in %s --out %s --tokens 250", B, tr, sl);
    CHECK(rc == 2 && strstr(err, "already exists"), "slice over a file: %d %s", rc, err);
    CHECK(sh("%s slice --in %s --out %s --tokens 250 --force", B, tr, sl) == 0, "slice --force: %s", err);
    CHECK(sh("%s info %s", B, sl) == 0 && strstr(out, "tokens (T)    250"), "slice --force did not replace");
    rc = sh("%s slice --in %s --out %s --force", B, tr, tr);
    CHECK(rc == 2 && strstr(err, "is the input file"), "slice onto its input: %d %s", rc, err);

    const char *bargs = "--method exact --device cpu --tokens 64 --q-heads 2 --kv-heads 1 --dim 16 --reps 1 --warmup 0";
    CHECK(sh("%s bench %s --csv %s", B, bargs, csv) == 0, "bench --csv: %s", err);
    rc = sh("%s bench %s --csv %s", B, bargs, csv);
    CHECK(rc == 2 && strstr(err, "--csv") && strstr(err, "already exists"), "bench over a csv: %d %s", rc, err);
    CHECK(sh("%s bench %s --csv %s --force", B, bargs, csv) == 0, "bench --csv --force: %s", err);
    CHECK(count_entries(d, ".tmp.") == 0, "temporary files left in %s", d);

    /* run: `--out . --force` in a directory holding someone's steps.csv: refused, the file intact */
    const char *w = fresh("force_cwd");
    FILE *f = fopen((snprintf(csv, sizeof csv, "%s/steps.csv", w), csv), "w");
    CHECK(f, "create %s", csv);
    fputs("my data\n", f);
    fclose(f);
    rc = sh("cd %s && %s%s run --trace %s%s --method exact --max-steps 2 --out . --force", w,
            B[0] == '/' ? "" : "$OLDPWD/", B, "$OLDPWD/", DEMO);
    CHECK(rc == 2 && strstr(err, "--out '.'"), "--out . --force: exit %d: %s", rc, err);
    char *s = kv_test_read_file(csv, NULL);
    CHECK(s && !strcmp(s, "my data\n"), "./steps.csv changed: %s", s ? s : "(deleted)");
    free(s);
    /* a directory holding a file kvbench did not write, or not a kvbench result */
    char sub[800];
    snprintf(sub, sizeof sub, "%s/notours", w);
    mkdir(sub, 0755);
    snprintf(csv, sizeof csv, "%s/summary.json", sub);
    f = fopen(csv, "w");
    fputs("{\"mine\": 1}\n", f);
    fclose(f);
    rc = sh("%s run --trace %s --method exact --max-steps 2 --out %s --force", B, DEMO, sub);
    CHECK(rc == 2 && strstr(err, "not a kvbench result directory"), "foreign summary.json: %d %s", rc, err);
    s = kv_test_read_file(csv, NULL);
    CHECK(s && !strcmp(s, "{\"mine\": 1}\n"), "foreign summary.json changed");
    free(s);
    CHECK(sh("%s run --trace %s --method streaming --max-steps 2 --out %s/r --quiet", B, DEMO, w) == 0, "run: %s", err);
    snprintf(csv, sizeof csv, "%s/r/plot.png", w);
    f = fopen(csv, "w");
    fclose(f);
    rc = sh("%s run --trace %s --method exact --max-steps 2 --out %s/r/ --force", B, DEMO, w);
    CHECK(rc == 2 && strstr(err, "holds 'plot.png', which kvbench did not write"), "extra file: %d %s", rc, err);
    CHECK(exists(csv), "plot.png deleted");
    /* an empty directory is fine with --force */
    snprintf(sub, sizeof sub, "%s/empty", w);
    mkdir(sub, 0755);
    CHECK(sh("%s run --trace %s --method exact --max-steps 2 --out %s --force --quiet", B, DEMO, sub) == 0,
          "run into an empty dir: %s", err);
    return KV_TEST_PASS;
}

/* The output is checked before the trace is read: a missing or unwritable
 * --out parent fails at once (exit 2, named), with no banner (printed once
 * the trace is open) and no work done. */
int test_cli_out_checked_first(void) {
    const char *B = kv_test_bin(), *w = fresh("outfirst");
    int rc = sh("%s run --trace %s --method exact --out %s/missing/r", B, DEMO, w);
    CHECK(rc == 2 && strstr(err, "/missing/r: its directory") && strstr(err, "does not exist") &&
          !strstr(err, "layer L14: T="), "missing parent: exit %d: %s", rc, err);
    rc = sh("%s run --trace /nonexistent.h5 --method exact --out %s/missing/r", B, w);
    CHECK(rc == 2 && strstr(err, "does not exist") && !strstr(err, "no such file"), "checked before the trace: %s", err);
    if (geteuid() != 0) { /* root writes anywhere: the permission case needs a normal user */
        char ro[800];
        snprintf(ro, sizeof ro, "%s/ro", w);
        mkdir(ro, 0555);
        rc = sh("%s run --trace %s --method exact --out %s/r", B, DEMO, ro);
        CHECK(rc == 2 && strstr(err, "is not writable"), "read-only parent: exit %d: %s", rc, err);
    }
    /* the default results/... relative to a directory without results/ */
    rc = sh("cd %s && %s%s run --trace %s%s --method exact", w, B[0] == '/' ? "" : "$OLDPWD/", B, "$OLDPWD/", DEMO);
    CHECK(rc == 2 && strstr(err, "its directory 'results' does not exist") && !strstr(err, "layer L14: T="),
          "default out: exit %d: %s", rc, err);
    return KV_TEST_PASS;
}

/* --force is all-or-nothing: a failed run, or one interrupted at any phase
 * of the final write, leaves the previous result exactly as it was and no
 * DIR.tmp.<pid> / DIR.old.<pid>; once the swap is done, the new result. */
int test_results_force_all_or_nothing(void) {
    const char *B = kv_test_bin(), *w = fresh("swap");
    char dir[800], ref[800], nan[800];
    snprintf(dir, sizeof dir, "%s/r", w);
    snprintf(ref, sizeof ref, "%s/ref", w);
    snprintf(nan, sizeof nan, "%s/nan.h5", w);
    const char *args = "--method streaming --max-steps 3 --device cpu --quiet";
    CHECK(sh("%s run --trace %s %s --out %s", B, DEMO, args, dir) == 0, "first run: %s", err);
    CHECK(sh("cp -r %s %s", dir, ref) == 0, "copy");
    /* a failing run with --force (a NaN in the trace) */
    kv_test_write_nan_trace(nan);
    int rc = sh("%s run --trace %s --method exact --out %s --force", B, nan, dir);
    CHECK(rc == 2, "NaN trace: exit %d: %s", rc, err);
    CHECK(same_result(dir, ref), "a failed --force run changed the previous result");
    /* interrupted (SIGTERM) inside the final write, at each phase */
    const char *phases[] = {"results-summary", "results-written"};
    for (int i = 0; i < 2; i++) {
        rc = sh("KVBENCH_TEST_RAISE=%s %s run --trace %s --method exact --max-steps 3 --device cpu --quiet --out %s "
                "--force", phases[i], B, DEMO, dir);
        CHECK(rc == 128 + 15 || rc == 128, "%s: exit %d, want death by SIGTERM: %s", phases[i], rc, err);
        CHECK(same_result(dir, ref), "%s: the previous result changed", phases[i]);
        CHECK(count_entries(w, ".tmp.") == 0 && count_entries(w, ".old.") == 0, "%s: temporary directory left",
              phases[i]);
    }
    /* interrupted right after the swap: the new result is in place, the old one removed */
    rc = sh("KVBENCH_TEST_RAISE=results-swapped %s run --trace %s --method exact --max-steps 3 --device cpu --quiet "
            "--out %s --force", B, DEMO, dir);
    CHECK(rc == 128 + 15 || rc == 128, "results-swapped: exit %d", rc);
    char p[900];
    snprintf(p, sizeof p, "%s/summary.json", dir);
    char *s = kv_test_read_file(p, NULL);
    CHECK(s && strstr(s, "\"method\": \"exact\""), "after the swap: %.200s", s ? s : "(none)");
    free(s);
    CHECK(count_entries(w, ".tmp.") == 0 && count_entries(w, ".old.") == 0, "results-swapped: temporary left");
    /* and an uninterrupted --force replaces it */
    CHECK(sh("%s run --trace %s %s --out %s --force", B, DEMO, args, dir) == 0, "--force: %s", err);
    snprintf(p, sizeof p, "%s/summary.json", dir);
    s = kv_test_read_file(p, NULL);
    CHECK(s && strstr(s, "\"method\": \"streaming\"") && !strstr(s, "\"method\": \"exact\""), "--force result");
    free(s);
    CHECK(count_entries(w, ".tmp.") == 0 && count_entries(w, ".old.") == 0, "temporary left after --force");
    return KV_TEST_PASS;
}

/* synth interrupted: its temp file is removed, on SIGINT from outside while
 * it writes and on SIGTERM right after the file is created. */
int test_synth_signal_cleanup(void) {
    const char *B = kv_test_bin(), *w = fresh("synthsig");
    char path[800];
    snprintf(path, sizeof path, "%s/big.h5", w);
    int rc = sh("KVBENCH_TEST_RAISE=trace-created %s synth --out %s --tokens 300 --q-heads 2 --kv-heads 1 --dim 16",
                B, path);
    CHECK(rc == 128 + 15 || rc == 128, "hook: exit %d", rc);
    CHECK(!exists(path) && count_entries(w, ".tmp.") == 0, "SIGTERM at creation left a file");
    /* about 1.5 GB to write: interrupted as soon as its temp file appears */
    /* A background job of a non-interactive shell starts with SIGINT ignored
     * (and kvbench keeps an inherited "ignore", as nohup expects): env
     * --default-signal gives it the default action back, as a terminal has. */
    int has_env = sh("env --default-signal=INT true") == 0;
    const char *sig = has_env ? "INT" : "TERM";
    rc = sh("%s %s synth --out %s --tokens 4000000 --q-heads 2 --kv-heads 1 --dim 64 & pid=$!; "
            "for i in $(seq 1 200); do ls %s/big.h5.tmp.* >/dev/null 2>&1 && break; sleep 0.05; done; "
            "kill -%s $pid; wait $pid", has_env ? "env --default-signal=INT" : "", B, path, w, sig);
    CHECK(rc == 128 + (has_env ? 2 : 15), "SIG%s: exit %d, want death by the signal: %s", sig, rc, err);
    CHECK(!exists(path) && count_entries(w, ".tmp.") == 0, "SIG%s left the temp file", sig);
    return KV_TEST_PASS;
}

/* Non-UTF-8 bytes and control characters in a trace's strings: summary.json
 * stays valid JSON (python3 -m json.tool), invalid bytes as U+FFFD. */
int test_results_json_non_utf8(void) {
    const char *B = kv_test_bin(), *w = fresh("utf8");
    char tr[800], dir[800], p[1000];
    snprintf(tr, sizeof tr, "%s/t.h5", w);
    snprintf(dir, sizeof dir, "%s/r", w);
    CHECK_OK(write_trace(tr, "bad \xff\xfe bytes, \xc3\x28 an invalid pair, \xed\xa0\x80 a surrogate, tab\there, "
                             "ok \xc3\xa9 \xe2\x82\xac \"quoted\" back\\slash \x7f", 0.25f, 1.0f));
    CHECK(sh("%s run --trace %s --method exact --max-steps 3 --device cpu --out %s --quiet", B, tr, dir) == 0, "run: %s",
          err);
    snprintf(p, sizeof p, "%s/summary.json", dir);
    if (sh("command -v python3") != 0) { kv_test_skip_reason("no python3"); return KV_TEST_SKIP; }
    int rc = sh("python3 -m json.tool %s", p);
    CHECK(rc == 0, "summary.json is not valid JSON: %s", err);
    char py[800];
    snprintf(py, sizeof py, "%s/check.py", w);
    FILE *f = fopen(py, "w");
    CHECK(f, "create %s", py);
    fputs("import json, sys\n"
          "d = json.load(open(sys.argv[1]))['trace']['description']\n"
          "want = ['bad \\ufffd\\ufffd bytes, \\ufffd( an invalid pair, \\ufffd\\ufffd\\ufffd a surrogate, tab\\there, ',\n"
          "        'ok \\u00e9 \\u20ac \"quoted\" back\\\\slash \\x7f']\n"
          "sys.exit(0 if d == ''.join(want) else print(repr(d)) or 1)\n", f);
    fclose(f);
    rc = sh("python3 %s %s", py, p);
    CHECK(rc == 0, "description not as expected: %s %s", out, err);
    return KV_TEST_PASS;
}

/* q and k values whose products overflow float32 (1e20 each), or an absurd
 * softmax_scale: exact's scores are not finite. That is an input error
 * naming the layer, head, step and position (it used to drop rows and give
 * exact a recall below 1). */
int test_cli_nonfinite_scores(void) {
    const char *B = kv_test_bin(), *w = fresh("nonfinite");
    char tr[800], dir[800];
    snprintf(tr, sizeof tr, "%s/big.h5", w);
    snprintf(dir, sizeof dir, "%s/r", w);
    CHECK_OK(write_trace(tr, "", 0.25f, 1e20f));
    int rc = sh("%s run --trace %s --method exact --device cpu --out %s", B, tr, dir);
    CHECK(rc == 2 && strstr(err, "layer L0, query head ") && strstr(err, "the attention score of key position ") &&
          strstr(err, "is not finite"), "1e20 values: exit %d: %s", rc, err);
    CHECK(!exists(dir), "a failed run left results");
    snprintf(tr, sizeof tr, "%s/scale.h5", w);
    CHECK_OK(write_trace(tr, "", 1e38f, 1.0f));
    rc = sh("%s run --trace %s --method exact --device cpu --out %s", B, tr, dir);
    CHECK(rc == 2 && (strstr(err, "is not finite") || strstr(err, "softmax_scale")), "scale 1e38: exit %d: %s", rc, err);
    return KV_TEST_PASS;
}

/* The oracle itself: a synthetic layer with one key of +-1e20 (kv head 0,
 * position 40) met by a query of 1e20 (head 0): the score overflows to
 * +inf, or to -inf (which leaves the softmax max and sum finite, so the GPU
 * path must find it another way). The error names head 0, the step and
 * position 40; a step before 40 is fine. The GPU oracle must report the same. */
static int oracle_nonfinite(int use_gpu) {
    for (int sign = 1; sign >= -1; sign -= 2) {
        kv_layer L;
        CHECK_OK(kv_test_synth_layer(64, 32, 2, 1, 64, 9, &L));
        L.k[(size_t)40 * L.D] = sign * 1e20f;
        float *q = malloc((size_t)L.Hq * L.D * sizeof(float));
        for (int h = 0; h < L.Hq; h++) memcpy(q + (size_t)h * L.D, L.q + ((size_t)h * L.T + 50) * L.D, L.D * sizeof(float));
        q[0] = 1e20f;
        kv_oracle *o;
        kv_oracle_out res;
        CHECK_OK(kv_oracle_create(&L, 0.125f, 4, 4, 8, 32, use_gpu, &o));
        kv_oracle_set_context(o, "hand.h5", "L7");
        kv_status st = kv_oracle_step(o, 50, q, &res);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", kv_last_error());
        kv_status st2 = kv_oracle_step(o, 39, q, &res);
        kv_oracle_destroy(o);
        kv_layer_free(&L);
        free(q);
        CHECK(st == KV_ERR_INPUT, "sign %d: status %d: %s", sign, (int)st, msg);
        CHECK(strstr(msg, "hand.h5: layer L7, query head 0, step 50: the attention score of key position 40 is "),
              "message: %s", msg);
        CHECK(strstr(msg, sign > 0 ? " is inf " : " is -inf "), "message: %s", msg);
        CHECK(st2 == KV_OK, "step 39 (before position 40): %s", kv_last_error());
    }
    return KV_TEST_PASS;
}

int test_oracle_nonfinite_scores(void) { return oracle_nonfinite(0); }
int test_gpu_oracle_nonfinite_scores(void) { return oracle_nonfinite(1); }
