// BPE pre-tokenization: the regex list llama.cpp's llm_tokenizer_bpe picks for each
// tokenizer.ggml.pre, run with PCRE2 (UTF + UCP, so \p{L}, \p{N}, \s are full Unicode).
// Each regex splits every piece the previous ones left, and text between matches stays a
// piece of its own, exactly like llama.cpp's unicode_regex_split; then every piece is
// GPT-2 byte-encoded (unless the vocabulary works on raw UTF-8, e.g. gemma4).
// Invalid UTF-8 is read as llama.cpp reads it: each bad byte becomes U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace frink::tok {

class PreTokenizer {
 public:
  // `kind` is a canonical pre-tokenizer kind (see pre_kind_for in vocab.cpp): "default",
  // "llama3", "gpt2", "starcoder", "falcon", "qwen2", ... Throws frink::Error if unknown.
  static std::shared_ptr<const PreTokenizer> create(std::string_view kind, bool byte_encode);
  ~PreTokenizer();

  // Splits `text` into pre-tokens (byte-encoded when byte_encode), appended to `out`.
  void split(std::string_view text, std::vector<std::string>& out) const;
  const std::vector<std::string>& regexes() const { return exprs_; }

 private:
  PreTokenizer() = default;
  struct Compiled;
  std::vector<std::string> exprs_;
  std::vector<std::unique_ptr<Compiled>> compiled_;
  bool byte_encode_ = true;
};

}  // namespace frink::tok
