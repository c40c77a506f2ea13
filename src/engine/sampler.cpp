// Sampling stages and the Sampler chain; semantics and order in sampler.h.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace frink {
namespace sampling {

namespace {

bool before(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

bool is_sorted_desc(const std::vector<TokenLogit>& cands) {
  return std::is_sorted(cands.begin(), cands.end(), before);
}

}  // namespace

void sort_desc(std::vector<TokenLogit>& cands) {
  if (!is_sorted_desc(cands)) std::sort(cands.begin(), cands.end(), before);
}

void top_k(std::vector<TokenLogit>& cands, int k) {
  if (k <= 0 || static_cast<size_t>(k) >= cands.size()) return;
  std::partial_sort(cands.begin(), cands.begin() + k, cands.end(), before);
  cands.resize(k);
}

void top_p(std::vector<TokenLogit>& cands, float p) {
  if (p >= 1.0f || cands.empty()) return;
  sort_desc(cands);
  // Softmax over the candidates at temperature 1, max-subtracted; sums in double so the
  // cut does not move with the vocabulary size.
  const float max_logit = cands[0].logit;
  double total = 0;
  for (const TokenLogit& c : cands) total += std::exp(double(c.logit) - max_logit);
  double cum = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    cum += std::exp(double(cands[i].logit) - max_logit) / total;
    if (cum >= p) {  // i + 1 >= min_keep (1) always holds
      cands.resize(i + 1);
      return;
    }
  }
  // Rounding left cum just below p: keep everything, as llama.cpp does.
}

void min_p(std::vector<TokenLogit>& cands, float p) {
  if (p <= 0.0f || cands.empty()) return;
  const float max_logit = cands[argmax(cands)].logit;
  const float min_logit = max_logit + std::log(p);
  std::vector<TokenLogit> kept;
  for (const TokenLogit& c : cands)
    if (c.logit >= min_logit) kept.push_back(c);
  if (kept.empty()) kept.push_back(cands[argmax(cands)]);  // p > 1: min_keep 1
  cands = std::move(kept);
}

float penalized(float logit, int count, float repeat, float frequency, float presence) {
  const float l = logit <= 0 ? logit * repeat : logit / repeat;
  return l - (float(count) * frequency + presence);
}

size_t argmax(const std::vector<TokenLogit>& cands) {
  FRINK_ASSERT(!cands.empty());
  size_t best = 0;
  for (size_t i = 1; i < cands.size(); ++i)
    if (before(cands[i], cands[best])) best = i;
  return best;
}

}  // namespace sampling

namespace {

uint32_t seed_value(int64_t seed) {
  if (seed < 0) return std::random_device{}();
  return static_cast<uint32_t>(seed);
}

}  // namespace

Sampler::Sampler(SamplerParams params, int n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(seed_value(params.seed)) {
  FRINK_ASSERT(n_vocab > 0, "n_vocab {}", n_vocab);
  cands_.reserve(n_vocab);
}

void Sampler::reset() {
  history_.clear();
  counts_.clear();
  rng_.seed(seed_value(params_.seed));
}

void Sampler::accept(int32_t token) {
  FRINK_ASSERT(token >= 0 && token < n_vocab_, "token {} of {}", token, n_vocab_);
  if (params_.penalty_last_n == 0) return;
  history_.push_back(token);
  ++counts_[token];
  if (params_.penalty_last_n > 0 && history_.size() > static_cast<size_t>(params_.penalty_last_n)) {
    const int32_t old = history_.front();
    history_.pop_front();
    if (--counts_[old] == 0) counts_.erase(old);
  }
}

// llama_sampler_penalties_apply: per token seen `count` times in the window,
//   logit = logit <= 0 ? logit * repeat : logit / repeat;
//   logit -= count * frequency + presence.
namespace {
bool penalties_off(const SamplerParams& p) {
  return p.penalty_last_n == 0 ||
         (p.repeat_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
}
}  // namespace

std::optional<DevicePick> Sampler::device_pick() const {
  DevicePick pick;
  if (params_.temp > 0.0f) {
    if (params_.top_k <= 0 || params_.top_k >= n_vocab_) return std::nullopt;
    pick.top_k = params_.top_k;
  }
  if (!counts_.empty() && !penalties_off(params_)) {
    pick.repeat = params_.repeat_penalty;
    pick.frequency = params_.frequency_penalty;
    pick.presence = params_.presence_penalty;
    for (const auto& [id, n] : counts_) {
      pick.pen_ids.push_back(id);
      pick.pen_counts.push_back(n);
    }
  }
  return pick;
}

void Sampler::apply_penalties(std::vector<TokenLogit>& cands) const {
  const SamplerParams& p = params_;
  if (counts_.empty() || penalties_off(p)) return;
  for (TokenLogit& c : cands) {
    const auto it = counts_.find(c.id);
    if (it == counts_.end()) continue;
    c.logit = sampling::penalized(c.logit, it->second, p.repeat_penalty, p.frequency_penalty, p.presence_penalty);
  }
}

// Softmax over the survivors, then one uniform draw in [0, 1) walked along the cumulative
// mass (llama_sample_dist). The last candidate takes any rounding remainder.
int32_t Sampler::draw(std::vector<TokenLogit>& cands) {
  const float max_logit = cands[sampling::argmax(cands)].logit;
  double total = 0;
  for (const TokenLogit& c : cands) total += std::exp(double(c.logit) - max_logit);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * total;
  double cum = 0;
  for (const TokenLogit& c : cands) {
    cum += std::exp(double(c.logit) - max_logit);
    if (u < cum) return c.id;
  }
  return cands.back().id;
}

int32_t Sampler::sample(const float* logits) {
  FRINK_ASSERT(logits != nullptr);
  cands_.resize(n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) cands_[i] = {i, logits[i]};

  apply_penalties(cands_);
  if (params_.temp <= 0.0f) return cands_[sampling::argmax(cands_)].id;

  sampling::top_k(cands_, params_.top_k);
  return finish(cands_);
}

int32_t Sampler::sample_top(std::vector<TokenLogit> top) {
  FRINK_ASSERT(params_.temp > 0.0f && params_.top_k > 0 && top.size() == static_cast<size_t>(params_.top_k),
               "sample_top needs the {} best candidates, got {}", params_.top_k, top.size());
  return finish(top);
}

int32_t Sampler::finish(std::vector<TokenLogit>& cands) {
  sampling::top_p(cands, params_.top_p);
  sampling::min_p(cands, params_.min_p);
  for (TokenLogit& c : cands) c.logit /= params_.temp;
  return draw(cands);
}

int32_t greedy_token(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

}  // namespace frink
