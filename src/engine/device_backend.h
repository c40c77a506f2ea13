// The contract between the Decoder and a device (DESIGN.md section 2): the device serves
// whatever it can, whole layers at a time, and REFUSES the rest by answering "no" before it
// has changed any state; the host body then runs that layer. A refusal is never an error
// and never a wrong answer, only a slower one. A device FAILURE (a CUDA call that fails,
// memory that cannot be had) is an error (frink::Error, or an abort with file:line), never
// a refusal: folding failures into refusals would hide them as silent, uncounted fallbacks.
//
// This header is the interface table only (ggml-backend-impl.h's role): it depends on
// nothing above src/kv and src/model, so a device library (src/cuda) can implement it
// without pulling the engine in. The Decoder owns the refusal counters.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "kv/recurrent_state.h"

namespace frink {

// Why a layer (or the output head) did not run on the device. kNone: it ran there.
enum class Refusal : uint8_t {
  kNone = 0,
  kNoDevice,      // --device auto on a machine (or build) without a usable GPU
  kForcedByTest,  // DeviceHooks::refuse_layer: a test makes one layer take the host path
  kQuantType,     // a weight's block type has no device kernel
  kShape,         // a head width or layout the kernels were not written for
  kRope,          // a RoPE variant the device does not implement
  kMoe,           // a mixture-of-experts FFN the device does not route (group-limited, > 512 experts)
  kRecurrent,     // a recurrent layer the device does not run (Mamba-2); gated delta nets run
  kMemory,        // device memory (or --gpu-layers) leaves the layer on the host
  kCount,
};

constexpr std::string_view refusal_name(Refusal r) {
  switch (r) {
    case Refusal::kNone: return "ran";
    case Refusal::kNoDevice: return "no-device";
    case Refusal::kForcedByTest: return "forced-by-test";
    case Refusal::kQuantType: return "quant-type";
    case Refusal::kShape: return "shape";
    case Refusal::kRope: return "rope";
    case Refusal::kMoe: return "moe";
    case Refusal::kRecurrent: return "recurrent";
    case Refusal::kMemory: return "memory";
    case Refusal::kCount: break;
  }
  return "?";
}

// Per-reason counts of layer evaluations (one per layer per batch, plus one per output head).
struct RefusalCounts {
  std::array<uint64_t, static_cast<size_t>(Refusal::kCount)> n{};

  void add(Refusal r) { ++n[static_cast<size_t>(r)]; }
  uint64_t operator[](Refusal r) const { return n[static_cast<size_t>(r)]; }
  uint64_t refused() const {
    uint64_t s = 0;
    for (size_t i = 1; i < n.size(); ++i) s += n[i];
    return s;
  }
  // "ran 320, moe 64": non-zero entries only; "none" when nothing was counted.
  std::string summary() const {
    std::string out;
    for (size_t i = 0; i < n.size(); ++i) {
      if (n[i] == 0) continue;
      if (!out.empty()) out += ", ";
      out += std::string(refusal_name(static_cast<Refusal>(i))) + " " + std::to_string(n[i]);
    }
    return out.empty() ? "none" : out;
  }
};

// Test switches. Never set outside tests.
struct DeviceHooks {
  int64_t refuse_layer = -1;        // this layer always refuses with kForcedByTest
  bool trust_stale_mirror = false;  // SABOTAGE: the KV mirror skips its staleness re-upload
  bool no_token_graph = false;      // decode steps go layer by layer, never run_token
  int64_t mirror_budget_bytes = 0;  // > 0: KV mirrors get this much device memory, not all free
  int64_t weight_budget_bytes = 0;  // > 0: weights and planned mirrors get this much, not all free
  bool separate_shared_expert = false;  // shared experts run as their own products, never stacked
  bool no_step_ahead = false;           // greedy decode steps never start before the caller asks (run_token)
};

// A decode step's next token chosen on the device (run_token), so the logits need not cross to
// the host: what the Sampler asks for (Sampler::device_pick: penalties on the listed tokens,
// then the argmax, the top k finished by the draw, or the draw over every logit), and the
// token.
inline constexpr int64_t kMaxPickPenalties = 4096;
inline constexpr int kMaxPickTopK = 256;
inline constexpr int64_t kMaxPickVocab = int64_t{1} << 20;  // the top-k merge's list count
struct TokenPick {
  DevicePick request;  // top_k <= kMaxPickTopK, at most kMaxPickPenalties; whole_vocab: n_vocab > kMaxPickTopK
  int32_t id = -1;     // out: the token
};

// One device as the Decoder sees it. The residual stream of a batch lives on the device
// between device layers, so consecutive device layers cost no host round trip; the Decoder
// moves it with upload()/download() only where a refusing layer sits between them.
//
// Call order per batch: begin_batch, then per layer check_layer and, on kNone, run_layer
// (an attention layer) or run_recurrent_layer; upload/download around host layers; finally
// output_logits or download. Every method but the check_* ones may throw frink::Error on a
// device failure.
//
// Recurrent state: a device that runs recurrent layers keeps the sequence's state on the
// device and links itself to the RecurrentState (RecurrentDeviceLink); after a batch it may
// hold a NEWER state than the host, which the RecurrentState pulls on any host access
// (src/kv/recurrent_state.h). So a host layer, a snapshot, a rewind or a copy of the session
// always sees the truth, and the Decoder needs to do nothing about it.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual std::string describe() const = 0;  // "NVIDIA H200 (sm_90), 4.1 GiB of weights"
  virtual double peak_gbps() const = 0;      // theoretical memory bandwidth, GB/s (0: unknown)

  // Could layer `il` run on the device? Decided from the plan and the weights alone, before
  // any state changes; kNone means run_layer may be called.
  virtual Refusal check_layer(int64_t il) const = 0;
  // The same for the final norm + output projection (+ softcap).
  virtual Refusal check_output() const = 0;

  // Sizes the batch's device buffers for n_tok tokens at positions [pos0, pos0 + n_tok).
  // caches: the sequence's host caches, which the batch will use (their mirrors are then
  // never evicted to make room for one another); a recurrent layer's (empty) cache may be
  // among them. recurrent: the sequence's recurrent state, or null when it has none.
  virtual void begin_batch(int64_t n_tok, int64_t pos0, std::span<KvCache* const> caches,
                           RecurrentState* recurrent) = 0;
  // Host residual [n_tok][n_embd] -> device (after embedding, or after a host layer).
  virtual void upload(const float* x) = 0;
  // Waits for the device, appends every pending K/V row to its host cache, and copies the
  // device residual back to x [n_tok][n_embd].
  virtual void download(float* x) = 0;
  // Enqueues layer `il` (precondition: check_layer(il) == kNone) against `cache`, the
  // sequence's host cache for that layer (cache.rows() == pos0). Nothing waits: the new K/V
  // rows reach the host cache at the next download/output_logits.
  virtual void run_layer(int64_t il, KvCache& cache) = 0;
  // Enqueues recurrent layer `il` (precondition: check_layer(il) == kNone) against the
  // sequence's recurrent state, which the device then holds ahead of the host for that layer
  // (pulled on any host access). The snapshots the state wants inside or at the end of the
  // batch (wants_snapshot) reach it at the next download/output_logits, as the host body
  // would have saved them.
  virtual void run_recurrent_layer(int64_t il, RecurrentState& state) = 0;
  // Final norm and output projection of the device residual's rows [first, first + n),
  // into logits [n][n_vocab]; waits, and flushes pending K/V rows like download().
  virtual void output_logits(int64_t first, int64_t n, float* logits) = 0;

  // A whole decode step at once (DESIGN.md section 4), when every layer and the head run
  // here: token (its host residual x [n_embd], null where embeds_tokens()) at position pos0
  // in; out, exactly one of:
  // logits [n_vocab], or the next token chosen on the device (pick, see TokenPick).
  // caches[il] is layer il's host cache (rows() == pos0; a recurrent layer's is unused);
  // recurrent: the sequence's recurrent state (null when it has none). One submission and
  // one wait; on return the new K/V rows are in the host caches and the recurrent layers are
  // ahead on the device. The same arithmetic as begin_batch(1, pos0, caches, recurrent),
  // upload, run_layer / run_recurrent_layer for each layer and output_logits(0, 1), bit for bit.
  //
  // Step ahead: with a pick without penalties (the argmax, or a draw, which takes the pick's
  // next uniform) the device may enqueue the NEXT step (position pos0 + 1, the picked token)
  // before this call returns, so the device never
  // waits for the host between tokens. That step touches no host state: the next run_token
  // with that position, token, caches and pick adopts it; any other call (begin_batch, another
  // run_token) first waits for it and drops it.
  virtual void run_token(int64_t pos0, int32_t token, const float* x, std::span<KvCache* const> caches,
                         RecurrentState* recurrent, float* logits, TokenPick* pick) = 0;
  // Whole-vocabulary draws (TokenPick) whose survivors outnumbered the few best the device
  // decides from, drawn by sorting the vocabulary there instead, since construction.
  virtual int64_t exact_draws() const { return 0; }
  // Whether run_token takes its token's embedding row itself, so the caller need not.
  virtual bool embeds_tokens() const { return false; }
  // run_token steps that found themselves already enqueued (step ahead), since construction.
  virtual int64_t steps_run_ahead() const { return 0; }
  // Where the run_token steps since the last call spent their time, one line (empty when none
  // ran or the backend does not measure): at --verbose only, so the default path pays nothing.
  virtual std::string take_step_times() { return {}; }
};

}  // namespace frink
