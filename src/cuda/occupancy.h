// How many blocks of a kernel the current device holds at once: the one occupancy query the
// launch rules share (matvec.cu's one-wave grids, attention.cu's decode split tiles), its SM
// count, and the one shared-memory opt-in the kernels past 48 KiB share.
#pragma once

#include <cstddef>
#include <cstdint>

namespace frink::cuda {

// Blocks of `kernel` at `threads` threads and `smem` bytes of dynamic shared memory resident
// on the whole current device (SMs x blocks per SM), remembered per (device, kernel, threads,
// smem). 0 when none fits, e.g. shared memory above 48 KiB not yet opted in (cudaFuncSetAttribute):
// a 0 is asked again next time, never remembered.
int64_t resident_blocks(const void* kernel, int threads, size_t smem);
// SMs of the current device.
int sm_count();
// Lets `kernel` take up to `bytes` of dynamic shared memory a block on the current device (at
// most its opt-in limit): above 48 KiB a kernel must opt in. Remembered per (device, kernel),
// because the call may wait for copies in flight; it enqueues nothing, so a launch makes it even
// while a graph is captured.
void opt_in_smem(const void* kernel, size_t bytes);

}  // namespace frink::cuda
