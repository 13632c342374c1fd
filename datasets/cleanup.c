/* cleanup.c: removal of kvbench's temporary paths on SIGINT/SIGTERM/SIGHUP
 * (see kv_cleanup.h). A slot is published by an atomic store of its state
 * after its path is written, so the handler, which may run on any thread
 * (OpenMP workers included), reads only complete paths; slots are handed
 * out round-robin, so a slot just freed is not rewritten while a handler
 * could still be reading it. */
#define _POSIX_C_SOURCE 200809L
#include "kv_cleanup.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif
#define KV_CLEAN_SLOTS 32

typedef struct {
    volatile sig_atomic_t kind; /* 0: free */
    char path[PATH_MAX], to[PATH_MAX];
} slot;

static slot slots[KV_CLEAN_SLOTS];
static int next_slot;
static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
    int saved = errno;
    got_signal = sig;
    /* restores first (put the old result back), then files, then directories */
    for (int i = 0; i < KV_CLEAN_SLOTS; i++)
        if (slots[i].kind == KV_CLEAN_RESTORE) rename(slots[i].path, slots[i].to);
    for (int i = 0; i < KV_CLEAN_SLOTS; i++)
        if (slots[i].kind == KV_CLEAN_FILE) unlink(slots[i].path);
    for (int i = 0; i < KV_CLEAN_SLOTS; i++)
        if (slots[i].kind == KV_CLEAN_DIR) rmdir(slots[i].path);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    errno = saved;
    raise(sig); /* delivered with the default action once this handler returns */
}

void kv_cleanup_install(void) {
    static int done;
    if (done) return;
    done = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGHUP);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        /* a signal the parent set to "ignore" (nohup, background jobs) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

int kv_cleanup_add(int kind, const char *path, const char *to) {
    if (strlen(path) >= PATH_MAX || (to && strlen(to) >= PATH_MAX)) {
        kv_fail(KV_ERR_INPUT, "%s: path too long (%zu bytes; the system's limit is %d)", path, strlen(path), PATH_MAX - 1);
        return -1;
    }
    for (int n = 0; n < KV_CLEAN_SLOTS; n++) {
        int i = (next_slot + n) % KV_CLEAN_SLOTS;
        if (slots[i].kind) continue;
        memcpy(slots[i].path, path, strlen(path) + 1);
        if (to) memcpy(slots[i].to, to, strlen(to) + 1);
        else slots[i].to[0] = 0;
        __atomic_store_n(&slots[i].kind, kind, __ATOMIC_SEQ_CST);
        next_slot = (i + 1) % KV_CLEAN_SLOTS;
        return i;
    }
    kv_fail(KV_ERR_INTERNAL, "%s: more than %d temporary paths at once", path, KV_CLEAN_SLOTS);
    return -1;
}

void kv_cleanup_remove(int id) {
    if (id >= 0 && id < KV_CLEAN_SLOTS) __atomic_store_n(&slots[id].kind, 0, __ATOMIC_SEQ_CST);
}

int kv_cleanup_signal(void) { return got_signal; }

void kv_cleanup_test_point(const char *phase) {
    const char *want = getenv("KVBENCH_TEST_RAISE");
    if (want && !strcmp(want, phase)) raise(SIGTERM);
}
