// Writer round trips: every metadata type, nested arrays, several tensor types, alignment
// other than 32, and a model split in 3 parts as llama.cpp's gguf-split writes it.
#include <gtest/gtest.h>
#include <unistd.h>

#include "core/error.h"
#include "format/gguf_reader.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "gguf_bytes.h"

namespace frink {
namespace {

using A = MetaValue::Array;

Metadata every_type() {
  Metadata m;
  m.set("t.u8", MetaValue::of_int(GgufType::UINT8, 255));
  m.set("t.i8", MetaValue::of_int(GgufType::INT8, -128));
  m.set("t.u16", MetaValue::of_int(GgufType::UINT16, 65535));
  m.set("t.i16", MetaValue::of_int(GgufType::INT16, -32768));
  m.set("t.u32", MetaValue::of_int(GgufType::UINT32, 4000000000));
  m.set("t.i32", MetaValue::of_int(GgufType::INT32, -2000000000));
  m.set("t.u64", MetaValue::of_uint64(18000000000000000000ull));
  m.set("t.i64", MetaValue::of_int(GgufType::INT64, -9000000000000000000ll));
  m.set("t.f32", MetaValue::of_float(GgufType::FLOAT32, 0.5));
  m.set("t.f64", MetaValue::of_float(GgufType::FLOAT64, 1e-300));
  m.set("t.bool", MetaValue::of_bool(true));
  m.set("t.str", MetaValue::of_string(std::string("h\xc3\xa9llo\0x", 8)));
  m.set("t.empty_str", MetaValue::of_string(""));
  m.set("t.arr_str", MetaValue::of_array(GgufType::STRING,
                                         A{MetaValue::of_string("a"), MetaValue::of_string("")}));
  m.set("t.arr_i32", MetaValue::of_array(GgufType::INT32, A{MetaValue::of_int(GgufType::INT32, -1),
                                                            MetaValue::of_int(GgufType::INT32, 7)}));
  m.set("t.arr_f32", MetaValue::of_array(GgufType::FLOAT32, A{MetaValue::of_float(GgufType::FLOAT32, 2.25)}));
  m.set("t.arr_empty", MetaValue::of_array(GgufType::UINT64, A{}));
  m.set("t.arr_bool", MetaValue::of_array(GgufType::BOOL, A{MetaValue::of_bool(false), MetaValue::of_bool(true)}));
  MetaValue inner1 = MetaValue::of_array(GgufType::UINT8, A{MetaValue::of_int(GgufType::UINT8, 1)});
  MetaValue inner2 = MetaValue::of_array(GgufType::UINT8, A{});
  MetaValue nested = MetaValue::of_array(GgufType::ARRAY, A{inner1, inner2});
  m.set("t.nested", nested);
  m.set("t.nested2", MetaValue::of_array(GgufType::ARRAY, A{nested, nested}));
  return m;
}

TEST(GgufWriter, RoundTripEveryTypeAndAlignment) {
  for (size_t alignment : {size_t{1}, size_t{32}, size_t{64}, size_t{4096}}) {
    SCOPED_TRACE(alignment);
    GgufWriter w;
    w.set("general.architecture", MetaValue::of_string("llama"));
    w.set_all(every_type());
    w.set_alignment(alignment);
    std::vector<float> f32(3 * 5);
    for (size_t i = 0; i < f32.size(); ++i) f32[i] = float(i) * 0.25f;
    std::vector<uint8_t> q4(2 * 18, 0xab), q6k(210 * 2, 0x5c), f16(7 * 2, 0x11);
    w.add_tensor("a.f32", GgmlType::F32, {3, 5}, f32.data(), f32.size() * 4);
    w.add_tensor("b.q4_0", GgmlType::Q4_0, {32, 1, 2}, q4.data(), q4.size());
    w.add_tensor("c.q6_k", GgmlType::Q6_K, {256, 2}, q6k.data(), q6k.size());
    w.add_tensor("d.f16", GgmlType::F16, {7}, f16.data(), f16.size());
    w.add_tensor("e.filled", GgmlType::I8, {2, 2, 2, 3}, [](uint8_t* dst, size_t n) {
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i + 1);
    });
    test::TempDir dir;
    w.write(dir.file("m.gguf"));
    auto bytes = w.to_bytes();
    auto mf = ModelFile::open(dir.file("m.gguf"));
    EXPECT_EQ(mf->file_bytes(), bytes.size());
    Metadata want = every_type();
    for (const auto& [k, v] : want.entries()) {
      SCOPED_TRACE(k);
      ASSERT_TRUE(mf->metadata().has(k));
      EXPECT_TRUE(mf->metadata().get(k) == v);
    }
    if (alignment != 32) {
      EXPECT_EQ(mf->metadata().get("general.alignment").type(), GgufType::UINT32);
    }
    EXPECT_EQ(mf->metadata().get("t.u64").as_uint64(), 18000000000000000000ull);
    EXPECT_THROW(mf->metadata().get("t.u64").as_int(), Error);
    EXPECT_EQ(mf->metadata().get("t.nested2").as_array()[1].as_array()[0].as_ints(),
              (std::vector<int64_t>{1}));
    ASSERT_EQ(mf->tensors().size(), 5u);
    EXPECT_EQ(mf->tensors()[0].name, "a.f32");  // file order kept
    const TensorView* a = mf->find("a.f32");
    EXPECT_EQ(a->ne, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(std::memcmp(a->data, f32.data(), a->n_bytes), 0);
    EXPECT_EQ(mf->find("b.q4_0")->ne, (std::vector<int64_t>{32, 1, 2}));
    EXPECT_EQ(std::memcmp(mf->find("c.q6_k")->data, q6k.data(), q6k.size()), 0);
    EXPECT_EQ(mf->find("d.f16")->n_bytes, 14u);
    const TensorView* e = mf->find("e.filled");
    EXPECT_EQ(e->n_elements(), 24);
    EXPECT_EQ(e->data[23], 24);
    for (const auto& t : mf->tensors())
      EXPECT_EQ((t.data - mf->mapped(0).data()) % alignment, 0u) << t.name;
    // The in-memory reader agrees with the file reader.
    auto mem = ModelFile::from_gguf_bytes(bytes.data(), bytes.size(), "mem");
    EXPECT_EQ(mem->tensors().size(), 5u);
  }
}

TEST(GgufWriter, RefusesBadTensors) {
  GgufWriter w;
  std::vector<uint8_t> d(64);
  EXPECT_THROW(w.add_tensor("x", GgmlType::Q4_0, {16}, d.data(), 9), Error);  // partial block
  EXPECT_THROW(w.add_tensor("x", GgmlType::F32, {4}, d.data(), 15), Error);   // wrong size
  EXPECT_THROW(w.add_tensor("x", GgmlType::F32, {0}, d.data(), 0), Error);
  EXPECT_THROW(w.add_tensor("x", GgmlType::F32, {1, 1, 1, 1, 1}, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), GgmlType::F32, {1}, d.data(), 4), Error);
  w.add_tensor("x", GgmlType::F32, {4}, d.data(), 16);
  EXPECT_THROW(w.add_tensor("x", GgmlType::F32, {4}, d.data(), 16), Error);
  EXPECT_THROW(w.set_alignment(48), Error);
  w.set("bad", MetaValue::of_array(GgufType::INT32, A{MetaValue::of_string("s")}));
  EXPECT_THROW(w.to_bytes(), Error);
}

// Three parts as gguf-split writes them: split.no (u16, from 0), split.count (u16) and
// split.tensors.count (i32) in every part; metadata in full only in part 1.
void write_split(const test::TempDir& dir, const std::string& prefix, int n_parts,
                 const std::vector<float>& data, int tensors_count_override = -1) {
  for (int p = 0; p < n_parts; ++p) {
    GgufWriter w;
    if (p == 0) w.set("general.architecture", MetaValue::of_string("llama"));
    w.set("split.no", MetaValue::of_int(GgufType::UINT16, p));
    w.set("split.count", MetaValue::of_int(GgufType::UINT16, n_parts));
    w.set("split.tensors.count",
          MetaValue::of_int(GgufType::INT32, tensors_count_override >= 0 ? tensors_count_override : 2 * n_parts));
    for (int k = 0; k < 2; ++k)
      w.add_tensor("t" + std::to_string(p * 2 + k), GgmlType::F32, {4}, data.data() + 4 * (p * 2 + k), 16);
    w.write(gguf::split_path(dir.file(prefix), p + 1, n_parts));
  }
}

TEST(GgufWriter, SplitModelOpensAsOne) {
  test::TempDir dir;
  std::vector<float> data(24);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  write_split(dir, "model", 3, data);
  auto mf = ModelFile::open(dir.file("model-00001-of-00003.gguf"));
  EXPECT_EQ(mf->n_files(), 3u);
  ASSERT_EQ(mf->tensors().size(), 6u);
  EXPECT_EQ(mf->metadata().get_string("general.architecture"), "llama");
  for (int i = 0; i < 6; ++i) {
    const TensorView* t = mf->find("t" + std::to_string(i));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(reinterpret_cast<const float*>(t->data)[3], float(i * 4 + 3));
  }
  // Opening a later part opens the whole model too.
  EXPECT_EQ(ModelFile::open(dir.file("model-00002-of-00003.gguf"))->tensors().size(), 6u);
}

TEST(GgufWriter, SplitModelErrors) {
  test::TempDir dir;
  std::vector<float> data(24);
  write_split(dir, "gone", 3, data);
  std::filesystem::remove(dir.file("gone-00003-of-00003.gguf"));
  EXPECT_THROW(ModelFile::open(dir.file("gone-00001-of-00003.gguf")), Error);
  write_split(dir, "count", 3, data, 5);
  EXPECT_THROW(ModelFile::open(dir.file("count-00001-of-00003.gguf")), Error);
  // split.count says 3 but the name says 2 parts.
  write_split(dir, "name", 3, data);
  std::filesystem::rename(dir.file("name-00001-of-00003.gguf"), dir.file("renamed-00001-of-00002.gguf"));
  std::filesystem::rename(dir.file("name-00002-of-00003.gguf"), dir.file("renamed-00002-of-00002.gguf"));
  EXPECT_THROW(ModelFile::open(dir.file("renamed-00001-of-00002.gguf")), Error);
  // A split part under a plain name.
  write_split(dir, "plain", 2, data);
  std::filesystem::rename(dir.file("plain-00001-of-00002.gguf"), dir.file("plain.gguf"));
  EXPECT_THROW(ModelFile::open(dir.file("plain.gguf")), Error);
}

}  // namespace
}  // namespace frink
