// Shared helpers for the tokenizer tests: loading a tokenizer from a shared GGUF file, and
// reading llama.cpp's tokenizer test vectors (.inp/.out) exactly as test-tokenizer-0 does.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "format/model_file.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"

namespace frink::test {

inline std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::filesystem::path& p) {
  auto mf = ModelFile::open(p.string());
  return Tokenizer::from_gguf(mf->metadata());
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// test-tokenizer-0's read_tests: inputs split on "\n__ggml_vocab_test__\n", outputs one
// whitespace-stripped line of ids per input.
inline std::vector<VocabCase> read_vocab_cases(const std::filesystem::path& inp,
                                               const std::filesystem::path& out) {
  const std::string raw = read_text_file(inp);
  const std::string ids_text = read_text_file(out);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<int32_t>> outputs;
  for (size_t pos = 0; pos < ids_text.size();) {
    size_t eol = ids_text.find('\n', pos);
    if (eol == std::string::npos) eol = ids_text.size();
    std::vector<int32_t> ids;
    const std::string line = ids_text.substr(pos, eol - pos);
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\r' || line[i] == '\t')) ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\r') ++j;
      if (j > i) ids.push_back(std::stoi(line.substr(i, j - i)));
      i = j;
    }
    outputs.push_back(std::move(ids));
    pos = eol + 1;
  }
  std::vector<VocabCase> cases;
  if (inputs.size() != outputs.size()) return cases;
  for (size_t k = 0; k < inputs.size(); ++k) cases.push_back({inputs[k], outputs[k]});
  return cases;
}

}  // namespace frink::test
