/* Finding the case files, loading them, filtering and scaling the cases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "spattn.h"

static int is_dir(const char *p) {
    struct stat st;
    return p && *p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* --cases-dir, else $SPATTN_CASES_DIR, else the source tree's cases/ (compiled in), else
 * ./cases: the first that names a directory. */
static const char *cases_dir(const sp_opts *o) {
    if (o->cases_dir) return o->cases_dir;
    const char *env = getenv("SPATTN_CASES_DIR");
    if (env && *env) return env;
#ifdef SPATTN_DEFAULT_CASES_DIR
    if (is_dir(SPATTN_DEFAULT_CASES_DIR)) return SPATTN_DEFAULT_CASES_DIR;
#endif
    return "cases";
}

int sp_select_cases(sp_opts *o, sp_case_list *out) {
    static const char *const kDefault[] = {"bsa", "sfa"};
    const char *const *suites = o->n_suites ? o->suites : kDefault;
    int n = o->n_suites ? o->n_suites : 2;
    const char *dir = cases_dir(o);
    sp_case_list all = {0};
    char err[1024], path[1024];
    for (int i = 0; i < n; i++) {
        const char *s = suites[i];
        size_t len = strlen(s);
        int is_file = strchr(s, '/') || (len > 6 && !strcmp(s + len - 6, ".cases"));
        if (is_file) snprintf(path, sizeof path, "%s", s);
        else snprintf(path, sizeof path, "%s/%s.cases", dir, s);
        if (!is_file && !is_dir(dir)) {
            fprintf(stderr, "spattn: %s:0: cannot open case file: the cases directory '%s' does not "
                    "exist (use --cases-dir DIR or set SPATTN_CASES_DIR)\n", path, dir);
            sp_case_list_free(&all);
            return -1;
        }
        int before = all.n;
        if (sp_cases_load(path, &all, err, sizeof err)) {
            fprintf(stderr, "spattn: %s\n", err);
            sp_case_list_free(&all);
            return -1;
        }
        if (all.n == before) { /* not "no case matches the filters": there was nothing */
            fprintf(stderr, "spattn: %s:0: the file holds no case\n", path);
            sp_case_list_free(&all);
            return -1;
        }
    }
    /* The same case name in two files would make the results ambiguous. */
    for (int i = 0; i < all.n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(all.v[i].name, all.v[j].name)) {
                fprintf(stderr, "spattn: %s:%d: case %s: name already used at %s:%d\n",
                        all.v[i].file, all.v[i].line, all.v[i].name, all.v[j].file, all.v[j].line);
                sp_case_list_free(&all);
                return -1;
            }
    const double f = sp_effective_scale(o);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < all.n; i++) {
        const sp_case *c = &all.v[i];
        if (o->op >= 0 && c->op != o->op) continue;
        if (o->dtype >= 0 && c->dtype != o->dtype) continue;
        if (o->has_re && regexec(&o->re, c->name, 0, NULL, 0) != 0) continue;
        if (out->n == out->cap) {
            out->cap = out->cap ? out->cap * 2 : 64;
            sp_case *v = realloc(out->v, (size_t)out->cap * sizeof *v);
            if (!v) {
                fprintf(stderr, "spattn: out of memory\n");
                sp_case_list_free(&all);
                return -1;
            }
            out->v = v;
        }
        sp_case_scale(c, f, &out->v[out->n++]);
    }
    sp_case_list_free(&all);
    return 0;
}

int sp_resolve_backend(sp_opts *o) {
    if (o->backend == SPATTN_BACKEND_AUTO)
        o->backend = spattn_cuda_available() ? SPATTN_BACKEND_CUDA : SPATTN_BACKEND_CPU;
    else if (o->backend == SPATTN_BACKEND_CUDA && !spattn_cuda_available()) {
        fprintf(stderr, "spattn: --backend cuda: no usable CUDA device (or spattn was built "
                "without CUDA); use --backend cpu\n");
        return -1;
    }
    return 0;
}

double sp_effective_scale(const sp_opts *o) {
    if (o->scale > 0.0) return o->scale >= 1.0 ? 1.0 : o->scale;
    return o->backend == SPATTN_BACKEND_CPU ? SP_CPU_DEFAULT_SCALE : 1.0;
}
