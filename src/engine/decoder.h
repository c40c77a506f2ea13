// Decoder: runs tokens of a Session through the model's layers and produces logits.
// Prompts are processed in batches (prefill), generation one token at a time (decode);
// both use the same layer bodies, so a prefix processed either way leaves identical caches.
//
// Device first, host as fallback (DESIGN.md section 2): per batch and per layer the Decoder
// asks the device backend (src/engine/device_backend.h) whether it takes the layer; a
// refusal, decided before any state changed, sends that layer to the host body. The
// refusal counts live here, per reason, for --verbose and `frink bench`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/thread_pool.h"
#include "engine/device_backend.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"

namespace frink {

enum class DeviceChoice { kCpu, kCuda, kAuto };  // --device cpu|cuda|auto

struct DecoderOptions {
  int n_threads = 0;     // 0: one per core
  int64_t n_batch = 512; // prompt tokens per layer pass
  DeviceChoice device = DeviceChoice::kCpu;  // kCuda without a usable GPU is an error
  // Layers on the device: -1 as many as its memory holds, else at most this many (the last
  // ones; the head too past n_layer), as llama.cpp's -ngl.
  int64_t n_gpu_layers = -1;
  int64_t n_ctx = 4096;  // the context the sessions plan for: the device keeps room for its K/V
  DeviceHooks hooks;     // test switches only
};

class Decoder {
 public:
  Decoder(const Model& m, DecoderOptions opts);
  ~Decoder();

  const Model& model() const { return m_; }
  int64_t n_vocab() const { return m_.hp.n_vocab; }
  // True when a device backend serves this decoder (layers may still refuse).
  bool on_device() const { return device_ != nullptr; }
  std::string device_description() const;
  // The device's theoretical memory bandwidth in GB/s (0: host path or unknown).
  double device_peak_gbps() const;
  // The device's whole-token steps since the last call, timed (DeviceBackend::take_step_times).
  std::string take_device_step_times() { return device_ ? device_->take_step_times() : std::string(); }
  const RefusalCounts& refusals() const { return refusals_; }
  // Decode steps that ran as one device submission (DeviceBackend::run_token).
  int64_t whole_token_steps() const { return whole_token_steps_; }
  // Of those, the ones the device had started before the call (DeviceBackend::run_token).
  int64_t steps_run_ahead() const { return device_ ? device_->steps_run_ahead() : 0; }
  // Of those, whole-vocabulary draws the device made by sorting the vocabulary (DeviceBackend).
  int64_t exact_draws() const { return device_ ? device_->exact_draws() : 0; }

  // Appends tokens to the session and runs them. logits receives [n][n_vocab] when
  // all_logits, else the last token's [n_vocab]. Throws frink::Error, leaving the session
  // unchanged, when the tokens do not fit the session's context or an id is out of range.
  void eval(Session& s, const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>& logits);
  // Appends one token and returns the next one as sampler.sample() would choose it from the
  // logits (the caller accepts it). When the step runs whole on the device, the sampler's
  // chain (Sampler::device_pick) runs there and the logits stay there.
  int32_t eval_next(Session& s, int32_t token, Sampler& sampler);

 private:
  void check_tokens(const Session& s, const int32_t* tokens, int64_t n) const;
  void eval_batch(Session& s, const int32_t* tokens, int64_t n, float* logits_out, bool all_logits,
                  TokenPick* pick = nullptr);
  Refusal ask_device(int64_t il) const;
  bool whole_token_on_device() const;

  const Model& m_;
  DecoderOptions opts_;
  ThreadPool pool_;
  std::unique_ptr<DeviceBackend> device_;  // null: host only
  RefusalCounts refusals_;
  bool token_graph_ = false;  // decode steps go to DeviceBackend::run_token
  int64_t whole_token_steps_ = 0;
  std::vector<float> next_logits_;  // eval_next's logits when they come to the host
  std::vector<float> x_;            // eval_batch's residual rows [n][n_embd] (grown, never shrunk)
};

}  // namespace frink
