/*
 * Case files (cases/NAME.cases): one case per line, a name followed by key=value pairs; '#'
 * starts a comment.  The parser checks every key and value so that a bad line ends the run
 * with "file:line: message" instead of a crash or a silently wrong case.
 */
#ifndef SPATTN_CLI_CASES_H
#define SPATTN_CLI_CASES_H

#include <stddef.h>
#include <stdint.h>

enum { SP_OP_BSA = 0, SP_OP_SFA = 1, SP_OP_COUNT = 2 };
enum { SP_PAT_DENSE, SP_PAT_CAUSAL, SP_PAT_WINDOW, SP_PAT_BIGBIRD, SP_PAT_RANDOM };

/* Most sequences a varlen case may hold (the lengths live in the case, by value). */
#define SP_MAX_SEQS 1024

typedef struct sp_case {
    char name[96];
    char file[512];   /* where the case was read (for file:line messages) */
    int line;
    int op;           /* SP_OP_* */
    int32_t dtype;    /* spattn_dtype of q, k, v, dO and the outputs */
    uint64_t seed;    /* key seed=, default 0 */
    int64_t B, D;
    /* bsa: q [B,N,Sq,D], k/v [B,Nkv,Skv,D] */
    int64_t N, Nkv, Sq, Skv, bx, by;
    int pattern;      /* SP_PAT_* */
    int64_t window;   /* tokens (pattern=window) */
    int64_t glob, win, rnd; /* blocks (pattern=bigbird) */
    double density;   /* pattern=random */
    /* sfa: q [B,S1,N1,D+Dr], k [B,S2,N2,D+Dr], indices [B,S1,N2,K] */
    int64_t S1, S2, N1, N2, Dr, K, sbs;
    int32_t mode;     /* 0 or 3 */
    int shared_kv;    /* 1: v is the first D columns of k (kv=shared, the default) */
    double scaled_by; /* 1 unless sp_case_scale changed the sequence lengths */
    /* Packed variable-length batch (cases/README.md, "Varlen and paged cases"): B sequences
     * with their own lengths; Sq/Skv (bsa) and S1/S2 (sfa) then hold max_seqlen_q/kv. */
    int varlen;        /* 1 when lens= or nseq= was given */
    int64_t page;      /* page size of paged keys (page=), 0: packed keys */
    int64_t nseq, total, ctx; /* the generator's parameters (nseq=, total=, ctx=), 0 if unused */
    uint64_t lens_seed;       /* lens_seed= of the generator */
    int lens_explicit;        /* 1: lens= (and kvlens=) listed the lengths */
    int32_t lens[SP_MAX_SEQS], kvlens[SP_MAX_SEQS]; /* per sequence (after scaling) */
} sp_case;

typedef struct sp_case_list {
    sp_case *v;
    int n, cap;
} sp_case_list;

/* Parses `text` (the contents of `file`) and appends its cases to `out`.  Returns 0, or -1
 * with "file:line: message" in err. */
int sp_cases_parse_text(const char *file, const char *text, sp_case_list *out, char *err,
                        size_t errlen);
/* Reads and parses a file; a missing or unreadable file is an error naming it. */
int sp_cases_load(const char *path, sp_case_list *out, char *err, size_t errlen);
void sp_case_list_free(sp_case_list *l);

/* A copy of `in` with the sequence lengths multiplied by f (0 < f <= 1), rounded so that the
 * case stays valid and keeps its character (see docs/cli.md, "Scaling"). */
void sp_case_scale(const sp_case *in, double f, sp_case *out);

const char *sp_op_name(int op);
const char *sp_pattern_name(int pattern);
/* "B=1 N=16 Sq=4096 ..." (the case's shape after scaling). */
void sp_case_shape_str(const sp_case *c, char *buf, size_t n);

#endif
