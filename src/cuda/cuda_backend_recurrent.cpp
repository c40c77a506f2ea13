// CudaBackend's gated delta net layers and its side of the recurrent state link (see
// cuda_backend_impl.h; the batch and attention machinery is in cuda_backend.cpp, the token
// graphs in cuda_backend_token.cpp).
//
// Gated delta nets (hybrids): a recurrent layer is ONE submission too (norm, projections,
// gates, conv, the delta rule, gated norm, output projection, residual, FFN), enqueued on the
// same stream, so a run of recurrent layers and the attention layers between them costs no
// wait. The sequence's recurrent state lives in a RecurrentMirror that the kernels update:
// nothing crosses to the host per token, the device is left AHEAD of the host's
// RecurrentState (told at the wait, flush()), and the state pulls from here whenever the host
// reads it (RecurrentDeviceLink::pull). Snapshots the state wants are copied to pinned
// staging at their segment ends and saved into the state at flush(). Batches update the
// mirror's current copy in place; in a token graph the recurrent layers read one of its two
// copies and write the other (fixed addresses, part of the graph key, so replays need nothing
// new), and a snapshot after the token is copied out after the replay.
#include <cmath>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_backend_impl.h"
#include "cuda/delta_net.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/mamba2.cuh"
#include "cuda/norm.cuh"

namespace frink::cuda::detail {

void CudaBackend::run_recurrent_layer(int64_t il, RecurrentState& state) {
  const LayerPlan& p = m_.hp.layers[static_cast<size_t>(il)];
  FRINK_ASSERT(refusal_[static_cast<size_t>(il)] == Refusal::kNone && p.recurrent != RecurrentKind::kNone,
               "run_recurrent_layer on layer {}", il);
  RecurrentMirror& rm = ready_recurrent(state);
  rm.prepare(state, il, stream_);
  // The host body's segments (cpu::recurrent_layer): cut after every position the state keeps
  // a snapshot of, so the snapshot is the state there whatever the batch boundaries were.
  std::vector<int64_t> ends;
  for (int64_t pos = pos0_ + 1; pos <= pos0_ + n_tok_; ++pos)
    if (pos == pos0_ + n_tok_ || state.wants_snapshot(pos, pos0_, pos0_ + n_tok_)) ends.push_back(pos - pos0_);
  rm.running(il);  // before the first launch: a throw below leaves the copy untrusted
  pending_rec_.push_back({&state, &rm, il, false});
  enqueue_recurrent(il, rm, rm.half(il), rm.half(il), ends, &state);
}

void CudaBackend::enqueue_recurrent(int64_t il, RecurrentMirror& rm, int from, int to, std::span<const int64_t> ends,
                                    RecurrentState* snap) {
  if (m_.hp.layers[static_cast<size_t>(il)].recurrent == RecurrentKind::kMamba2)
    enqueue_mamba2(il, rm, from, to, ends, snap);
  else
    enqueue_delta_net(il, rm, from, to, ends, snap);
}

// The host's mamba2_layer (cpu/recurrent_layer.cpp) step by step, every step on the device.
void CudaBackend::enqueue_mamba2(int64_t il, RecurrentMirror& rm, int from, int to, std::span<const int64_t> ends,
                                 RecurrentState* snap) {
  const Hparams& hp = m_.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const DeviceLayer& d = w_.layer(il);
  const SsmPlan& sp = p.ssm;
  const int64_t E = hp.n_embd, n = n_tok_, C = sp.conv_channels(), DI = sp.d_inner, H = sp.n_v_head;
  const int64_t W = DI + C + H;
  FRINK_ASSERT(!ends.empty() && ends.back() == n && (from == to || ends.size() == 1),
               "segments must end at the batch end, and read the state they write");

  // h = rms(x) * attn_norm; z | xBC | dt = ssm_in h
  const NormParams attn_norm = norm_params(d.attn_norm, x_.f(), h_.f(), n, E, E, hp.norm == NormKind::kLayer);
  MatmulParams in = matmul_params(d.ssm_in, h_.f(), E, mb_in_.f(), W);
  in.pre_norm = &attn_norm;
  launch_matmuls(&in, 1);

  // Segment by segment: xBC = silu(conv1d(xBC)) against the conv state, then the selective
  // scan against the SSM state, its output (y + D x) * silu(z).
  int64_t b = 0;
  for (const int64_t e : ends) {
    launch_conv1d_silu(conv_params(il, rm, from, to, mb_in_.f() + b * W + DI, W, mb_xbc_.f() + b * C, e - b));
    Mamba2ScanParams sc;
    sc.xbc = mb_xbc_.f() + b * C;
    sc.xbc_stride = C;
    sc.zdt = mb_in_.f() + b * W;
    sc.zdt_stride = W;
    sc.dt_off = DI + C;
    sc.dt_bias = d.ssm_dt_b;
    sc.a = d.ssm_a;
    sc.d = d.ssm_d;
    sc.state = rm.ssm(il, from);
    if (to != from) sc.state_out = rm.ssm(il, to);
    sc.y = mb_y_.f() + b * DI;
    sc.n_tok = e - b;
    sc.n_head = H;
    sc.head_dim = DI / H;
    sc.d_state = sp.d_state;
    sc.n_group = sp.n_group;
    sc.stream = stream_;
    launch_mamba2_scan(sc);
    if (snap && snap->wants_snapshot(pos0_ + e, pos0_, pos0_ + n)) stage_snapshot(*snap, rm, il, pos0_ + e, to);
    b = e;
  }
  // y = rms(y) * ssm_norm per group; x = x + ssm_out(y); x = x + ffn(rms(x) * ffn_norm)
  if (d.ssm_norm) {
    GroupNormParams gn;
    gn.y = mb_y_.f();
    gn.w = d.ssm_norm;
    gn.n_tok = n;
    gn.width = DI;
    gn.n_group = sp.n_group;
    gn.eps = hp.norm_eps;
    gn.stream = stream_;
    launch_group_rms_norm(gn);
  }
  enqueue_residual_ffn(il, p, d, d.ssm_out, mb_y_.f(), DI);
}

ConvParams CudaBackend::conv_params(int64_t il, RecurrentMirror& rm, int from, int to, const float* x,
                                    int64_t x_stride, float* y, int64_t n_tok) {
  const SsmPlan& sp = m_.hp.layers[static_cast<size_t>(il)].ssm;
  const DeviceLayer& d = w_.layer(il);
  ConvParams cp;
  cp.x = x;
  cp.x_stride = x_stride;
  cp.y = y;
  cp.y_stride = sp.conv_channels();
  cp.n_tok = n_tok;
  cp.channels = sp.conv_channels();
  cp.width = sp.d_conv;
  cp.w = d.ssm_conv1d;
  cp.bias = d.ssm_conv1d_b;
  cp.state = rm.conv(il, from);
  if (to != from) cp.state_out = rm.conv(il, to);
  cp.stream = stream_;
  return cp;
}

// The host's delta_net_layer (cpu/recurrent_layer.cpp) step by step, every step on the device.
void CudaBackend::enqueue_delta_net(int64_t il, RecurrentMirror& rm, int from, int to, std::span<const int64_t> ends,
                                    RecurrentState* snap) {
  const Hparams& hp = m_.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const DeviceLayer& d = w_.layer(il);
  const SsmPlan& sp = p.ssm;
  const int64_t E = hp.n_embd, n = n_tok_, C = sp.conv_channels(), dh = sp.d_state;
  const int64_t nk = sp.n_group, nv = sp.n_v_head, V = sp.d_inner;
  FRINK_ASSERT(!ends.empty() && ends.back() == n && (from == to || ends.size() == 1),
               "segments must end at the batch end, and read the state they write");

  // h = rms(x) * attn_norm; qkv = attn_qkv h; z = attn_gate h; beta, alpha = ssm_ba h (or ssm_beta h, ssm_alpha h)
  // The norm runs as the products' producer (MatmulParams::pre_norm): where they read dp4a
  // blocks (Q4_K_M: Q5_K qkv, Q4_K z), it writes them with h, one launch fewer. With the GLU
  // in ssm_out's producer below: qwen3-next-80b-a3b Q4_K_M, 8 layers, tg128 graph 0.673 /
  // 0.676 -> 0.652 / 0.653 ms, logits bit for bit (H200, one call, alternating).
  const NormParams attn_norm = norm_params(d.attn_norm, x_.f(), h_.f(), n, E, E, hp.norm == NormKind::kLayer);
  MatmulParams ps[4];
  int n_ps = 0;
  ps[n_ps++] = matmul_params(d.ssm_qkv, h_.f(), E, gdn_qkv_.f(), C);
  ps[n_ps++] = matmul_params(d.ssm_z, h_.f(), E, gdn_z_.f(), V);
  if (d.ssm_ba) {
    ps[n_ps++] = matmul_params(d.ssm_ba, h_.f(), E, gdn_ba_.f(), 2 * nv);
  } else {  // beta and alpha side by side, as the gates kernel reads them
    ps[n_ps++] = matmul_params(d.ssm_beta, h_.f(), E, gdn_ba_.f(), 2 * nv);
    ps[n_ps++] = matmul_params(d.ssm_alpha, h_.f(), E, gdn_ba_.f() + nv, 2 * nv);
  }
  ps[0].pre_norm = &attn_norm;
  launch_matmuls(ps, n_ps);  // one rounding of h for all of them
  // beta = sigmoid(b); g = softplus(a + dt_bias) * ssm_a
  DeltaGatesParams gp;
  gp.ba = gdn_ba_.f();
  gp.fused = static_cast<bool>(d.ssm_ba);
  gp.n_tok = n;
  gp.n_v_head = nv;
  gp.n_k_head = nk;
  gp.dt_bias = d.ssm_dt_b;
  gp.a = d.ssm_a;
  gp.beta = gdn_beta_.f();
  gp.g = gdn_g_.f();
  gp.stream = stream_;

  // Segment by segment: qkv = silu(conv1d(qkv)) against the conv state; q, k = l2norm(q),
  // l2norm(k) per key head; o = gated_delta_rule(q / sqrt(d), k, v, g, beta) against the state.
  int64_t b = 0;
  for (const int64_t e : ends) {
    const ConvParams cp = conv_params(il, rm, from, to, gdn_qkv_.f() + b * C, C, gdn_conv_.f() + b * C, e - b);
    L2NormParams lp;
    lp.x = gdn_conv_.f() + b * C;
    lp.x_stride = C;
    lp.n_tok = e - b;
    lp.n_head = 2 * nk;  // q heads then k heads, contiguous
    lp.n = dh;
    lp.eps = hp.norm_eps;
    lp.stream = stream_;
    // A decode token: the three in one launch. qwen3-next-80b-a3b Q4_K_M, 4 layers, tg128 graph
    // 0.383 / 0.379 -> 0.369 / 0.368 ms (H200, one call, alternating; test_gpu passed).
    if (n == 1 && delta_decode_prep_ok(cp, lp, gp)) {
      launch_delta_decode_prep(cp, lp, gp);
    } else {
      if (b == 0) launch_delta_gates(gp);  // every token's gates, before the first delta rule
      launch_conv1d_silu(cp);
      launch_l2_norm(lp);
    }
    DeltaRuleParams dp;
    dp.qkv = gdn_conv_.f() + b * C;
    dp.qkv_stride = C;
    dp.beta = gdn_beta_.f() + b * nv;
    dp.g = gdn_g_.f() + b * nv;
    dp.out = gdn_o_.f() + b * V;
    dp.out_stride = V;
    dp.state = rm.ssm(il, from);
    if (to != from) dp.state_out = rm.ssm(il, to);
    dp.n_tok = e - b;
    dp.n_v_head = nv;
    dp.n_k_head = nk;
    dp.d = dh;
    dp.kv_head_tiled = sp.kv_head_tiled;
    dp.q_scale = 1.0f / std::sqrt(static_cast<float>(dh));
    dp.stream = stream_;
    launch_delta_rule(dp);
    if (snap && snap->wants_snapshot(pos0_ + e, pos0_, pos0_ + n)) stage_snapshot(*snap, rm, il, pos0_ + e, to);
    b = e;
  }

  // o = rms(o) * ssm_norm * silu(z) per value head: the norm in the GLU's launch (up_norm),
  // where its heads tile the GLU's 256-element blocks. One launch fewer: qwen3-next 4 layers,
  // graph 0.369 / 0.368 -> 0.365 / 0.366 ms (the call above).
  GluParams g;
  g.gate = gdn_z_.f();
  g.up = gdn_o_.f();
  g.gate_stride = g.up_stride = V;
  g.out = gdn_o_.f();  // element by element: each output is its own up input
  g.n = V;
  g.n_tok = n;
  g.up_norm_w = d.ssm_norm;
  g.up_norm_n = dh;
  g.up_norm_eps = hp.norm_eps;
  g.stream = stream_;
  if (!glu_norm_ok(g)) {
    g.up_norm_w = nullptr;
    norm_rows(DeviceNorm{d.ssm_norm, nullptr}, gdn_o_.f(), gdn_o_.f(), n * nv, dh, dh, false);
  }
  // x = x + ssm_out(o); x = x + ffn(rms(x) * ffn_norm), the GLU in ssm_out's producer (with
  // o's dp4a blocks where ssm_out reads them)
  enqueue_residual_ffn(il, p, d, d.ssm_out, gdn_o_.f(), V, false, &g);
}

void CudaBackend::stage_snapshot(RecurrentState& s, RecurrentMirror& rm, int64_t il, int64_t pos, int half) {
  const RecurrentState::LayerShape shape = s.shape(il);
  const size_t conv_n = static_cast<size_t>(shape.conv), ssm_n = static_cast<size_t>(shape.ssm);
  FRINK_ASSERT(snap_used_ + conv_n + ssm_n <= snap_staging_.floats(), "snapshot staging too small");
  const PendingSnap ps{&s, pos, il, snap_used_, snap_used_ + conv_n};
  // Stream-ordered: the copies read the state as it stands after this segment's kernels.
  if (conv_n > 0)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(snap_staging_.f() + ps.conv_off, rm.conv(il, half), conv_n * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
  if (ssm_n > 0)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(snap_staging_.f() + ps.ssm_off, rm.ssm(il, half), ssm_n * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
  snap_used_ += conv_n + ssm_n;
  pending_snaps_.push_back(ps);
}

RecurrentMirror& CudaBackend::ready_recurrent(RecurrentState& s) {
  std::unique_ptr<RecurrentMirror>& slot = rec_mirrors_[&s];
  if (!slot) {
    std::vector<bool> on_device(static_cast<size_t>(m_.hp.n_layer));
    for (int64_t il = 0; il < m_.hp.n_layer; ++il)
      on_device[static_cast<size_t>(il)] = m_.hp.layers[static_cast<size_t>(il)].recurrent != RecurrentKind::kNone &&
                                           refusal_[static_cast<size_t>(il)] == Refusal::kNone;
    try {
      slot = std::make_unique<RecurrentMirror>(s, on_device);
    } catch (...) {
      rec_mirrors_.erase(&s);
      throw;
    }
    FRINK_LOG_DEBUG("device: recurrent state mirror of {:.1f} MiB", slot->bytes() / 1048576.0);
  }
  // A state still linked to another backend pulls from it and leaves it first.
  s.attach_device(this);
  return *slot;
}

void CudaBackend::pull(const RecurrentState& s, int64_t layer, float* conv, float* ssm) {
  auto it = rec_mirrors_.find(const_cast<RecurrentState*>(&s));
  FRINK_ASSERT(it != rec_mirrors_.end(), "pull from a state this device holds no copy of");
  it->second->pull(layer, conv, ssm, stream_);
}

void CudaBackend::forget(const RecurrentState& s) noexcept {
  auto it = rec_mirrors_.find(const_cast<RecurrentState*>(&s));
  if (it == rec_mirrors_.end()) return;
  cudaStreamSynchronize(stream_);  // no queued work may still write the buffers freed below
  if (ahead_.recurrent == &s) ahead_ = {};  // a step ahead on its state: dropped (the sync above waited for it)
  std::erase_if(pending_rec_, [&](const PendingRec& pr) { return pr.state == &s; });
  std::erase_if(pending_snaps_, [&](const PendingSnap& ps) { return ps.state == &s; });
  rec_mirrors_.erase(it);
}

}  // namespace frink::cuda::detail
