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
// Gated delta net layers (hybrids) and the recurrent state mirror: cuda_backend_recurrent.cpp.
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

// A token graph's pick (graph_key's pick_k): none (the logits out), the argmax, top-k and the
// draw, or the draw over every logit.
static constexpr int kNoPick = -1, kWholePick = kPickMaxTopK + 1;
static int pick_kind(const TokenPick* p) {
  return !p ? kNoPick : p->request.whole_vocab ? kWholePick : p->request.top_k;
}
static int64_t n_pen(const TokenPick* p) { return p ? static_cast<int64_t>(p->request.pen_ids.size()) : 0; }
static bool penalizes(const TokenPick* p) { return p && p->request.penalize; }

// Where a whole-vocabulary draw's chunk sums lie in pick_scratch_: after the top-k's scratch.
static size_t draw_sums_offset(int64_t n_vocab) {
  return (topk_scratch_bytes(n_vocab, kPickMaxTopK) + 255) / 256 * 256;
}

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

// A MoE layer's slots a token and its stacks' experts: the routed ones, and one more of each
// where the shared expert is stacked with them (DeviceLayer::shexp_slots).
struct MoeStack {
  int64_t slots, experts;
};
static MoeStack moe_stack(const MoePlan& mp, const DeviceLayer& d) {
  return {mp.n_expert_used + d.shexp_slots, mp.n_expert + d.shexp_slots};
}

// Whether an n_tok batch takes a MoE layer's expert products grouped by expert
// (moe_grouped_experts) rather than slot by slot: enough rows an expert (moe.cuh), and slots
// the sort holds. begin_batch sizes the sort's buffers by the same rule.
static bool takes_grouped_experts(int64_t n_tok, const MoeStack& st) {
  const int64_t S = n_tok * st.slots;
  return S >= kMoeGroupMinRows * st.experts && S <= kMoeSortMaxSlots;
}

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

std::vector<uintptr_t> CudaBackend::graph_key(std::span<const LayerRun> runs, int64_t max_keys, int pick_k,
                                              bool penalties, int parity) const {
  std::vector<uintptr_t> key{static_cast<uintptr_t>(pick_k + 1), penalties, static_cast<uintptr_t>(parity)};
  for (const DevBuf* b : {&act_, &fold_, &x_, &h_, &q_, &k_, &v_, &qkv_, &attn_, &o_, &f_, &gate_, &up_, &hidden_, &partial_,
                          &logits_, &attn_gate_, &moe_logits_, &moe_ids_, &moe_w_, &moe_gu_, &moe_hidden_, &moe_y_, &moe_sh_y_,
                          &moe_sh_g_, &moe_h_q8_, &gdn_qkv_, &gdn_conv_, &gdn_z_, &gdn_ba_, &gdn_beta_, &gdn_g_,
                          &gdn_o_, &mla_qa_, &mla_q_, &mla_ctx_, &mla_heads_, &mb_in_, &mb_xbc_, &mb_y_})
    key.push_back(reinterpret_cast<uintptr_t>(b->p));
  key.push_back(reinterpret_cast<uintptr_t>(staging_.p));
  key.push_back(reinterpret_cast<uintptr_t>(dstage_.p));
  key.push_back(static_cast<uintptr_t>(max_keys));
  for (size_t il = 0; il < runs.size(); ++il) {
    const LayerRun& r = runs[il];
    if (r.rec) {  // the state copy the recurrent kernels read (they write the other)
      key.push_back(reinterpret_cast<uintptr_t>(r.rec->conv(static_cast<int64_t>(il), r.rec_from)));
      key.push_back(reinterpret_cast<uintptr_t>(r.rec->ssm(static_cast<int64_t>(il), r.rec_from)));
    } else {
      key.push_back(reinterpret_cast<uintptr_t>(r.kv->k_rows(0)));
      key.push_back(reinterpret_cast<uintptr_t>(r.kv->v_rows(0)));
    }
  }
  return key;
}

cudaGraphExec_t CudaBackend::capture_token(std::span<const LayerRun> runs, int64_t max_keys, int pick_k, bool penalties,
                                           int parity) {
  // ThreadLocal: only this thread's calls are checked for capture safety (the host thread
  // pool never touches CUDA).
  FRINK_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    static constexpr int64_t kOneSegment[] = {1};  // a decode step: no cut; snapshots go after the replay
    if (embeds_tokens()) {  // the token's row, its id at pick_ids_dev_[0]: a step ahead's is the pick before it
      EmbedParams e;
      e.type = w_.token_embd.type;
      e.w = w_.token_embd.w;
      e.row_bytes = w_.token_embd.row_bytes;
      e.n = m_.hp.n_embd;
      e.scale = m_.hp.embd_scale;
      e.id = pick_ids_dev_;
      e.x = x_.f();
      e.stream = stream_;
      launch_embed_row(e);
    }
    bool forked = false;  // a layer's rows went to copy_stream_, which must rejoin
    const Pending* group_first = nullptr;  // the first layer of the copy group being enqueued
    for (size_t il = 0; il < runs.size(); ++il) {
      const LayerRun& r = runs[il];
      if (r.rec) {
        enqueue_recurrent(static_cast<int64_t>(il), *r.rec, r.rec_from, 1 - r.rec_from, kOneSegment, nullptr);
        continue;
      }
      enqueue_layer(static_cast<int64_t>(il), *r.kv, r.pd, max_keys);
      if (!group_first || group_first->event != r.pd.event) group_first = &r.pd;
      size_t next = il + 1;  // the next attention layer, if any: the group ends before a new event
      while (next < runs.size() && !runs[next].kv) ++next;
      if (next == runs.size() || runs[next].pd.event != r.pd.event) {
        copy_back_in_graph(*group_first, r.pd);
        forked = true;
      }
    }
    // The logits in the parity's half of logits_: a step ahead (the other parity) leaves them
    // for exact_draw.
    const int64_t V = m_.hp.n_vocab;
    float* logits = logits_.f() + parity * V;
    enqueue_head(0, 1, logits);
    if (pick_k != kNoPick) {  // the next token chosen here (TokenPick): penalties, then argmax or top-k and draw
      if (penalties) {  // the token the graph embeds, where a step ahead's window takes it in
        PickDev* pen_dev = nullptr;
        FRINK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pen_dev), pick_host_ + parity, 0));
        launch_penalties(logits, pen_dev, pick_ids_dev_, stream_);
      }
      // The pick advances the position for the step it feeds (a step ahead's; any other step
      // copies its own position first).
      if (pick_k == 0) {
        launch_argmax(logits, V, pick_scratch_.p, pick_ids_dev_, stream_, pos_dev_);
      } else {
        const int k = pick_k == kWholePick ? kPickMaxTopK : pick_k;
        launch_topk(logits, V, k, pick_scratch_.p, pick_ids_dev_, pick_vals_dev_, stream_);
        DrawDev* draw_dev = nullptr;
        FRINK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&draw_dev), draw_host_ + parity, 0));
        if (pick_k == kWholePick)
          launch_draw_whole(logits, V, pick_ids_dev_, pick_vals_dev_, draw_dev,
                            reinterpret_cast<double*>(static_cast<char*>(pick_scratch_.p) + draw_sums_offset(V)),
                            pick_ids_dev_, stream_, pos_dev_);
        else
          launch_draw(pick_ids_dev_, pick_vals_dev_, k, draw_dev, pick_ids_dev_, stream_, pos_dev_);
      }
    }
    // The copies rejoin at the end, so the last group's copy runs beside the head, off its chain.
    if (forked) {
      FRINK_CUDA_CHECK(cudaEventRecord(graph_join_, copy_stream_));
      FRINK_CUDA_CHECK(cudaStreamWaitEvent(stream_, graph_join_, 0));
    }
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream_, &broken);  // leave the stream usable; the error goes up
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();  // and leave no sticky error for the next launch check to misreport
    throw;
  }
  cudaGraph_t graph = nullptr;
  FRINK_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FRINK_CUDA_CHECK(inst);
  ++n_captures_;
  FRINK_LOG_DEBUG("device: token graph capture {} (key bound {} keys, {} cached)", n_captures_, max_keys,
                  token_graphs_.size() + 1);
  return exec;
}

cudaGraphExec_t CudaBackend::cached_token_graph(const std::vector<uintptr_t>& key) {
  for (size_t i = 0; i < token_graphs_.size(); ++i)
    if (token_graphs_[i].key == key) {
      std::rotate(token_graphs_.begin() + static_cast<std::ptrdiff_t>(i),
                  token_graphs_.begin() + static_cast<std::ptrdiff_t>(i) + 1, token_graphs_.end());
      return token_graphs_.back().exec;
    }
  return nullptr;
}

cudaGraphExec_t CudaBackend::token_graph_for(std::vector<uintptr_t> key, std::span<const LayerRun> runs,
                                             int64_t max_keys, int pick_k, bool penalties, int parity) {
  if (cudaGraphExec_t exec = cached_token_graph(key)) return exec;
  cudaGraphExec_t exec = capture_token(runs, max_keys, pick_k, penalties, parity);
  if (token_graphs_.size() == kMaxTokenGraphs) {  // no replay is in flight: a capture follows begin_batch's wait
    FRINK_CUDA_CHECK(cudaGraphExecDestroy(token_graphs_.front().exec));
    token_graphs_.erase(token_graphs_.begin());
  }
  token_graphs_.push_back({std::move(key), exec});
  return exec;
}

// The attention grid's key bound a token graph at position pos bakes in: a power of two, at
// least 512, so a sequence's graphs change about log2(context) times.
static int64_t token_key_bound(int64_t pos) {
  return std::max<int64_t>(512, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(pos + 1))));
}

// The same draw: its parameters and its uniform.
static bool same_draw(const DeviceDraw& a, const DeviceDraw& b) {
  return a.top_p == b.top_p && a.min_p == b.min_p && a.log_min_p == b.log_min_p && a.temp == b.temp && a.u == b.u;
}

// A step enqueued ahead is this call's when nothing it assumed changed: the position, the token
// (the pick it embedded on the device), the caches, a pick the same as its own (a draw's
// uniform included, penalties over the window it assumed), and each mirror still the image of
// its cache (the staleness rule: a truncate or a restore between the calls fails it).
bool CudaBackend::adopt_ahead(int64_t pos0, int32_t token, std::span<KvCache* const> caches, RecurrentState* recurrent,
                              const float* logits, const TokenPick* pick) {
  if (!ahead_.active) return false;
  bool same = pos0 == ahead_.pos0 && token == ahead_.token && !logits && pick && pick_kind(pick) == ahead_.pick_k &&
              ahead_.pen.penalties_after(pick->request, token) &&
              (ahead_.pick_k == 0 || same_draw(pick->request.draw, ahead_.draw)) &&
              recurrent == ahead_.recurrent &&
              std::equal(caches.begin(), caches.end(), ahead_.caches.begin(), ahead_.caches.end());
  for (size_t i = 0; same && i < ahead_.pending.size(); ++i) {
    const Pending& pd = ahead_.pending[i];
    same = pd.cache->rows() == pos0 && pd.mirror->current(*pd.cache);
  }
  // Each recurrent layer's state is still the one the step ahead read: the step before it
  // landed there (its copy became current) and the host has not changed it since.
  RecurrentMirror* rm = nullptr;
  if (same && recurrent) {
    auto it = rec_mirrors_.find(recurrent);
    same = it != rec_mirrors_.end();
    if (same) rm = it->second.get();
  }
  for (size_t i = 0; same && i < ahead_.rec_from.size(); ++i)
    same = rm->holds_newest(*recurrent, ahead_.rec_from[i].first, ahead_.rec_from[i].second);
  if (!same) {
    cancel_ahead();
    return false;
  }
  ++batch_tick_;  // begin_batch's LRU mark, for the mirrors this step uses
  for (KvCache* c : caches)
    if (auto it = mirrors_.find(c); it != mirrors_.end()) it->second.last_use = batch_tick_;
  clear_pending();
  pending_ = std::move(ahead_.pending);
  n_tok_ = 1;
  pos0_ = pos0;
  staging_used_ = staging_landed_ = ahead_.staging_end;  // the replay copies every layer's rows back itself
  for (const auto& [il, from] : ahead_.rec_from) {
    rm->running(il);
    pending_rec_.push_back({recurrent, rm, il, true});
  }
  ahead_ = {};
  ++n_ahead_;
  return true;
}

void CudaBackend::cancel_ahead() {
  if (!ahead_.active) return;
  ahead_ = {};
  // Its replay still reads buffers the caller may now resize, and its copies write staging_.
  // Nothing of it reached the host; its mirror rows lie past each mirror's seq_len, where the
  // next step writes its own.
  FRINK_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::launch_step(cudaGraphExec_t exec, int parity) {
  const bool timed = log_level() >= LogLevel::kDebug;
  cudaEvent_t* ev = step_ev_[parity];
  if (timed) {
    for (int i = 0; i < 2; ++i)
      if (!ev[i]) FRINK_CUDA_CHECK(cudaEventCreate(&ev[i]));
    FRINK_CUDA_CHECK(cudaEventRecord(ev[0], stream_));
  }
  FRINK_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  if (timed) FRINK_CUDA_CHECK(cudaEventRecord(ev[1], stream_));
}

void CudaBackend::set_draw(int parity, const DeviceDraw& d) {
  draw_host_[parity] = {.u = d.u, .top_p = d.top_p, .min_p = d.min_p, .log_min_p = d.log_min_p, .temp = d.temp};
}

void CudaBackend::set_penalties(int parity, const DevicePick& r, bool entering) {
  PickDev& p = pick_host_[parity];
  p.n_pen = static_cast<int32_t>(r.pen_ids.size());
  p.entering = entering;
  p.leaving = r.pen_leaving;
  p.repeat = r.repeat;
  p.frequency = r.frequency;
  p.presence = r.presence;
  for (size_t i = 0; i < r.pen_ids.size(); ++i) {
    p.pen[2 * i] = r.pen_ids[i];
    p.pen[2 * i + 1] = r.pen_counts[i];
  }
}

void CudaBackend::finish_step(int parity, bool pick, bool logits) {
  const int64_t V = m_.hp.n_vocab;
  if (logits) copy_out(logits_.f() + parity * V, static_cast<size_t>(V));
  if (pick)
    FRINK_CUDA_CHECK(cudaMemcpyAsync(pick_ids_host_ + parity, pick_ids_dev_, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                     stream_));
  FRINK_CUDA_CHECK(cudaEventRecord(step_done_[parity], stream_));
}

// The step at pos1 = the one in flight's position + 1, its token the in-flight step's pick,
// enqueued behind it: the embedding row taken on the device, then the replay. Only where
// nothing must wait or grow under the running step (its mirrors have room for its row, the
// attention scratch is big enough, its graph was captured before); else the next call runs
// its step the usual way.
bool CudaBackend::launch_ahead(int64_t pos1, std::span<KvCache* const> caches, RecurrentState* recurrent,
                               const TokenPick& pick) {
  const Hparams& hp = m_.hp;
  if (!embeds_tokens() || pos1 > INT32_MAX || stage_half_ == 0) return false;
  // A snapshot after the step would be copied out after its replay, by the host (run_token).
  if (recurrent && recurrent->wants_snapshot(pos1 + 1, pos1, pos1 + 1)) return false;
  std::vector<std::pair<int64_t, int>> rec_from;
  const int parity = static_cast<int>(pos1 & 1);
  const int64_t max_keys = token_key_bound(pos1);
  std::vector<LayerRun> runs(static_cast<size_t>(hp.n_layer));
  std::vector<Pending> pending;
  size_t used = static_cast<size_t>(parity) * stage_half_;
  const int ev0 = parity * copy_groups_;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
    if (p.recurrent != RecurrentKind::kNone) {  // the copy the step in flight writes, into the one it reads
      auto rit = recurrent ? rec_mirrors_.find(recurrent) : rec_mirrors_.end();
      if (rit == rec_mirrors_.end() || !rit->second->has(il)) return false;
      LayerRun& r = runs[static_cast<size_t>(il)];
      r.rec = rit->second.get();
      r.rec_from = 1 - r.rec->half(il);
      rec_from.emplace_back(il, r.rec_from);
      continue;
    }
    KvCache& cache = *caches[static_cast<size_t>(il)];
    auto it = mirrors_.find(&cache);
    if (it == mirrors_.end()) return false;
    KvMirror& mirror = *it->second.mirror;
    // The mirror holds the cache's rows; the step in flight writes row pos1 - 1, this one pos1.
    if (cache.rows() != pos1 - 1 || mirror.seq_len() != pos1 - 1 || mirror.capacity() < pos1 + 1) return false;
    LayerRun& r = runs[static_cast<size_t>(il)];
    r.kv = &mirror;
    r.pd = staged_rows(cache, mirror, used);
    r.pd.event = ev0 + static_cast<int>(pending.size()) / kGraphCopyLayers;
    pending.push_back(r.pd);
  }
  if (attn_partial_floats(1, max_keys) * sizeof(float) > partial_.bytes ||
      copy_events_.size() < static_cast<size_t>(2 * copy_groups_))
    return false;
  const int pick_k = pick_kind(&pick);
  cudaGraphExec_t exec = cached_token_graph(graph_key(runs, max_keys, pick_k, penalizes(&pick), parity));
  if (!exec) return false;
  DeviceDraw draw = pick.request.draw;  // drawn with the next uniform, into the slot no step in flight reads
  draw.u = pick.request.draw.u_next;
  if (pick_k > 0) set_draw(parity, draw);
  if (penalizes(&pick)) set_penalties(parity, pick.request, true);  // this window, the pick entering
  // Nothing before the replay: its token's row is the graph's own first kernel, its id the
  // step in flight's pick (pick_ids_dev_), and that pick advanced the position (a kernel
  // right before a replay made the replay itself about 23 us slower: 8B Q4_0, H200, a
  // one-block kernel there took the token 1.855 -> 1.878 ms of graph, 527.8 -> 514.9-517.7
  // t/s). The position's copy it replaces: 8B Q4_0 533.3 / 533.1 -> 533.7 / 534.0 t/s,
  // qwen3-30b-a3b 530.1 / 530.5 -> 531.1 / 531.4, qwen3-next 8 layers 1912 / 1919 -> 1931 /
  // 1933 (H200, one call, two rounds, with the penalties launch gone from greedy graphs).
  launch_step(exec, parity);
  finish_step(parity, true, false);
  ahead_.active = true;
  ahead_.pos0 = pos1;
  ahead_.token = -1;  // known when the step in flight's pick lands
  ahead_.pick_k = pick_k;
  ahead_.draw = draw;
  ahead_.pen = pick.request;
  ahead_.caches.assign(caches.begin(), caches.end());
  ahead_.pending = std::move(pending);
  ahead_.staging_end = used;
  ahead_.recurrent = recurrent;
  ahead_.rec_from = std::move(rec_from);
  return true;
}

void CudaBackend::run_token(int64_t pos0, int32_t token, const float* x, std::span<KvCache* const> caches,
                            RecurrentState* recurrent, float* logits, TokenPick* pick) {
  const Hparams& hp = m_.hp;
  FRINK_ASSERT(static_cast<int64_t>(caches.size()) == hp.n_layer, "{} caches for {} layers", caches.size(), hp.n_layer);
  FRINK_ASSERT((logits != nullptr) != (pick != nullptr), "run_token returns the logits or a pick, one of them");
  const int pick_k = pick_kind(pick);
  if (pick) {
    const DevicePick& r = pick->request;
    FRINK_ASSERT(r.top_k >= 0 && r.top_k <= kPickMaxTopK && r.top_k < hp.n_vocab &&
                     (!r.whole_vocab || (r.top_k == 0 && hp.n_vocab > kPickMaxTopK)) &&
                     n_pen(pick) <= kPickMaxPenalties && r.pen_counts.size() == r.pen_ids.size(),
                 "device pick of top {} (whole vocabulary: {}) with {} penalties", r.top_k, r.whole_vocab, n_pen(pick));
  }
  using Clock = std::chrono::steady_clock;
  const bool timed = log_level() >= LogLevel::kDebug;
  const Clock::time_point t_enter = Clock::now();
  Clock::time_point t_launch = t_enter, t_launched = t_enter;
  const int parity = static_cast<int>(pos0 & 1);
  try {
    const bool adopted = adopt_ahead(pos0, token, caches, recurrent, logits, pick);
    if (!adopted) {
      begin_batch(1, pos0, caches, recurrent);
      // Everything that may synchronise, allocate or upload happens here, before the replay.
      const int64_t max_keys = token_key_bound(pos0);
      std::vector<LayerRun> runs(static_cast<size_t>(hp.n_layer));
      for (int64_t il = 0; il < hp.n_layer; ++il) {
        const LayerPlan& p = hp.layers[static_cast<size_t>(il)];
        FRINK_ASSERT(refusal_[static_cast<size_t>(il)] == Refusal::kNone, "run_token with refused layer {}", il);
        if (p.recurrent != RecurrentKind::kNone) {
          FRINK_ASSERT(recurrent, "run_token on recurrent layer {} without a recurrent state", il);
          RecurrentMirror& rm = ready_recurrent(*recurrent);
          rm.prepare(*recurrent, il, stream_);  // a stale copy is uploaded here, before the replay
          runs[static_cast<size_t>(il)].rec = &rm;
          runs[static_cast<size_t>(il)].rec_from = rm.half(il);
          continue;
        }
        KvCache& cache = *caches[static_cast<size_t>(il)];
        FRINK_ASSERT(cache.rows() == pos0, "cache has {} rows at position {}", cache.rows(), pos0);
        runs[static_cast<size_t>(il)].kv = &ready_mirror(cache, p, 1);
      }
      partial_.ensure(attn_partial_floats(1, max_keys) * sizeof(float));
      logits_.ensure(2 * static_cast<size_t>(hp.n_vocab) * sizeof(float));  // a half a parity
      if (embeds_tokens()) {  // the graph takes the token's row itself: its id where it reads it
        pos_host_[0] = token;  // nothing in flight reads it: begin_batch left the stream idle
        FRINK_CUDA_CHECK(
            cudaMemcpyAsync(pick_ids_dev_, pos_host_, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
      } else {
        // x through pinned memory: from the caller's pageable memory the copy is the driver's own
        // staging, synchronous on this thread (measured with KvMirror's fingerprint prefix).
        FRINK_ASSERT(x, "run_token without the token's row on a device that does not embed tokens");
        const size_t xb = static_cast<size_t>(hp.n_embd) * sizeof(float);
        in_host_.ensure(xb);  // nothing in flight reads it: begin_batch left the stream idle
        std::memcpy(in_host_.p, x, xb);
        FRINK_CUDA_CHECK(cudaMemcpyAsync(x_.p, in_host_.p, xb, cudaMemcpyHostToDevice, stream_));
      }
      // Each group of attention layers' rows land by their own event (copy_back_in_graph), in
      // layer order; the events and the staging half are the parity's (a step ahead's are the other).
      staging_used_ = staging_landed_ = static_cast<size_t>(parity) * stage_half_;
      int n_kv = 0;
      for (const LayerRun& r : runs) n_kv += r.kv != nullptr;
      copy_groups_ = (n_kv + kGraphCopyLayers - 1) / kGraphCopyLayers;
      n_kv = 0;
      for (int64_t il = 0; il < hp.n_layer; ++il) {
        LayerRun& r = runs[static_cast<size_t>(il)];
        if (r.kv) {
          r.pd = add_pending(*caches[static_cast<size_t>(il)], *r.kv);
          r.pd.event = pending_.back().event = parity * copy_groups_ + n_kv++ / kGraphCopyLayers;
        } else {
          r.rec->running(il);
          pending_rec_.push_back({recurrent, r.rec, il, true});
        }
      }
      ensure_copy_events(static_cast<size_t>(2 * copy_groups_));
      if (!graph_join_) FRINK_CUDA_CHECK(cudaEventCreateWithFlags(&graph_join_, cudaEventDisableTiming));
      const bool penalties = penalizes(pick);
      cudaGraphExec_t exec = token_graph_for(graph_key(runs, max_keys, pick_k, penalties, parity), runs, max_keys,
                                             pick_k, penalties, parity);
      // Nothing in flight reads the draw's slot: begin_batch left the stream idle.
      if (pick_k > 0) set_draw(parity, pick->request.draw);
      if (penalties) set_penalties(parity, pick->request, false);
      t_launch = Clock::now();
      launch_step(exec, parity);
      t_launched = Clock::now();
      staging_landed_ = staging_used_;  // the replay copies every layer's rows back itself
      // The state after this token, where the state keeps one (every snapshot_interval-th
      // position): copied out after the replay, so the graph never depends on the position.
      if (recurrent && recurrent->wants_snapshot(pos0 + 1, pos0, pos0 + 1))
        for (int64_t il = 0; il < hp.n_layer; ++il)
          if (const LayerRun& r = runs[static_cast<size_t>(il)]; r.rec)
            stage_snapshot(*recurrent, *r.rec, il, pos0 + 1, 1 - r.rec_from);
      finish_step(parity, pick != nullptr, logits != nullptr);
    }
    // The next step, enqueued before this one's wait, so the device runs it while the host
    // lands this one's rows and the caller takes its token: where the device's pick is the
    // token (its penalties' window the same with the pick entering it). Not after a whole-vocabulary draw
    // that needed the exact form: the next one likely does too, and then the step ahead, which
    // embedded its -1, is dropped only after it ran (8B Q4_0 synth, flat logits, `--top-k 0`:
    // 248.5 t/s, 1.7 ms a step waiting for it).
    if (pick && !(pick->request.whole_vocab && last_draw_exact_) && !hooks_.no_step_ahead &&
        !hooks_.trust_stale_mirror) {
      const Clock::time_point t = Clock::now();
      if (launch_ahead(pos0 + 1, caches, recurrent, *pick)) {
        t_launch = t;
        t_launched = Clock::now();
      }
    }
    const Clock::time_point t_flush = Clock::now();
    flush(step_done_[parity]);
    if (logits) std::memcpy(logits, out_host_.p, static_cast<size_t>(hp.n_vocab) * sizeof(float));
    if (pick) pick->id = pick_ids_host_[parity];
    if (ahead_.active) ahead_.token = pick->id;  // what the step ahead embedded: -1 drops it
    if (pick) last_draw_exact_ = pick->id < 0;
    if (pick && pick->id < 0) pick->id = exact_draw(parity);
    if (timed) {  // flush waited for this step's end: both its events have completed
      float graph_ms = 0.0f;
      FRINK_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, step_ev_[parity][0], step_ev_[parity][1]));
      const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
      const Clock::time_point t_end = Clock::now();
      step_times_.graph_ms.push_back(graph_ms);
      step_times_.n_ahead += adopted;
      step_times_.prep_ms.push_back(ms(t_launch - t_enter));
      step_times_.launch_ms.push_back(ms(t_launched - t_launch));
      step_times_.wait_ms.push_back(ms(flush_synced_ - t_flush));
      step_times_.land_ms.push_back(ms(t_end - flush_synced_));
      step_times_.call_ms.push_back(ms(t_end - t_enter));
      if (last_step_end_ != Clock::time_point{}) step_times_.between_ms.push_back(ms(t_enter - last_step_end_));
      last_step_end_ = t_end;
    }
  } catch (...) {
    // The booked rows never reached the host: forget them (and a step ahead), so the error is
    // this step's alone and the next batch starts clean (the mirrors' rows past their seq_len
    // are overwritten by the next step).
    cudaStreamSynchronize(stream_);  // no queued copy may still read the pinned buffers
    ahead_ = {};
    clear_pending();
    staging_used_ = staging_landed_ = 0;
    throw;
  }
}

int32_t CudaBackend::exact_draw(int parity) {
  const int64_t V = m_.hp.n_vocab;
  const size_t at = exact_draw_scratch_bytes(V);
  exact_scratch_.ensure(at + sizeof(int32_t));
  auto* out = reinterpret_cast<int32_t*>(static_cast<char*>(exact_scratch_.p) + at);
  launch_exact_draw(logits_.f() + parity * V, V, draw_host_[parity], exact_scratch_.p, out, copy_stream_);
  FRINK_CUDA_CHECK(
      cudaMemcpyAsync(pick_ids_host_ + parity, out, sizeof(int32_t), cudaMemcpyDeviceToHost, copy_stream_));
  FRINK_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  const int32_t id = pick_ids_host_[parity];
  FRINK_ASSERT(id >= 0 && id < V, "exact draw gave token {} of {}", id, V);
  ++n_exact_draws_;
  return id;
}

std::string CudaBackend::take_step_times() {
  StepTimes t = std::move(step_times_);
  step_times_ = {};
  last_step_end_ = {};
  if (t.graph_ms.empty()) return {};
  const auto median = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  return fmt::format(
      "{} whole-token steps ({} enqueued a step ahead), medians: graph {:.3f} ms on the device; on the host {:.3f} ms "
      "a call ({:.3f} before the call's replay, {:.3f} launching it, {:.3f} waiting, {:.3f} landing rows after), "
      "{:.3f} ms between calls",
      t.graph_ms.size(), t.n_ahead, median(t.graph_ms), median(t.call_ms), median(t.prep_ms), median(t.launch_ms),
      median(t.wait_ms), median(t.land_ms), median(t.between_ms));
}

}  // namespace detail

std::unique_ptr<DeviceBackend> make_cuda_backend(const Model& m, const DeviceHooks& hooks, int64_t n_gpu_layers,
                                                 int64_t n_ctx) {
  return std::make_unique<detail::CudaBackend>(m, hooks, n_gpu_layers, n_ctx);
}

}  // namespace frink::cuda
