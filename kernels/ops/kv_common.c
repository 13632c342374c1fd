/* kv_common.c: status messages, allocation, clock, PRNG, half floats and
 * percentiles shared by every layer (see kv_common.h). The last-error
 * buffer is thread-local, so it is not global state in the sense of the
 * style guide: each thread sees only its own message. */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char kv_err_buf[2048];

/* Formats into a scratch buffer first: a message built from the previous
 * one (kv_fail(st, "context: %s", kv_last_error())) must not read the
 * buffer it is writing. */
kv_status kv_fail(kv_status st, const char *fmt, ...) {
    static _Thread_local char next[sizeof kv_err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(next, sizeof next, fmt, ap);
    va_end(ap);
    memcpy(kv_err_buf, next, sizeof kv_err_buf);
    return st;
}

const char *kv_last_error(void) { return kv_err_buf[0] ? kv_err_buf : "unknown error"; }
void kv_clear_error(void) { kv_err_buf[0] = 0; }

int kv_exit_code(kv_status st) {
    if (st == KV_OK) return 0;
    return st == KV_ERR_INPUT ? 2 : 1;
}

void *kv_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) kv_fail(KV_ERR_NOMEM, "out of host memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *kv_calloc(size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) kv_fail(KV_ERR_NOMEM, "out of host memory allocating %zu x %zu bytes for %s", n, size, what);
    return p;
}

int kv_env_on(const char *name) {
    const char *e = getenv(name);
    return !(e && !strcmp(e, "0"));
}

int kv_env_is1(const char *name) {
    const char *e = getenv(name);
    return e && !strcmp(e, "1");
}

double kv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void kv_rng_seed(kv_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kv_rng_u64(kv_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return out;
}

double kv_rng_uniform(kv_rng *r) { return (double)(kv_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

double kv_rng_normal(kv_rng *r) {
    double u1 = kv_rng_uniform(r), u2 = kv_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float kv_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
__attribute__((target("avx,f16c"))) static void half_row_f16c(const uint16_t *s, float *d, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = kv_half_to_float(s[i]);
}
/* cpuid leaf 1: OSXSAVE, AVX, F16C, and the OS saving YMM state; -1 unknown yet */
static int f16c_ok = -1;
static int have_f16c(void) {
    if (f16c_ok >= 0) return f16c_ok;
    unsigned a, b, c, d, lo, hi;
    int ok = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27)) && (c & (1u << 28)) && (c & (1u << 29));
    if (ok) {
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        ok = (lo & 6u) == 6u;
    }
    __atomic_store_n(&f16c_ok, ok, __ATOMIC_RELAXED);
    return ok;
}
#endif

void kv_half_to_float_n(const uint16_t *src, float *dst, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_f16c()) { half_row_f16c(src, dst, n); return; }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kv_half_to_float(src[i]);
}

void kv_host_rows_head(const kv_host_rows *x, int h, int D, int a, int n, float *dst) {
    size_t off = ((size_t)h * x->ld + a) * D;
    if (x->f16) kv_half_to_float_n(x->f16 + off, dst, (size_t)n * D);
    else memcpy(dst, x->f32 + off, (size_t)n * D * sizeof(float));
}

kv_status kv_rows_walk_start(kv_rows_walk *w, const kv_host_rows *x, int H, int D, int a, int end, const char *what) {
    *w = (kv_rows_walk){x, H, D, a, end, NULL};
    if (x->f16 && end > a && !(w->buf = kv_malloc((size_t)H * KV_HOST_ROWS_CHUNK * D * sizeof(float), what)))
        return KV_ERR_NOMEM;
    return KV_OK;
}

const float *kv_rows_walk_next(kv_rows_walk *w, int *a, int *n, size_t *hstride) {
    if (w->at >= w->end) return NULL;
    const kv_host_rows *x = w->x;
    int c = w->end - w->at, D = w->D;
    if (x->f16 && c > KV_HOST_ROWS_CHUNK) c = KV_HOST_ROWS_CHUNK;
    *a = w->at;
    *n = c;
    w->at += c;
    if (!x->f16) {
        *hstride = (size_t)x->ld * D;
        return x->f32 + (size_t)*a * D;
    }
    for (int h = 0; h < w->H; h++) kv_host_rows_head(x, h, D, *a, c, w->buf + (size_t)h * c * D);
    *hstride = (size_t)c * D;
    return w->buf;
}

void kv_rows_walk_end(kv_rows_walk *w) {
    free(w->buf);
    w->buf = NULL;
}

uint16_t kv_float_to_half(float f) { /* round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int exp = (int)e - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - exp;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exp: correct */
    return (uint16_t)(sign | h);
}

/* Moves the i-th smallest of v[0, n) to v[i], smaller ones before it and
 * larger ones after (Hoare quickselect on the median of three; finite
 * values). */
static void select_ith(float *v, size_t n, size_t i) {
    size_t lo = 0, hi = n - 1;
    while (hi > lo) {
        size_t mid = lo + (hi - lo) / 2;
        float a = v[lo], b = v[mid], c = v[hi];
        float piv = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        size_t l = lo, r = hi;
        for (;;) {
            while (v[l] < piv) l++;
            while (v[r] > piv) r--;
            if (l >= r) break;
            float t = v[l]; v[l] = v[r]; v[r] = t;
            l++; r--;
        }
        /* [lo, r] <= piv <= [r + 1, hi] */
        if (i <= r) hi = r;
        else lo = r + 1;
    }
}

double kv_percentile_inplace(float *v, size_t n, double q) {
    if (n == 0) return NAN;
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos;
    if (lo + 1 >= n) { /* the largest */
        float m = v[0];
        for (size_t i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
        return m;
    }
    select_ith(v, n, lo); /* the values a sort would put at lo and lo + 1 */
    float next = v[lo + 1];
    for (size_t i = lo + 2; i < n; i++) next = v[i] < next ? v[i] : next;
    double frac = pos - (double)lo;
    return v[lo] + frac * (next - v[lo]);
}
