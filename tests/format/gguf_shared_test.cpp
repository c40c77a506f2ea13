// Every GGUF under ../shared/testdata opens, and spot checks against what llama.cpp wrote.
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/error.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "gguf_bytes.h"
#include "support/test_support.h"

namespace frink {
namespace {

namespace fs = std::filesystem;

TEST(GgufShared, EveryFileOpens) {
  FRINK_REQUIRE_SHARED();
  int n_files = 0;
  for (const auto& e : fs::recursive_directory_iterator(test::shared_testdata())) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().string());
    std::unique_ptr<ModelFile> mf;
    ASSERT_NO_THROW(mf = ModelFile::open(e.path().string()));
    EXPECT_EQ(mf->format(), FileFormat::kGguf);
    EXPECT_EQ(mf->gguf_version(), 3u);
    EXPECT_TRUE(mf->metadata().has("general.architecture"));
    EXPECT_EQ(mf->file_bytes(), fs::file_size(e.path()));
    for (const auto& t : mf->tensors()) {
      EXPECT_GE(t.data, mf->mapped(0).data());
      EXPECT_LE(t.data + t.n_bytes, mf->mapped(0).data() + mf->mapped(0).size());
      EXPECT_EQ(t.n_bytes, t.row_bytes() * static_cast<size_t>(t.n_rows()));
    }
    ++n_files;
  }
  EXPECT_GE(n_files, 40);
}

TEST(GgufShared, Stories260K) {
  FRINK_REQUIRE_SHARED();
  auto mf = ModelFile::open((test::shared_testdata() / "models/stories260K.gguf").string());
  const Metadata& m = mf->metadata();
  EXPECT_EQ(m.get_string("general.architecture"), "llama");
  EXPECT_EQ(m.get_int("llama.block_count"), 5);
  EXPECT_EQ(m.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(m.get("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(m.get("tokenizer.ggml.tokens").as_strings().size(), 512u);
  const TensorView* t = mf->find("token_embd.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(t->type, GgmlType::F32);
  EXPECT_EQ(t->n_bytes, 64u * 512u * 4u);
  EXPECT_EQ(mf->find("no.such.tensor"), nullptr);
}

TEST(GgufShared, QuantizedTypes) {
  FRINK_REQUIRE_SHARED();
  auto mf = ModelFile::open((test::shared_testdata() / "llamacpp/quant/llama-dense-Q4_K_M.gguf").string());
  bool saw_q4k = false;
  for (const auto& t : mf->tensors()) saw_q4k |= t.type == GgmlType::Q4_K;
  EXPECT_TRUE(saw_q4k);
}

TEST(GgufShared, WrongKindNamesKey) {
  FRINK_REQUIRE_SHARED();
  auto mf = ModelFile::open((test::shared_testdata() / "models/stories260K.gguf").string());
  try {
    mf->metadata().get_int("general.architecture");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mf->metadata().get_int("no.such.key"), Error);
  EXPECT_FALSE(mf->metadata().try_int("no.such.key").has_value());
}

}  // namespace
}  // namespace frink

namespace frink {
namespace {

// Rewriting llama.cpp's files with GgufWriter gives files of exactly the same size (same
// layout and padding rules) that read back equal: our writer speaks llama.cpp's GGUF.
TEST(GgufShared, RewriteMatchesLlamaCppLayout) {
  FRINK_REQUIRE_SHARED();
  for (const char* rel : {"models/stories260K.gguf", "llamacpp/quant/llama-dense-Q4_K_M.gguf",
                          "vocab/ggml-vocab-llama-spm.gguf"}) {
    SCOPED_TRACE(rel);
    auto src = ModelFile::open((test::shared_testdata() / rel).string());
    GgufWriter w;
    w.set_all(src->metadata());
    for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    test::TempDir dir;
    w.write(dir.file("copy.gguf"));
    auto copy = ModelFile::open(dir.file("copy.gguf"));
    EXPECT_EQ(copy->file_bytes(), src->file_bytes());
    EXPECT_EQ(copy->metadata().entries().size(), src->metadata().entries().size());
    for (const auto& [k, v] : src->metadata().entries()) EXPECT_TRUE(copy->metadata().get(k) == v) << k;
    ASSERT_EQ(copy->tensors().size(), src->tensors().size());
    for (size_t i = 0; i < src->tensors().size(); ++i) {
      const auto &a = src->tensors()[i], &b = copy->tensors()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.ne, b.ne);
      EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
    }
  }
}

}  // namespace
}  // namespace frink
