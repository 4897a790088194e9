/* sfa CPU kernels, avx2 variant: generated from the shared body in sfa_kernels.inc. */
#define SPATTN_ISA_AVX2 1
#if defined(__x86_64__) || defined(__i386__)
#include "sfa_kernels.inc"
#endif
