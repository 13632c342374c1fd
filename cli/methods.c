/* methods.c: the method list of `kvbench run` and `kvbench bench`:
 * "--method a,b" resolved against the registry (unknown or repeated names
 * are usage errors) and the --param assignments applied: "M.N=V" to method
 * M only, "N=V" to every listed method that has a parameter N; a name no
 * listed method has is an error that lists the accepted names. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "results.h"

int kv_pick_methods(const char *cmd, const char *list, const char *const *params, int n_params, kv_method_run *runs,
                    int max, int *n_runs) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const kv_method *m = kv_method_find(tok);
        if (!m) return kv_usage_error(cmd, "--method: unknown method '%s' (kvbench list shows them)", tok);
        if (n >= max) return kv_usage_error(cmd, "--method: at most %d methods", max);
        for (int i = 0; i < n; i++)
            if (runs[i].m == m) return kv_usage_error(cmd, "--method: '%s' listed twice", tok);
        memset(&runs[n], 0, sizeof runs[n]);
        runs[n].m = m;
        kv_params_init(&runs[n].ps, m->params);
        n++;
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
            if (!applied) return kv_usage_error(cmd, "--param %s: method '%.*s' is not in --method", a, (int)(dot - a), a);
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
    for (int i = 0; i < n; i++) kv_params_format(&runs[i].ps, runs[i].params, sizeof runs[i].params);
    *n_runs = n;
    return -1;
}
