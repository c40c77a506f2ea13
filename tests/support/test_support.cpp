#include "support/test_support.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace frink::test {

std::filesystem::path shared_testdata() {
  std::filesystem::path p = std::filesystem::path(FRINK_SHARED_DIR) / "testdata";
  if (std::filesystem::is_directory(p)) return p;
  return {};
}

std::vector<float> read_f32_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  f.seekg(0, std::ios::end);
  size_t n = static_cast<size_t>(f.tellg()) / sizeof(float);
  f.seekg(0);
  std::vector<float> v(n);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  return v;
}

std::string read_text_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double nmse(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? num / den : num;
}

CommandResult run_frink(const std::string& args) { return run_frink_with_input(args, ""); }

CommandResult run_frink_with_input(const std::string& args, const std::string& input) {
  auto tmp = std::filesystem::temp_directory_path();
  auto tag = std::to_string(::getpid()) + "_" + std::to_string(std::rand());
  auto out_path = tmp / ("frink_test_out_" + tag);
  auto err_path = tmp / ("frink_test_err_" + tag);
  auto in_path = tmp / ("frink_test_in_" + tag);
  {
    std::ofstream in(in_path, std::ios::binary);
    in << input;
  }
  std::string cmd = std::string(FRINK_BIN) + " " + args + " >" + out_path.string() + " 2>" +
                    err_path.string() + " <" + in_path.string();
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text_file(out_path);
  r.err = read_text_file(err_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  std::filesystem::remove(in_path);
  return r;
}

}  // namespace frink::test
