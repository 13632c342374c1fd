/* results.c: aggregation of the raw per-(step, head) metrics into overall
 * and per-window statistics (README, "Result files"), and all-or-nothing
 * writing: everything goes to "<dir>.tmp.<pid>" which takes <dir>'s place
 * by one rename only once every file is complete, so a failed or
 * interrupted run leaves no partial results and the previous ones intact
 * (see results.h for the --force rule and the swap). */
#define _GNU_SOURCE /* renameat2 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../datasets/kv_cleanup.h"
#include "results.h"

kv_status kv_rows_push(kv_method_run *r, const kv_step_metric *rows, int n) {
    if (r->n_rows + (size_t)n > r->cap_rows) {
        size_t cap = r->cap_rows ? 2 * r->cap_rows : 4096;
        while (cap < r->n_rows + (size_t)n) cap *= 2;
        kv_step_metric *p = realloc(r->rows, cap * sizeof *p);
        if (!p) return kv_fail(KV_ERR_NOMEM, "out of host memory for %zu metric rows", cap);
        r->rows = p;
        r->cap_rows = cap;
    }
    memcpy(r->rows + r->n_rows, rows, (size_t)n * sizeof *rows);
    r->n_rows += (size_t)n;
    return KV_OK;
}

typedef struct { double recall, mass, outerr, recall_p10, mass_p10, outerr_p90, recall_pre, recall_gen, gen_share, metric; } window_stats;

/* Mean of a float member over rows[lo, hi), skipping NANs; NAN if none. */
static double nanmean(const kv_step_metric *rows, size_t lo, size_t hi, size_t off) {
    double s = 0;
    size_t n = 0;
    for (size_t i = lo; i < hi; i++) {
        float x = *(const float *)((const char *)&rows[i] + off);
        if (!isnan(x)) { s += x; n++; }
    }
    return n ? s / n : NAN;
}

/* Means and percentiles over rows[lo, hi); scratch holds hi-lo floats. */
static void stats(const kv_step_metric *rows, size_t lo, size_t hi, float *scratch, window_stats *w) {
    size_t n = hi - lo;
    w->recall = nanmean(rows, lo, hi, offsetof(kv_step_metric, recall));
    w->mass = nanmean(rows, lo, hi, offsetof(kv_step_metric, mass));
    w->outerr = nanmean(rows, lo, hi, offsetof(kv_step_metric, outerr));
    w->recall_pre = nanmean(rows, lo, hi, offsetof(kv_step_metric, recall_pre));
    w->recall_gen = nanmean(rows, lo, hi, offsetof(kv_step_metric, recall_gen));
    w->gen_share = nanmean(rows, lo, hi, offsetof(kv_step_metric, gen_share));
    w->metric = nanmean(rows, lo, hi, offsetof(kv_step_metric, metric));
    for (size_t i = lo; i < hi; i++) scratch[i - lo] = rows[i].recall;
    w->recall_p10 = kv_percentile_inplace(scratch, n, 0.10);
    for (size_t i = lo; i < hi; i++) scratch[i - lo] = rows[i].mass;
    w->mass_p10 = kv_percentile_inplace(scratch, n, 0.10);
    size_t m = 0;
    for (size_t i = lo; i < hi; i++) if (!isnan(rows[i].outerr)) scratch[m++] = rows[i].outerr;
    w->outerr_p90 = m ? kv_percentile_inplace(scratch, m, 0.90) : NAN;
}

void kv_overall_compute(const kv_method_run *r, kv_overall *o) {
    memset(o, 0, sizeof *o);
    size_t n = r->n_rows, nc = 0;
    double cr = 0;
    for (size_t i = 0; i < n; i++) {
        o->recall_sel += r->rows[i].recall_sel;
        o->n_sel += r->rows[i].n_sel;
        o->n_extra += r->rows[i].n_extra;
        if (!isnan(r->rows[i].cand_recall)) { cr += r->rows[i].cand_recall; nc++; }
    }
    o->n = n;
    o->recall_sel = n ? o->recall_sel / n : NAN;
    o->n_sel = n ? o->n_sel / n : NAN;
    o->n_extra = n ? o->n_extra / n : NAN;
    o->cand_recall = nc ? cr / nc : NAN;
    float *scratch = malloc((n ? n : 1) * sizeof(float) + r->n_steps * sizeof(float) + 8);
    if (!scratch) { o->recall = NAN; return; }
    window_stats w;
    stats(r->rows, 0, n, scratch, &w);
    o->recall = w.recall; o->mass = w.mass; o->outerr = w.outerr;
    o->recall_pre = w.recall_pre; o->recall_gen = w.recall_gen; o->gen_share = w.gen_share; o->metric = w.metric;
    o->recall_p10 = w.recall_p10; o->mass_p10 = w.mass_p10; o->outerr_p90 = w.outerr_p90;
    for (int i = 0; i < r->n_steps; i++) scratch[i] = (float)(r->search_s[i] * 1e6);
    o->search_p90_us = kv_percentile_inplace(scratch, (size_t)r->n_steps, 0.90);
    o->search_med_us = kv_percentile_inplace(scratch, (size_t)r->n_steps, 0.50);
    free(scratch);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes at s
 * are not one (RFC 3629: no overlongs, no surrogates, at most U+10FFFF). */
static int utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!n) return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    if (c == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* above U+10FFFF */
    return n;
}

/* A JSON string: quotes, backslashes and control characters escaped, valid
 * UTF-8 copied, and every byte that is not part of valid UTF-8 (a trace's
 * string attribute may hold any bytes) written as U+FFFD, so the file is
 * always valid JSON (RFC 8259 requires UTF-8). */
static void json_str(FILE *f, const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    while (*s) {
        unsigned c = *s;
        int n = utf8_len(s);
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else if (n == 0) { fputs("\\ufffd", f); n = 1; }
        else fwrite(s, 1, (size_t)n, f);
        s += n ? n : 1;
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isnan(x) || isinf(x)) fputs("null", f);
    else fprintf(f, "%.6g", x);
}

/* Opens an in-memory stream (open_memstream) for one rendered part. */
static kv_status mem_open(FILE **f, char **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    *f = open_memstream(buf, n);
    return *f ? KV_OK : kv_fail(KV_ERR_NOMEM, "out of host memory for the rendered results");
}

kv_status kv_results_begin(kv_results_acc *acc) {
    memset(acc, 0, sizeof *acc);
    KV_TRY(mem_open(&acc->f_methods, &acc->methods, &acc->n_methods));
    KV_TRY(mem_open(&acc->f_profile, &acc->profile, &acc->n_profile));
    KV_TRY(mem_open(&acc->f_drift, &acc->drift, &acc->n_drift));
    KV_TRY(mem_open(&acc->f_prof_csv, &acc->prof_csv, &acc->n_prof_csv));
    KV_TRY(mem_open(&acc->f_table, &acc->table, &acc->n_table));
    acc->steps = tmpfile();
    return acc->steps ? KV_OK : kv_fail(KV_ERR_IO, "cannot create a temporary file for steps.csv: %s", strerror(errno));
}

void kv_results_end(kv_results_acc *acc) {
    FILE **fs[] = {&acc->f_methods, &acc->f_profile, &acc->f_drift, &acc->f_prof_csv, &acc->f_table, &acc->steps};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        if (*fs[i]) { fclose(*fs[i]); *fs[i] = NULL; }
    free(acc->methods); free(acc->profile); free(acc->drift); free(acc->prof_csv); free(acc->table);
    memset(acc, 0, sizeof *acc);
}

kv_status kv_profile_push(kv_profile_rows *pr, int t, const int *budget) {
    if (pr->n == pr->cap) {
        int cap = pr->cap ? 2 * pr->cap : 1024;
        int *s = realloc(pr->step, (size_t)cap * sizeof(int));
        if (s) pr->step = s;
        int *b = s ? realloc(pr->budget, (size_t)cap * pr->Hq * KV_NPROFILE * sizeof(int)) : NULL;
        if (!b) return kv_fail(KV_ERR_NOMEM, "out of host memory for %d budget profile rows", cap);
        pr->budget = b;
        pr->cap = cap;
    }
    pr->step[pr->n] = t;
    memcpy(pr->budget + (size_t)pr->n * pr->Hq * KV_NPROFILE, budget, (size_t)pr->Hq * KV_NPROFILE * sizeof(int));
    pr->n++;
    return KV_OK;
}

void kv_profile_free(kv_profile_rows *pr) {
    free(pr->step);
    free(pr->budget);
    memset(pr, 0, sizeof *pr);
}

/* Over steps [lo, hi) of pr: mean, p10, median, p90 of the tokens needed
 * for target p, and the mean region size; scratch holds (hi-lo)*Hq floats. */
typedef struct { double mean, p10, p50, p90, region; size_t n; } prof_stats;
static void prof_window(const kv_profile_rows *pr, int lo, int hi, int p, int sink, int local, float *scratch,
                        prof_stats *o) {
    size_t n = 0;
    double s = 0, reg = 0;
    for (int i = lo; i < hi; i++) {
        reg += pr->step[i] + 1 - local - sink;
        for (int h = 0; h < pr->Hq; h++) {
            int b = pr->budget[((size_t)i * pr->Hq + h) * KV_NPROFILE + p];
            scratch[n++] = (float)b;
            s += b;
        }
    }
    o->n = n;
    o->mean = n ? s / n : NAN;
    o->region = hi > lo ? reg / (hi - lo) : NAN;
    o->p10 = kv_percentile_inplace(scratch, n, 0.10);
    o->p50 = kv_percentile_inplace(scratch, n, 0.50);
    o->p90 = kv_percentile_inplace(scratch, n, 0.90);
}

static void render_profile(kv_results_acc *acc, const kv_run_meta *mt, const kv_profile_rows *pr) {
    float *scratch = malloc(((size_t)pr->n * pr->Hq + 1) * sizeof(float));
    if (!scratch) return;
    int P = mt->info->prefill_len;
    FILE *f = acc->f_profile;
    fprintf(f, "%s    {\"layer\": ", acc->profiles++ ? ",\n" : "");
    json_str(f, mt->layer);
    fprintf(f, ", \"p\": [0.5, 0.8, 0.9, 0.95, 0.99]");
    const char *names[4] = {"tokens_mean", "tokens_p10", "tokens_median", "tokens_p90"};
    prof_stats st[KV_NPROFILE];
    for (int p = 0; p < KV_NPROFILE; p++) prof_window(pr, 0, pr->n, p, mt->sink, mt->local, scratch, &st[p]);
    for (int j = 0; j < 4; j++) {
        fprintf(f, ", \"%s\": [", names[j]);
        for (int p = 0; p < KV_NPROFILE; p++) {
            double x = j == 0 ? st[p].mean : j == 1 ? st[p].p10 : j == 2 ? st[p].p50 : st[p].p90;
            if (p) fputs(", ", f);
            json_num(f, x);
        }
        fputc(']', f);
    }
    fprintf(f, ", \"region_mean\": ");
    json_num(f, st[0].region);
    fprintf(f, ", \"rows\": %zu}", st[0].n);
    for (int lo = 0; lo < pr->n;) {
        int w = (pr->step[lo] - P) / mt->window, hi = lo;
        while (hi < pr->n && (pr->step[hi] - P) / mt->window == w) hi++;
        for (int p = 0; p < KV_NPROFILE; p++) {
            prof_stats s;
            prof_window(pr, lo, hi, p, mt->sink, mt->local, scratch, &s);
            fprintf(acc->f_prof_csv, "%s,%d,%lld,%lld,%g,%.3f,%.1f,%.1f,%.1f,%.1f,%zu\n", mt->layer, w,
                    P + (long long)w * mt->window, P + (long long)(w + 1) * mt->window, kv_profile_p[p], s.mean, s.p10,
                    s.p50, s.p90, s.region, s.n);
        }
        lo = hi;
    }
    free(scratch);
}

void kv_profile_print(FILE *f, const char *layer, const kv_profile_rows *pr, int P, int window, int sink, int local) {
    float *scratch = malloc(((size_t)pr->n * pr->Hq + 1) * sizeof(float));
    if (!scratch) return;
    fprintf(f, "budget profile, layer %s: region tokens needed (with sink %d + local %d) for attention mass p; "
               "mean (median) over steps x query heads\n", layer, sink, local);
    fprintf(f, "  %-16s %9s", "steps", "region");
    for (int p = 0; p < KV_NPROFILE; p++) fprintf(f, "  p=%-12g", kv_profile_p[p]);
    fputc('\n', f);
    for (int pass = 0; pass < 2; pass++)
        for (int lo = 0; lo < pr->n;) {
            int w = (pr->step[lo] - P) / window, hi = lo;
            while (hi < pr->n && (pass == 0 || (pr->step[hi] - P) / window == w)) hi++;
            char span[40];
            if (pass == 0) snprintf(span, sizeof span, "all");
            else snprintf(span, sizeof span, "%d-%d", P + w * window, P + (w + 1) * window);
            prof_stats s;
            prof_window(pr, lo, hi, 0, sink, local, scratch, &s);
            fprintf(f, "  %-16s %9.0f", span, s.region);
            for (int p = 0; p < KV_NPROFILE; p++) {
                prof_window(pr, lo, hi, p, sink, local, scratch, &s);
                char cell[40];
                snprintf(cell, sizeof cell, "%.1f (%.0f)", s.mean, s.p50);
                fprintf(f, "  %-14s", cell);
            }
            fputc('\n', f);
            lo = hi;
        }
    free(scratch);
}

static void render_method(kv_results_acc *acc, const kv_run_meta *mt, const kv_method_run *r) {
    const kv_trace_info *in = mt->info;
    FILE *f = acc->f_methods;
    kv_overall o;
    kv_overall_compute(r, &o);
    fprintf(f, "%s    {\"method\": \"%s\", \"params\": ", acc->entries++ ? ",\n" : "", r->m->name);
    json_str(f, r->params);
    fprintf(f, ", \"layer\": ");
    json_str(f, r->layer);
    fprintf(f, ", \"k\": %d, \"k_effective\": %d, \"seed\": %llu, \"seeded\": %s,\n", r->k, r->k_eff,
            (unsigned long long)r->seed, r->seeded ? "true" : "false");
    fprintf(f, "     \"device\": \"%s\", \"per_kv_head\": %s, \"variable_budget\": %s,\n", r->on_gpu ? "gpu" : "cpu",
            kv_method_group_consistent(r->m, &r->ps) ? "true" : "false", r->m->variable_budget ? "true" : "false");
    fprintf(f, "     \"recall\": "); json_num(f, o.recall);
    fprintf(f, ", \"recall_p10\": "); json_num(f, o.recall_p10);
    fprintf(f, ", \"recall_selected\": "); json_num(f, o.recall_sel);
    fprintf(f, ", \"candidate_recall\": "); json_num(f, o.cand_recall);
    fprintf(f, ",\n     \"recall_prefill_keys\": "); json_num(f, o.recall_pre);
    fprintf(f, ", \"recall_generated_keys\": "); json_num(f, o.recall_gen);
    fprintf(f, ", \"generated_share_of_topk\": "); json_num(f, o.gen_share);
    fprintf(f, ", \"mass\": "); json_num(f, o.mass);
    fprintf(f, ", \"mass_p10\": "); json_num(f, o.mass_p10);
    fprintf(f, ", \"output_error\": "); json_num(f, o.outerr);
    fprintf(f, ", \"output_error_p90\": "); json_num(f, o.outerr_p90);
    fprintf(f, ",\n     \"mean_selected\": "); json_num(f, o.n_sel);
    fprintf(f, ", \"mean_extra\": "); json_num(f, o.n_extra);
    fprintf(f, ", \"index_bytes\": %zu, \"index_bytes_per_token\": ", r->index_bytes);
    json_num(f, (double)r->index_bytes / (double)(in->num_tokens * (double)in->num_kv_heads));
    fprintf(f, ", \"build_seconds\": "); json_num(f, r->build_s);
    fprintf(f, ", \"append_seconds_total\": "); json_num(f, r->append_s);
    fprintf(f, ", \"search_us_median\": "); json_num(f, o.search_med_us);
    fprintf(f, ", \"search_us_p90\": "); json_num(f, o.search_p90_us);
    fprintf(f, ", \"search_seconds_total\": "); json_num(f, r->search_total_s);
    fprintf(f, ", \"search_timer\": \"%s\"", r->search_dev ? "device" : "host");
    fprintf(f, ", \"diagnostics_seconds_total\": "); json_num(f, r->diag_s);
    fprintf(f, ", \"method_metric_name\": ");
    if (r->m->metric_name) json_str(f, r->m->metric_name); else fputs("null", f);
    fprintf(f, ", \"method_metric\": "); json_num(f, o.metric);
    fprintf(f, ", \"rows\": %zu}", o.n);
}

const char *const kv_phase_names[KV_NPHASES] = {"load", "build", "append", "oracle", "search", "diagnostics",
                                                  "methods_wall", "bookkeeping", "output"};

void kv_phases_print(FILE *f, const kv_run_meta *mt) {
    fprintf(f, "phases (s, host timers; wall %.3f):", mt->wall_s);
    for (int i = 0; i < KV_NPHASES; i++) fprintf(f, " %s %.3f", kv_phase_names[i], mt->phase_s[i]);
    fprintf(f, "%s\n", mt->parallel_methods ? " (methods in parallel: search and diagnostics are thread-seconds, "
                                               "methods_wall their wall)" : "");
}

static void render_drift(kv_results_acc *acc, const kv_run_meta *mt, const kv_method_run *r) {
    FILE *f = acc->f_drift;
    int P = mt->info->prefill_len;
    float *scratch = malloc((r->n_rows ? r->n_rows : 1) * sizeof(float));
    if (!scratch) return;
    for (size_t lo = 0; lo < r->n_rows;) {
        int w = (r->rows[lo].step - P) / mt->window;
        size_t hi = lo;
        while (hi < r->n_rows && (r->rows[hi].step - P) / mt->window == w) hi++;
        window_stats s;
        stats(r->rows, lo, hi, scratch, &s);
        fprintf(f, "%s,\"%s\",%s,%d,%llu,%d,%lld,%lld,%.6f,%.6f,%.6f,%.6f,", r->m->name, r->params, r->layer, r->k,
                (unsigned long long)r->seed, w, P + (long long)w * mt->window, P + (long long)(w + 1) * mt->window,
                s.recall, s.recall_p10, s.mass, s.mass_p10);
        if (isnan(s.outerr)) fprintf(f, ",,");
        else fprintf(f, "%.6f,%.6f,", s.outerr, s.outerr_p90);
        double by[3] = {s.recall_pre, s.recall_gen, s.gen_share};
        for (int b = 0; b < 3; b++)
            if (isnan(by[b])) fputc(',', f); else fprintf(f, "%.6f,", by[b]);
        fprintf(f, "%zu,", hi - lo);
        if (isnan(s.metric)) fputc('\n', f); else fprintf(f, "%.6f\n", s.metric);
        lo = hi;
    }
    free(scratch);
}

/* steps.csv rows of run r into f (one row per step and head). */
static void steps_rows(FILE *f, const kv_method_run *r) {
    for (size_t j = 0; j < r->n_rows; j++) {
        const kv_step_metric *m = &r->rows[j];
        fprintf(f, "%s,%s,%d,%llu,%d,%d,%.6f,%.6f,", r->m->name, r->layer, r->k, (unsigned long long)r->seed, m->step,
                m->head, m->recall, m->recall_sel);
        if (isnan(m->cand_recall)) fputc(',', f); else fprintf(f, "%.6f,", m->cand_recall);
        fprintf(f, "%.6f,", m->mass);
        if (isnan(m->outerr)) fputc(',', f); else fprintf(f, "%.6g,", m->outerr);
        fprintf(f, "%d,%d,", m->n_sel, m->n_extra);
        if (isnan(m->recall_pre)) fputc(',', f); else fprintf(f, "%.6f,", m->recall_pre);
        if (isnan(m->recall_gen)) fputc(',', f); else fprintf(f, "%.6f,", m->recall_gen);
        if (isnan(m->metric)) fputc('\n', f); else fprintf(f, "%.6g\n", m->metric);
    }
}

/* steps.csv is most of a run's output bytes (a row per step, head and
 * method: 15 MB for the demo), and formatting it was 12% of make demo's
 * wall (issue 12, goal 5): the runs are formatted in parallel, each into
 * its own memory stream, and appended in run order, so the file is the
 * same bytes as one sequential pass. */
static kv_status render_steps(kv_results_acc *acc, const kv_method_run *runs, int n_runs) {
    char **buf = calloc((size_t)n_runs, sizeof *buf);
    size_t *len = calloc((size_t)n_runs, sizeof *len);
    int bad = !buf || !len;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad) if (!bad && n_runs > 1)
    for (int i = 0; i < n_runs; i++) {
        FILE *f = open_memstream(&buf[i], &len[i]);
        if (!f) { bad = 1; continue; }
        steps_rows(f, &runs[i]);
        bad |= fclose(f) != 0;
    }
    for (int i = 0; i < n_runs && !bad; i++) bad |= len[i] && fwrite(buf[i], 1, len[i], acc->steps) != len[i];
    for (int i = 0; buf && i < n_runs; i++) free(buf[i]);
    free(buf);
    free(len);
    return bad ? kv_fail(KV_ERR_IO, "rendering steps.csv failed (out of memory or disk)") : KV_OK;
}

/* The printed table: one line per (layer, k, method), seeded methods as
 * the mean over their seeds with the standard deviation beside it. */
static void render_table(kv_results_acc *acc, const kv_run_meta *mt, const kv_method_run *runs, int n_runs) {
    FILE *f = acc->f_table;
    int sd = mt->seeds > 1;
    for (int i = 0; i < n_runs; i++) {
        const kv_method_run *r = &runs[i];
        int first = 1;
        for (int j = 0; j < i; j++) first &= !(runs[j].m == r->m && runs[j].k == r->k);
        if (!first) continue;
        /* columns: recall, p10, sel, pre, gen, mass, out_err, budget, extra, search_us; sd of recall, mass, err */
        double sum[10] = {0}, sq[10] = {0}, cnt = 0;
        for (int j = i; j < n_runs; j++) {
            if (runs[j].m != r->m || runs[j].k != r->k) continue;
            kv_overall o;
            kv_overall_compute(&runs[j], &o);
            double v[10] = {o.recall, o.recall_p10, o.recall_sel, o.recall_pre, o.recall_gen, o.mass, o.outerr,
                            o.n_sel, o.n_extra, o.search_med_us};
            for (int x = 0; x < 10; x++) { sum[x] += v[x]; sq[x] += v[x] * v[x]; }
            cnt++;
        }
        double mean[10], dev[10];
        for (int x = 0; x < 10; x++) {
            mean[x] = sum[x] / cnt;
            double var = cnt > 1 ? (sq[x] - cnt * mean[x] * mean[x]) / (cnt - 1) : 0;
            dev[x] = var > 0 ? sqrt(var) : 0;
        }
        fprintf(f, "%-12s %6s %6d %8.4f", r->m->name, r->layer, r->k, mean[0]);
        if (sd) fprintf(f, " %7.4f", dev[0]);
        fprintf(f, " %8.4f %8.4f %8.4f %8.4f %8.4f", mean[1], mean[2], mean[3], mean[4], mean[5]);
        if (sd) fprintf(f, " %7.4f", dev[5]);
        fprintf(f, " %8.4f", mean[6]);
        if (sd) fprintf(f, " %7.4f", dev[6]);
        fprintf(f, " %8.1f %8.1f %10.1f %10.2f", mean[7], mean[8], mean[9], r->index_bytes / 1e6);
        if (sd && !r->seeded) fprintf(f, "  (not seeded)");
        fputc('\n', f);
    }
}

kv_status kv_results_add(kv_results_acc *acc, const kv_run_meta *mt, const kv_method_run *runs, int n_runs,
                         const kv_profile_rows *pr) {
    for (int i = 0; i < n_runs; i++) {
        render_method(acc, mt, &runs[i]);
        render_drift(acc, mt, &runs[i]);
    }
    kv_status st = render_steps(acc, runs, n_runs);
    if (st != KV_OK) return st;
    render_table(acc, mt, runs, n_runs);
    if (pr && pr->n) render_profile(acc, mt, pr);
    FILE *fs[] = {acc->f_methods, acc->f_profile, acc->f_drift, acc->f_prof_csv, acc->f_table, acc->steps};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        if (fflush(fs[i]) != 0 || ferror(fs[i])) return kv_fail(KV_ERR_IO, "rendering the results failed (out of memory or disk)");
    return KV_OK;
}

static kv_status write_summary(const char *path, const kv_run_meta *mt, kv_results_acc *acc) {
    FILE *f = fopen(path, "w");
    if (!f) return kv_fail(KV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const kv_trace_info *in = mt->info;
    fprintf(f, "{\n  \"kvbench_version\": \"%s\",\n  \"git_sha\": ", KVBENCH_VERSION);
    json_str(f, kv_git_sha());
    fprintf(f, ",\n  \"command\": ");
    json_str(f, mt->cmdline);
    fprintf(f, ",\n  \"started\": ");
    json_str(f, mt->started);
    fprintf(f, ",\n  \"wall_seconds\": %.3f,\n", mt->wall_s);
    fprintf(f, "  \"phase_seconds\": {");
    for (int i = 0; i < KV_NPHASES; i++) fprintf(f, "%s\"%s\": %.4f", i ? ", " : "", kv_phase_names[i], mt->phase_s[i]);
    fprintf(f, ", \"parallel_methods\": %s},\n", mt->parallel_methods ? "true" : "false");
    fprintf(f, "  \"device\": {\"kind\": \"%s\", \"name\": ", mt->use_gpu ? "gpu" : "cpu");
    json_str(f, mt->use_gpu ? mt->gpu.name : "host CPU");
    fprintf(f, ", \"driver_version\": %d, \"runtime_version\": %d},\n", mt->gpu.driver_version, mt->gpu.runtime_version);
    fprintf(f, "  \"host\": {\"cpu_threads\": %d, \"cores\": %d, \"omp_wait_policy\": ", mt->host.threads, mt->host.cores);
    json_str(f, mt->host.wait_policy);
    fprintf(f, ", \"load_average_at_start\": [");
    for (int i = 0; i < 3; i++) {
        if (i) fputs(", ", f);
        json_num(f, mt->host.load[i] < 0 ? NAN : mt->host.load[i]);
    }
    fprintf(f, "]},\n");
    fprintf(f, "  \"trace\": {\"path\": ");
    json_str(f, in->path);
    fprintf(f, ", \"model\": ");
    json_str(f, in->model);
    fprintf(f, ", \"description\": ");
    json_str(f, in->description);
    fprintf(f, ", \"layer\": ");
    json_str(f, mt->layer);
    fprintf(f, ", \"layers\": ");
    json_str(f, mt->layers ? mt->layers : mt->layer);
    fprintf(f, ", \"num_tokens\": %d, \"prefill_len\": %d, \"num_q_heads\": %d, \"num_kv_heads\": %d, "
               "\"head_dim\": %d, \"softmax_scale\": %g, \"rope\": ",
            in->num_tokens, in->prefill_len, in->num_q_heads, in->num_kv_heads, in->head_dim, in->softmax_scale);
    json_str(f, in->rope);
    fprintf(f, "},\n");
    fprintf(f, "  \"protocol\": {\"k\": %d, \"k_effective\": %d, \"ks\": [", mt->k, mt->k_effective);
    for (int i = 0; i < mt->nk; i++) fprintf(f, "%s%d", i ? ", " : "", mt->ks[i]);
    fprintf(f, "], \"sink\": %d, \"local\": %d, \"stride\": %d, \"max_steps\": %d, "
               "\"window\": %d, \"seed\": %llu, \"seeds\": %d, \"lag\": %d, \"steps_evaluated\": %d, \"steps_skipped_empty_region\": %d},\n",
            mt->sink, mt->local, mt->stride, mt->max_steps, mt->window, (unsigned long long)mt->seed, mt->seeds, mt->lag,
            mt->steps_evaluated, mt->steps_skipped);
    fprintf(f, "  \"budget_profile\": [\n");
    fwrite(acc->profile, 1, acc->n_profile, f);
    fprintf(f, "%s  ],\n", acc->profiles ? "\n" : "");
    fprintf(f, "  \"methods\": [\n");
    fwrite(acc->methods, 1, acc->n_methods, f);
    fprintf(f, "%s  ]\n}\n", acc->entries ? "\n" : "");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return kv_fail(KV_ERR_IO, "%s: write failed", path);
    return KV_OK;
}

static kv_status write_text(const char *path, const char *header, const char *body, size_t n, FILE *from) {
    FILE *f = fopen(path, "w");
    if (!f) return kv_fail(KV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    fputs(header, f);
    if (body) fwrite(body, 1, n, f);
    if (from) {
        rewind(from);
        char buf[1 << 16];
        for (size_t got; (got = fread(buf, 1, sizeof buf, from)) > 0;) fwrite(buf, 1, got, f);
        if (ferror(from)) { fclose(f); return kv_fail(KV_ERR_IO, "%s: reading the temporary rows failed", path); }
        fseek(from, 0, SEEK_END);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return kv_fail(KV_ERR_IO, "%s: write failed", path);
    return KV_OK;
}

static const char drift_header[] =
    "method,params,layer,k,seed,window,step_start,step_end,recall_mean,recall_p10,mass_mean,mass_p10,outerr_mean,"
    "outerr_p90,recall_prefill_keys,recall_generated_keys,generated_share,n,method_metric\n";
static const char steps_header[] =
    "method,layer,k,seed,step,head,recall,recall_selected,candidate_recall,mass,outerr,n_selected,n_extra,"
    "recall_prefill_keys,recall_generated_keys,method_metric\n";
static const char profile_header[] =
    "layer,window,step_start,step_end,p,tokens_mean,tokens_p10,tokens_median,tokens_p90,region_mean,n\n";

static const char *const result_files[] = {"summary.json", "drift.csv", "steps.csv", "profile.csv"};
#define N_RESULT_FILES 4
#define SUMMARY_MARK "{\n  \"kvbench_version\": "

/* 1 when dir/summary.json starts with the line kvbench writes first. */
static int has_marker(const char *dir) {
    char *p = kv_strfmt("%s/summary.json", dir);
    FILE *f = p ? fopen(p, "r") : NULL;
    free(p);
    if (!f) return 0;
    char head[sizeof SUMMARY_MARK];
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    head[n] = 0;
    return !strcmp(head, SUMMARY_MARK);
}

kv_status kv_results_check_out(const char *dir, int force) {
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    if (!*dir || !*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return kv_fail(KV_ERR_INPUT, "--out '%s': expected the name of a result directory to create (or, with "
                                     "--force, to replace), found %s%s%s", dir, *base ? "'" : "nothing",
                       base, *base ? "'" : "");
    KV_TRY(kv_check_parent("--out", dir));
    struct stat sb;
    if (lstat(dir, &sb) != 0) return KV_OK;
    if (!force) return kv_fail(KV_ERR_INPUT, "--out %s: already exists (use --force to replace it)", dir);
    if (!S_ISDIR(sb.st_mode))
        return kv_fail(KV_ERR_INPUT, "--out %s: exists and is not a directory; --force replaces only a kvbench "
                                     "result directory", dir);
    DIR *d = opendir(dir);
    if (!d) return kv_fail(KV_ERR_INPUT, "--out %s: cannot read the existing directory: %s", dir, strerror(errno));
    struct dirent *e;
    char foreign[300] = "";
    int n = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        int ours = 0;
        for (int i = 0; i < N_RESULT_FILES; i++) ours |= !strcmp(e->d_name, result_files[i]);
        if (!ours && !foreign[0]) snprintf(foreign, sizeof foreign, "%.280s%s", e->d_name, strlen(e->d_name) > 280 ? "..." : "");
    }
    closedir(d);
    if (n == 0) return KV_OK; /* an empty directory: nothing to lose */
    if (foreign[0])
        return kv_fail(KV_ERR_INPUT, "--out %s: holds '%s', which kvbench did not write; --force replaces only a "
                                     "kvbench result directory (summary.json, drift.csv, steps.csv): choose another "
                                     "--out or move the file", dir, foreign);
    if (!has_marker(dir))
        return kv_fail(KV_ERR_INPUT, "--out %s: not a kvbench result directory (no summary.json written by kvbench); "
                                     "--force replaces only those: choose another --out", dir);
    return KV_OK;
}

typedef struct {
    char *dir;                    /* the directory */
    char *file[N_RESULT_FILES];   /* its result files */
    int id_dir, id_file[N_RESULT_FILES];
} tracked_dir;

/* Registers dir and its result files for removal on a signal. */
static kv_status track(tracked_dir *t, const char *dir) {
    memset(t, 0, sizeof *t);
    t->id_dir = -1;
    for (int i = 0; i < N_RESULT_FILES; i++) t->id_file[i] = -1;
    if (!(t->dir = kv_strfmt("%s", dir))) return KV_ERR_NOMEM;
    for (int i = 0; i < N_RESULT_FILES; i++)
        if (!(t->file[i] = kv_strfmt("%s/%s", dir, result_files[i]))) return KV_ERR_NOMEM;
    if ((t->id_dir = kv_cleanup_add(KV_CLEAN_DIR, t->dir, NULL)) < 0) return KV_ERR_INPUT;
    for (int i = 0; i < N_RESULT_FILES; i++)
        if ((t->id_file[i] = kv_cleanup_add(KV_CLEAN_FILE, t->file[i], NULL)) < 0) return KV_ERR_INPUT;
    return KV_OK;
}

/* Removes the result files and the directory (if that leaves it empty), then forgets them. */
static void untrack(tracked_dir *t, int remove_files) {
    for (int i = 0; i < N_RESULT_FILES; i++) {
        if (remove_files && t->file[i]) unlink(t->file[i]);
        kv_cleanup_remove(t->id_file[i]);
        free(t->file[i]);
    }
    if (remove_files && t->dir) rmdir(t->dir);
    kv_cleanup_remove(t->id_dir);
    free(t->dir);
    memset(t, 0, sizeof *t);
    t->id_dir = -1;
}

/* Puts tmp in place of an existing dir: one atomic exchange where the
 * kernel has it, else dir -> old, tmp -> dir (old put back if the second
 * rename fails, and by the signal handler meanwhile). On success *gone
 * names the directory now holding the previous results. */
static kv_status swap_in(const char *tmp, const char *dir, char **gone) {
    *gone = NULL;
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        *gone = kv_strfmt("%s", tmp);
        return *gone ? KV_OK : KV_ERR_NOMEM;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return kv_fail(KV_ERR_IO, "--out %s: cannot swap %s into place: %s", dir, tmp, strerror(errno));
#endif
    char *old = kv_strfmt("%s.old.%d", dir, (int)getpid());
    if (!old) return KV_ERR_NOMEM;
    int id = kv_cleanup_add(KV_CLEAN_RESTORE, old, dir);
    if (id < 0) { free(old); return KV_ERR_INPUT; }
    if (rename(dir, old) != 0) {
        kv_status st = kv_fail(KV_ERR_IO, "--out %s: cannot move the previous result aside to %s: %s", dir, old,
                               strerror(errno));
        kv_cleanup_remove(id);
        free(old);
        return st;
    }
    kv_cleanup_test_point("results-swap");
    if (rename(tmp, dir) != 0) {
        kv_status st = kv_fail(KV_ERR_IO, "--out %s: cannot rename %s into place: %s", dir, tmp, strerror(errno));
        rename(old, dir);
        kv_cleanup_remove(id);
        free(old);
        return st;
    }
    kv_cleanup_remove(id);
    *gone = old;
    return KV_OK;
}

kv_status kv_results_write(const char *dir, const kv_run_meta *mt, kv_results_acc *acc) {
    kv_cleanup_install();
    char *tmp = kv_strfmt("%s.tmp.%d", dir, (int)getpid());
    if (!tmp) return KV_ERR_NOMEM;
    tracked_dir t, old;
    kv_status st = track(&t, tmp);
    if (st == KV_OK && mkdir(tmp, 0755) != 0)
        st = kv_fail(KV_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
    if (st != KV_OK) {
        untrack(&t, 0); /* not created, or not ours: never removed */
        free(tmp);
        return st;
    }
    st = write_summary(t.file[0], mt, acc);
    kv_cleanup_test_point("results-summary");
    if (st == KV_OK) st = write_text(t.file[1], drift_header, acc->drift, acc->n_drift, NULL);
    if (st == KV_OK) st = write_text(t.file[2], steps_header, NULL, 0, acc->steps);
    if (st == KV_OK) st = write_text(t.file[3], profile_header, acc->prof_csv, acc->n_prof_csv, NULL);
    kv_cleanup_test_point("results-written");
    struct stat sb;
    int replace = st == KV_OK && lstat(dir, &sb) == 0;
    if (replace) st = kv_results_check_out(dir, mt->force); /* still ours to replace? (checked before the run too) */
    if (st == KV_OK && replace) {
        char *gone;
        st = swap_in(tmp, dir, &gone);
        if (st == KV_OK) {
            kv_cleanup_test_point("results-swapped");
            untrack(&t, 0);                  /* tmp's names now hold the old files (exchange) or nothing */
            if (track(&old, gone) == KV_OK) untrack(&old, 1);
            else untrack(&old, 0);
            free(gone);
            free(tmp);
            return KV_OK;
        }
    } else if (st == KV_OK && rename(tmp, dir) != 0)
        st = kv_fail(KV_ERR_IO, "%s: cannot rename %s into place: %s", dir, tmp, strerror(errno));
    untrack(&t, st != KV_OK);
    free(tmp);
    return st;
}

void kv_results_print(FILE *f, const kv_run_meta *mt, kv_results_acc *acc) {
    int sd = mt->seeds > 1;
    fprintf(f, "\n%s  layers %s  T=%d P=%d  k=", mt->info->path, mt->layers ? mt->layers : mt->layer,
            mt->info->num_tokens, mt->info->prefill_len);
    for (int i = 0; i < mt->nk; i++) fprintf(f, "%s%d", i ? "," : "", mt->ks[i]);
    fprintf(f, " sink=%d local=%d  steps=%d  device=%s", mt->sink, mt->local, mt->steps_evaluated,
            mt->use_gpu ? mt->gpu.name : "cpu");
    if (sd) fprintf(f, "  seeds=%d (seeded methods: mean and standard deviation)", mt->seeds);
    fputc('\n', f);
    fprintf(f, "%-12s %6s %6s %8s", "method", "layer", "k", "recall");
    if (sd) fprintf(f, " %7s", "rec_sd");
    fprintf(f, " %8s %8s %8s %8s %8s", "rec_p10", "rec_sel", "rec_pre", "rec_gen", "mass");
    if (sd) fprintf(f, " %7s", "mass_sd");
    fprintf(f, " %8s", "out_err");
    if (sd) fprintf(f, " %7s", "err_sd");
    fprintf(f, " %8s %8s %10s %10s\n", "budget", "extra", "search_us", "index_MB");
    fflush(acc->f_table);
    fwrite(acc->table, 1, acc->n_table, f);
}
