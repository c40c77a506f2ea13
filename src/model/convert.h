// frink convert: a Hugging Face SafeTensors folder to ONE GGUF file that llama.cpp loads.
//
// The weights come through frink's own SafeTensors path (load_model -> hf_config.cpp), which
// already renames tensors to GGUF's names, permutes llama's q/k rows to llama.cpp's
// interleaved rope layout, and translates config.json into llama.cpp's keys; the converter
// writes what that path loaded, so `frink run -m DIR` and `frink run -m OUT.gguf` read the same
// weights (up to the chosen type's rounding). The tokenizer comes from tokenizer.json (plus
// tokenizer_config.json and config.json for the special ids), written as llama.cpp's
// convert_hf_to_gguf.py writes a byte-level BPE vocabulary ("gpt2").
//
// Types, as llama.cpp's converter picks them: 1-D tensors (norms) stay F32; matrices take the
// requested type, or F16 when a row is not a whole number of its blocks.
//
// Refuses (frink::Error, nothing written) a tokenizer that is not byte-level BPE with GPT-2's
// pre-tokenizer regex: that is the one whose GGUF pre-tokenizer name ("gpt-2") is certain.
#pragma once

#include <cstdint>
#include <string>

#include "quant/ggml_type.h"

namespace frink {

struct ConvertOptions {
  GgmlType type = GgmlType::F16;  // for matrices: F32, F16, BF16 or Q8_0
  std::string name;               // general.name; empty: the folder's name
  std::string description;        // general.description; empty: not written
};

struct ConvertSummary {
  int64_t n_tensors = 0;
  int64_t n_params = 0;
  int64_t n_vocab = 0;
  uint64_t file_bytes = 0;
};

// The matrix type for a --type spelling (case-insensitive). Throws frink::Error if unsupported.
GgmlType parse_convert_type(std::string spelling);

// Reads the SafeTensors folder `src_dir` and writes `out_path`. Throws frink::Error.
ConvertSummary convert_to_gguf(const std::string& src_dir, const std::string& out_path, const ConvertOptions& o);

}  // namespace frink
