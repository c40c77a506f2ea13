// A decode token's experts as one launch (cuda/moe_experts.cu: gate|up, GLU and down in a
// cluster per slot) against the three launches moe_slot_experts makes otherwise: the same
// routing, weights and prepared h. The gate/up sums are added in another order (blocks_dot
// against the stream kernel's lane dots), so a GLU value may round to another Q8 step: equal
// up to that, held by NMSE; an expert, row range or slot mixed up is off by the order of 1.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/elementwise.cuh"
#include "cuda/matmul.cuh"
#include "cuda/moe_experts.cuh"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

// n_rows random rows of type t, as a file holds them.
std::vector<uint8_t> random_rows(std::mt19937& rng, GgmlType t, int64_t n_in, int64_t n_rows) {
  std::vector<uint8_t> bytes;
  for (int64_t r = 0; r < n_rows; ++r) {
    const auto row = random_weight_row(rng, t, n_in);
    bytes.insert(bytes.end(), row.begin(), row.end());
  }
  return bytes;
}

bool hopper() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
}

struct FusedCase {
  GgmlType tg, td;
  int64_t n_embd, n_ff, k;
  bool fused_gate_up;
};

TEST(CudaMoeFused, OneLaunchEqualsThree) {
  FRINK_REQUIRE_GPU();
  if (!hopper()) GTEST_SKIP() << "the fused expert kernel needs sm_90 clusters; skipping";
  std::mt19937 rng(71);
  const int64_t n_expert = 16;
  // qwen3-30b-a3b's shapes (Q4_0; Q4_K_M's Q4_K gate/up with a Q4_K or Q6_K down), a fused
  // gate_up, and a narrower one of four slots.
  const std::vector<FusedCase> cases = {{GgmlType::Q4_0, GgmlType::Q4_0, 2048, 768, 8, false},
                                        {GgmlType::Q4_K, GgmlType::Q6_K, 2048, 768, 8, false},
                                        {GgmlType::Q4_K, GgmlType::Q4_K, 2048, 768, 8, false},
                                        {GgmlType::Q4_0, GgmlType::Q4_0, 2048, 768, 8, true},
                                        {GgmlType::Q4_K, GgmlType::Q6_K, 1024, 512, 4, true}};
  for (const FusedCase& c : cases) {
    const int64_t E = c.n_embd, F = c.n_ff, k = c.k;
    const std::string where = std::string(ggml_type_name(c.tg)) + "/" + std::string(ggml_type_name(c.td)) + " E " +
                              std::to_string(E) + " F " + std::to_string(F) + " k " + std::to_string(k) +
                              (c.fused_gate_up ? " gate_up" : "");
    const size_t gu_expert = ggml_row_bytes(c.tg, E) * static_cast<size_t>(c.fused_gate_up ? 2 * F : F);
    const size_t dn_expert = ggml_row_bytes(c.td, F) * static_cast<size_t>(E);
    Dev<uint8_t> dg(random_rows(rng, c.tg, E, (c.fused_gate_up ? 2 * F : F) * n_expert)),
        du(random_rows(rng, c.tg, E, F * n_expert)), dd(random_rows(rng, c.td, F, E * n_expert));
    std::vector<int32_t> ids(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(j)] = static_cast<int32_t>((5 * j + 3) % n_expert);
    Dev<int32_t> dids(ids);
    const auto h = random_floats(rng, E);
    Dev<float> dh(h), dact(static_cast<size_t>(E) * 2), dgu(static_cast<size_t>(2 * F * k)),
        dhid(static_cast<size_t>(F * k)), dhact(static_cast<size_t>(F * k) * 2), y1(static_cast<size_t>(E * k)),
        y2(static_cast<size_t>(E * k));
    // gate|up of the slots (one fused product, or gate then up), as expert_params sets them
    cuda::MatmulParams gu[2];
    const int n_gu = c.fused_gate_up ? 1 : 2;
    for (int i = 0; i < n_gu; ++i) {
      const int64_t n_out = c.fused_gate_up ? 2 * F : F;
      gu[i] = mat_params(c.tg, i == 0 ? dg.p : du.p, E, n_out, dh.p, 1, dgu.p + i * k * F);
      gu[i].y_stride = n_out;
      gu[i].act_round = dact.p;
      gu[i].slot_expert = dids.p;
      gu[i].n_slots = k;
      gu[i].x_div = k;
      gu[i].expert_bytes = gu_expert;
    }
    cuda::launch_matmuls(gu, n_gu);  // quantizes h into dact (the fused launch reads it from there)
    cuda::GluParams g;
    g.gate = dgu.p;
    g.up = c.fused_gate_up ? dgu.p + F : dgu.p + k * F;
    g.gate_stride = g.up_stride = c.fused_gate_up ? 2 * F : F;
    g.out = dhid.p;
    g.n = F;
    g.n_tok = k;
    cuda::MatmulParams down = mat_params(c.td, dd.p, F, E, dhid.p, k, y1.p);
    down.act_round = dhact.p;
    down.slot_expert = dids.p;
    down.n_slots = k;
    down.x_div = 1;
    down.expert_bytes = dn_expert;
    down.pre_glu = &g;
    cuda::launch_matmul(down);
    // the same in one launch, into y2
    gu[0].x_prepared = true;
    down.y = y2.p;
    down.pre_glu = nullptr;
    ASSERT_TRUE(cuda::launch_fused_experts(gu, n_gu, down, g)) << where;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where;
    const auto a = y1.get(), b = y2.get();
    EXPECT_LT(nmse(b.data(), a.data(), a.size()), 1e-5) << where;
    // Two tokens, or h not prepared: the three launches' business.
    cuda::MatmulParams two[2] = {gu[0], gu[1]};
    two[0].n_tok = 2;
    EXPECT_FALSE(cuda::launch_fused_experts(two, n_gu, down, g)) << where;
    two[0] = gu[0];
    two[0].x_prepared = false;
    EXPECT_FALSE(cuda::launch_fused_experts(two, n_gu, down, g)) << where;
  }
}

}  // namespace
}  // namespace frink::test

#else
TEST(CudaMoeFused, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
