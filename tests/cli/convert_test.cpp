// frink convert against the built binary: a transformers Llama fixture (tests/fixtures/hf/llama,
// random weights, made by tools/make_hf_fixtures.py) with a byte-level tokenizer.json written
// here (GPT-2's 256 byte symbols, no merges). The F32 GGUF must give the SafeTensors folder's
// logits bit for bit (same weights, same permuted q/k rows, same code path), its tokenizer the
// tokenizer.json's ids; Q8_0 must load; an unsupported pre-tokenizer is one error line.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace frink {
namespace {

namespace fs = std::filesystem;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others map to 256 + k.
std::string byte_symbol(int b, int& next_extra) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const int cp = printable ? b : 256 + next_extra++;
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  return s;
}

nlohmann::json byte_tokenizer(const std::string& pre_type) {
  nlohmann::json vocab = nlohmann::json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b, extra)] = b;
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", pre_type}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

class Convert : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("frink_convert_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "hf");
    const fs::path fixture = fs::path(FRINK_SOURCE_DIR) / "tests/fixtures/hf/llama";
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(fixture / f, dir_ / "hf" / f, fs::copy_options::overwrite_existing);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_tokenizer(const nlohmann::json& j) { std::ofstream(dir_ / "hf/tokenizer.json") << j.dump(); }
  std::string hf() const { return (dir_ / "hf").string(); }
  std::string out(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(Convert, F32GivesTheFoldersLogitsExactly) {
  write_tokenizer(byte_tokenizer("ByteLevel"));
  auto c = test::run_frink("convert " + hf() + " -o " + out("m.gguf") + " --type F32");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string ids = " --tokens 1,72,101,108,108,111,32,200,7 -t 1 -o ";
  auto a = test::run_frink("logits -m " + hf() + ids + out("a.f32"));
  auto b = test::run_frink("logits -m " + out("m.gguf") + ids + out("b.f32"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto la = test::read_f32_file(out("a.f32")), lb = test::read_f32_file(out("b.f32"));
  ASSERT_EQ(la.size(), 9u * 256u);
  EXPECT_EQ(la, lb);

  auto ta = test::run_frink("tokenize --ids -m " + hf() + " -p \"Hello, world!\"");
  auto tb = test::run_frink("tokenize --ids -m " + out("m.gguf") + " -p \"Hello, world!\"");
  ASSERT_EQ(tb.exit_code, 0) << tb.err;
  // config.json names bos_token_id 1 and the tokenizer adds none: no BOS either way.
  EXPECT_EQ(tb.out, "[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33]\n");
  EXPECT_EQ(ta.out, tb.out);
}

TEST_F(Convert, Q8_0Loads) {
  write_tokenizer(byte_tokenizer("ByteLevel"));
  auto c = test::run_frink("convert " + hf() + " -o " + out("q.gguf") + " --type q8_0");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  auto i = test::run_frink("info --json " + out("q.gguf"));
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find("Q8_0"), std::string::npos) << i.out;
}

TEST_F(Convert, UnsupportedPreTokenizerIsAOneLineError) {
  write_tokenizer(byte_tokenizer("Metaspace"));
  auto c = test::run_frink("convert " + hf() + " -o " + out("m.gguf"));
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_EQ(c.err.rfind("error: ", 0), 0u) << c.err;
  EXPECT_EQ(c.err.find('\n'), c.err.size() - 1) << c.err;
  EXPECT_FALSE(fs::exists(out("m.gguf")));
}

}  // namespace
}  // namespace frink
