/* cli.h: what the subcommands share: the command table entry, usage
 * errors (one line + "Try 'kvbench CMD --help'", exit 2), runtime errors
 * ("kvbench: <message>", exit by status), checked option parsing (every
 * number through kv_opt_int / kv_opt_float: the range is part of the
 * message, and nothing is silently cut or wrapped), output-path checks
 * shared by every command that writes (the --force rule), and the device
 * choice. Error rule: the message names the option or file, what was
 * expected and what was found; bad input exits 2. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <getopt.h>

#include "../kernels/ops/kv_common.h"
#include "../kernels/ops/kv_gpu.h"

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
/* `kvbench info --profile ...` (cli/profile.c). */
int kv_info_profile(int argc, char **argv);

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
/* The same for option --NAME of command CMD: on failure prints the usage
 * error "--NAME: expected an integer in [lo, hi], found 'S'" and returns 2;
 * 0 on success. */
int kv_opt_int(const char *cmd, const char *name, const char *s, long lo, long hi, int *out);
/* Comma-separated integers in [lo, hi] ("16384,131072") into out[0..cap);
 * returns the count, or prints the usage error (empty item, bad number,
 * more than cap) and returns -2. */
int kv_opt_int_list(const char *cmd, const char *name, const char *s, long lo, long hi, int *out, int cap);
/* getopt_long's answer c ('?' or ':') as a usage error: "option --k needs
 * a value", "unknown option '--frob'", "option --force takes no value".
 * Call with getopt's opterr = 0 and an optstring starting with ':'. */
int kv_opt_error(const char *cmd, int c, char **argv, const struct option *opts);
/* The optstring of every command: ':' first, so a missing value comes back
 * as ':' ("needs a value"), not as an unknown option. */
#define KV_OPTSTRING ":h"

/* malloc'd printf (NULL + kv_fail(KV_ERR_NOMEM) on failure). */
char *kv_strfmt(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Checks an output FILE before any work (run, synth, slice, bench --csv):
 * its directory exists and is writable; an existing FILE is an error
 * without --force, and with it must be a regular file; `input` (the file
 * being read, or NULL) may not be the output. KV_ERR_INPUT with the
 * message naming option `opt`. */
kv_status kv_check_out_file(const char *opt, const char *path, int force, const char *input);
/* Checks that the directory that will hold `path` exists and is writable. */
kv_status kv_check_parent(const char *opt, const char *path);

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

/* The command line as one malloc'd string (for results; NULL when out of
 * memory), the git sha of the build. */
char *kv_command_line(int argc, char **argv);
const char *kv_git_sha(void);

#endif
