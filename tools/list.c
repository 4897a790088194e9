/* `spattn list`: the selected cases with their (scaled) shapes and work, without running. */
#include <stdio.h>

#include "cli.h"
#include "gen.h"
#include "spattn.h"

int sp_cmd_list(sp_opts *o) {
    if (o->backend == SPATTN_BACKEND_AUTO)
        o->backend = spattn_cuda_available() ? SPATTN_BACKEND_CUDA : SPATTN_BACKEND_CPU;
    sp_case_list cases;
    if (sp_select_cases(o, &cases)) return SP_EXIT_USAGE;
    double f = sp_effective_scale(o);
    if (f < 1.0) printf("SCALED: sequence lengths x%g (backend %s)\n", f,
                        o->backend == SPATTN_BACKEND_CUDA ? "cuda" : "cpu");
    double tot[2] = {0, 0};
    for (int i = 0; i < cases.n; i++) {
        const sp_case *c = &cases.v[i];
        char shape[256];
        sp_case_shape_str(c, shape, sizeof shape);
        double p = sp_pairs_estimate(c);
        double ff = sp_flops(c, p, 0), fb = sp_flops(c, p, 1);
        tot[0] += ff;
        tot[1] += fb;
        printf("%-26s %s %-4s %s  fwd %.2f GFLOP  bwd %.2f GFLOP  (%s:%d)\n", c->name,
               sp_op_name(c->op), spattn_dtype_name((spattn_dtype)c->dtype), shape, ff / 1e9,
               fb / 1e9, c->file, c->line);
    }
    printf("%d cases, fwd %.1f GFLOP, bwd %.1f GFLOP in all\n", cases.n, tot[0] / 1e9, tot[1] / 1e9);
    sp_case_list_free(&cases);
    return SP_EXIT_OK;
}
