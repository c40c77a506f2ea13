#include "format/gguf_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "format/gguf_reader.h"

namespace frink {

namespace {

// llama.cpp's GGML_MAX_NAME is 64 including the NUL; its reader refuses longer names.
constexpr size_t kMaxNameBytes = 63;

template <typename T>
void put(std::ostream& os, T v) {
  os.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_string(std::ostream& os, const std::string& s) {
  put<uint64_t>(os, s.size());
  os.write(s.data(), static_cast<std::streamsize>(s.size()));
}

template <typename T>
void put_int(std::ostream& os, const MetaValue& v, const std::string& key) {
  int64_t x = v.as_int();
  if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      (x > 0 && static_cast<uint64_t>(x) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
    fail("metadata key {}: value {} does not fit in {}", key, x, gguf_type_name(v.type()));
  put<T>(os, static_cast<T>(x));
}

void put_value(std::ostream& os, const MetaValue& v, const std::string& key) {
  switch (v.type()) {
    case GgufType::UINT8: put_int<uint8_t>(os, v, key); break;
    case GgufType::INT8: put_int<int8_t>(os, v, key); break;
    case GgufType::UINT16: put_int<uint16_t>(os, v, key); break;
    case GgufType::INT16: put_int<int16_t>(os, v, key); break;
    case GgufType::UINT32: put_int<uint32_t>(os, v, key); break;
    case GgufType::INT32: put_int<int32_t>(os, v, key); break;
    case GgufType::INT64: put<int64_t>(os, v.as_int()); break;
    case GgufType::UINT64: put<uint64_t>(os, v.as_uint64()); break;
    case GgufType::FLOAT32: put<float>(os, static_cast<float>(v.as_float())); break;
    case GgufType::FLOAT64: put<double>(os, v.as_float()); break;
    case GgufType::BOOL: put<uint8_t>(os, v.as_bool() ? 1 : 0); break;
    case GgufType::STRING: put_string(os, v.as_string()); break;
    case GgufType::ARRAY: {
      put<uint32_t>(os, static_cast<uint32_t>(v.elem_type()));
      put<uint64_t>(os, v.size());
      for (const auto& item : v.as_array()) {
        if (item.type() != v.elem_type())
          fail("metadata key {}: array of {} holds a {}", key, gguf_type_name(v.elem_type()),
               gguf_type_name(item.type()));
        put_value(os, item, key);
      }
      break;
    }
  }
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void pad(std::ostream& os, size_t from, size_t to) {
  static const char kZeros[256] = {};
  while (from < to) {
    size_t n = std::min<size_t>(to - from, sizeof kZeros);
    os.write(kZeros, static_cast<std::streamsize>(n));
    from += n;
  }
}

}  // namespace

void GgufWriter::set(const std::string& key, MetaValue v) {
  if (key == "general.alignment") {
    uint64_t a = v.as_uint64();
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
      fail("general.alignment {} is not a power of two in [1, 2^30]", a);
    alignment_ = static_cast<size_t>(a);
    v = MetaValue::of_int(GgufType::UINT32, static_cast<int64_t>(a));
  }
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::set_all(const Metadata& m) {
  for (const auto& [k, v] : m.entries()) set(k, v);
}

void GgufWriter::set_alignment(size_t alignment) {
  set("general.alignment", MetaValue::of_int(GgufType::UINT32, static_cast<int64_t>(alignment)));
}

size_t GgufWriter::check_tensor(const std::string& name, GgmlType type,
                                const std::vector<int64_t>& ne) const {
  if (name.empty() || name.size() > kMaxNameBytes)
    fail("tensor name \"{}\" must be 1 to {} bytes", name, kMaxNameBytes);
  for (const auto& t : tensors_)
    if (t.name == name) fail("tensor {} added twice", name);
  if (ne.empty() || ne.size() > 4) fail("tensor {} has {} dimensions (1 to 4)", name, ne.size());
  const auto& info = ggml_type_info(type);
  uint64_t n_elems = 1;
  for (int64_t d : ne) {
    if (d <= 0) fail("tensor {} has a dimension of {}", name, d);
    if (__builtin_mul_overflow(n_elems, static_cast<uint64_t>(d), &n_elems))
      fail("tensor {} has too many elements", name);
  }
  if (ne[0] % info.block_elems != 0)
    fail("tensor {}: row of {} elements is not a multiple of {}'s block of {}", name, ne[0],
         info.name, info.block_elems);
  return static_cast<size_t>(n_elems / info.block_elems) * info.block_bytes;
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                            const void* data, size_t n_bytes) {
  size_t want = check_tensor(name, type, ne);
  if (n_bytes != want) fail("tensor {}: {} bytes given, its shape needs {}", name, n_bytes, want);
  tensors_.push_back({name, type, std::move(ne), want, data, nullptr});
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                            FillFn fill) {
  size_t want = check_tensor(name, type, ne);
  tensors_.push_back({name, type, std::move(ne), want, nullptr, std::move(fill)});
}

void GgufWriter::write(std::ostream& os) const {
  size_t pos = 0;
  std::ostringstream head;
  put<uint32_t>(head, gguf::kMagic);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(head, k);
    put<uint32_t>(head, static_cast<uint32_t>(v.type()));
    put_value(head, v, k);
  }
  size_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t.n_bytes, alignment_);
  }
  std::string h = head.str();
  os.write(h.data(), static_cast<std::streamsize>(h.size()));
  pos = h.size();
  if (tensors_.empty()) return;  // as llama.cpp: a vocab-only file ends after its header
  pad(os, pos, align_up(pos, alignment_));
  std::vector<uint8_t> buf;
  for (const auto& t : tensors_) {
    if (t.data) {
      os.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.n_bytes));
    } else {
      buf.assign(t.n_bytes, 0);
      t.fill(buf.data(), buf.size());
      os.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    }
    pad(os, t.n_bytes, align_up(t.n_bytes, alignment_));
  }
}

void GgufWriter::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("cannot write {}: {}", path, std::strerror(errno));
  write(f);
  f.flush();
  if (!f) fail("cannot write {}: {}", path, std::strerror(errno));
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::ostringstream ss;
  write(ss);
  std::string s = ss.str();
  return {s.begin(), s.end()};
}

}  // namespace frink
