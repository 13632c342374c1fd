/* kv_cleanup.h: the temporary paths kvbench is writing (a trace's
 * "<path>.tmp.<pid>", a run's "<dir>.tmp.<pid>" and its files, the old
 * result directory during a --force swap), removed (or, for a swap, put
 * back) when SIGINT, SIGTERM or SIGHUP arrives, at every phase of a
 * command. The handler is async-signal-safe: it records the signal,
 * renames back, unlinks the registered files, removes the registered
 * directories (files first, so a directory can be empty by then), then
 * restores the default action and re-raises, so the process still dies
 * of the signal (shells and batch scripts see it).
 *
 * Slots are static (no allocation in the handler, no freeing under it);
 * a path must be shorter than PATH_MAX, which a path the kernel accepts
 * always is. Register a path BEFORE creating it and remove the entry
 * AFTER it was renamed away or deleted. */
#ifndef KV_CLEANUP_H
#define KV_CLEANUP_H

#include "../kernels/ops/kv_common.h"

enum { KV_CLEAN_FILE = 1, KV_CLEAN_DIR = 2, KV_CLEAN_RESTORE = 3 };

/* Installs the handlers once (idempotent). */
void kv_cleanup_install(void);
/* Registers `path` (a file or an empty-once-its-files-are-gone directory),
 * or for KV_CLEAN_RESTORE "rename `path` back to `to`". Returns a slot id
 * >= 0, or -1 with kv_fail(KV_ERR_INPUT) when the path is too long or all
 * slots are taken. */
int kv_cleanup_add(int kind, const char *path, const char *to);
/* Forgets slot `id` (ignores -1). */
void kv_cleanup_remove(int id);
/* The signal that interrupted the process (0 if none): recorded before cleanup. */
int kv_cleanup_signal(void);
/* Test hook: raises SIGTERM when the environment variable
 * KVBENCH_TEST_RAISE equals `phase` (tests/test_cli.c interrupts a run at
 * a chosen phase this way, deterministically). */
void kv_cleanup_test_point(const char *phase);

#endif
