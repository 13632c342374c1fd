/* bench.c: `kvbench bench` (placeholder until the GPU bench lands). */
#include "cli.h"
int cmd_bench(int argc, char **argv) { (void)argc; (void)argv; return kv_usage_error("bench", "not built yet"); }
