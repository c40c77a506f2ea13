// frink logits: raw float32 logits for every prompt position ([n_tokens][n_vocab],
// little-endian), and optionally N greedy tokens decoded one at a time, as JSON on stdout.
// The tool behind comparisons with other engines' outputs.
#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/decoder.h"
#include "engine/sampler.h"

namespace frink::cli {

namespace {

struct LogitsArgs {
  ModelOptions model;
  std::string tokens;
  std::string out;
  int greedy = 0;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) fail("--tokens: '{}' is not a token id", item);
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

int run(const LogitsArgs& a) {
  std::vector<int32_t> ids = parse_ids(a.tokens);
  auto m = load_model_for(a.model);
  Decoder dec(*m, decoder_options(a.model, *m));
  Session s(*m, context_size(a.model, *m));
  std::vector<float> logits;
  dec.eval(s, ids, true, logits);
  if (!a.out.empty()) {
    std::FILE* f = std::fopen(a.out.c_str(), "wb");
    if (!f) fail("cannot write {}", a.out);
    const size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
    if (std::fclose(f) != 0 || n != logits.size()) fail("writing {} failed", a.out);
  }
  if (a.greedy > 0) {
    const int64_t V = m->hp.n_vocab;
    std::vector<int32_t> out;
    int32_t next = greedy_token(logits.data() + (ids.size() - 1) * V, V);
    std::vector<float> step;
    for (int i = 0; i < a.greedy; ++i) {
      out.push_back(next);
      if (i + 1 == a.greedy) break;
      dec.eval(s, {next}, false, step);
      next = greedy_token(step.data(), V);
    }
    std::printf("{\"greedy\": [");
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
    std::printf("]}\n");
  }
  return 0;
}

}  // namespace

Runner add_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  auto* cmd = app.add_subcommand("logits", "Write the logits of a token sequence");
  add_model_options(*cmd, a->model);
  cmd->add_option("--tokens", a->tokens, "comma-separated token ids")->required();
  cmd->add_option("-o,--output", a->out, "file for float32 logits [n_tokens][n_vocab]");
  cmd->add_option("--greedy", a->greedy, "then decode N tokens greedily and print them as JSON");
  return [a] { return run(*a); };
}

}  // namespace frink::cli
