#include "engine/logits_harness.h"

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "engine/decoder.h"
#include "engine/sampler.h"
#include "support/test_support.h"

namespace frink::test {

LogitsRun run_logits(const std::string& model_path, const std::vector<int32_t>& prompt, int n_steps,
                     int64_t n_batch) {
  auto model = load_model(model_path);
  DecoderOptions opts;
  opts.n_batch = n_batch;
  Decoder dec(*model, opts);
  Session s(*model, 0);
  LogitsRun r;
  r.n_vocab = model->hp.n_vocab;
  dec.eval(s, prompt, true, r.prefill);
  int32_t next = greedy_token(r.prefill.data() + (prompt.size() - 1) * r.n_vocab, r.n_vocab);
  std::vector<float> step;
  for (int i = 0; i < n_steps; ++i) {
    r.greedy.push_back(next);
    dec.eval(s, {next}, false, step);
    r.decode.insert(r.decode.end(), step.begin(), step.end());
    next = greedy_token(step.data(), r.n_vocab);
  }
  return r;
}

LogitsFixture read_fixture(const std::filesystem::path& json_path) {
  auto j = nlohmann::json::parse(read_text_file(json_path));
  LogitsFixture f;
  f.prompt = j.at("prompt").get<std::vector<int32_t>>();
  f.greedy = j.at("greedy").get<std::vector<int32_t>>();
  f.n_vocab = j.at("n_vocab").get<int64_t>();
  auto dir = json_path.parent_path();
  f.prefill = read_f32_file(dir / j.at("prefill_logits").get<std::string>());
  f.decode = read_f32_file(dir / j.at("decode_logits").get<std::string>());
  return f;
}

namespace {
OracleCheck check(const std::string& label, const std::string& model_path, const LogitsFixture& fx) {
  LogitsRun run = run_logits(model_path, fx.prompt, static_cast<int>(fx.greedy.size()));
  EXPECT_EQ(run.n_vocab, fx.n_vocab);
  OracleCheck c;
  c.greedy = run.greedy;
  c.expected_greedy = fx.greedy;
  if (run.prefill.size() != fx.prefill.size() || run.decode.size() != fx.decode.size()) {
    ADD_FAILURE() << label << ": logits of a different shape than the fixture's";
    c.prefill = c.decode = 1.0;
    return c;
  }
  c.prefill = nmse(run.prefill.data(), fx.prefill.data(), fx.prefill.size());
  c.decode = nmse(run.decode.data(), fx.decode.data(), fx.decode.size());
  ::testing::Test::RecordProperty("nmse_prefill", std::to_string(c.prefill));
  ::testing::Test::RecordProperty("nmse_decode", std::to_string(c.decode));
  if (std::getenv("FRINK_TEST_VERBOSE"))
    std::printf("%s nmse prefill %.3g decode %.3g\n", label.c_str(), c.prefill, c.decode);
  return c;
}
}  // namespace

OracleCheck check_llamacpp_arch(const std::string& name) {
  const auto dir = shared_testdata() / "llamacpp" / "archs";
  return check(name, (dir / (name + ".gguf")).string(), read_fixture(dir / (name + ".json")));
}

OracleCheck check_hf_fixture(const std::string& name) {
  const auto dir = std::filesystem::path(FRINK_SOURCE_DIR) / "tests" / "fixtures" / "hf" / name;
  return check(name, dir.string(), read_fixture(dir / "reference.json"));
}

void expect_matches(const OracleCheck& c, double bound) {
  EXPECT_LT(c.prefill, bound) << "prefill";
  EXPECT_LT(c.decode, bound) << "decode";
  EXPECT_EQ(c.greedy, c.expected_greedy);
}

std::string param_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (auto& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

}  // namespace frink::test
