// The AVX-512 kernel set: the same 256-bit kernel bodies as dot_avx2.cpp, compiled with
// AVX-512 VL + VNNI so the int8 dot products become vpdpbusd (one instruction instead of
// maddubs + madd) and the scale multiply-adds vpdpwssd (see dot_x86_common.h). 256-bit
// vectors are kept on purpose: the kernels are load-bound at one or four rows, and
// 512-bit registers would need a second set of bodies for a small gain.
#define FRINK_X86_TABLE_FN avx512_dot_kernel
#include "quant/dot_x86_table.h"
