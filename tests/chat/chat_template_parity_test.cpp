// Every shared chat template x every conversation in conversations.h, rendered by frink and
// by Python's jinja2 (tools/render_chat_template.py, run at test time), must agree byte for
// byte; where jinja2 raises, frink must raise too. Skips with a message when ../shared,
// python3 or jinja2 is absent.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "chat/conversations.h"
#include "core/error.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  fs::path dir = fs::path(FRINK_SHARED_DIR) / "testdata" / "chat-templates";
  if (!fs::is_directory(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jinja") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool have_jinja2() {
  static const bool ok = std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0;
  return ok;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

struct Tally {
  int pass = 0, total = 0;
  std::vector<std::string> raised;  // cases where jinja2 raised (and frink must too)
  std::set<std::string> failing_templates;
};
Tally& tally() {
  static Tally t;
  return t;
}

class ParityReport : public ::testing::Environment {
 public:
  void TearDown() override {
    if (tally().total == 0) return;
    std::printf("[ jinja2 parity ] %d / %d template x conversation renders agree (%zu templates fail)\n",
                tally().pass, tally().total, tally().failing_templates.size());
    std::printf("[ jinja2 parity ] %zu of them are cases where jinja2 raises:\n", tally().raised.size());
    for (const auto& r : tally().raised) std::printf("    %s\n", r.c_str());
  }
};
const auto* const kReport = ::testing::AddGlobalTestEnvironment(new ParityReport);

class ChatTemplateParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateParity, MatchesJinja2) {
  FRINK_REQUIRE_SHARED();
  if (!have_jinja2()) GTEST_SKIP() << "python3 with jinja2 is not installed; skipping the jinja2 comparison";
  const std::string name = GetParam();
  fs::path tpath = shared_testdata() / "chat-templates" / (name + ".jinja");
  std::string text = read_text_file(tpath);
  auto convs = chat_conversations();

  nlohmann::ordered_json contexts = nlohmann::ordered_json::array();
  for (const auto& c : convs) contexts.push_back(c.context);
  fs::path ctx_path = fs::temp_directory_path() / ("frink_chat_ctx_" + std::to_string(::getpid()) + "_" + name + ".json");
  std::ofstream(ctx_path) << contexts.dump();
  std::string script = std::string(FRINK_SOURCE_DIR) + "/tools/render_chat_template.py";
  std::string out = run_capture("python3 '" + script + "' --batch '" + tpath.string() + "' '" + ctx_path.string() + "'");
  fs::remove(ctx_path);
  nlohmann::ordered_json expected = nlohmann::ordered_json::parse(out, nullptr, false);
  ASSERT_TRUE(expected.is_array() && expected.size() == convs.size()) << "reference script failed: " << out;

  for (size_t i = 0; i < convs.size(); ++i) {
    const auto& ctx = convs[i].context;
    ChatOptions opts;
    opts.add_generation_prompt = ctx.value("add_generation_prompt", false);
    opts.bos_token = ctx.value("bos_token", "");
    opts.eos_token = ctx.value("eos_token", "");
    opts.date = ctx.value("date", "");
    if (ctx.contains("extra")) opts.extra = ctx["extra"];
    nlohmann::ordered_json tools = ctx.contains("tools") ? ctx["tools"] : nlohmann::ordered_json();
    bool ok = false;
    std::string got, err;
    try {
      got = render_chat(text, ctx["messages"], tools, opts);
      ok = true;
    } catch (const Error& e) {
      err = e.what();
    }
    const auto& exp = expected[i];
    bool agree;
    if (exp["ok"].get<bool>()) {
      agree = ok && got == exp["text"].get<std::string>();
      EXPECT_TRUE(agree) << name << " / " << convs[i].name << ": "
                         << (ok ? "render differs\n--- jinja2:\n" + exp["text"].get<std::string>() + "\n--- frink:\n" + got
                                : "frink raised: " + err);
    } else {
      agree = !ok;
      tally().raised.push_back(name + " / " + convs[i].name + ": " + exp["error"].get<std::string>().substr(0, 100) +
                               " | frink: " + err.substr(0, 100));
      EXPECT_TRUE(agree) << name << " / " << convs[i].name << ": jinja2 raised (" << exp["error"].get<std::string>()
                         << ") but frink rendered";
    }
    ++tally().total;
    if (agree) ++tally().pass;
    else tally().failing_templates.insert(name);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedTemplates, ChatTemplateParity, ::testing::ValuesIn(template_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ChatTemplateParity);

}  // namespace
}  // namespace frink::test
