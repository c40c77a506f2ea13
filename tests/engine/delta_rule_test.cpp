// The chunked gated delta rule against the token-by-token recurrence (src/cpu/delta_rule.h),
// alone over a case table and inside a model's prefill; and rewinding a hybrid session
// through its recurrent-state snapshots.
#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "cpu/delta_rule.h"
#include "engine/decoder.h"
#include "engine/logits_harness.h"
#include "engine/rewind.h"
#include "engine/sampler.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

struct RuleCase {
  int64_t n, d, chunk;
};

// Inputs shaped like the model's: q and k L2-normalised, beta in (0, 1), g = -softplus * a
// in about [-1.5, 0), a non-zero starting state.
struct RuleInputs {
  std::vector<float> q, k, v, g, beta, state;
};

RuleInputs make_inputs(int64_t n, int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  RuleInputs in;
  auto fill = [&](std::vector<float>& x, int64_t count) {
    x.resize(static_cast<size_t>(count));
    for (auto& e : x) e = nd(rng);
  };
  fill(in.q, n * d);
  fill(in.k, n * d);
  fill(in.v, n * d);
  fill(in.state, d * d);
  for (int64_t t = 0; t < n; ++t)
    for (auto* x : {&in.q, &in.k}) {
      float s = 0;
      for (int64_t i = 0; i < d; ++i) s += (*x)[t * d + i] * (*x)[t * d + i];
      for (int64_t i = 0; i < d; ++i) (*x)[t * d + i] /= std::sqrt(s);
    }
  for (int64_t t = 0; t < n; ++t) {
    in.g.push_back(-1.5f * ud(rng));
    in.beta.push_back(ud(rng));
  }
  return in;
}

cpu::DeltaRuleSeq seq_of(const RuleInputs& in, int64_t n, int64_t d, float* out) {
  cpu::DeltaRuleSeq s;
  s.q = in.q.data();
  s.k = in.k.data();
  s.v = in.v.data();
  s.qk_stride = s.v_stride = s.out_stride = d;
  s.g = in.g.data();
  s.beta = in.beta.data();
  s.out = out;
  s.n = n;
  s.d = d;
  s.q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  return s;
}

float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float e : x) m = std::max(m, std::abs(e));
  return m;
}

// Relative max error of the outputs and of the final state. Both formulations run in f32 and
// differ only in association: each output is a sum of O(d + chunk) products of O(1) terms
// whose rounding errors, ~6e-8 each, grow like their square root, and the state carries over
// chunks with decays < 1, so the error stays near 1e-6 of the largest value; 2e-5 leaves a
// margin and still fails on any real mistake (a wrong decay index or a missing beta gives
// 1e-2 or more).
TEST(DeltaRule, ChunkedEqualsRecurrent) {
  const RuleCase cases[] = {{1, 16, 64},  {5, 16, 4},  {63, 16, 64}, {64, 32, 64}, {65, 32, 64},
                            {130, 32, 16}, {200, 64, 64}, {77, 128, 64}, {100, 16, 1}, {97, 16, 7}};
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " d " << c.d << " chunk " << c.chunk);
    RuleInputs in = make_inputs(c.n, c.d, static_cast<uint32_t>(c.n * 131 + c.d));
    std::vector<float> out_r(static_cast<size_t>(c.n * c.d)), out_c(out_r.size());
    std::vector<float> s_r = in.state, s_c = in.state;
    cpu::delta_rule_recurrent(seq_of(in, c.n, c.d, out_r.data()), s_r.data());
    cpu::delta_rule_chunked(seq_of(in, c.n, c.d, out_c.data()), s_c.data(), c.chunk);
    float e_out = 0, e_state = 0;
    for (size_t i = 0; i < out_r.size(); ++i) e_out = std::max(e_out, std::abs(out_r[i] - out_c[i]));
    for (size_t i = 0; i < s_r.size(); ++i) e_state = std::max(e_state, std::abs(s_r[i] - s_c[i]));
    EXPECT_LT(e_out / max_abs(out_r), 2e-5);
    EXPECT_LT(e_state / max_abs(s_r), 2e-5);
  }
}

// The recurrence in double on the same f32 inputs: the ground truth both forms are held to.
void delta_rule_f64(const RuleInputs& in, int64_t n, int64_t d, std::vector<double>& out, std::vector<double>& S) {
  const double q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  S.assign(in.state.begin(), in.state.end());
  out.assign(static_cast<size_t>(n * d), 0.0);
  std::vector<double> sk(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    const float* q = &in.q[t * d];
    const float* k = &in.k[t * d];
    const float* v = &in.v[t * d];
    const double decay = std::exp(static_cast<double>(in.g[t])), beta = in.beta[t];
    std::fill(sk.begin(), sk.end(), 0.0);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) {
        S[i * d + j] *= decay;
        sk[j] += k[i] * S[i * d + j];
      }
    for (int64_t j = 0; j < d; ++j) {
      const double delta = beta * (v[j] - sk[j]);
      for (int64_t i = 0; i < d; ++i) S[i * d + j] += k[i] * delta;
    }
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) out[t * d + j] += q[i] * q_scale * S[i * d + j];
  }
}

// Both forms against the f64 recurrence on inputs like a qwen3.5-9b synth's first delta-net
// layer (frink synth --preset qwen3.5-9b --layers 4 --type Q4_0; d 128, 512 tokens): there g
// spans [-19.9, -0.11] (ssm_a ~ -4), so exp(G) of a 64-token chunk underflows f32, and on that
// layer's dumped q/k/v/g/beta the worst head's max error relative to its max |o| was 5.7e-7
// (recurrent) and 4.9e-7 (chunked). Each output is a sum of ~d products of f32 terms (~6e-8
// rounding each, growing like sqrt(d)); here the worst is 5.4e-7, so 2e-6 leaves a margin and
// still fails on a real mistake (beta dropped from W: 1.9e-4 with the strong decays, 0.2 with
// the weak). This is the check the whole-model comparison on a quantized model cannot make:
// see validated() in bench/hybrid_prefill.cpp.
TEST(DeltaRule, BothFormsMatchFloat64AtModelRanges) {
  struct Case {
    int64_t n, d, chunk;
    float g_min, g_max;  // g uniform in [g_min, g_max]
  };
  const Case cases[] = {{512, 128, 64, -20.0f, -0.1f}, {300, 128, 64, -0.05f, 0.0f}, {200, 128, 16, -20.0f, 0.0f}};
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " d " << c.d << " chunk " << c.chunk << " g [" << c.g_min
                                    << ", " << c.g_max << "]");
    RuleInputs in = make_inputs(c.n, c.d, static_cast<uint32_t>(c.n + c.chunk));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> ud(c.g_min, c.g_max);
    for (auto& g : in.g) g = ud(rng);
    for (auto& v : in.v) v *= 0.5f;  // post-conv SiLU values
    std::vector<double> ref, s_ref;
    delta_rule_f64(in, c.n, c.d, ref, s_ref);
    double ref_max = 0, s_max = 0;
    for (double e : ref) ref_max = std::max(ref_max, std::abs(e));
    for (double e : s_ref) s_max = std::max(s_max, std::abs(e));
    for (int64_t chunk : {int64_t{0}, c.chunk}) {
      std::vector<float> out(ref.size()), state = in.state;
      if (chunk == 0)
        cpu::delta_rule_recurrent(seq_of(in, c.n, c.d, out.data()), state.data());
      else
        cpu::delta_rule_chunked(seq_of(in, c.n, c.d, out.data()), state.data(), chunk);
      double e_out = 0, e_state = 0;
      for (size_t i = 0; i < out.size(); ++i) e_out = std::max(e_out, std::abs(out[i] - ref[i]));
      for (size_t i = 0; i < state.size(); ++i) e_state = std::max(e_state, std::abs(state[i] - s_ref[i]));
      EXPECT_LT(e_out / ref_max, 2e-6) << "chunk " << chunk;
      EXPECT_LT(e_state / s_max, 2e-6) << "chunk " << chunk;
    }
  }
}

std::filesystem::path arch_file(const char* name) {
  return shared_testdata() / "llamacpp" / "archs" / (std::string(name) + ".gguf");
}

std::vector<int32_t> random_prompt(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % n_vocab);
  return t;
}

// A whole model's prefill with the delta rule chunked (several sizes, prompt lengths not a
// multiple of them) equals the same prefill token by token: the bound is the kernel's above
// carried through two layers, far below the 1e-6 the llama.cpp comparison allows.
TEST(DeltaRule, ModelPrefillChunkedEqualsTokenByToken) {
  FRINK_REQUIRE_SHARED();
  auto model = load_model(arch_file("qwen3next-moe").string());
  Decoder dec(*model, {});
  const auto prompt = random_prompt(100, model->hp.n_vocab, 7);
  std::vector<float> ref, got;
  Session s0(*model, 0);
  s0.recurrent().set_delta_chunk(0);
  dec.eval(s0, prompt, true, ref);
  for (int64_t chunk : {64, 16, 7}) {
    Session s(*model, 0);
    s.recurrent().set_delta_chunk(chunk);
    dec.eval(s, prompt, true, got);
    EXPECT_LT(nmse(got.data(), ref.data(), ref.size()), 1e-11) << "chunk " << chunk;
  }
}

// Rewinding to a snapshot position is exact and replays nothing; rewinding to a position
// without one replays from the nearest snapshot before it. Either way the following decode
// equals a fresh session's that ran only the kept tokens. Same arithmetic on both sides (the
// replay runs the same batch sizes as the fresh run), so the logits agree to 1e-12.
class HybridRewind : public ::testing::TestWithParam<const char*> {};

TEST_P(HybridRewind, TruncateThenDecodeEqualsFreshRun) {
  FRINK_REQUIRE_SHARED();
  auto model = load_model(arch_file(GetParam()).string());
  Decoder dec(*model, {});
  const auto prompt = random_prompt(40, model->hp.n_vocab, 11);
  Session s(*model, 0);
  s.recurrent().set_snapshot_policy(16, 8);  // snapshots at 16, 32 (inside the prompt), 40 (its end)
  std::vector<float> logits;
  dec.eval(s, prompt, false, logits);
  decode_steps(dec, s, 3, 6);  // positions 40..45: single tokens, no snapshots
  ASSERT_EQ(s.n_past(), 46);

  auto fresh = [&](int64_t n, int32_t next) {
    Session f(*model, 0);
    std::vector<float> l;
    const std::vector<int32_t> kept(s.tokens().begin(), s.tokens().begin() + n);
    dec.eval(f, kept, false, l);
    return decode_steps(dec, f, next, 3);
  };
  const std::vector<int32_t> tokens = s.tokens();
  for (int64_t n : {43, 32, 20}) {  // no snapshot (replay 3 from 40), a snapshot, replay 4 from 16
    SCOPED_TRACE(n);
    const auto want = fresh(n, tokens[static_cast<size_t>(n)]);
    const int64_t replayed = rewind_session(dec, s, n);
    EXPECT_EQ(replayed, n == 43 ? 3 : n == 32 ? 0 : 4);
    ASSERT_EQ(s.n_past(), n);
    const auto got = decode_steps(dec, s, tokens[static_cast<size_t>(n)], 3);
    EXPECT_LT(nmse(got.data(), want.data(), want.size()), 1e-12);
    rewind_session(dec, s, n);  // back to n for the next, shorter target
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, HybridRewind, ::testing::Values("qwen3next-moe", "granitehybrid-dense"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace frink::test
