// The next token chosen next to the logits (engine TokenPick): penalties on the listed tokens,
// then the argmax (elementwise.cuh) or the top k candidates. Parameters live in device memory
// (PickDev), written before each step, so a captured token graph serves every step.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

inline constexpr int kPickMaxPenalties = 4096;
inline constexpr int kPickMaxTopK = 256;

// In device memory; the host fills a pinned copy and sends its used part (pick_dev_bytes)
// before the step.
struct PickDev {
  int32_t n_pen;
  float repeat, frequency, presence;
  int32_t pen[2 * kPickMaxPenalties];  // (token id, count) pairs, ids distinct
};
inline size_t pick_dev_bytes(int32_t n_pen) {
  return offsetof(PickDev, pen) + 2 * static_cast<size_t>(n_pen) * sizeof(int32_t);
}

// logits[id]: <= 0 ? * repeat : / repeat, then -= count * frequency + presence, each
// operation rounded once as on the host (no fused multiply-add).
void launch_penalties(float* logits, const PickDev* pick, cudaStream_t stream);

// The k largest of x[0, n) (1 <= k <= kPickMaxTopK, k < n), best first: value descending,
// index ascending on ties (the host's sampling::top_k order). Two passes: blocks of 1024
// values each keep their k best (in shared memory), then one block merges the sorted lists.
size_t topk_scratch_bytes(int64_t n, int k);
void launch_topk(const float* x, int64_t n, int k, void* scratch, int32_t* out_ids, float* out_vals,
                 cudaStream_t stream);

}  // namespace frink::cuda
