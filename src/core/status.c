/* Status strings and the thread-local last-error message. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define SPATTN_TLS _Thread_local
#else
#define SPATTN_TLS __thread
#endif

static SPATTN_TLS char g_last_error[1024];

spattn_status spattn_set_error(spattn_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

void spattn_clear_error(void) { g_last_error[0] = '\0'; }

const char *spattn_last_error(void) { return g_last_error; }

const char *spattn_status_str(spattn_status s) {
    switch (s) {
    case SPATTN_STATUS_SUCCESS: return "SPATTN_STATUS_SUCCESS: success";
    case SPATTN_STATUS_NULL_POINTER: return "SPATTN_STATUS_NULL_POINTER: required pointer is NULL";
    case SPATTN_STATUS_INVALID_VALUE: return "SPATTN_STATUS_INVALID_VALUE: scalar argument out of range";
    case SPATTN_STATUS_BAD_OPTIONS: return "SPATTN_STATUS_BAD_OPTIONS: options field out of range";
    case SPATTN_STATUS_BAD_NDIM: return "SPATTN_STATUS_BAD_NDIM: wrong number of dimensions";
    case SPATTN_STATUS_BAD_SHAPE: return "SPATTN_STATUS_BAD_SHAPE: shape mismatch or non-positive dimension";
    case SPATTN_STATUS_BAD_DTYPE: return "SPATTN_STATUS_BAD_DTYPE: unsupported or mismatched dtype";
    case SPATTN_STATUS_BAD_STRIDE: return "SPATTN_STATUS_BAD_STRIDE: stride overflow or self-overlapping output";
    case SPATTN_STATUS_ALIASING: return "SPATTN_STATUS_ALIASING: output overlaps another tensor";
    case SPATTN_STATUS_BAD_DEVICE: return "SPATTN_STATUS_BAD_DEVICE: tensors on wrong or mixed devices";
    case SPATTN_STATUS_BACKEND_UNAVAILABLE: return "SPATTN_STATUS_BACKEND_UNAVAILABLE: backend not available";
    case SPATTN_STATUS_BAD_INDEX: return "SPATTN_STATUS_BAD_INDEX: index value out of range";
    case SPATTN_STATUS_NOT_SUPPORTED: return "SPATTN_STATUS_NOT_SUPPORTED: valid but not supported";
    case SPATTN_STATUS_WORKSPACE_TOO_SMALL: return "SPATTN_STATUS_WORKSPACE_TOO_SMALL: workspace too small";
    case SPATTN_STATUS_OUT_OF_MEMORY: return "SPATTN_STATUS_OUT_OF_MEMORY: allocation failed";
    case SPATTN_STATUS_CUDA_ERROR: return "SPATTN_STATUS_CUDA_ERROR: CUDA runtime error";
    case SPATTN_STATUS_INTERNAL: return "SPATTN_STATUS_INTERNAL: internal error";
    }
    return "SPATTN_STATUS_UNKNOWN: unknown status code";
}

const char *spattn_version(int *major, int *minor, int *patch) {
    if (major) *major = SPATTN_VERSION_MAJOR;
    if (minor) *minor = SPATTN_VERSION_MINOR;
    if (patch) *patch = SPATTN_VERSION_PATCH;
    return SPATTN_VERSION_STRING;
}
