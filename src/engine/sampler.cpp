// Sampling stages and the Sampler chain; semantics and order in sampler.h.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <utility>

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
  // Softmax over the candidates at temperature 1, max-subtracted, its total summed in double
  // in the candidates' order (sorted after top-k, which a device's draw repeats), so the cut
  // does not move with the vocabulary size.
  const float max_logit = cands[argmax(cands)].logit;
  double total = 0;
  for (const TokenLogit& c : cands) total += std::exp(double(c.logit) - max_logit);
  // The prefix is sorted only as far as the mass needs: a full sort of a 128256-token
  // vocabulary (top-k off) took 13.7 ms a token on the dev machine, the mass usually a few
  // hundred tokens. Each round sorts the next best of the rest, so the prefix is the full
  // sort's.
  const bool sorted = is_sorted_desc(cands);
  double cum = 0;
  for (size_t done = 0, want = 256;; want *= 4) {
    const size_t upto = want >= cands.size() / 4 ? cands.size() : want;
    if (!sorted) {
      if (upto == cands.size())
        std::sort(cands.begin() + static_cast<std::ptrdiff_t>(done), cands.end(), before);
      else
        std::partial_sort(cands.begin() + static_cast<std::ptrdiff_t>(done),
                          cands.begin() + static_cast<std::ptrdiff_t>(upto), cands.end(), before);
    }
    for (size_t i = done; i < upto; ++i) {
      cum += std::exp(double(cands[i].logit) - max_logit) / total;
      if (cum >= p) {  // i + 1 >= min_keep (1) always holds
        cands.resize(i + 1);
        return;
      }
    }
    if (upto == cands.size()) return;  // rounding left cum just below p: keep all, as llama.cpp does
    done = upto;
  }
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

int32_t finish(std::vector<TokenLogit>& cands, float top_p, float min_p, float temp, double u) {
  FRINK_ASSERT(!cands.empty() && temp > 0.0f);
  sampling::top_p(cands, top_p);
  sampling::min_p(cands, min_p);
  for (TokenLogit& c : cands) c.logit /= temp;
  // Softmax over the survivors, max-subtracted, summed in double in candidate order.
  const float max_logit = cands[argmax(cands)].logit;
  double total = 0;
  for (const TokenLogit& c : cands) total += std::exp(double(c.logit) - max_logit);
  const double at = u * total;
  double cum = 0;
  for (const TokenLogit& c : cands) {
    cum += std::exp(double(c.logit) - max_logit);
    if (at < cum) return c.id;
  }
  return cands.back().id;
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

// Out-of-range values mean what llama.cpp makes of them (temp <= 0 greedy, top-p >= 1 off,
// min-p > 1 the top token alone); a NaN or infinity means nothing, and NaN failed every
// stage's comparison (an assertion at the draw, `--temp nan`).
void SamplerParams::check() const {
  for (const auto& [name, v] : {std::pair{"temperature", temp}, {"top-p", top_p}, {"min-p", min_p},
                                {"repeat penalty", repeat_penalty}, {"presence penalty", presence_penalty},
                                {"frequency penalty", frequency_penalty}})
    if (!std::isfinite(v)) fail("the {} must be a finite number, not {}", name, v);
}

namespace {

uint32_t seed_value(int64_t seed) {
  if (seed < 0) return std::random_device{}();
  return static_cast<uint32_t>(seed);
}

}  // namespace

Sampler::Sampler(SamplerParams params, int n_vocab) : params_(params), n_vocab_(n_vocab) {
  FRINK_ASSERT(n_vocab > 0, "n_vocab {}", n_vocab);
  params.check();
  cands_.reserve(n_vocab);
  reset();  // seeds the RNG and draws the first two uniforms
}

void Sampler::reset() {
  history_.clear();
  counts_.clear();
  rng_.seed(seed_value(params_.seed));
  for (double& u : uniform_) u = rng_uniform();
}

double Sampler::rng_uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

double Sampler::take_uniform() {
  const double u = uniform_[0];
  uniform_[0] = uniform_[1];
  uniform_[1] = rng_uniform();
  return u;
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
    pick.draw.top_p = params_.top_p;
    pick.draw.min_p = params_.min_p;
    if (params_.min_p > 0.0f) pick.draw.log_min_p = std::log(params_.min_p);
    pick.draw.temp = params_.temp;
    pick.draw.u = uniform_[0];
    pick.draw.u_next = uniform_[1];
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

int32_t Sampler::sample(const float* logits) {
  FRINK_ASSERT(logits != nullptr);
  cands_.resize(n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) cands_[i] = {i, logits[i]};

  apply_penalties(cands_);
  if (params_.temp <= 0.0f) return cands_[sampling::argmax(cands_)].id;

  sampling::top_k(cands_, params_.top_k);
  return sampling::finish(cands_, params_.top_p, params_.min_p, params_.temp, take_uniform());
}

int32_t Sampler::take_device_draw(int32_t token) {
  FRINK_ASSERT(token >= 0 && token < n_vocab_, "token {} of {}", token, n_vocab_);
  if (params_.temp > 0.0f) take_uniform();
  return token;
}

int32_t greedy_token(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

}  // namespace frink
