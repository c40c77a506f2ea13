// CudaBackend's MoE FFN: routing, the selected experts' products slot by slot (decode) or grouped
// by expert (prompts), the shared expert, and the weighted combine, all on the stream without a
// round trip to the host.
#include "cuda/cuda_backend_impl.h"

#include <algorithm>

#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/elementwise.cuh"
#include "cuda/matmul.cuh"
#include "cuda/moe.cuh"
#include "cuda/norm.cuh"
#include "quant/ggml_type.h"

namespace frink::cuda::detail {

MatmulParams CudaBackend::grouped_params(const DeviceExperts& x, const float* in, int64_t n_rows, float* y,
                                         int64_t y_stride) {
  MatmulParams p = matmul_params(first_expert(x), in, x.n_in, y, y_stride);
  p.bias = nullptr;  // each expert's: launch_slot_bias after the product
  p.n_tok = n_rows;
  p.n_expert = static_cast<int64_t>(moe_rows_host_.size());
  p.group_rows = moe_rows_host_.data();
  p.group_ptrs = static_cast<void**>(moe_ptrs_.p);
  p.expert_bytes = x.expert_bytes;
  p.act_round = moe_ract_.f();
  p.scratch = moe_rscratch_.p;
  p.scratch_elems = moe_rscratch_elems_;
  return p;
}

MatmulParams CudaBackend::expert_params(const DeviceExperts& x, const float* in, int64_t n_rows, int64_t x_div,
                                        float* y, int64_t y_stride) {
  MatmulParams p = matmul_params(first_expert(x), in, x.n_in, y, y_stride);
  p.n_tok = n_rows;
  p.slot_expert = static_cast<const int32_t*>(moe_ids_.p);
  p.n_slots = n_rows * x_div;
  p.x_div = x_div;
  p.expert_bytes = x.expert_bytes;
  p.expert_scale = x.scale;
  return p;
}

// The mixture-of-experts block on normed h [n_tok][n_embd] -> out (+ residual), the host's
// moe_ffn (cpu/moe.cpp) step by step, every step on the device: router product, routing,
// gate|up of each token's chosen experts, GLU, down, the weighted sum with the shared expert.
// pre_norm: h is that norm's output, launched here first.
void CudaBackend::moe_ffn(const LayerPlan& p, const DeviceLayer& d, const float* h, float* out,
                          const float* residual, const NormParams* pre_norm) {
  const MoePlan& mp = p.moe;
  const MoeStack st = moe_stack(mp, d);
  const int64_t E = m_.hp.n_embd, n = n_tok_, k = st.slots, F = mp.n_ff_exp, S = n * k;
  // Prompt-sized batches: each expert's tokens as one matrix product (grouped_params), where
  // the experts have no scale; their biases (gpt-oss's) are added after each product
  // (launch_slot_bias). Measured (H200, gpt-oss-20b MXFP4, 2 layers): pp512 1526 t/s slot by
  // slot, where every slot's product read its expert's rows again.
  bool grouped = takes_grouped_experts(n, st);
  for (const DeviceExperts* x : {&d.gate_exps, &d.up_exps, &d.gate_up_exps, &d.down_exps})
    if (*x && (x->scale || x->expert_bytes != x->row_bytes * static_cast<size_t>(x->n_out))) grouped = false;
  // The experts' gate|up products of h (or one fused gate_up), launched after the routing.
  MatmulParams gu[2];
  const int n_gu = d.gate_up_exps ? 1 : 2;
  if (d.gate_up_exps) {
    gu[0] = expert_params(d.gate_up_exps, h, n, k, moe_gu_.f(), 2 * F);
  } else {
    gu[0] = expert_params(d.gate_exps, h, n, k, moe_gu_.f(), F);
    gu[1] = expert_params(d.up_exps, h, n, k, moe_gu_.f() + S * F, F);
  }
  // h = post_attention_layernorm(x): when the experts read h as Q8_0 blocks (Q4_0/Q8_0) or
  // Q8_K blocks (Q4_K/Q6_K), the norm's kernel writes them too (one kernel fewer; the rows
  // are per token, as the slots' s / x_div reads them), into moe_h_q8_: the router's own
  // preparation of h goes to act_. Both of gate and up read blocks: moe_h_q8_ is sized for no
  // other preparation (an up of another type would prepare h there after gate).
  // A decode token's F32 router runs in the norm's launch (RouterNormParams), its blocks
  // norming the residual themselves: the chain wo -> norm -> router -> routing loses a kernel.
  // With gpt-oss's bias too, where its 32 rows of 2880 took the generic kernel's 32 one-warp
  // blocks, 6.5 us a layer (H200 ncu).
  RouterNormParams rn;
  rn.w = static_cast<const float*>(d.router.w);
  rn.b = d.router.b;
  rn.n_embd = E;
  rn.n_expert = d.router.n_out;  // a stacked shared expert's gate row included
  rn.logits = moe_logits_.f();
  const bool router_f32 = d.router.type == static_cast<int>(GgmlType::F32) && d.router.scale == 1.0f;
  bool routed = false;  // the router's product ran with the norm
  if (pre_norm && grouped) {
    launch_norm(*pre_norm);  // the grouped products read h's f32 rows
  } else if (pre_norm) {
    MatmulParams q8 = gu[0];
    q8.act_round = moe_h_q8_.f();
    q8.pre_norm = pre_norm;
    // Without dp4a blocks for both of gate and up, the producer writes h alone.
    if (!matmul_reads_q8_blocks(q8) || (n_gu == 2 && !matmul_reads_q8_blocks(gu[1]))) q8.act_round = nullptr;
    routed = n == 1 && router_f32 && norm_router_ok(q8, rn);
    if (launch_matmul_producer(q8, routed ? &rn : nullptr)) {  // false: h alone (rows it cannot fuse)
      for (int i = 0; i < n_gu; ++i) gu[i].act_round = moe_h_q8_.f();
      gu[0].x_prepared = true;
    }
  }
  // logits = self.gate(hidden_states); chosen experts and their weights, on the device
  if (!routed) {  // f32 at any batch size: top-k must rank the experts as the host does. An F32
                  // router's cuBLAS product is f32 throughout (no f16 copies); the matrix-vector
                  // kernel took a prompt 4 tokens a launch: 128 launches, 1.25 ms of a
                  // qwen3-30b-a3b layer at pp512 (H200, ncu).
    MatmulParams rp = matmul_params(d.router, h, E, moe_logits_.f(), d.router.n_out);
    rp.matvec_only = d.router.type != static_cast<int>(GgmlType::F32);
    launch_matmul(rp);
  }
  RouteParams r;
  r.logits = moe_logits_.f();
  r.sel_bias = d.exp_probs_b;
  r.n_tok = n;
  r.n_expert = mp.n_expert;
  r.k = mp.n_expert_used;
  r.n_shared = static_cast<int>(d.shexp_slots);
  r.shared_gated = d.shexp_slots > 0 && d.router.n_out > mp.n_expert;
  r.gating = mp.gating == ExpertGating::kSoftmax ? 0 : mp.gating == ExpertGating::kSigmoid ? 1 : 2;
  r.norm_w = mp.norm_w;
  r.w_scale = mp.w_scale;
  if (mp.group_limited()) {
    r.n_group = static_cast<int>(mp.n_group);
    r.n_group_used = static_cast<int>(mp.n_group_used);
  }
  r.expert = static_cast<int32_t*>(moe_ids_.p);
  r.weight = moe_w_.f();
  r.stream = stream_;
  // A decode token's experts' gate/up launch routes the token itself where it can (MatmulParams::
  // route): one kernel boundary fewer on the layer's chain. Measured (H200, qwen3-30b-a3b Q4_0
  // tg128 graph, one call, three rounds alternating): 2.110 / 2.110 / 2.109 -> 2.023 / 2.022 /
  // 2.022 ms, tg128 467 -> 487 t/s; logits bit for bit (`frink logits -b 1`, 4 layers).
  // (Gate and up of one type share the launch, whose blocks all rank the token themselves.)
  if (!grouped && n == 1 && (n_gu == 1 || gu[1].type == gu[0].type) && matmul_routes_in_launch(gu[0], r)) {
    gu[0].route = &r;
  } else {
    launch_route(r);
  }
  // The combine in the down's launch takes the routed experts alone (a shared expert of its own
  // adds its product in combine_experts).
  const bool own_shared = mp.n_ff_shexp > 0 && d.shexp_slots == 0;
  bool combined = false;
  if (grouped) {
    moe_grouped_experts(p, d, h);
  } else {
    combined = moe_slot_experts(p, d, gu, n_gu, n == 1 && !own_shared ? out : nullptr, residual);
  }
  if (!combined) combine_experts(p, d, h, out, residual, gu[0].x_prepared ? &gu[0] : nullptr);
}

// The experts' GLU over `rows` rows of gate|up outputs in gu (one fused gate_up product:
// [gate | up] per row; else all gate rows, then all up rows) into out.
static GluParams expert_glu(const MoePlan& mp, bool fused, float* gu, float* out, int64_t rows, cudaStream_t stream) {
  const int64_t F = mp.n_ff_exp;
  GluParams g;
  g.out = out;
  g.n = F;
  g.n_tok = rows;
  g.oai = mp.swiglu_oai;
  g.stream = stream;
  g.gate = gu;
  g.up = fused ? gu + F : gu + rows * F;
  g.gate_stride = g.up_stride = fused ? 2 * F : F;
  return g;
}

// The chosen experts' products slot by slot (one matrix-vector product per token and expert,
// reading the routing on the device: decode, and a token graph): y_e = down_e(glu(gate_e h,
// up_e h)) into moe_y_, slot t * k + j.
bool CudaBackend::moe_slot_experts(const LayerPlan& p, const DeviceLayer& d, MatmulParams* gu, int n_gu, float* out,
                                   const float* residual) {
  const MoePlan& mp = p.moe;
  const int64_t E = m_.hp.n_embd, S = n_tok_ * moe_stack(mp, d).slots;
  // gate, up = gate_e(x), up_e(x) for each chosen expert e   (or one fused gate_up_e(x), split)
  launch_matmuls(gu, n_gu);  // one preparation of h for gate and up
  GluParams g = expert_glu(mp, static_cast<bool>(d.gate_up_exps), moe_gu_.f(), moe_hidden_.f(), S, stream_);
  // y_e = down_e(hidden), one row per slot (the GLU launched with its activation preparation)
  MatmulParams down = expert_params(d.down_exps, moe_hidden_.f(), S, 1, moe_y_.f(), E);
  down.pre_glu = &g;
  down.slots_settled = true;  // the routing finished before the gate/up began (MatmulParams)
  // out = residual + sum_j w_j y_j in the down's own launch: one kernel fewer on the chain.
  // Measured (H200, tg128 graph, one call each, two rounds alternating): qwen3-30b-a3b Q4_0
  // 2.016 / 2.007 -> 1.942 / 1.938 ms; qwen3-next-80b-a3b Q4_K_M (8 layers; Q4_K and Q6_K downs)
  // 0.541 / 0.540 -> 0.528 / 0.528 ms; logits bit for bit (`frink logits -b 1`).
  MatmulParams comb = down;
  comb.combine_w = moe_w_.f();
  comb.y = out;
  comb.residual = residual;
  const bool combines = out && matmul_combines_in_launch(comb);
  launch_matmul(combines ? comb : down);
  return combines;
}

// The same products, each expert's tokens as one matrix product (a prompt-sized batch): the
// slots put in expert order, the counts brought to the host (the products' shapes: one wait a
// MoE layer, so never in a token graph), h's rows copied in that order, gate|up, GLU and down
// on them, and the outputs back in slot order.
void CudaBackend::moe_grouped_experts(const LayerPlan& p, const DeviceLayer& d, const float* h) {
  const MoePlan& mp = p.moe;
  const MoeStack st = moe_stack(mp, d);
  const int64_t E = m_.hp.n_embd, k = st.slots, F = mp.n_ff_exp, S = n_tok_ * k;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  FRINK_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  FRINK_ASSERT(capturing == cudaStreamCaptureStatusNone, "grouped expert products inside a graph capture");
  SlotSort ss;
  ss.expert = static_cast<const int32_t*>(moe_ids_.p);
  ss.n_slots = S;
  ss.n_expert = st.experts;
  ss.count = static_cast<int32_t*>(moe_sort_.p);
  ss.pos = ss.count + st.experts;
  ss.stream = stream_;
  launch_sort_slots(ss);
  moe_rows_host_.resize(static_cast<size_t>(st.experts));
  FRINK_CUDA_CHECK(cudaMemcpyAsync(moe_rows_host_.data(), ss.count, moe_rows_host_.size() * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream_));
  FRINK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int64_t W = std::max(E, F);
  const auto fl = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
  moe_rx_.ensure(fl(S * E));
  moe_rgu_.ensure(fl(S * 2 * F));
  moe_rh_.ensure(fl(S * F));
  moe_ract_.ensure(fl(S * W));
  moe_rscratch_elems_ = matmul_scratch_elems(W, S);
  moe_rscratch_.ensure(moe_rscratch_elems_ * 2);
  launch_slot_rows(moe_rx_.f(), h, E, ss.pos, S, k, true, stream_);
  MatmulParams gu[2];
  const int n_gu = d.gate_up_exps ? 1 : 2;
  if (d.gate_up_exps) {
    gu[0] = grouped_params(d.gate_up_exps, moe_rx_.f(), S, moe_rgu_.f(), 2 * F);
  } else {
    gu[0] = grouped_params(d.gate_exps, moe_rx_.f(), S, moe_rgu_.f(), F);
    gu[1] = grouped_params(d.up_exps, moe_rx_.f(), S, moe_rgu_.f() + S * F, F);
  }
  launch_matmuls(gu, n_gu);  // one preparation of the rows for gate and up
  const auto bias = [&](const DeviceExperts& x, const MatmulParams& q) {
    if (x.b) launch_slot_bias(q.y, q.y_stride, x.n_out, x.b, ss.expert, ss.pos, S, stream_);
  };
  if (d.gate_up_exps) {
    bias(d.gate_up_exps, gu[0]);
  } else {
    bias(d.gate_exps, gu[0]);
    bias(d.up_exps, gu[1]);
  }
  GluParams g = expert_glu(mp, static_cast<bool>(d.gate_up_exps), moe_rgu_.f(), moe_rh_.f(), S, stream_);
  MatmulParams down = grouped_params(d.down_exps, moe_rh_.f(), S, moe_rx_.f(), E);
  down.pre_glu = &g;
  launch_matmul(down);
  bias(d.down_exps, down);
  launch_slot_rows(moe_y_.f(), moe_rx_.f(), E, ss.pos, S, 1, false, stream_);
}

// out = sum_j weight_j * y_{e_j} (+ the shared expert) (+ residual), from moe_y_.
void CudaBackend::combine_experts(const LayerPlan& p, const DeviceLayer& d, const float* h, float* out,
                                  const float* residual, const MatmulParams* h_blocks) {
  const MoePlan& mp = p.moe;
  const int64_t E = m_.hp.n_embd, n = n_tok_, k = moe_stack(mp, d).slots;
  // the shared expert: down(silu(gate h) * up h) [* sigmoid(gate_inp_shexp h)]; stacked, it
  // was the last slots of the routed experts' products (their weights the routing's).
  CombineParams c;
  if (mp.n_ff_shexp > 0 && d.shexp_slots == 0) {
    const int64_t Fs = mp.n_ff_shexp;
    MatmulParams gu[2] = {matmul_params(d.gate_shexp, h, E, gate_.f(), Fs), matmul_params(d.up_shexp, h, E, up_.f(), Fs)};
    // Where both read the blocks the routed experts read (Q8_0, or Q8_K for Q4_K and Q6_K
    // alike), they take h's from moe_h_q8_: no second quantization of h on the chain. Same
    // bits; qwen3-next-80b-a3b Q4_K_M, 4 layers, graph 0.490-0.491 -> 0.487 ms (H200, one call).
    if (h_blocks) {
      MatmulParams a = gu[0], b = gu[1];
      a.act_round = b.act_round = moe_h_q8_.f();
      if (matmul_reads_q8_blocks(a) && matmul_reads_q8_blocks(b) && matmul_reads_q8_0(a) == matmul_reads_q8_0(*h_blocks) &&
          matmul_reads_q8_0(b) == matmul_reads_q8_0(a)) {
        gu[0] = a;
        gu[1] = b;
        gu[0].x_prepared = true;
      }
    }
    launch_matmuls(gu, 2);
    GluParams gs;
    gs.gate = gate_.f();
    gs.up = up_.f();
    gs.gate_stride = gs.up_stride = Fs;
    gs.out = hidden_.f();
    gs.n = Fs;
    gs.n_tok = n;
    gs.stream = stream_;
    MatmulParams sdown = matmul_params(d.down_shexp, hidden_.f(), Fs, moe_sh_y_.f(), E);
    sdown.pre_glu = &gs;
    launch_matmul(sdown);
    c.shared = moe_sh_y_.f();
    if (mp.shexp_gate && d.gate_inp_shexp) {
      MatmulParams gp = matmul_params(d.gate_inp_shexp, h, E, moe_sh_g_.f(), 1);
      gp.matvec_only = true;  // one output per token: cuBLAS would only add f16 rounding
      launch_matmul(gp);
      c.shared_gate = moe_sh_g_.f();
    }
  }
  // out = sum_j weight_j * y_{e_j} (+ shared), added in the order chosen (+ residual)
  c.y = moe_y_.f();
  c.weight = moe_w_.f();
  c.n_tok = n;
  c.k = k;
  c.n_embd = E;
  c.residual = residual;
  c.out = out;
  c.stream = stream_;
  launch_moe_combine(c);
}

}  // namespace frink::cuda::detail
