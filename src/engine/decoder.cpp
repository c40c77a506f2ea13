#include "engine/decoder.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/layer_body.h"

namespace frink {

Decoder::Decoder(const Model& m, DecoderOptions opts) : m_(m), opts_(opts), pool_(opts.n_threads) {}

void Decoder::eval(Session& s, const std::vector<int32_t>& tokens, bool all_logits,
                   std::vector<float>& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail("nothing to evaluate: the token list is empty");
  if (s.n_ctx() > 0 && s.n_past() + n > s.n_ctx())
    fail("{} tokens do not fit the context: {} already used of {} (raise -c)", n, s.n_past(), s.n_ctx());
  for (int32_t t : tokens)
    if (t < 0 || t >= m_.hp.n_vocab) fail("token id {} is outside the vocabulary of {} tokens", t, m_.hp.n_vocab);
  const int64_t V = m_.hp.n_vocab;
  logits.assign(static_cast<size_t>((all_logits ? n : 1) * V), 0.0f);
  for (int64_t b = 0; b < n; b += opts_.n_batch) {
    const int64_t nb = std::min(opts_.n_batch, n - b);
    const bool last = b + nb == n;
    float* out = all_logits ? logits.data() + b * V : (last ? logits.data() : nullptr);
    eval_batch(s, tokens.data() + b, nb, out, all_logits);
  }
}

void Decoder::eval_batch(Session& s, const int32_t* tokens, int64_t n, float* logits_out, bool all_logits) {
  const Hparams& hp = m_.hp;
  const int64_t pos0 = s.n_past();
  std::vector<float> x(static_cast<size_t>(n * hp.n_embd));
  cpu::embed_tokens(m_, tokens, n, x.data());
  for (int64_t il = 0; il < hp.n_layer; ++il) cpu::attention_layer(m_, il, s.cache(il), x.data(), n, pos0, pool_);
  s.commit(tokens, n);
  if (!logits_out) return;
  if (all_logits) {
    cpu::output_logits(m_, x.data(), n, logits_out, pool_);
  } else {
    cpu::output_logits(m_, x.data() + (n - 1) * hp.n_embd, 1, logits_out, pool_);
  }
}

}  // namespace frink
