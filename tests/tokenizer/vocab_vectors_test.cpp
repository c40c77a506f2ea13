// llama.cpp's tokenizer test vectors (tests/test-tokenizer-0 with the .inp/.out files in
// ../shared/testdata/vocab): every input must encode to exactly the expected ids with
// add_special = false and parse_special = false, as test-tokenizer-0 calls common_tokenize.
//
// Round trip: byte-level BPE and SentencePiece with byte fallback lose nothing, so the
// concatenated pieces must give the input back (SentencePiece: after dropping the prefix space
// that add_space_prefix put in, as llama_detokenize does). decode() also applies
// clean_up_tokenization_spaces where the vocabulary asks for it (gpt-2, falcon, mpt,
// starcoder, refact, llama3), which is lossy by design, so there the check uses the raw
// pieces. WordPiece (bert-bge) lowercases and drops accents and whitespace: not checked.
#include <gtest/gtest.h>

#include <iostream>

#include "vocab_cases.h"

namespace frink::test {
namespace {

struct VectorSet {
  std::string name;
  bool lossless;  // byte-level BPE or SentencePiece with byte fallback
};

class VocabVectors : public ::testing::TestWithParam<VectorSet> {};

void check_cases(const std::string& name, const Tokenizer& tok, const std::vector<VocabCase>& cases,
                 bool lossless) {
  int n_pass = 0, n_roundtrip = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const VocabCase& c = cases[k];
    const std::vector<int32_t> got = tok.encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, c.ids) << name << " case " << k << ": '" << c.text << "'";
    n_pass += got == c.ids;
    if (!lossless) {
      continue;
    }
    std::string pieces;
    for (int32_t id : got) pieces += tok.token_to_piece(id);
    if (tok.vocab().add_space_prefix && !pieces.empty() && pieces[0] == ' ') pieces.erase(0, 1);
    EXPECT_EQ(pieces, c.text) << name << " round trip, case " << k;
    if (!tok.vocab().clean_spaces) {
      EXPECT_EQ(tok.decode(got), c.text) << name << " decode, case " << k;
    }
    n_roundtrip += pieces == c.text;
  }
  std::cout << "[ vectors  ] " << name << ": " << n_pass << "/" << cases.size() << " encode";
  if (lossless) std::cout << ", " << n_roundtrip << "/" << cases.size() << " round trip";
  std::cout << "\n";
}

TEST_P(VocabVectors, EncodeMatchesLlamaCpp) {
  FRINK_REQUIRE_SHARED();
  const auto dir = shared_testdata() / "vocab";
  const std::string base = "ggml-vocab-" + GetParam().name + ".gguf";
  const auto cases = read_vocab_cases(dir / (base + ".inp"), dir / (base + ".out"));
  ASSERT_FALSE(cases.empty()) << "no test vectors for " << base;
  const auto tok = load_gguf_tokenizer(dir / base);
  check_cases(GetParam().name, *tok, cases, GetParam().lossless);
}

INSTANTIATE_TEST_SUITE_P(Shared, VocabVectors,
                         ::testing::Values(VectorSet{"llama-spm", true}, VectorSet{"phi-3", true},
                                           VectorSet{"bert-bge", false}, VectorSet{"deepseek-coder", true},
                                           VectorSet{"deepseek-llm", true}, VectorSet{"falcon", true},
                                           VectorSet{"gpt-2", true}, VectorSet{"mpt", true},
                                           VectorSet{"refact", true}, VectorSet{"starcoder", true}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The Llama-3 vocabulary ships as GPT-2 style files (encoder.json + vocab.bpe), not GGUF;
// with the llama3 pre-tokenizer it must pass llama.cpp's llama-bpe vectors.
// (qwen2, qwen35, gemma-4 and command-r have vectors but no vocabulary here: not tested.)
TEST(VocabVectorsLlamaBpe, EncodeMatchesLlamaCpp) {
  FRINK_REQUIRE_SHARED();
  const auto dir = shared_testdata() / "vocab";
  const auto cases = read_vocab_cases(dir / "ggml-vocab-llama-bpe.gguf.inp", dir / "ggml-vocab-llama-bpe.gguf.out");
  ASSERT_FALSE(cases.empty());
  const auto tok = Tokenizer::from_gpt2_files(read_text_file(dir / "ollama-llama3.2/encoder.json"),
                                              read_text_file(dir / "ollama-llama3.2/vocab.bpe"), "llama-bpe");
  check_cases("llama-bpe", *tok, cases, true);
}

}  // namespace
}  // namespace frink::test
