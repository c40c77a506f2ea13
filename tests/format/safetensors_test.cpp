// SafeTensors: hand-written files (u64 header length, JSON header, data) read back, a sharded
// index folder with config.json, and broken files each with one clear Error line.
#include <gtest/gtest.h>

#include "core/error.h"
#include "format/model_file.h"
#include "gguf_bytes.h"
#include "support/test_support.h"

namespace frink {
namespace {

std::vector<uint8_t> st_file(const std::string& header, size_t data_bytes, uint8_t fill = 0) {
  test::Bytes b;
  b.u64(header.size()).raw(header);
  std::vector<uint8_t> out = b.b;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(fill + i));
  return out;
}

// The reader test::error_of runs: every file is named "bad.safetensors".
void read_safetensors(const uint8_t* data, size_t n) { ModelFile::from_safetensors_bytes(data, n, "bad.safetensors"); }

void expect_error(const std::vector<uint8_t>& b, const std::string& needle) {
  std::string err = test::error_of(b, read_safetensors);
  ASSERT_FALSE(err.empty()) << "expected an error containing \"" << needle << "\"";
  EXPECT_NE(err.find(needle), std::string::npos) << err;
  EXPECT_NE(err.find("bad.safetensors"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

const char* kHeader =
    R"({"__metadata__":{"format":"pt"},)"
    R"("model.embed_tokens.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]},)"
    R"("model.norm.weight":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},)"
    R"("lm_head.weight":{"dtype":"F16","shape":[2,1,2],"data_offsets":[28,36]}})";

TEST(SafeTensors, SingleFileReadBack) {
  test::TempDir dir;
  test::write_file(dir.file("model.safetensors"), st_file(kHeader, 36));
  test::write_file(dir.file("config.json"), std::string(R"({"model_type":"llama"})"));
  for (const std::string& path : {dir.file("model.safetensors"), dir.path.string()}) {
    auto mf = ModelFile::open(path);
    EXPECT_EQ(mf->format(), FileFormat::kSafeTensors);
    EXPECT_EQ(mf->gguf_version(), 0u);
    EXPECT_EQ(mf->hf_config_json(), R"({"model_type":"llama"})");
    EXPECT_EQ(mf->hf_dir(), dir.path.string());
    ASSERT_EQ(mf->tensors().size(), 3u);
    EXPECT_EQ(mf->tensors()[0].name, "model.embed_tokens.weight");  // header order kept
    const TensorView* e = mf->find("model.embed_tokens.weight");
    EXPECT_EQ(e->type, GgmlType::F32);
    EXPECT_EQ(e->ne, (std::vector<int64_t>{2, 3}));  // reversed: ne[0] innermost
    EXPECT_EQ(e->data[0], 0);
    EXPECT_EQ(mf->find("model.norm.weight")->type, GgmlType::BF16);
    EXPECT_EQ(mf->find("model.norm.weight")->data[0], 24);
    const TensorView* h = mf->find("lm_head.weight");
    EXPECT_EQ(h->type, GgmlType::F16);
    EXPECT_EQ(h->ne, (std::vector<int64_t>{2, 1, 2}));
    EXPECT_EQ(h->n_bytes, 8u);
    ASSERT_TRUE(mf->metadata().has("safetensors.format"));  // the header's __metadata__
    EXPECT_EQ(mf->metadata().get("safetensors.format").as_string(), "pt");
  }
}

TEST(SafeTensors, ShardedFolder) {
  test::TempDir dir;
  test::write_file(dir.file("model-00001-of-00002.safetensors"),
                   st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, 10));
  test::write_file(dir.file("model-00002-of-00002.safetensors"),
                   st_file(R"({"b":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
                           R"("c":{"dtype":"F16","shape":[1],"data_offsets":[8,10]}})", 10, 20));
  test::write_file(dir.file("model.safetensors.index.json"),
                   std::string(R"({"metadata":{"total_size":26},"weight_map":{)"
                               R"("a":"model-00001-of-00002.safetensors",)"
                               R"("b":"model-00002-of-00002.safetensors",)"
                               R"("c":"model-00002-of-00002.safetensors"}})"));
  test::write_file(dir.file("config.json"), std::string("{}"));
  auto mf = ModelFile::open(dir.path.string());
  EXPECT_EQ(mf->n_files(), 2u);
  ASSERT_EQ(mf->tensors().size(), 3u);
  EXPECT_EQ(mf->find("a")->data[0], 10);
  EXPECT_EQ(mf->find("b")->data[0], 20);
  EXPECT_EQ(mf->find("c")->data[0], 28);
  EXPECT_EQ(mf->hf_config_json(), "{}");

  // A weight_map entry that its shard does not hold.
  test::write_file(dir.file("model.safetensors.index.json"),
                   std::string(R"({"weight_map":{"a":"model-00001-of-00002.safetensors",)"
                               R"("zz":"model-00001-of-00002.safetensors"}})"));
  EXPECT_THROW(ModelFile::open(dir.path.string()), Error);
  test::write_file(dir.file("model.safetensors.index.json"), std::string(R"({"weight_map":{"a":"../x"}})"));
  EXPECT_THROW(ModelFile::open(dir.path.string()), Error);
  test::write_file(dir.file("model.safetensors.index.json"), std::string(R"({"weight_map": [)"));
  try {
    ModelFile::open(dir.path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("broken JSON in", 0), 0u) << e.what();
  }
}

TEST(SafeTensors, EmptyFolderIsAnError) {
  test::TempDir dir;
  EXPECT_THROW(ModelFile::open(dir.path.string()), Error);
}

TEST(SafeTensors, BadInput) {
  EXPECT_EQ(test::error_of(st_file(kHeader, 36), read_safetensors), "");
  expect_error(st_file(R"({"a":)", 0), "broken JSON");
  expect_error(st_file("[1,2]", 0), "not a JSON object");
  expect_error({1, 2, 3}, "too short");
  expect_error(st_file(R"({"__metadata__":[1]})", 0), "__metadata__ is not a JSON object");
  expect_error(st_file(R"({"__metadata__":{"step":3}})", 0), "is not a string");
  test::Bytes past;
  past.u64(1000).raw("{}");
  expect_error(past.b, "runs past the end");
  expect_error(st_file(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8), "dtype \"I64\"");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), "run past");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12), "do not hold");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 12), "do not hold");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 12), "non-negative");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "overlap");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}})", 4), "dimensions");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 4), "dimension of 0");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 4),
               "overflows");
  expect_error(st_file(R"({"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})", 4), "needs");
  expect_error(st_file(R"({"a":3})", 4), "not an object");
}

}  // namespace
}  // namespace frink
