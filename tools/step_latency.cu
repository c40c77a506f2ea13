// What one dependent step of a decode token costs on the device (issue 6): today a token is
// ~10 kernels per layer in one CUDA graph, and the next step under study is a persistent
// kernel per layer with grid-wide barriers between its phases. Which is cheaper per step?
// Built and run on the GPU machine by hand:
//   nvcc -O3 -arch=sm_90 tools/step_latency.cu -o /tmp/sl && /tmp/sl
// Measures, each as microseconds per step over a chain of kSteps (median of 5 replays):
//  (a) graph of 1-block kernels, each reading what the previous one wrote (a norm's shape);
//  (b) graph of one-wave kernels (every SM's resident blocks), the same dependency (a product's);
//  (c) one cooperative kernel of one wave, cooperative_groups grid.sync() between steps;
//  (d) the same with a hand-rolled barrier (arrival counter, generation flag, spinning loads).
// First run in the seventh session: (a) 0.75, (b) 1.11, (c) 2.23, (d) 3.60 us a step on the
// H200 (docs/gpu-notes.md).
#include <cooperative_groups.h>

#include "microbench.cuh"

namespace cg = cooperative_groups;

constexpr int kSteps = 1000, kThreads = 128;

// Step: block 0's thread 0 reads the counter the previous step left and writes it plus one,
// so every step depends on the one before (other blocks only exist, as a product's do).
__global__ void step_kernel(unsigned* v) {
  if (blockIdx.x == 0 && threadIdx.x == 0) v[0] = v[0] + 1;
}

__global__ void coop_steps(unsigned* v, int steps) {
  cg::grid_group g = cg::this_grid();
  for (int s = 0; s < steps; ++s) {
    if (blockIdx.x == 0 && threadIdx.x == 0) v[0] = v[0] + 1;
    g.sync();
  }
}

__global__ void hand_steps(unsigned* v, unsigned* count, unsigned* gen, int steps) {
  for (int s = 0; s < steps; ++s) {
    if (blockIdx.x == 0 && threadIdx.x == 0) v[0] = v[0] + 1;
    grid_barrier(count, gen);
  }
}

// Milliseconds of run(), the median of 5 after a warm-up.
template <typename F>
float median_ms(F run) {
  return median_us(0, run, 5) * 1e-3f;
}

int main() {
  int dev = 0, sms = 0, per_sm = 0, coop = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coop_steps, kThreads, 0));
  const int wave = sms * std::min(per_sm, 8);  // a product's grid: 8 blocks of 4 warps per SM
  unsigned* buf = nullptr;
  CK(cudaMalloc(&buf, 3 * sizeof(unsigned)));
  CK(cudaMemset(buf, 0, 3 * sizeof(unsigned)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("%d SMs, one wave = %d blocks of %d threads\n", sms, wave, kThreads);

  for (const int blocks : {1, wave}) {
    const float us = graph_median_us(
        st, [&] { for (int s = 0; s < kSteps; ++s) step_kernel<<<blocks, kThreads, 0, st>>>(buf); }, 5);
    if (us < 0) return 1;
    std::printf("(%c) graph of %d kernels of %d block(s): %.2f us per step\n", blocks == 1 ? 'a' : 'b', kSteps,
                blocks, us / kSteps);
  }
  if (coop) {
    int steps = kSteps;
    void* args[] = {&buf, &steps};
    const float ms = median_ms([&] {
      cudaLaunchCooperativeKernel(reinterpret_cast<void*>(coop_steps), wave, kThreads, args, 0, st);
      cudaStreamSynchronize(st);
    });
    CK(cudaGetLastError());
    std::printf("(c) cooperative kernel of %d blocks, grid.sync(): %.2f us per step\n", wave, 1000.0f * ms / kSteps);
  }
  {
    // Co-residency of every block is what makes the spin safe: one wave at most.
    const float ms = median_ms([&] {
      hand_steps<<<wave, kThreads, 0, st>>>(buf, buf + 1, buf + 2, kSteps);
      cudaStreamSynchronize(st);
    });
    CK(cudaGetLastError());
    std::printf("(d) one kernel of %d blocks, hand-rolled barrier: %.2f us per step\n", wave, 1000.0f * ms / kSteps);
  }
  cudaFree(buf);
  return 0;
}
