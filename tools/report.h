/* Per-case results kept for the summary and the JSON file, and the common JSON header. */
#ifndef SPATTN_CLI_REPORT_H
#define SPATTN_CLI_REPORT_H

#include "cli.h"
#include "eco.h"
#include "json.h"

typedef struct sp_tensor_res {
    char name[16];
    int pass;       /* SP_PASS_* */
    int32_t dtype;
    sp_eco eco;
    sp_tol tol;
    double worst_actual, worst_golden;
} sp_tensor_res;

typedef struct sp_case_res {
    const sp_case *c;
    int pass;        /* 1 when every tensor passed */
    int status;      /* spattn_status of a failing call, else 0 */
    char msg[1024];
    double fwd_ms, bwd_ms, ref_ms, total_ms, pairs;
    int nt;
    sp_tensor_res t[8];
} sp_case_res;

/* "tool", "command", "version", "backend", "name", "device", "threads", "scale", "scaled". */
void sp_json_header(sp_jw *w, const sp_opts *o, const char *command);
/* "shape": {...} of a case (after scaling). */
void sp_json_shape(sp_jw *w, const sp_case *c);
const char *sp_dtype_str(int32_t dtype);
const char *sp_backend_str(int backend);

#endif
