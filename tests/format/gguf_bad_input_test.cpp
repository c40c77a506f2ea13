// Broken and hostile GGUF images: each gets one Error line naming the file and the problem,
// never a crash, an overread (run under ASan in the fuzz build) or a huge allocation.
#include <gtest/gtest.h>

#include "core/error.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "gguf_bytes.h"
#include "support/test_support.h"

namespace frink {
namespace {

using test::Bytes;

// The reader test::error_of runs: every image is named "bad.gguf".
void read_gguf(const uint8_t* data, size_t n) { ModelFile::from_gguf_bytes(data, n, "bad.gguf"); }

void expect_error(const std::vector<uint8_t>& b, const std::string& needle) {
  std::string err = test::error_of(b, read_gguf);
  ASSERT_FALSE(err.empty()) << "expected an error containing \"" << needle << "\"";
  EXPECT_NE(err.find(needle), std::string::npos) << err;
  EXPECT_EQ(err.rfind("bad.gguf", 0), 0u) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  Bytes b;
  b.raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  return b;
}

Bytes& tensor_info(Bytes& b, const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                   uint64_t offset) {
  b.str(name).u32(static_cast<uint32_t>(ne.size()));
  for (auto d : ne) b.u64(d);
  return b.u32(type).u64(offset);
}

TEST(GgufBadInput, EveryTruncation) {
  GgufWriter w;
  w.set("general.architecture", MetaValue::of_string("llama"));
  w.set("a", MetaValue::of_array(GgufType::STRING, {MetaValue::of_string("xy"), MetaValue::of_string("z")}));
  w.set("n", MetaValue::of_array(GgufType::ARRAY,
                                 {MetaValue::of_array(GgufType::INT16, {MetaValue::of_int(GgufType::INT16, 3)})}));
  std::vector<float> d(8, 1.0f);
  w.add_tensor("w0", GgmlType::F32, {8}, d.data(), 32);
  w.add_tensor("w1", GgmlType::F32, {8}, d.data(), 32);  // 32 bytes: the file ends with no padding
  auto full = w.to_bytes();
  ASSERT_EQ(test::error_of(full, read_gguf), "");
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<long>(n));
    std::string err = test::error_of(prefix, read_gguf);
    ASSERT_FALSE(err.empty()) << "prefix of " << n << " bytes loaded";
    ASSERT_EQ(err.find('\n'), std::string::npos);
  }
}

TEST(GgufBadInput, MagicAndVersion) {
  expect_error(Bytes().raw("GGUX").u32(3).u64(0).u64(0).b, "not a GGUF file");
  expect_error(Bytes().raw("GG").b, "not a GGUF file");
  expect_error(header(0, 0, 1).b, "version 1");
  expect_error(header(0, 0, 99).b, "version 99");
  expect_error(header(0, 0, 0x03000000).b, "big-endian");
  EXPECT_EQ(test::error_of(header(0, 0, 2).b, read_gguf), "");  // v2 has the same layout as v3
}

TEST(GgufBadInput, AbsurdCounts) {
  expect_error(header(1ull << 60, 0).b, "tensor count");
  expect_error(header(0, 1ull << 60).b, "metadata count");
  expect_error(header(0, 1).u64(1ull << 62).zeros(16).b, "runs past the end");               // key length
  expect_error(header(0, 1).str("k").u32(8).u64(~0ull).b, "runs past the end");    // string value
  expect_error(header(0, 1).str("k").u32(9).u32(4).u64(1ull << 61).b, "array length");
  expect_error(header(0, 1).str("k").u32(9).u32(8).u64(1ull << 59).b, "array length");
  expect_error(header(0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
  expect_error(header(0, 1).str("k").u32(7).put<uint8_t>(2).b, "bool value 2");
  expect_error(header(0, 2).str("k").u32(0).put<uint8_t>(1).str("k").u32(0).put<uint8_t>(1).b,
               "duplicate metadata key");
  Bytes deep = header(0, 1).str("k").u32(9);
  for (int i = 0; i < 20; ++i) deep.u32(9).u64(1);
  expect_error(deep.b, "deeper");
}

TEST(GgufBadInput, TensorInfos) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    Bytes b = header(1, 0);
    tensor_info(b, "t", ne, type, offset);
    return b.pad_to(32).zeros(64).b;
  };
  EXPECT_EQ(test::error_of(one({16}, 0, 0), read_gguf), "");
  expect_error(one({1, 1, 1, 1, 1}, 0, 0), "5 dimensions");
  expect_error(one({4, 0}, 0, 0), "dimension 1 = 0");
  expect_error(one({1ull << 40, 1ull << 40}, 0, 0), "overflows");
  expect_error(one({1ull << 62}, 0, 0), "byte size that overflows");
  expect_error(one({1ull << 40}, 0, 0), "outside");  // byte size past the file
  expect_error(one({16}, 999, 0), "unknown type id 999");
  expect_error(one({16}, 2, 0), "not a multiple");   // Q4_0 rows are 32 elements
  expect_error(one({16}, 0, 1ull << 20), "outside");
  expect_error(one({16}, 0, 4), "alignment");
  expect_error(one({16}, 0, ~0ull - 31), "outside");  // offset + size wraps around
  Bytes b = header(2, 0);
  tensor_info(b, "t0", {16}, 0, 0);
  tensor_info(b, "t1", {8}, 0, 32);
  expect_error(b.pad_to(32).zeros(64).b, "overlap");
  Bytes dup = header(2, 0);
  tensor_info(dup, "t", {8}, 0, 0);
  tensor_info(dup, "t", {8}, 0, 32);
  expect_error(dup.pad_to(32).zeros(64).b, "duplicate tensor");
}

TEST(GgufBadInput, Alignment) {
  auto with_alignment = [](uint32_t type, uint64_t a) {
    Bytes b = header(0, 1).str("general.alignment").u32(type);
    if (type == 4) b.u32(static_cast<uint32_t>(a)); else b.u64(a);
    return b.b;
  };
  EXPECT_EQ(test::error_of(with_alignment(4, 64), read_gguf), "");
  expect_error(with_alignment(4, 0), "power of two");
  expect_error(with_alignment(4, 48), "power of two");
  expect_error(Bytes(header(0, 1).str("general.alignment").u32(8).str("x")).b, "expected u32");
}

TEST(GgufBadInput, FileErrorsNameThePath) {
  test::TempDir dir;
  test::write_file(dir.file("v1.gguf"), header(0, 0, 1).b);
  try {
    ModelFile::open(dir.file("v1.gguf"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir.file("v1.gguf"), 0), 0u) << e.what();
  }
  test::write_file(dir.file("junk.bin"), std::string("hello there"));
  EXPECT_THROW(ModelFile::open(dir.file("junk.bin")), Error);
  EXPECT_THROW(ModelFile::open(dir.file("missing.gguf")), Error);
  test::write_file(dir.file("empty.gguf"), std::string());
  EXPECT_THROW(ModelFile::open(dir.file("empty.gguf")), Error);
}

}  // namespace
}  // namespace frink
