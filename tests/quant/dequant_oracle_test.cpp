// Dequantization against llama.cpp's own output: for every entry of
// testdata/llamacpp/quant/dequant/index.json (one tensor of each of 14 types, from the
// tiny llama GGUFs), our dequantize_row must give the SAME floats, bit for bit. Exact
// equality is the right bound: decoding is a fixed sequence of int-to-float conversions
// and one or two roundings per element, so any difference is a layout or order bug.
#include <cstring>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "quant/gguf_tensor_locator.h"
#include "support/test_support.h"

namespace frink {
namespace {

TEST(DequantOracle, MatchesLlamaCppBitForBit) {
  FRINK_REQUIRE_SHARED();
  const auto dir = test::shared_testdata() / "llamacpp" / "quant";
  const auto index = nlohmann::json::parse(test::read_text_file(dir / "dequant" / "index.json"));
  std::set<std::string> types_seen;
  int n_checked = 0;
  for (const auto& [file, entry] : index.items()) {
    SCOPED_TRACE(file);
    test::GgufTensorLocator gguf(dir / entry["gguf"].get<std::string>());
    const auto tensor = gguf.find(entry["tensor"].get<std::string>(), [](uint32_t type, int64_t n) {
      return ggml_row_bytes(ggml_type_info(type).value().type, n);
    });
    const GgmlType type = ggml_type_info(tensor.type).value().type;
    ASSERT_EQ(ggml_type_name(type), entry["type"].get<std::string>());
    ASSERT_TRUE(host_supports(type));
    const auto expected = test::read_f32_file(dir / "dequant" / file);
    const int64_t row = tensor.shape.at(0);
    ASSERT_EQ(static_cast<int64_t>(expected.size()) % row, 0);
    std::vector<float> got(expected.size());
    const size_t row_bytes = ggml_row_bytes(type, row);
    for (size_t r = 0; r < expected.size() / row; ++r)
      dequantize_row(type, tensor.bytes.data() + r * row_bytes, got.data() + r * row, row);
    size_t n_diff = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      // Compare bits, so -0.0 vs 0.0 or a NaN would also show.
      if (std::memcmp(&got[i], &expected[i], sizeof(float)) != 0 && n_diff++ == 0) first = i;
    }
    EXPECT_EQ(n_diff, 0u) << "first mismatch at " << first << ": " << got[first] << " vs " << expected[first];
    types_seen.insert(std::string(ggml_type_name(type)));
    ++n_checked;
  }
  EXPECT_GE(n_checked, 14);
  EXPECT_EQ(types_seen.size(), 14u) << "index.json should cover 14 types";
}

}  // namespace
}  // namespace frink
