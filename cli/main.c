/* main.c: kvbench's entry point: a static table of subcommands dispatched
 * by name (git/redis style). Each subcommand parses its own options. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const kv_command commands[] = {
    {"run", cmd_run, "evaluate retrievers on a trace layer (recall, mass, output error, drift)"},
    {"bench", cmd_bench, "time the per-step kernels of a method on synthetic data of given lengths"},
    {"list", cmd_list, "list the retrievers with their parameters"},
    {"info", cmd_info, "print a trace's model, shapes, layers and dtypes"},
    {"slice", cmd_slice, "write a smaller valid trace (fewer tokens / layers)"},
    {"synth", cmd_synth, "write a seeded synthetic trace (tests and scale benchmarks only)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kvbench <command> [options]   (kvbench <command> --help or kvbench help <command> for its "
               "options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-7s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    kv_passive_wait_policy(argv); /* before any OpenMP region: see cli/util.c */
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "help") && argc >= 3) { /* kvbench help CMD = kvbench CMD --help */
        if (argc > 3) { fprintf(stderr, "kvbench help: expected one command name, found %d arguments\n", argc - 2); return 2; }
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[2], commands[i].name)) {
                char *args[] = {argv[2], "--help", NULL};
                return commands[i].fn(2, args);
            }
        fprintf(stderr, "kvbench help: unknown command '%s'\n", argv[2]);
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version")) { printf("kvbench %s (%s)\n", KVBENCH_VERSION, kv_git_sha()); return 0; }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvbench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
