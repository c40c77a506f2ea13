// GGUF reader (versions 2 and 3, little-endian), after ggml's docs/gguf.md.
// Invariant: nothing is read, reserved or viewed before its extent was checked against the
// bytes that remain, so a truncated or hostile file costs one Error line, never a crash or a
// huge allocation. Tensor views point into the caller's bytes (zero copy).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/metadata.h"
#include "format/model_file.h"

namespace frink::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr size_t kDefaultAlignment = 32;

// One parsed GGUF image.
struct GgufPart {
  uint32_t version = 0;
  size_t alignment = kDefaultAlignment;
  size_t data_offset = 0;  // where the tensor data section starts
  Metadata meta;
  std::vector<TensorView> tensors;  // views into the parsed bytes
};

// Parses [data, data + n_bytes); `name` (a path) starts every error line. Throws frink::Error.
GgufPart parse(const uint8_t* data, size_t n_bytes, const std::string& name);

// Opens PATH into `out`: maps it, and when its name is NAME-0000K-of-0000N.gguf (or its
// split.count says it is split) maps and checks every part, taking metadata from part 1.
void open(const std::string& path, ModelFile& out);

// "NAME-00002-of-00003.gguf" for a split prefix "NAME" (llama.cpp's llama_split_path).
std::string split_path(const std::string& prefix, int part_no, int n_parts);

}  // namespace frink::gguf
