/* fuzz_main.c: libFuzzer entry point of `make fuzz` (built twice:
 * -DKV_FUZZ_CLI for the option parser target, else the trace loader; the
 * targets are in tests/fuzz_targets.c). make fuzz runs the option target
 * with -close_fd_mask=2: its usage errors are expected output. */
#include <stdint.h>
#include <stdio.h>

int kv_fuzz_loader(const uint8_t *data, size_t size);
int kv_fuzz_cli(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#ifdef KV_FUZZ_CLI
    kv_fuzz_cli(data, size);
#else
    kv_fuzz_loader(data, size);
#endif
    return 0;
}
