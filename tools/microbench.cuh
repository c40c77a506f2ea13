// What the GPU microbenchmarks in tools/ (stream_ceiling.cu, step_latency.cu, layer_stream.cu)
// share: the error check, the two read shapes they compare, a grid barrier and the timing.
// Each is one nvcc program built and run on the GPU machine by hand (see its first lines).
#pragma once

#include <cuda_pipeline.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

// In main(): a failed CUDA call prints itself and returns 1.
#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e = (x);                                                                        \
    if (e != cudaSuccess) {                                                                     \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                                       \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

// 16-byte loads p[i], p[i + stride], ... below n, four in flight, a token use of each.
__device__ unsigned strided_read(const uint4* __restrict__ p, int64_t i, int64_t n, int64_t stride) {
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= __ldg(p + i).x;
  return acc;
}

// The bare read: the whole grid strided over p.
__global__ void grid_stride(const uint4* __restrict__ p, int64_t n, unsigned* out) {
  const unsigned acc =
      strided_read(p, int64_t{blockIdx.x} * blockDim.x + threadIdx.x, n, int64_t{gridDim.x} * blockDim.x);
  if (acc == 0x12345678) out[0] = acc;
}

// frink's stream-kernel skeleton (src/cuda/matvec.cu) with the arithmetic taken out: a warp per
// row pair, Chunk-byte pieces of both rows copied by cp.async, two stages, Warps warps a block.
template <int Chunk, int Warps>
__global__ void __launch_bounds__(Warps * 32) staged(const uint8_t* w, int64_t row_bytes, int64_t n_rows, unsigned* out) {
  __shared__ __align__(16) uint8_t sm[Warps][2][2][Chunk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pair = int64_t{blockIdx.x} * Warps + warp;
  if (2 * pair >= n_rows) return;
  const int n_chunks = static_cast<int>(row_bytes / Chunk);
  auto issue = [&](int c) {
    if (c >= n_chunks) return;
    for (int r = 0; r < 2; ++r) {
      const uint8_t* src = w + (2 * pair + r) * row_bytes + int64_t{c} * Chunk;
      for (int i = lane * 16; i < Chunk; i += 512) __pipeline_memcpy_async(&sm[warp][c % 2][r][i], src + i, 16);
    }
  };
  unsigned acc = 0;
  issue(0);
  __pipeline_commit();
  for (int c = 0; c < n_chunks; ++c) {
    issue(c + 1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncwarp();
    acc ^= reinterpret_cast<const unsigned*>(sm[warp][c % 2][0])[lane] ^ reinterpret_cast<const unsigned*>(sm[warp][c % 2][1])[lane + 32];
    __syncwarp();
  }
  if (acc == 0x12345678) out[0] = acc;
}

// Sense-reversing barrier for the blocks of one co-resident grid (one wave at most): the last
// to arrive resets the count and bumps the generation.
__device__ void grid_barrier(unsigned* count, volatile unsigned* gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned my_gen = *gen;
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      *gen = my_gen + 1;
    } else {
      while (*gen == my_gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// Median microseconds of `reps` runs of run() on stream st (events around each), after one
// run not counted; with idle_us, the host waits that long after each run with the device idle
// (as between frink's decode steps).
template <class F>
float median_us(cudaStream_t st, F run, int reps = 9, int idle_us = 0) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  run();
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, st);
    run();
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1e3f);
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(idle_us)) {
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median microseconds of one replay of a CUDA graph of what capture() enqueues on st (reps
// replays after one not counted, as median_us); the graph is built and freed here. A failed
// capture prints itself and gives -1.
template <class F>
float graph_median_us(cudaStream_t st, F capture, int reps = 9) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    capture();
    e = cudaStreamEndCapture(st, &g);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
  if (e != cudaSuccess) {
    std::printf("graph capture: %s\n", cudaGetErrorString(e));
    return -1.0f;
  }
  const float us = median_us(st, [&] { cudaGraphLaunch(ge, st); }, reps);
  cudaStreamSynchronize(st);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return us;
}
