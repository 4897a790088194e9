/* Public backend queries. */
#include "internal.h"
int spattn_cuda_available(void) { return spattn_cuda_backend_available(); }
const char *spattn_cpu_isa(void) { return spattn_cpu_isa_name(); }
