// Every model the host passes gives the same answer on the device (issue 6): prefill logits
// for every position and the logits of each greedy decode step within NMSE 1e-4 of the host
// path, and identical greedy tokens. The host path is the reference (DESIGN.md section 2).
// Also: forcing any single layer to refuse (the host runs it, the rest stay on the device)
// changes nothing beyond the same bound.
//
// Why 1e-4: the host rounds activations to 8-bit blocks before quantized products (llama.cpp's
// CPU scheme, about 5e-6 NMSE per product), the device does not, and the device's cuBLAS
// prefill path rounds both operands to f16 (about 1e-7); a handful of layers compounds these
// to ~1e-5 at most on the tiny fixtures. A real bug (a wrong row, a stale mirror) is O(1).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/decoder.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "gpu_support.h"
#include "model/model.h"
#include "model/synth.h"
#include "step_ahead_script.h"

#ifdef FRINK_HAVE_CUDA
#include "cuda/attention.cuh"
#include "cuda/device_weights.h"
#endif

namespace frink::test {
namespace {

struct ModelRun {
  std::vector<float> prefill, decode;
  std::vector<int32_t> greedy;
  RefusalCounts refusals;
  int64_t whole_token_steps = 0;
  std::string device;  // Decoder::device_description
};

// Prompt of n_prompt ids (a fixed pattern inside the vocabulary), batched prefill in chunks of
// n_batch, then n_steps greedy decode steps; with `feed`, step i takes feed[i] (another run's
// greedy tokens) rather than its own choice, so two runs' steps see the same tokens even where
// a near tie of random weights picks differently (greedy still records its own choices).
ModelRun run_model(const Model& m, DecoderOptions o, int n_prompt, int n_steps,
                   const std::vector<int32_t>* feed = nullptr) {
  Decoder dec(m, o);
  Session s(m, 0);
  std::vector<int32_t> prompt;
  for (int i = 0; i < n_prompt; ++i) prompt.push_back(static_cast<int32_t>((1 + 7 * i * i + 3 * i) % m.hp.n_vocab));
  ModelRun r;
  dec.eval(s, prompt, true, r.prefill);
  const int64_t V = m.hp.n_vocab;
  int32_t next = greedy_token(r.prefill.data() + (n_prompt - 1) * V, V);
  std::vector<float> logits;
  for (int i = 0; i < n_steps; ++i) {
    r.greedy.push_back(next);
    if (feed) next = (*feed)[static_cast<size_t>(i)];
    dec.eval(s, {next}, false, logits);
    r.decode.insert(r.decode.end(), logits.begin(), logits.end());
    next = greedy_token(logits.data(), V);
  }
  r.greedy.push_back(next);
  r.refusals = dec.refusals();
  r.whole_token_steps = dec.whole_token_steps();
  r.device = dec.device_description();
  return r;
}

void expect_same(const ModelRun& dev, const ModelRun& host, const std::string& what, double bound = 1e-4) {
  ASSERT_EQ(dev.prefill.size(), host.prefill.size());
  const double e_pre = nmse(dev.prefill.data(), host.prefill.data(), host.prefill.size());
  const double e_dec = nmse(dev.decode.data(), host.decode.data(), host.decode.size());
  std::printf("[gpu] %-28s prefill nmse %.3g  decode nmse %.3g  refusals: %s\n", what.c_str(), e_pre, e_dec,
              dev.refusals.summary().c_str());
  EXPECT_LT(e_pre, bound) << what << " prefill";
  EXPECT_LT(e_dec, bound) << what << " decode";
  EXPECT_EQ(dev.greedy, host.greedy) << what;
}

DecoderOptions opts(DeviceChoice d, int64_t n_batch) {
  DecoderOptions o;
  o.n_threads = 4;
  o.n_batch = n_batch;
  o.device = d;
  return o;
}

class DeviceParity : public ::testing::TestWithParam<const char*> {};

// Prompt of 19 tokens: batches of 19 take the cuBLAS prefill path, batches of 5 the
// matrix-vector kernels (5 = one 4-token launch and one 1-token launch).
TEST_P(DeviceParity, PrefillAndDecodeMatchHost) {
  FRINK_REQUIRE_GPU();
  const std::string rel = GetParam();
  FRINK_REQUIRE_GPU_DATA(rel);
  const auto m = load_model((gpu_testdata() / rel).string());
  const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), 19, 8);
  for (int64_t nb : {512, 5}) {
    const ModelRun dev = run_model(*m, opts(DeviceChoice::kCuda, nb), 19, 8);
    expect_same(dev, host, rel + " b" + std::to_string(nb));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, DeviceParity,
    ::testing::Values("llamacpp/archs/llama-dense.gguf", "llamacpp/archs/qwen2-dense.gguf",
                      "llamacpp/archs/qwen3-dense.gguf", "llamacpp/archs/mistral3-dense.gguf",
                      "llamacpp/archs/phi3-dense.gguf", "llamacpp/archs/gemma2-dense.gguf",
                      "llamacpp/archs/bloom-dense.gguf", "llamacpp/archs/llama-moe.gguf",
                      "llamacpp/archs/qwen3moe-moe.gguf", "llamacpp/archs/olmoe-moe.gguf",
                      "llamacpp/archs/gpt-oss-moe.gguf", "llamacpp/archs/deepseek2-moe.gguf",
                      "llamacpp/archs/granitehybrid-dense.gguf", "llamacpp/quant/llama-dense-F16.gguf",
                      "llamacpp/quant/llama-dense-BF16.gguf", "llamacpp/quant/llama-dense-Q4_0.gguf",
                      "llamacpp/quant/llama-dense-Q4_1.gguf", "llamacpp/quant/llama-dense-Q5_0.gguf",
                      "llamacpp/quant/llama-dense-Q5_1.gguf", "llamacpp/quant/llama-dense-Q8_0.gguf",
                      "llamacpp/quant/llama-dense-Q2_K.gguf", "llamacpp/quant/llama-dense-Q3_K_M.gguf",
                      "llamacpp/quant/llama-dense-Q4_K_M.gguf", "llamacpp/quant/llama-dense-Q5_K_M.gguf",
                      "llamacpp/quant/llama-dense-Q6_K.gguf", "llamacpp/quant/llama-dense-IQ4_NL.gguf",
                      "llamacpp/quant/llama-dense-IQ4_XS.gguf", "llamacpp/quant/qwen3-dense-Q4_K_M.gguf",
                      "llamacpp/quant/qwen3-dense-Q8_0.gguf", "models/stories260K.gguf"),
    [](const auto& info) {
      std::string n = std::filesystem::path(info.param).stem().string();
      for (auto& c : n)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

class HfParity : public ::testing::TestWithParam<const char*> {};

// The transformers fixtures (SafeTensors folders committed under tests/fixtures/hf).
TEST_P(HfParity, PrefillAndDecodeMatchHost) {
  FRINK_REQUIRE_GPU();
  const auto dir = hf_fixture(GetParam());
  if (!std::filesystem::exists(dir / "config.json")) GTEST_SKIP() << dir << " absent";
  std::unique_ptr<Model> m;
  try {
    m = load_model(dir.string());
  } catch (const std::exception& e) {
    GTEST_SKIP() << "host cannot load " << GetParam() << " yet: " << e.what();
  }
  const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), 13, 6);
  const ModelRun dev = run_model(*m, opts(DeviceChoice::kCuda, 512), 13, 6);
  expect_same(dev, host, std::string("hf/") + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Hf, HfParity,
                         ::testing::Values("llama", "llama3-rope", "mistral", "qwen2", "qwen3", "gemma2",
                                           "gemma3", "phi3", "qwen3_moe", "mixtral", "gpt_oss", "qwen3_next",
                                           "qwen3_5"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// A decode step as one graph replay (DeviceBackend::run_token) computes exactly what the
// same step does layer by layer: the same kernels with the same parameters, the position
// read from device memory. Bit-identical logits, over enough steps to pass a power of two
// of the length (a new graph key: 512 -> 1024) and a mirror capacity doubling.
TEST(DeviceTokenGraph, ReplayEqualsLayerByLayerBitForBit) {
  FRINK_REQUIRE_GPU();
  for (const char* rel : {"llamacpp/archs/qwen3-dense.gguf", "llamacpp/quant/llama-dense-Q4_K_M.gguf"}) {
    FRINK_REQUIRE_GPU_DATA(rel);
    const auto m = load_model((gpu_testdata() / rel).string());
    DecoderOptions layered = opts(DeviceChoice::kCuda, 512);
    layered.hooks.no_token_graph = true;
    const ModelRun a = run_model(*m, opts(DeviceChoice::kCuda, 512), 500, 30);
    const ModelRun b = run_model(*m, layered, 500, 30);
    EXPECT_EQ(a.whole_token_steps, 30) << rel << ": every decode step should be one graph replay";
    EXPECT_EQ(b.whole_token_steps, 0) << rel;
    EXPECT_EQ(a.decode, b.decode) << rel;
    EXPECT_EQ(a.greedy, b.greedy) << rel;
    // eval_next with a greedy sampler (the argmax taken on the device, the logits left there)
    // gives the same tokens; alternating it with logits steps on one Decoder also proves the
    // two kinds of graph (with and without the pick) are told apart. The prompt is evaluated
    // as run_model does (all logits), so the first token comes from the same head.
    Sampler greedy_sampler(SamplerParams{.temp = 0.0f}, static_cast<int>(m->hp.n_vocab));
    Decoder dec(*m, opts(DeviceChoice::kCuda, 512));
    Session s(*m, 0);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 500; ++i) prompt.push_back(static_cast<int32_t>((1 + 7 * i * i + 3 * i) % m->hp.n_vocab));
    std::vector<float> logits;
    dec.eval(s, prompt, true, logits);
    std::vector<int32_t> greedy{greedy_token(logits.data() + 499 * m->hp.n_vocab, m->hp.n_vocab)};
    for (int i = 0; i < 30; ++i) {
      if (i % 2 == 0) {
        greedy.push_back(dec.eval_next(s, greedy.back(), greedy_sampler));
      } else {
        dec.eval(s, {greedy.back()}, false, logits);
        greedy.push_back(greedy_token(logits.data(), m->hp.n_vocab));
      }
    }
    EXPECT_EQ(greedy, a.greedy) << rel;
    EXPECT_EQ(dec.whole_token_steps(), 30) << rel;
  }
}

// A sampled run: the prompt, its first token sampled from the prompt's logits, then n tokens by
// eval_next, on the device where graphs, else layer by layer with every logit on the host.
struct SampledRun {
  std::vector<int32_t> tokens;
  int64_t graph_steps, ahead, exact;
};
SampledRun run_sampled(const Model& m, bool graphs, const SamplerParams& params, const std::vector<int32_t>& prompt,
                       int n) {
  DecoderOptions o = opts(DeviceChoice::kCuda, 512);
  o.hooks.no_token_graph = !graphs;
  Decoder dec(m, o);
  Session s(m, 0);
  Sampler sampler(params, static_cast<int>(m.hp.n_vocab));
  for (int32_t t : prompt) sampler.accept(t);
  std::vector<float> logits;
  dec.eval(s, prompt, false, logits);
  std::vector<int32_t> out{sampler.sample(logits.data())};
  for (int i = 0; i < n; ++i) {
    sampler.accept(out.back());
    out.push_back(dec.eval_next(s, out.back(), sampler));
  }
  return {out, dec.whole_token_steps(), dec.steps_run_ahead(), dec.exact_draws()};
}

// Sampling with the next token picked on the device (penalties, top-k, top-p, min-p,
// temperature and the draw there) gives exactly the tokens of the same sampler fed the full
// logits layer by layer: same seed, same draws. The steps also run one ahead, each drawn with
// the sampler's next uniform, its penalties over a window of 16 (so tokens leave it) with the
// token before it entering.
TEST(DeviceTokenGraph, DevicePickSamplesAsTheHostSampler) {
  FRINK_REQUIRE_GPU();
  const char* rel = "llamacpp/quant/llama-dense-Q4_K_M.gguf";
  FRINK_REQUIRE_GPU_DATA(rel);
  const auto m = load_model((gpu_testdata() / rel).string());
  SamplerParams sp;
  sp.temp = 0.9f;
  sp.top_k = 40;
  sp.top_p = 0.95f;
  sp.min_p = 0.02f;
  sp.repeat_penalty = 1.3f;
  sp.frequency_penalty = 0.2f;
  sp.presence_penalty = 0.1f;
  sp.penalty_last_n = 16;
  sp.seed = 7;
  const std::vector<int32_t> prompt = {1, 15, 27, 3, 99, 42, 7};
  const auto run = [&](bool graphs, const SamplerParams& p) { return run_sampled(*m, graphs, p, prompt, 40); };
  const SampledRun picked = run(true, sp), host = run(false, sp);
  EXPECT_EQ(picked.graph_steps, 40);
  EXPECT_GT(picked.ahead, 30);
  EXPECT_EQ(host.graph_steps, 0);
  EXPECT_EQ(picked.tokens, host.tokens);
  SamplerParams plain = sp;  // no penalties: steps run ahead
  plain.repeat_penalty = 1.0f;
  plain.frequency_penalty = plain.presence_penalty = 0.0f;
  const SampledRun ahead = run(true, plain);
  EXPECT_EQ(ahead.tokens, run(false, plain).tokens);
  EXPECT_GT(ahead.ahead, 30);
  std::set<int32_t> distinct(ahead.tokens.begin(), ahead.tokens.end());
  EXPECT_GT(distinct.size(), 5u);  // drawn, not a greedy loop
  SamplerParams greedy = sp;  // greedy with penalties: penalties and the argmax on the device
  greedy.temp = 0.0f;
  EXPECT_EQ(run(true, greedy).tokens, run(false, greedy).tokens);
}

// Top-k off: the draw over every logit on stories260K (a trained model, 512 tokens: the
// fixtures' 128 are fewer than the device's 256 candidates), tokens exactly the host sampler's
// on full logits. Min-p's few survivors and the plain draw (by chunk sums) decide on the device
// and run ahead; top-p just below 1 cuts past the device's 256 best, so those draws sort the
// vocabulary on the device (launch_exact_draw).
TEST(DeviceTokenGraph, WholeVocabularyPickSamplesAsTheHostSampler) {
  FRINK_REQUIRE_GPU();
  const char* rel = "models/stories260K.gguf";
  FRINK_REQUIRE_GPU_DATA(rel);
  const auto m = load_model((gpu_testdata() / rel).string());
  const std::vector<int32_t> prompt = {1, 403, 261, 303, 411, 264};
  const auto run = [&](bool graphs, const SamplerParams& p) { return run_sampled(*m, graphs, p, prompt, 60); };
  const SamplerParams min_p_only{.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.05f, .seed = 9};
  SamplerParams every = min_p_only;
  every.min_p = 0.0f;
  SamplerParams top_p_only = every;  // with penalties, on the device too
  top_p_only.top_p = std::nextafter(1.0f, 0.0f);  // this peaked model's mass reaches 0.9999 within 256
  top_p_only.repeat_penalty = 1.2f;
  top_p_only.presence_penalty = 0.3f;
  int64_t exact = 0;
  for (const SamplerParams& p : {min_p_only, every, top_p_only}) {
    const SampledRun dev = run(true, p), ref = run(false, p);
    const std::string what = "top_p " + std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p);
    EXPECT_EQ(dev.tokens, ref.tokens) << what;
    EXPECT_EQ(dev.graph_steps, 60) << what;
    EXPECT_EQ(ref.graph_steps, 0) << what;
    if (p.repeat_penalty == 1.0f) {
      EXPECT_GT(dev.ahead, 45) << what;
    }
    std::set<int32_t> spread(dev.tokens.begin(), dev.tokens.end());
    EXPECT_GT(spread.size(), 10u) << what;  // drawn, not a greedy loop
    exact += dev.exact;
    std::printf("whole-vocabulary draw, %s: %lld of 60 steps ahead, %lld by sorting the vocabulary\n",
                what.c_str(), static_cast<long long>(dev.ahead), static_cast<long long>(dev.exact));
  }
  EXPECT_GT(exact, 0);
}

// Two sequences taking turns on one Decoder (a server's slots), each with its own mirrors and
// so its own graph key, in the same power-of-two bucket: each step must read its own
// sequence's mirrors and position, bit for bit what the layer-by-layer path gives.
TEST(DeviceTokenGraph, SequencesTakingTurnsKeepTheirOwnState) {
  FRINK_REQUIRE_GPU();
  const char* rel = "llamacpp/archs/qwen3-dense.gguf";
  FRINK_REQUIRE_GPU_DATA(rel);
  const auto m = load_model((gpu_testdata() / rel).string());
  const auto run = [&](bool graphs) {
    DecoderOptions o = opts(DeviceChoice::kCuda, 512);
    o.hooks.no_token_graph = !graphs;
    Decoder dec(*m, o);
    Session a(*m, 0), b(*m, 0);
    std::vector<float> la, lb, all;
    dec.eval(a, {1, 2, 3, 4, 5, 6, 7}, false, la);
    dec.eval(b, {9, 8, 7}, false, lb);
    for (int i = 0; i < 12; ++i) {  // different lengths, different histories
      dec.eval(a, {greedy_token(la.data(), m->hp.n_vocab)}, false, la);
      all.insert(all.end(), la.begin(), la.end());
      dec.eval(b, {greedy_token(lb.data(), m->hp.n_vocab)}, false, lb);
      all.insert(all.end(), lb.begin(), lb.end());
    }
    return std::make_pair(all, dec.whole_token_steps());
  };
  const auto [with_graphs, n_graph_steps] = run(true);
  const auto [layered, n_layered_steps] = run(false);
  EXPECT_EQ(n_graph_steps, 24);
  EXPECT_EQ(n_layered_steps, 0);
  EXPECT_EQ(with_graphs, layered);
}

// Greedy decode steps enqueued one ahead (DeviceBackend::run_token: the next step's token
// embedded on the device from the pick, before the caller asks for it) give bit for bit what
// steps started only when asked give, through step_ahead_script.h's script: a 500-token
// prompt and 30 greedy steps past a new graph key (512 -> 1024 keys), a truncate, a restore
// of a copy with the same rows, and the rest. gemma2: the embedding's scale.
TEST(DeviceTokenGraph, StepsRunAheadEqualStepsRunWhenAsked) {
  FRINK_REQUIRE_GPU();
  for (const char* rel : {"llamacpp/quant/llama-dense-Q4_K_M.gguf", "llamacpp/quant/llama-dense-Q4_0.gguf",
                          "llamacpp/archs/qwen3-dense.gguf", "llamacpp/archs/gemma2-dense.gguf"}) {
    FRINK_REQUIRE_GPU_DATA(rel);
    const auto m = load_model((gpu_testdata() / rel).string());
    // Each parity's graph for a new key is captured by a step run when asked first, and a
    // step that drops one ahead runs when asked: 30 + 3 + 4 + 3 + 3 + 4 + 5 greedy steps on
    // a, minus those, leave more than 30 to run ahead.
    expect_steps_ahead_equal_asked(*m, opts(DeviceChoice::kCuda, 512), {.prompt = 500, .first = 30, .last = 5}, rel, 30);
  }
  // Sampled steps: each step ahead drawn with the sampler's next uniform, the same draws either way.
  const char* rel = "llamacpp/quant/llama-dense-Q4_K_M.gguf";
  const auto m = load_model((gpu_testdata() / rel).string());
  const SamplerParams sampled{.temp = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.02f, .seed = 5};
  expect_steps_ahead_equal_asked(*m, opts(DeviceChoice::kCuda, 512),
                                 {.prompt = 500, .first = 30, .last = 5, .sampling = sampled},
                                 std::string(rel) + " sampled", 30);
  // Penalties: a step ahead takes the window with its token entering; a window of 8 fills and
  // drops its oldest within the script's first steps.
  SamplerParams penalised = sampled;
  penalised.repeat_penalty = 1.3f;
  penalised.frequency_penalty = 0.2f;
  penalised.penalty_last_n = 8;
  expect_steps_ahead_equal_asked(*m, opts(DeviceChoice::kCuda, 512),
                                 {.prompt = 500, .first = 30, .last = 5, .sampling = penalised},
                                 std::string(rel) + " sampled with penalties", 30);
  // Top-k off with nothing cutting: the draw over every logit, which the device always decides
  // (stories260K: more tokens than the device's 256 candidates).
  const char* stories = "models/stories260K.gguf";
  FRINK_REQUIRE_GPU_DATA(stories);
  const SamplerParams every{.temp = 0.9f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 5};
  expect_steps_ahead_equal_asked(*load_model((gpu_testdata() / stories).string()), opts(DeviceChoice::kCuda, 512),
                                 {.prompt = 500, .first = 30, .last = 5, .sampling = every},
                                 std::string(stories) + " sampled over every logit", 30);
}

// Forced refusal of any single layer (and of the head) gives the same result via the host.
TEST(DeviceRefusal, AnySingleForcedLayerMatchesHost) {
  FRINK_REQUIRE_GPU();
  for (const char* rel : {"llamacpp/archs/qwen3-dense.gguf", "llamacpp/quant/llama-dense-Q4_K_M.gguf"}) {
    if (!std::filesystem::exists(gpu_testdata() / rel)) continue;
    const auto m = load_model((gpu_testdata() / rel).string());
    const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), 11, 4);
    for (int64_t il = 0; il <= m->hp.n_layer; ++il) {
      DecoderOptions o = opts(DeviceChoice::kCuda, 512);
      o.hooks.refuse_layer = il;
      const ModelRun dev = run_model(*m, o, 11, 4);
      EXPECT_GT(dev.refusals[Refusal::kForcedByTest], 0u);
      expect_same(dev, host, std::string(rel) + " refuse " + std::to_string(il));
    }
  }
}

// A random-weight file of a synth preset's shapes (frink synth) in the temp directory, loaded;
// the file goes with it.
struct SynthFile {
  std::filesystem::path path;
  std::unique_ptr<Model> m;
  SynthFile(const std::string& preset, const std::string& type, int64_t n_layer, const char* name)
      : path(std::filesystem::temp_directory_path() / name) {
    SynthOptions so;
    so.preset = preset;
    so.type = type;
    so.n_layer = n_layer;
    write_synth(plan_synth(so), path.string(), 0);
    m = load_model(path.string());
  }
  ~SynthFile() { std::filesystem::remove(path); }
  SynthFile(const SynthFile&) = delete;
  SynthFile& operator=(const SynthFile&) = delete;
};

// The residual stream's norms folded into the products around them (cuda NormFold: one-token
// decode, Q8_0 rows on the register kernel; the fixtures' rows are too narrow or of other
// types): a two-layer llama3.2-1b-shaped Q8_0 file, where every decode layer's q/k/v (RoPE in
// the store) and gate/up read a fold, against the host; and with either layer refused, so a
// fold's producer or consumer runs on the host (the other then takes its norm launch).
// Bound 1e-3, not 1e-4: random weights amplify any rounding. The device path without folds
// measured 2.7e-4 / 3.6e-4 against the host on 8-layer llama3.1-8b Q4_0 / Q8_0 synth files, as
// with them (greedy tokens the same either way); this file 9.8e-5 (H200). A wrong or missing
// 1/rms, or a block's quants in the wrong place, changes the logits wholesale (and the tokens).
TEST(DeviceNormFold, FoldedDecodeMatchesHost) {
  FRINK_REQUIRE_GPU();
  const SynthFile f("llama3.2-1b", "Q8_0", 2, "frink_fold_llama1b_q8_0.gguf");
  Model* m = f.m.get();
  const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), 7, 6);
  for (int64_t il = -1; il < m->hp.n_layer; ++il) {
    DecoderOptions o = opts(DeviceChoice::kCuda, 512);
    o.hooks.refuse_layer = il;
    const ModelRun dev = run_model(*m, o, 7, 6);
    expect_same(dev, host, "llama1b-q8_0 refuse " + std::to_string(il), 1e-3);
  }
}

// A random-weight synth file's device run against the host's, its decode steps fed the host's
// tokens (run_model's feed): such files' logits hold near ties that rounding flips, and a flip
// would make every later step differ wholesale. NMSE under `bound`, and the host's clear
// choices (greedy[i + 1] where its top two logits at step i are more than 0.05 apart) made the
// same; all_device: no layer refused. Returns the clear steps compared.
int expect_fed_run_matches(const Model& m, const ModelRun& host, const DecoderOptions& o, int n_prompt, double bound,
                           const std::string& what, bool all_device) {
  const int64_t V = m.hp.n_vocab;
  const int n_steps = static_cast<int>(host.decode.size() / static_cast<size_t>(V));
  const ModelRun dev = run_model(m, o, n_prompt, n_steps, &host.greedy);
  const double e_pre = nmse(dev.prefill.data(), host.prefill.data(), host.prefill.size());
  const double e_dec = nmse(dev.decode.data(), host.decode.data(), host.decode.size());
  std::printf("[gpu] %-34s prefill nmse %.3g  decode nmse %.3g  refusals: %s\n", what.c_str(), e_pre, e_dec,
              dev.refusals.summary().c_str());
  EXPECT_LT(e_pre, bound) << what;
  EXPECT_LT(e_dec, bound) << what;
  if (all_device) {
    EXPECT_EQ(dev.refusals.refused(), 0u) << what << ": " << dev.refusals.summary();
  }
  int n_clear = 0;
  for (int step = 0; step < n_steps; ++step) {
    std::vector<float> l(host.decode.begin() + step * V, host.decode.begin() + (step + 1) * V);
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
    if (l[0] - l[1] <= 0.05f) continue;
    ++n_clear;
    const size_t i = static_cast<size_t>(step) + 1;
    EXPECT_EQ(dev.greedy[i], host.greedy[i]) << what << " step " << step;
  }
  return n_clear;
}

// m's host run, then device runs of the prompt in batches of 512 and of 5, every layer on the
// device (expect_fed_run_matches each, 6 decode steps), with some clear steps compared.
void expect_batches_match_host(const Model& m, int n_prompt, double bound, const std::string& what) {
  const ModelRun host = run_model(m, opts(DeviceChoice::kCpu, 512), n_prompt, 6);
  int n_clear = 0;
  for (int64_t nb : {512, 5})
    n_clear += expect_fed_run_matches(m, host, opts(DeviceChoice::kCuda, nb), n_prompt, bound,
                                      what + " b" + std::to_string(nb), true);
  EXPECT_GT(n_clear, 0) << what;
}

// gpt-oss-20b's first layer as released (MXFP4 experts with biases, 32 of them with 4 used, the
// clamped SwiGLU, a 128-token window with sinks; the other matrices Q8_0): 150 prompt tokens
// in a batch of 512 (600 slots: its experts grouped, each expert's bias added after its product)
// and in batches of 5 (slot products), then decode steps, against the host. MXFP4's code book
// is read in registers (dequant.cuh book16); an entry or a bias wrong is O(1). Bound 3e-3, as
// DeviceMla's: random weights at a released width amplify rounding. Measured (H200): prompt
// 1.3e-3 grouped (cuBLAS on the rounded activations' f16 copy), 7e-5 slot by slot; decode 1e-4
// to 1.6e-4. The llama.cpp gpt-oss fixture's biases, grouped, agree with the host at 3e-14.
TEST(DeviceParityMoe, GptOssShapesMatchHost) {
  FRINK_REQUIRE_GPU();
  const SynthFile f("gpt-oss-20b", "MXFP4", 1, "frink_gpt_oss_mxfp4.gguf");
  Model* m = f.m.get();
  expect_batches_match_host(*m, 150, 3e-3, "gpt-oss-20b mxfp4");
}

// gemma3-12b's first two layers (16 heads of 256 over 8 KV heads, QK-norm, a 1024-key window
// on layer 0, the global layer 1; the other head dim 256 models, gemma2 and qwen3-next's
// attention, use the same kernel): 150 prompt tokens in a batch of 512 take the tensor-core
// prefill with Q read from shared memory and half-tile key steps; batches of 5 take split-K.
// Then decode steps fed the host's tokens. A wrong Q fragment, a step reading the wrong half of
// a tile or its flag is O(1); f16 inputs are ~1.5e-7 an attention (CudaAttention, hd 256).
// Bound 1e-3, as the other released widths' (random weights there amplify rounding): measured
// (H200) prefill 1.8e-4 on tensor cores and 1.2e-4 split-K, decode 1.6e-4 / 1.25e-4, so the
// excess over 1e-4 is the model's, not this kernel's.
TEST(DeviceParity, Gemma3ShapesMatchHost) {
  FRINK_REQUIRE_GPU();
  const SynthFile f("gemma3-12b", "Q8_0", 2, "frink_gemma3_q8_0.gguf");
  Model* m = f.m.get();
#ifdef FRINK_HAVE_CUDA
  ASSERT_TRUE(cuda::attn_uses_tensor_cores(150, m->hp.layers[0].head_dim_k, m->hp.layers[0].head_dim_v));
#endif
  expect_batches_match_host(*m, 150, 1e-3, "gemma3-12b q8_0");
}

// DeepSeek-2's latent attention on the device (cuda_backend_mla.cpp) at a released model's
// widths: a two-layer deepseek-v2-lite Q8_0 file (16 heads, the 576-wide cache row, no q LoRA;
// layer 0 dense, layer 1 with 64 experts and shared ones) against the host, prompts of 150
// tokens in batches of 512 (the prompt kernel) and of 5 (decode-sized batches on split keys,
// three 64-key splits by the end), then greedy steps in token graphs; and with either layer
// refused. llama.cpp's deepseek2 file (one head, a q LoRA, F32) is in DeviceParity, at 1e-14.
// The decode steps take the host's tokens (run_model's feed): this file's 102400 random logits
// hold near ties (top two within 0.05) that rounding flips, and a flip would make every later
// step differ wholesale. Bound 3e-3: with layer 0 on the device the logits move by 1e-3 (H200),
// its rounding flipping near-tied experts of layer 1's random router; layer 1 alone there,
// fed the host's layer 0, 1.3e-4. A wrong head's matrix or a stale row is O(1). The experts
// route as the full DeepSeek-V2 does, limited to the best 3 of 8 groups (the plan set on the
// loaded model: host and device read the same plan), so the device's group masking is held to
// the host's too.
TEST(DeviceMla, LiteShapesMatchHost) {
  FRINK_REQUIRE_GPU();
  // deepseek-v2-lite's two layers; then deepseek-v3's first (a dense one: 128 heads, the q LoRA
  // of 1536, 7168 wide), where the per-head tables, the 16 head blocks of the softmax and the
  // q LoRA's norm run at the largest released widths.
  struct Case {
    const char* preset;
    int64_t layers;
    int n_prompt;
  };
  for (const Case c : {Case{"deepseek-v2-lite", 2, 150}, Case{"deepseek-v3", 1, 70}}) {
    const SynthFile f(c.preset, "Q8_0", c.layers, "frink_mla_q8_0.gguf");
    Model* m = f.m.get();
    for (LayerPlan& p : m->hp.layers)
      if (p.ffn == FfnKind::kMoe) p.moe.n_group = 8, p.moe.n_group_used = 3;
    const int kSteps = 6;
    const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), c.n_prompt, kSteps);
    int n_clear = 0;
    for (int64_t il = -1; il < m->hp.n_layer; ++il)
      for (int64_t nb : {512, 5}) {
        if (il >= 0 && nb == 5) continue;
        DecoderOptions o = opts(DeviceChoice::kCuda, nb);
        o.hooks.refuse_layer = il;
        const std::string what =
            std::string(c.preset) + " q8_0 b" + std::to_string(nb) + " refuse " + std::to_string(il);
        n_clear += expect_fed_run_matches(*m, host, o, c.n_prompt, 3e-3, what, il < 0);
      }
    EXPECT_GT(n_clear, 0) << c.preset;  // not vacuous
  }
}

// A shared expert wider than a routed one, stacked as several (cuda/device_weights.cpp
// shared_expert_slots: its gate and up split by rows, its down by columns at upload):
// DeepSeek-V2-Lite's 2 x 1408, weight 1 each; Qwen1.5-MoE's 4 x 1408 under its sigmoid gate
// (the router's extra row, on every slot). It computes what its own launches compute, the
// slots' down products summed by the combine against one product. The two differ by the order
// of sums, which can move a GLU value across a rounding step of the down's 8-bit input (a step
// is 1/127 of its block's largest): measured (H200) prompt NMSE up to 9e-6 grouped by expert
// (cuBLAS tiles the shared rows as an expert's, not as a matrix of their own), 2e-8 in batches
// of 5, decode 0 to 6e-8. A column range cut wrong, a slot's expert or its gate weight wrong,
// moves the shared expert's whole output. Q4_0 (the narrow kernels, the combine in the down's
// launch) and Q8_0; prompt batches grouped by expert (150 tokens: 18 rows an expert) and of 5,
// then decode steps fed the same tokens.
TEST(DeviceParityMoe, WideSharedExpertInSlotsEqualsSeparate) {
  FRINK_REQUIRE_GPU();
  struct Case {
    const char* preset;
    int64_t layers, slots;
  };
  for (const Case c : {Case{"deepseek-v2-lite", 2, 2}, Case{"qwen1.5-moe-a2.7b", 1, 4}})
    for (const char* type : {"Q4_0", "Q8_0"}) {
      const SynthFile f(c.preset, type, c.layers, "frink_wide_shared.gguf");
      Model* m = f.m.get();
      const MoePlan& mp = m->hp.layers[static_cast<size_t>(c.layers - 1)].moe;
      ASSERT_EQ(mp.n_ff_shexp, c.slots * mp.n_ff_exp);
      for (int64_t nb : {512, 5}) {
        DecoderOptions separate = opts(DeviceChoice::kCuda, nb);
        separate.hooks.separate_shared_expert = true;
        const ModelRun b = run_model(*m, separate, 150, 6);
        const ModelRun a = run_model(*m, opts(DeviceChoice::kCuda, nb), 150, 6, &b.greedy);
        const std::string what = std::string(c.preset) + " " + type + " b" + std::to_string(nb);
        EXPECT_NE(a.device.find("shared experts stacked"), std::string::npos) << a.device;
        EXPECT_EQ(b.device.find("shared experts stacked"), std::string::npos) << b.device;
        EXPECT_EQ(a.refusals.refused(), 0u) << a.refusals.summary();
        const double e_pre = nmse(a.prefill.data(), b.prefill.data(), b.prefill.size());
        const double e_dec = nmse(a.decode.data(), b.decode.data(), b.decode.size());
        std::printf("[gpu] %-30s in slots against separate: prefill nmse %.3g  decode nmse %.3g\n", what.c_str(),
                    e_pre, e_dec);
        EXPECT_LT(e_pre, 1e-4) << what;
        EXPECT_LT(e_dec, 1e-4) << what;
      }
      }
}

#ifdef FRINK_HAVE_CUDA
// Layers that device memory cannot hold, or that --gpu-layers leaves out, run on the host
// (counted as "memory"), the rest on the device: the host path's logits and greedy tokens.
// -ngl 1 (the last layer alone) and -ngl n_layer (the head on the host) on llama-dense Q4_K_M;
// on stories260K (5 layers) a budget of memory (DeviceHooks::weight_budget_bytes) that holds
// what lending takes (every mirror, two slots of a layer), the head and the last layer.
TEST(DevicePlacement, LayersLeftOnTheHostMatchHost) {
  FRINK_REQUIRE_GPU();
  struct Case {
    std::string what;
    DecoderOptions o;
    uint64_t on_device;  // evaluations on the device: (layers + head there) x 9 batches
  };
  for (const char* rel : {"llamacpp/quant/llama-dense-Q4_K_M.gguf", "models/stories260K.gguf"}) {
    FRINK_REQUIRE_GPU_DATA(rel);
    const auto m = load_model((gpu_testdata() / rel).string());
    const int64_t n = m->hp.n_layer;
    ASSERT_GE(n, 2);
    const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), 19, 8);
    std::vector<Case> cases;
    DecoderOptions ngl1 = opts(DeviceChoice::kCuda, 512), ngl_n = ngl1;
    ngl1.n_gpu_layers = 1;
    ngl_n.n_gpu_layers = n;
    if (n == 2) {
      cases = {Case{"-ngl 1", ngl1, 9}, Case{"-ngl n_layer", ngl_n, static_cast<uint64_t>(9 * n)}};
    } else {
      const std::vector<size_t> bytes = cuda::DeviceWeights::upload_bytes(*m);
      DecoderOptions fits = opts(DeviceChoice::kCuda, 512);
      fits.n_ctx = 64;
      size_t budget = bytes.back() + bytes[static_cast<size_t>(n - 1)] +
                      2 * *std::max_element(bytes.begin(), bytes.end() - 1);
      for (const LayerPlan& p : m->hp.layers)
        budget += static_cast<size_t>(fits.n_ctx * (p.cache_k_width() + p.cache_v_width())) * sizeof(float);
      fits.hooks.weight_budget_bytes = static_cast<int64_t>(budget);
      cases = {Case{"memory for the lending, the head and a layer", fits, 18}};
    }
    for (const Case& c : cases) {
      const ModelRun dev = run_model(*m, c.o, 19, 8);
      expect_same(dev, host, std::string(rel) + " " + c.what);
      EXPECT_EQ(dev.refusals[Refusal::kNone], c.on_device) << c.what;
      EXPECT_EQ(dev.refusals[Refusal::kMemory], static_cast<uint64_t>(9 * (n + 1)) - c.on_device) << c.what;
    }
  }
}

// Prompt batches of 32 tokens or more run the layers left on the host on the device too,
// copied into a slot layer by layer (CudaBackend's lent layers; K-quant weights reordered after
// each copy): with -ngl 1 every layer of a 40-token batch runs there, decode steps keep all
// but the last on the host, and the next prompt batch finds the lent layers' mirrors stale
// (the host appended their decode rows). The host path's logits throughout, and the counts.
TEST(DevicePlacement, PromptBatchesLendTheHostLayersTheDevice) {
  FRINK_REQUIRE_GPU();
  for (const char* rel : {"llamacpp/quant/llama-dense-Q4_K_M.gguf", "llamacpp/archs/gemma2-dense.gguf"}) {
    FRINK_REQUIRE_GPU_DATA(rel);
    const auto m = load_model((gpu_testdata() / rel).string());
    const int64_t n = m->hp.n_layer, V = m->hp.n_vocab;
    struct Run {
      std::vector<float> logits;
      RefusalCounts refusals;
    };
    const auto run = [&](DeviceChoice d) {
      DecoderOptions o = opts(d, 512);
      o.n_gpu_layers = 1;
      Decoder dec(*m, o);
      Session s(*m, 0);
      Run r;
      std::vector<float> logits;
      const auto prompt = [&](int salt) {
        std::vector<int32_t> t;
        for (int i = 0; i < 40; ++i) t.push_back(static_cast<int32_t>((salt + 5 * i * i + i) % V));
        dec.eval(s, t, true, logits);
        r.logits.insert(r.logits.end(), logits.begin(), logits.end());
      };
      prompt(1);
      for (int i = 0; i < 3; ++i) {
        dec.eval(s, {greedy_token(logits.data() + logits.size() - V, V)}, false, logits);
        r.logits.insert(r.logits.end(), logits.begin(), logits.end());
      }
      prompt(2);
      r.refusals = dec.refusals();
      return r;
    };
    const Run host = run(DeviceChoice::kCpu), dev = run(DeviceChoice::kCuda);
    ASSERT_EQ(dev.logits.size(), host.logits.size());
    const double e = nmse(dev.logits.data(), host.logits.data(), host.logits.size());
    std::printf("[gpu] %s -ngl 1, lent to 40-token batches: nmse %.3g, refusals: %s\n", rel, e,
                dev.refusals.summary().c_str());
    EXPECT_LT(e, 1e-4) << rel;
    // Two prompt batches: every layer on the device, the head on the host; three decode steps:
    // the last layer on the device.
    EXPECT_EQ(dev.refusals[Refusal::kNone], static_cast<uint64_t>(2 * n + 3)) << rel;
    EXPECT_EQ(dev.refusals[Refusal::kMemory], static_cast<uint64_t>(2 + 3 * n)) << rel;
  }
}

// A lent MoE layer whose shared expert is two routed ones wide (deepseek-v2-lite, 2 layers,
// -ngl 0: both layers lent to the prompt batch, decode on the host) fills its slot with the
// shared down cut by columns on the host (a temporary part of the fill: DeviceWeights::
// upload_joined) and runs it as two slots: against the same layers lent with the shared expert
// separate. A slot filled from a freed buffer, or cut wrong, moves the shared expert's output
// (the bound is WideSharedExpertInSlotsEqualsSeparate's: the order of sums across rounding steps).
TEST(DevicePlacement, LentWideSharedExpertEqualsSeparate) {
  FRINK_REQUIRE_GPU();
  const SynthFile f("deepseek-v2-lite", "Q4_0", 2, "frink_dsv2_lent.gguf");
  Model* m = f.m.get();
  DecoderOptions lent = opts(DeviceChoice::kCuda, 512), separate = lent;
  lent.n_gpu_layers = separate.n_gpu_layers = 0;
  separate.hooks.separate_shared_expert = true;
  const ModelRun b = run_model(*m, separate, 150, 3);
  const ModelRun a = run_model(*m, lent, 150, 3, &b.greedy);
  const double e_pre = nmse(a.prefill.data(), b.prefill.data(), b.prefill.size());
  const double e_dec = nmse(a.decode.data(), b.decode.data(), b.decode.size());
  std::printf("[gpu] dsv2-lite -ngl 0, lent, in slots against separate: prefill nmse %.3g  decode nmse %.3g, %s\n",
              e_pre, e_dec, a.refusals.summary().c_str());
  EXPECT_EQ(a.refusals[Refusal::kNone], 2u) << a.refusals.summary();  // the prompt batch's two layers
  EXPECT_LT(e_pre, 1e-4);
  EXPECT_GT(e_pre, 0.0);  // the slots ran (their sums in another order; resident: 3.4e-6, H200)
  EXPECT_EQ(e_dec, 0.0);  // decode steps on the host alike
}
#endif

// Mixtures of experts whose prompt batches give every expert 16+ rows on average (cuda/moe.cuh
// kMoeGroupMinRows) run them as one product per expert's rows (sorted by expert on the device,
// cuBLAS, back to slot order, gpt-oss's expert biases added by launch_slot_bias); batches of 5
// keep the slot products. Both against the host.
TEST(DeviceParityMoe, PromptBatchesGroupedByExpertMatchHost) {
  FRINK_REQUIRE_GPU();
  for (const char* rel : {"llamacpp/archs/qwen3moe-moe.gguf", "llamacpp/archs/gpt-oss-moe.gguf"}) {
    if (gpu_testdata().empty() || !std::filesystem::exists(gpu_testdata() / rel)) {
      std::printf("[gpu] %s absent: skipped\n", rel);
      continue;
    }
    const auto m = load_model((gpu_testdata() / rel).string());
    const int n_prompt = 64;
    for (const LayerPlan& p : m->hp.layers) {  // the 512-token batch takes the grouped path
      if (p.ffn == FfnKind::kMoe) {
        ASSERT_GE(n_prompt * p.moe.n_expert_used, 16 * p.moe.n_expert);
      }
    }
    const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), n_prompt, 8);
    for (int64_t nb : {512, 5}) {
      const ModelRun dev = run_model(*m, opts(DeviceChoice::kCuda, nb), n_prompt, 8);
      expect_same(dev, host, std::string(rel) + " p64 b" + std::to_string(nb));
    }
  }
}

// A shared expert stacked with the routed experts at upload (one more expert: slot k of every
// token, its gate the router's extra row, cuda/device_weights.cpp stacks_shared_expert)
// computes what its own four launches compute: prompt batches grouped by expert (64 tokens,
// where the experts have no scales) and slot by slot (batches of 5), then decode steps. A
// wrong slot, weight, scale or gate row is O(1); the two differ at most by the order of a sum
// (the gate's product alone or as a router row). llama.cpp's fixtures fuse gate_up and scale
// their down experts; the transformers one does neither. (Their shared gate and up carry
// different scales, which one expert's scale cannot hold: the test gives up the gate's, host
// and device alike, so that the fused stack is exercised too.)
TEST(DeviceParityMoe, SharedExpertStackedEqualsSeparate) {
  FRINK_REQUIRE_GPU();
  std::vector<std::filesystem::path> models;
  if (const auto hf = hf_fixture("qwen3_next"); std::filesystem::exists(hf / "config.json")) models.push_back(hf);
  for (const char* rel : {"llamacpp/archs/qwen3next-moe.gguf", "llamacpp/archs/qwen35moe-moe.gguf"})
    if (!gpu_testdata().empty() && std::filesystem::exists(gpu_testdata() / rel)) models.push_back(gpu_testdata() / rel);
  if (models.empty()) GTEST_SKIP() << "no fixture with a shared expert present";
  for (const auto& path : models) {
    const std::string name = path.filename().string();
    SCOPED_TRACE(name);
    const auto m = load_model(path.string());
    for (LayerWeights& w : m->w.layers) w.ffn_up_shexp.scale = w.ffn_gate_shexp.scale;
    const ModelRun host = run_model(*m, opts(DeviceChoice::kCpu, 512), 64, 8);
    for (int64_t nb : {512, 5}) {
      DecoderOptions separate = opts(DeviceChoice::kCuda, nb);
      separate.hooks.separate_shared_expert = true;
      const ModelRun a = run_model(*m, opts(DeviceChoice::kCuda, nb), 64, 8), b = run_model(*m, separate, 64, 8);
      EXPECT_NE(a.device.find("shared experts stacked"), std::string::npos) << a.device;
      EXPECT_EQ(b.device.find("shared experts stacked"), std::string::npos) << b.device;
      const double e_pre = nmse(a.prefill.data(), b.prefill.data(), b.prefill.size());
      const double e_dec = nmse(a.decode.data(), b.decode.data(), b.decode.size());
      std::printf("[gpu] %s b%lld stacked against separate: prefill nmse %.3g (%s)  decode nmse %.3g (%s)\n",
                  name.c_str(), static_cast<long long>(nb), e_pre, a.prefill == b.prefill ? "same bits" : "differs",
                  e_dec, a.decode == b.decode ? "same bits" : "differs");
      EXPECT_LT(e_pre, 1e-10);
      EXPECT_LT(e_dec, 1e-10);
      EXPECT_EQ(a.greedy, b.greedy);
      expect_same(a, host, name + " stacked b" + std::to_string(nb));
      expect_same(b, host, name + " separate b" + std::to_string(nb));
    }
  }
}

}  // namespace
}  // namespace frink::test
