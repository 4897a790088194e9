/* Compiles the public header alone (tested as C11 -pedantic and as C++). */
#include "spattn.h"
int main(void) { return spattn_dtype_size(SPATTN_DTYPE_F32) == 4 ? 0 : 1; }
