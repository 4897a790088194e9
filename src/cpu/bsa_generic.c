/* bsa CPU kernels, generic variant: generated from the shared body in bsa_kernels.inc. */
#define SPATTN_ISA_GENERIC 1
#include "bsa_kernels.inc"
