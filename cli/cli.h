/* cli.h: what the subcommands share: the command table entry, usage
 * errors (one line + "Try 'kvbench CMD --help'", exit 2), runtime errors
 * ("kvbench: <message>", exit by status), option parsing helpers and the
 * device choice. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include "../kernels/kv_common.h"
#include "../kernels/kv_gpu.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} kv_command;

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_slice(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "kvbench CMD: <msg>" and the --help hint to stderr; returns 2. */
int kv_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prints "kvbench: <last error>" to stderr; returns the status's exit code. */
int kv_report(kv_status st);
/* Strict integer / float parsing of an option value; 0 on success. */
int kv_parse_int(const char *s, long lo, long hi, int *out);
int kv_parse_float(const char *s, double lo, double hi, double *out);
/* Comma-separated positive integers ("16384,131072"); returns count or -1. */
int kv_parse_int_list(const char *s, int *out, int cap);

typedef enum { KV_DEVICE_AUTO, KV_DEVICE_CPU, KV_DEVICE_GPU } kv_device_choice;
int kv_parse_device(const char *s, kv_device_choice *out);
/* Resolves the choice against the probe: *use_gpu; KV_ERR_INPUT for gpu without one. */
kv_status kv_resolve_device(kv_device_choice c, kv_gpu_info *gi, int *use_gpu);

/* CPU threads and the machine's load (issue 16): what a CPU timing depends
 * on, recorded with every result. kv_host_setup applies --threads N (0:
 * OpenMP's default, one thread per available core), probes the cores, the
 * 1/5/15-minute load average and the OpenMP wait policy (main() makes it
 * passive unless the user set OMP_WAIT_POLICY), and warns on stderr when
 * the 1-minute load is above the core count. */
typedef struct {
    int threads, cores;
    double load[3];     /* -1 where the load average is unavailable */
    char wait_policy[32];
} kv_host_info;
void kv_host_setup(const char *cmd, int threads, kv_host_info *h);
/* Sets OMP_WAIT_POLICY=passive and re-executes the binary once, unless the
 * variable is already set (main() calls it before anything else). */
void kv_passive_wait_policy(char **argv);

/* The command line as one string (for results), the git sha of the build. */
void kv_command_line(int argc, char **argv, char *buf, size_t cap);
const char *kv_git_sha(void);

#endif
