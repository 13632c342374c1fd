/* params.c: parameter tables (validation, defaults, formatting) and the
 * selection buffers every search fills. Parameters are data
 * (kv_param_spec tables in each retriever), so `kvbench list`, --help and
 * validation read the same table and cannot drift. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_retriever.h"

void kv_params_init(kv_param_set *ps, const kv_param_spec *spec) {
    memset(ps, 0, sizeof *ps);
    ps->spec = spec;
    for (int i = 0; spec && spec[i].name && i < KV_MAX_PARAMS; i++) {
        ps->val[i] = spec[i].def;
        ps->n = i + 1;
    }
}

static int enum_index(const char *choices, const char *word) {
    int idx = 0;
    size_t wl = strlen(word);
    for (const char *p = choices; *p; idx++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == wl && strncmp(p, word, len) == 0) return idx;
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

static void enum_name(const char *choices, int idx, char *out, size_t cap) {
    const char *p = choices;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    if (!p) { snprintf(out, cap, "?"); return; }
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    snprintf(out, cap, "%.*s", (int)len, p);
}

static void describe_accepted(const kv_param_set *ps, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = 0;
    if (ps->n == 0) { snprintf(buf, cap, "(this method takes no parameters)"); return; }
    for (int i = 0; i < ps->n && used < cap; i++) {
        const kv_param_spec *s = &ps->spec[i];
        int w;
        if (s->type == KV_PARAM_ENUM) w = snprintf(buf + used, cap - used, "%s%s=%s", i ? ", " : "", s->name, s->choices);
        else if (s->type == KV_PARAM_INT)
            w = snprintf(buf + used, cap - used, "%s%s=int in [%.0f, %.0f]", i ? ", " : "", s->name, s->min, s->max);
        else w = snprintf(buf + used, cap - used, "%s%s=float in [%g, %g]", i ? ", " : "", s->name, s->min, s->max);
        if (w < 0) break;
        used += (size_t)w;
    }
}

kv_status kv_params_set(kv_param_set *ps, const char *method, const char *assignment) {
    char accepted[2048];
    const char *eq = strchr(assignment, '=');
    describe_accepted(ps, accepted, sizeof accepted);
    if (!eq || eq == assignment)
        return kv_fail(KV_ERR_INPUT, "--param '%s' for method %s: expected name=value; accepted: %s", assignment,
                       method, accepted);
    size_t nl = (size_t)(eq - assignment);
    const char *val = eq + 1;
    for (int i = 0; i < ps->n; i++) {
        const kv_param_spec *s = &ps->spec[i];
        if (strlen(s->name) != nl || strncmp(s->name, assignment, nl) != 0) continue;
        double x;
        if (s->type == KV_PARAM_ENUM) {
            int idx = enum_index(s->choices, val);
            if (idx < 0)
                return kv_fail(KV_ERR_INPUT, "--param %s for method %s: expected one of %s, found '%s'", s->name,
                               method, s->choices, val);
            x = idx;
        } else {
            char *end;
            errno = 0;
            x = strtod(val, &end);
            if (*val == 0 || *end != 0 || errno || !isfinite(x))
                return kv_fail(KV_ERR_INPUT, "--param %s for method %s: expected a number, found '%s'", s->name,
                               method, val);
            if (s->type == KV_PARAM_INT && x != floor(x))
                return kv_fail(KV_ERR_INPUT, "--param %s for method %s: expected an integer, found '%s'", s->name,
                               method, val);
            if (x < s->min || x > s->max)
                return kv_fail(KV_ERR_INPUT, "--param %s for method %s: expected a value in [%g, %g], found %s",
                               s->name, method, s->min, s->max, val);
        }
        ps->val[i] = x;
        ps->set[i] = 1;
        return KV_OK;
    }
    return kv_fail(KV_ERR_INPUT, "--param %.*s: method %s has no such parameter; accepted: %s", (int)nl, assignment,
                   method, accepted);
}

static int param_slot(const kv_param_set *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->spec[i].name, name) == 0) return i;
    fprintf(stderr, "kvbench: internal error: parameter '%s' is not in the method's table\n", name);
    abort(); /* a programming error in a retriever, never user input */
}

double kv_param(const kv_param_set *ps, const char *name) { return ps->val[param_slot(ps, name)]; }
int kv_param_int(const kv_param_set *ps, const char *name) { return (int)kv_param(ps, name); }
int kv_param_is_set(const kv_param_set *ps, const char *name) { return ps->set[param_slot(ps, name)]; }

void kv_params_format(const kv_param_set *ps, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < ps->n && used < cap; i++) {
        const kv_param_spec *s = &ps->spec[i];
        char v[64];
        if (s->type == KV_PARAM_ENUM) enum_name(s->choices, (int)ps->val[i], v, sizeof v);
        else if (s->type == KV_PARAM_INT) snprintf(v, sizeof v, "%.0f", ps->val[i]);
        else snprintf(v, sizeof v, "%g", ps->val[i]);
        int w = snprintf(buf + used, cap - used, "%s%s=%s", i ? "," : "", s->name, v);
        if (w < 0) break;
        used += (size_t)w;
    }
}

kv_status kv_method_search(const kv_method *m, void *state, int t, const float *q, int k, kv_selection *sel) {
    KV_TRY(m->search(state, t, q, k, sel));
    return m->candidates ? m->candidates(state, sel) : KV_OK;
}

const float *kv_prefill_k32(const kv_prefill *pre, int H, int D, float **tmp) {
    *tmp = NULL;
    if (!pre->half) return pre->k;
    kv_host_rows x = kv_prefill_keys(pre);
    if (!(*tmp = kv_malloc((size_t)H * pre->n * D * sizeof(float) + 1, "prefill keys (float32)"))) return NULL;
    for (int h = 0; h < H; h++) kv_host_rows_head(&x, h, D, 0, pre->n, *tmp + (size_t)h * pre->n * D);
    return *tmp;
}

kv_status kv_selection_alloc(kv_selection *s, int n_lists, int n_kv, int cap, int extra_cap, int cand_cap) {
    memset(s, 0, sizeof *s);
    s->n_lists = n_lists;
    s->cap = cap;
    s->extra_cap = extra_cap;
    s->cand_cap = cand_cap;
    size_t lc = (size_t)n_lists * (size_t)cap;
    s->count = kv_calloc((size_t)n_lists, sizeof(int), "selection counts");
    s->idx = kv_malloc(lc * sizeof(int32_t), "selection indices");
    s->logw = kv_malloc(lc * sizeof(float), "selection log-weights");
    s->n_extra = kv_calloc((size_t)n_kv, sizeof(int), "extra counts");
    s->extra = kv_malloc((size_t)n_kv * (size_t)extra_cap * sizeof(int32_t), "extra indices");
    s->n_cand = kv_calloc((size_t)n_lists, sizeof(int), "candidate counts");
    s->cand = kv_malloc((size_t)n_lists * (size_t)cand_cap * sizeof(int32_t), "candidate indices");
    if (!s->count || !s->idx || !s->logw || !s->n_extra || !s->extra || !s->n_cand || !s->cand) {
        kv_selection_free(s);
        return KV_ERR_NOMEM;
    }
    s->n_kv = n_kv;
    kv_selection_reset(s);
    return KV_OK;
}

void kv_selection_reset(kv_selection *s) {
    for (int i = 0; i < s->n_lists; i++) { s->count[i] = 0; s->n_cand[i] = -1; }
    for (int g = 0; g < s->n_kv; g++) s->n_extra[g] = 0;
    s->metric = NAN;
}

void kv_selection_free(kv_selection *s) {
    free(s->count); free(s->idx); free(s->logw); free(s->n_extra); free(s->extra); free(s->n_cand); free(s->cand);
    memset(s, 0, sizeof *s);
}
