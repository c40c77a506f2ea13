// Prompt-sized MoE batches' grouped expert products (moe.cuh SlotSort, MatmulParams::
// group_rows): the slots' rows in expert order against the host's stable sort, token rows to
// that order and back, and the sorted rows through grouped cuBLAS calls against the slot path
// (one matrix-vector product per row, exact f32 sums of the same rounded activations).
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_support.h"

#ifdef FRINK_HAVE_CUDA
#include <cublas_v2.h>

#include "cuda/matmul.cuh"
#include "cuda/moe.cuh"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace frink::test {
namespace {

// The slots' experts as the routing leaves them: k distinct experts per token, some experts
// never chosen.
std::vector<int32_t> random_routing(std::mt19937& rng, int64_t n_tok, int64_t k, int64_t n_expert) {
  std::vector<int32_t> ids;
  std::vector<int32_t> all(static_cast<size_t>(n_expert));
  for (int64_t e = 0; e < n_expert; ++e) all[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  for (int64_t t = 0; t < n_tok; ++t) {
    // Experts above n_expert * 3 / 4 are never drawn: empty groups inside and at the end.
    std::shuffle(all.begin(), all.begin() + n_expert * 3 / 4, rng);
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  return ids;
}

TEST(CudaMoeGrouped, SlotsSortedByExpertThenSlotAndMovedThereAndBack) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(71);
  struct C {
    int64_t n_tok, k, n_expert;
  };
  // qwen3-30b-a3b at a 512-token batch, qwen3-next's 512 experts, the most slots the sort
  // holds, one expert a token.
  for (const C& c : {C{512, 8, 128}, C{80, 10, 512}, C{1024, 8, 128}, C{70, 1, 4}}) {
    const int64_t S = c.n_tok * c.k, width = 5;
    const auto ids = random_routing(rng, c.n_tok, c.k, c.n_expert);
    std::vector<int32_t> count(static_cast<size_t>(c.n_expert), 0), pos(static_cast<size_t>(S));
    for (int32_t e : ids) ++count[static_cast<size_t>(e)];
    for (int32_t e = 0, j = 0; e < c.n_expert; ++e)
      for (int64_t s = 0; s < S; ++s)
        if (ids[static_cast<size_t>(s)] == e) pos[static_cast<size_t>(s)] = j++;
    Dev<int32_t> dids(ids), dcount(std::vector<int32_t>(count.size(), -1)),
        dpos(std::vector<int32_t>(static_cast<size_t>(S), -1));
    cuda::SlotSort ss;
    ss.expert = dids.p;
    ss.n_slots = S;
    ss.n_expert = c.n_expert;
    ss.count = dcount.p;
    ss.pos = dpos.p;
    cuda::launch_sort_slots(ss);
    EXPECT_EQ(dcount.get(), count) << "slots " << S;
    EXPECT_EQ(dpos.get(), pos) << "slots " << S;
    // Token rows into expert order and back: each slot's row comes back as its token's.
    const auto x = random_floats(rng, c.n_tok * width);
    Dev<float> dx(x), drows(static_cast<size_t>(S * width)), dback(static_cast<size_t>(S * width));
    cuda::launch_slot_rows(drows.p, dx.p, width, dpos.p, S, c.k, true, nullptr);
    cuda::launch_slot_rows(dback.p, drows.p, width, dpos.p, S, 1, false, nullptr);
    const auto back = dback.get();
    for (int64_t s = 0; s < S; ++s)
      ASSERT_EQ(std::vector<float>(back.begin() + s * width, back.begin() + (s + 1) * width),
                std::vector<float>(x.begin() + s / c.k * width, x.begin() + (s / c.k + 1) * width))
          << "slot " << s;
  }
}

TEST(CudaMoeGrouped, ExpertOrderedRowsMatchSlotProducts) {
  FRINK_REQUIRE_GPU();
  std::mt19937 rng(73);
  cublasHandle_t blas;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const int64_t n_expert = 9, n_in = 512, n_out = 96, n_tok = 40, k = 3, S = n_tok * k;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::BF16, GgmlType::F32}) {
    std::vector<uint8_t> w;
    for (int64_t r = 0; r < n_expert * n_out; ++r) {
      const auto row = random_weight_row(rng, t, n_in);
      w.insert(w.end(), row.begin(), row.end());
    }
    // Rows in expert order, as the sort and launch_slot_rows leave them.
    auto ids = random_routing(rng, n_tok, k, n_expert);
    std::sort(ids.begin(), ids.end());
    std::vector<int32_t> rows(static_cast<size_t>(n_expert), 0);
    for (int32_t e : ids) ++rows[static_cast<size_t>(e)];
    const auto xs = random_floats(rng, S * n_in);
    const size_t expert_bytes = ggml_row_bytes(t, n_in) * static_cast<size_t>(n_out);
    Dev<uint8_t> dw(w);
    Dev<float> dxs(xs), dact(xs.size()), dslot(static_cast<size_t>(S * n_out)), dgrp(static_cast<size_t>(S * n_out));
    Dev<int32_t> dsorted(ids);
    cuda::MatmulParams q = mat_params(t, dw.p, n_in, n_out, dxs.p, S, dslot.p);
    q.act_round = dact.p;
    q.slot_expert = dsorted.p;
    q.n_slots = S;
    q.expert_bytes = expert_bytes;
    cuda::launch_matmul(q);
    // Scratch for x's f16 copy and three experts' f16 matrices: runs of at most three experts,
    // so the dequantizing types take several calls (and an empty expert inside a run).
    const size_t scratch_elems = static_cast<size_t>(S * n_in + 3 * n_out * n_in);
    Dev<uint16_t> dscratch(std::vector<uint16_t>(scratch_elems, 0x7e00));  // f16 NaNs
    Dev<void*> dptrs(std::vector<void*>(static_cast<size_t>(3 * n_expert), nullptr));
    cuda::MatmulParams p = mat_params(t, dw.p, n_in, n_out, dxs.p, S, dgrp.p);
    p.act_round = dact.p;
    p.group_rows = rows.data();
    p.n_expert = n_expert;
    p.group_ptrs = dptrs.p;
    p.expert_bytes = expert_bytes;
    p.blas = blas;
    p.scratch = dscratch.p;
    p.scratch_elems = scratch_elems;
    cuda::launch_matmul(p);
    const auto ys = dslot.get(), yg = dgrp.get();
    // f16 copies of the (rounded) activations and of the dequantized weights: ~1e-7 here; a row
    // of the wrong expert or place is ~1.
    const double e = nmse(yg.data(), ys.data(), ys.size());
    EXPECT_LT(e, t == GgmlType::F32 ? 1e-10 : 1e-5) << ggml_type_name(t);
    std::printf("[gpu] expert-ordered rows %-5s nmse against slots %.3g\n", ggml_type_name(t).data(), e);
  }
  cublasDestroy(blas);
}

}  // namespace
}  // namespace frink::test

#else
TEST(CudaMoeGrouped, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (FRINK_CUDA=OFF)"; }
#endif
