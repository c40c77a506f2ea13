// GGUF reader: map and walk, with every length checked against the bytes left first.
// Layout (docs/gguf.md): magic u32, version u32, n_tensors u64, n_kv u64, then n_kv key/values
// (string key, u32 type, value), then n_tensors tensor infos (string name, u32 n_dims,
// u64 ne[n_dims], u32 type, u64 offset), padding to general.alignment, then tensor data.
// Strings are u64 length + bytes (no NUL). Version 1 used u32 counts and is refused.
#include "format/gguf_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>
#include <unordered_set>

#include "core/error.h"
#include "format/name_util.h"

namespace frink::gguf {

namespace {

// Arrays may nest; beyond this depth a file is hostile (llama.cpp itself nests at most 1).
constexpr int kMaxNesting = 8;
constexpr uint32_t kMaxDims = 4;

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t n, const std::string& name) : p_(data), n_(n), name_(name) {}

  size_t pos() const { return pos_; }
  size_t left() const { return n_ - pos_; }
  const std::string& name() const { return name_; }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > left())
      fail("{}: {} of {} bytes at offset {} runs past the end of the file ({} bytes)", name_, what,
           len, pos_ - 8, n_);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  // A count of items each at least `min_item_bytes` long must fit in what is left.
  void check_count(uint64_t count, size_t min_item_bytes, const char* what) {
    if (min_item_bytes > 0 && count > left() / min_item_bytes)
      fail("{}: {} {} at offset {} cannot fit in the {} bytes left", name_, what, count, pos_,
           left());
  }

  void need(size_t n, const char* what) {
    if (n > left())
      fail("{}: file ends at byte {} while reading {} at offset {}", name_, n_, what, pos_);
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& name_;
};

size_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: return 8;   // at least its length field
    case GgufType::ARRAY: return 12;   // at least its type and count
  }
  return 0;
}

GgufType read_type(Cursor& c, const std::string& key) {
  uint32_t t = c.read<uint32_t>("a value type");
  if (t > static_cast<uint32_t>(GgufType::FLOAT64))
    fail("{}: metadata key {} has unknown value type {}", c.name(), printable(key), t);
  return static_cast<GgufType>(t);
}

MetaValue read_value(Cursor& c, GgufType t, const std::string& key, int depth) {
  switch (t) {
    case GgufType::UINT8: return MetaValue::of_int(t, c.read<uint8_t>("a u8"));
    case GgufType::INT8: return MetaValue::of_int(t, c.read<int8_t>("an i8"));
    case GgufType::UINT16: return MetaValue::of_int(t, c.read<uint16_t>("a u16"));
    case GgufType::INT16: return MetaValue::of_int(t, c.read<int16_t>("an i16"));
    case GgufType::UINT32: return MetaValue::of_int(t, c.read<uint32_t>("a u32"));
    case GgufType::INT32: return MetaValue::of_int(t, c.read<int32_t>("an i32"));
    case GgufType::UINT64: return MetaValue::of_uint64(c.read<uint64_t>("a u64"));
    case GgufType::INT64: return MetaValue::of_int(t, c.read<int64_t>("an i64"));
    case GgufType::FLOAT32: return MetaValue::of_float(t, c.read<float>("an f32"));
    case GgufType::FLOAT64: return MetaValue::of_float(t, c.read<double>("an f64"));
    case GgufType::BOOL: {
      uint8_t b = c.read<uint8_t>("a bool");
      if (b > 1) fail("{}: metadata key {} has bool value {}", c.name(), printable(key), b);
      return MetaValue::of_bool(b != 0);
    }
    case GgufType::STRING: return MetaValue::of_string(c.read_string("a string"));
    case GgufType::ARRAY: {
      if (depth >= kMaxNesting)
        fail("{}: metadata key {} nests arrays deeper than {}", c.name(), printable(key),
             kMaxNesting);
      GgufType elem = read_type(c, key);
      uint64_t count = c.read<uint64_t>("an array length");
      c.check_count(count, scalar_bytes(elem), "array length");
      MetaValue::Array items;
      items.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i) items.push_back(read_value(c, elem, key, depth + 1));
      return MetaValue::of_array(elem, std::move(items));
    }
  }
  fail("{}: metadata key {} has unknown value type", c.name(), printable(key));
}

// Reads one tensor info; its data pointer is filled once the data section is known.
struct TensorInfo {
  TensorView view;
  uint64_t offset;
};

TensorInfo read_tensor_info(Cursor& c) {
  TensorInfo ti;
  TensorView& t = ti.view;
  t.name = c.read_string("a tensor name");
  const std::string& nm = c.name();
  uint32_t n_dims = c.read<uint32_t>("a tensor's n_dims");
  if (n_dims > kMaxDims)
    fail("{}: tensor {} has {} dimensions (at most {})", nm, printable(t.name), n_dims, kMaxDims);
  int64_t n_elems = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t ne = c.read<uint64_t>("a tensor dimension");
    if (ne == 0 || ne > static_cast<uint64_t>(INT64_MAX))
      fail("{}: tensor {} has dimension {} = {}", nm, printable(t.name), d, ne);
    if (__builtin_mul_overflow(n_elems, static_cast<int64_t>(ne), &n_elems))
      fail("{}: tensor {} has an element count that overflows", nm, printable(t.name));
    t.ne.push_back(static_cast<int64_t>(ne));
  }
  if (t.ne.empty()) t.ne.push_back(1);  // a scalar: one element
  uint32_t type_id = c.read<uint32_t>("a tensor type");
  auto info = ggml_type_info(type_id);
  if (!info) fail("{}: tensor {} has unknown type id {}", nm, printable(t.name), type_id);
  t.type = info->type;
  if (t.ne[0] % info->block_elems != 0)
    fail("{}: tensor {} has rows of {} elements, not a multiple of {}'s block of {}", nm,
         printable(t.name), t.ne[0], info->name, info->block_elems);
  uint64_t n_blocks = static_cast<uint64_t>(n_elems / info->block_elems);
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(n_blocks, static_cast<uint64_t>(info->block_bytes), &n_bytes))
    fail("{}: tensor {} has a byte size that overflows", nm, printable(t.name));
  t.n_bytes = static_cast<size_t>(n_bytes);
  t.data = nullptr;
  ti.offset = c.read<uint64_t>("a tensor data offset");
  return ti;
}

size_t read_alignment(const Metadata& meta, const std::string& name) {
  const MetaValue* v = meta.find("general.alignment");
  if (!v) return kDefaultAlignment;
  if (!v->is_integer()) fail("{}: general.alignment is a {}, expected u32", name, gguf_type_name(v->type()));
  uint64_t a = v->as_uint64();
  if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
    fail("{}: general.alignment {} is not a power of two in [1, 2^30]", name, a);
  return static_cast<size_t>(a);
}

// Places every tensor in the data section: aligned, inside the file, not overlapping.
void place_tensors(std::vector<TensorInfo>& infos, const uint8_t* data, size_t n_bytes,
                   size_t data_offset, size_t alignment, const std::string& name) {
  size_t data_bytes = n_bytes - data_offset;
  for (auto& ti : infos) {
    const TensorView& t = ti.view;
    if (ti.offset % alignment != 0)
      fail("{}: tensor {} data offset {} is not a multiple of the alignment {}", name,
           printable(t.name), ti.offset, alignment);
    if (ti.offset > data_bytes || t.n_bytes > data_bytes - ti.offset)
      fail("{}: tensor {} data [{}, {}) lies outside the {}-byte data section", name,
           printable(t.name), ti.offset, ti.offset + static_cast<uint64_t>(t.n_bytes), data_bytes);
    ti.view.data = data + data_offset + ti.offset;
  }
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(infos.size());
  for (const auto& ti : infos) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* a = by_offset[i - 1];
    const TensorInfo* b = by_offset[i];
    if (a->offset + a->view.n_bytes > b->offset)
      fail("{}: tensors {} and {} overlap in the data section", name, printable(a->view.name),
           printable(b->view.name));
  }
}

}  // namespace

GgufPart parse(const uint8_t* data, size_t n_bytes, const std::string& name) {
  Cursor c(data, n_bytes, name);
  if (n_bytes < 4 || c.read<uint32_t>("the magic") != kMagic)
    fail("{}: not a GGUF file (the first bytes are not \"GGUF\")", name);
  GgufPart part;
  part.version = c.read<uint32_t>("the version");
  if (part.version == 1)
    fail("{}: GGUF version 1 (u32 counts) is not supported; convert it with a newer llama.cpp", name);
  if (part.version == 0x02000000u || part.version == 0x03000000u)
    fail("{}: big-endian GGUF is not supported", name);
  if (part.version != 2 && part.version != 3)
    fail("{}: GGUF version {} is not supported (2 and 3 are)", name, part.version);
  uint64_t n_tensors = c.read<uint64_t>("the tensor count");
  uint64_t n_kv = c.read<uint64_t>("the metadata count");
  // Smallest key/value: 8 (key length) + 4 (type) + 1 (u8 value).
  c.check_count(n_kv, 13, "metadata count");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("a metadata key");
    GgufType t = read_type(c, key);
    MetaValue v = read_value(c, t, key, 0);
    if (part.meta.has(key)) fail("{}: duplicate metadata key {}", name, printable(key));
    part.meta.set(std::move(key), std::move(v));
  }
  // Smallest tensor info: 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
  c.check_count(n_tensors, 24, "tensor count");
  std::vector<TensorInfo> infos;
  infos.reserve(static_cast<size_t>(n_tensors));
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    infos.push_back(read_tensor_info(c));
    if (!names.insert(infos.back().view.name).second)
      fail("{}: duplicate tensor {}", name, printable(infos.back().view.name));
  }
  part.alignment = read_alignment(part.meta, name);
  size_t header_end = c.pos();
  size_t data_offset = (header_end + part.alignment - 1) / part.alignment * part.alignment;
  if (data_offset > n_bytes) {
    if (!infos.empty())
      fail("{}: file ends at byte {} before its tensor data section at {}", name, n_bytes, data_offset);
    data_offset = n_bytes;  // a vocab-only file may omit the final padding
  }
  part.data_offset = data_offset;
  place_tensors(infos, data, n_bytes, data_offset, part.alignment, name);
  part.tensors.reserve(infos.size());
  for (auto& ti : infos) part.tensors.push_back(std::move(ti.view));
  return part;
}

std::string split_path(const std::string& prefix, int part_no, int n_parts) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, part_no, n_parts);
}

namespace {

// Checks a part's split.no / split.count against its place in the file names.
void check_split_keys(const GgufPart& p, const std::string& path, int part_idx, int n_parts) {
  auto count = p.meta.try_int("split.count");
  auto no = p.meta.try_int("split.no");
  if (count && *count != n_parts)
    fail("{}: split.count is {} but the file name says {} parts", path, *count, n_parts);
  if (no && *no != part_idx)
    fail("{}: split.no is {} but the file name says part {} (split.no counts from 0)", path, *no,
         part_idx);
}

void append_part(ModelFile& out, GgufPart& part, const std::string& path,
                 std::unordered_set<std::string>& seen) {
  for (auto& t : part.tensors) {
    if (!seen.insert(t.name).second)
      fail("{}: tensor {} also appears in an earlier part", path, printable(t.name));
    out.mutable_tensors().push_back(std::move(t));
  }
}

}  // namespace

void open(const std::string& path, ModelFile& out) {
  out.set_source(FileFormat::kGguf, path);
  static const std::regex kSplitName(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  std::smatch m;
  if (!std::regex_match(path, m, kSplitName)) {
    auto f = std::make_unique<MappedFile>(path);
    GgufPart part = parse(f->data(), f->size(), path);
    if (auto n = part.meta.try_int("split.count"); n && *n > 1)
      fail("{}: split.count is {} but the name does not follow NAME-00001-of-{:05d}.gguf", path, *n, *n);
    out.set_gguf_version(part.version);
    out.mutable_metadata() = std::move(part.meta);
    std::unordered_set<std::string> seen;
    append_part(out, part, path, seen);
    out.keep_mapping(std::move(f));
    return;
  }
  const std::string prefix = m[1];
  int n_parts = std::stoi(m[3]);
  if (n_parts < 1 || std::stoi(m[2]) < 1 || std::stoi(m[2]) > n_parts)
    fail("{}: split file name has part {} of {}", path, std::string(m[2]), n_parts);
  std::unordered_set<std::string> seen;
  for (int i = 1; i <= n_parts; ++i) {
    std::string part_path = split_path(prefix, i, n_parts);
    if (!std::filesystem::exists(part_path))
      fail("{}: split part {} of {} is missing ({})", path, i, n_parts, part_path);
    auto f = std::make_unique<MappedFile>(part_path);
    GgufPart part = parse(f->data(), f->size(), part_path);
    check_split_keys(part, part_path, i - 1, n_parts);
    if (i == 1) {
      out.set_gguf_version(part.version);
      out.mutable_metadata() = std::move(part.meta);
    }
    append_part(out, part, part_path, seen);
    out.keep_mapping(std::move(f));
  }
  if (auto n = out.metadata().try_int("split.tensors.count"); n && *n != static_cast<int64_t>(out.tensors().size()))
    fail("{}: split.tensors.count is {} but the {} parts hold {} tensors", path, *n, n_parts,
         out.tensors().size());
}

}  // namespace frink::gguf
