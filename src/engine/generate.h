// Text generation for one session: evaluate the prompt, then sample one token at a time,
// streaming text pieces as they become complete UTF-8, until n_predict tokens, an
// end-of-generation token, or a stop request.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/decoder.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

namespace frink {

struct GenerateOptions {
  int n_predict = 128;             // < 0: until end of generation or the context is full
  SamplerParams sampling;
  bool stop_at_eog = true;
};

struct GenerateStats {
  int64_t n_prompt = 0, n_generated = 0;
  double prompt_seconds = 0, generate_seconds = 0;
  bool hit_eog = false, hit_context_limit = false, stopped = false;
  // Every sampled token, in order. The LAST one has not been run through the model (nothing
  // needed its logits), so it is not in the session: a caller that continues the sequence
  // evaluates it first.
  std::vector<int32_t> tokens;
};

// Appends `prompt` (already tokenized) to the session and generates after it. on_text gets
// each completed text piece. `stop` (optional) is polled between tokens.
GenerateStats generate(Decoder& dec, Session& s, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                       const GenerateOptions& opts, const std::function<void(const std::string&)>& on_text,
                       const std::atomic<bool>* stop = nullptr);

}  // namespace frink
