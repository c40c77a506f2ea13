// A test-only GGUF reader that finds one tensor's bytes, so the quant tests do not depend
// on src/format (a layer above quant). Reads the header (magic, version 3, u64 counts),
// skips every metadata value by its type, keeps general.alignment (default 32), reads the
// tensor infos and returns the named tensor's type and bytes. Bad input throws.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace frink::test {

struct LocatedTensor {
  uint32_t type = 0;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // the tensor's bytes, copied out of the file
};

class GgufTensorLocator {
 public:
  explicit GgufTensorLocator(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + p.string());
    data_.assign(std::istreambuf_iterator<char>(f), {});
  }

  // Parses the header and tensor infos; throws on a malformed header.
  void parse() {
    pos_ = 0;
    if (get<uint32_t>() != 0x46554747u) throw std::runtime_error("not a GGUF file");
    if (get<uint32_t>() != 3) throw std::runtime_error("GGUF version is not 3");
    const uint64_t n_tensors = get<uint64_t>();
    const uint64_t n_kv = get<uint64_t>();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t type = get<uint32_t>();
      if (key == "general.alignment" && type == 4) {
        alignment = get<uint32_t>();
      } else {
        skip_value(type);
      }
    }
    infos_.clear();
    for (uint64_t i = 0; i < n_tensors; ++i) {
      Info t;
      t.name = str();
      const uint32_t n_dims = get<uint32_t>();
      for (uint32_t d = 0; d < n_dims; ++d) t.shape.push_back(static_cast<int64_t>(get<uint64_t>()));
      t.type = get<uint32_t>();
      t.offset = get<uint64_t>();
      infos_.push_back(std::move(t));
    }
    data_start_ = (pos_ + alignment - 1) / alignment * alignment;
  }

  std::vector<std::string> names() {
    if (infos_.empty()) parse();
    std::vector<std::string> out;
    for (const auto& t : infos_) out.push_back(t.name);
    return out;
  }

  // row_bytes(type, n_elems) converts an element count to a byte count.
  template <typename RowBytes>
  LocatedTensor find(const std::string& name, RowBytes row_bytes) {
    if (infos_.empty()) parse();
    for (const auto& t : infos_) {
      if (t.name != name) continue;
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      const size_t bytes = row_bytes(t.type, n);
      const uint64_t begin = data_start_ + t.offset;
      if (begin + bytes > data_.size()) throw std::runtime_error("tensor runs past the end of the file");
      LocatedTensor out{t.type, t.shape, {}};
      out.bytes.assign(data_.begin() + static_cast<std::ptrdiff_t>(begin),
                       data_.begin() + static_cast<std::ptrdiff_t>(begin + bytes));
      return out;
    }
    throw std::runtime_error("no tensor named " + name);
  }

 private:
  template <typename T>
  T get() {
    if (pos_ + sizeof(T) > data_.size()) throw std::runtime_error("truncated GGUF header");
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string str() {
    const uint64_t len = get<uint64_t>();
    if (pos_ + len > data_.size()) throw std::runtime_error("truncated GGUF string");
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  // GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
  // 9 array (u32 element type, u64 count), 10 u64, 11 i64, 12 f64.
  void skip_value(uint32_t type) {
    static constexpr int kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      str();
    } else if (type == 9) {
      const uint32_t elem = get<uint32_t>();
      const uint64_t count = get<uint64_t>();
      for (uint64_t i = 0; i < count; ++i) skip_value(elem);
    } else if (type < 13) {
      pos_ += kSize[type];
    } else {
      throw std::runtime_error("unknown GGUF value type " + std::to_string(type));
    }
  }

  struct Info {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    uint64_t offset;
  };
  std::vector<uint8_t> data_;
  std::vector<Info> infos_;
  uint64_t data_start_ = 0;
  size_t pos_ = 0;
};

}  // namespace frink::test
