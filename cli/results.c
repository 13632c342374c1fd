/* results.c: aggregation of the raw per-(step, head) metrics into overall
 * and per-window statistics (README, "Result files"), and atomic writing:
 * everything goes to "<dir>.tmp.<pid>" which is renamed to <dir> only once
 * every file is complete, so a failed run leaves no partial results. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isnan(x) || isinf(x)) fputs("null", f);
    else fprintf(f, "%.6g", x);
}

static kv_status write_summary(const char *path, const kv_run_meta *mt, const kv_method_run *runs, int n_runs) {
    FILE *f = fopen(path, "w");
    if (!f) return kv_fail(KV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const kv_trace_info *in = mt->info;
    fprintf(f, "{\n  \"kvbench_version\": \"%s\",\n  \"git_sha\": ", KVBENCH_VERSION);
    json_str(f, kv_git_sha());
    fprintf(f, ",\n  \"command\": ");
    json_str(f, mt->cmdline);
    fprintf(f, ",\n  \"started\": \"%s\",\n  \"wall_seconds\": %.3f,\n", mt->started, mt->wall_s);
    fprintf(f, "  \"device\": {\"kind\": \"%s\", \"name\": ", mt->use_gpu ? "gpu" : "cpu");
    json_str(f, mt->use_gpu ? mt->gpu.name : "host CPU");
    fprintf(f, ", \"driver_version\": %d, \"runtime_version\": %d},\n", mt->gpu.driver_version, mt->gpu.runtime_version);
    fprintf(f, "  \"trace\": {\"path\": ");
    json_str(f, in->path);
    fprintf(f, ", \"model\": ");
    json_str(f, in->model);
    fprintf(f, ", \"description\": ");
    json_str(f, in->description);
    fprintf(f, ", \"layer\": ");
    json_str(f, mt->layer);
    fprintf(f, ", \"num_tokens\": %d, \"prefill_len\": %d, \"num_q_heads\": %d, \"num_kv_heads\": %d, "
               "\"head_dim\": %d, \"softmax_scale\": %g, \"rope\": \"%s\"},\n",
            in->num_tokens, in->prefill_len, in->num_q_heads, in->num_kv_heads, in->head_dim, in->softmax_scale,
            in->rope);
    fprintf(f, "  \"protocol\": {\"k\": %d, \"sink\": %d, \"local\": %d, \"stride\": %d, \"max_steps\": %d, "
               "\"window\": %d, \"seed\": %llu, \"lag\": %d, \"steps_evaluated\": %d, \"steps_skipped_empty_region\": %d},\n",
            mt->k, mt->sink, mt->local, mt->stride, mt->max_steps, mt->window, (unsigned long long)mt->seed, mt->lag,
            mt->steps_evaluated, mt->steps_skipped);
    fprintf(f, "  \"methods\": [\n");
    for (int i = 0; i < n_runs; i++) {
        const kv_method_run *r = &runs[i];
        kv_overall o;
        kv_overall_compute(r, &o);
        fprintf(f, "    {\"method\": \"%s\", \"params\": ", r->m->name);
        json_str(f, r->params);
        fprintf(f, ", \"device\": \"%s\", \"per_kv_head\": %s, \"variable_budget\": %s,\n", r->on_gpu ? "gpu" : "cpu",
                r->m->per_kv_head ? "true" : "false", r->m->variable_budget ? "true" : "false");
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
        fprintf(f, ", \"method_metric_name\": ");
        if (r->m->metric_name) json_str(f, r->m->metric_name); else fputs("null", f);
        fprintf(f, ", \"method_metric\": "); json_num(f, o.metric);
        fprintf(f, ", \"rows\": %zu}%s\n", o.n, i + 1 < n_runs ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return kv_fail(KV_ERR_IO, "%s: write failed", path);
    return KV_OK;
}

static kv_status write_drift(const char *path, const kv_run_meta *mt, const kv_method_run *runs, int n_runs) {
    FILE *f = fopen(path, "w");
    if (!f) return kv_fail(KV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "method,params,window,step_start,step_end,recall_mean,recall_p10,mass_mean,mass_p10,outerr_mean,"
               "outerr_p90,recall_prefill_keys,recall_generated_keys,generated_share,n,method_metric\n");
    int P = mt->info->prefill_len;
    for (int i = 0; i < n_runs; i++) {
        const kv_method_run *r = &runs[i];
        float *scratch = malloc((r->n_rows ? r->n_rows : 1) * sizeof(float));
        if (!scratch) { fclose(f); return kv_fail(KV_ERR_NOMEM, "drift scratch"); }
        for (size_t lo = 0; lo < r->n_rows;) {
            int w = (r->rows[lo].step - P) / mt->window;
            size_t hi = lo;
            while (hi < r->n_rows && (r->rows[hi].step - P) / mt->window == w) hi++;
            window_stats s;
            stats(r->rows, lo, hi, scratch, &s);
            fprintf(f, "%s,\"%s\",%d,%d,%d,%.6f,%.6f,%.6f,%.6f,", r->m->name, r->params, w, P + w * mt->window,
                    P + (w + 1) * mt->window, s.recall, s.recall_p10, s.mass, s.mass_p10);
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
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return kv_fail(KV_ERR_IO, "%s: write failed", path);
    return KV_OK;
}

static kv_status write_steps(const char *path, const kv_method_run *runs, int n_runs) {
    FILE *f = fopen(path, "w");
    if (!f) return kv_fail(KV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "method,step,head,recall,recall_selected,candidate_recall,mass,outerr,n_selected,n_extra,"
               "recall_prefill_keys,recall_generated_keys,method_metric\n");
    for (int i = 0; i < n_runs; i++)
        for (size_t j = 0; j < runs[i].n_rows; j++) {
            const kv_step_metric *m = &runs[i].rows[j];
            fprintf(f, "%s,%d,%d,%.6f,%.6f,", runs[i].m->name, m->step, m->head, m->recall, m->recall_sel);
            if (isnan(m->cand_recall)) fputc(',', f); else fprintf(f, "%.6f,", m->cand_recall);
            fprintf(f, "%.6f,", m->mass);
            if (isnan(m->outerr)) fputc(',', f); else fprintf(f, "%.6g,", m->outerr);
            fprintf(f, "%d,%d,", m->n_sel, m->n_extra);
            if (isnan(m->recall_pre)) fputc(',', f); else fprintf(f, "%.6f,", m->recall_pre);
            if (isnan(m->recall_gen)) fputc(',', f); else fprintf(f, "%.6f,", m->recall_gen);
            if (isnan(m->metric)) fputc('\n', f); else fprintf(f, "%.6g\n", m->metric);
        }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return kv_fail(KV_ERR_IO, "%s: write failed", path);
    return KV_OK;
}

static void remove_tree(const char *dir) {
    static const char *names[] = {"summary.json", "drift.csv", "steps.csv"};
    char p[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        remove(p);
    }
    rmdir(dir);
}

kv_status kv_results_write(const char *dir, const kv_run_meta *mt, const kv_method_run *runs, int n_runs) {
    char tmp[4096], p[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
    if (mkdir(tmp, 0755) != 0) return kv_fail(KV_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
    snprintf(p, sizeof p, "%s/summary.json", tmp);
    kv_status st = write_summary(p, mt, runs, n_runs);
    snprintf(p, sizeof p, "%s/drift.csv", tmp);
    if (st == KV_OK) st = write_drift(p, mt, runs, n_runs);
    snprintf(p, sizeof p, "%s/steps.csv", tmp);
    if (st == KV_OK) st = write_steps(p, runs, n_runs);
    if (st == KV_OK) {
        struct stat sb;
        if (stat(dir, &sb) == 0) remove_tree(dir); /* --force: replace the previous result */
        if (rename(tmp, dir) != 0) st = kv_fail(KV_ERR_IO, "%s: cannot rename %s into place: %s", dir, tmp, strerror(errno));
    }
    if (st != KV_OK) remove_tree(tmp);
    return st;
}

void kv_results_print(FILE *f, const kv_run_meta *mt, const kv_method_run *runs, int n_runs) {
    fprintf(f, "\n%s  layer %s  T=%d P=%d  k=%d sink=%d local=%d  steps=%d  device=%s\n", mt->info->path, mt->layer,
            mt->info->num_tokens, mt->info->prefill_len, mt->k, mt->sink, mt->local, mt->steps_evaluated,
            mt->use_gpu ? mt->gpu.name : "cpu");
    fprintf(f, "%-12s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %10s %10s\n", "method", "recall", "rec_p10", "rec_sel",
            "rec_pre", "rec_gen", "mass", "mass_p10", "out_err", "budget", "extra", "search_us", "index_MB");
    for (int i = 0; i < n_runs; i++) {
        kv_overall o;
        kv_overall_compute(&runs[i], &o);
        fprintf(f, "%-12s %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %8.1f %8.1f %10.1f %10.2f\n", runs[i].m->name,
                o.recall, o.recall_p10, o.recall_sel, o.recall_pre, o.recall_gen, o.mass, o.mass_p10, o.outerr, o.n_sel,
                o.n_extra, o.search_med_us, runs[i].index_bytes / 1e6);
    }
}
