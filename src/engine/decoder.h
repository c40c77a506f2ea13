// Decoder: runs tokens of a Session through the model's layers and produces logits.
// Prompts are processed in batches (prefill), generation one token at a time (decode);
// both use the same host layer bodies, so a prefix processed either way leaves identical
// caches.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/thread_pool.h"
#include "engine/session.h"
#include "model/model.h"

namespace frink {

struct DecoderOptions {
  int n_threads = 0;     // 0: one per core
  int64_t n_batch = 512; // prompt tokens per layer pass
};

class Decoder {
 public:
  Decoder(const Model& m, DecoderOptions opts);

  const Model& model() const { return m_; }
  int64_t n_vocab() const { return m_.hp.n_vocab; }

  // Appends tokens to the session and runs them. logits receives [n][n_vocab] when
  // all_logits, else the last token's [n_vocab]. Throws frink::Error, leaving the session
  // unchanged, when the tokens do not fit the session's context or an id is out of range.
  void eval(Session& s, const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>& logits);

 private:
  void eval_batch(Session& s, const int32_t* tokens, int64_t n, float* logits_out, bool all_logits);

  const Model& m_;
  DecoderOptions opts_;
  ThreadPool pool_;
};

}  // namespace frink
