#include "quant/ggml_type.h"

#include <array>
#include <cctype>
#include <string>

#include "core/error.h"

namespace frink {

namespace {

// Block geometry from ggml's type_traits (ggml.c). Types frink has no kernels for are still
// listed, so a file holding them can be described (frink info) and bounds-checked.
constexpr std::array kTypes = {
    GgmlTypeInfo{GgmlType::F32, "F32", 1, 4, false},
    GgmlTypeInfo{GgmlType::F16, "F16", 1, 2, false},
    GgmlTypeInfo{GgmlType::Q4_0, "Q4_0", 32, 18, true},
    GgmlTypeInfo{GgmlType::Q4_1, "Q4_1", 32, 20, true},
    GgmlTypeInfo{GgmlType::Q5_0, "Q5_0", 32, 22, true},
    GgmlTypeInfo{GgmlType::Q5_1, "Q5_1", 32, 24, true},
    GgmlTypeInfo{GgmlType::Q8_0, "Q8_0", 32, 34, true},
    GgmlTypeInfo{GgmlType::Q8_1, "Q8_1", 32, 36, true},
    GgmlTypeInfo{GgmlType::Q2_K, "Q2_K", 256, 84, true},
    GgmlTypeInfo{GgmlType::Q3_K, "Q3_K", 256, 110, true},
    GgmlTypeInfo{GgmlType::Q4_K, "Q4_K", 256, 144, true},
    GgmlTypeInfo{GgmlType::Q5_K, "Q5_K", 256, 176, true},
    GgmlTypeInfo{GgmlType::Q6_K, "Q6_K", 256, 210, true},
    GgmlTypeInfo{GgmlType::Q8_K, "Q8_K", 256, 292, true},
    GgmlTypeInfo{GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, true},
    GgmlTypeInfo{GgmlType::IQ2_XS, "IQ2_XS", 256, 74, true},
    GgmlTypeInfo{GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, true},
    GgmlTypeInfo{GgmlType::IQ1_S, "IQ1_S", 256, 50, true},
    GgmlTypeInfo{GgmlType::IQ4_NL, "IQ4_NL", 32, 18, true},
    GgmlTypeInfo{GgmlType::IQ3_S, "IQ3_S", 256, 110, true},
    GgmlTypeInfo{GgmlType::IQ2_S, "IQ2_S", 256, 82, true},
    GgmlTypeInfo{GgmlType::IQ4_XS, "IQ4_XS", 256, 136, true},
    GgmlTypeInfo{GgmlType::I8, "I8", 1, 1, false},
    GgmlTypeInfo{GgmlType::I16, "I16", 1, 2, false},
    GgmlTypeInfo{GgmlType::I32, "I32", 1, 4, false},
    GgmlTypeInfo{GgmlType::I64, "I64", 1, 8, false},
    GgmlTypeInfo{GgmlType::F64, "F64", 1, 8, false},
    GgmlTypeInfo{GgmlType::IQ1_M, "IQ1_M", 256, 56, true},
    GgmlTypeInfo{GgmlType::BF16, "BF16", 1, 2, false},
    GgmlTypeInfo{GgmlType::TQ1_0, "TQ1_0", 256, 54, true},
    GgmlTypeInfo{GgmlType::TQ2_0, "TQ2_0", 256, 66, true},
    GgmlTypeInfo{GgmlType::MXFP4, "MXFP4", 32, 17, true},
};

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const GgmlTypeInfo& ggml_type_info(GgmlType t) {
  for (const auto& info : kTypes)
    if (info.type == t) return info;
  FRINK_ASSERT(false, "GgmlType {} missing from the table", static_cast<uint32_t>(t));
  __builtin_unreachable();
}

std::string_view ggml_type_name(GgmlType t) { return ggml_type_info(t).name; }

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  std::string upper(name);
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& t : kTypes)
    if (t.name == upper) return t.type;
  return std::nullopt;
}

size_t ggml_row_bytes(GgmlType t, int64_t n) {
  const auto& info = ggml_type_info(t);
  FRINK_ASSERT(n % info.block_elems == 0, "row of {} elements is not a whole number of {} blocks", n,
               info.name);
  return static_cast<size_t>(n / info.block_elems) * info.block_bytes;
}

}  // namespace frink
