/* `spattn bench --dump DIR`: see bench.h and docs/cli.md ("Dump files"). */
#include "bench.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "call.h"
#include "json.h"
#include "report.h"

int sp_dump_prepare(const char *dir) {
    struct stat st;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "spattn: --dump %s: cannot create: %s\n", dir, strerror(errno));
        return -1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "spattn: --dump %s: not a directory\n", dir);
        return -1;
    }
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/.spattn_dump_probe", dir);
    FILE *f = fopen(probe, "w");
    if (!f) {
        fprintf(stderr, "spattn: --dump %s: cannot write there: %s\n", dir, strerror(errno));
        return -1;
    }
    fclose(f);
    remove(probe);
    return 0;
}

static int little_endian(void) {
    const uint16_t x = 1;
    return *(const uint8_t *)&x == 1;
}

int sp_dump_case(const char *dir, const sp_opts *o, const sp_case *c, const sp_inputs *in,
                 double pairs, char *err, size_t errlen) {
    /* Varlen / paged cases are not dumped: their indices are packed over tokens ([Tq,N2,K])
     * and the peer scripts time batched [B,S,..] layouts only. */
    if (c->varlen) return 0;
    const int bsa = c->op == SP_OP_BSA;
    /* bsa: mask uint8 [B,N,nbx,nby]; sfa: indices int32 [B,S1,N2,K] (-1 = padding). */
    const char *what = bsa ? "mask" : "indices", *ext = bsa ? "u8" : "i32";
    const void *data = bsa ? (const void *)in->mask : (const void *)in->idx;
    const size_t esize = bsa ? 1 : 4;
    const int64_t n = bsa ? in->nmask : in->nidx;
    const int64_t shape[4] = {c->B, bsa ? c->N : c->S1, bsa ? in->nbx : c->N2, bsa ? in->nby : c->K};
    char file[160], path[4096];
    snprintf(file, sizeof file, "%s.%s.%s", c->name, what, ext);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, esize, (size_t)n, f) != (size_t)n || fclose(f)) {
        snprintf(err, errlen, "--dump: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s.json", dir, c->name);
    f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "--dump: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    sp_jw w;
    sp_jw_init(&w, f);
    sp_jw_obj(&w, NULL);
    sp_json_header(&w, o, "bench --dump");
    sp_jw_str(&w, "case", c->name);
    sp_jw_str(&w, "op", sp_op_name(c->op));
    sp_json_shape(&w, c); /* after scaling: the shape the data belongs to */
    sp_jw_num(&w, "softmax_scale", sp_softmax_scale(c));
    sp_jw_num(&w, "pairs", pairs);
    sp_jw_num(&w, "flops_fwd", sp_flops(c, pairs, 0));
    sp_jw_num(&w, "flops_bwd", sp_flops(c, pairs, 1));
    sp_jw_obj(&w, what);
    sp_jw_str(&w, "file", file);
    sp_jw_str(&w, "dtype", bsa ? "uint8" : "int32");
    sp_jw_str(&w, "byte_order", little_endian() ? "little" : "big");
    sp_jw_arr(&w, "shape");
    for (int i = 0; i < 4; i++) sp_jw_int(&w, NULL, shape[i]);
    sp_jw_end_arr(&w);
    sp_jw_end_obj(&w);
    sp_jw_end_obj(&w);
    if (fclose(f)) {
        snprintf(err, errlen, "--dump: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
