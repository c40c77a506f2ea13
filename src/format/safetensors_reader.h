// SafeTensors reader: one file (u64 little-endian header length, a JSON header, then data)
// or a sharded folder (model.safetensors.index.json naming a shard per tensor). Views point
// into the mapping; every data_offsets pair is checked against the file and its neighbours.
// Only F32, F16 and BF16 are read; shapes are reversed into ggml order (ne[0] innermost).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/model_file.h"

namespace frink::safetensors {

// Parses one image [data, data + n_bytes), appending its tensors (header order) to `out`
// and its "__metadata__" strings to `meta` as "safetensors.KEY" (the format's free-form
// text-to-text map: anything but strings there is a malformed file).
void parse(const uint8_t* data, size_t n_bytes, const std::string& name, std::vector<TensorView>& out,
           Metadata& meta);

// A .safetensors file or a model.safetensors.index.json; config.json beside it is kept.
void open(const std::string& path, ModelFile& out);
// A folder holding model.safetensors.index.json or model.safetensors (and config.json).
void open_folder(const std::string& dir, ModelFile& out);

}  // namespace frink::safetensors
