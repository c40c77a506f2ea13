// Oracle 3 (DESIGN.md section 6): real trained weights. stories260K's greedy text, on which
// llama.cpp, llama2.c and Karpathy's published sample agree.
#include <gtest/gtest.h>

#include <string>

#include "support/test_support.h"

namespace frink::test {
namespace {

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  s.erase(s.find_last_not_of(ws) + 1);
  return s;
}

TEST(Run, Stories260KGreedyTextEqualsLlamaCpp) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  auto r = run_frink("run -m " + model.string() + " -p \"Once upon a time\" -n 120 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string expected =
      read_text_file(shared_testdata() / "expected" / "stories260K_greedy_llamacpp_prompt_OnceUponATime_n120.txt");
  EXPECT_EQ(trim(r.out), trim(expected));
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << "timings belong on stderr";
}

// llama.cpp's -ngl: on a GPU the last 2 layers run there and the rest on the CPU, elsewhere all on
// the CPU; the text is llama.cpp's either way. A count below -1 is refused.
TEST(Run, GpuLayersKeepTheGreedyText) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  auto r = run_frink("run -m " + model.string() + " -p \"Once upon a time\" -n 120 --temp 0 -t 2 -ngl 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string expected =
      read_text_file(shared_testdata() / "expected" / "stories260K_greedy_llamacpp_prompt_OnceUponATime_n120.txt");
  EXPECT_EQ(trim(r.out), trim(expected));
  auto bad = run_frink("run -m " + model.string() + " -p hi -n 1 --gpu-layers -2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--gpu-layers"), std::string::npos) << bad.err;
}

TEST(Run, SeededSamplingIsReproducible) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  const std::string args = "run -m " + model.string() + " -p \"Once\" -n 40 --temp 1 --seed 7";
  auto a = run_frink(args), b = run_frink(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  auto c = run_frink("run -m " + model.string() + " -p \"Once\" -n 40 --temp 1 --seed 8");
  EXPECT_NE(a.out, c.out);
}

TEST(Run, PromptLongerThanTheContextIsAOneLineError) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  auto r = run_frink("run -m " + model.string() + " -p \"Once upon a time there was a girl\" -c 4 -n 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

// A sampling parameter that is NaN or infinite is refused before anything runs, by run and
// by chat (which would otherwise fail only at its first reply).
TEST(Run, NonFiniteSamplingParameterIsAOneLineError) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  for (const std::string cmd : {"run -p Once -n 4", "chat -n 4"}) {
    for (const std::string opt : {"--temp nan", "--top-p inf", "--min-p -inf", "--repeat-penalty nan"}) {
      auto r = run_frink(cmd + " -m " + model.string() + " " + opt);
      EXPECT_EQ(r.exit_code, 1) << cmd << " " << opt;
      EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
      EXPECT_NE(r.err.find("finite"), std::string::npos) << r.err;
      EXPECT_EQ(r.out, "") << cmd << " " << opt;
    }
  }
}

// Negative sizes and counts are refused when the options are read: before a table header
// (bench printed its header, then failed on a depth, and ran nothing for a negative -p).
TEST(Bench, NegativeSizesAreRefusedBeforeAnyOutput) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "models" / "stories260K.gguf";
  for (const std::string opt : {"-p -4", "-n 8,-1", "-d 0,-5", "-r 0", "-t -2", "-b 0"}) {
    auto r = run_frink("bench -m " + model.string() + " " + opt);
    EXPECT_NE(r.exit_code, 0) << opt;
    EXPECT_EQ(r.out, "") << opt;
    EXPECT_NE(r.err.find("must be at least"), std::string::npos) << opt << ": " << r.err;
  }
}

TEST(Run, UnknownArchitectureIsAOneLineError) {
  FRINK_REQUIRE_SHARED();
  // A vocabulary-only file has an architecture frink does not run ("llama" vocab files
  // carry no tensors): either way the answer is one error line and exit code 1.
  const auto model = shared_testdata() / "vocab" / "ggml-vocab-gpt-2.gguf";
  auto r = run_frink("run -m " + model.string() + " -p hi -n 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
}

TEST(Logits, WritesEveryPositionAndGreedyJson) {
  FRINK_REQUIRE_SHARED();
  const auto dir = shared_testdata() / "llamacpp" / "archs";
  const auto out = std::filesystem::temp_directory_path() / "frink_logits_test.f32";
  auto r = run_frink("logits -m " + (dir / "llama-dense.gguf").string() +
                     " --tokens 24,63,79,104,56,78,100,98,99,110,34,19,35,25,102,104,122,20,112,14,45,1,64,62 -o " +
                     out.string() + " --greedy 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(trim(r.out), "{\"greedy\": [1, 58, 28, 58, 28, 58, 28, 58]}");
  auto ours = read_f32_file(out);
  auto ref = read_f32_file(dir / "llama-dense.prefill.f32");
  ASSERT_EQ(ours.size(), ref.size());
  EXPECT_LT(nmse(ours.data(), ref.data(), ref.size()), 1e-6);
  std::filesystem::remove(out);
}

TEST(Logits, BadTokenListIsAOneLineError) {
  FRINK_REQUIRE_SHARED();
  const auto model = shared_testdata() / "llamacpp" / "archs" / "llama-dense.gguf";
  auto r = run_frink("logits -m " + model.string() + " --tokens 1,x,3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  auto r2 = run_frink("logits -m " + model.string() + " --tokens 1,100000");
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_NE(r2.err.find("vocabulary"), std::string::npos) << r2.err;
}

}  // namespace
}  // namespace frink::test
