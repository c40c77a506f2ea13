// quantize_row against llama.cpp's files. The tiny llama models were quantized by
// llama-quantize from an f32 original we do not have; the F16 model's tensors are that
// original rounded to half. Re-quantizing the F16 values therefore cannot reproduce every
// row (a row of 256 differs if one value lands on the other side of a rounding edge, and
// Q8_0, whose scale comes straight from the rounded max, is not tested here), but with the
// right algorithm MOST rows come out byte-identical, and with any layout, rounding or
// search-order bug essentially none do. Measured (this commit): Q4_0 ~83%, Q5_0 ~75%,
// Q4_K ~63%, Q6_K 48%, Q4_1 ~15%, Q5_1 ~11% of rows identical; the floors below sit at
// about half of that so a real regression, not noise, trips them.
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "quant/gguf_tensor_locator.h"
#include "support/test_support.h"

namespace frink {
namespace {

size_t row_bytes_of(uint32_t type, int64_t n) { return ggml_row_bytes(ggml_type_info(type).value().type, n); }

TEST(RequantizeOracle, MostRowsMatchLlamaQuantizeBytes) {
  FRINK_REQUIRE_SHARED();
  const auto dir = test::shared_testdata() / "llamacpp" / "quant";
  test::GgufTensorLocator f16(dir / "llama-dense-F16.gguf");
  std::map<GgmlType, std::pair<int64_t, int64_t>> same_total;  // rows identical, rows
  for (const char* file : {"llama-dense-Q4_0.gguf", "llama-dense-Q4_1.gguf",
                           "llama-dense-Q5_0.gguf", "llama-dense-Q5_1.gguf", "llama-dense-Q4_K_M.gguf",
                           "llama-dense-Q5_K_M.gguf", "llama-dense-Q6_K.gguf"}) {
    test::GgufTensorLocator q(dir / file);
    for (const auto& name : q.names()) {
      const auto tq = q.find(name, row_bytes_of);
      const GgmlType type = ggml_type_info(tq.type).value().type;
      if (!can_quantize(type) || type == GgmlType::F32) continue;
      const auto tf = f16.find(name, row_bytes_of);
      const int64_t row = tf.shape[0];
      const int64_t n_rows = static_cast<int64_t>(tf.bytes.size()) / static_cast<int64_t>(row_bytes_of(tf.type, row));
      const GgmlType ftype = ggml_type_info(tf.type).value().type;
      std::vector<float> x(row);
      std::vector<uint8_t> out(ggml_row_bytes(type, row));
      int64_t n_same = 0;
      for (int64_t r = 0; r < n_rows; ++r) {
        dequantize_row(ftype, tf.bytes.data() + r * row_bytes_of(tf.type, row), x.data(), row);
        quantize_row(type, x.data(), out.data(), row);
        n_same += std::memcmp(out.data(), tq.bytes.data() + r * out.size(), out.size()) == 0;
      }
      same_total[type].first += n_same;
      same_total[type].second += n_rows;
    }
  }
  const std::map<GgmlType, double> floor = {{GgmlType::Q4_0, 0.4}, {GgmlType::Q5_0, 0.35}, {GgmlType::Q4_K, 0.3},
                                            {GgmlType::Q6_K, 0.25}, {GgmlType::Q4_1, 0.06}, {GgmlType::Q5_1, 0.05}};
  for (const auto& [type, min_fraction] : floor) {
    const auto [same, total] = same_total[type];
    ASSERT_GT(total, 0) << ggml_type_name(type);
    const double fraction = static_cast<double>(same) / static_cast<double>(total);
    EXPECT_GE(fraction, min_fraction) << ggml_type_name(type) << ": " << same << "/" << total << " rows identical";
  }
}

}  // namespace
}  // namespace frink
