// A model's tensors and metadata, from a GGUF file (one or split), or a SafeTensors file or
// folder. Tensor data are views into memory-mapped files (zero copy). Every view was
// bounds-checked against its file's size and its type's block size before it existed.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "format/metadata.h"
#include "quant/ggml_type.h"

namespace frink {

struct TensorView {
  std::string name;        // GGUF name ("blk.0.attn_q.weight"); SafeTensors keeps its own
  GgmlType type;
  std::vector<int64_t> ne; // ggml order: ne[0] is the contiguous (row) length; 1 to 4 dims
  const uint8_t* data;     // into the mapping
  size_t n_bytes;

  int64_t n_elements() const;
  int64_t n_rows() const { return ne.empty() ? 0 : n_elements() / ne[0]; }
  size_t row_bytes() const { return ggml_row_bytes(type, ne[0]); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes(); }
};

enum class FileFormat { kGguf, kSafeTensors };

class ModelFile {
 public:
  // Opens PATH: a .gguf (a NAME-00001-of-0000N.gguf part opens all parts as one model), a
  // .safetensors file, or a folder holding model.safetensors or model.safetensors.index.json
  // (plus config.json, whose JSON text is kept in hf_config_json()). Throws frink::Error.
  static std::unique_ptr<ModelFile> open(const std::string& path);

  // Parse an image already in memory (fuzzers, tests). Tensor views point into `data`, which
  // must outlive the result; `name` starts error lines. Throws frink::Error.
  static std::unique_ptr<ModelFile> from_gguf_bytes(const uint8_t* data, size_t n_bytes,
                                                    const std::string& name);
  static std::unique_ptr<ModelFile> from_safetensors_bytes(const uint8_t* data, size_t n_bytes,
                                                           const std::string& name);

  FileFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const Metadata& metadata() const { return meta_; }
  Metadata& mutable_metadata() { return meta_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(std::string_view name) const;
  uint32_t gguf_version() const { return gguf_version_; }  // 0 for SafeTensors
  size_t file_bytes() const;                               // all parts together
  size_t n_files() const { return files_.size(); }
  // config.json beside a SafeTensors model ("" when absent or for GGUF).
  const std::string& hf_config_json() const { return hf_config_json_; }
  const std::string& hf_dir() const { return hf_dir_; }    // folder of a SafeTensors model

  // The i-th mapped file (a split GGUF has one per part).
  const MappedFile& mapped(size_t i) const { return *files_.at(i); }

  // Replaces the tensor list (the SafeTensors translation renames tensors and adds derived
  // ones); `owned` keeps alive the bytes of tensors that are not views into the mapping.
  void replace_tensors(std::vector<TensorView> tensors) { tensors_ = std::move(tensors); }
  std::vector<uint8_t>& own_bytes(size_t n) { return owned_.emplace_back(n); }

  // Building, for the readers (src/format/gguf_reader.cpp, safetensors_reader.cpp) only:
  // nothing changes a file after open() but the SafeTensors translation above.
  void set_source(FileFormat format, std::string path) {
    format_ = format;
    path_ = std::move(path);
  }
  void set_gguf_version(uint32_t v) { gguf_version_ = v; }
  void set_hf(std::string dir, std::string config_json) {
    hf_dir_ = std::move(dir);
    hf_config_json_ = std::move(config_json);
  }
  // Keeps a mapping alive as long as the tensor views into it.
  void keep_mapping(std::unique_ptr<MappedFile> f) { files_.push_back(std::move(f)); }
  std::vector<TensorView>& mutable_tensors() { return tensors_; }

 private:
  FileFormat format_ = FileFormat::kGguf;
  std::string path_;
  Metadata meta_;
  std::vector<TensorView> tensors_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  uint32_t gguf_version_ = 0;
  std::string hf_config_json_;
  std::string hf_dir_;
  std::deque<std::vector<uint8_t>> owned_;  // deque: element addresses stay put
};

}  // namespace frink
