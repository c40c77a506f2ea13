// The host KV cache is authoritative and rewinds cleanly: truncating to n rows and decoding
// on gives exactly what a fresh session fed the same tokens gives. Batch boundaries do not
// change results either (a prompt in one batch, in odd-sized batches, or token by token).
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/decoder.h"
#include "engine/logits_harness.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

std::vector<int32_t> prompt_of(const LogitsFixture& fx) { return fx.prompt; }

class Rewind : public ::testing::TestWithParam<const char*> {};

TEST_P(Rewind, TruncateThenDecodeEqualsAFreshRun) {
  FRINK_REQUIRE_SHARED();
  const auto dir = shared_testdata() / "llamacpp" / "archs";
  const std::string name = GetParam();
  auto fx = read_fixture(dir / (name + ".json"));
  auto m = load_model((dir / (name + ".gguf")).string());
  Decoder dec(*m, {});
  const std::vector<int32_t> p = prompt_of(fx);  // 24 tokens; gemma2's window is 16
  const std::vector<int32_t> tail = {5, 17, 99, 3};

  // Rewound: the whole prompt, then back to n rows, then new tokens.
  for (int64_t n : {0, 1, 7, 17, 23}) {
    Session rewound(*m, 64);
    std::vector<float> scratch, after_rewind, fresh_logits;
    dec.eval(rewound, p, false, scratch);
    rewound.truncate(n);
    EXPECT_EQ(rewound.cache(0).rows(), n);
    std::vector<int32_t> rest(p.begin(), p.begin() + n);
    rest.insert(rest.end(), tail.begin(), tail.end());
    dec.eval(rewound, tail, true, after_rewind);

    Session fresh(*m, 64);
    dec.eval(fresh, rest, true, fresh_logits);
    const int64_t V = m->hp.n_vocab;
    const float* want = fresh_logits.data() + n * V;
    // The same arithmetic in the same order: bit-identical, not merely close.
    for (size_t i = 0; i < after_rewind.size(); ++i) ASSERT_EQ(after_rewind[i], want[i]) << "n=" << n << " i=" << i;
  }
}

TEST_P(Rewind, BatchSplitsDoNotChangeLogits) {
  FRINK_REQUIRE_SHARED();
  const auto dir = shared_testdata() / "llamacpp" / "archs";
  const std::string name = GetParam();
  auto fx = read_fixture(dir / (name + ".json"));
  const auto path = (dir / (name + ".gguf")).string();
  LogitsRun one = run_logits(path, fx.prompt, 2, 512);
  for (int64_t b : {1, 5, 16}) {
    LogitsRun split = run_logits(path, fx.prompt, 2, b);
    EXPECT_LT(nmse(split.prefill.data(), one.prefill.data(), one.prefill.size()), 1e-12) << "batch " << b;
    EXPECT_EQ(split.greedy, one.greedy);
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, Rewind, ::testing::Values("llama-dense", "gemma2-dense", "bloom-dense"),
                         param_name);

TEST(Context, OverflowIsAnErrorAndLeavesTheSessionIntact) {
  FRINK_REQUIRE_SHARED();
  auto m = load_model((shared_testdata() / "llamacpp" / "archs" / "llama-dense.gguf").string());
  Decoder dec(*m, {});
  Session s(*m, 8);
  std::vector<float> logits;
  dec.eval(s, {1, 2, 3, 4, 5, 6}, false, logits);
  EXPECT_THROW(dec.eval(s, {7, 8, 9}, false, logits), frink::Error);
  EXPECT_EQ(s.n_past(), 6);
  EXPECT_EQ(s.cache(1).rows(), 6);
  dec.eval(s, {7, 8}, false, logits);  // still usable up to the limit
  EXPECT_EQ(s.n_past(), 8);
}

}  // namespace
}  // namespace frink::test
