/* sfa CPU kernels, generic variant: generated from the shared body in sfa_kernels.inc. */
#define SPATTN_ISA_GENERIC 1
#include "sfa_kernels.inc"
