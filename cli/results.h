/* results.h: one run's records (per method: parameters, timings, raw
 * per-(step, head) metrics) and their aggregation and atomic writing as
 * summary.json, drift.csv and steps.csv. */
#ifndef KV_RESULTS_H
#define KV_RESULTS_H

#include "../datasets/kv_trace.h"
#include "../kernels/ops/kv_gpu.h"
#include "cli.h"
#include "protocol.h"

typedef struct {
    const kv_method *m;
    kv_param_set ps;
    char params[4096];  /* "k1=v1,..." of every parameter: KV_MAX_PARAMS names + 65 each fit */
    void *state;
    kv_selection sel;
    int on_gpu;
    kv_step_metric *rows;
    size_t n_rows, cap_rows;
    double build_s, append_s;
    double *search_s;   /* per evaluated step */
    int n_steps;
    size_t index_bytes;
} kv_method_run;

typedef struct {
    const kv_trace_info *info;
    const char *layer;
    int k, sink, local, stride, max_steps, window;
    uint64_t seed;
    int lag;            /* --lag: methods saw the query of t - lag */
    int use_gpu;
    kv_gpu_info gpu;
    char *cmdline;        /* malloc'd (kv_command_line) */
    int k_effective;      /* k after clamping to the largest retrievable region */
    int force;            /* --force: an existing result directory may be replaced */
    char started[64];
    int steps_evaluated, steps_skipped;
    double wall_s;
    kv_host_info host;  /* CPU threads, load average at start */
} kv_run_meta;

typedef struct {
    double recall, recall_sel, cand_recall, mass, outerr, n_sel, n_extra;
    double recall_pre, recall_gen, gen_share; /* by key origin (means over the rows where defined) */
    double metric;      /* mean of the method's own per-step scalar (kv_method.metric_name), NAN if none */
    double recall_p10, mass_p10, outerr_p90;
    double search_med_us, search_p90_us;
    size_t n;
} kv_overall;

/* Resolves --method LIST into runs[0..*n_runs) (at most max) with their
 * --param assignments applied (cli/methods.c); returns -1 when done, else
 * the exit code of the usage error it printed for command `cmd`. */
int kv_pick_methods(const char *cmd, const char *list, const char *const *params, int n_params, kv_method_run *runs,
                    int max, int *n_runs);

kv_status kv_rows_push(kv_method_run *r, const kv_step_metric *rows, int n);
void kv_overall_compute(const kv_method_run *r, kv_overall *o);
/* Before any work: may `dir` be written? Its parent must exist and be
 * writable; an existing `dir` is an error without --force, and with it
 * must be an empty directory or a kvbench result directory (summary.json
 * written by kvbench, and no file but the three kvbench writes): kvbench
 * never deletes or overwrites a file it did not write. KV_ERR_INPUT with
 * the message. */
kv_status kv_results_check_out(const char *dir, int force);
/* Writes the run directory all-or-nothing: DIR.tmp.<pid>, then into place
 * by one rename (an existing result directory is swapped with it by
 * renameat2(RENAME_EXCHANGE), or moved aside and put back on failure),
 * then the old files are removed. A failed or interrupted write (SIGINT,
 * SIGTERM, SIGHUP: datasets/kv_cleanup.h) leaves DIR exactly as it was and
 * no DIR.tmp.<pid>. */
kv_status kv_results_write(const char *dir, const kv_run_meta *meta, const kv_method_run *runs, int n_runs);
void kv_results_print(FILE *f, const kv_run_meta *meta, const kv_method_run *runs, int n_runs);

#endif
