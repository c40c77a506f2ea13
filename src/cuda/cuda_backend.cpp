// CudaBackend: one attention layer = ONE submission. Attention norm, Q/K/V projections,
// QK-norm, RoPE, the K/V append to the mirror (and the copy back to the host), split-K
// attention against the mirror, output projection, residual, FFN norm, FFN and residual are
// all enqueued on one stream; nothing waits until the Decoder needs the residual or the
// logits on the host, so a token whose layers all run here costs one wait.
//
// K/V copy-back: the K/V append kernel writes each layer's new rows into the mirror and into a
// device staging buffer (dstage_); flush() copies what was staged to pinned host staging in
// ONE copy (v1 made two per layer: 64 copy nodes in a token's graph), waits, appends the rows
// to their host caches and marks the mirrors caught up. Host caches are behind only between
// a run_layer and that wait, and nothing reads them in between (a host layer reads only its
// own cache).
//
// The whole token (run_token): a decode step whose layers and head all run here is ONE
// CUDA graph replay and one wait. The graph is the same enqueue code (enqueue_layer,
// enqueue_head) captured once; the position lives in device memory (pos_dev_, written
// before each replay) and every kernel that depends on it reads it there, so replays need
// no new parameters. What a graph bakes in is its key (graph_key): buffer and mirror
// addresses, and the attention grid's key bound, a power of two of the length. A key not
// seen before (a buffer or mirror grown, the length past the next power of two, another
// sequence's mirrors) captures a new graph: about log2(context) captures in a sequence's
// life. The last kMaxTokenGraphs graphs are kept by key, so sequences taking turns replay
// their own. Mirror staleness is settled before the replay (prepare() uploads outside the
// graph), so the replay always reads a mirror that agrees with its host cache.
//
// One step ahead: a step's pick (the argmax, or the sampler's draw with its next uniform,
// DeviceDraw) is its next step's token, so run_token enqueues that step before it waits for
// its own, and the device runs it while the host lands the rows and the caller takes the
// token. So a token graph starts with the token's embedding row (embed.cuh), its id where the
// pick leaves it; a step run when asked copies its token there. The step ahead changes no
// host state; its rows go to the other half of the staging (by the position's parity, as its
// copy events, draw and penalty parameters and pick slot), a hybrid's recurrent state to the
// mirror's other copy (RecurrentMirror), and both land only when the next call adopts it: same
// position, token, caches and pick (a draw's uniform too; penalties over the window the step
// ahead assumed: this one's with the token entering), and every mirror still current (the
// staleness rule, so a truncate or restore between the calls drops it).
// Anything else waits for it and drops it (cancel_ahead); its mirror rows lie past seq_len.
//
// The whole token's graphs and the step ahead: cuda_backend_token.cpp. MoE FFNs:
// cuda_backend_moe.cpp; MLA attention: cuda_backend_mla.cpp; gated delta net layers (hybrids)
// and the recurrent state mirror: cuda_backend_recurrent.cpp.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <optional>
#include <bit>
#include <cmath>
#include <span>
#include <unordered_map>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "cuda/attention.cuh"
#include "cuda/cuda_backend_impl.h"
#include "cuda/cuda_check.h"
#include "cuda/device_probe.h"
#include "cuda/device_weights.h"
#include "cuda/elementwise.cuh"
#include "cuda/embed.cuh"
#include "cuda/kv_mirror.h"
#include "cuda/matmul.cuh"
#include "cuda/mla_attention.cuh"
#include "cuda/moe.cuh"
#include "cuda/pick.cuh"
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"
#include "quant/ggml_type.h"

namespace frink::cuda {

static_assert(kPickMaxPenalties == kMaxPickPenalties && kPickMaxTopK == kMaxPickTopK &&
                  kPickMaxVocab == kMaxPickVocab &&
                  kPickSumChunk == static_cast<int>(sampling::kSumChunk),
              "the engine's pick limits are the kernels'");


namespace detail {

// Where each layer's weights go (place_layers), in the device memory free now less a reserve
// for what the backend allocates beside the weights and the planned mirrors (batch buffers,
// cuBLAS's workspace, a prompt's f16 weight tiles, the CUDA context's growth): 1 GiB and 2% of
// the device, a margin rather than a measurement.
static std::vector<Refusal> placement(const Model& m, const DeviceHooks& hooks, int64_t n_gpu_layers, int64_t n_ctx) {
  Placement o;
  o.n_gpu_layers = n_gpu_layers;
  o.n_ctx = n_ctx > 0 ? n_ctx : 4096;
  size_t free = 0, total = 0;
  FRINK_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const size_t reserve = (size_t{1} << 30) + total / 50;
  o.budget_bytes = hooks.weight_budget_bytes > 0 ? static_cast<size_t>(hooks.weight_budget_bytes)
                                                 : (free > reserve ? free - reserve : 0);
  std::vector<Refusal> r = place_layers(m, DeviceWeights::upload_bytes(m, !hooks.separate_shared_expert), o);
  const auto left = std::count(r.begin(), r.end() - 1, Refusal::kMemory);
  if (left > 0 || r.back() == Refusal::kMemory) {
    const std::string why = n_gpu_layers >= 0 ? fmt::format("--gpu-layers {}", n_gpu_layers)
                                              : fmt::format("{:.2f} GiB of device memory for the weights and the K/V "
                                                            "of a {}-token context",
                                                            o.budget_bytes / 1073741824.0, o.n_ctx);
    FRINK_LOG_INFO("device: {} of {} layers{} run on the host ({})", left, m.hp.n_layer,
                   r.back() == Refusal::kMemory ? " and the output head" : "", why);
  }
  return r;
}

CudaBackend::CudaBackend(const Model& m, const DeviceHooks& hooks, int64_t n_gpu_layers, int64_t n_ctx)
    : m_(m),
      hooks_(hooks),
      info_(probe_device()),
      refusal_(placement(m, hooks, n_gpu_layers, n_ctx)),
      w_(m, refusal_, !hooks.separate_shared_expert) {
  FRINK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FRINK_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS could not be initialised");
  if (cublasSetStream(blas_, stream_) != CUBLAS_STATUS_SUCCESS) fail("cublasSetStream failed");
  FRINK_CUDA_CHECK(cudaMalloc(&pos_dev_, sizeof(int32_t)));
  FRINK_CUDA_CHECK(cudaMallocHost(&pos_host_, 2 * sizeof(int32_t)));
  FRINK_CUDA_CHECK(cudaMalloc(&pick_ids_dev_, kPickMaxTopK * sizeof(int32_t)));
  FRINK_CUDA_CHECK(cudaMalloc(&pick_vals_dev_, kPickMaxTopK * sizeof(float)));
  FRINK_CUDA_CHECK(cudaMallocHost(&pick_ids_host_, 2 * sizeof(int32_t)));  // a slot a parity
  // Read by the draw kernel in place: pinned memory is mapped at the same address under
  // unified addressing (every 64-bit platform CUDA 13 runs on).
  FRINK_CUDA_CHECK(cudaHostAlloc(&draw_host_, 2 * sizeof(DrawDev), cudaHostAllocMapped));
  FRINK_CUDA_CHECK(cudaHostAlloc(&pick_host_, 2 * sizeof(PickDev), cudaHostAllocMapped));  // the penalties' too
  for (cudaEvent_t& e : step_done_) FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  pick_scratch_.ensure(
      std::max(argmax_scratch_bytes(), draw_sums_offset(m.hp.n_vocab) + draw_sums_bytes(m.hp.n_vocab)));
}

CudaBackend::~CudaBackend() {
  // States that outlive this backend get what is ahead here first (a pull each), then forget
  // it: their host copy is the truth again.
  for (auto& [state, mirror] : rec_mirrors_) {
    try {
      state->detach_device(this);
    } catch (const std::exception& e) {
      FRINK_LOG_WARN("device: a recurrent state could not be copied back: {}", e.what());
    }
  }
  rec_mirrors_.clear();
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(copy_stream_);
  for (TokenGraph& g : token_graphs_) cudaGraphExecDestroy(g.exec);
  FRINK_LOG_DEBUG("device: {} token graph capture(s), {} mirror eviction(s)", n_captures_, n_evictions_);
  if (moe_ptrs_.p)
    FRINK_LOG_DEBUG("device: prompt batches' expert products {}",
                    gemm_grouped_calls() ? "as cuBLAS grouped calls" : "one cuBLAS call per expert");
  cudaFree(pos_dev_);
  cudaFreeHost(pos_host_);
  cudaFreeHost(pick_host_);
  cudaFree(pick_ids_dev_);
  cudaFree(pick_vals_dev_);
  cudaFreeHost(pick_ids_host_);
  cudaFreeHost(draw_host_);
  for (const CopyEvents& e : copy_events_) {
    cudaEventDestroy(e.ready);
    cudaEventDestroy(e.landed);
  }
  if (graph_join_) cudaEventDestroy(graph_join_);
  for (auto& pair : step_ev_)
    for (cudaEvent_t e : pair)
      if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : step_done_)
    if (e) cudaEventDestroy(e);
  for (LayerSlot& s : slots_) {
    if (s.read) cudaEventDestroy(s.read);
    if (s.filled) cudaEventDestroy(s.filled);
  }
  if (fill_stream_) {
    cudaStreamSynchronize(fill_stream_);
    cudaStreamDestroy(fill_stream_);
  }
  for (StageChunk& c : stage_)
    if (c.done) cudaEventDestroy(c.done);
  cudaStreamDestroy(copy_stream_);
  cublasDestroy(blas_);
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::describe() const {
  int refused = 0;
  for (Refusal r : refusal_) refused += r != Refusal::kNone;
  std::string s = fmt::format("{} (sm_{}{}), {:.2f} GiB of weights resident, {} of {} layers+head refused", info_.name,
                              info_.sm_major, info_.sm_minor, w_.bytes() / 1073741824.0, refused, refusal_.size());
  if (w_.shared_stacked() > 0) s += fmt::format(", shared experts stacked with the routed in {} layers", w_.shared_stacked());
  return s;
}

void CudaBackend::begin_batch(int64_t n_tok, int64_t pos0, std::span<KvCache* const> caches,
                              RecurrentState* recurrent) {
  // Rows still pending here belong to a batch that failed on the device (its error went up);
  // they never reached the host, and their mirrors, never caught up, re-upload when next used.
  // Recurrent work pending likewise never landed: its mirror layers stay untrusted.
  // A failed batch may have left early copies running (flush waits for them otherwise); the
  // staging they write may be reallocated below. Only then: this runs every decode token.
  cancel_ahead();
  if (std::any_of(pending_.begin(), pending_.end(), [](const Pending& pd) { return pd.event >= 0; }))
    FRINK_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  clear_pending();
  batch_begin_ = std::chrono::steady_clock::now();
  ++batch_tick_;
  // The batch's caches count as in use before any of them is readied, so making room for one
  // layer's mirror never evicts another layer of the same sequence.
  for (KvCache* c : caches)
    if (auto it = mirrors_.find(c); it != mirrors_.end()) it->second.last_use = batch_tick_;
  n_tok_ = n_tok;
  pos0_ = pos0;
  lend_batch_ = false;  // where ready_lending throws
  lend_batch_ = n_tok >= kLendMinTok && !lending_off_ && ready_lending(caches);
  const Hparams& hp = m_.hp;
  int64_t q_w = 0, kv_w = 0, qkv_w = 0, o_w = 0, ff = 0, max_in = hp.n_embd;
  int64_t n_exp = 0, slots = 0, slot_ff = 0;  // MoE: stack experts (router rows), n_tok * slots, slots * n_ff_exp
  bool grouped_experts = false;               // some MoE layer takes moe_grouped_experts
  int64_t gdn_c = 0, gdn_v = 0, gdn_h = 0;    // delta net: conv channels, d_inner, value heads
  int64_t mb_w = 0, mb_c = 0, mb_di = 0;       // Mamba-2: ssm_in's width, conv channels, d_inner
  int64_t mla_h = 0, mla_qa = 0, mla_w = 0, mla_r = 0, mla_in = 0;  // latent attention (enqueue_mla)
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    if (p.recurrent == RecurrentKind::kGatedDeltaNet) {
      gdn_c = std::max(gdn_c, p.ssm.conv_channels());
      gdn_v = std::max(gdn_v, p.ssm.d_inner);
      gdn_h = std::max(gdn_h, p.ssm.n_v_head);
      max_in = std::max(max_in, p.ssm.d_inner);  // ssm_out's input
    }
    if (p.recurrent == RecurrentKind::kMamba2) {
      const SsmPlan& s = p.ssm;
      mb_w = std::max(mb_w, s.d_inner + s.conv_channels() + s.n_v_head);
      mb_c = std::max(mb_c, s.conv_channels());
      mb_di = std::max(mb_di, s.d_inner);
      max_in = std::max(max_in, s.d_inner);  // ssm_out's input
    }
    if (p.ffn == FfnKind::kMoe) {
      const MoeStack st = moe_stack(p.moe, w_.layer(il));
      n_exp = std::max(n_exp, st.experts);
      slots = std::max(slots, n_tok * st.slots);
      slot_ff = std::max(slot_ff, n_tok * st.slots * p.moe.n_ff_exp);
      grouped_experts = grouped_experts || takes_grouped_experts(n_tok, st);
      ff = std::max(ff, p.moe.n_ff_shexp);
    }
    if (p.attn == AttnKind::kMla) {
      const int64_t R = p.mla.kv_lora_rank;
      mla_h = p.n_head;  // one count in every such layer (device_refusal)
      mla_qa = std::max(mla_qa, p.mla.q_lora_rank);
      mla_w = std::max(mla_w, p.cache_k_width());
      mla_r = std::max(mla_r, R);
      // the per-head products' input rows, prepared in act_: wk_b's q_nope, wv_b's latent sums
      mla_in = std::max(mla_in, n_tok * p.n_head * std::max(R, p.head_dim_k - p.rope.n_rot));
      max_in = std::max(max_in, p.mla.q_lora_rank);
    }
    q_w = std::max(q_w, p.n_head * p.head_dim_k);
    // The cache's row widths: a latent layer's one row, [c | k_pe], is wider than its heads.
    kv_w = std::max({kv_w, p.cache_k_width(), p.cache_v_width()});
    qkv_w = std::max({qkv_w, p.n_head * p.head_dim_k + p.n_head_kv * (p.head_dim_k + p.head_dim_v),
                      2 * p.n_head * p.head_dim_k});  // attn_out_gate: [q | gate] per head
    o_w = std::max(o_w, p.n_head * p.head_dim_v);
    ff = std::max(ff, 2 * p.n_ff);
    max_in = std::max({max_in, o_w, p.n_ff, p.ffn == FfnKind::kMoe ? p.moe.n_ff_shexp : int64_t{0}});
  }
  const auto fl = [n_tok](int64_t w) { return static_cast<size_t>(n_tok * w) * sizeof(float); };
  x_.ensure(fl(hp.n_embd));
  h_.ensure(fl(hp.n_embd));
  fold_.ensure(norm_fold_bytes(hp.n_embd));
  fold_for_layer_ = -1;
  o_.ensure(fl(hp.n_embd));
  f_.ensure(fl(hp.n_embd));
  q_.ensure(fl(q_w));
  k_.ensure(fl(kv_w));
  v_.ensure(fl(kv_w));
  qkv_.ensure(fl(qkv_w));
  attn_.ensure(fl(o_w));
  attn_gate_.ensure(fl(q_w));
  gate_.ensure(fl(ff));
  up_.ensure(fl(ff));
  hidden_.ensure(fl(ff));
  partial_.ensure(attn_partial_floats(n_tok, pos0 + n_tok) * sizeof(float));
  // act_ holds one prepared activation: n_tok rows, or a MoE down product's slot rows.
  act_.ensure(std::max({fl(max_in), static_cast<size_t>(std::max(slot_ff, mla_in)) * sizeof(float)}));
  if (mla_h > 0) {
    mla_qa_.ensure(fl(mla_qa));
    mla_q_.ensure(fl(mla_h * mla_w));
    mla_ctx_.ensure(fl(mla_h * mla_r));
    if (n_tok * mla_h > mla_slots_) {  // slot s takes head s % n_head; written once per growth
      std::vector<int32_t> heads(static_cast<size_t>(n_tok * mla_h));
      for (size_t s = 0; s < heads.size(); ++s) heads[s] = static_cast<int32_t>(static_cast<int64_t>(s) % mla_h);
      FRINK_CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing in flight reads the old table
      mla_heads_.ensure(heads.size() * sizeof(int32_t));
      FRINK_CUDA_CHECK(cudaMemcpy(mla_heads_.p, heads.data(), heads.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      mla_slots_ = n_tok * mla_h;
    }
  }
  if (slots > 0) {
    moe_logits_.ensure(fl(n_exp));
    moe_ids_.ensure(static_cast<size_t>(slots) * sizeof(int32_t));
    moe_w_.ensure(static_cast<size_t>(slots) * sizeof(float));
    moe_gu_.ensure(static_cast<size_t>(2 * slot_ff) * sizeof(float));
    moe_hidden_.ensure(static_cast<size_t>(slot_ff) * sizeof(float));
    moe_y_.ensure(static_cast<size_t>(slots * hp.n_embd) * sizeof(float));
    moe_sh_y_.ensure(fl(hp.n_embd));
    moe_sh_g_.ensure(fl(1));
    // h as Q8_0 or Q8_K blocks for the experts: moe_ffn.
    moe_h_q8_.ensure(matmul_q8_blocks_bytes(hp.n_embd, n_tok));
    if (grouped_experts) {  // moe_grouped_experts' sort and call pointers; its rows it sizes itself
      moe_sort_.ensure(static_cast<size_t>(n_exp + slots) * sizeof(int32_t));
      moe_ptrs_.ensure(static_cast<size_t>(3 * n_exp) * sizeof(void*));
    }
  }
  if (mb_w > 0) {
    mb_in_.ensure(fl(mb_w));
    mb_xbc_.ensure(fl(mb_c));
    mb_y_.ensure(fl(mb_di));
  }
  if (gdn_c > 0) {
    gdn_qkv_.ensure(fl(gdn_c));
    gdn_conv_.ensure(fl(gdn_c));
    gdn_z_.ensure(fl(gdn_v));
    gdn_ba_.ensure(fl(2 * gdn_h));
    gdn_beta_.ensure(fl(gdn_h));
    gdn_g_.ensure(fl(gdn_h));
    gdn_o_.ensure(fl(gdn_v));
  }
  // Snapshot staging: every position of the batch the state wants kept, times the state of
  // every layer the device may run.
  if (recurrent) {
    int64_t n_snap = 0, per_snap = 0;
    for (int64_t p = pos0 + 1; p <= pos0 + n_tok; ++p) n_snap += recurrent->wants_snapshot(p, pos0, pos0 + n_tok);
    for (int64_t il = 0; il < hp.n_layer && n_snap > 0; ++il)
      if (hp.layers[static_cast<size_t>(il)].recurrent != RecurrentKind::kNone &&
          refusal_[static_cast<size_t>(il)] == Refusal::kNone)
        per_snap += recurrent->shape(il).conv + recurrent->shape(il).ssm;
    const size_t snap_need = static_cast<size_t>(n_snap * per_snap);
    snap_staging_.ensure(snap_need * sizeof(float));  // nothing in flight reads it: every batch ends with a wait
  }
  if (n_tok > kMatvecMaxTok) {
    // (latent attention's per-head products take n_tok * n_head rows: MatmulParams::head_batch)
    scratch_elems_ = std::max(matmul_scratch_elems(max_in, n_tok), matmul_scratch_elems(1, mla_in));
    scratch_.ensure(scratch_elems_ * 2);
  }
  // A decode step's rows take one of two halves by the parity of its position, so a step
  // enqueued ahead (run_token) never writes where the host is landing the one before it.
  const size_t need = static_cast<size_t>(hp.n_layer * n_tok * 2 * kv_w);
  if (n_tok == 1) stage_half_ = need;
  staging_.ensure((n_tok == 1 ? 2 : 1) * need * sizeof(float));
  dstage_.ensure((n_tok == 1 ? 2 : 1) * need * sizeof(float));
  staging_used_ = staging_landed_ = 0;
  // Every batch that ran device work ended with a wait, so no earlier copy still reads
  // pos_host_; one that ran none only left a copy of a value nobody read.
  FRINK_ASSERT(pos0 <= INT32_MAX, "position {} past the device's 32-bit positions", pos0);
  pos_host_[1] = static_cast<int32_t>(pos0);
  FRINK_CUDA_CHECK(cudaMemcpyAsync(pos_dev_, pos_host_ + 1, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
}

size_t CudaBackend::attn_partial_floats(int64_t n_tok, int64_t max_keys) const {
  size_t part = 0;
  for (const LayerPlan& p : m_.hp.layers)
    if (p.attn == AttnKind::kMla)
      part = std::max(part, mla_scratch_floats(n_tok, max_keys, p.n_head, p.mla.kv_lora_rank));
    else if (p.recurrent == RecurrentKind::kNone)
      part = std::max(part, attn_scratch_floats(n_tok, max_keys, p.n_head, p.n_head_kv, p.head_dim_k, p.head_dim_v));
  return part;
}

void CudaBackend::upload(const float* x) {
  FRINK_CUDA_CHECK(cudaMemcpyAsync(x_.p, x, static_cast<size_t>(n_tok_ * m_.hp.n_embd) * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(float* x) { copy_out_and_flush(x_.f(), static_cast<size_t>(n_tok_ * m_.hp.n_embd), x); }

// The caller's memory is pageable: a copy into it would block the host until the stream
// drained, so flush() would append every layer's K/V rows only after the device finished
// instead of while it runs (an 8B BF16 pp512 batch: 46 ms, 18 ms of it kernels). The copy
// lands in pinned memory, and moves to `out` once flush has waited for the stream.
void CudaBackend::copy_out_and_flush(const float* dev, size_t n, float* out) {
  copy_out(dev, n);
  flush();
  std::memcpy(out, out_host_.p, n * sizeof(float));
}

void CudaBackend::copy_out(const float* dev, size_t n) {
  out_host_.ensure(n * sizeof(float));  // nothing in flight reads it: every batch ends with a wait
  FRINK_CUDA_CHECK(cudaMemcpyAsync(out_host_.p, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
}

// The newest pending layer's rows (all staged rows not yet copied) go back now, and an event
// marks their landing. Why: a prompt batch's rows are many (8B, 512 tokens: 128 MB), and v1
// copied and appended them all only after the last layer, the device idle meanwhile.
void CudaBackend::ensure_copy_events(size_t n) {
  while (copy_events_.size() < n) {
    CopyEvents e;
    FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&e.ready, cudaEventDisableTiming));
    copy_events_.push_back(e);  // pushed before the second create, so the destructor frees both
    FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&copy_events_.back().landed, cudaEventDisableTiming));
  }
}

void CudaBackend::copy_back_early() {
  FRINK_ASSERT(!pending_.empty() && staging_used_ > staging_landed_, "no rows to copy back");
  const size_t n_early = static_cast<size_t>(
      std::count_if(pending_.begin(), pending_.end(), [](const Pending& pd) { return pd.event >= 0; }));
  ensure_copy_events(n_early + 1);
  const CopyEvents& e = copy_events_[n_early];
  FRINK_CUDA_CHECK(cudaEventRecord(e.ready, stream_));  // the layer's rows are in dstage_
  FRINK_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, e.ready, 0));
  FRINK_CUDA_CHECK(cudaMemcpyAsync(staging_.f() + staging_landed_, dstage_.f() + staging_landed_,
                                   (staging_used_ - staging_landed_) * sizeof(float), cudaMemcpyDeviceToHost,
                                   copy_stream_));
  staging_landed_ = staging_used_;
  FRINK_CUDA_CHECK(cudaEventRecord(e.landed, copy_stream_));
  pending_.back().event = static_cast<int>(n_early);
}

void CudaBackend::copy_back_in_graph(const Pending& first, const Pending& last) {
  FRINK_ASSERT(first.event == last.event && first.k_off <= last.k_off, "a copy group of one event, in staging order");
  const CopyEvents& e = copy_events_[static_cast<size_t>(last.event)];
  // k rows, then v, layer after layer: the group's staging is contiguous (add_pending).
  const size_t n = last.v_off + static_cast<size_t>(n_tok_ * last.cache->v_width()) - first.k_off;
  FRINK_CUDA_CHECK(cudaEventRecord(e.ready, stream_));  // captured: a fork after the group's last kernel
  FRINK_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, e.ready, 0));
  FRINK_CUDA_CHECK(cudaMemcpyAsync(staging_.f() + first.k_off, dstage_.f() + first.k_off, n * sizeof(float),
                                   cudaMemcpyDeviceToHost, copy_stream_));
  FRINK_CUDA_CHECK(cudaEventRecordWithFlags(e.landed, copy_stream_, cudaEventRecordExternal));
}

void CudaBackend::flush(cudaEvent_t done) {
  // A decode step with the next one enqueued behind it (run_token's step ahead) waits for its
  // own end, not the stream's.
  const auto wait_done = [&] { FRINK_CUDA_CHECK(done ? cudaEventSynchronize(done) : cudaStreamSynchronize(stream_)); };
  if (staging_used_ > staging_landed_)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(staging_.f() + staging_landed_, dstage_.f() + staging_landed_,
                                     (staging_used_ - staging_landed_) * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  staging_landed_ = staging_used_;
  // Layers copied early are appended as each lands, while later layers still run; the rest
  // after the stream is done. A prompt batch's layers are appended by several threads, one
  // layer each at a time: an 8B BF16 pp512 batch's 134 MB of rows took 28 ms on one thread
  // (H200 host) against 18 ms of kernels. A device error part way leaves no layer appended:
  // the ones already appended are truncated back, so the host caches stay one consistent length.
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  const Clock::time_point t_flush = Clock::now();
  // A layer copied early waits for its own copy; the others for the stream (synced once, below).
  const auto land = [&](const Pending& pd) {
    if (pd.event >= 0) FRINK_CUDA_CHECK(cudaEventSynchronize(copy_events_[static_cast<size_t>(pd.event)].landed));
    pd.cache->append_rows(staging_.f() + pd.k_off, staging_.f() + pd.v_off, n_tok_);
  };
  try {
    // A token step's rows (copy_back_in_graph) land on this thread, layer by layer as the
    // replay copies them: one waiting thread, as the stream's wait, where the pool's eight
    // would each spin on an event for the whole step.
    const bool all_early = std::all_of(pending_.begin(), pending_.end(), [](const Pending& pd) { return pd.event >= 0; });
    if (all_early && pending_.size() > 1 && n_tok_ > 1) {
      // The layers land in order, and each thread takes the next one not yet taken, so the
      // appends follow the copies. (Contiguous chunks left the last thread four of the 8B's 32
      // layers to append after the last copy; the 8B BF16 pp512 batch, device-bound, measured
      // the same either way: 20 ms from enqueue to the last append, H200.)
      std::atomic<size_t> next{0};
      std::vector<std::exception_ptr> errors(pending_.size());
      append_pool_.parallel_for(append_pool_.n_threads(), [&](int64_t, int64_t, int) {
        for (size_t i; (i = next.fetch_add(1)) < pending_.size();) {
          try {
            land(pending_[i]);
          } catch (...) {
            errors[i] = std::current_exception();
            return;  // this thread stops; the catch below truncates every layer
          }
        }
      });
      for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
    } else {
      // While the device still runs, the rows' host storage is made resident (KvCache::ready_rows).
      for (const Pending& pd : pending_)
        if (pd.event < 0) pd.cache->ready_rows(n_tok_);
      bool synced = false;  // a decode step's layers (none early) wait for the stream once, not per layer
      for (const Pending& pd : pending_) {
        if (pd.event < 0 && !synced) {
          wait_done();
          synced = true;
          flush_synced_ = Clock::now();  // run_token's --verbose times
        }
        land(pd);
      }
      if (!synced) {
        wait_done();
        flush_synced_ = Clock::now();  // run_token's --verbose times: its rows landed while it ran
      }
    }
    wait_done();
  } catch (...) {
    cudaStreamSynchronize(stream_);  // no copy may still write staging_ (a host-side throw leaves work queued)
    cudaStreamSynchronize(copy_stream_);
    // Every pending of the cycle started at pos0_ (run_layer and run_token assert it), a cache
    // that failed part way through its rows included.
    for (const Pending& pd : pending_)
      if (pd.cache->rows() > pos0_) pd.cache->truncate(pos0_);
    throw;
  }
  if (n_tok_ > 1 && !pending_.empty())
    FRINK_LOG_DEBUG("device batch of {} tokens: enqueue {:.2f} ms, then waiting and appending K/V rows {:.2f} ms", n_tok_,
                    ms(t_flush - batch_begin_), ms(Clock::now() - t_flush));
  for (const Pending& pd : pending_) pd.mirror->caught_up(*pd.cache);
  pending_.clear();
  // In enqueue order, so snapshots are kept (and the oldest evicted) as the host body would.
  for (const PendingSnap& ps : pending_snaps_)
    ps.state->save_layer(ps.pos, ps.layer, snap_staging_.f() + ps.conv_off, snap_staging_.f() + ps.ssm_off);
  pending_snaps_.clear();
  snap_used_ = 0;
  for (const PendingRec& pr : pending_rec_) pr.mirror->landed(*pr.state, pr.layer, pr.flip);
  pending_rec_.clear();
}

void CudaBackend::clear_pending() {
  pending_.clear();
  pending_rec_.clear();
  pending_snaps_.clear();
  snap_used_ = 0;
}

MatmulParams CudaBackend::matmul_params(const DeviceLinear& l, const float* x, int64_t x_stride, float* y,
                                        int64_t y_stride) {
  MatmulParams p;
  p.type = l.type;
  p.w = l.w;
  p.row_bytes = l.row_bytes;
  p.n_in = l.n_in;
  p.n_out = l.n_out;
  p.x = x;
  p.x_stride = x_stride;
  p.y = y;
  p.y_stride = y_stride;
  p.n_tok = n_tok_;
  p.bias = l.b;
  p.scale = l.scale;
  p.bias_before_scale = l.bias_before_scale;
  p.blas = blas_;
  p.scratch = scratch_.p;
  p.scratch_elems = scratch_elems_;
  p.act_round = act_.f();
  p.stream = stream_;
  return p;
}

void CudaBackend::matmul(const DeviceLinear& l, const float* x, int64_t x_stride, float* y, int64_t y_stride,
                         const float* residual, bool x_prepared, const GluParams* pre_glu, const NormFold* fold_out) {
  MatmulParams p = matmul_params(l, x, x_stride, y, y_stride);
  p.residual = residual;
  p.x_prepared = x_prepared;
  p.pre_glu = pre_glu;
  p.fold_out = fold_out;
  launch_matmul(p);
}

void CudaBackend::norm_rows(const DeviceNorm& n, const float* x, float* y, int64_t n_rows, int64_t len,
                            int64_t stride, bool layer) {
  launch_norm(norm_params(n, x, y, n_rows, len, stride, layer));
}

NormParams CudaBackend::norm_params(const DeviceNorm& n, const float* x, float* y, int64_t n_rows, int64_t len,
                                    int64_t stride, bool layer) const {
  NormParams p;
  p.x = x;
  p.x_stride = stride;
  p.y = y;
  p.y_stride = stride;
  p.n = len;
  p.n_rows = n_rows;
  p.w = n.w;
  p.b = n.b;
  p.eps = m_.hp.norm_eps;
  p.layer_norm = layer;
  p.stream = stream_;
  return p;
}

// The feed-forward block on normed h [n_tok][n_embd] -> out [n_tok][n_embd] (cpu ffn()), plus
// residual when given (matmul's rule).
void CudaBackend::ffn(const LayerPlan& p, const DeviceLayer& d, const float* h, float* out, const float* residual,
                      const NormParams* pre_norm, const NormFold* h_fold, const NormFold* out_fold) {
  FRINK_ASSERT(!h_fold || (p.ffn == FfnKind::kGated && !pre_norm), "a folded FFN norm: gated FFN only");
  FRINK_ASSERT(!out_fold || p.ffn != FfnKind::kMoe, "a fold from the down: dense FFN only");
  if (p.ffn == FfnKind::kMoe) {
    moe_ffn(p, d, h, out, residual, pre_norm);
    return;
  }
  if (pre_norm && p.ffn != FfnKind::kGated) launch_norm(*pre_norm);
  const int64_t E = m_.hp.n_embd, n_ff = p.n_ff;
  GluParams g;
  g.out = hidden_.f();
  g.n = n_ff;
  g.n_tok = n_tok_;
  g.gelu = p.act == Activation::kGeluTanh;
  g.stream = stream_;
  if (p.ffn == FfnKind::kGated) {
    // self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    MatmulParams gu[2] = {matmul_params(d.ffn_gate, h, E, gate_.f(), n_ff), matmul_params(d.ffn_up, h, E, up_.f(), n_ff)};
    gu[0].pre_norm = pre_norm;
    if (h_fold) read_norm_fold(gu, 2, *h_fold);
    launch_matmuls(gu, 2);  // one rounding of h for both (with the norm, when given)
    g.gate = gate_.f();
    g.up = up_.f();
    g.gate_stride = g.up_stride = n_ff;
  } else if (p.ffn == FfnKind::kGatedFused) {
    matmul(d.ffn_up, h, E, gate_.f(), 2 * n_ff);
    g.gate = gate_.f();
    g.up = gate_.f() + n_ff;
    g.gate_stride = g.up_stride = 2 * n_ff;
  } else {
    matmul(d.ffn_up, h, E, gate_.f(), n_ff);
    g.gate = gate_.f();
    g.gate_stride = n_ff;
  }
  // The GLU launched with the down product's activation preparation (MatmulParams::pre_glu).
  MatmulParams down = matmul_params(d.ffn_down, hidden_.f(), n_ff, out, E);
  down.residual = residual;
  down.pre_glu = &g;
  down.fold_out = out_fold;
  launch_matmul(down);
}

KvMirror& CudaBackend::ready_mirror(KvCache& cache, const LayerPlan& p, int64_t n_new) {
  MirrorSlot& slot = mirrors_[&cache];
  // A new cache can live where an ended sequence's did, even for a layer of another shape.
  if (!slot.mirror || slot.mirror->k_width() != cache.k_width() || slot.mirror->v_width() != cache.v_width())
    slot.mirror = std::make_unique<KvMirror>(cache.k_width(), cache.v_width());
  slot.last_use = batch_tick_;
  if (const size_t grow = slot.mirror->growth_bytes(cache, n_new); grow > 0) {
    // prepare() frees the old buffers before it allocates, so the growth must fit in what is
    // free plus what they hold, with a margin left for the runtime.
    size_t free = 0, margin = 0;
    if (hooks_.mirror_budget_bytes > 0) {
      size_t used = 0;
      for (const auto& [c, s] : mirrors_) used += s.mirror ? s.mirror->bytes() : 0;
      free = static_cast<size_t>(hooks_.mirror_budget_bytes) > used ? static_cast<size_t>(hooks_.mirror_budget_bytes) - used : 0;
    } else {
      size_t total = 0;
      FRINK_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      margin = size_t{256} << 20;
    }
    const size_t held = slot.mirror->bytes();
    if (grow + margin > free + held) evict_mirrors(grow + margin - free - held);
  }
  slot.mirror->prepare(cache, n_new, stream_, hooks_.trust_stale_mirror);
  return *slot.mirror;
}

// Frees mirrors not used by the current batch, least recently used first, until bytes_wanted
// are freed (or none is left to free: the allocation then fails as a device error). Cached token graphs may still name
// their buffers; one is replayed only when its key (which holds every mirror address) matches
// the live mirrors exactly, so a freed address reused by a new mirror is then that mirror's.
void CudaBackend::evict_mirrors(size_t bytes_wanted) {
  std::vector<std::pair<uint64_t, const KvCache*>> lru;
  for (const auto& [cache, slot] : mirrors_)
    if (slot.last_use != batch_tick_) lru.emplace_back(slot.last_use, cache);
  std::sort(lru.begin(), lru.end());
  FRINK_CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing in flight may still read them
  size_t freed = 0;
  for (const auto& [tick, cache] : lru) {
    if (freed >= bytes_wanted) break;
    freed += mirrors_[cache].mirror->bytes();
    mirrors_.erase(cache);
  }
  ++n_evictions_;
  FRINK_LOG_DEBUG("device: evicted KV mirrors, {:.1f} MiB freed, {} left", freed / 1048576.0, mirrors_.size());
}

CudaBackend::Pending CudaBackend::staged_rows(KvCache& cache, KvMirror& mirror, size_t& used) const {
  const size_t kf = static_cast<size_t>(n_tok_ * cache.k_width()), vf = static_cast<size_t>(n_tok_ * cache.v_width());
  FRINK_ASSERT(used + kf + vf <= staging_.floats(), "staging too small");
  const Pending pd{&cache, &mirror, used, used + kf};
  used += kf + vf;
  return pd;
}

CudaBackend::Pending CudaBackend::add_pending(KvCache& cache, KvMirror& mirror) {
  pending_.push_back(staged_rows(cache, mirror, staging_used_));
  return pending_.back();
}

void CudaBackend::run_layer(int64_t il, KvCache& cache) {
  const LayerPlan& p = m_.hp.layers[static_cast<size_t>(il)];
  FRINK_ASSERT(check_layer(il) == Refusal::kNone, "run_layer on refused layer {}", il);
  FRINK_ASSERT(cache.rows() == pos0_, "cache has {} rows at position {}", cache.rows(), pos0_);
  KvMirror& mirror = ready_mirror(cache, p, n_tok_);
  LayerSlot* lent = refusal_[static_cast<size_t>(il)] == Refusal::kMemory ? &lend_layer(il) : nullptr;
  enqueue_layer(il, mirror, add_pending(cache, mirror), pos0_ + n_tok_);
  if (lent) {  // the slot may be filled again once this layer's kernels have read it
    FRINK_CUDA_CHECK(cudaEventRecord(lent->read, stream_));
    lent->read_recorded = true;
  }
  if (n_tok_ >= kEarlyCopyMinTok) copy_back_early();
}

bool CudaBackend::ready_lending(std::span<KvCache* const> caches) {
  const Hparams& hp = m_.hp;
  if (static_cast<int64_t>(caches.size()) != hp.n_layer) return false;
  if (slot_bytes_ == 0) {
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (lendable(il)) slot_bytes_ = std::max(slot_bytes_, w_.fill_bytes(m_, il));
    if (slot_bytes_ == 0) {
      lending_off_ = true;
      return false;
    }
  }
  // What lending takes beside what is resident: the slots (once) and the lent layers' mirrors.
  size_t need = slots_[0].buf.bytes ? 0 : 2 * slot_bytes_;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    if (!lendable(il)) continue;
    const KvCache& cache = *caches[static_cast<size_t>(il)];
    const auto it = mirrors_.find(&cache);
    const int64_t rows = mirror_capacity_for(pos0_ + n_tok_, cache.planned_capacity());
    need += it != mirrors_.end() && it->second.mirror
                ? it->second.mirror->growth_bytes(cache, n_tok_)
                : static_cast<size_t>(rows * (cache.k_width() + cache.v_width())) * sizeof(float);
  }
  size_t free = 0, total = 0;
  FRINK_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  if (need + (size_t{256} << 20) > free) {
    FRINK_LOG_DEBUG("device: a prompt batch keeps its {} host layers there ({:.2f} GiB would not fit)",
                    std::count(refusal_.begin(), refusal_.end() - 1, Refusal::kMemory), need / 1073741824.0);
    return false;
  }
  if (!slots_[0].buf.bytes) {
    FRINK_CUDA_CHECK(cudaStreamCreateWithFlags(&fill_stream_, cudaStreamNonBlocking));
    for (LayerSlot& s : slots_) {
      s.buf.ensure(slot_bytes_);
      FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&s.read, cudaEventDisableTiming));
      FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&s.filled, cudaEventDisableTiming));
    }
    for (StageChunk& c : stage_) {
      c.buf.ensure(kStageBytes);
      FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming));
    }
    FRINK_LOG_INFO("device: prompt batches lend the host's layers the device, through two {:.2f} GiB slots",
                   slot_bytes_ / 1073741824.0);
  }
  return true;
}

void CudaBackend::stage_copy(void* dst, const void* src, size_t n) {
  for (size_t at = 0; at < n; at += kStageBytes) {
    const size_t len = std::min(kStageBytes, n - at);
    StageChunk& c = stage_[next_stage_];
    next_stage_ = (next_stage_ + 1) % kStageChunks;
    if (c.used) FRINK_CUDA_CHECK(cudaEventSynchronize(c.done));  // its last copy has left it
    const char* from = static_cast<const char*>(src) + at;
    char* to = static_cast<char*>(c.buf.p);
    const auto copy = [&](int64_t b, int64_t e, int) { std::memcpy(to + b, from + b, static_cast<size_t>(e - b)); };
    append_pool_.parallel_for(static_cast<int64_t>(len), copy, int64_t{1} << 20);
    FRINK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + at, to, len, cudaMemcpyHostToDevice, fill_stream_));
    FRINK_CUDA_CHECK(cudaEventRecord(c.done, fill_stream_));
    c.used = true;
  }
}

CudaBackend::LayerSlot& CudaBackend::lend_layer(int64_t il) {
  LayerSlot* s = slots_[0].layer == il ? &slots_[0] : slots_[1].layer == il ? &slots_[1] : nullptr;
  if (!s) {
    s = &slots_[next_slot_];
    next_slot_ ^= 1;
    if (s->read_recorded) FRINK_CUDA_CHECK(cudaStreamWaitEvent(fill_stream_, s->read, 0));
    s->layer = -1;  // a failed fill leaves it holding nothing
    w_.fill(m_, il, s->buf.p, s->buf.bytes, fill_stream_,
            [this](void* dst, const void* src, size_t n) { stage_copy(dst, src, n); });
    s->layer = il;
    FRINK_CUDA_CHECK(cudaEventRecord(s->filled, fill_stream_));
  }
  FRINK_CUDA_CHECK(cudaStreamWaitEvent(stream_, s->filled, 0));
  return *s;
}

RopeLaunch CudaBackend::rope_launch(const LayerPlan& p) const {
  RopeLaunch r;
  r.n_tok = n_tok_;
  r.head_dim = p.head_dim_k;
  r.pos = pos_dev_;
  r.n_rot = p.rope.n_rot;
  r.neox = p.rope.kind == RopeKind::kNeox;
  r.freq_base = p.rope.freq_base;
  r.freq_scale = p.rope.freq_scale;
  r.ext_factor = p.rope.ext_factor;
  r.attn_factor = p.rope.attn_factor;
  r.beta_fast = p.rope.beta_fast;
  r.beta_slow = p.rope.beta_slow;
  r.n_ctx_orig = p.rope.n_ctx_orig;
  r.yarn_truncate = p.rope.yarn_truncate;
  r.freq_factors = p.rope.use_freq_factors ? w_.rope_freqs : nullptr;
  r.stream = stream_;
  return r;
}

void CudaBackend::enqueue_layer(int64_t il, KvMirror& mirror, const Pending& pd, int64_t max_keys) {
  const Hparams& hp = m_.hp;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  if (p.attn == AttnKind::kMla) return enqueue_mla(il, mirror, pd, max_keys);
  const DeviceLayer& d = w_.layer(il);
  const int64_t E = hp.n_embd, n = n_tok_;
  const int64_t q_w = p.n_head * p.head_dim_k, k_w = p.n_head_kv * p.head_dim_k, v_w = p.n_head_kv * p.head_dim_v;
  const bool ln = hp.norm == NormKind::kLayer;
  FRINK_ASSERT(max_keys >= pos0_ + n, "attention grid for {} keys, {} needed", max_keys, pos0_ + n);
  // The previous layer's down wrote this layer's attention norm as a NormFold (attn_takes_fold).
  const bool folded = fold_for_layer_ == il;
  fold_for_layer_ = -1;
  const NormFold attn_fold = norm_fold_at(fold_.p, d.attn_norm.w, E, hp.norm_eps);

  // h = self.input_layernorm(x)   (launched with the q/k/v products' activation preparation)
  const NormParams attn_norm = norm_params(d.attn_norm, x_.f(), h_.f(), n, E, E, ln);
  // q = q_norm(q), k = k_norm(k) per head; apply_rotary_pos_emb(q, k, cos, sin); the new K/V
  // rows into the mirror at pos0, and back to the host cache (landed by flush()). Described
  // before the products: their store can run it (MatmulParams::rope, below).
  const NormParams q_norm = norm_params(d.q_norm, q_.f(), q_.f(), n * p.n_head, p.head_dim_k, p.head_dim_k, false);
  const NormParams k_norm = norm_params(d.k_norm, k_.f(), k_.f(), n * p.n_head_kv, p.head_dim_k, p.head_dim_k, false);
  // olmoe: one RMSNorm over each token's whole q and whole k, before RoPE (a launch of its own:
  // the products' store sees a head at a time).
  const NormParams q_norm_full = norm_params(d.q_norm, q_.f(), q_.f(), n, q_w, q_w, false);
  const NormParams k_norm_full = norm_params(d.k_norm, k_.f(), k_.f(), n, k_w, k_w, false);
  const bool roped = p.rope.kind != RopeKind::kNone;
  RopeLaunch r = rope_launch(p);
  r.x = q_.f();
  r.row_stride = q_w;
  r.n_head = p.n_head;
  r.x2 = k_.f();
  r.row_stride2 = k_w;
  r.n_head2 = p.n_head_kv;
  r.v = v_.f();
  r.v_width = v_w;
  r.mirror_k = mirror.k_rows(0);
  r.mirror_v = mirror.v_rows(0);
  r.stage_k = dstage_.f() + pd.k_off;
  r.stage_v = dstage_.f() + pd.v_off;
  r.qk_norm = p.qk_norm;  // the norms in the rotation's launch (launch_rope)
  r.norm_x = q_norm;
  r.norm_x2 = k_norm;
  bool rope_done = false;  // r ran in the q/k/v products' store
  // q, k, v = q_proj(h), k_proj(h), v_proj(h)   (or one fused projection, split)
  if (d.wqkv) {
    FRINK_ASSERT(!folded, "layer {}: a folded norm before a fused q/k/v", il);
    launch_norm(attn_norm);
    const int64_t w3 = q_w + k_w + v_w;
    matmul(d.wqkv, h_.f(), E, qkv_.f(), w3);
    const auto split = [&](float* dst, int64_t off, int64_t w) {
      FRINK_CUDA_CHECK(cudaMemcpy2DAsync(dst, w * sizeof(float), qkv_.f() + off, w3 * sizeof(float), w * sizeof(float),
                                         n, cudaMemcpyDeviceToDevice, stream_));
    };
    split(q_.f(), 0, q_w);
    split(k_.f(), q_w, k_w);
    split(v_.f(), q_w + k_w, v_w);
  } else {
    // Gated attention (Qwen3-Next): wq gives [q | gate] per head, split below.
    float* q_out = p.attn_out_gate ? qkv_.f() : q_.f();
    MatmulParams qkv[3] = {matmul_params(d.wq, h_.f(), E, q_out, p.attn_out_gate ? 2 * q_w : q_w),
                           matmul_params(d.wk, h_.f(), E, k_.f(), k_w), matmul_params(d.wv, h_.f(), E, v_.f(), v_w)};
    qkv[0].pre_norm = &attn_norm;
    if (folded) read_norm_fold(qkv, 3, attn_fold);  // h is attn_fold: no norm launch
    // RoPE (with the QK-norm for neox heads) and the append in the products' store where it
    // can (decode: matmul_can_rope): one launch fewer per layer.
    rope_done = roped && !p.attn_out_gate && !p.qk_norm_full && matmul_can_rope(qkv, 3, r);
    if (rope_done)
      for (MatmulParams& m : qkv) m.rope = &r;
    launch_matmuls(qkv, 3);  // one rounding of h for all three
    if (p.attn_out_gate) {
      // query_states, gate = torch.chunk(q_proj(h).view(..., head_dim * 2), 2, dim=-1)
      const size_t hd = static_cast<size_t>(p.head_dim_k) * sizeof(float);
      const size_t rows = static_cast<size_t>(n * p.n_head);
      FRINK_CUDA_CHECK(cudaMemcpy2DAsync(q_.p, hd, qkv_.f(), 2 * hd, hd, rows, cudaMemcpyDeviceToDevice, stream_));
      FRINK_CUDA_CHECK(cudaMemcpy2DAsync(attn_gate_.p, hd, qkv_.f() + p.head_dim_k, 2 * hd, hd, rows,
                                         cudaMemcpyDeviceToDevice, stream_));
    }
  }
  if (p.qk_norm_full) launch_norm_pair(q_norm_full, k_norm_full);
  if (p.qk_norm && !roped) launch_norm_pair(q_norm, k_norm);
  if (!roped) {
    launch_kv_append(k_.f(), v_.f(), k_w, v_w, n, pos_dev_, mirror.k_rows(0), mirror.v_rows(0), dstage_.f() + pd.k_off,
                     dstage_.f() + pd.v_off, stream_);
  } else if (!rope_done) {
    launch_rope(r);
  }

  // attn_output = softmax(q k^T * scale + mask) v, against the mirror rows [0, pos0 + t]
  AttnParams a;
  a.q = q_.f();
  a.q_stride = q_w;
  a.k = mirror.k_rows(0);
  a.v = mirror.v_rows(0);
  a.out = attn_.f();
  a.n_tok = n;
  a.pos = pos_dev_;
  a.max_keys = max_keys;
  a.n_head = p.n_head;
  a.n_head_kv = p.n_head_kv;
  a.head_dim_k = p.head_dim_k;
  a.head_dim_v = p.head_dim_v;
  a.scale = p.attn_scale;
  a.softcap = p.attn_softcap;
  a.window = p.window;
  a.alibi_slopes = d.alibi_slopes;
  a.sinks = d.attn_sinks;
  a.partial = partial_.f();
  a.stream = stream_;
  // The merge also writes the wo product's Q8_0 or Q8_K input (one quantize kernel fewer), or
  // its F16 / BF16 rounded input (one act_round kernel fewer), where wo reads one and the merge
  // can write it. Not under gated attention: wo reads the gated output. Q8_K's kernel left out
  // of the 8B Q4_K_M token graph saved 2.1 us a layer (H200, 2.59 -> 2.52 ms); the rounded
  // input 8B BF16's 1.1 us (4.30 -> 4.26 ms).
  const int64_t o_in = p.n_head * p.head_dim_v;
  const MatmulParams wo = matmul_params(d.wo, attn_.f(), o_in, o_.f(), E);
  const bool wo_q8_0 = matmul_reads_q8_0(wo), wo_q8k = !wo_q8_0 && matmul_reads_q8_blocks(wo);
  // F16 / BF16 wo: the merge writes its input rounded instead (AttnParams::out_round).
  const bool o_r16 = !p.attn_out_gate && matmul_reads_rounded16(wo) && attn_uses_split_k(n, p.head_dim_k, p.head_dim_v);
  const bool o_prepared = o_r16 || (!p.attn_out_gate && ((wo_q8_0 && attn_writes_q8_0(n, p.head_dim_k, p.head_dim_v)) ||
                                                   (wo_q8k && attn_writes_q8k(n, p.head_dim_k, p.head_dim_v, p.n_head))));
  if (o_r16) {
    a.out_round = wo.act_round;
    a.out_round_bf16 = wo.type == static_cast<int>(GgmlType::BF16);
  } else if (o_prepared && wo_q8_0) {
    a.out_q8 = q8_0_act(wo).q;
    a.out_d8 = q8_0_act(wo).d;
  } else if (o_prepared) {
    const Q8KAct x = q8k_act(wo);
    a.out_q8 = x.q;
    a.out_d8 = x.d;
    a.out_sum = x.sum;
  }
  launch_attention(a);
  // attn_output = attn_output * torch.sigmoid(gate)   (gated attention)
  if (p.attn_out_gate) launch_sigmoid_mul(attn_.f(), attn_gate_.f(), n * p.n_head * p.head_dim_v, stream_);
  if (p.parallel_residual) {
    // x + attn(ln(x)) + mlp(ln(x)): the FFN reads the same normed input (or its own norm)
    matmul(d.wo, attn_.f(), o_in, o_.f(), E, nullptr, o_prepared);
    if (p.post_attn_norm) norm_rows(d.post_attn_norm, o_.f(), o_.f(), n, E, E, ln);
    if (d.ffn_norm.w) norm_rows(d.ffn_norm, x_.f(), h_.f(), n, E, E, ln);
    ffn(p, d, h_.f(), f_.f(), nullptr);
    launch_add(x_.f(), x_.f(), o_.f(), f_.f(), n * E, stream_);
    return;
  }
  enqueue_residual_ffn(il, p, d, d.wo, attn_.f(), o_in, o_prepared);
}

bool CudaBackend::attn_takes_fold(int64_t il) const {
  const Hparams& hp = m_.hp;
  if (n_tok_ != 1 || il >= hp.n_layer || refusal_[static_cast<size_t>(il)] != Refusal::kNone) return false;
  const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
  const DeviceLayer& d = w_.layer(il);
  const bool neox = p.rope.kind == RopeKind::kNeox;  // (enqueue_layer's RopeLaunch::neox)
  const auto takes = [&](const DeviceLinear& l) { return l && matmul_takes_folded_norm(l.type, l.n_in, neox); };
  return p.recurrent == RecurrentKind::kNone && p.attn == AttnKind::kGqa && hp.norm != NormKind::kLayer &&
         d.attn_norm.w && !d.attn_norm.b &&
         !d.wqkv && !p.attn_out_gate && takes(d.wq) && takes(d.wk) && takes(d.wv);
}

bool CudaBackend::ffn_takes_fold(const LayerPlan& p, const DeviceLayer& d) const {
  const auto takes = [&](const DeviceLinear& l) { return l && matmul_takes_folded_norm(l.type, l.n_in, false); };
  return n_tok_ == 1 && p.ffn == FfnKind::kGated && !p.post_attn_norm && !p.post_ffn_norm &&
         m_.hp.norm != NormKind::kLayer && d.ffn_norm.w && !d.ffn_norm.b && takes(d.ffn_gate) && takes(d.ffn_up);
}

void CudaBackend::enqueue_residual_ffn(int64_t il, const LayerPlan& p, const DeviceLayer& d, const DeviceLinear& proj,
                                       const float* branch, int64_t branch_w, bool branch_q8,
                                       const GluParams* branch_glu) {
  const int64_t E = m_.hp.n_embd, n = n_tok_;
  const bool ln = m_.hp.norm == NormKind::kLayer;
  // The products add the residual in their epilogue (x = x + W h, one launch;
  // matmul_adds_residual: decode batches, and cuBLAS ones without a bias or scale): where a
  // sandwich norm sits between product and add, or the product cannot, the add stays a kernel.
  // Decode's sum is the add kernel's bit for bit (x + o == o + x); cuBLAS's is its epilogue's.
  const auto in_place = [&](const DeviceLinear& l, const float* in, int64_t in_w) {
    MatmulParams q = matmul_params(l, in, in_w, x_.f(), E);
    q.residual = x_.f();
    return q;
  };
  const auto adds = [&](const DeviceLinear& l, const float* in, int64_t in_w) {
    return matmul_adds_residual(in_place(l, in, in_w));
  };
  // One token: the FFN norm folded into the projection before it, and the next layer's
  // attention norm into the down (NormFold), where the products take them.
  const NormFold ffn_fold = norm_fold_at(fold_.p, d.ffn_norm.w, E, m_.hp.norm_eps);
  const bool fold_ffn = ffn_takes_fold(p, d) && matmul_folds_norm(in_place(proj, branch, branch_w));
  // x = x + o_proj(attn_output) (+ the sandwich norm before the add)
  if (!p.post_attn_norm && adds(proj, branch, branch_w)) {
    matmul(proj, branch, branch_w, x_.f(), E, x_.f(), branch_q8, branch_glu, fold_ffn ? &ffn_fold : nullptr);
  } else {
    FRINK_ASSERT(!fold_ffn, "layer {}: a folded FFN norm needs the projection's residual", il);
    matmul(proj, branch, branch_w, o_.f(), E, nullptr, branch_q8, branch_glu);
    if (p.post_attn_norm) add_normed(d.post_attn_norm, o_.f());
    else launch_add(x_.f(), x_.f(), o_.f(), nullptr, n * E, stream_);
  }
  // x = x + mlp(post_attention_layernorm(x))   (the norm launched by ffn)
  const NormParams ffn_norm = norm_params(d.ffn_norm, x_.f(), h_.f(), n, E, E, ln);
  // (MoE: the experts' combine adds it, decode batches only.)
  const bool ffn_adds = p.ffn == FfnKind::kMoe ? n <= kMatvecMaxTok : adds(d.ffn_down, hidden_.f(), p.n_ff);
  if (ffn_adds && !p.post_ffn_norm) {
    std::optional<NormFold> next;  // layer il + 1's attention norm, in the down's launch
    if (p.ffn != FfnKind::kMoe && attn_takes_fold(il + 1) &&
        matmul_folds_norm(in_place(d.ffn_down, hidden_.f(), p.n_ff))) {
      next = norm_fold_at(fold_.p, w_.layer(il + 1).attn_norm.w, E, m_.hp.norm_eps);
      fold_for_layer_ = il + 1;
    }
    ffn(p, d, h_.f(), x_.f(), x_.f(), fold_ffn ? nullptr : &ffn_norm, fold_ffn ? &ffn_fold : nullptr,
        next ? &*next : nullptr);
  } else {
    ffn(p, d, h_.f(), f_.f(), nullptr, &ffn_norm);
    if (p.post_ffn_norm) add_normed(d.post_ffn_norm, f_.f());
    else launch_add(x_.f(), x_.f(), f_.f(), nullptr, n * E, stream_);
  }
}

// x += norm(branch) in one launch (a sandwich norm and its residual add; gemma2/3's post norms
// took two launches each: gemma3-12b decode, ncu, a norm 3.45 us and an add 2.5 us).
void CudaBackend::add_normed(const DeviceNorm& post_norm, const float* branch) {
  const int64_t E = m_.hp.n_embd;
  NormParams q = norm_params(post_norm, branch, x_.f(), n_tok_, E, E, m_.hp.norm == NormKind::kLayer);
  q.residual = x_.f();
  launch_norm(q);
}


// Final norm, output projection (and softcap) of residual rows [first, first + n) into
// logits (logits_, sized by the caller).
void CudaBackend::enqueue_head(int64_t first, int64_t n, float* logits) {
  const Hparams& hp = m_.hp;
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  norm_rows(w_.output_norm, x_.f() + first * E, h_.f(), n, E, E, hp.norm == NormKind::kLayer);
  const int64_t saved = n_tok_;
  n_tok_ = n;  // the head runs on n rows only
  matmul(w_.output, h_.f(), E, logits, V);
  n_tok_ = saved;
  if (hp.final_softcap > 0.0f) launch_softcap(logits, n * V, hp.final_softcap, stream_);
}

void CudaBackend::output_logits(int64_t first, int64_t n, float* logits) {
  const int64_t V = m_.hp.n_vocab;
  logits_.ensure(static_cast<size_t>(n * V) * sizeof(float));
  enqueue_head(first, n, logits_.f());
  copy_out_and_flush(logits_.f(), static_cast<size_t>(n * V), logits);
}


}  // namespace detail

std::unique_ptr<DeviceBackend> make_cuda_backend(const Model& m, const DeviceHooks& hooks, int64_t n_gpu_layers,
                                                 int64_t n_ctx) {
  return std::make_unique<detail::CudaBackend>(m, hooks, n_gpu_layers, n_ctx);
}

}  // namespace frink::cuda
