// `frink info` against the built binary: the facts on a real model, JSON output, and one
// `error: ...` line with exit code 1 on a truncated file.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace frink {
namespace {

std::string stories() { return (test::shared_testdata() / "models/stories260K.gguf").string(); }

TEST(CliInfo, Stories260K) {
  FRINK_REQUIRE_SHARED();
  auto r = test::run_frink("info " + stories());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("292.80 K"), std::string::npos) << r.out;  // sum of tensor elements
  EXPECT_NE(r.out.find("GGUF v3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("F32"), std::string::npos) << r.out;
}

TEST(CliInfo, Json) {
  FRINK_REQUIRE_SHARED();
  auto r = test::run_frink("info --json " + stories());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["layers"], 5);
  EXPECT_EQ(j["embedding_size"], 64);
  EXPECT_EQ(j["heads"], 8);
  EXPECT_EQ(j["kv_heads"], 4);
  EXPECT_EQ(j["vocab_size"], 512);
  EXPECT_EQ(j["n_parameters"], 292800);
}

TEST(CliInfo, TruncatedFileIsOneErrorLine) {
  FRINK_REQUIRE_SHARED();
  auto path = std::filesystem::temp_directory_path() / ("frink_info_trunc_" + std::to_string(::getpid()) + ".gguf");
  {
    std::ifstream in(stories(), std::ios::binary);
    std::string head(4000, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(path, std::ios::binary) << head;
  }
  auto r = test::run_frink("info " + path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // exactly one line
  EXPECT_NE(r.err.find(path.string()), std::string::npos) << r.err;
}

}  // namespace
}  // namespace frink
