// The next token chosen next to the logits (engine TokenPick): penalties on the listed tokens,
// then the argmax (elementwise.cuh) or the top k candidates. Parameters live in pinned host
// memory the kernels read (PickDev, DrawDev), written before each step, so a captured token
// graph serves every step.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace frink::cuda {

inline constexpr int kPickMaxPenalties = 4096;
inline constexpr int kPickMaxTopK = 256;
inline constexpr int kPickSumChunk = 256;  // engine sampling::kSumChunk
inline constexpr int64_t kPickMaxVocab = int64_t{1} << 20;

// The penalties of one step (engine DevicePick), read by the kernel from pinned host memory the
// caller wrote before the launch, a slot a step parity, as DrawDev. A step enqueued ahead
// (entering = 1) takes the window of the step before it with the token it embeds entering and
// `leaving` (-1: none) leaving, so its slot holds the same list and no copy precedes its replay.
struct PickDev {
  int32_t n_pen;
  int32_t entering;  // 1: the token at launch_penalties' `token` joins the window first
  int32_t leaving;
  float repeat, frequency, presence;
  int32_t pen[2 * kPickMaxPenalties];  // (token id, count) pairs, ids distinct
};

// logits[id]: <= 0 ? * repeat : / repeat, then -= count * frequency + presence, each
// operation rounded once as on the host (no fused multiply-add). token: the id the step
// embeds (read where pick->entering). A dependent launch (pdl.cuh) of one block, reading
// pick and token before its wait.
void launch_penalties(float* logits, const PickDev* pick, const int32_t* token, cudaStream_t stream);

// The sampler's chain after top-k for one step (engine sampling::finish). The kernel reads it
// from pinned host memory the caller wrote before the launch (a slot a step parity), so a step
// enqueued ahead needs no copy before its replay.
struct DrawDev {
  double u;         // the step's uniform draw, [0, 1)
  float top_p;      // >= 1: off
  float min_p;      // <= 0: off
  float log_min_p;  // std::log(min_p) as the host rounds it
  float temp;       // > 0
};

// The k largest of x[0, n) (1 <= k <= kPickMaxTopK, k < n), best first: value descending,
// index ascending on ties (the host's sampling::top_k order). Three passes: up to 512 blocks
// take their chunk's best; each block appends its chunk's candidates at or above the k-th
// best of those; one block sorts the candidates (exact for any input; a slow path where
// equal logits at the bound outnumber 2048).
size_t topk_scratch_bytes(int64_t n, int k);
void launch_topk(const float* x, int64_t n, int k, void* scratch, int32_t* out_ids, float* out_vals,
                 cudaStream_t stream);

// *out = the token sampling::finish draws from the top k (ids, vals in launch_topk's order)
// with d's parameters and uniform: top-p, min-p, temperature, the draw, in the host's
// arithmetic and order (double sums in candidate order; exp may differ from the host's in its
// last bit, which moves a token only where the draw lands that close to a boundary). out may
// be ids. advance (or null): *advance += 1 with the token, as launch_argmax's. A dependent
// launch (pdl.cuh) of one block, reading d before its wait.
void launch_draw(const int32_t* ids, const float* vals, int k, const DrawDev* d, int32_t* out, cudaStream_t stream,
                 int32_t* advance = nullptr);

// Top-k off (engine DevicePick::whole_vocab): *out = the token sampling::finish draws from all
// kPickMaxTopK < n <= kPickMaxVocab logits x (penalised) with d's parameters, from their top kPickMaxTopK (ids,
// vals: launch_topk's) where the survivors are among those (top-p's cut, or fewer min-p
// survivors), and from x's chunk sums (sums: draw_sums_bytes(n) of scratch) where nothing
// cuts; else -1 (undecided: launch_exact_draw decides it). Two launches: the chunk sums, then one block.
size_t draw_sums_bytes(int64_t n);
void launch_draw_whole(const float* x, int64_t n, const int32_t* ids, const float* vals, const DrawDev* d, double* sums,
                       int32_t* out, cudaStream_t stream, int32_t* advance = nullptr);

// Where launch_draw_whole left the draw undecided (-1): *out = the token sampling::finish draws
// from all n <= kPickMaxVocab logits x with d's parameters, exactly, on the device
// (pick_exact.cu): top-p's survivors sorted (a radix sort of the vocabulary), min-p's alone in
// id order. Eager launches (CUB's sizes are the host's), about a dozen, reading d by value;
// scratch: exact_draw_scratch_bytes(n). min-p above 1 (always decided) writes -1.
size_t exact_draw_scratch_bytes(int64_t n);
void launch_exact_draw(const float* x, int64_t n, const DrawDev& d, void* scratch, int32_t* out, cudaStream_t stream);

}  // namespace frink::cuda
