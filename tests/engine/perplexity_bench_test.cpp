// frink perplexity and frink bench on stories260K (a real trained model, vocab 512):
// perplexity equals a by-hand NLL through the Decoder, is finite and below the vocabulary
// size; KL divergence of the model against itself is 0 with 100% top-token agreement; bench
// produces llama-bench's rows.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/bench.h"
#include "engine/decoder.h"
#include "engine/perplexity.h"
#include "engine/session.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"

namespace frink {
namespace {

std::string stories_path() { return (test::shared_testdata() / "models" / "stories260K.gguf").string(); }

// A few hundred tokens of TinyStories-like text.
std::string story_text() {
  std::string t;
  const char* lines[] = {
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. ",
      "One day, she saw a big red ball in the park. She ran to the ball and kicked it very hard. ",
      "The ball went up into the tree and did not come down. Lily was sad and started to cry. ",
      "Her friend Tom came and said, \"Don't worry, Lily. I will help you get the ball.\" ",
      "Tom climbed the tree and got the ball. Lily was very happy and said thank you to Tom. ",
      "They played with the ball all day long, and they were best friends forever. The end. "};
  for (int rep = 0; rep < 3; ++rep)
    for (const char* l : lines) t += l;
  return t;
}

TEST(Perplexity, MatchesByHandNllOnStories260K) {
  FRINK_REQUIRE_SHARED();
  const auto m = load_model(stories_path());
  const auto tok = Tokenizer::from_gguf(m->file->metadata());
  const auto tokens = perplexity_tokens(*tok, story_text());
  const int64_t n_ctx = 64, first = n_ctx / 2, V = m->hp.n_vocab;
  ASSERT_GE(int64_t(tokens.size()), 2 * n_ctx);
  ASSERT_TRUE(tok->add_bos());

  // By hand: each window from an empty session, first token BOS, the second half scored.
  const int64_t n_chunk = int64_t(tokens.size()) / n_ctx;
  Decoder dec(*m, DecoderOptions{});  // all cores, batches of 512, host path
  double nll = 0;
  int64_t n = 0;
  for (int64_t c = 0; c < n_chunk; ++c) {
    std::vector<int32_t> w(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    w[0] = tok->bos();
    Session s(*m, n_ctx);
    std::vector<float> logits;
    dec.eval(s, w, true, logits);
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + j * V;
      double mx = row[0], sum = 0;
      for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(row[i]));
      for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - mx);
      nll -= double(row[tokens[c * n_ctx + j + 1]]) - mx - std::log(sum);
      ++n;
    }
  }
  const double ppl_hand = std::exp(nll / double(n));

  PerplexityParams p;
  p.n_ctx = n_ctx;
  p.n_batch = 16;  // several evals per window: batching must not change the scores
  int64_t chunks_seen = 0;
  const PerplexityResult r = run_perplexity(*m, tokens, tok->bos(), p, [&](int64_t, double) { ++chunks_seen; });
  EXPECT_EQ(chunks_seen, n_chunk);
  EXPECT_EQ(r.n_scored, n);
  EXPECT_TRUE(std::isfinite(r.ppl));
  EXPECT_LT(r.ppl, double(V));
  EXPECT_GT(r.ppl, 1.0);
  // Same sums in the same order, from logits batching does not change: 1e-9 relative.
  EXPECT_NEAR(r.ppl, ppl_hand, 1e-9 * ppl_hand);
  // The printed estimate is the by-hand one, to the 4 decimals it shows.
  const std::string line = perplexity_final_line(r);
  EXPECT_EQ(line.substr(0, line.find(" +/-")), fmt::format("Final estimate: PPL = {:.4f}", ppl_hand));
  EXPECT_GT(r.ppl_err, 0.0);
}

TEST(Perplexity, KlAgainstItselfIsZero) {
  FRINK_REQUIRE_SHARED();
  const auto m = load_model(stories_path());
  const auto tok = Tokenizer::from_gguf(m->file->metadata());
  const auto tokens = perplexity_tokens(*tok, story_text());
  const auto base = std::filesystem::temp_directory_path() / "frink_kl_base_test.bin";
  PerplexityParams p;
  p.n_ctx = 64;
  p.kl_base_out = base.string();
  const PerplexityResult r0 = run_perplexity(*m, tokens, tok->bos(), p);
  p.kl_base_out.clear();
  p.kl_in = base.string();
  p.n_ctx = 999;  // the file's n_ctx and tokens win
  const PerplexityResult r1 = run_perplexity(*m, {}, tok->bos(), p);
  std::filesystem::remove(base);
  ASSERT_TRUE(r1.kl.has_value());
  EXPECT_EQ(r1.kl->n, r0.n_scored);
  EXPECT_DOUBLE_EQ(r1.ppl, r0.ppl);
  // Stored log-probs are off by at most 32/65535/2 = 2.4e-4 nats, so KL ~ err^2 ~ 1e-8.
  EXPECT_LT(std::fabs(r1.kl->kld_mean), 1e-6);
  EXPECT_DOUBLE_EQ(r1.kl->same_top, 1.0);
  EXPECT_NEAR(r1.kl->ppl_base, r0.ppl, 1e-3 * r0.ppl);
}

TEST(Perplexity, RefusesShortText) {
  FRINK_REQUIRE_SHARED();
  const auto m = load_model(stories_path());
  PerplexityParams p;
  p.n_ctx = 512;
  EXPECT_THROW(run_perplexity(*m, std::vector<int32_t>(100, 5), 1, p), Error);
}

TEST(Bench, RowsLikeLlamaBench) {
  FRINK_REQUIRE_SHARED();
  const auto m = load_model(stories_path());
  BenchParams p;
  p.n_prompt = {8};
  p.n_gen = {4};
  p.depths = {0, 16};
  p.reps = 2;
  const auto rows = run_bench(*m, p);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].test, "pp8");
  EXPECT_EQ(rows[1].test, "tg4");
  EXPECT_EQ(rows[3].test, "tg4 @ d16");
  for (const auto& r : rows) {
    EXPECT_EQ(r.samples_s.size(), 2u);
    EXPECT_GT(r.ts_mean, 0.0);
    EXPECT_FALSE(r.refused_layers.has_value());  // no device path, no refusal counter yet
  }
  EXPECT_TRUE(rows[1].gbps.has_value());
  EXPECT_FALSE(rows[0].gbps.has_value());
  const BenchModelInfo info = bench_model_info(*m, 1);
  EXPECT_NE(bench_markdown_row(info, rows[0]).find(" pp8 |"), std::string::npos);
  EXPECT_EQ(bench_json(info, rows).size(), 4u);
}

// A hybrid model at depth: a recurrent state rewinds only to a snapshot, so each repetition's
// rewind re-evaluates from there (bench asserts it lands exactly at the depth).
TEST(Bench, HybridModelRewindsToTheDepth) {
  const auto m = load_model((std::filesystem::path(FRINK_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "qwen3_next").string());
  BenchParams p;
  p.n_prompt = {6};
  p.n_gen = {3};
  p.depths = {13};
  p.reps = 2;
  p.n_batch = 5;  // depth 13 fills in batches of 5: snapshots at 5, 10, 13, none at 12
  const auto rows = run_bench(*m, p);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].test, "tg3 @ d13");
}

}  // namespace
}  // namespace frink
