// `frink template` end to end: a shared template file renders as render_chat does, and an
// unsupported template warns and falls back to ChatML. Skips when the frink binary has not
// been built (test_chat does not depend on it) or ../shared is absent.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace frink::test {
namespace {

namespace fs = std::filesystem;

fs::path write_temp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("frink_template_cli_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

TEST(TemplateCli, RendersAndFallsBack) {
  FRINK_REQUIRE_SHARED();
  if (!fs::exists(FRINK_BIN)) GTEST_SKIP() << "frink binary not built; skipping the command-line test";
  fs::path msgs = write_temp("msgs.json", R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])");
  fs::path tmpl = shared_testdata() / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja";
  auto r = run_frink("template --file " + tmpl.string() + " --messages " + msgs.string() + " --add-generation-prompt");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  fs::path bad = write_temp("bad.jinja", "{% include 'other.jinja' %}");
  r = run_frink("template --file " + bad.string() + " --messages " + msgs.string());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.err.find("unsupported tag 'include'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");

  // A template that raises is an error, not a fallback.
  tmpl = shared_testdata() / "chat-templates" / "google-gemma-2-2b-it.jinja";
  r = run_frink("template --file " + tmpl.string() + " --messages " + msgs.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("System role not supported"), std::string::npos) << r.err;
  fs::remove(msgs);
  fs::remove(bad);
}

}  // namespace
}  // namespace frink::test
