#include "cuda/device_weights.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "core/error.h"
#include "core/log.h"
#include "cpu/ops.h"
#include "cuda/attention.cuh"
#include "cuda/cuda_check.h"
#include "cuda/delta_net.cuh"
#include "cuda/mamba2.cuh"
#include "cuda/matmul.cuh"
#include "cuda/mla_attention.cuh"
#include "cuda/moe.cuh"

namespace frink::cuda {

namespace {

bool linear_ok(const Linear& l) { return !l || matmul_supported(static_cast<int>(l.w->type)); }

bool experts_ok(const Experts& x) { return !x || matmul_supported(static_cast<int>(x.w->type)); }

// The rows of row_bytes that parts hold (each a whole number of them).
size_t rows_in(const std::vector<std::pair<const void*, size_t>>& parts, size_t row_bytes) {
  size_t n_rows = 0;
  for (const auto& part : parts) n_rows += part.second / row_bytes;
  return n_rows;
}

// What the device MoE path (cuda/moe.cuh) does not do; the host runs such layers.
bool moe_ok(const LayerPlan& p, const LayerWeights& w) {
  const MoePlan& mp = p.moe;
  if (mp.group_limited() && mp.n_group > 32) return false;  // route_token's groups: a lane each
  if (mp.n_expert > kMoeMaxExperts || mp.n_expert_used > 32 || mp.n_expert_used < 1) return false;
  if (!w.ffn_gate_inp || !w.ffn_down_exps || !(w.ffn_gate_up_exps || (w.ffn_gate_exps && w.ffn_up_exps))) return false;
  for (const Experts* x : {&w.ffn_gate_exps, &w.ffn_up_exps, &w.ffn_gate_up_exps, &w.ffn_down_exps})
    if (!experts_ok(*x)) return false;
  for (const Linear* l : {&w.ffn_gate_inp, &w.ffn_gate_shexp, &w.ffn_up_shexp, &w.ffn_down_shexp})
    if (!linear_ok(*l)) return false;
  if (mp.shexp_gate && !w.ffn_gate_inp_shexp) return false;
  return mp.n_ff_shexp == 0 || (w.ffn_gate_shexp && w.ffn_up_shexp && w.ffn_down_shexp);
}

// The stacks a shared expert joins (shared_expert_slots): gate and up (or the fused gate_up,
// the shared gate's rows then its up's), their rows; down, its columns (by_columns). Each with
// the shared matrices it takes and the DeviceLayer stack it becomes.
struct SharedStack {
  const Experts* x;
  const Linear* part[2];  // part[1] null but for the fused gate_up
  DeviceExperts DeviceLayer::*to;
  bool by_columns = false;
};
std::vector<SharedStack> shared_stacks(const LayerWeights& w) {
  if (w.ffn_gate_up_exps)
    return {{&w.ffn_gate_up_exps, {&w.ffn_gate_shexp, &w.ffn_up_shexp}, &DeviceLayer::gate_up_exps},
            {&w.ffn_down_exps, {&w.ffn_down_shexp, nullptr}, &DeviceLayer::down_exps, true}};
  return {{&w.ffn_gate_exps, {&w.ffn_gate_shexp, nullptr}, &DeviceLayer::gate_exps},
          {&w.ffn_up_exps, {&w.ffn_up_shexp, nullptr}, &DeviceLayer::up_exps},
          {&w.ffn_down_exps, {&w.ffn_down_shexp, nullptr}, &DeviceLayer::down_exps, true}};
}

// How many experts of the routed stacks a (device-run) MoE layer's shared expert can be
// uploaded as (0: none), so that it runs as slots k.. of every token inside the routed
// experts' launches rather than as four launches of its own after them (gate|up, GLU and
// down, its gate; qwen3-next-80b-a3b Q4_K_M, 8 layers, tg128 graph 0.878 -> 0.821 ms a token,
// H200, one call). A shared expert n times as wide as a routed one (DeepSeek-V2's 2 x 1408,
// qwen2moe's 4 x 1408) is n of them: its gate and up split by rows, its down by columns (at
// block boundaries), the n down products summed by the combine. It needs the shared matrices
// of the routed ones' type, no bias on either, one scale for the parts of a fused gate_up, the
// slots within the routing's 32, the plain SwiGLU (the shared expert never takes gpt-oss's),
// and, when gated, an F32 router without bias or scale that takes the gate's row as its row
// n_expert.
int64_t shared_expert_slots(const LayerPlan& p, const LayerWeights& w) {
  const MoePlan& mp = p.moe;
  if (mp.n_ff_shexp == 0 || mp.n_ff_exp <= 0 || mp.n_ff_shexp % mp.n_ff_exp != 0 || mp.swiglu_oai) return 0;
  const int64_t n = mp.n_ff_shexp / mp.n_ff_exp;
  if (mp.n_expert_used + n > 32) return 0;
  for (const SharedStack& st : shared_stacks(w)) {
    const Experts& x = *st.x;
    if (!x || x.b) return 0;
    // by rows: the parts' rows are n experts' (of n_in each); by columns: a row of the part
    // is n experts' rows, each whole blocks.
    int64_t rows = 0;
    for (const Linear* l : st.part) {
      if (!l) continue;
      if (!*l || l->b || l->w->type != x.w->type || l->scale != st.part[0]->scale) return 0;
      if (l->n_in() != (st.by_columns ? n * x.n_in() : x.n_in())) return 0;
      rows += l->n_out();
    }
    if (rows != (st.by_columns ? x.n_out() : n * x.n_out())) return 0;
    if (st.by_columns && x.n_in() % ggml_type_info(x.w->type).block_elems != 0) return 0;
  }
  if (!mp.shexp_gate) return n;
  const Linear& r = w.ffn_gate_inp;
  return w.ffn_gate_inp_shexp && r.w->type == GgmlType::F32 && !r.b && r.scale == 1.0f ? n : 0;
}

// A recurrent layer: gated delta nets run (cuda/delta_net.cuh) when their head width and
// conv width fit the kernels and the layer has the host body's shape (no sandwich norms, no
// parallel residual: the host's delta_net_layer applies none); Mamba-2 layers (mamba2.cuh)
// likewise.
Refusal mamba2_refusal(const LayerPlan& p, const LayerWeights& w) {
  const SsmPlan& s = p.ssm;
  if (!mamba2_supported(s.d_state) || !delta_net_supported(s.d_state, s.d_conv) || s.n_v_head <= 0 ||
      s.n_group <= 0 || s.n_v_head % s.n_group != 0 || s.d_inner % s.n_v_head != 0 || p.parallel_residual ||
      p.post_attn_norm || p.post_ffn_norm)
    return Refusal::kShape;
  if (!w.ssm_in || !w.ssm_out || !w.ssm_conv1d || !w.ssm_dt_b || !w.ssm_a || !w.ssm_d) return Refusal::kShape;
  if (p.ffn == FfnKind::kMoe && !moe_ok(p, w)) return Refusal::kMoe;
  for (const Linear* l : {&w.ssm_in, &w.ssm_out, &w.ffn_gate, &w.ffn_up, &w.ffn_down})
    if (!linear_ok(*l)) return Refusal::kQuantType;
  return Refusal::kNone;
}

Refusal recurrent_refusal(const LayerPlan& p, const LayerWeights& w) {
  if (p.recurrent == RecurrentKind::kMamba2) return mamba2_refusal(p, w);
  if (p.recurrent != RecurrentKind::kGatedDeltaNet) return Refusal::kRecurrent;
  const SsmPlan& s = p.ssm;
  if (!delta_net_supported(s.d_state, s.d_conv) || s.head_v_dim() != s.d_state || p.parallel_residual ||
      p.post_attn_norm || p.post_ffn_norm)
    return Refusal::kShape;
  if (!w.ssm_qkv || !w.ssm_z || !w.ssm_out || !w.ssm_conv1d || !w.ssm_dt_b || !w.ssm_a || !w.ssm_norm ||
      !(w.ssm_ba || (w.ssm_beta && w.ssm_alpha)))
    return Refusal::kShape;
  if (p.ffn == FfnKind::kMoe && !moe_ok(p, w)) return Refusal::kMoe;
  for (const Linear* l : {&w.ssm_qkv, &w.ssm_z, &w.ssm_ba, &w.ssm_beta, &w.ssm_alpha, &w.ssm_out, &w.ffn_gate,
                          &w.ffn_up, &w.ffn_down})
    if (!linear_ok(*l)) return Refusal::kQuantType;
  return Refusal::kNone;
}

// A latent-attention layer: the kernel's widths (cuda/mla_attention.cuh), one head count in
// every such layer (the per-head products' slot table, CudaBackend::begin_batch, is built for
// one), the rope's pairs inside the query's rope part.
Refusal mla_refusal(const Model& m, const LayerPlan& p, const LayerWeights& w) {
  const int64_t R = p.mla.kv_lora_rank, n_rot = p.rope.n_rot;
  // (launch_mla_prep norms c as RMS, the one norm DeepSeek files have)
  if (!mla_attention_supported(p.cache_k_width(), R) || p.head_dim_k <= n_rot || p.parallel_residual ||
      m.hp.norm != NormKind::kRms)
    return Refusal::kShape;
  for (const LayerPlan& o : m.hp.layers)
    if (o.attn == AttnKind::kMla && o.n_head != p.n_head) return Refusal::kShape;
  if (p.rope.kind == RopeKind::kNone || n_rot % 2 != 0) return Refusal::kRope;
  if (p.ffn == FfnKind::kMoe && !moe_ok(p, w)) return Refusal::kMoe;
  for (const Linear* l : {&w.wq, &w.wq_a, &w.wq_b, &w.wkv_a_mqa, &w.wo, &w.ffn_gate, &w.ffn_up, &w.ffn_down})
    if (!linear_ok(*l)) return Refusal::kQuantType;
  if (!experts_ok(w.wk_b) || !experts_ok(w.wv_b)) return Refusal::kQuantType;
  return Refusal::kNone;
}

}  // namespace

std::vector<char> padded_rows(const std::vector<std::pair<const void*, size_t>>& parts, size_t row_bytes,
                              size_t dev_row_bytes) {
  std::vector<char> out(rows_in(parts, row_bytes) * dev_row_bytes, 0);
  size_t r = 0;
  for (const auto& [p, bytes] : parts)
    for (size_t i = 0; i < bytes / row_bytes; ++i, ++r)
      std::memcpy(out.data() + r * dev_row_bytes, static_cast<const char*>(p) + i * row_bytes, row_bytes);
  return out;
}

Refusal device_refusal(const Model& m, int64_t il) {
  if (il == m.hp.n_layer) return linear_ok(m.w.output) ? Refusal::kNone : Refusal::kQuantType;
  const LayerPlan& p = m.hp.layers[static_cast<size_t>(il)];
  const LayerWeights& w = m.w.layers[static_cast<size_t>(il)];
  if (p.recurrent != RecurrentKind::kNone) return recurrent_refusal(p, w);
  if (p.attn == AttnKind::kMla) return mla_refusal(m, p, w);
  if (p.ffn == FfnKind::kMoe && !moe_ok(p, w)) return Refusal::kMoe;
  if (p.n_head_kv <= 0 || p.n_head % p.n_head_kv != 0 || p.head_dim_k > kAttnMaxHeadDim ||
      p.head_dim_v > kAttnMaxHeadDim)
    return Refusal::kShape;
  if (p.rope.kind != RopeKind::kNone && (p.rope.n_rot > p.head_dim_k || p.rope.n_rot % 2 != 0)) return Refusal::kRope;
  for (const Linear* l : {&w.wq, &w.wk, &w.wv, &w.wqkv, &w.wo, &w.ffn_gate, &w.ffn_up, &w.ffn_down})
    if (!linear_ok(*l)) return Refusal::kQuantType;
  return Refusal::kNone;
}

DeviceWeights::DeviceWeights(const Model& m, std::span<const Refusal> placed, bool stack_shared) {
  const Hparams& hp = m.hp;
  FRINK_ASSERT(static_cast<int64_t>(placed.size()) == hp.n_layer + 1, "{} placements for {} layers", placed.size(),
               hp.n_layer);
  layers_.resize(static_cast<size_t>(hp.n_layer));
  size_t total = 0;
  int64_t next_report = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    if (il * 10 >= next_report * hp.n_layer) {
      FRINK_LOG_INFO("device: uploading weights, layer {}/{}, {:.2f} GiB so far", il, hp.n_layer, bytes_ / 1073741824.0);
      ++next_report;
    }
    const Refusal r = placed[static_cast<size_t>(il)];
    if (r == Refusal::kNone) {
      upload_layer(m, il, stack_shared);
    } else if (r == Refusal::kMemory) {  // its shape (types, widths, stacking) without its bytes: fill's
      Fill shape;
      fill_ = &shape;
      upload_layer(m, il, stack_shared);
      fill_ = nullptr;
    }
  }
  stack_shared_ = stack_shared;
  if (placed.back() == Refusal::kNone)
    upload_head(m, std::all_of(placed.begin(), placed.end(), [](Refusal r) { return r == Refusal::kNone; }));
  if (m.w.rope_freqs) {
    int64_t n_rot = 0;
    for (const LayerPlan& p : hp.layers) n_rot = std::max(n_rot, p.rope.n_rot);
    rope_freqs = upload_vec(m.w.rope_freqs, n_rot / 2);
  }
  FRINK_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the reorders (device_layout), before any other stream reads
  size_t free1 = 0;
  FRINK_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  FRINK_LOG_INFO("device: {:.2f} GiB of weights resident; device memory used {:.2f} of {:.2f} GiB",
                 bytes_ / 1073741824.0, (total - free1) / 1073741824.0, total / 1073741824.0);
}

void DeviceWeights::upload_layer(const Model& m, int64_t il, bool stack_shared) {
  const Hparams& hp = m.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const LayerWeights& w = m.w.layers[static_cast<size_t>(il)];
  DeviceLayer& d = layers_[static_cast<size_t>(il)];
  const bool ln = hp.norm == NormKind::kLayer;
  auto nrm = [&](const Norm& n, int64_t len) {
    DeviceNorm r = norm(n, len);
    if (!ln) r.b = nullptr;  // RMSNorm has no bias
    return r;
  };
  d.attn_norm = nrm(w.attn_norm, hp.n_embd);
  // Per head, or (olmoe's qk_norm_full) over the whole q and k projections.
  d.q_norm = norm(w.q_norm, p.qk_norm_full ? p.n_head * p.head_dim_k : p.head_dim_k);
  d.k_norm = norm(w.k_norm, p.qk_norm_full ? p.n_head_kv * p.head_dim_k : p.head_dim_k);
  d.q_norm.b = d.k_norm.b = nullptr;
  d.post_attn_norm = nrm(w.post_attn_norm, hp.n_embd);
  d.ffn_norm = nrm(w.ffn_norm, hp.n_embd);
  d.post_ffn_norm = nrm(w.post_ffn_norm, hp.n_embd);
  if (p.recurrent != RecurrentKind::kNone) {
    const SsmPlan& s = p.ssm;
    d.ssm_out = linear(w.ssm_out);
    d.ssm_conv1d = upload_vec(w.ssm_conv1d, s.conv_channels() * s.d_conv);
    d.ssm_conv1d_b = upload_vec(w.ssm_conv1d_b, s.conv_channels());
    d.ssm_dt_b = upload_vec(w.ssm_dt_b, s.n_v_head);
    d.ssm_a = upload_vec(w.ssm_a, s.n_v_head);
    if (p.recurrent == RecurrentKind::kMamba2) {
      d.ssm_in = linear(w.ssm_in);
      d.ssm_d = upload_vec(w.ssm_d, s.n_v_head);
      d.ssm_norm = upload_vec(w.ssm_norm, s.d_inner);
    } else {
      d.ssm_qkv = linear(w.ssm_qkv);
      d.ssm_z = linear(w.ssm_z);
      d.ssm_ba = linear(w.ssm_ba);
      d.ssm_beta = linear(w.ssm_beta);
      d.ssm_alpha = linear(w.ssm_alpha);
      d.ssm_norm = upload_vec(w.ssm_norm, s.head_v_dim());
    }
  }
  if (p.attn == AttnKind::kMla) {
    d.wq_a = linear(w.wq_a);
    d.q_a_norm = nrm(w.q_a_norm, p.mla.q_lora_rank);
    d.wq_b = linear(w.wq_b);
    d.wkv_a_mqa = linear(w.wkv_a_mqa);
    d.kv_a_norm = nrm(w.kv_a_norm, p.mla.kv_lora_rank);
    d.wk_b = experts(w.wk_b, p.n_head);
    d.wv_b = experts(w.wv_b, p.n_head);
  }
  d.wq = linear(w.wq);
  d.wk = linear(w.wk);
  d.wv = linear(w.wv);
  d.wqkv = linear(w.wqkv);
  d.wo = linear(w.wo);
  d.ffn_gate = linear(w.ffn_gate);
  d.ffn_up = linear(w.ffn_up);
  d.ffn_down = linear(w.ffn_down);
  if (p.alibi) {
    std::vector<float> slopes(static_cast<size_t>(p.n_head));
    for (int64_t h = 0; h < p.n_head; ++h)
      slopes[static_cast<size_t>(h)] = cpu::alibi_slope(h, p.n_head, hp.max_alibi_bias);
    d.alibi_slopes = upload_values(slopes);
  }
  if (p.attn_sinks) d.attn_sinks = upload_vec(w.attn_sinks, p.n_head);
  if (p.ffn == FfnKind::kMoe) {
    const int64_t n_exp = p.moe.n_expert;
    d.exp_probs_b = upload_vec(w.exp_probs_b, n_exp);
    d.shexp_slots = stack_shared ? shared_expert_slots(p, w) : 0;
    if (d.shexp_slots > 0) {
      if (!fill_) ++shared_stacked_;
      for (const SharedStack& st : shared_stacks(w))
        d.*st.to = experts_and(*st.x, n_exp, d.shexp_slots, st.part[0], st.part[1], st.by_columns);
      if (p.moe.shexp_gate) {  // the gate's row after the experts' (F32 rows, no bias)
        d.router.type = static_cast<int>(GgmlType::F32);
        d.router.row_bytes = static_cast<size_t>(hp.n_embd) * sizeof(float);
        d.router.n_in = hp.n_embd;
        d.router.n_out = n_exp + 1;
        d.router.w = upload_joined({{w.ffn_gate_inp.w->data, d.router.row_bytes * static_cast<size_t>(n_exp)},
                                    {w.ffn_gate_inp_shexp, d.router.row_bytes}});
      } else {
        d.router = linear(w.ffn_gate_inp);
      }
    } else {
      d.router = linear(w.ffn_gate_inp);
      d.gate_up_exps = experts(w.ffn_gate_up_exps, n_exp);
      d.gate_exps = experts(w.ffn_gate_exps, n_exp);
      d.up_exps = experts(w.ffn_up_exps, n_exp);
      d.down_exps = experts(w.ffn_down_exps, n_exp);
      d.gate_shexp = linear(w.ffn_gate_shexp);
      d.up_shexp = linear(w.ffn_up_shexp);
      d.down_shexp = linear(w.ffn_down_shexp);
      if (w.ffn_gate_inp_shexp) {  // one f32 row, so the shared expert's gate is a product too
        d.gate_inp_shexp.type = 0;
        d.gate_inp_shexp.w = upload_vec(w.ffn_gate_inp_shexp, hp.n_embd);
        d.gate_inp_shexp.row_bytes = static_cast<size_t>(hp.n_embd) * sizeof(float);
        d.gate_inp_shexp.n_in = hp.n_embd;
        d.gate_inp_shexp.n_out = 1;
      }
    }
  }
}

void DeviceWeights::upload_head(const Model& m, bool all_layers) {
  const Hparams& hp = m.hp;
  output_norm = norm(m.w.output_norm, hp.n_embd);
  if (hp.norm != NormKind::kLayer) output_norm.b = nullptr;
  output = linear(m.w.output);
  if (all_layers && !hp.embd_norm && m.w.tok_embd && matmul_supported(static_cast<int>(m.w.tok_embd->type)))
    token_embd = linear(Linear{.w = m.w.tok_embd});
}

size_t DeviceWeights::counted(const Model& m, int64_t il, bool stack_shared) {
  DeviceWeights c;
  c.layers_.resize(static_cast<size_t>(m.hp.n_layer));
  Fill f;  // no slot: places pieces, copies nothing
  c.fill_ = &f;
  if (il < m.hp.n_layer) {
    c.upload_layer(m, il, stack_shared);
  } else {
    c.upload_head(m, true);
  }
  return f.off;
}

std::vector<size_t> DeviceWeights::upload_bytes(const Model& m, bool stack_shared) {
  std::vector<size_t> bytes;
  for (int64_t il = 0; il <= m.hp.n_layer; ++il)
    bytes.push_back(device_refusal(m, il) == Refusal::kNone ? counted(m, il, stack_shared) : 0);
  return bytes;
}

std::vector<Refusal> place_layers(const Model& m, std::span<const size_t> bytes, const Placement& o) {
  const Hparams& hp = m.hp;
  FRINK_ASSERT(static_cast<int64_t>(bytes.size()) == hp.n_layer + 1, "{} sizes for {} layers", bytes.size(),
               hp.n_layer);
  std::vector<Refusal> r;
  for (int64_t il = 0; il <= hp.n_layer; ++il) r.push_back(device_refusal(m, il));
  const auto attention = [&](int64_t il) {
    return hp.layers[static_cast<size_t>(il)].recurrent == RecurrentKind::kNone;
  };
  // Everything the device could run: the weights, and each attention layer's mirror at the
  // planned context.
  size_t all = r.back() == Refusal::kNone ? bytes.back() : 0, mirrors = 0, largest = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    if (r[static_cast<size_t>(il)] != Refusal::kNone) continue;
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    const size_t kv =
        attention(il) ? static_cast<size_t>(o.n_ctx * (p.cache_k_width() + p.cache_v_width())) * sizeof(float) : 0;
    all += bytes[static_cast<size_t>(il)] + kv;
    mirrors += kv;
    if (attention(il)) largest = std::max(largest, bytes[static_cast<size_t>(il)]);
  }
  if (all <= o.budget_bytes && (o.n_gpu_layers < 0 || o.n_gpu_layers > hp.n_layer)) return r;
  // Not all of it: the attention layers left on the host are lent to prompt batches
  // (CudaBackend), which takes their mirrors too and two slots of the largest layer, so those
  // come first and the weights share the rest.
  const size_t lending = mirrors + 2 * largest;
  size_t left = o.budget_bytes > lending ? o.budget_bytes - lending : 0;
  const auto take = [&](size_t need) {
    if (need > left) return false;
    left -= need;
    return true;
  };
  // The head first (read by every token), on the device with the layers only past n_layer, as
  // llama.cpp's -ngl counts it.
  if (r.back() == Refusal::kNone && ((o.n_gpu_layers >= 0 && o.n_gpu_layers <= hp.n_layer) || !take(bytes.back())))
    r.back() = Refusal::kMemory;
  // Then the last layers down; the first that does not fit leaves every earlier one on the host
  // too, so the residual crosses once a pass.
  int64_t placed = 0;
  bool full = false;
  for (int64_t il = hp.n_layer - 1; il >= 0; --il) {
    Refusal& ri = r[static_cast<size_t>(il)];
    if (ri != Refusal::kNone) continue;
    full = full || (o.n_gpu_layers >= 0 && placed >= o.n_gpu_layers) || !take(bytes[static_cast<size_t>(il)]);
    if (full) {
      ri = Refusal::kMemory;
    } else {
      ++placed;
    }
  }
  return r;
}

DeviceWeights::~DeviceWeights() {
  for (void* p : allocations_) cudaFree(p);
}

char* DeviceWeights::fill_place(size_t n) {
  fill_->off = (fill_->off + kFillAlign - 1) / kFillAlign * kFillAlign;
  FRINK_ASSERT(fill_->off + n <= fill_->cap, "a layer's fill past its slot ({} + {} > {})", fill_->off, n, fill_->cap);
  char* d = fill_->base ? fill_->base + fill_->off : nullptr;  // no slot: counted, or a shape
  fill_->off += n;
  return d;
}

void DeviceWeights::fill_copy(void* dst, const void* src, size_t n) {
  if (fill_->copy && *fill_->copy) {
    (*fill_->copy)(dst, src, n);
  } else {
    FRINK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, fill_->stream));
  }
}

void DeviceWeights::fill(const Model& m, int64_t il, void* slot, size_t slot_bytes, cudaStream_t stream,
                         const FillCopy& copy) {
  Fill f;
  f.base = static_cast<char*>(slot);
  f.cap = slot_bytes;
  f.stream = stream;
  f.copy = &copy;
  fill_ = &f;
  try {
    upload_layer(m, il, stack_shared_);
  } catch (...) {
    fill_ = nullptr;
    throw;
  }
  fill_ = nullptr;
}

size_t DeviceWeights::fill_bytes(const Model& m, int64_t il) const { return counted(m, il, stack_shared_); }

const void* DeviceWeights::upload(const void* host, size_t n_bytes) {
  if (fill_) {
    if (auto it = fill_->seen.find(host); it != fill_->seen.end()) return it->second;
    char* d = fill_place(n_bytes);
    if (d) fill_copy(d, host, n_bytes);
    fill_->seen[host] = d;
    return d;
  }
  if (auto it = uploaded_.find(host); it != uploaded_.end()) return it->second;
  void* d = nullptr;
  FRINK_CUDA_CHECK(cudaMalloc(&d, n_bytes));
  allocations_.push_back(d);
  FRINK_CUDA_CHECK(cudaMemcpy(d, host, n_bytes, cudaMemcpyHostToDevice));
  bytes_ += n_bytes;
  uploaded_[host] = d;
  return d;
}

const float* DeviceWeights::upload_values(const std::vector<float>& v) {
  return static_cast<const float*>(upload_joined({{v.data(), v.size() * sizeof(float)}}, true));
}

const float* DeviceWeights::upload_vec(const float* host, int64_t n) {
  return host ? static_cast<const float*>(upload(host, static_cast<size_t>(n) * sizeof(float))) : nullptr;
}

DeviceLinear DeviceWeights::linear(const Linear& l) {
  DeviceLinear d;
  if (!l) return d;
  d.type = static_cast<int>(l.w->type);
  d.row_bytes = device_row_bytes(static_cast<int>(l.w->type), l.n_in(), l.w->row_bytes());
  d.n_in = l.n_in();
  d.n_out = l.n_out();
  d.w = upload_rows({{l.w->data, l.w->row_bytes() * static_cast<size_t>(d.n_out)}}, l.w->row_bytes(), d.row_bytes);
  d.type = device_layout(d.w, d.row_bytes * static_cast<size_t>(d.n_out), d.type, d.n_in);
  d.b = upload_vec(l.b, d.n_out);
  d.scale = l.scale;
  d.bias_before_scale = l.bias_before_scale;
  return d;
}

DeviceExperts DeviceWeights::experts(const Experts& x, int64_t n_expert) {
  DeviceExperts d;
  if (!x) return d;
  d.type = static_cast<int>(x.w->type);
  d.row_bytes = device_row_bytes(static_cast<int>(x.w->type), x.n_in(), x.w->row_bytes());
  d.n_in = x.n_in();
  d.n_out = x.n_out();
  d.expert_bytes = d.row_bytes * static_cast<size_t>(d.n_out);
  d.w = upload_rows({{x.w->data, x.w->row_bytes() * static_cast<size_t>(d.n_out * n_expert)}}, x.w->row_bytes(),
                    d.row_bytes);
  d.type = device_layout(d.w, d.expert_bytes * static_cast<size_t>(n_expert), d.type, d.n_in);
  d.b = upload_vec(x.b, n_expert * d.n_out);
  d.scale = upload_vec(x.scale, n_expert);
  return d;
}

DeviceExperts DeviceWeights::experts_and(const Experts& x, int64_t n_expert, int64_t n_more, const Linear* a,
                                         const Linear* b, bool by_columns) {
  DeviceExperts d;
  d.type = static_cast<int>(x.w->type);
  const size_t row = x.w->row_bytes();  // as the file holds it; d.row_bytes as the device does
  d.row_bytes = device_row_bytes(static_cast<int>(x.w->type), x.n_in(), row);
  d.n_in = x.n_in();
  d.n_out = x.n_out();
  d.expert_bytes = d.row_bytes * static_cast<size_t>(d.n_out);
  std::vector<std::pair<const void*, size_t>> parts = {{x.w->data, row * static_cast<size_t>(d.n_out * n_expert)}};
  std::vector<char> cols;  // by_columns: a's rows cut into n_more experts' rows
  const auto* pa = reinterpret_cast<const char*>(a->w->data);
  const size_t a_row = a->w->row_bytes();
  if (by_columns && !copies()) {  // counted: the cut's size only
    parts.emplace_back(nullptr, row * static_cast<size_t>(d.n_out * n_more));
  } else if (by_columns) {
    cols.resize(row * static_cast<size_t>(d.n_out * n_more));
    for (int64_t j = 0; j < n_more; ++j)
      for (int64_t r = 0; r < d.n_out; ++r)
        std::memcpy(cols.data() + static_cast<size_t>(j * d.n_out + r) * row,
                    pa + static_cast<size_t>(r) * a_row + static_cast<size_t>(j) * row, row);
    parts.emplace_back(cols.data(), cols.size());
  } else if (!b) {  // a's rows are the n_more experts' in order
    parts.emplace_back(pa, a_row * static_cast<size_t>(a->n_out()));
  } else {  // a fused gate_up: expert j is a's j-th share of rows, then b's
    const size_t share = a_row * static_cast<size_t>(a->n_out() / n_more);
    for (int64_t j = 0; j < n_more; ++j) {
      parts.emplace_back(pa + static_cast<size_t>(j) * share, share);
      parts.emplace_back(reinterpret_cast<const char*>(b->w->data) + static_cast<size_t>(j) * share, share);
    }
  }
  d.w = upload_rows(parts, row, d.row_bytes, !cols.empty());
  d.type = device_layout(d.w, d.expert_bytes * static_cast<size_t>(n_expert + n_more), d.type, d.n_in);
  if (x.scale || a->scale != 1.0f) {  // the stacked expert's scale: its matrices' one
    std::vector<float> s(static_cast<size_t>(n_expert + n_more), a->scale);
    if (x.scale) std::copy(x.scale, x.scale + n_expert, s.begin());
    else std::fill(s.begin(), s.begin() + n_expert, 1.0f);
    d.scale = upload_values(s);
  }
  return d;
}

// Rows as the file holds them go through upload or upload_joined. Padded rows are a temporary
// copy, remembered as one host matrix's, as upload does (a tied matrix met twice is uploaded
// once); only counted when the fill copies nothing.
const void* DeviceWeights::upload_rows(const std::vector<std::pair<const void*, size_t>>& parts, size_t row_bytes,
                                       size_t dev_row_bytes, bool temporary) {
  if (dev_row_bytes == row_bytes)
    return parts.size() == 1 && !temporary ? upload(parts[0].first, parts[0].second) : upload_joined(parts, temporary);
  const void* host = parts.size() == 1 && !temporary ? parts[0].first : nullptr;
  auto& seen = fill_ ? fill_->seen : uploaded_;
  if (auto it = seen.find(host); host && it != seen.end()) return it->second;
  const void* d = nullptr;
  if (!copies()) {
    d = upload_joined({{nullptr, rows_in(parts, row_bytes) * dev_row_bytes}}, false);
  } else {
    const std::vector<char> padded = padded_rows(parts, row_bytes, dev_row_bytes);
    d = upload_joined({{padded.data(), padded.size()}}, true);
  }
  if (host) seen[host] = d;
  return d;
}

// Never shared through uploaded_: the joined copy is no part's own.
const void* DeviceWeights::upload_joined(const std::vector<std::pair<const void*, size_t>>& parts, bool temporary) {
  size_t n = 0;
  for (const auto& [p, bytes] : parts) n += bytes;
  if (fill_) {
    char* d = fill_place(n);
    size_t at = 0;
    for (const auto& [p, bytes] : parts) {
      if (d && bytes) fill_copy(d + at, p, bytes);
      at += bytes;
    }
    // A temporary part must have left before its caller frees it: the stage ring copies it
    // before fill_copy returns, a pageable cudaMemcpyAsync may not.
    if (temporary && d && !(fill_->copy && *fill_->copy)) FRINK_CUDA_CHECK(cudaStreamSynchronize(fill_->stream));
    return d;
  }
  void* d = nullptr;
  FRINK_CUDA_CHECK(cudaMalloc(&d, n));
  allocations_.push_back(d);
  size_t at = 0;
  for (const auto& [p, bytes] : parts) {
    if (bytes) FRINK_CUDA_CHECK(cudaMemcpy(static_cast<char*>(d) + at, p, bytes, cudaMemcpyHostToDevice));
    at += bytes;
  }
  bytes_ += n;
  return d;
}

// Matrices x8_type keeps in another order (Q4_0, Q8_0, MXFP4; Q4_K, Q5_K, Q6_K of whole tiles; matmul.cuh) are
// reordered once, where they land, on the legacy stream (the constructor waits for it once at
// its end); repacked_ keeps a tied matrix, uploaded once and met twice, from a second pass.
int DeviceWeights::device_layout(const void* d, size_t n_bytes, int type, int64_t n_in) {
  const int t = x8_type(type, n_in);
  if (fill_) {  // a slot's copy: reordered after it lands, on its stream, at every fill
    if (t != type && d) repack_x8(type, const_cast<void*>(d), n_bytes, n_in, fill_->stream);
    return t;
  }
  if (t != type && repacked_.insert(d).second) repack_x8(type, const_cast<void*>(d), n_bytes, n_in, nullptr);
  return t;
}

DeviceNorm DeviceWeights::norm(const Norm& n, int64_t len) { return {upload_vec(n.w, len), upload_vec(n.b, len)}; }

}  // namespace frink::cuda
