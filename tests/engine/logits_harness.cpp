#include "engine/logits_harness.h"

#include <nlohmann/json.hpp>

#include "engine/decoder.h"
#include "support/test_support.h"

namespace frink::test {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

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
  int32_t next = argmax(r.prefill.data() + (prompt.size() - 1) * r.n_vocab, r.n_vocab);
  std::vector<float> step;
  for (int i = 0; i < n_steps; ++i) {
    r.greedy.push_back(next);
    dec.eval(s, {next}, false, step);
    r.decode.insert(r.decode.end(), step.begin(), step.end());
    next = argmax(step.data(), r.n_vocab);
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

}  // namespace frink::test
