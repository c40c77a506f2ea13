// MetaValue and Metadata: typed access to GGUF key/values. Every wrong-kind access throws
// frink::Error naming what was expected and what was stored.
#include "format/metadata.h"

#include <limits>

#include "core/error.h"

namespace frink {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "u8";
    case GgufType::INT8: return "i8";
    case GgufType::UINT16: return "u16";
    case GgufType::INT16: return "i16";
    case GgufType::UINT32: return "u32";
    case GgufType::INT32: return "i32";
    case GgufType::FLOAT32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::UINT64: return "u64";
    case GgufType::INT64: return "i64";
    case GgufType::FLOAT64: return "f64";
  }
  return "unknown";
}

namespace {

bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
      return true;
    default:
      return false;
  }
}

[[noreturn]] void wrong_kind(const char* want, GgufType have) {
  fail("metadata value is {}, expected {}", gguf_type_name(have), want);
}

}  // namespace

MetaValue MetaValue::of_int(GgufType t, int64_t v) {
  if (t == GgufType::UINT64) {
    if (v < 0) fail("negative value {} for a u64 metadata value", v);
    return of_uint64(static_cast<uint64_t>(v));
  }
  FRINK_ASSERT(is_int_type(t) || t == GgufType::BOOL, "of_int with type {}", gguf_type_name(t));
  MetaValue m;
  m.type_ = t;
  m.v_ = t == GgufType::BOOL ? int64_t{v != 0} : v;
  return m;
}

MetaValue MetaValue::of_uint64(uint64_t v) {
  MetaValue m;
  m.type_ = GgufType::UINT64;
  m.v_ = v;
  return m;
}

MetaValue MetaValue::of_float(GgufType t, double v) {
  FRINK_ASSERT(t == GgufType::FLOAT32 || t == GgufType::FLOAT64, "of_float with type {}",
               gguf_type_name(t));
  MetaValue m;
  m.type_ = t;
  m.v_ = v;
  return m;
}

MetaValue MetaValue::of_bool(bool v) { return of_int(GgufType::BOOL, v); }

MetaValue MetaValue::of_string(std::string v) {
  MetaValue m;
  m.type_ = GgufType::STRING;
  m.v_ = std::move(v);
  return m;
}

MetaValue MetaValue::of_array(GgufType elem_type, Array items) {
  MetaValue m;
  m.type_ = GgufType::ARRAY;
  m.elem_type_ = elem_type;
  m.v_ = std::make_shared<const Array>(std::move(items));
  return m;
}

bool MetaValue::is_integer() const { return is_int_type(type_); }
bool MetaValue::is_float() const {
  return type_ == GgufType::FLOAT32 || type_ == GgufType::FLOAT64;
}

int64_t MetaValue::as_int() const {
  if (type_ == GgufType::UINT64) {
    uint64_t u = std::get<uint64_t>(v_);
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("metadata u64 value {} does not fit in i64", u);
    return static_cast<int64_t>(u);
  }
  if (!is_integer() && type_ != GgufType::BOOL) wrong_kind("an integer", type_);
  return std::get<int64_t>(v_);
}

uint64_t MetaValue::as_uint64() const {
  if (type_ == GgufType::UINT64) return std::get<uint64_t>(v_);
  int64_t v = as_int();
  if (v < 0) fail("metadata value {} is negative, expected an unsigned integer", v);
  return static_cast<uint64_t>(v);
}

double MetaValue::as_float() const {
  if (is_float()) return std::get<double>(v_);
  if (type_ == GgufType::UINT64) return static_cast<double>(std::get<uint64_t>(v_));
  if (is_integer()) return static_cast<double>(std::get<int64_t>(v_));
  wrong_kind("a number", type_);
}

bool MetaValue::as_bool() const {
  if (type_ == GgufType::BOOL || is_integer()) return as_uint64_or_int_nonzero();
  wrong_kind("a bool", type_);
}

bool MetaValue::as_uint64_or_int_nonzero() const {
  if (type_ == GgufType::UINT64) return std::get<uint64_t>(v_) != 0;
  return std::get<int64_t>(v_) != 0;
}

const std::string& MetaValue::as_string() const {
  if (type_ != GgufType::STRING) wrong_kind("a string", type_);
  return std::get<std::string>(v_);
}

const MetaValue::Array& MetaValue::as_array() const {
  if (type_ != GgufType::ARRAY) wrong_kind("an array", type_);
  return *std::get<std::shared_ptr<const Array>>(v_);
}

size_t MetaValue::size() const { return as_array().size(); }

std::vector<std::string> MetaValue::as_strings() const {
  const Array& a = as_array();
  std::vector<std::string> out;
  out.reserve(a.size());
  for (const auto& v : a) out.push_back(v.as_string());
  return out;
}

std::vector<int64_t> MetaValue::as_ints() const {
  const Array& a = as_array();
  std::vector<int64_t> out;
  out.reserve(a.size());
  for (const auto& v : a) out.push_back(v.as_int());
  return out;
}

std::vector<float> MetaValue::as_floats() const {
  const Array& a = as_array();
  std::vector<float> out;
  out.reserve(a.size());
  for (const auto& v : a) out.push_back(static_cast<float>(v.as_float()));
  return out;
}

bool MetaValue::operator==(const MetaValue& o) const {
  if (type_ != o.type_) return false;
  if (type_ != GgufType::ARRAY) return v_ == o.v_;
  return elem_type_ == o.elem_type_ && as_array() == o.as_array();
}

void Metadata::set(std::string key, MetaValue v) { kv_.insert_or_assign(std::move(key), std::move(v)); }

const MetaValue* Metadata::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const MetaValue& Metadata::get(std::string_view key) const {
  const MetaValue* v = find(key);
  if (!v) fail("missing metadata key {}", key);
  return *v;
}

// The Metadata accessors add the key to a kind error, so the line says which key was wrong.
#define FRINK_META_GET(expr)                                          \
  try {                                                                \
    return expr;                                                       \
  } catch (const Error& e) {                                           \
    fail("metadata key {}: {}", key, e.what());                        \
  }

int64_t Metadata::get_int(std::string_view key) const { FRINK_META_GET(get(key).as_int()) }
double Metadata::get_float(std::string_view key) const { FRINK_META_GET(get(key).as_float()) }
bool Metadata::get_bool(std::string_view key) const { FRINK_META_GET(get(key).as_bool()) }
const std::string& Metadata::get_string(std::string_view key) const {
  const MetaValue& v = get(key);
  if (v.type() != GgufType::STRING)
    fail("metadata key {}: value is {}, expected a string", key, gguf_type_name(v.type()));
  return v.as_string();
}

std::optional<int64_t> Metadata::try_int(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  FRINK_META_GET(get(key).as_int())
}
std::optional<double> Metadata::try_float(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  FRINK_META_GET(get(key).as_float())
}
std::optional<bool> Metadata::try_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  FRINK_META_GET(get(key).as_bool())
}
std::optional<std::string> Metadata::try_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}

#undef FRINK_META_GET

}  // namespace frink
