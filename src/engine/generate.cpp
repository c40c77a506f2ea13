#include "engine/generate.h"

#include <chrono>

#include "core/error.h"

namespace frink {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateStats generate(Decoder& dec, Session& s, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                       const GenerateOptions& opts, const std::function<void(const std::string&)>& on_text,
                       const std::atomic<bool>* stop) {
  GenerateStats st;
  if (prompt.empty()) fail("the prompt is empty");
  if (s.n_ctx() > 0 && s.n_past() + static_cast<int64_t>(prompt.size()) > s.n_ctx())
    fail("the prompt is {} tokens but the context holds {} (with {} already used); raise -c", prompt.size(),
         s.n_ctx(), s.n_past());
  Sampler sampler(opts.sampling, static_cast<int>(dec.n_vocab()));
  for (int32_t t : s.tokens()) sampler.accept(t);
  for (int32_t t : prompt) sampler.accept(t);

  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  dec.eval(s, prompt, false, logits);
  st.prompt_seconds = seconds_since(t0);
  st.n_prompt = static_cast<int64_t>(prompt.size());

  StreamDecoder text(tok, false);
  t0 = std::chrono::steady_clock::now();
  int32_t next = sampler.sample(logits.data());
  while (opts.n_predict < 0 || st.n_generated < opts.n_predict) {
    if (stop && stop->load()) {
      st.stopped = true;
      break;
    }
    sampler.accept(next);
    st.tokens.push_back(next);
    ++st.n_generated;
    if (opts.stop_at_eog && tok.is_eog(next)) {
      st.hit_eog = true;
      break;
    }
    if (auto piece = text.push(next); !piece.empty()) on_text(piece);
    if (opts.n_predict >= 0 && st.n_generated >= opts.n_predict) break;
    if (s.n_ctx() > 0 && s.n_past() + 1 > s.n_ctx()) {
      st.hit_context_limit = true;
      break;
    }
    // The decoder picks the next token with the sampler: on the device when the whole step
    // runs there, so the logits never cross to the host.
    next = dec.eval_next(s, next, sampler);
  }
  if (auto rest = text.flush(); !rest.empty()) on_text(rest);
  st.generate_seconds = seconds_since(t0);
  return st;
}

}  // namespace frink
