// The AVX2 + FMA + F16C kernel set (CMake adds -mavx2 -mfma -mf16c to *_avx2.cpp). The
// kernel bodies live in dot_x86_*.h and are shared with dot_avx512.cpp.
#define FRINK_X86_TABLE_FN avx2_dot_kernel
#include "quant/dot_x86_table.h"
