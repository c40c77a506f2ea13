// CudaBackend's latent-attention layers (DeepSeek-2/3, plan.attn == kMla): the host's
// cpu::mla_attention step by step on the device (see cuda_backend_impl.h; the batch and mirror
// machinery is in cuda_backend.cpp, the token graphs in cuda_backend_token.cpp). The layer's cache
// holds one row [c | k_pe] a token, so its mirror is a K mirror R + n_rot wide with no V, filled
// and copied back as any other. The per-head matrices wk_b and wv_b are stacks of n_head experts:
// each product is one launch whatever the head count, a slot per (token, head) taking head h's
// matrix (mla_heads_) in a decode batch, one strided-batched cuBLAS call over the heads in a prompt
// batch.
#include "core/error.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/mla_attention.cuh"
#include "cuda/rope.cuh"

namespace frink::cuda::detail {

void CudaBackend::enqueue_mla(int64_t il, KvMirror& mirror, const Pending& pd, int64_t max_keys) {
  const Hparams& hp = m_.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const DeviceLayer& d = w_.layer(il);
  const int64_t E = hp.n_embd, n = n_tok_, H = p.n_head, dk = p.head_dim_k, n_rot = p.rope.n_rot;
  const int64_t R = p.mla.kv_lora_rank, W = R + n_rot, Q = p.mla.q_lora_rank;
  const bool ln = hp.norm == NormKind::kLayer;
  FRINK_ASSERT(fold_for_layer_ != il, "layer {}: a folded norm before latent attention", il);
  FRINK_ASSERT(max_keys >= pos0_ + n, "attention grid for {} keys, {} needed", max_keys, pos0_ + n);

  // h = attn_norm(x); q = wq_b(q_a_norm(wq_a h)) (or wq h) [n][H][nope | rope], and
  // kv = wkv_a_mqa h [n][c | k_pe] (k_ holds it): one preparation of h for both products.
  const NormParams attn_norm = norm_params(d.attn_norm, x_.f(), h_.f(), n, E, E, ln);
  MatmulParams in[2] = {d.wq_a ? matmul_params(d.wq_a, h_.f(), E, mla_qa_.f(), Q)
                               : matmul_params(d.wq, h_.f(), E, q_.f(), H * dk),
                        matmul_params(d.wkv_a_mqa, h_.f(), E, k_.f(), W)};
  in[0].pre_norm = &attn_norm;
  launch_matmuls(in, 2);
  if (d.wq_a) {
    norm_rows(d.q_a_norm, mla_qa_.f(), mla_qa_.f(), n, Q, Q, ln);
    matmul(d.wq_b, mla_qa_.f(), Q, q_.f(), H * dk);
  }
  // The absorbed query [wk_b_h q_nope_h | q_pe_h] [n][H][W]: row t * H + h of the wk_b
  // product reads q's head row (its first nope floats) and writes the first R of its row. A
  // decode batch's rows are slots taking head h's matrix (mla_heads_: matrix-vector kernels, a
  // token graph's launches); a prompt batch's, one strided-batched cuBLAS call over the heads.
  const bool batched = n > kMatvecMaxTok;
  const auto per_head = [&](const DeviceExperts& x, const float* in_rows, int64_t in_stride, float* out,
                            int64_t out_stride) {
    MatmulParams mp;
    if (batched) {
      mp = matmul_params(first_expert(x), in_rows, in_stride, out, out_stride);
      mp.n_tok = n * H;
      mp.head_batch = H;
      mp.expert_bytes = x.expert_bytes;
    } else {
      mp = expert_params(x, in_rows, n * H, 1, out, out_stride);
      mp.x_stride = in_stride;
      mp.slot_expert = static_cast<const int32_t*>(mla_heads_.p);
    }
    return mp;
  };
  MatmulParams kb = per_head(d.wk_b, q_.f(), dk, mla_q_.f(), W);
  MatmulParams vb = per_head(d.wv_b, mla_ctx_.f(), R, attn_.f(), p.head_dim_v);

  // One launch before the attention (launch_mla_prep): q_pe rotated into the query's tail (llama.cpp's
  // deepseek2 graph passes no frequency factors), q_nope as wk_b's Q8_0 input where it reads
  // one, c = kv_a_norm(kv[:R]) and k_pe rotated, the row [c | k_pe] into the mirror at pos0 and
  // on its way back to the host.
  RopeLaunch r = rope_launch(p);
  r.freq_factors = nullptr;
  MlaPrepParams prep;
  prep.q = q_.f();
  prep.kv = k_.f();
  prep.kv_norm_w = d.kv_a_norm.w;
  prep.eps = hp.norm_eps;
  prep.q_abs = mla_q_.f();
  kb.x_prepared = !batched && matmul_reads_q8_0(kb);  // (nope % 32 == 0 then)
  if (kb.x_prepared) {
    prep.q8 = q8_0_act(kb).q;
    prep.d8 = q8_0_act(kb).d;
  }
  prep.mirror = mirror.k_rows(0);
  prep.stage = dstage_.f() + pd.k_off;
  prep.pos = pos_dev_;
  prep.n_tok = n;
  prep.n_head = H;
  prep.head_dim = dk;
  prep.n_rot = n_rot;
  prep.rank = R;
  prep.freq = rope_freq(r);
  prep.neox = r.neox;
  prep.stream = stream_;
  launch_mla_prep(prep);
  launch_matmul(kb);

  // softmax(q . rows * scale) over rows [0, pos0 + t], weighing each row's c: [n][H][R] (and
  // as wv_b's Q8_0 input where it reads one)
  MlaAttnParams a;
  a.q = mla_q_.f();
  a.rows = mirror.k_rows(0);
  a.out = mla_ctx_.f();
  a.n_tok = n;
  a.n_head = H;
  a.width = W;
  a.rank = R;
  a.pos = pos_dev_;
  a.max_keys = max_keys;
  a.scale = p.attn_scale;
  a.partial = partial_.f();
  a.stream = stream_;
  vb.x_prepared = !batched && matmul_reads_q8_0(vb);  // (R % 32 == 0 then)
  if (vb.x_prepared) {
    a.out_q8 = q8_0_act(vb).q;
    a.out_d8 = q8_0_act(vb).d;
  }
  launch_mla_attention(a);
  // o_h = wv_b_h ctx_h [n][H][head_dim_v], then x = x + wo o and the FFN
  launch_matmul(vb);
  enqueue_residual_ffn(il, p, d, d.wo, attn_.f(), H * p.head_dim_v);
}

}  // namespace frink::cuda::detail
