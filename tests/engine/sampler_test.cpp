// Sampler: each stage alone, the chain's order, seeding, and the drawn distribution against
// softmax(logits / T) (semantics in src/engine/sampler.h, after llama.cpp's llama-sampling.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

namespace frink {
namespace {

std::vector<TokenLogit> cands_of(const std::vector<float>& logits) {
  std::vector<TokenLogit> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({int32_t(i), logits[i]});
  return c;
}

std::set<int32_t> ids_of(const std::vector<TokenLogit>& c) {
  std::set<int32_t> s;
  for (const TokenLogit& t : c) s.insert(t.id);
  return s;
}

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_for(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

SamplerParams no_truncation(float temp, int64_t seed) {
  SamplerParams p;
  p.temp = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> l(n);
  for (float& x : l) x = dist(rng);
  return l;
}

int32_t argmax_of(const std::vector<float>& l) {
  return int32_t(std::max_element(l.begin(), l.end()) - l.begin());  // first max
}

TEST(Sampler, GreedyPicksArgmax) {
  SamplerParams p;
  p.temp = 0.0f;
  for (uint32_t s = 0; s < 20; ++s) {
    const std::vector<float> l = random_logits(1000, s);
    Sampler sampler(p, 1000);
    EXPECT_EQ(sampler.sample(l.data()), argmax_of(l)) << "logits seed " << s;
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  SamplerParams p;
  p.temp = -1.0f;
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  Sampler sampler(p, 5);
  EXPECT_EQ(sampler.sample(l.data()), 1);
}

TEST(Sampler, TopK1EqualsGreedy) {
  SamplerParams p;
  p.temp = 1.5f;
  p.top_k = 1;
  for (int64_t seed = 0; seed < 50; ++seed) {
    p.seed = seed;
    const std::vector<float> l = random_logits(300, uint32_t(seed));
    Sampler sampler(p, 300);
    EXPECT_EQ(sampler.sample(l.data()), argmax_of(l)) << "seed " << seed;
  }
}

TEST(Sampler, SeededSamplingIsReproducible) {
  const std::vector<float> l(50, 0.0f);  // uniform: two independent draws agree 1 time in 50
  SamplerParams p = no_truncation(1.0f, 1234);
  Sampler a(p, 50), b(p, 50);
  std::vector<int32_t> first;
  for (int i = 0; i < 200; ++i) {
    const int32_t t = a.sample(l.data());
    EXPECT_EQ(t, b.sample(l.data())) << "draw " << i;
    first.push_back(t);
  }
  a.reset();  // a fixed seed replays the same draws
  for (int i = 0; i < 200; ++i) EXPECT_EQ(a.sample(l.data()), first[i]) << "draw " << i;

  p.seed = 1235;
  Sampler c(p, 50);
  int same = 0;
  for (int i = 0; i < 200; ++i) same += c.sample(l.data()) == first[i];
  EXPECT_LT(same, 30) << "another seed should give another sequence (expected ~4 of 200)";
}

// N draws at temperature T; each token's frequency must lie within 5 standard deviations of
// the binomial, sqrt(p(1-p)/N), of softmax(logits / T). The seed is fixed, so the test is
// deterministic; for a fair sampler a 5-sigma miss over 5 tokens has probability ~3e-6.
TEST(Sampler, FrequenciesMatchSoftmaxOverTemperature) {
  const std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f};
  const int n = 200000;
  for (float temp : {0.7f, 1.0f, 2.0f}) {
    Sampler sampler(no_truncation(temp, 42), 5);
    std::vector<int> hits(5, 0);
    for (int i = 0; i < n; ++i) ++hits[sampler.sample(l.data())];
    double total = 0;
    for (float x : l) total += std::exp(x / temp);
    for (int t = 0; t < 5; ++t) {
      const double p = std::exp(l[t] / temp) / total;
      const double sigma = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(double(hits[t]) / n, p, 5 * sigma) << "T " << temp << " token " << t;
    }
  }
}

TEST(SamplerStages, TopKKeepsTheKHighest) {
  std::vector<TokenLogit> c = cands_of({0.1f, 3.0f, -2.0f, 2.0f, 1.0f});
  sampling::top_k(c, 2);
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{1, 3}));
  c = cands_of({0.1f, 3.0f});
  sampling::top_k(c, 0);  // off
  EXPECT_EQ(c.size(), 2u);
}

// probs 0.5, 0.3, 0.15, 0.05 in shuffled id order.
const std::vector<double> kProbs = {0.15, 0.5, 0.05, 0.3};

TEST(SamplerStages, TopPKeepsTheSmallestPrefixReachingP) {
  std::vector<TokenLogit> c = cands_of(logits_for(kProbs));
  sampling::top_p(c, 0.75f);  // 0.5 + 0.3 = 0.8 >= 0.75
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{1, 3}));
  c = cands_of(logits_for(kProbs));
  sampling::top_p(c, 0.85f);  // needs 0.15 too
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{0, 1, 3}));
  c = cands_of(logits_for(kProbs));
  sampling::top_p(c, 0.1f);  // the top token alone already reaches it
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{1}));
  c = cands_of(logits_for(kProbs));
  sampling::top_p(c, 1.0f);  // off
  EXPECT_EQ(c.size(), 4u);
}

// Over a whole vocabulary (top-k off), the prefix top_p sorts (its best 256 by a partial sort,
// the rest by a radix sort where the mass needs it) is the full sort's, cut where the
// definition cuts it: peaked logits (a few tokens hold the mass) and flat ones (thousands of
// tokens, ties among them, zeros of both signs: the radix sort's order is `before`'s).
TEST(SamplerStages, TopPOverAVocabularyEqualsTheFullSortsPrefix) {
  std::mt19937 rng(3);
  for (float sd : {1.5f, 3.0f}) {
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> l(128256);
    for (float& v : l) v = nd(rng);
    if (sd < 2.0f) l[78] = l[77] = 16.0f;  // peaked (97.8% of the mass), a tie at the top
    if (sd > 2.0f)  // flat: many equal values (ids decide their order), and zeros of both signs
      for (size_t i = 0; i < l.size(); ++i)
        l[i] = i % 1000 == 0 ? (i % 2000 ? -0.0f : 0.0f) : std::round(l[i] * 16) / 16;
    std::vector<TokenLogit> got = cands_of(l);
    sampling::top_p(got, 0.95f);
    std::vector<TokenLogit> want = cands_of(l);
    const float max_logit = *std::max_element(l.begin(), l.end());
    double total = 0;  // id order, by chunks of sampling::kSumChunk
    for (size_t c = 0; c < want.size(); c += sampling::kSumChunk) {
      double sum = 0;
      for (size_t i = c; i < std::min(want.size(), c + sampling::kSumChunk); ++i)
        sum += std::exp(double(want[i].logit) - max_logit);
      total += sum;
    }
    std::sort(want.begin(), want.end(), [](const TokenLogit& a, const TokenLogit& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    });
    double before = 0, run = 0;  // the mass through each candidate, by chunks
    size_t keep = want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      if (i % sampling::kSumChunk == 0) {
        before += run;
        run = 0;
      }
      if (before + (run += std::exp(double(want[i].logit) - max_logit) / total) >= 0.95) {
        keep = i + 1;
        break;
      }
    }
    want.resize(keep);
    ASSERT_EQ(got.size(), want.size()) << "sd " << sd;
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i].id, want[i].id) << "sd " << sd << " rank " << i;
    if (sd > 2.0f) {
      EXPECT_GT(keep, 4096u);  // the flat case reached the radix sort
    } else {
      EXPECT_LT(keep, 256u);
    }
  }
}

TEST(SamplerStages, MinPIsRelativeToTheTopProbability) {
  std::vector<TokenLogit> c = cands_of(logits_for(kProbs));
  sampling::min_p(c, 0.2f);  // keeps p >= 0.1
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{0, 1, 3}));
  c = cands_of(logits_for(kProbs));
  sampling::min_p(c, 0.5f);  // keeps p >= 0.25
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{1, 3}));
  c = cands_of(logits_for(kProbs));
  sampling::min_p(c, 2.0f);  // nothing passes: the top token stays (min_keep 1)
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{1}));
}

// The whole chain never draws what top-p or min-p cut, and top-p sees temperature-1
// probabilities: a high temperature flattens the survivors but keeps the cut where it was.
TEST(Sampler, TruncationHoldsThroughTheChainAtAnyTemperature) {
  const std::vector<float> l = logits_for(kProbs);
  for (float temp : {0.5f, 1.0f, 5.0f}) {
    SamplerParams p = no_truncation(temp, 9);
    p.top_p = 0.75f;
    Sampler top_p(p, 4);
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    Sampler min_p(p, 4);
    std::set<int32_t> seen_p, seen_m;
    for (int i = 0; i < 5000; ++i) {
      seen_p.insert(top_p.sample(l.data()));
      seen_m.insert(min_p.sample(l.data()));
    }
    EXPECT_EQ(seen_p, (std::set<int32_t>{1, 3})) << "top-p, T " << temp;
    EXPECT_EQ(seen_m, (std::set<int32_t>{1, 3})) << "min-p, T " << temp;
  }
}

SamplerParams greedy_with(float repeat, float presence, float frequency, int last_n = 64) {
  SamplerParams p;
  p.temp = 0.0f;
  p.repeat_penalty = repeat;
  p.presence_penalty = presence;
  p.frequency_penalty = frequency;
  p.penalty_last_n = last_n;
  return p;
}

TEST(SamplerPenalties, RepeatDividesPositiveAndMultipliesNegative) {
  const std::vector<float> pos = {2.0f, 1.9f, 0.0f};  // 2.0 / 1.1 = 1.82 < 1.9
  Sampler a(greedy_with(1.1f, 0, 0), 3);
  EXPECT_EQ(a.sample(pos.data()), 0);
  a.accept(0);
  EXPECT_EQ(a.sample(pos.data()), 1);

  const std::vector<float> neg = {-1.0f, -1.05f, -3.0f};  // -1.0 * 1.1 = -1.1 < -1.05
  Sampler b(greedy_with(1.1f, 0, 0), 3);
  b.accept(0);
  EXPECT_EQ(b.sample(neg.data()), 1);
}

TEST(SamplerPenalties, PresenceOnceFrequencyPerOccurrence) {
  const std::vector<float> l = {1.0f, 0.8f};
  Sampler presence(greedy_with(1.0f, 0.3f, 0), 2);
  presence.accept(0);
  EXPECT_EQ(presence.sample(l.data()), 1);  // 1.0 - 0.3 = 0.7

  Sampler frequency(greedy_with(1.0f, 0, 0.15f), 2);
  frequency.accept(0);
  EXPECT_EQ(frequency.sample(l.data()), 0);  // 1.0 - 0.15 = 0.85
  frequency.accept(0);
  EXPECT_EQ(frequency.sample(l.data()), 1);  // 1.0 - 0.30 = 0.70

  Sampler presence_twice(greedy_with(1.0f, 0.15f, 0), 2);
  presence_twice.accept(0);
  presence_twice.accept(0);
  EXPECT_EQ(presence_twice.sample(l.data()), 0);  // 1.0 - 0.15 once = 0.85
}

TEST(SamplerPenalties, OnlyTheLastNTokensCountAndResetForgets) {
  const std::vector<float> l = {1.0f, 0.8f, -5.0f, -5.0f};
  Sampler s(greedy_with(1.0f, 0.3f, 0, /*last_n=*/2), 4);
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 1);
  s.accept(2);
  EXPECT_EQ(s.sample(l.data()), 1);  // window {0, 2}
  s.accept(3);
  EXPECT_EQ(s.sample(l.data()), 0);  // window {2, 3}: token 0 left it
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 1);
  s.reset();
  EXPECT_EQ(s.sample(l.data()), 0);

  Sampler off(greedy_with(1.0f, 0.3f, 0, /*last_n=*/0), 4);
  off.accept(0);
  EXPECT_EQ(off.sample(l.data()), 0);
}

// Penalties run before truncation and temperature, as in llama.cpp: a penalised token can
// fall out of top-k = 1.
TEST(SamplerPenalties, ApplyBeforeTopK) {
  SamplerParams p = greedy_with(1.0f, 0.5f, 0);
  p.temp = 1.0f;
  p.top_k = 1;
  p.seed = 3;
  const std::vector<float> l = {1.0f, 0.8f, 0.0f};
  Sampler s(p, 3);
  EXPECT_EQ(s.sample(l.data()), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 1);
}

// The device split of sample(): device_pick's penalties and top-k computed here as a device
// does (the llama.cpp penalty formula on the listed tokens, then sampling::top_k), finished by
// sampling::finish with the pick's parameters and uniform, and handed to take_device_draw,
// draw the same token as sample() on the full logits, step after step with the same seed;
// each pick's next uniform is the next step's. And device_pick declines what it cannot split.
TEST(SamplerDevicePick, TopKPlusFinishEqualsSample) {
  SamplerParams p;
  p.temp = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repeat_penalty = 1.2f;
  p.frequency_penalty = 0.3f;
  p.presence_penalty = 0.2f;
  p.seed = 11;
  const int n_vocab = 3000;
  Sampler full(p, n_vocab), split(p, n_vocab);
  double u_next = -1;
  for (int step = 0; step < 50; ++step) {
    std::vector<float> l = random_logits(n_vocab, 100 + step);
    l[17] = l[18] = 9.0f;  // a tie at the top: the lower id first
    const int32_t want = full.sample(l.data());
    const std::optional<DevicePick> pick = split.device_pick();
    ASSERT_TRUE(pick.has_value());
    ASSERT_EQ(pick->top_k, 40);
    const DeviceDraw& d = pick->draw;
    EXPECT_EQ(d.log_min_p, std::log(p.min_p));
    if (step > 0) {
      EXPECT_EQ(d.u, u_next) << "step " << step;
    }
    u_next = d.u_next;
    for (size_t i = 0; i < pick->pen_ids.size(); ++i) {
      float& v = l[static_cast<size_t>(pick->pen_ids[i])];
      v = sampling::penalized(v, pick->pen_counts[i], pick->repeat, pick->frequency, pick->presence);
    }
    std::vector<TokenLogit> top = cands_of(l);
    sampling::top_k(top, pick->top_k);
    const int32_t got = split.take_device_draw(sampling::finish(top, d.top_p, d.min_p, d.temp, d.u));
    ASSERT_EQ(got, want) << "step " << step;
    full.accept(want);
    split.accept(got);
  }
  SamplerParams no_k = p;
  no_k.top_k = 0;
  const std::optional<DevicePick> whole = Sampler(no_k, n_vocab).device_pick();
  ASSERT_TRUE(whole.has_value());  // the draw over every logit
  EXPECT_TRUE(whole->whole_vocab);
  EXPECT_EQ(whole->top_k, 0);
  no_k.top_k = n_vocab;
  EXPECT_FALSE(Sampler(no_k, n_vocab).device_pick().has_value());  // top-k not below the vocabulary
  SamplerParams greedy = p;
  greedy.temp = 0.0f;
  EXPECT_EQ(Sampler(greedy, n_vocab).device_pick()->top_k, 0);  // the argmax
}

// The device split of sample() with top-k off (DevicePick::whole_vocab): the penalties on the
// listed tokens, then sampling::finish over every token in id order with the pick's chain and
// uniform, handed to take_device_draw, draw what sample() draws, step after step; top-p and
// min-p off: the draw over every token, its mass by chunks (sampling::kSumChunk).
TEST(SamplerDevicePick, WholeVocabularyFinishEqualsSample) {
  const SamplerParams p{.temp = 1.1f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.3f,
                        .frequency_penalty = 0.2f, .seed = 3};
  const int n_vocab = 1000;
  Sampler full(p, n_vocab), split(p, n_vocab);
  std::set<int32_t> drawn;
  for (int step = 0; step < 40; ++step) {
    std::vector<float> l = random_logits(n_vocab, 500 + step);
    const int32_t want = full.sample(l.data());
    const std::optional<DevicePick> pick = split.device_pick();
    ASSERT_TRUE(pick.has_value() && pick->whole_vocab);
    for (size_t i = 0; i < pick->pen_ids.size(); ++i) {
      float& v = l[static_cast<size_t>(pick->pen_ids[i])];
      v = sampling::penalized(v, pick->pen_counts[i], pick->repeat, pick->frequency, pick->presence);
    }
    std::vector<TokenLogit> all = cands_of(l);
    const DeviceDraw& d = pick->draw;
    ASSERT_EQ(split.take_device_draw(sampling::finish(all, d.top_p, d.min_p, d.temp, d.u)), want) << "step " << step;
    full.accept(want);
    split.accept(want);
    drawn.insert(want);
  }
  EXPECT_GT(drawn.size(), 20u);  // spread over the vocabulary: chunks past the first were walked
}

// finish's mass by chunks: where the draw's point reaches the mass through a candidate of the
// third chunk (the earlier chunks' sums plus its chunk's terms up to it, sampler.h), the draw
// is the candidate after it; just below, the candidate itself.
TEST(SamplerStages, FinishWalksTheMassByChunks) {
  std::vector<TokenLogit> cands;
  for (int i = 0; i < 700; ++i) cands.push_back({i, static_cast<float>((i * 37) % 11) * 0.3f});
  const float max_logit = cands[sampling::argmax(cands)].logit;
  const auto term = [&](int i) { return std::exp(double(cands[static_cast<size_t>(i)].logit) - max_logit); };
  const auto chunk_sum = [&](int from, int to) {
    double sum = 0;
    for (int i = from; i < to; ++i) sum += term(i);
    return sum;
  };
  const double total = (chunk_sum(0, 256) + chunk_sum(256, 512)) + chunk_sum(512, 700);
  const double mass = (chunk_sum(0, 256) + chunk_sum(256, 512)) + chunk_sum(512, 601);  // through candidate 600
  double u = mass / total;  // the least u whose point u * total reaches the mass
  while (u * total < mass) u = std::nextafter(u, 1.0);
  while (std::nextafter(u, 0.0) * total >= mass) u = std::nextafter(u, 0.0);
  std::vector<TokenLogit> a = cands, b = cands;
  EXPECT_EQ(sampling::finish(a, 1.0f, 0.0f, 1.0f, u), 601);
  EXPECT_EQ(sampling::finish(b, 1.0f, 0.0f, 1.0f, std::nextafter(u, 0.0)), 600);
}

TEST(SamplerParams, NonFiniteValuesAreRefused) {
  EXPECT_THROW(Sampler(SamplerParams{.temp = NAN}, 10), Error);
  EXPECT_THROW(Sampler(SamplerParams{.top_p = INFINITY}, 10), Error);
  EXPECT_THROW((SamplerParams{.frequency_penalty = -INFINITY}.check()), Error);
  EXPECT_NO_THROW(Sampler(SamplerParams{.temp = -1.0f, .top_p = 2.0f, .min_p = 3.0f}, 10));  // llama.cpp's meanings
}

// A fixed seed replays its draws after reset(), the two looked ahead included.
TEST(SamplerDevicePick, ResetReplaysTheUniforms) {
  SamplerParams p;
  p.seed = 5;
  Sampler s(p, 100);
  const DeviceDraw first = s.device_pick()->draw;
  s.take_device_draw(3);
  EXPECT_EQ(s.device_pick()->draw.u, first.u_next);
  s.reset();
  EXPECT_EQ(s.device_pick()->draw.u, first.u);
  EXPECT_EQ(s.device_pick()->draw.u_next, first.u_next);
}

// A step enqueued ahead takes the next window as this pick's with the picked token entering
// (DevicePick::penalties_after): true for the token the caller accepts, through a window that
// fills, drops its oldest (counts down to zero and down by one) and sees repeats; false for
// any other token, for other parameters, and where the caller accepted something else too.
TEST(SamplerDevicePick, NextPenaltiesAreThisWindowWithTheTokenEntering) {
  const SamplerParams p{.temp = 0.0f, .repeat_penalty = 1.2f, .frequency_penalty = 0.1f, .penalty_last_n = 4};
  Sampler s(p, 50);
  std::optional<DevicePick> now = s.device_pick();
  ASSERT_TRUE(now && now->penalize);
  EXPECT_TRUE(now->pen_ids.empty());  // on before any token entered
  const int32_t tokens[] = {7, 3, 7, 9, 7, 1, 2, 3, 3, 3, 8};
  int leaving = 0;
  for (const int32_t t : tokens) {
    leaving += now->pen_leaving >= 0;
    s.accept(t);
    const std::optional<DevicePick> next = s.device_pick();
    EXPECT_TRUE(now->penalties_after(*next, t)) << "token " << t;
    EXPECT_FALSE(now->penalties_after(*next, (t + 1) % 50)) << "token " << t;
    DevicePick other = *next;
    other.presence = 0.5f;
    EXPECT_FALSE(now->penalties_after(other, t));
    now = next;
  }
  EXPECT_EQ(leaving, 7);  // the window was full from the fourth token on
  Sampler twice(p, 50);
  twice.accept(4);
  const DevicePick before = *twice.device_pick();
  twice.accept(5);
  twice.accept(6);
  EXPECT_FALSE(before.penalties_after(*twice.device_pick(), 5));
  EXPECT_FALSE(Sampler(SamplerParams{.temp = 0.0f}, 50).device_pick()->penalize);  // neutral penalties: off
}

}  // namespace
}  // namespace frink
