/*
 * spattn: sparse attention, forward and backward, on CPUs and NVIDIA Hopper GPUs.
 *
 * Pure C11 public header, usable from C++.  One prefix (spattn_ / SPATTN_), sized integer
 * types, status codes instead of aborts.  Semantics of the operators follow
 * cases/README.md (copied from the project's shared spec).
 *
 * Conventions used by every entry point:
 *   - Tensors are described by spattn_tensor (modelled on DLPack's DLTensor).  Strides are in
 *     ELEMENTS, not bytes, and may be any value that keeps offsets inside int64 (views of a
 *     larger buffer, transposes and concatenated [.., D+Dr] buffers pass without copies).
 *   - All arguments are validated before any output element is written.  On error nothing is
 *     written, nothing leaks, the status says which kind of check failed and
 *     spattn_last_error() names the tensor, the dimension, what was expected and what came.
 *   - All floating tensors of one call (q, k, v, o, dO, dq, dk, dv, ...) share one dtype:
 *     fp16, bf16 or fp32.  LSE is always fp32.  Accumulation is fp32 (CPU and GPU).
 *   - A query row that attends to no key has O = 0, LSE = -inf and contributes nothing to any
 *     gradient (its dQ row is 0), whatever its q, dO and the keys hold.  With finite inputs
 *     (scores within fp32) no NaN or Inf appears anywhere else.
 *   - NaN / Inf inputs follow IEEE arithmetic on the dense formula over the keys a row attends
 *     (cases/README.md), as dense attention in PyTorch does; never a plausible finite value:
 *     a NaN in q or in an attended k makes the row's O and LSE NaN; a NaN in an attended v
 *     makes the O columns it reaches NaN; a +inf score makes O and LSE NaN (exp(inf - inf));
 *     a -inf score acts as a masked pair (all -inf: a row with no key).  The backward
 *     propagates them the same way (a NaN row gives NaN dQ and NaN dK, dV rows of the keys it
 *     attends).  Values a row does not attend never affect it, with one exception on CUDA:
 *     the tensor-core products run over whole tiles, so a non-finite value in a tile also
 *     reaches pairs of that tile the mask excludes through 0 * NaN (forward: v of a key that
 *     some rows of the 128-row query tile attend; bsa backward: q, k, v, dO, O of the 64-row x
 *     128-key tiles, e.g. a NaN q row makes dK / dV of the tile's keys NaN; sfa backward when
 *     it runs key-major (<= 16 heads per key head in shapes the grouped form below does not
 *     take, or 17-32 with deterministic = 0 and rows selecting most keys they reach, and the
 *     separate-V shapes at any head count), per 64-key block: a non-finite q, dO, O or LSE of a
 *     token can make dK / dV of every key of the blocks its row touches NaN, a non-finite k row
 *     that some token selects the dQ of every token touching its block (in the _varlen calls a
 *     64-row block of the key side may hold rows of two sequences, so this crosses sequences);
 *     sfa forward and backward at 4, 8, 16 or 32 query
 *     heads per key head with D 512 + 64 and shared kv (and the shapes run packed into its
 *     columns), the grouped form: groups of 64 / H
 *     consecutive tokens run over the union of their selections, so a non-finite q of a token can
 *     make dK of every key of its group's union NaN, a non-finite k row the O and dQ of every
 *     token of the groups whose union holds it; in the _varlen calls the groups are
 *     consecutive packed tokens of one sequence, never crossing sequences; the forward's group
 *     form of the other shapes with D <= 128 (dense calls, 9-32 heads per key head, where
 *     neighbouring tokens' selections overlap): groups of 8 tokens (9-16 heads) or 4 (17-32)
 *     over their union, so a non-finite v row (shared kv: k's first D columns) some token of a
 *     group selects makes the O of every token of the group NaN).  Such a value only adds NaN,
 *     it never turns a result into a plausible finite number; the CPU backend has no exception.
 *   - Results are deterministic by default: the same inputs give bitwise the same outputs for
 *     any CPU thread count and any launch.
 *   - Outputs must not overlap any input or each other (error SPATTN_STATUS_ALIASING); inputs
 *     may overlap each other freely.
 */
#ifndef SPATTN_H
#define SPATTN_H

#include <stddef.h>
#include <stdint.h>

#define SPATTN_VERSION_MAJOR 0
#define SPATTN_VERSION_MINOR 1
#define SPATTN_VERSION_PATCH 0
#define SPATTN_VERSION_STRING "0.1.0"

#if defined(_WIN32) && defined(SPATTN_BUILD_SHARED)
#define SPATTN_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define SPATTN_API __attribute__((visibility("default")))
#else
#define SPATTN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Status codes, grouped by kind (hundreds digit).                                          */
/* ---------------------------------------------------------------------------------------- */
typedef enum spattn_status {
    SPATTN_STATUS_SUCCESS = 0,
    /* 1xx: arguments */
    SPATTN_STATUS_NULL_POINTER = 100,   /* a required tensor, its data or an out-pointer is NULL */
    SPATTN_STATUS_INVALID_VALUE = 101,  /* a scalar argument out of range (bx, by, scale, sbs, mode) */
    SPATTN_STATUS_BAD_OPTIONS = 102,    /* an options field out of range */
    /* 2xx: shapes */
    SPATTN_STATUS_BAD_NDIM = 200,       /* a tensor has the wrong number of dimensions */
    SPATTN_STATUS_BAD_SHAPE = 201,      /* a dimension is non-positive or does not match */
    /* 3xx: dtypes */
    SPATTN_STATUS_BAD_DTYPE = 300,      /* unsupported dtype, or dtypes that do not match */
    /* 4xx: strides and memory */
    SPATTN_STATUS_BAD_STRIDE = 400,     /* offsets overflow int64, or an output overlaps itself */
    SPATTN_STATUS_ALIASING = 401,       /* an output overlaps an input or another output */
    /* 5xx: devices */
    SPATTN_STATUS_BAD_DEVICE = 500,     /* tensors on different devices, or not on the backend's */
    SPATTN_STATUS_BACKEND_UNAVAILABLE = 501, /* backend not built in, or no such device */
    /* 6xx: data */
    SPATTN_STATUS_BAD_INDEX = 600,      /* an sfa index outside [-1, ceil(S2/sbs)) */
    /* 7xx: valid but unsupported */
    SPATTN_STATUS_NOT_SUPPORTED = 700,  /* e.g. a head dim a backend has no kernel for */
    /* 8xx: resources */
    SPATTN_STATUS_WORKSPACE_TOO_SMALL = 800,
    SPATTN_STATUS_OUT_OF_MEMORY = 801,
    /* 9xx: runtime */
    SPATTN_STATUS_CUDA_ERROR = 900,
    SPATTN_STATUS_INTERNAL = 999
} spattn_status;

/* Short fixed name of a status ("SPATTN_STATUS_BAD_SHAPE: shape mismatch"). Never NULL. */
SPATTN_API const char *spattn_status_str(spattn_status status);

/* Message of the last failing call on this thread ("" when none).  Names the argument, the
 * dimension, what was expected and what came.  Valid until the next spattn call on this thread. */
SPATTN_API const char *spattn_last_error(void);

/* Library version as "MAJOR.MINOR.PATCH"; *major etc. may be NULL. */
SPATTN_API const char *spattn_version(int *major, int *minor, int *patch);

/* ---------------------------------------------------------------------------------------- */
/* Tensor descriptor (DLPack-like).                                                          */
/* ---------------------------------------------------------------------------------------- */
#define SPATTN_MAX_DIMS 8

typedef enum spattn_dtype {
    SPATTN_DTYPE_F32 = 0,
    SPATTN_DTYPE_F16 = 1,
    SPATTN_DTYPE_BF16 = 2,
    SPATTN_DTYPE_I32 = 3,
    SPATTN_DTYPE_U8 = 4
} spattn_dtype;

/* Values equal DLPack's DLDeviceType for the two devices we support. */
typedef enum spattn_device_type {
    SPATTN_DEVICE_CPU = 1,
    SPATTN_DEVICE_CUDA = 2
} spattn_device_type;

typedef struct spattn_tensor {
    void *data;                        /* address of element [0, 0, ..., 0] */
    int32_t device_type;               /* spattn_device_type */
    int32_t device_id;                 /* CUDA ordinal; 0 for CPU */
    int32_t dtype;                     /* spattn_dtype */
    int32_t ndim;                      /* 1 .. SPATTN_MAX_DIMS */
    int64_t shape[SPATTN_MAX_DIMS];
    int64_t strides[SPATTN_MAX_DIMS];  /* in elements */
} spattn_tensor;

/* Bytes of one element of a dtype; 0 for an unknown dtype. */
SPATTN_API size_t spattn_dtype_size(spattn_dtype dtype);
/* "fp32", "fp16", "bf16", "int32", "uint8" or "unknown". */
SPATTN_API const char *spattn_dtype_name(spattn_dtype dtype);

/* A CPU tensor descriptor over `data`.  strides == NULL means contiguous row-major. */
SPATTN_API spattn_tensor spattn_tensor_make(void *data, spattn_dtype dtype, int32_t ndim,
                                            const int64_t *shape, const int64_t *strides);

/* ---------------------------------------------------------------------------------------- */
/* Execution options (the optional context of the _ex calls; NULL means defaults).            */
/* ---------------------------------------------------------------------------------------- */
typedef enum spattn_backend {
    SPATTN_BACKEND_AUTO = 0,  /* by the tensors' device */
    SPATTN_BACKEND_CPU = 1,
    SPATTN_BACKEND_CUDA = 2
} spattn_backend;

typedef struct spattn_options {
    int32_t backend;          /* spattn_backend */
    int32_t num_threads;      /* CPU threads, 0 .. 1024; 0 = OpenMP's default.  A call starts
                                 no more than it has work items (tiles).  Results do not
                                 depend on it. */
    void *cuda_stream;        /* cudaStream_t the CUDA kernels run on; NULL = default stream */
    void *workspace;          /* optional scratch on the tensors' device; NULL = library allocates
                                 (CUDA: stream-ordered, from a per-device pool of spattn that
                                 keeps its memory between calls, as a caching allocator does:
                                 no remapping per call; its peak stays reserved) */
    size_t workspace_size;    /* bytes at workspace; see spattn_*_workspace_size */
    int32_t deterministic;    /* 1 (default): bitwise reproducible.  0 allows faster kernels
                                 whose floating-point summation order may vary (CUDA only):
                                 the bsa backward then adds dQ tiles in arrival order instead
                                 of key-tile order (H200, public suite, 2026-12-04: 0.98x-1.38x
                                 the speed, geomean 1.06x); the sfa backward adds dK / dV in
                                 fp32 instead of fixed point (packed int32 or int64).
                                 Other values: SPATTN_STATUS_BAD_OPTIONS. */
    int32_t reserved[7];      /* zero (else SPATTN_STATUS_BAD_OPTIONS) */
} spattn_options;

/* Fills *opt with defaults (AUTO backend, default threads and stream, no workspace,
 * deterministic). */
SPATTN_API void spattn_options_init(spattn_options *opt);

/* ---------------------------------------------------------------------------------------- */
/* Packed variable-length batches and paged keys (the layout argument of the _varlen calls;  */
/* semantics in cases/README.md, "Packed variable-length batches and paged keys").            */
/* ---------------------------------------------------------------------------------------- */
/*
 * The B sequences of a batch lie back to back along one token dimension T (torch_npu's "TND").
 *   cu_seqlens_q   int32 [B+1], on the tensors' device: sequence b owns query tokens
 *                  [cu_q[b], cu_q[b+1]); cu_q[0] = 0, non-decreasing, cu_q[B] <= Tq
 *   cu_seqlens_kv  int32 [B+1], the same for the keys (with pages: only the lengths count)
 *   max_seqlen_q/kv  >= 1 and >= every sequence's length (they size the bsa mask)
 *   block_table    NULL: k/v packed [Tkv, Nkv, D].  Else int32 [B, max_pages] and k, v (and
 *                  k_rope, dk, dv, dk_rope) are pages [num_pages, page_size, Nkv, D]: key j of
 *                  sequence b is row j % page_size of page block_table[b, j / page_size].
 *                  Slots a sequence uses hold ids in [0, num_pages), no id twice in a row;
 *                  other slots are not read.  Sequences may share pages.
 * Zero-length sequences are allowed.  Every sequence is an independent problem (its own Sq,
 * Skv; bsa block rows/columns and sfa index values are sequence-local; sfa mode 3 uses the
 * sequence's own lengths): the result equals one dense call per sequence.  The lengths and
 * the table are read and checked (SPATTN_STATUS_BAD_INDEX) before any output is written.
 * Backends: the CPU; on CUDA the sfa forward and backward (spattn_sfa_fwd_varlen /
 * spattn_sfa_bwd_varlen: the lengths, the table and the indices are checked on the device, where
 * they stay; one wait per call for the checks' verdict, as the dense sfa calls), the bsa
 * forward packed and paged (spattn_bsa_fwd_varlen: the prefix sums and the table are checked on
 * the device; one wait per call for that check's verdict, the kernels run on after the call
 * returns, stream-ordered) and the bsa backward,
 * packed and paged (spattn_bsa_bwd_varlen, for fp16 / bf16, D <= 128 and TMA-readable views only;
 * paged: page sizes that are multiples of 8).  Other shapes give SPATTN_STATUS_NOT_SUPPORTED.
 */
typedef struct spattn_varlen {
    const spattn_tensor *cu_seqlens_q;
    const spattn_tensor *cu_seqlens_kv;
    int64_t max_seqlen_q;
    int64_t max_seqlen_kv;
    const spattn_tensor *block_table; /* NULL: no pages */
    int64_t reserved[4];              /* zero */
} spattn_varlen;

/* ---------------------------------------------------------------------------------------- */
/* Block-sparse attention (bsa).  Layout BNSD.                                               */
/* ---------------------------------------------------------------------------------------- */
/*
 * spattn_bsa_fwd: O = softmax(scale * Q K^T restricted to the mask) V, and its LSE.
 *   q           [B, N,   Sq,  D]      fp16 | bf16 | fp32
 *   k, v        [B, Nkv, Skv, D]      same dtype as q; N % Nkv == 0 (GQA: query head n uses
 *                                     key/value head n / (N / Nkv))
 *   block_mask  [B, N, ceil(Sq/bx), ceil(Skv/by)]  uint8; pair (i, j) is attended iff
 *                                     block_mask[b, n, i / bx, j / by] != 0 (any bx, by >= 1,
 *                                     up to INT64_MAX; the last block row / column may be
 *                                     partial)
 *   scale       softmax scale; 0 means 1/sqrt(D); must be finite in fp32 (|scale| <= FLT_MAX,
 *               else SPATTN_STATUS_INVALID_VALUE)
 *   o           [B, N, Sq, D]         output, same dtype as q
 *   lse         [B, N, Sq]            output, fp32, natural log; may be NULL (not computed)
 * D: a multiple of 8, 8 .. 256.  Rows with no attended key: O = 0, LSE = -inf.
 */
SPATTN_API spattn_status spattn_bsa_fwd(const spattn_tensor *q, const spattn_tensor *k,
                                        const spattn_tensor *v, const spattn_tensor *block_mask,
                                        int64_t bx, int64_t by, double scale,
                                        const spattn_tensor *o, const spattn_tensor *lse);
SPATTN_API spattn_status spattn_bsa_fwd_ex(const spattn_tensor *q, const spattn_tensor *k,
                                           const spattn_tensor *v, const spattn_tensor *block_mask,
                                           int64_t bx, int64_t by, double scale,
                                           const spattn_tensor *o, const spattn_tensor *lse,
                                           const spattn_options *opt);

/*
 * spattn_bsa_bwd: gradients of spattn_bsa_fwd.
 *   q, k, v, block_mask, bx, by, scale   as in spattn_bsa_fwd
 *   o      [B, N, Sq, D]   the forward's output (same dtype as q)
 *   dout   [B, N, Sq, D]   dL/dO (same dtype as q)
 *   lse    [B, N, Sq]      fp32, the forward's LSE (-inf on rows with no key)
 *   dq     [B, N, Sq, D]   output
 *   dk, dv [B, Nkv, Skv, D] outputs (with GQA, summed over the query heads of a group)
 * Delta = rowsum(dO * O) is computed from o and dout.
 */
SPATTN_API spattn_status spattn_bsa_bwd(const spattn_tensor *q, const spattn_tensor *k,
                                        const spattn_tensor *v, const spattn_tensor *o,
                                        const spattn_tensor *dout, const spattn_tensor *lse,
                                        const spattn_tensor *block_mask, int64_t bx, int64_t by,
                                        double scale, const spattn_tensor *dq,
                                        const spattn_tensor *dk, const spattn_tensor *dv);
SPATTN_API spattn_status spattn_bsa_bwd_ex(const spattn_tensor *q, const spattn_tensor *k,
                                           const spattn_tensor *v, const spattn_tensor *o,
                                           const spattn_tensor *dout, const spattn_tensor *lse,
                                           const spattn_tensor *block_mask, int64_t bx, int64_t by,
                                           double scale, const spattn_tensor *dq,
                                           const spattn_tensor *dk, const spattn_tensor *dv,
                                           const spattn_options *opt);

/* Bytes of workspace the forward (backward = 0) or backward (backward = 1) needs on the chosen
 * backend for these shapes.  Only shapes, dtypes and devices are read. */
SPATTN_API spattn_status spattn_bsa_workspace_size(const spattn_tensor *q, const spattn_tensor *k,
                                                   const spattn_tensor *v,
                                                   const spattn_tensor *block_mask, int64_t bx,
                                                   int64_t by, int32_t backward,
                                                   const spattn_options *opt, size_t *bytes);

/*
 * A reusable bsa plan (like FlexAttention's BlockMask): the block mask and the schedules the
 * kernels walk (built on the device from the mask, at each kernel's own tile sizes), made once
 * and used by any number of forward and backward calls with the same mask and shapes.
 *   block_mask  [B, N, ceil(Sq/bx), ceil(Skv/by)] uint8 (CPU or CUDA); the plan keeps its own
 *               copy, so the caller may free or change it afterwards
 *   Sq, Skv     sequence lengths (>= 1); Nkv key/value heads (N % Nkv == 0)
 *   opt         backend / stream / device as for the _ex calls (NULL = defaults); the plan
 *               lives on block_mask's device.  Creation allocates and synchronizes the stream.
 * spattn_bsa_fwd_plan / spattn_bsa_bwd_plan take the arguments of spattn_bsa_fwd_ex /
 * spattn_bsa_bwd_ex with the plan in place of (block_mask, bx, by); q, k, v must have the
 * plan's B, N, Nkv, Sq, Skv and be on its device.  On CUDA with a caller workspace (see
 * spattn_bsa_plan_workspace_size: 256 bytes for a fp16/bf16 forward) they allocate nothing and
 * never synchronize, so they can be captured in a CUDA graph.  Results are bitwise identical to
 * the plan-less calls.  A plan may be shared by threads; destroy it after its last use has
 * completed on the device.  spattn_bsa_plan_destroy(NULL) does nothing.
 */
typedef struct spattn_bsa_plan spattn_bsa_plan;
SPATTN_API spattn_status spattn_bsa_plan_create(const spattn_tensor *block_mask, int64_t bx,
                                                int64_t by, int64_t Sq, int64_t Skv, int64_t Nkv,
                                                const spattn_options *opt,
                                                spattn_bsa_plan **plan);
SPATTN_API void spattn_bsa_plan_destroy(spattn_bsa_plan *plan);
SPATTN_API spattn_status spattn_bsa_fwd_plan(const spattn_bsa_plan *plan, const spattn_tensor *q,
                                             const spattn_tensor *k, const spattn_tensor *v,
                                             double scale, const spattn_tensor *o,
                                             const spattn_tensor *lse, const spattn_options *opt);
SPATTN_API spattn_status spattn_bsa_bwd_plan(const spattn_bsa_plan *plan, const spattn_tensor *q,
                                             const spattn_tensor *k, const spattn_tensor *v,
                                             const spattn_tensor *o, const spattn_tensor *dout,
                                             const spattn_tensor *lse, double scale,
                                             const spattn_tensor *dq, const spattn_tensor *dk,
                                             const spattn_tensor *dv, const spattn_options *opt);
SPATTN_API spattn_status spattn_bsa_plan_workspace_size(const spattn_bsa_plan *plan,
                                                        const spattn_tensor *q,
                                                        const spattn_tensor *k,
                                                        const spattn_tensor *v, int32_t backward,
                                                        const spattn_options *opt, size_t *bytes);

/*
 * Packed variable-length bsa (see spattn_varlen).  Shapes (T = token counts):
 *   q, o, dout, dq  [Tq, N, D]       k, v, dk, dv  [Tkv, Nkv, D]
 *   k, v, dk, dv with vl->block_table: [num_pages, page_size, Nkv, D] (dk, dv shaped as k)
 *   block_mask      [B, N, ceil(max_seqlen_q/bx), ceil(max_seqlen_kv/by)] uint8, block
 *                   indices restart at each sequence's first token
 *   lse             [Tq, N] fp32 (any strides: an [N, Tq] buffer passes as its transpose)
 * Rows past cu_seqlens_q[B] are not written; dk/dv rows past cu_seqlens_kv[B] get 0.  Paged
 * backward (as the sfa one): every dk/dv page row that no sequence's key uses gets 0, and a
 * page shared by several sequences gets the sum of their contributions (fp32, in sequence
 * order: deterministic).  opt: as in the _ex calls (NULL = defaults); a caller workspace needs
 * spattn_bsa_varlen_workspace_size bytes (CPU: the paged backward's includes one fp32 row per
 * key-side row and head for shared pages, 2 * num_pages * page_size * Nkv * D floats; CUDA: the
 * paged backward's adds an fp32 dK / dV scratch of 2 * B * max_seqlen_kv * Nkv * D floats, the
 * page lists, 8 * B * max_pages bytes, and 12 * num_pages + 4 bytes of counts, each piece rounded
 * up to 256 bytes).
 * CUDA tensors: the forward and the backward, packed and paged, run on the GPU (the prefix sums
 * and the block table are checked there before any write; the call waits for that check's
 * verdict only, its kernels run on after it returns, stream-ordered; the
 * backward takes fp16 / bf16, D <= 128 and views the TMA engine can read: 16-byte aligned,
 * contiguous D, row / head strides multiples of 8 elements, and for pages a page_size that is a
 * multiple of 8; other shapes give SPATTN_STATUS_NOT_SUPPORTED, and their workspace query 0
 * bytes).  The paged forward's fast kernel takes page sizes that are multiples of 8; other page
 * sizes run a slower reference kernel.  The paged backward is deterministic in both modes for
 * dk / dv (a page row shared by several sequences sums their fp32 rows in ascending sequence
 * order); deterministic = 0 changes only dq's summation order, as in the packed backward.
 */
SPATTN_API spattn_status spattn_bsa_fwd_varlen(const spattn_tensor *q, const spattn_tensor *k,
                                               const spattn_tensor *v,
                                               const spattn_tensor *block_mask, int64_t bx,
                                               int64_t by, double scale, const spattn_varlen *vl,
                                               const spattn_tensor *o, const spattn_tensor *lse,
                                               const spattn_options *opt);
SPATTN_API spattn_status spattn_bsa_bwd_varlen(const spattn_tensor *q, const spattn_tensor *k,
                                               const spattn_tensor *v, const spattn_tensor *o,
                                               const spattn_tensor *dout, const spattn_tensor *lse,
                                               const spattn_tensor *block_mask, int64_t bx,
                                               int64_t by, double scale, const spattn_varlen *vl,
                                               const spattn_tensor *dq, const spattn_tensor *dk,
                                               const spattn_tensor *dv, const spattn_options *opt);
/* Workspace of spattn_bsa_fwd_varlen (backward = 0) / spattn_bsa_bwd_varlen (1); only shapes,
 * dtypes and devices are read (not the lengths). */
SPATTN_API spattn_status spattn_bsa_varlen_workspace_size(const spattn_tensor *q,
                                                          const spattn_tensor *k,
                                                          const spattn_tensor *v,
                                                          const spattn_tensor *block_mask,
                                                          int64_t bx, int64_t by,
                                                          const spattn_varlen *vl,
                                                          int32_t backward,
                                                          const spattn_options *opt,
                                                          size_t *bytes);

/* ---------------------------------------------------------------------------------------- */
/* Top-k sparse flash attention (sfa, DeepSeek-V3.2 style sparse MLA).  Layout BSND.          */
/* ---------------------------------------------------------------------------------------- */
#define SPATTN_SFA_MODE_NONE 0    /* no mask beyond the selection */
#define SPATTN_SFA_MODE_CAUSAL 3  /* right-down causal: key j allowed for query i iff
                                     j <= S2 - S1 + i */

/*
 * spattn_sfa_fwd
 *   q        [B, S1, N1, D]     fp16 | bf16 | fp32 (score part without rope)
 *   q_rope   [B, S1, N1, Dr]    optional (NULL: Dr = 0); same dtype
 *   k        [B, S2, N2, D]     N1 % N2 == 0; query head h uses key head h / (N1 / N2)
 *   k_rope   [B, S2, N2, Dr]    present iff q_rope is
 *   v        [B, S2, N2, D]     optional: NULL means v is k itself (shared key/value, MLA)
 *   indices  [B, S1, N2, K]     int32; entry b selects keys [b*sbs, min((b+1)*sbs, S2));
 *                               -1 is padding (anywhere in a row); duplicates count once per
 *                               occurrence; any other value outside [0, ceil(S2/sbs)) is
 *                               rejected with SPATTN_STATUS_BAD_INDEX before any write
 *   sbs      sparse block size, a power of two, 1 .. 128
 *   mode     SPATTN_SFA_MODE_NONE or SPATTN_SFA_MODE_CAUSAL (selected keys past the causal
 *            limit are masked, not an error)
 *   scale    0 means 1/sqrt(D + Dr); must be finite in fp32 (|scale| <= FLT_MAX)
 *   o        [B, S1, N1, D]     output
 *   lse      [B, S1, N1]        output, fp32; may be NULL
 * D and Dr: multiples of 8 (Dr may be 0), D <= 1024, Dr <= 256.  q/q_rope (and k/k_rope) may
 * be two strided views of one concatenated [.., D+Dr] buffer or separate buffers.
 * CUDA kernels: fp16/bf16 rows of unit stride, 16-byte aligned, with D <= 256 and Dr <= 64 (any
 * multiples of 8; v separate or NULL), or D 512, Dr 64 and v NULL (DeepSeek MLA), run the Hopper
 * kernels (the backward of the shapes other than MLA key-major, when its blocks hold 16 or more
 * keys or 1 in 8 keys is selected); the other fp16/bf16 shapes whose columns fit MLA's (v NULL with
 * D <= 512 and D + Dr <= 576, or a separate v with 2 D + Dr <= 576, any layout) run the MLA
 * kernels on operands packed into its 512 + 64 columns in the workspace, the outputs' columns
 * copied back (a call that copies outputs back refuses stream capture with NOT_SUPPORTED); other
 * shapes run simple kernels (fp32 arithmetic on CUDA cores: correct, not fast).
 * CUDA: the indices are checked on the device and the verdict read back once per call: the call
 * waits for the scan (and the work queued before it on the stream), not for the attention
 * kernels, which run on after it returns, gated on the verdict on the device.  Under stream capture (CUDA graphs) the fp16/bf16 forward and backward of
 * the Hopper kernels are captured without it: at replay a bad index leaves o and lse (backward:
 * dq, dq_rope, dk, dk_rope, dv) unwritten and no status can say so (check indices outside the
 * graph).  Calls that need the verdict before their kernels (the simple kernels' shapes, every
 * _varlen call) return SPATTN_STATUS_NOT_SUPPORTED under capture, before enqueuing anything.
 */
SPATTN_API spattn_status spattn_sfa_fwd(const spattn_tensor *q, const spattn_tensor *q_rope,
                                        const spattn_tensor *k, const spattn_tensor *k_rope,
                                        const spattn_tensor *v, const spattn_tensor *indices,
                                        int64_t sbs, int32_t mode, double scale,
                                        const spattn_tensor *o, const spattn_tensor *lse);
SPATTN_API spattn_status spattn_sfa_fwd_ex(const spattn_tensor *q, const spattn_tensor *q_rope,
                                           const spattn_tensor *k, const spattn_tensor *k_rope,
                                           const spattn_tensor *v, const spattn_tensor *indices,
                                           int64_t sbs, int32_t mode, double scale,
                                           const spattn_tensor *o, const spattn_tensor *lse,
                                           const spattn_options *opt);

/*
 * spattn_sfa_bwd: gradients of spattn_sfa_fwd.
 *   inputs as in spattn_sfa_fwd, plus o [B, S1, N1, D], dout [B, S1, N1, D], lse [B, S1, N1].
 *   dq [B, S1, N1, D], dq_rope [B, S1, N1, Dr] (iff rope), dk [B, S2, N2, D],
 *   dk_rope [B, S2, N2, Dr] (iff rope), dv [B, S2, N2, D] iff v is given.  With v == NULL the
 *   dV contribution is added into dk (shared key/value) and dv must be NULL.
 *   Keys never selected get zero gradients.
 */
SPATTN_API spattn_status spattn_sfa_bwd(const spattn_tensor *q, const spattn_tensor *q_rope,
                                        const spattn_tensor *k, const spattn_tensor *k_rope,
                                        const spattn_tensor *v, const spattn_tensor *o,
                                        const spattn_tensor *dout, const spattn_tensor *lse,
                                        const spattn_tensor *indices, int64_t sbs, int32_t mode,
                                        double scale, const spattn_tensor *dq,
                                        const spattn_tensor *dq_rope, const spattn_tensor *dk,
                                        const spattn_tensor *dk_rope, const spattn_tensor *dv);
SPATTN_API spattn_status spattn_sfa_bwd_ex(const spattn_tensor *q, const spattn_tensor *q_rope,
                                           const spattn_tensor *k, const spattn_tensor *k_rope,
                                           const spattn_tensor *v, const spattn_tensor *o,
                                           const spattn_tensor *dout, const spattn_tensor *lse,
                                           const spattn_tensor *indices, int64_t sbs, int32_t mode,
                                           double scale, const spattn_tensor *dq,
                                           const spattn_tensor *dq_rope, const spattn_tensor *dk,
                                           const spattn_tensor *dk_rope, const spattn_tensor *dv,
                                           const spattn_options *opt);

/* Bytes of workspace spattn_sfa_fwd (backward = 0) or spattn_sfa_bwd (backward = 1) needs on
 * the chosen backend for these shapes (the backward: for any layout of o, dout and the
 * gradients, which decide the CUDA kernels).  Only shapes, dtypes and devices are read (index
 * values are not scanned).  The CUDA forward at 4, 8, 16 or 32 query heads per key head (D 512
 * + Dr 64, fp16/bf16, sbs <= 64) needs some: the per-call plan that runs groups of neighbouring
 * tokens with overlapping selections as one tile (about 4 + c * (260 + 512 / H) bytes per group
 * of 64 / H tokens, c = min(ceil(S2 / 64), ceil(K sbs / 64 / d)) blocks, d the least density
 * taken; the key ids of groups packed 64 to a block are the 256); without a caller workspace it
 * comes from a stream-ordered pool of the library that keeps its memory between calls.  The
 * CUDA backward of those shapes runs the same groups (c = ceil(S2 / 64)); its size includes it.
 * The forward of the other shapes with D <= 128 at 9-32 heads per key head (sbs <= 64) plans its
 * group form the same way (groups of 8 tokens at 9-16 heads, 4 at 17-32).  Shapes run on the
 * MLA kernels through packed columns add their packed operands (q, k and, for the backward, o,
 * dout, dq, dk, dv: up to 1152 bytes a row each in fp16 / bf16) to the MLA call's need.
 * The CUDA backward's workspace: 10-220 MB on the public sfa suite.  When the per-token kernel takes the call (more than 32 query heads per key head, or
 * shapes the grouped forms do not take), its accumulator is larger than 48 MiB (B S2 N2 x 2304
 * bytes) and K <= 8192, it also holds the index rows sorted (B S1 N2 K x 4 bytes), so that the
 * scattered dK / dV adds of the CTAs running together stay in L2. */
SPATTN_API spattn_status spattn_sfa_workspace_size(const spattn_tensor *q, const spattn_tensor *q_rope,
                                                   const spattn_tensor *k, const spattn_tensor *k_rope,
                                                   const spattn_tensor *v, const spattn_tensor *indices,
                                                   int64_t sbs, int32_t mode, int32_t backward,
                                                   const spattn_options *opt, size_t *bytes);

/*
 * Packed variable-length sfa (see spattn_varlen).  Shapes (T = token counts):
 *   q, o, dout, dq [Tq, N1, D]   q_rope, dq_rope [Tq, N1, Dr]   lse [Tq, N1] fp32
 *   k, v, dk, dv   [Tkv, N2, D]  k_rope, dk_rope [Tkv, N2, Dr]
 *     with vl->block_table: [num_pages, page_size, N2, D] / [.., Dr] (gradients too)
 *   indices        [Tq, N2, K] int32; values are block positions inside the sequence's own
 *                  keys: -1 or [0, ceil(Skv_b/sbs)) (else SPATTN_STATUS_BAD_INDEX)
 * mode 3: key j allowed for query i of sequence b iff j <= Skv_b - Sq_b + i.
 * Rows past cu_seqlens_q[B] are not written; every dk/dv/dk_rope row that no sequence's key
 * uses gets 0.  opt as in the _ex calls; a caller workspace needs
 * spattn_sfa_varlen_workspace_size bytes (CUDA forward: 16 bytes per query token, plus fp32 O
 * and LSE for shapes without a Hopper kernel; CUDA backward: 16 bytes per query token plus
 * 5 x 576 + 24 bytes per key-side row and key head (packed rows, or num_pages * page_size page
 * rows), plus, when max_seqlen_kv such rows exceed 48 MiB, 4 K bytes per query token and key
 * head for the index rows sorted; shapes of the simple kernels: fp32 dq / dk / dv scratch plus 9
 * bytes per dk / dk_rope / dv element and key-side row, and a count histogram; both passes at 4,
 * 8, 16 or 32 query heads per key head add the grouped form's lists: per group of 64 / H packed
 * tokens and key head, 4 bytes plus up to ceil(max_seqlen_kv / 64) + 2 blocks of 4 + 8 x 64 / H
 * + 256 bytes).  CUDA: the Hopper kernels for fp16/bf16, D 512, Dr 64, shared key/value, pages
 * page_size rows apart (at 4, 8, 16 or 32 query heads per key head the grouped form of
 * spattn_sfa_fwd / spattn_sfa_bwd over each sequence's tokens, else per token), and the other
 * Hopper shapes of spattn_sfa_fwd (backward: key-major over the key-side rows when the blocks
 * hold 16 or more keys or 1 in 8 of max_seqlen_kv keys is selected; its workspace: 16 bytes per
 * query token, 9 x 576 bytes per key-side row and key head, 9 W + 8 bytes per query token
 * and head (W: D + Dr with each rounded up to a multiple of 64), and lists of up to 132 bytes per (token, key head, 64 key-side rows) visited); other
 * shapes on the simple kernels (fp32 arithmetic on CUDA cores: correct, not fast).  The CUDA backward is
 * bitwise reproducible with deterministic = 1 on both (fixed-point dK / dV: packed int32 with
 * exact bounds on the Hopper kernel, as spattn_sfa_bwd's token-major form; int64 on the simple
 * kernels).
 */
SPATTN_API spattn_status spattn_sfa_fwd_varlen(const spattn_tensor *q, const spattn_tensor *q_rope,
                                               const spattn_tensor *k, const spattn_tensor *k_rope,
                                               const spattn_tensor *v, const spattn_tensor *indices,
                                               int64_t sbs, int32_t mode, double scale,
                                               const spattn_varlen *vl, const spattn_tensor *o,
                                               const spattn_tensor *lse, const spattn_options *opt);
SPATTN_API spattn_status spattn_sfa_bwd_varlen(const spattn_tensor *q, const spattn_tensor *q_rope,
                                               const spattn_tensor *k, const spattn_tensor *k_rope,
                                               const spattn_tensor *v, const spattn_tensor *o,
                                               const spattn_tensor *dout, const spattn_tensor *lse,
                                               const spattn_tensor *indices, int64_t sbs,
                                               int32_t mode, double scale, const spattn_varlen *vl,
                                               const spattn_tensor *dq, const spattn_tensor *dq_rope,
                                               const spattn_tensor *dk, const spattn_tensor *dk_rope,
                                               const spattn_tensor *dv, const spattn_options *opt);
SPATTN_API spattn_status spattn_sfa_varlen_workspace_size(const spattn_tensor *q,
                                                          const spattn_tensor *q_rope,
                                                          const spattn_tensor *k,
                                                          const spattn_tensor *k_rope,
                                                          const spattn_tensor *v,
                                                          const spattn_tensor *indices,
                                                          int64_t sbs, int32_t mode,
                                                          const spattn_varlen *vl,
                                                          int32_t backward,
                                                          const spattn_options *opt,
                                                          size_t *bytes);

/* ---------------------------------------------------------------------------------------- */
/* Merging attention states (split-KV / cascade / ring attention).                           */
/* ---------------------------------------------------------------------------------------- */
/*
 * spattn_merge_attention_states: combines two partial attention results over disjoint key sets
 * into the result over their union, row by row (fp32 math):
 *     lse = log(exp(lse1) + exp(lse2)),   o = exp(lse1 - lse) * o1 + exp(lse2 - lse) * o2
 *   o1, o2      [R..., D]  the same shape, ndim 2 .. 8 (any row dims: BNSD [B,N,S,D] with LSE
 *                          [B,N,S], BSND [B,S,N,D] with LSE [B,S,N], [T,N,D], ...);
 *                          fp16 | bf16 | fp32, EACH ITS OWN dtype (e.g. bf16 partial results
 *                          merged into an fp32 accumulator)
 *   lse1, lse2  [R...]     fp32 (shape of o1 without D), natural log, finite or -inf
 *   o           [R..., D]  output, fp16 | bf16 | fp32
 *   lse         [R...]     output, fp32; may be NULL (not written)
 * A row whose input LSE is -inf is empty in that input: its O values are not read (they may
 * hold anything).  Rows empty in both inputs give O = 0, LSE = -inf; a NaN LSE gives a NaN row.
 * In place: o may be exactly the view o1 or o2 (same data, dtype, shape and strides), lse exactly
 * lse1 or lse2; any other overlap of an output with an input or the other output is
 * SPATTN_STATUS_ALIASING.  All tensors on one device (CPU or CUDA; opt->cuda_stream is used).
 */
SPATTN_API spattn_status spattn_merge_attention_states(const spattn_tensor *o1, const spattn_tensor *lse1,
                                                       const spattn_tensor *o2, const spattn_tensor *lse2,
                                                       const spattn_tensor *o, const spattn_tensor *lse);
SPATTN_API spattn_status spattn_merge_attention_states_ex(const spattn_tensor *o1,
                                                          const spattn_tensor *lse1,
                                                          const spattn_tensor *o2,
                                                          const spattn_tensor *lse2,
                                                          const spattn_tensor *o,
                                                          const spattn_tensor *lse,
                                                          const spattn_options *opt);

/* ---------------------------------------------------------------------------------------- */
/* Backend queries.                                                                          */
/* ---------------------------------------------------------------------------------------- */
/* 1 when the CUDA backend was built in and a CUDA device is visible, else 0. */
SPATTN_API int spattn_cuda_available(void);
/* Which SIMD variant the CPU kernels use on this machine: "avx512", "avx2" or "generic". */
SPATTN_API const char *spattn_cpu_isa(void);

#ifdef __cplusplus
}
#endif

#endif /* SPATTN_H */
