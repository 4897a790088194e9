#include "report.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "spattn.h"

const char *sp_dtype_str(int32_t dtype) { return spattn_dtype_name((spattn_dtype)dtype); }

const char *sp_backend_str(int backend) {
    return backend == SPATTN_BACKEND_CUDA ? "cuda" : backend == SPATTN_BACKEND_CPU ? "cpu" : "auto";
}

void sp_json_header(sp_jw *w, const sp_opts *o, const char *command) {
    char dev[512];
    sp_device_name(o, dev, sizeof dev);
    double f = sp_effective_scale(o);
    sp_jw_str(w, "tool", "spattn");
    sp_jw_str(w, "command", command);
    sp_jw_str(w, "version", spattn_version(NULL, NULL, NULL));
    sp_jw_str(w, "name", "spattn");
    sp_jw_str(w, "backend", sp_backend_str(o->backend));
    sp_jw_str(w, "device", dev);
    int threads = o->threads;
#ifdef _OPENMP
    /* The count OpenMP resolves "default" to, so results say what actually ran. */
    if (threads == 0 && o->backend == SPATTN_BACKEND_CPU) threads = omp_get_max_threads();
#endif
    sp_jw_int(w, "threads", threads);
    sp_jw_num(w, "scale", f);
    sp_jw_bool(w, "scaled", f < 1.0);
}

void sp_json_shape(sp_jw *w, const sp_case *c) {
    sp_jw_obj(w, "shape");
    sp_jw_int(w, "B", c->B);
    if (c->op == SP_OP_BSA) {
        sp_jw_int(w, "N", c->N);
        sp_jw_int(w, "Nkv", c->Nkv);
        sp_jw_int(w, "Sq", c->Sq);
        sp_jw_int(w, "Skv", c->Skv);
        sp_jw_int(w, "D", c->D);
        sp_jw_int(w, "bx", c->bx);
        sp_jw_int(w, "by", c->by);
        sp_jw_str(w, "pattern", sp_pattern_name(c->pattern));
        if (c->pattern == SP_PAT_WINDOW) sp_jw_int(w, "window", c->window);
        if (c->pattern == SP_PAT_BIGBIRD) {
            sp_jw_int(w, "glob", c->glob);
            sp_jw_int(w, "win", c->win);
            sp_jw_int(w, "rand", c->rnd);
        }
        if (c->pattern == SP_PAT_RANDOM) sp_jw_num(w, "density", c->density);
    } else {
        sp_jw_int(w, "S1", c->S1);
        sp_jw_int(w, "S2", c->S2);
        sp_jw_int(w, "N1", c->N1);
        sp_jw_int(w, "N2", c->N2);
        sp_jw_int(w, "D", c->D);
        sp_jw_int(w, "Dr", c->Dr);
        sp_jw_int(w, "K", c->K);
        sp_jw_int(w, "sbs", c->sbs);
        sp_jw_int(w, "mode", c->mode);
        sp_jw_str(w, "kv", c->shared_kv ? "shared" : "separate");
    }
    sp_jw_str(w, "dtype", sp_dtype_str(c->dtype));
    sp_jw_int(w, "seed", (int64_t)c->seed);
    if (c->varlen) {
        /* Varlen: B is the sequence count and Sq/Skv (S1/S2) the max lengths; the lengths
         * themselves (after scaling) let a peer regenerate the packed inputs. */
        sp_jw_int(w, "page", c->page);
        sp_jw_arr(w, "lens");
        for (int64_t b = 0; b < c->nseq; b++) sp_jw_int(w, NULL, c->lens[b]);
        sp_jw_end_arr(w);
        sp_jw_arr(w, "kvlens");
        for (int64_t b = 0; b < c->nseq; b++) sp_jw_int(w, NULL, c->kvlens[b]);
        sp_jw_end_arr(w);
    }
    sp_jw_end_obj(w);
}
