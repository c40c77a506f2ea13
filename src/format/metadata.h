// Key/value metadata in GGUF's vocabulary. A GGUF file fills it directly; a SafeTensors
// folder's config.json is translated into the same keys (src/model/hf_config) so everything
// above this layer reads one kind of metadata.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace frink {

// GGUF's value type ids (gguf.h, enum gguf_type).
enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value: a scalar, a string, or an array (arrays may nest). Accessors throw
// frink::Error naming the expected kind when the stored value is not of that kind, so a
// model file with a wrong-typed key gets one clear line, not garbage.
class MetaValue {
 public:
  using Array = std::vector<MetaValue>;
  MetaValue() = default;
  static MetaValue of_int(GgufType t, int64_t v);     // any integer type or BOOL
  static MetaValue of_uint64(uint64_t v);
  static MetaValue of_float(GgufType t, double v);    // FLOAT32 / FLOAT64
  static MetaValue of_bool(bool v);
  static MetaValue of_string(std::string v);
  static MetaValue of_array(GgufType elem_type, Array items);

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::ARRAY; }
  GgufType elem_type() const { return elem_type_; }  // for arrays
  bool is_integer() const;
  bool is_float() const;

  int64_t as_int() const;          // integers and bools (UINT64 above INT64_MAX throws)
  uint64_t as_uint64() const;
  double as_float() const;         // floats and integers
  bool as_bool() const;            // BOOL or integer
  const std::string& as_string() const;
  const Array& as_array() const;
  size_t size() const;             // array length

  // Typed copies of an array's elements (throws if an element is of the wrong kind).
  std::vector<std::string> as_strings() const;
  std::vector<int64_t> as_ints() const;
  std::vector<float> as_floats() const;

  // Same type (and element type for arrays) and same value; used by round-trip tests.
  bool operator==(const MetaValue& o) const;

 private:
  bool as_uint64_or_int_nonzero() const;

  GgufType type_ = GgufType::UINT8;
  GgufType elem_type_ = GgufType::UINT8;
  std::variant<int64_t, uint64_t, double, std::string, std::shared_ptr<const Array>> v_;
};

class Metadata {
 public:
  void set(std::string key, MetaValue v);
  const MetaValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Required accessors throw frink::Error "missing metadata key K" when absent.
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const MetaValue& get(std::string_view key) const;

  std::optional<int64_t> try_int(std::string_view key) const;
  std::optional<double> try_float(std::string_view key) const;
  std::optional<bool> try_bool(std::string_view key) const;
  std::optional<std::string> try_string(std::string_view key) const;

  const std::map<std::string, MetaValue, std::less<>>& entries() const { return kv_; }

 private:
  std::map<std::string, MetaValue, std::less<>> kv_;
};

}  // namespace frink
