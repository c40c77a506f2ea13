// A model file that parses but does not describe a runnable model is bad input: one error
// line naming the tensor or key, never a crash or a silently wrong model.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "format/gguf_writer.h"
#include "model/model.h"
#include "support/test_support.h"

namespace frink::test {
namespace {

// Rewrites llama-dense.gguf through `edit`, which may drop or reshape tensors and keys.
std::string rewrite(const std::string& tag,
                    const std::function<bool(const TensorView&, std::vector<int64_t>&)>& keep,
                    const std::function<void(Metadata&)>& edit_meta = nullptr) {
  auto src = ModelFile::open((shared_testdata() / "llamacpp" / "archs" / "llama-dense.gguf").string());
  Metadata meta = src->metadata();
  if (edit_meta) edit_meta(meta);
  GgufWriter w;
  w.set_all(meta);
  std::vector<std::vector<uint8_t>> bufs;
  for (const TensorView& t : src->tensors()) {
    std::vector<int64_t> ne = t.ne;
    if (!keep(t, ne)) continue;
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    auto& b = bufs.emplace_back(static_cast<size_t>(n) * 4, 0);
    std::memcpy(b.data(), t.data, std::min(b.size(), t.n_bytes));
    w.add_tensor(t.name, t.type, ne, b.data(), b.size());
  }
  const auto path = std::filesystem::temp_directory_path() / ("frink_bad_model_" + tag + ".gguf");
  w.write(path.string());
  return path.string();
}

void expect_error(const std::string& path, const std::string& fragment) {
  try {
    load_model(path);
    FAIL() << "loaded a bad model: " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(BadModel, MissingRequiredTensorIsNamed) {
  FRINK_REQUIRE_SHARED();
  auto p = rewrite("missing", [](const TensorView& t, std::vector<int64_t>&) { return t.name != "blk.1.ffn_up.weight"; });
  expect_error(p, "required tensor 'blk.1.ffn_up.weight' is missing");
}

TEST(BadModel, WrongShapeIsNamed) {
  FRINK_REQUIRE_SHARED();
  auto p = rewrite("shape", [](const TensorView& t, std::vector<int64_t>& ne) {
    if (t.name == "blk.0.attn_k.weight") ne = {256, 128};
    return true;
  });
  expect_error(p, "tensor 'blk.0.attn_k.weight' has shape {256, 128}, expected {256, 256}");
}

TEST(BadModel, UnknownArchitectureIsNamed) {
  FRINK_REQUIRE_SHARED();
  auto p = rewrite("arch", [](const TensorView&, std::vector<int64_t>&) { return true; },
                   [](Metadata& m) { m.set("general.architecture", MetaValue::of_string("llama9")); });
  expect_error(p, "unknown architecture 'llama9'");
}

TEST(BadModel, CliSaysOneLineAndExitsOne) {
  FRINK_REQUIRE_SHARED();
  auto p = rewrite("cli", [](const TensorView& t, std::vector<int64_t>&) { return t.name != "output_norm.weight"; });
  auto r = run_frink("run -m " + p + " -p hi -n 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("output_norm.weight"), std::string::npos) << r.err;
  std::filesystem::remove(p);
}

}  // namespace
}  // namespace frink::test
