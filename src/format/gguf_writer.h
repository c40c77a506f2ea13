// GGUF v3 writer: metadata of every type (nested arrays too), tensors of any GgmlType, any
// power-of-two alignment. Files it writes load in llama.cpp (names < 64 bytes, offsets
// aligned, general.alignment written as u32 when it is not 32).
// Tensor bytes are streamed at write() time, one tensor at a time, from a pointer the caller
// keeps alive or from a callback that fills them, so a multi-GB model is never held twice.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "format/metadata.h"
#include "quant/ggml_type.h"

namespace frink {

class GgufWriter {
 public:
  // Fills exactly n_bytes of the tensor's data at dst.
  using FillFn = std::function<void(uint8_t* dst, size_t n_bytes)>;

  // Keys are written in the order they were first set; setting a key again replaces its value.
  void set(const std::string& key, MetaValue v);
  void set_all(const Metadata& m);  // every entry of m, in m's (sorted) order
  // Power of two; stored as general.alignment (u32). The default is GGUF's 32.
  void set_alignment(size_t alignment);
  size_t alignment() const { return alignment_; }

  // ne in ggml order (ne[0] innermost), 1 to 4 dims, each > 0, ne[0] a multiple of the type's
  // block. `data` (n_bytes, checked against the shape) must stay valid until write().
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, const void* data,
                  size_t n_bytes);
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, FillFn fill);
  size_t n_tensors() const { return tensors_.size(); }

  // Throws frink::Error when the file can't be written.
  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;
  void write(std::ostream& os) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    size_t n_bytes;
    const void* data;  // or null, with fill set
    FillFn fill;
  };
  size_t check_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne) const;

  std::vector<std::pair<std::string, MetaValue>> kv_;
  std::vector<Tensor> tensors_;
  size_t alignment_ = 32;
};

}  // namespace frink
