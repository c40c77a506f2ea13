// Encoding speed of frink's tokenizers on ~1 MB of English text (the GPL-3 text repeated, or
// the llama.cpp vocab test inputs when it is absent; nothing is committed), for the gpt-2
// (byte-level BPE, PCRE2 pre-tokenizer) and llama-spm (SentencePiece) vocabularies of
// ../shared/testdata/vocab. Validates first: the pieces must give the text back.
//
// Notebook (shared 2-core dev container, Release, `build-tok/bench/bench_tokenizer_encode`,
// 1 MiB of GPL-3 text, CPU time per encode):
//   v1 gpt-2      234 ms: 242k tokens, ~1.03 M tokens/s, 4.3 MB/s (PCRE2 JIT pre-tokenizer,
//                 llama.cpp's rank heap per pre-token, no word cache).
//   v1 llama-spm  853 ms: 261k tokens, ~0.31 M tokens/s, 1.2 MB/s (llama.cpp's SPM: the
//                 whole text is ONE fragment, one bigram heap over ~1M symbols).
//   Untried: a per-word cache for BPE (English repeats words); it needs a thread-safe cache.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path shared_testdata() {
  if (const char* env = std::getenv("FRINK_SHARED_DIR")) return fs::path(env) / "testdata";
  for (const char* up : {"../shared", "../../shared", "../../../shared"})
    if (fs::is_directory(fs::path(up) / "testdata")) return fs::path(up) / "testdata";
  return {};
}

const std::string& corpus() {
  static const std::string kText = [] {
    std::string seed = read_all("/usr/share/common-licenses/GPL-3");
    if (seed.empty()) seed = read_all(shared_testdata() / "vocab/ggml-vocab-gpt-2.gguf.inp");
    if (seed.empty()) seed = "The quick brown fox jumps over the lazy dog. ";
    std::string text;
    while (text.size() < (1u << 20)) text += seed;
    return text;
  }();
  return kText;
}

void bench_vocab(benchmark::State& state, const char* vocab_file) {
  const fs::path dir = shared_testdata();
  if (dir.empty()) {
    state.SkipWithError("../shared/testdata not found (set FRINK_SHARED_DIR)");
    return;
  }
  const auto mf = frink::ModelFile::open((dir / "vocab" / vocab_file).string());
  const auto tok = frink::Tokenizer::from_gguf(mf->metadata());
  const std::string& text = corpus();

  std::vector<int32_t> ids = tok->encode(text, false, false);
  std::string back;
  for (int32_t id : ids) back += tok->token_to_piece(id);
  if (tok->vocab().add_space_prefix && !back.empty()) back.erase(0, 1);
  if (back != text) {
    state.SkipWithError("round trip failed: the pieces do not give the text back");
    return;
  }
  for (auto _ : state) {
    ids = tok->encode(text, false, false);
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(ids.size()) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(text.size()) * state.iterations());
}

BENCHMARK_CAPTURE(bench_vocab, gpt2, "ggml-vocab-gpt-2.gguf")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(bench_vocab, llama_spm, "ggml-vocab-llama-spm.gguf")->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
