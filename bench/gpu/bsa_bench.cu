// Block-sparse attention on the GPU over the public case suite (cases/bsa.cases): for every
// case, verify ours (the public API, fast kernels) against the CUDA reference kernels with the
// eco criterion (cases/README.md), then time forward and backward with CUDA events around the
// whole call, L2 flushed before every repeat, median of `reps`: "fwd"/"bwd" with a reused plan
// (spattn_bsa_plan_create once, caller workspace: the kernels alone), "fwd_call"/"bwd_call"
// through the plain entry points (schedules built and workspace allocated in every call).  The
// plan's outputs must be bitwise equal to the plain calls'.
// Writes one JSON line per case pass to the --json file and each case's block mask to
// <maskdir>/<case>.u8 (so that the peer script times the very same masks); prints a table.
// Usage: bsa_bench [cases/bsa.cases] [--json out.json] [--masks dir] [--reps N] [--case substr]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/internal.h"
#include "spattn.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

struct Case {
    std::string name, pattern;
    int B = 1, N = 1, Nkv = 0, Sq = 0, Skv = 0, D = 128, bx = 64, by = 64, dt = SPATTN_DTYPE_F16;
    int window = 0, glob = 0, win = 0, rnd = 0;
    double density = 0;
    uint64_t seed = 0;
};

static std::vector<Case> load_cases(const char *path) {
    std::vector<Case> out;
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *h = strchr(line, '#');
        if (h) *h = 0;
        char *tok = strtok(line, " \t\r\n");
        if (!tok) continue;
        Case c;
        c.name = tok;
        while ((tok = strtok(NULL, " \t\r\n"))) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = 0;
            const char *k = tok, *v = eq + 1;
            if (!strcmp(k, "B")) c.B = atoi(v);
            else if (!strcmp(k, "N")) c.N = atoi(v);
            else if (!strcmp(k, "Nkv")) c.Nkv = atoi(v);
            else if (!strcmp(k, "Sq")) c.Sq = atoi(v);
            else if (!strcmp(k, "Skv")) c.Skv = atoi(v);
            else if (!strcmp(k, "D")) c.D = atoi(v);
            else if (!strcmp(k, "bx")) c.bx = atoi(v);
            else if (!strcmp(k, "by")) c.by = atoi(v);
            else if (!strcmp(k, "pattern")) c.pattern = v;
            else if (!strcmp(k, "window")) c.window = atoi(v);
            else if (!strcmp(k, "glob")) c.glob = atoi(v);
            else if (!strcmp(k, "win")) c.win = atoi(v);
            else if (!strcmp(k, "rand")) c.rnd = atoi(v);
            else if (!strcmp(k, "density")) c.density = atof(v);
            else if (!strcmp(k, "seed")) c.seed = strtoull(v, NULL, 0);
            else if (!strcmp(k, "dtype")) c.dt = !strcmp(v, "bf16") ? SPATTN_DTYPE_BF16 : !strcmp(v, "fp32") ? SPATTN_DTYPE_F32 : SPATTN_DTYPE_F16;
        }
        if (!c.Nkv) c.Nkv = c.N;
        out.push_back(c);
    }
    fclose(f);
    return out;
}

static uint64_t splitmix(uint64_t &x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Block mask by the rules of cases/README.md.
static std::vector<uint8_t> make_mask(const Case &c, int nbx, int nby) {
    std::vector<uint8_t> m((size_t)c.B * c.N * nbx * nby, 0);
    uint64_t st = c.seed * 1000003ull + 17;
    const long off = (long)c.Skv - c.Sq;
    for (int bn = 0; bn < c.B * c.N; bn++)
        for (int r = 0; r < nbx; r++) {
            const long qs = (long)r * c.bx, qe = std::min<long>((long)(r + 1) * c.bx, c.Sq) - 1;
            uint8_t *row = &m[((size_t)bn * nbx + r) * nby];
            for (int cc = 0; cc < nby; cc++) {
                const long ks = (long)cc * c.by, ke = std::min<long>((long)(cc + 1) * c.by, c.Skv) - 1;
                int v = 0;
                if (c.pattern == "dense") v = 1;
                else if (c.pattern == "causal") v = ks <= qe + off;
                else if (c.pattern == "window") v = ks <= qe + off && ke >= qs + off - c.window;
                else if (c.pattern == "bigbird")
                    v = cc < c.glob || r < c.glob || (ks <= qe + (long)c.win * c.by && ke >= qs - (long)c.win * c.by);
                else if (c.pattern == "random") v = (double)(splitmix(st) >> 11) * 0x1.0p-53 < c.density;
                row[cc] = (uint8_t)v;
            }
            if (c.pattern == "bigbird")
                for (int x = 0; x < c.rnd; x++) row[splitmix(st) % nby] = 1;
        }
    return m;
}

static double count_pairs(const Case &c, const std::vector<uint8_t> &m, int nbx, int nby) {
    double pairs = 0;
    for (int bn = 0; bn < c.B * c.N; bn++)
        for (int r = 0; r < nbx; r++)
            for (int cc = 0; cc < nby; cc++)
                if (m[((size_t)bn * nbx + r) * nby + cc])
                    pairs += (double)(std::min((r + 1) * c.bx, c.Sq) - r * c.bx) *
                             (double)(std::min((cc + 1) * c.by, c.Skv) - cc * c.by);
    return pairs;
}

__global__ void gen_normal(void *dst, long long n, uint64_t seed, int dt) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        uint64_t x = seed ^ (uint64_t)i * 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull; x = (x ^ (x >> 27)) * 0x94d049bb133111ebull; x ^= x >> 31;
        const double u1 = ((x >> 11) + 1) * 0x1.0p-53, u2 = (double)((x * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
        const float v = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        if (dt == SPATTN_DTYPE_BF16) ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
        else if (dt == SPATTN_DTYPE_F16) ((__half *)dst)[i] = __float2half_rn(v);
        else ((float *)dst)[i] = v;
    }
}

static float ld(const void *b, size_t i, int dt) {
    if (dt == SPATTN_DTYPE_F16) return __half2float(((const __half *)b)[i]);
    if (dt == SPATTN_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)b)[i]);
    return ((const float *)b)[i];
}

struct Eco { double ratio, maxe, rel; bool pass; };
static Eco eco(const void *dev_actual, int adt, const float *dev_golden, size_t n, int dt, bool is_lse) {
    std::vector<char> a(n * (adt == SPATTN_DTYPE_F32 ? 4 : 2));
    std::vector<float> g(n);
    CK(cudaMemcpy(a.data(), dev_actual, a.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g.data(), dev_golden, n * 4, cudaMemcpyDeviceToHost));
    double atol, rtol, lim;
    if (is_lse) { atol = 0x1p-16; rtol = 0x1p-10; lim = 0.01; }
    else if (dt == SPATTN_DTYPE_F16) { atol = rtol = 0x1p-9; lim = 0.1; }
    else { atol = rtol = 0x1p-6; lim = 1.0; }
    size_t ok = 0, special_bad = 0;
    double maxe = 0, num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = ld(a.data(), i, adt), y = g[i];
        if (!isfinite(x) || !isfinite(y)) {
            if ((isinf(y) && x == y) || (isnan(x) && isnan(y))) ok++;
            else special_bad++;
            continue;
        }
        const double e = fabs(x - y);
        ok += e <= atol + rtol * fabs(y);
        maxe = std::max(maxe, e);
        num += e * e;
        den += y * y;
    }
    Eco r;
    r.ratio = (double)ok / n;
    r.maxe = maxe;
    r.rel = den > 0 ? sqrt(num / den) : 0;
    r.pass = r.ratio >= 0.99 && maxe <= lim && special_bad == 0;
    return r;
}

static spattn_tensor dt4(void *p, int dt, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    spattn_tensor t = spattn_tensor_make(p, (spattn_dtype)dt, 4, sh, NULL);
    t.device_type = SPATTN_DEVICE_CUDA;
    return t;
}

int main(int argc, char **argv) {
    const char *path = "cases/bsa.cases", *json = NULL, *maskdir = NULL, *only = NULL;
    int reps = 15, verify = 1, passes = 3;  // bit 0: forward, bit 1: backward
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--masks") && i + 1 < argc) maskdir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--case") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--no-verify")) verify = 0;
        else if (!strcmp(argv[i], "--pass") && i + 1 < argc) {
            i++;
            passes = !strcmp(argv[i], "fwd") ? 1 : !strcmp(argv[i], "bwd") ? 2 : 3;
        }
        else path = argv[i];
    }
    if (!spattn_cuda_available()) { printf("bsa_bench: no CUDA device: skipped\n"); return 0; }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::vector<Case> cases = load_cases(path);
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf) fprintf(jf, "{\"name\": \"spattn\", \"backend\": \"cuda\", \"device\": \"%s\", \"results\": [\n", prop.name);
    int nfail = 0;
    std::vector<std::string> entries;
    const size_t flush_bytes = (size_t)prop.l2CacheSize * 2;
    void *flush;
    CK(cudaMalloc(&flush, flush_bytes));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%-28s %6s %9s %9s %9s %9s %9s %9s  %s\n", "case", "dens", "fwd_ms", "fwd_TF", "bwd_ms", "bwd_TF",
           "fwdcall", "bwdcall", "verify");
    for (const Case &c : cases) {
        if (only && !strstr(c.name.c_str(), only)) continue;
        const int nbx = (c.Sq + c.bx - 1) / c.bx, nby = (c.Skv + c.by - 1) / c.by, dt = c.dt;
        std::vector<uint8_t> mask = make_mask(c, nbx, nby);
        const double pairs = count_pairs(c, mask, nbx, nby);
        if (maskdir) {
            std::string mp = std::string(maskdir) + "/" + c.name + ".u8";
            FILE *mf = fopen(mp.c_str(), "wb");
            if (mf) { fwrite(mask.data(), 1, mask.size(), mf); fclose(mf); }
        }
        const size_t nq = (size_t)c.B * c.N * c.Sq * c.D, nk = (size_t)c.B * c.Nkv * c.Skv * c.D,
                     nrow = (size_t)c.B * c.N * c.Sq, es = dt == SPATTN_DTYPE_F32 ? 4 : 2;
        void *q, *k, *v, *dO, *o, *dq, *dk, *dv, *m;
        float *lse;
        CK(cudaMalloc(&q, nq * es)); CK(cudaMalloc(&k, nk * es)); CK(cudaMalloc(&v, nk * es));
        CK(cudaMalloc(&dO, nq * es)); CK(cudaMalloc(&o, nq * es)); CK(cudaMalloc(&dq, nq * es));
        CK(cudaMalloc(&dk, nk * es)); CK(cudaMalloc(&dv, nk * es)); CK(cudaMalloc(&m, mask.size()));
        CK(cudaMalloc(&lse, nrow * 4));
        gen_normal<<<1024, 256>>>(q, nq, c.seed * 4 + 1, dt);
        gen_normal<<<1024, 256>>>(k, nk, c.seed * 4 + 2, dt);
        gen_normal<<<1024, 256>>>(v, nk, c.seed * 4 + 3, dt);
        gen_normal<<<1024, 256>>>(dO, nq, c.seed * 4 + 4, dt);
        CK(cudaMemcpy(m, mask.data(), mask.size(), cudaMemcpyHostToDevice));
        CK(cudaMemset(o, 0xff, nq * es)); CK(cudaMemset(lse, 0xff, nrow * 4));
        CK(cudaMemset(dq, 0xff, nq * es)); CK(cudaMemset(dk, 0xff, nk * es)); CK(cudaMemset(dv, 0xff, nk * es));
        CK(cudaDeviceSynchronize());
        spattn_tensor tq = dt4(q, dt, c.B, c.N, c.Sq, c.D), tk = dt4(k, dt, c.B, c.Nkv, c.Skv, c.D),
                      tv = dt4(v, dt, c.B, c.Nkv, c.Skv, c.D), tdo = dt4(dO, dt, c.B, c.N, c.Sq, c.D),
                      to = dt4(o, dt, c.B, c.N, c.Sq, c.D), tdq = dt4(dq, dt, c.B, c.N, c.Sq, c.D),
                      tdk = dt4(dk, dt, c.B, c.Nkv, c.Skv, c.D), tdv = dt4(dv, dt, c.B, c.Nkv, c.Skv, c.D),
                      tm = dt4(m, SPATTN_DTYPE_U8, c.B, c.N, nbx, nby);
        int64_t shl[3] = {c.B, c.N, c.Sq};
        spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, shl, NULL);
        tl.device_type = SPATTN_DEVICE_CUDA;
        spattn_options opt;
        spattn_options_init(&opt);
        opt.cuda_stream = st;
        auto fwd = [&]() { return spattn_bsa_fwd_ex(&tq, &tk, &tv, &tm, c.bx, c.by, 0.0, &to, &tl, &opt); };
        auto bwd = [&]() {
            return spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, c.bx, c.by, 0.0, &tdq, &tdk, &tdv, &opt);
        };
        spattn_status s1 = fwd();
        CK(cudaStreamSynchronize(st));
        spattn_status s2 = s1 ? s1 : bwd();
        CK(cudaStreamSynchronize(st));
        if (s1 || s2) {
            printf("%-28s ERROR %d %s\n", c.name.c_str(), s1 ? s1 : s2, spattn_last_error());
            nfail++;
            continue;
        }
        // the plan path: same bits as the plain calls
        spattn_bsa_plan *plan = NULL;
        void *pws = NULL;
        spattn_options popt = opt;
        {
            std::vector<char> o_ref(nq * es), dq_ref(nq * es), dk_ref(nk * es), dv_ref(nk * es);
            CK(cudaMemcpy(o_ref.data(), o, nq * es, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(dq_ref.data(), dq, nq * es, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(dk_ref.data(), dk, nk * es, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(dv_ref.data(), dv, nk * es, cudaMemcpyDeviceToHost));
            size_t w0 = 0, w1 = 0;
            spattn_status s = spattn_bsa_plan_create(&tm, c.bx, c.by, c.Sq, c.Skv, c.Nkv, &opt, &plan);
            if (!s) s = spattn_bsa_plan_workspace_size(plan, &tq, &tk, &tv, 0, &opt, &w0);
            if (!s) s = spattn_bsa_plan_workspace_size(plan, &tq, &tk, &tv, 1, &opt, &w1);
            if (s) { printf("%-28s PLAN ERROR %d %s\n", c.name.c_str(), s, spattn_last_error()); exit(1); }
            popt.workspace_size = std::max(w0, w1);
            if (popt.workspace_size) CK(cudaMalloc(&pws, popt.workspace_size));
            popt.workspace = pws;
            CK(cudaMemset(o, 0xff, nq * es)); CK(cudaMemset(dq, 0xff, nq * es));
            CK(cudaMemset(dk, 0xff, nk * es)); CK(cudaMemset(dv, 0xff, nk * es));
            s = spattn_bsa_fwd_plan(plan, &tq, &tk, &tv, 0.0, &to, &tl, &popt);
            if (!s) s = spattn_bsa_bwd_plan(plan, &tq, &tk, &tv, &to, &tdo, &tl, 0.0, &tdq, &tdk, &tdv, &popt);
            CK(cudaStreamSynchronize(st));
            if (s) { printf("%-28s PLAN CALL ERROR %d %s\n", c.name.c_str(), s, spattn_last_error()); exit(1); }
            std::vector<char> x(nq * es), y(nk * es);
            bool same = true;
            CK(cudaMemcpy(x.data(), o, nq * es, cudaMemcpyDeviceToHost)); same &= x == o_ref;
            CK(cudaMemcpy(x.data(), dq, nq * es, cudaMemcpyDeviceToHost)); same &= x == dq_ref;
            CK(cudaMemcpy(y.data(), dk, nk * es, cudaMemcpyDeviceToHost)); same &= y == dk_ref;
            CK(cudaMemcpy(y.data(), dv, nk * es, cudaMemcpyDeviceToHost)); same &= y == dv_ref;
            if (!same) { printf("%-28s FAIL: plan outputs differ from the plain calls\n", c.name.c_str()); nfail++; }
        }
        auto fwd_p = [&]() { return spattn_bsa_fwd_plan(plan, &tq, &tk, &tv, 0.0, &to, &tl, &popt); };
        auto bwd_p = [&]() {
            return spattn_bsa_bwd_plan(plan, &tq, &tk, &tv, &to, &tdo, &tl, 0.0, &tdq, &tdk, &tdv, &popt);
        };
        std::string vres = "skipped";
        if (verify) {
            spattn_bsa_problem p = {};
            p.q = &tq; p.k = &tk; p.v = &tv; p.mask = &tm; p.dout = &tdo;
            p.B = c.B; p.N = c.N; p.Nkv = c.Nkv; p.Sq = c.Sq; p.Skv = c.Skv; p.D = c.D;
            p.bx = c.bx; p.by = c.by; p.nbx = nbx; p.nby = nby; p.scale = (float)(1.0 / sqrt((double)c.D)); p.dtype = dt;
            spattn_exec ex = {};
            ex.stream = st;
            float *go, *gl, *gq, *gk, *gv;
            CK(cudaMalloc(&go, nq * 4)); CK(cudaMalloc(&gl, nrow * 4)); CK(cudaMalloc(&gq, nq * 4));
            CK(cudaMalloc(&gk, nk * 4)); CK(cudaMalloc(&gv, nk * 4));
            if (spattn_cuda_ref_bsa_fwd(&p, &ex, go, gl) || spattn_cuda_ref_bsa_bwd(&p, &ex, gq, gk, gv)) {
                vres = std::string("ref error: ") + spattn_last_error();
                nfail++;
            } else {
                Eco r[5] = {eco(o, dt, go, nq, dt, false), eco(lse, SPATTN_DTYPE_F32, gl, nrow, dt, true),
                            eco(dq, dt, gq, nq, dt, false), eco(dk, dt, gk, nk, dt, false), eco(dv, dt, gv, nk, dt, false)};
                const char *nm[5] = {"O", "LSE", "dQ", "dK", "dV"};
                bool all = true;
                char buf[512] = "";
                for (int i = 0; i < 5; i++) {
                    all &= r[i].pass;
                    char t[100];
                    snprintf(t, sizeof t, "%s%s %.4f/%.2g/%.2g ", r[i].pass ? "" : "FAIL:", nm[i], r[i].ratio, r[i].maxe, r[i].rel);
                    strcat(buf, t);
                }
                vres = std::string(all ? "PASS " : "FAIL ") + buf;
                if (!all) nfail++;
            }
            cudaFree(go); cudaFree(gl); cudaFree(gq); cudaFree(gk); cudaFree(gv);
        }
        double med[4] = {NAN, NAN, NAN, NAN};  // fwd plan, bwd plan, fwd plain call, bwd plain call
        for (int pass = 0; pass < 4; pass++) {
            if (!(passes >> (pass & 1) & 1)) continue;
            std::vector<float> ts;
            for (int r = 0; r < reps + 2; r++) {
                CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, st));
                CK(cudaEventRecord(e0, st));
                spattn_status s = pass == 0 ? fwd_p() : pass == 1 ? bwd_p() : pass == 2 ? fwd() : bwd();
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                if (s) { fprintf(stderr, "timing call failed: %s\n", spattn_last_error()); exit(1); }
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 2) ts.push_back(ms);
            }
            std::sort(ts.begin(), ts.end());
            med[pass] = ts.size() % 2 ? ts[ts.size() / 2] : 0.5 * (ts[ts.size() / 2 - 1] + ts[ts.size() / 2]);
        }
        const double ff = 4.0 * c.D * pairs, fb = 10.0 * c.D * pairs;
        const double tf = ff / (med[0] * 1e-3) / 1e12, tb = fb / (med[1] * 1e-3) / 1e12;
        const double dens = pairs / ((double)c.B * c.N * c.Sq * c.Skv);
        printf("%-28s %6.3f %9.4f %9.1f %9.4f %9.1f %9.4f %9.4f  %s\n", c.name.c_str(), dens, med[0], tf, med[1], tb,
               med[2], med[3], vres.c_str());
        fflush(stdout);
        static const char *const pname[4] = {"fwd", "bwd", "fwd_call", "bwd_call"};
        for (int pass = 0; pass < 4; pass++) {
            if (!(passes >> (pass & 1) & 1)) continue;
            const double fl = pass & 1 ? fb : ff;
            char t[400];
            snprintf(t, sizeof t,
                     "  {\"case\": \"%s\", \"pass\": \"%s\", \"median_ms\": %.6f, \"tflops\": %.3f, "
                     "\"flops\": %.6g, \"pairs\": %.0f, \"verify\": \"%s\"}",
                     c.name.c_str(), pname[pass], med[pass], fl / (med[pass] * 1e-3) / 1e12, fl, pairs,
                     vres.substr(0, 4).c_str());
            entries.push_back(t);
        }
        spattn_bsa_plan_destroy(plan);
        if (pws) cudaFree(pws);
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(dO); cudaFree(o); cudaFree(dq); cudaFree(dk); cudaFree(dv);
        cudaFree(m); cudaFree(lse);
    }
    if (jf) {
        for (size_t i = 0; i < entries.size(); i++) fprintf(jf, "%s%s\n", entries[i].c_str(), i + 1 < entries.size() ? "," : "");
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    printf("bsa_bench: %d case(s) failed\n", nfail);
    return nfail ? 1 : 0;
}
