/* results.h: one run's records (per method, layer, budget and seed:
 * parameters, timings, raw per-(step, head) metrics), their aggregation,
 * and atomic writing as summary.json, drift.csv, steps.csv and profile.csv.
 * A run over several layers renders each layer's records as soon as the
 * layer is done (kv_results_add) and frees its raw rows, so memory holds
 * one layer's rows, not the model's; steps.csv grows in an unlinked
 * temporary file until the final write. */
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
    int sel_pinned;     /* sel.idx (and sel.logw, uses_logw) page-locked: a GPU method's (run.c pin_selection) */
    kv_step_metric *rows;
    size_t n_rows, cap_rows;
    double build_s, append_s;
    double *search_s;   /* per evaluated step */
    double search_total_s; /* sum of search_s (issue 12's phase breakdown) */
    int search_dev;     /* 1: search_s are device times (searches queued by the run, kv_gpu_mark), 0: host timer */
    double diag_s;      /* the record's diagnostics on the host: candidates copy, scoring or packing */
    int n_steps;
    size_t index_bytes;
    const char *layer;  /* the record's layer, budget (asked and effective) and seed (the shape's seed) */
    int k, k_eff;
    uint64_t seed;
    int seeded;         /* the method has a `seed` parameter: run over --seeds seeds */
} kv_method_run;

/* The oracle budget profile of one layer: per evaluated step and query
 * head, the region tokens needed for each mass target (oracle.h). */
typedef struct {
    int n, cap, Hq;
    int *step;    /* [n] */
    int *budget;  /* [n][Hq][KV_NPROFILE] */
} kv_profile_rows;
kv_status kv_profile_push(kv_profile_rows *pr, int t, const int *budget);
void kv_profile_free(kv_profile_rows *pr);
/* Prints the profile of `layer` (overall, then per drift window): mean and
 * median tokens needed per p, and the mean region size. */
void kv_profile_print(FILE *f, const char *layer, const kv_profile_rows *pr, int P, int window, int sink, int local);

/* What is rendered so far: summary.json's method entries and profile, the
 * drift and profile rows, steps.csv's rows, the printed tables. */
typedef struct {
    char *methods, *profile, *drift, *prof_csv, *table;
    size_t n_methods, n_profile, n_drift, n_prof_csv, n_table;
    FILE *f_methods, *f_profile, *f_drift, *f_prof_csv, *f_table, *steps;
    int entries, profiles;
} kv_results_acc;

typedef struct {
    const kv_trace_info *info;
    const char *layer;
    int k, sink, local, stride, max_steps, window;
    uint64_t seed;
    const int *ks;        /* the budgets, ascending; k is the largest */
    int nk, seeds;        /* seeds: --seeds N (seeded methods run seeds seed .. seed+N-1) */
    const char *layers;   /* the layers evaluated, comma-separated */
    int lag;              /* --lag: methods saw the query of t - lag */
    int use_gpu;
    kv_gpu_info gpu;
    char *cmdline;        /* malloc'd (kv_command_line) */
    int k_effective;      /* k after clamping to the largest retrievable region */
    int force;            /* --force: an existing result directory may be replaced */
    char started[64];
    int steps_evaluated, steps_skipped;
    double wall_s;
    kv_host_info host;  /* CPU threads, load average at start */
    /* issue 12: where the run's wall time went, host timers (kv_now) around
     * each phase, summed over layers (kv_phase_names). append, search and
     * diagnostics are summed over instances: with the methods run in
     * parallel (CPU, --threads > 1) they are thread-seconds and
     * methods_wall is the wall time of those per-step sections. */
    double phase_s[9];
    int parallel_methods; /* the methods of a step ran in parallel (CPU path, threads > 1) */
} kv_run_meta;

enum { KV_PH_LOAD, KV_PH_BUILD, KV_PH_APPEND, KV_PH_ORACLE, KV_PH_SEARCH, KV_PH_DIAG, KV_PH_METHODS_WALL,
       KV_PH_BOOK, KV_PH_OUTPUT, KV_NPHASES };
extern const char *const kv_phase_names[KV_NPHASES];
/* Prints the phase breakdown (and each record's search total) to f. */
void kv_phases_print(FILE *f, const kv_run_meta *meta);

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
kv_status kv_results_begin(kv_results_acc *acc);
/* Renders one layer's records (and its profile, when pr is not NULL). */
kv_status kv_results_add(kv_results_acc *acc, const kv_run_meta *meta, const kv_method_run *runs, int n_runs,
                         const kv_profile_rows *pr);
kv_status kv_results_write(const char *dir, const kv_run_meta *meta, kv_results_acc *acc);
void kv_results_print(FILE *f, const kv_run_meta *meta, kv_results_acc *acc);
void kv_results_end(kv_results_acc *acc);

#endif
