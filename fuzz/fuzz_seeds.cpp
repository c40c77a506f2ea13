// Writes the fuzzers' seed corpus: small GGUF files from GgufWriter (every metadata type,
// nested arrays, several tensor types and alignments) and hand-made SafeTensors files.
// Usage: fuzz_seeds GGUF_DIR SAFETENSORS_DIR. Generated at run time, never committed.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "format/gguf_writer.h"

using frink::GgmlType;
using frink::GgufType;
using frink::MetaValue;

namespace {

void write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

frink::GgufWriter model(size_t alignment) {
  frink::GgufWriter w;
  w.set("general.architecture", MetaValue::of_string("llama"));
  w.set("llama.block_count", MetaValue::of_int(GgufType::UINT32, 1));
  w.set("f", MetaValue::of_float(GgufType::FLOAT32, 1.5));
  w.set("d", MetaValue::of_float(GgufType::FLOAT64, -2.5));
  w.set("b", MetaValue::of_bool(true));
  w.set("i8", MetaValue::of_int(GgufType::INT8, -3));
  w.set("u16", MetaValue::of_int(GgufType::UINT16, 7));
  w.set("i64", MetaValue::of_int(GgufType::INT64, -1));
  w.set("u64", MetaValue::of_uint64(9));
  w.set("tokens", MetaValue::of_array(GgufType::STRING, {MetaValue::of_string("a"), MetaValue::of_string("bc")}));
  w.set("nested", MetaValue::of_array(GgufType::ARRAY,
                                      {MetaValue::of_array(GgufType::INT32, {MetaValue::of_int(GgufType::INT32, 5)})}));
  if (alignment != 32) w.set_alignment(alignment);
  auto fill = [](uint8_t* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i * 7);
  };
  w.add_tensor("token_embd.weight", GgmlType::F32, {4, 3}, fill);
  w.add_tensor("blk.0.attn_q.weight", GgmlType::Q4_0, {32, 2}, fill);
  w.add_tensor("blk.0.ffn_up.weight", GgmlType::Q4_K, {256, 1}, fill);
  w.add_tensor("output_norm.weight", GgmlType::F16, {4}, fill);
  return w;
}

std::string st(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + std::string(data_bytes, '\x01');
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_seeds GGUF_DIR SAFETENSORS_DIR\n");
    return 2;
  }
  std::filesystem::path gg(argv[1]), sf(argv[2]);
  std::filesystem::create_directories(gg);
  std::filesystem::create_directories(sf);
  for (size_t a : {size_t{32}, size_t{8}, size_t{64}}) {
    auto b = model(a).to_bytes();
    write(gg / ("model_align" + std::to_string(a) + ".gguf"), std::string(b.begin(), b.end()));
  }
  frink::GgufWriter vocab_only;
  vocab_only.set("general.architecture", MetaValue::of_string("llama"));
  auto b = vocab_only.to_bytes();
  write(gg / "vocab_only.gguf", std::string(b.begin(), b.end()));
  write(sf / "one.safetensors",
        st(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
           R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})", 22));
  write(sf / "f16.safetensors", st(R"({"w":{"dtype":"F16","shape":[1,2,1,2],"data_offsets":[0,8]}})", 8));
  write(sf / "empty.safetensors", st("{}", 0));
  return 0;
}
