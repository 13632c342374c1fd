/* list.c: `kvbench list`: every registered method, its selection
 * granularity, and its parameter table (the same table validation reads). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../retrievers/kv_retriever.h"
#include "cli.h"

/* " (pool=none: per query head)" or " (pool=mean|max: per kv head)": how the
 * method's pooling parameter changes the granularity printed before it. */
static void pool_hint(const kv_method *m, int pooled, char *buf, size_t cap) {
    buf[0] = 0;
    if (m->per_kv_head || !m->group_pool_param) return;
    for (const kv_param_spec *s = m->params; s && s->name; s++) {
        if (strcmp(s->name, m->group_pool_param) || !s->choices) continue;
        if (pooled) { snprintf(buf, cap, " (%s=none: per query head)", s->name); return; }
        char others[128] = "";
        for (const char *c = s->choices; c && *c;) {
            const char *e = strchr(c, '|');
            int len = e ? (int)(e - c) : (int)strlen(c);
            if (strncmp(c, "none", 4))
                snprintf(others + strlen(others), sizeof others - strlen(others), "%s%.*s", others[0] ? "|" : "", len, c);
            c = e ? e + 1 : NULL;
        }
        snprintf(buf, cap, " (%s=%s: per kv head)", s->name, others);
    }
}

int cmd_list(int argc, char **argv) {
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: kvbench list [--verbose]\nLists every method: summary, granularity, parameters "
                 "(name, type, default, range, stage, help).");
            return 0;
        } else return kv_usage_error("list", "unexpected argument '%s'", argv[i]);
    }
    int n;
    const kv_method *const *all = kv_methods(&n);
    for (int i = 0; i < n; i++) {
        const kv_method *m = all[i];
        kv_param_set dp;
        kv_params_init(&dp, m->params);
        printf("%-12s %s\n", m->name, m->summary);
        int pooled = kv_method_group_consistent(m, &dp);
        char hint[160];
        pool_hint(m, pooled, hint, sizeof hint);
        printf("%-12s selects per %s%s%s%s; %s\n%-12s from: %s\n", "", pooled ? "kv head (group-consistent)" : "query head",
               hint, m->variable_budget ? ", variable budget" : "", m->uses_logw ? ", log-weights" : "",
               m->has_gpu ? "CPU and GPU" : "CPU only", "", m->paper);
        for (const kv_param_spec *s = m->params; s && s->name; s++) {
            char *range = s->type == KV_PARAM_ENUM ? kv_strfmt("%s", s->choices)
                        : s->type == KV_PARAM_INT  ? kv_strfmt("int [%.0f, %.0f]", s->min, s->max)
                                                   : kv_strfmt("float [%g, %g]", s->min, s->max);
            /* the default as results record it: the table from s on, formatted, cut at its first entry */
            size_t cap = 1;
            for (const kv_param_spec *x = s; x->name; x++) cap += strlen(x->name) + 65;
            char *def = malloc(cap);
            if (!range || !def) { free(range); free(def); return kv_report(KV_ERR_NOMEM); }
            kv_param_set ps;
            kv_params_init(&ps, s);
            kv_params_format(&ps, def, cap);
            char *comma = strchr(def, ',');
            if (comma) *comma = 0;
            printf("%-12s   --param %-24s %-24s %-6s %s\n", "", def, range,
                   s->stage == KV_PARAM_BUILD ? "build" : "search", s->help);
            free(range);
            free(def);
        }
        if (verbose && m->describe) m->describe(stdout);
    }
    for (const char *const *a = kv_methods_absent(); *a; a++) printf("%s\n", *a);
    return 0;
}
