// frink chat driven through its standard input: turns stream, the KV cache is reused
// between turns, /save writes the transcript, /reset clears it, end of input exits cleanly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace frink::test {
namespace {

TEST(Chat, TwoTurnsSaveAndReuseTheCache) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  const auto saved = std::filesystem::temp_directory_path() / "frink_chat_test.json";
  auto r = run_frink_with_input("chat -m " + model.string() + " -n 12 --temp 0 -v -sys \"You tell stories\"",
                                "Once upon a time\nThe end\n/save " + saved.string() + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(read_text_file(saved));
  ASSERT_EQ(j.size(), 5u);  // system, user, assistant, user, assistant
  EXPECT_EQ(j[0]["role"], "system");
  EXPECT_EQ(j[1]["content"], "Once upon a time");
  EXPECT_EQ(j[3]["content"], "The end");
  EXPECT_FALSE(j[2]["content"].get<std::string>().empty());
  // Stories260K has no chat template: ChatML with a warning, once.
  EXPECT_NE(r.err.find("ChatML"), std::string::npos) << r.err;
  // The second turn reuses the first turn's tokens instead of reprocessing them.
  auto second = r.err.find("prompt tokens reused", r.err.find("prompt tokens reused") + 1);
  ASSERT_NE(second, std::string::npos) << r.err;
  const auto open = r.err.rfind('[', second);
  EXPECT_GT(std::stoll(r.err.substr(open + 1)), 10) << r.err;
  std::filesystem::remove(saved);
}

TEST(Chat, ResetForgetsTheConversation) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  const auto saved = std::filesystem::temp_directory_path() / "frink_chat_reset.json";
  auto r = run_frink_with_input("chat -m " + model.string() + " -n 4 --temp 0",
                                "Hello\n/reset\nAgain\n/save " + saved.string() + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(read_text_file(saved));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["content"], "Again");
  std::filesystem::remove(saved);
}

}  // namespace
}  // namespace frink::test
