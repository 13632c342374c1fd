/* isolate.c: runs one step of trace reading in a forked child so that a
 * crash, hang or runaway allocation inside the HDF5 library becomes an
 * error message instead of killing or hanging kvbench (issue 13).
 *
 * Debian 12's libhdf5 1.10.8 segfaults, loops forever or allocates without
 * bound on some corrupt files (a one-byte change of a valid h5py file is
 * enough); newer HDF5 releases still receive such reports, so no version
 * can be trusted with hostile metadata. The child gets an alarm (SIGALRM,
 * default action: die) and an address-space limit (RLIMIT_AS: its current
 * size plus a budget); its result and error message come back through a
 * MAP_SHARED page block the parent mapped before fork, and bulk data
 * (a layer's floats) through a pipe that the parent drains into its own
 * malloc'd arrays while the child reads the next head: shared mappings
 * were measured slower (first-touch faults of shmem pages cost more than
 * of private ones, and the copy through the pipe overlaps the reading).
 * Only the
 * parent's own state is trusted: the child's death by any signal, a
 * timeout or an exit without a result all become
 * "FILE: corrupt or unreadable HDF5 metadata (...)". The child calls
 * _exit, so no atexit handler (HDF5's, a temp-file cleanup) runs twice.
 * Under AddressSanitizer the memory limit is left off (ASan reserves
 * terabytes of shadow address space). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_trace.h"

#if defined(__SANITIZE_ADDRESS__)
#define KV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_ASAN 1
#endif
#endif

typedef struct {
    int done;
    kv_status st;
    char msg[2048];
} result_hdr;

void *kv_shared_alloc(size_t bytes, const char *what) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        kv_fail(KV_ERR_NOMEM, "out of host memory mapping %zu bytes for %s", bytes, what);
        return NULL;
    }
    return p;
}

void kv_shared_free(void *p, size_t bytes) {
    if (p) munmap(p, bytes ? bytes : 1);
}

static size_t current_vm_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

kv_status kv_isolated_stream(const char *path, const char *what, double timeout_s, size_t mem_budget,
                             kv_status (*fn)(void *arg, void *out, int fd), void *arg, void *out, size_t out_bytes,
                             kv_status (*consume)(int fd, void *carg), void *carg) {
    size_t total = sizeof(result_hdr) + out_bytes;
    unsigned char *blk = kv_shared_alloc(total, "trace reader result");
    if (!blk) return KV_ERR_NOMEM;
    result_hdr *h = (result_hdr *)blk;
    unsigned char *res = blk + sizeof(result_hdr);
    int pfd[2] = {-1, -1};
    if (consume && pipe(pfd) != 0) {
        kv_shared_free(blk, total);
        return kv_fail(KV_ERR_INTERNAL, "%s: cannot create a pipe for the trace reader: %s", path, strerror(errno));
    }
    if (consume) fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20); /* fewer wake-ups; best effort */
    size_t vm = current_vm_bytes();
    fflush(stdout);
    fflush(stderr);
    /* the parent's cleanup handlers (SIGINT/SIGTERM/SIGHUP) must never run in
     * the child: block them across fork, the child resets them first */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t parent = getpid(), pid = fork();
    if (pid != 0) sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        kv_shared_free(blk, total);
        if (consume) { close(pfd[0]); close(pfd[1]); }
        return kv_fail(KV_ERR_INTERNAL, "%s: cannot start the trace reader process: %s", path, strerror(errno));
    }
    if (pid == 0) {
        /* child: default signal actions (the parent's cleanup handlers must not run here) */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGALRM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphan reader when the parent is killed */
        if (getppid() != parent) _exit(1); /* it died before prctl */
        if (consume) close(pfd[0]);
#ifndef KV_ASAN
        if (vm) {
            struct rlimit rl = {vm + mem_budget, vm + mem_budget};
            setrlimit(RLIMIT_AS, &rl);
        }
#else
        (void)mem_budget;
#endif
        unsigned secs = timeout_s < 1 ? 1 : timeout_s > 86400 ? 86400 : (unsigned)(timeout_s + 0.999);
        alarm(secs);
        kv_clear_error();
        kv_status st = fn(arg, res, consume ? pfd[1] : -1);
        h->st = st;
        snprintf(h->msg, sizeof h->msg, "%s", st == KV_OK ? "" : kv_last_error());
        __atomic_store_n(&h->done, 1, __ATOMIC_SEQ_CST);
        _exit(0);
    }
    kv_status cst = KV_OK;
    if (consume) {
        close(pfd[1]);
        cst = consume(pfd[0], carg); /* ends at the child's exit or death (EOF) at the latest */
        close(pfd[0]);
    }
    int ws = 0;
    pid_t r;
    while ((r = waitpid(pid, &ws, 0)) < 0 && errno == EINTR) {
    }
    kv_status st;
    /* a result, once complete, stands whatever the exit (valgrind's or a sanitizer's exit hooks) */
    if (r == pid && __atomic_load_n(&h->done, __ATOMIC_SEQ_CST)) {
        st = h->st;
        if (st != KV_OK) kv_fail(st, "%s", h->msg);
        else if (cst != KV_OK) st = kv_fail(KV_ERR_INTERNAL, "%s: the trace reader's data ended early", path);
        else if (out_bytes) memcpy(out, res, out_bytes);
    } else if (r == pid && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGALRM) {
        st = kv_fail(KV_ERR_INPUT, "%s: corrupt or unreadable HDF5 metadata (%s did not finish within %.0f s: "
                     "the HDF5 library hangs on this file)", path, what, timeout_s < 1 ? 1 : timeout_s);
    } else if (r == pid && WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGKILL || WTERMSIG(ws) == SIGINT ||
                                               WTERMSIG(ws) == SIGTERM || WTERMSIG(ws) == SIGHUP)) {
        st = kv_fail(KV_ERR_INTERNAL, "%s: the trace reader process was killed while %s (%s, signal %d)", path,
                     what, strsignal(WTERMSIG(ws)), WTERMSIG(ws));
    } else if (r == pid && WIFSIGNALED(ws)) {
        st = kv_fail(KV_ERR_INPUT, "%s: corrupt or unreadable HDF5 metadata (%s crashed the HDF5 library: %s, "
                     "signal %d)", path, what, strsignal(WTERMSIG(ws)), WTERMSIG(ws));
    } else {
        st = kv_fail(KV_ERR_INPUT, "%s: corrupt or unreadable HDF5 metadata (%s ended without a result, exit "
                     "status %d)", path, what, r == pid && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    }
    kv_shared_free(blk, total);
    return st;
}

typedef struct { kv_status (*fn)(void *, void *); void *arg; } plain_call;
static kv_status call_plain(void *arg, void *out, int fd) {
    (void)fd;
    plain_call *c = arg;
    return c->fn(c->arg, out);
}

kv_status kv_isolated(const char *path, const char *what, double timeout_s, size_t mem_budget,
                      kv_status (*fn)(void *arg, void *out), void *arg, void *out, size_t out_bytes) {
    plain_call c = {fn, arg};
    return kv_isolated_stream(path, what, timeout_s, mem_budget, call_plain, &c, out, out_bytes, NULL, NULL);
}

kv_status kv_write_all(int fd, const void *buf, size_t bytes) {
    const char *p = buf;
    while (bytes) {
        ssize_t n = write(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return kv_fail(KV_ERR_IO, "write to the trace reader's pipe failed: %s", strerror(errno));
        p += n;
        bytes -= (size_t)n;
    }
    return KV_OK;
}

kv_status kv_read_all(int fd, void *buf, size_t bytes) {
    char *p = buf;
    while (bytes) {
        ssize_t n = read(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return KV_ERR_IO; /* EOF: the child stopped (its status says why) */
        p += n;
        bytes -= (size_t)n;
    }
    return KV_OK;
}
