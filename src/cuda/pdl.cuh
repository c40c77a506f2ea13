// Programmatic dependent launch (Hopper): a kernel launched this way may start while the
// kernel before it on the stream is still finishing, and must call grid_dependency_wait()
// before it reads (or writes) anything that kernel or an earlier one touches. What it does
// before the wait overlaps its predecessor: the matrix-vector kernels prefetch their weights
// there; the small kernels between products (activation preparation, decode attention and its
// merge) start with dependent_kernel_start(), which lets the next kernel launch at once and
// then waits, so their launches and the next product's first weight copies overlap.
// The products themselves never let their successor launch early. Measured on the H200 (graph
// time per decode token by events, `frink bench -v`; docs/gpu-notes.md, seventh session):
//   off: 8B Q4_0 2.578 ms, Q8_0 3.75 ms, qwen3-30b-a3b 3.17 ms;
//   products as dependents only: 8B Q4_0 2.494 ms, qwen3-30b-a3b 3.17 ms;
//   + the small kernels above (this file's rule): 2.350, 3.41, 3.03 ms;
//   + the products letting their successor launch at their start: 2.54, 3.49, 3.03 ms (worse);
//   + every other small kernel (norms, RoPE, routing, delta net, sampling): within 0.5%, not kept.
// On for sm_90 and newer; FRINK_CUDA_PDL=0 turns it off (to rule it out when chasing a race).
#pragma once

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace frink::cuda {

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FRINK_CUDA_PDL");
    if (v && std::strcmp(v, "0") == 0) return false;
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  }();
  return on;
}

// Whether the code the device runs for `kernel` was compiled for sm_90 or newer: a build for
// older architectures alone runs on Hopper through JIT-compiled PTX in which
// grid_dependency_wait() is empty, and must not be launched as a dependent.
inline bool pdl_compiled(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<const void*, bool> known;
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(kernel); it != known.end()) return it->second;
  cudaFuncAttributes fa{};
  const bool ok = cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && fa.ptxVersion >= 90;
  known.emplace(kernel, ok);
  return ok;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic serialization when enabled;
// with cluster_x > 1, in thread-block clusters of cluster_x blocks along x (grid.x a multiple).
template <typename... KArgs, typename... Args>
void launch_dependent_clustered(unsigned cluster_x, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled() && pdl_compiled(reinterpret_cast<const void*>(kernel))) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {cluster_x, 1, 1};
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  FRINK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... KArgs, typename... Args>
void launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  launch_dependent_clustered(1, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

#ifdef __CUDACC__
// Waits until the kernels this one depends on have finished and their writes are visible; a
// no-op for kernels launched the ordinary way, and before sm_90.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel launched after this one as a dependent start once every block of this one
// has called it (its blocks then run up to their grid_dependency_wait(), which still waits
// for this whole kernel). A no-op when no dependent follows, and before sm_90.
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The first statement of a small kernel launched with launch_dependent: the kernel after it
// may launch now (and wait in turn), and this one waits for the kernel before it. Nothing may
// come before it: every read or write of the kernel follows the wait.
__device__ __forceinline__ void dependent_kernel_start() {
  grid_dependents_launch();
  grid_dependency_wait();
}
#endif

}  // namespace frink::cuda
