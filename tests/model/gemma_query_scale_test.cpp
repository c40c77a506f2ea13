// Gemma's query_pre_attn_scalar rule (src/model/arch_gemma.h), which both the GGUF reader and
// the SafeTensors config check use: the released configs' values, from their shapes.
#include <gtest/gtest.h>

#include "model/arch_gemma.h"

namespace frink {
namespace {

using arch::gemma_query_pre_attn_scalar;

TEST(GemmaQueryScale, TwentySevenBModelsUseEmbdPerHeadOthersHeadDim) {
  // gemma-2-27b (46 layers, 4608 wide, 32 heads of 128) and gemma-3-27b (62, 5376, 32 of 128)
  // ship query_pre_attn_scalar 144 and 168.
  EXPECT_EQ(gemma_query_pre_attn_scalar("gemma2", 46, 4608, 32, 128), 144);
  EXPECT_EQ(gemma_query_pre_attn_scalar("gemma3", 62, 5376, 32, 128), 168);
  // gemma-2-9b (42, 3584, 16 of 256) and gemma-3-12b (48, 3840, 16 of 256): the head size.
  EXPECT_EQ(gemma_query_pre_attn_scalar("gemma2", 42, 3584, 16, 256), 256);
  EXPECT_EQ(gemma_query_pre_attn_scalar("gemma3", 48, 3840, 16, 256), 256);
  // Each family has its own 27B depth: 62 layers mean nothing to gemma2, 46 nothing to gemma3.
  EXPECT_EQ(gemma_query_pre_attn_scalar("gemma2", 62, 5376, 32, 128), 128);
  EXPECT_EQ(gemma_query_pre_attn_scalar("gemma3", 46, 4608, 32, 128), 128);
}

}  // namespace
}  // namespace frink
