/* methods.c: the method list of `kvbench run` and `kvbench bench`:
 * "--method a,b" resolved against the registry (unknown or repeated names
 * are usage errors) and the --param assignments applied: "M.N=V" to method
 * M only, "N=V" to every listed method that has a parameter N; a name no
 * listed method has is an error that lists the accepted names. An empty
 * list or an empty name ("", ",", "exact,") is a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "results.h"

int kv_pick_methods(const char *cmd, const char *list, const char *const *params, int n_params, kv_method_run *runs,
                    int max, int *n_runs) {
    int n = 0;
    const char *p0 = list;
    for (;;) {
        const char *c = strchr(p0, ',');
        size_t len = c ? (size_t)(c - p0) : strlen(p0);
        if (len == 0)
            return kv_usage_error(cmd, "--method: expected comma-separated method names (kvbench list shows them), "
                                       "found %s in '%s'", *list ? "an empty name" : "nothing", list);
        const kv_method *m = NULL;
        int total;
        const kv_method *const *all = kv_methods(&total);
        for (int i = 0; i < total && !m; i++)
            if (strlen(all[i]->name) == len && !strncmp(all[i]->name, p0, len)) m = all[i];
        if (!m) return kv_usage_error(cmd, "--method: unknown method '%.*s' (kvbench list shows them)", (int)len, p0);
        if (n >= max) return kv_usage_error(cmd, "--method: at most %d methods, found more in '%s'", max, list);
        for (int i = 0; i < n; i++)
            if (runs[i].m == m) return kv_usage_error(cmd, "--method: '%s' listed twice", m->name);
        memset(&runs[n], 0, sizeof runs[n]);
        runs[n].m = m;
        kv_params_init(&runs[n].ps, m->params);
        n++;
        if (!c) break;
        p0 = c + 1;
    }
    for (int p = 0; p < n_params; p++) {
        const char *a = params[p], *eq = strchr(a, '='), *dot = strchr(a, '.');
        int applied = 0;
        if (dot && (!eq || dot < eq)) { /* method.name=value */
            for (int i = 0; i < n; i++)
                if (strlen(runs[i].m->name) == (size_t)(dot - a) && !strncmp(runs[i].m->name, a, dot - a)) {
                    kv_status st = kv_params_set(&runs[i].ps, runs[i].m->name, dot + 1);
                    if (st != KV_OK) return kv_report(st);
                    applied = 1;
                }
            if (!applied)
                return kv_usage_error(cmd, "--param %s: expected a method of --method (%s), found '%.*s'", a, list,
                                      (int)(dot - a), a);
            continue;
        }
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        for (int i = 0; i < n; i++)
            for (const kv_param_spec *s = runs[i].m->params; s && s->name; s++)
                if (strlen(s->name) == nl && !strncmp(s->name, a, nl)) {
                    kv_status st = kv_params_set(&runs[i].ps, runs[i].m->name, a);
                    if (st != KV_OK) return kv_report(st);
                    applied = 1;
                }
        if (!applied) {
            kv_status st = kv_params_set(&runs[0].ps, runs[0].m->name, a); /* lists the accepted names */
            if (st != KV_OK) return kv_report(st);
        }
    }
    for (int i = 0; i < n; i++) {
        size_t need = 1; /* "name=value," per parameter; a value is formatted into at most 63 characters */
        for (const kv_param_spec *s = runs[i].m->params; s && s->name; s++) need += strlen(s->name) + 65;
        if (need > sizeof runs[i].params)
            return kv_report(kv_fail(KV_ERR_INTERNAL, "method %s: its parameter list needs up to %zu bytes, more "
                                     "than the %zu kept for results", runs[i].m->name, need, sizeof runs[i].params));
        kv_params_format(&runs[i].ps, runs[i].params, sizeof runs[i].params);
    }
    *n_runs = n;
    return -1;
}
