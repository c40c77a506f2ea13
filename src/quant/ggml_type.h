// The tensor element types of GGUF, with their numeric ids exactly as ggml defines them
// (ggml.h, enum ggml_type) and their block geometry. This table is the ONE list of types:
// "can the host dot it", "does the device have a kernel" are columns read from rows here
// (src/quant/quant.h for the host kernels), never a second list kept in step by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace frink {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;   // ggml's spelling: "Q4_K", "BF16", ...
  int64_t block_elems;     // elements per block (1 for plain types)
  size_t block_bytes;      // bytes per block, exactly GGUF's layout
  bool is_quantized;       // block-quantized (needs dequantization)
};

// nullopt for an id no GGUF writer defines (an unknown tensor type in a file is bad input).
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType t);
std::string_view ggml_type_name(GgmlType t);
// Parses ggml's spelling ("q4_0" or "Q4_0"); nullopt when unknown.
std::optional<GgmlType> ggml_type_from_name(std::string_view name);

// Bytes of a row of n elements; n must be a multiple of the block size (asserted).
size_t ggml_row_bytes(GgmlType t, int64_t n);

}  // namespace frink
