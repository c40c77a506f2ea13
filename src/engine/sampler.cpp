// Sampling stages and the Sampler chain; semantics and order in sampler.h.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace frink {
namespace sampling {

namespace {

// The sum of term(i) over [0, n) in kSumChunk chunks (sampler.h).
template <class Term>
double chunked_sum(size_t n, Term term) {
  double total = 0;
  for (size_t c = 0; c < n; c += kSumChunk) {
    double s = 0;
    for (size_t i = c; i < std::min(n, c + kSumChunk); ++i) s += term(i);
    total += s;
  }
  return total;
}

bool before(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

bool is_sorted_desc(const std::vector<TokenLogit>& cands) {
  return std::is_sorted(cands.begin(), cands.end(), before);
}

// A candidate as one 64-bit key whose ascending order is `before`'s: the value's bits made
// monotonic (descending) above, the id below. -0 is +0, as `before` compares them.
uint64_t ascending_key(const TokenLogit& c) {
  uint32_t b;
  const float v = c.logit == 0.0f ? 0.0f : c.logit;
  std::memcpy(&b, &v, sizeof b);
  const uint32_t desc = (b & 0x80000000u) ? b : ~(b | 0x80000000u);  // larger values smaller
  return (uint64_t{desc} << 32) | static_cast<uint32_t>(c.id);
}

// [first, last) sorted in `before`'s order by an LSD radix sort of ascending_key, 16 bits a
// pass (passes whose digit is the same everywhere skipped): a whole vocabulary's sort where
// top-p keeps most of it (flat logits) took 19.4 ms a token with std::sort's rounds
// (bench_sampler, dev machine).
void radix_sort_desc(TokenLogit* first, TokenLogit* last) {
  const size_t n = static_cast<size_t>(last - first);
  // Kept between calls: fresh buffers' page faults and zeroing took a third of the time.
  thread_local std::vector<uint64_t> a, b;
  thread_local std::vector<size_t> count(size_t{1} << 16);
  a.resize(n);
  b.resize(n);
  for (size_t i = 0; i < n; ++i) a[i] = ascending_key(first[i]);
  for (int shift = 0; shift < 64; shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    for (uint64_t k : a) ++count[(k >> shift) & 0xffff];
    if (count[(a[0] >> shift) & 0xffff] == n) continue;
    size_t at = 0;
    for (size_t& c : count) at += std::exchange(c, at);
    for (uint64_t k : a) b[count[(k >> shift) & 0xffff]++] = k;
    a.swap(b);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint32_t desc = static_cast<uint32_t>(a[i] >> 32);
    const uint32_t bits = (desc & 0x80000000u) ? desc : ~desc & 0x7fffffffu;
    float v;
    std::memcpy(&v, &bits, sizeof v);
    first[i] = {static_cast<int32_t>(static_cast<uint32_t>(a[i])), v};
  }
}

}  // namespace

void sort_desc(std::vector<TokenLogit>& cands) {
  if (!is_sorted_desc(cands)) radix_sort_desc(cands.data(), cands.data() + cands.size());
}

void top_k(std::vector<TokenLogit>& cands, int k) {
  if (k <= 0 || static_cast<size_t>(k) >= cands.size()) return;
  std::partial_sort(cands.begin(), cands.begin() + k, cands.end(), before);
  cands.resize(k);
}

void top_p(std::vector<TokenLogit>& cands, float p) {
  if (p >= 1.0f || cands.empty()) return;
  // Softmax over the candidates at temperature 1, max-subtracted, its total summed in double
  // in the candidates' order (sorted after top-k, id order without it) by chunks, which a
  // device's draw repeats.
  const float max_logit = cands[argmax(cands)].logit;
  const double total =
      chunked_sum(cands.size(), [&](size_t i) { return std::exp(double(cands[i].logit) - max_logit); });
  // The prefix is sorted only as far as the mass needs: first the best 256 (a partial sort;
  // the mass is usually there), then, where it is not, the rest by a radix sort. A full sort
  // of a 128256-token vocabulary took 13.7 ms a token (dev machine), and rounds of partial
  // sorts growing 4x took 19.4 where top-p keeps most of it (flat logits); this: 0.76 ms
  // peaked, 3.5 flat (bench_sampler).
  const size_t head = std::min<size_t>(256, cands.size());
  bool sorted_rest = true;
  if (!is_sorted_desc(cands)) {
    std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(head), cands.end(), before);
    sorted_rest = false;
  }
  double before_chunk = 0, run = 0;  // the mass walked by chunks, as the draw's
  for (size_t i = 0; i < cands.size(); ++i) {
    if (i == head && !sorted_rest) radix_sort_desc(cands.data() + head, cands.data() + cands.size());
    if (i % kSumChunk == 0) before_chunk += std::exchange(run, 0.0);
    run += std::exp(double(cands[i].logit) - max_logit) / total;
    if (before_chunk + run >= p) {  // i + 1 >= min_keep (1) always holds
      cands.resize(i + 1);
      return;
    }
  }
  // Rounding left cum just below p: keep all, as llama.cpp does.
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
  // Softmax over the survivors, max-subtracted, summed in double in candidate order by chunks.
  const float max_logit = cands[argmax(cands)].logit;
  const auto term = [&](size_t i) { return std::exp(double(cands[i].logit) - max_logit); };
  const double at = u * chunked_sum(cands.size(), term);
  double before_chunk = 0;
  for (size_t c = 0; c < cands.size(); c += kSumChunk) {
    double run = 0;
    for (size_t i = c; i < std::min(cands.size(), c + kSumChunk); ++i) {
      run += term(i);
      if (at < before_chunk + run) return cands[i].id;
    }
    before_chunk += run;
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
    if (params_.top_k >= n_vocab_) return std::nullopt;
    if (params_.top_k > 0)
      pick.top_k = params_.top_k;
    else
      pick.whole_vocab = true;
    pick.draw.top_p = params_.top_p;
    pick.draw.min_p = params_.min_p;
    if (params_.min_p > 0.0f) pick.draw.log_min_p = std::log(params_.min_p);
    pick.draw.temp = params_.temp;
    pick.draw.u = uniform_[0];
    pick.draw.u_next = uniform_[1];
  }
  if (!penalties_off(params_)) {
    pick.penalize = true;
    const auto last_n = static_cast<size_t>(params_.penalty_last_n);
    if (params_.penalty_last_n > 0 && history_.size() == last_n) pick.pen_leaving = history_.front();
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

bool DevicePick::penalties_after(const DevicePick& next, int32_t entering) const {
  if (penalize != next.penalize) return false;
  if (!penalize) return true;
  if (repeat != next.repeat || frequency != next.frequency || presence != next.presence) return false;
  std::vector<std::pair<int32_t, int>> want, got;
  bool entered = false;
  for (size_t i = 0; i < pen_ids.size(); ++i) {
    const int32_t id = pen_ids[i];
    entered |= id == entering;
    const int n = pen_counts[i] + (id == entering) - (id == pen_leaving);
    if (n > 0) want.emplace_back(id, n);
  }
  if (!entered && entering != pen_leaving) want.emplace_back(entering, 1);
  for (size_t i = 0; i < next.pen_ids.size(); ++i) got.emplace_back(next.pen_ids[i], next.pen_counts[i]);
  if (want.size() != got.size()) return false;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  return want == got;
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
