// The CudaBackend class, shared by the files that implement it (cuda_backend.cpp: batches,
// attention layers, the head; cuda_backend_moe.cpp: MoE FFNs; cuda_backend_mla.cpp: MLA
// attention; cuda_backend_token.cpp: token graphs and the step ahead;
// cuda_backend_recurrent.cpp: gated delta net layers and the recurrent state mirror link).
// Internal to src/cuda: the rest of frink sees DeviceBackend through make_cuda_backend
// (cuda_backend.h) only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cpu/thread_pool.h"
#include "cuda/cuda_check.h"
#include "cuda/device_probe.h"
#include "cuda/delta_net.cuh"
#include "cuda/device_weights.h"
#include "cuda/kv_mirror.h"
#include "cuda/matmul.cuh"
#include "cuda/moe.cuh"
#include "cuda/pick.cuh"
#include "cuda/recurrent_mirror.h"
#include "cuda/rope.cuh"
#include "engine/device_backend.h"
#include "kv/recurrent_state.h"
#include "model/model.h"

namespace frink::cuda::detail {

// A device buffer that only grows (sized for the largest batch seen).
// A growable buffer, on the device (DevBuf) or pinned on the host (PinnedBuf: the landing
// place of device-to-host copies, which with pageable memory would block the host until the
// stream drains, and are staged by the driver besides).
template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { Free(p); }
  void ensure(size_t n) {
    if (n <= bytes) return;
    FRINK_CUDA_CHECK(Free(p));
    p = nullptr;
    bytes = 0;  // if the allocation below fails, the buffer says it holds nothing
    FRINK_CUDA_CHECK(Alloc(&p, n));
    bytes = n;
  }
  float* f() const { return static_cast<float*>(p); }
  size_t floats() const { return bytes / sizeof(float); }
};
inline cudaError_t pinned_alloc(void** p, size_t n) { return cudaMallocHost(p, n); }
inline cudaError_t device_alloc(void** p, size_t n) { return cudaMalloc(p, n); }
using DevBuf = Buf<device_alloc, cudaFree>;
using PinnedBuf = Buf<pinned_alloc, cudaFreeHost>;

// A MoE layer's slots a token and its stacks' experts: the routed ones, and one more of each
// where the shared expert is stacked with them (DeviceLayer::shexp_slots).
struct MoeStack {
  int64_t slots, experts;
};
inline MoeStack moe_stack(const MoePlan& mp, const DeviceLayer& d) {
  return {mp.n_expert_used + d.shexp_slots, mp.n_expert + d.shexp_slots};
}

// Whether an n_tok batch takes a MoE layer's expert products grouped by expert
// (moe_grouped_experts) rather than slot by slot: enough rows an expert (moe.cuh), and slots
// the sort holds. begin_batch sizes the sort's buffers by the same rule.
inline bool takes_grouped_experts(int64_t n_tok, const MoeStack& st) {
  const int64_t S = n_tok * st.slots;
  return S >= kMoeGroupMinRows * st.experts && S <= kMoeSortMaxSlots;
}

// Where a whole-vocabulary draw's chunk sums lie in pick_scratch_: after the top-k's scratch.
inline size_t draw_sums_offset(int64_t n_vocab) {
  return (topk_scratch_bytes(n_vocab, kPickMaxTopK) + 255) / 256 * 256;
}

class CudaBackend final : public DeviceBackend, public RecurrentDeviceLink {
 public:
  CudaBackend(const Model& m, const DeviceHooks& hooks, int64_t n_gpu_layers, int64_t n_ctx);
  ~CudaBackend() override;

  std::string describe() const override;
  double peak_gbps() const override { return info_.peak_gbps; }
  // A layer placed kMemory runs here in a prompt batch that lends it the device (lends).
  Refusal check_layer(int64_t il) const override {
    const Refusal r = refusal_[static_cast<size_t>(il)];
    return r == Refusal::kMemory && lends(il) ? Refusal::kNone : r;
  }
  Refusal check_output() const override { return refusal_.back(); }
  void begin_batch(int64_t n_tok, int64_t pos0, std::span<KvCache* const> caches, RecurrentState* recurrent) override;
  void upload(const float* x) override;
  void download(float* x) override;
  void run_layer(int64_t il, KvCache& cache) override;
  void run_recurrent_layer(int64_t il, RecurrentState& state) override;
  void output_logits(int64_t first, int64_t n, float* logits) override;
  void run_token(int64_t pos0, int32_t token, const float* x, std::span<KvCache* const> caches,
                 RecurrentState* recurrent, float* logits, TokenPick* pick) override;
  int64_t steps_run_ahead() const override { return n_ahead_; }
  // A token graph takes its token's embedding row itself (its first kernel), where the
  // embedding is on the device (DeviceWeights::token_embd): a step ahead's token is known
  // only there.
  bool embeds_tokens() const override { return static_cast<bool>(w_.token_embd); }
  std::string take_step_times() override;
  int64_t exact_draws() const override { return n_exact_draws_; }
  // RecurrentDeviceLink
  void pull(const RecurrentState& s, int64_t layer, float* conv, float* ssm) override;
  void forget(const RecurrentState& s) noexcept override;

 private:
  struct Pending {
    KvCache* cache;
    KvMirror* mirror;
    size_t k_off, v_off;  // floats into staging_
    int event = -1;       // copied early (copy_back_early): its copy's event in copy_events_
  };
  // What a token graph runs for one layer: an attention layer's mirror and staging, or a
  // recurrent layer's state mirror, read from copy rec_from and written to the other.
  struct LayerRun {
    KvMirror* kv = nullptr;
    Pending pd{};
    RecurrentMirror* rec = nullptr;
    int rec_from = 0;
  };
  // Recurrent work enqueued and not yet landed (flush tells the state the device is ahead;
  // flip: the work wrote the mirror's other copy), and snapshots on their way to the host
  // (saved into the state at flush).
  struct PendingRec {
    RecurrentState* state;
    RecurrentMirror* mirror;
    int64_t layer;
    bool flip;
  };
  struct PendingSnap {
    RecurrentState* state;
    int64_t pos, layer;
    size_t conv_off, ssm_off;  // floats into snap_staging_
  };
  // Layer p's mirror of cache, made ready for n_new rows (staleness settled, room made, and
  // device memory found for a growth by evicting other sequences' mirrors if need be).
  KvMirror& ready_mirror(KvCache& cache, const LayerPlan& p, int64_t n_new);
  void evict_mirrors(size_t bytes_wanted);
  // Books staging room for the batch's new rows of one layer (in layer order, so a token's
  // offsets are the same every step) and queues them for flush().
  Pending add_pending(KvCache& cache, KvMirror& mirror);
  // The staging room of one layer's rows at `used` (floats into staging_), which it advances.
  Pending staged_rows(KvCache& cache, KvMirror& mirror, size_t& used) const;
  // The device work of layer il / of the head; max_keys bounds the attention grid.
  void enqueue_layer(int64_t il, KvMirror& mirror, const Pending& pd, int64_t max_keys);
  // Layer p's rotation as the batch applies it (positions from pos_dev_); the caller names the rows.
  RopeLaunch rope_launch(const LayerPlan& p) const;
  // A latent-attention layer (plan.attn == kMla): its attention, then enqueue_residual_ffn.
  void enqueue_mla(int64_t il, KvMirror& mirror, const Pending& pd, int64_t max_keys);
  // Gated delta net layer il on the batch, its recurrence cut at the batch-relative segment
  // ends `ends` (ascending, the last n_tok_); when snap is set, the state after each end
  // the state wants a snapshot of is copied out (stage_snapshot). The state is read from the
  // mirror's copy `from` and written to copy `to` (another only with one segment).
  void enqueue_delta_net(int64_t il, RecurrentMirror& rm, int from, int to, std::span<const int64_t> ends,
                         RecurrentState* snap);
  // Recurrent layer il's causal conv of n_tok rows of x (its channels from x, x_stride apart)
  // into y (rows of its channels), against the state copy `from`, the new state into `to`.
  ConvParams conv_params(int64_t il, RecurrentMirror& rm, int from, int to, const float* x, int64_t x_stride, float* y,
                         int64_t n_tok);
  // The same for a Mamba-2 layer (mamba2.cuh), and the one of the two layer il is.
  void enqueue_mamba2(int64_t il, RecurrentMirror& rm, int from, int to, std::span<const int64_t> ends,
                      RecurrentState* snap);
  void enqueue_recurrent(int64_t il, RecurrentMirror& rm, int from, int to, std::span<const int64_t> ends,
                         RecurrentState* snap);
  // x = x + proj(branch) (+ sandwich norm), x = x + ffn(ffn_norm(x)): the tail of a layer.
  // branch_q8: act_ already holds branch as proj reads it (Q8_0 blocks: MatmulParams::x_prepared).
  // branch_glu: branch is this GLU's output, computed in proj's launch (MatmulParams::pre_glu).
  // il: the layer (its successor's attention norm may fold into the down: attn_takes_fold).
  void enqueue_residual_ffn(int64_t il, const LayerPlan& p, const DeviceLayer& d, const DeviceLinear& proj,
                            const float* branch, int64_t branch_w, bool branch_q8 = false,
                            const GluParams* branch_glu = nullptr);
  // The sequence's recurrent mirror (made on first use; the state is linked to this backend).
  RecurrentMirror& ready_recurrent(RecurrentState& s);
  // Copy `half` of layer il's state, as it stands after the work enqueued so far, on its way
  // to the state's snapshot at pos.
  void stage_snapshot(RecurrentState& s, RecurrentMirror& rm, int64_t il, int64_t pos, int half);
  void clear_pending();  // a failed batch's bookkeeping, forgotten
  // The attention's partial scratch (partial_) n_tok tokens against at most max_keys keys
  // need, in floats: the largest of the attention layers'.
  size_t attn_partial_floats(int64_t n_tok, int64_t max_keys) const;
  void enqueue_head(int64_t first, int64_t n, float* logits);
  // pick_k (pick_kind): -1 no pick (logits out), 0 argmax, 1..kPickMaxTopK top-k and the draw,
  // kWholePick the draw over every logit; penalties: the pick's
  // penalties kernel first (a step without penalties, as every step ahead, has none: one
  // launch fewer at the token's end). parity: the position's, which picks the staging half,
  // copy events and draw parameters the graph bakes in.
  std::vector<uintptr_t> graph_key(std::span<const LayerRun> runs, int64_t max_keys, int pick_k, bool penalties,
                                   int parity) const;
  cudaGraphExec_t capture_token(std::span<const LayerRun> runs, int64_t max_keys, int pick_k, bool penalties,
                                int parity);
  cudaGraphExec_t cached_token_graph(const std::vector<uintptr_t>& key);  // null: none captured
  cudaGraphExec_t token_graph_for(std::vector<uintptr_t> key, std::span<const LayerRun> runs, int64_t max_keys,
                                  int pick_k, bool penalties, int parity);
  MatmulParams matmul_params(const DeviceLinear& l, const float* x, int64_t x_stride, float* y, int64_t y_stride);
  // y = W x (+ residual, which may be y: decode batches only, see MatmulParams::residual;
  // x_prepared, pre_glu: MatmulParams').
  void matmul(const DeviceLinear& l, const float* x, int64_t x_stride, float* y, int64_t y_stride,
              const float* residual = nullptr, bool x_prepared = false, const GluParams* pre_glu = nullptr,
              const NormFold* fold_out = nullptr);
  void norm_rows(const DeviceNorm& n, const float* x, float* y, int64_t n_rows, int64_t len, int64_t stride, bool layer);
  // x_ += post_norm(branch) over the batch's rows, one launch.
  void add_normed(const DeviceNorm& post_norm, const float* branch);
  NormParams norm_params(const DeviceNorm& n, const float* x, float* y, int64_t n_rows, int64_t len, int64_t stride,
                         bool layer) const;
  // pre_norm: h is that norm's output, launched here (with the gate/up products' activation
  // preparation when it can: MatmulParams::pre_norm).
  // h_fold (gated FFN, no pre_norm): the gate/up read h as that NormFold; out_fold: the down
  // writes it (MatmulParams::fold_in / fold_out).
  void ffn(const LayerPlan& p, const DeviceLayer& d, const float* h, float* out, const float* residual,
           const NormParams* pre_norm = nullptr, const NormFold* h_fold = nullptr, const NormFold* out_fold = nullptr);
  // NormFold (matmul.cuh) of the residual stream, one token: whether layer il's q/k/v read
  // their attention norm's fold (written by the product before them), and whether a layer's
  // gate/up read their FFN norm's.
  bool attn_takes_fold(int64_t il) const;
  bool ffn_takes_fold(const LayerPlan& p, const DeviceLayer& d) const;
  // out set (one token, no shared expert of its own): the down adds the combine into out (+
  // residual) where it can (MatmulParams::combine_w); true when it did.
  bool moe_slot_experts(const LayerPlan& p, const DeviceLayer& d, MatmulParams* gu, int n_gu, float* out,
                        const float* residual);
  void moe_grouped_experts(const LayerPlan& p, const DeviceLayer& d, const float* h);
  // h_blocks: the routed experts' first gate/up product when moe_h_q8_ holds h as its dp4a
  // blocks (the norm's producer wrote them), else null.
  void combine_experts(const LayerPlan& p, const DeviceLayer& d, const float* h, float* out, const float* residual,
                       const MatmulParams* h_blocks);
  void moe_ffn(const LayerPlan& p, const DeviceLayer& d, const float* h, float* out, const float* residual,
               const NormParams* pre_norm);
  // An expert product: slot s multiplies its routed expert with activation row s / x_div.
  // MatmulParams of expert stack x for n_rows rows of `in` in expert order (moe_rows_host_[e]
  // of them for expert e), as moe_grouped_experts takes them.
  MatmulParams grouped_params(const DeviceExperts& x, const float* in, int64_t n_rows, float* y, int64_t y_stride);
  MatmulParams expert_params(const DeviceExperts& x, const float* in, int64_t n_rows, int64_t x_div, float* y,
                             int64_t y_stride);
  // Waits (for `done` when set, else for the stream), then lands pending K/V rows on the host.
  void flush(cudaEvent_t done = nullptr);
  // run_token's parts: the replay (timed at --verbose), then its results' copies to the host
  // slot of its parity and its end (step_done_).
  void launch_step(cudaGraphExec_t exec, int parity);
  void finish_step(int parity, bool pick, bool logits);
  // The draw parameters a top-k graph of this parity reads (draw_host_), written while no
  // step of the parity is in flight.
  void set_draw(int parity, const DeviceDraw& d);
  // The penalties a graph of this parity reads (pick_host_), likewise: r's window, with the
  // step's own token entering it first where `entering` (a step ahead).
  void set_penalties(int parity, const DevicePick& r, bool entering);
  // The token of a whole-vocabulary draw its 256 best left undecided, drawn exactly from the
  // parity's logits (launch_exact_draw) on copy_stream_, beside a step ahead on stream_ (which
  // writes the other half of logits_, and is dropped: it embedded the -1).
  int32_t exact_draw(int parity);
  // The step ahead (run_token): taken over by the call it was enqueued for, dropped by any
  // other (a wait), or enqueued behind the step in flight.
  bool adopt_ahead(int64_t pos0, int32_t token, std::span<KvCache* const> caches, RecurrentState* recurrent,
                   const float* logits, const TokenPick* pick);
  void cancel_ahead();
  // pick: the step in flight's, whose draw parameters (with the next uniform) the step ahead takes.
  bool launch_ahead(int64_t pos1, std::span<KvCache* const> caches, RecurrentState* recurrent, const TokenPick& pick);

  const Model& m_;
  DeviceHooks hooks_;
  DeviceInfo info_;
  std::vector<Refusal> refusal_;  // per layer, then the output head (place_layers)
  DeviceWeights w_;
  // Lent layers: a prompt batch of kLendMinTok tokens or more runs the attention layers placed
  // kMemory here too, each copied into one of two slots (DeviceWeights::fill) on fill_stream_
  // once the layer that used that slot before has run, so one layer's copy overlaps the
  // previous layer's kernels. Measured reason: those layers' prompts otherwise run at the
  // CPU's speed (8B Q4_0 with 16 layers on the host: pp512 55 t/s, H200 host).
  static constexpr int64_t kLendMinTok = 32;
  struct LayerSlot {
    DevBuf buf;
    int64_t layer = -1;  // whose weights it holds
    cudaEvent_t read = nullptr, filled = nullptr;
    bool read_recorded = false;
  };
  LayerSlot slots_[2];
  int next_slot_ = 0;
  size_t slot_bytes_ = 0;      // the largest lent layer's fill (0: not yet known)
  bool lend_batch_ = false;    // this batch lends its kMemory attention layers
  bool lending_off_ = false;   // no layer can be lent, or its slots could not be had
  cudaStream_t fill_stream_ = nullptr;
  // The lent layers' copies pass through pinned chunks: threads copy a piece of the file into
  // one, the device takes it from there at the link's rate. Why: through the driver's own
  // staging of the pageable (mmapped) file they ran at about 7.5 GB/s (8B Q4_0, H200 host), and
  // page-locking the file's spans instead stalled (gpu-notes, forty-first session, call 6).
  static constexpr size_t kStageBytes = size_t{16} << 20;
  static constexpr int kStageChunks = 4;
  struct StageChunk {
    PinnedBuf buf;
    cudaEvent_t done = nullptr;
    bool used = false;
  };
  StageChunk stage_[kStageChunks];
  int next_stage_ = 0;
  // Copies n bytes from the host's src (pageable) to the device's dst through stage_, on
  // fill_stream_, the host's part on append_pool_.
  void stage_copy(void* dst, const void* src, size_t n);
  // An attention layer placed kMemory: what a prompt batch may lend the device.
  bool lendable(int64_t il) const {
    return refusal_[static_cast<size_t>(il)] == Refusal::kMemory &&
           m_.hp.layers[static_cast<size_t>(il)].recurrent == RecurrentKind::kNone;
  }
  bool lends(int64_t il) const { return lend_batch_ && lendable(il); }
  // Whether this batch (begin_batch's) can lend its layers: slots and mirrors fit beside what
  // is resident; allocates the slots the first time.
  bool ready_lending(std::span<KvCache* const> caches);
  // Copies lent layer il into a slot (unless one holds it) and makes stream_ wait for it.
  LayerSlot& lend_layer(int64_t il);
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  // Mirrors by host cache. Nothing tells the device a Session ended, so when a mirror's
  // allocation would not fit in device memory (or in hooks_.mirror_budget_bytes), mirrors
  // of caches the current batch does not use are evicted, least recently used first; a cache
  // that comes back meets a fresh mirror and the staleness rule uploads its history. Memory,
  // not a count, triggers it: a count cap made sequences taking turns evict each other.
  struct MirrorSlot {
    std::unique_ptr<KvMirror> mirror;
    uint64_t last_use = 0;  // batch_tick_ of its last batch
  };
  std::unordered_map<const KvCache*, MirrorSlot> mirrors_;
  uint64_t batch_tick_ = 0;
  // Recurrent state mirrors by host state. Each state is linked to this backend while its
  // mirror exists; it tells us when it goes away (forget), and we detach from every state,
  // pulling what is ahead, before we go away.
  std::unordered_map<RecurrentState*, std::unique_ptr<RecurrentMirror>> rec_mirrors_;
  std::vector<PendingRec> pending_rec_;
  std::vector<PendingSnap> pending_snaps_;
  PinnedBuf snap_staging_;  // snapshot states on their way to the host
  size_t snap_used_ = 0;

  int64_t n_tok_ = 0, pos0_ = 0;
  // fold_ holds the residual stream's NormFold (one at a time: the launch right after its
  // producer reads it, and the next producer runs two launches later); fold_for_layer_: the layer whose attention norm
  // the last down folded there (-1: none), set by enqueue_residual_ffn, taken by enqueue_layer.
  DevBuf fold_;
  int64_t fold_for_layer_ = -1;
  DevBuf act_, x_, h_, q_, k_, v_, qkv_, attn_, o_, f_, gate_, up_, hidden_, partial_, logits_, scratch_;
  DevBuf attn_gate_;  // gated attention (attn_out_gate): the gate half of wq's output
  // Latent attention (enqueue_mla): wq_a's normed output, each head's absorbed query
  // [wk_b q_nope | q_pe] and its weighted sum of the latent rows; the per-head products' slot
  // table (slot t * n_head + h takes head h's matrices) for mla_slots_ slots.
  DevBuf mla_qa_, mla_q_, mla_ctx_, mla_heads_;
  int64_t mla_slots_ = 0;
  // MoE: router logits, routing (expert ids, weights), per-slot gate|up, hidden, outputs, the
  // shared expert's output and gate logit.
  DevBuf moe_logits_, moe_ids_, moe_w_, moe_gu_, moe_hidden_, moe_y_, moe_sh_y_, moe_sh_g_;
  // h as Q8_0 blocks for Q4_0/Q8_0 experts, Q8_K blocks for Q4_K/Q6_K ones, written with the
  // FFN norm (moe_ffn): its own buffer, as the router's product between them prepares h in act_.
  DevBuf moe_h_q8_;
  // Prompt-sized batches' grouped expert products (moe_grouped_experts, moe.cuh SlotSort): the
  // sort ([n_expert] counts, then each slot's row), the grouped calls' pointer arrays, the
  // counts on the host (the calls' shapes); the rows in expert order: x (then the down
  // product's y), gate|up, the GLU, and the products' rounded x and f16 scratch.
  DevBuf moe_sort_, moe_ptrs_;
  std::vector<int32_t> moe_rows_host_;
  DevBuf moe_rx_, moe_rgu_, moe_rh_, moe_ract_, moe_rscratch_;
  size_t moe_rscratch_elems_ = 0;
  // Gated delta net: the q|k|v projection and its conv output, z, the raw beta|alpha, the
  // gates, the delta rule's output.
  DevBuf gdn_qkv_, gdn_conv_, gdn_z_, gdn_ba_, gdn_beta_, gdn_g_, gdn_o_;
  // Mamba-2: ssm_in's z | xBC | dt, the conv's x | B | C, the scan's gated output.
  DevBuf mb_in_, mb_xbc_, mb_y_;
  size_t scratch_elems_ = 0;
  PinnedBuf staging_;  // new K/V rows on their way to the host caches
  DevBuf dstage_;      // the same rows on the device, at the same offsets
  size_t staging_used_ = 0, staging_landed_ = 0;
  size_t stage_half_ = 0;  // floats of one decode step's rows: staging_ holds two, a half a parity
  // A decode step enqueued before the call that wants it (run_token): greedy steps run one
  // ahead, so the device never idles while the host lands a step's rows and the caller takes
  // its token. It has touched no host state; its rows land only when the next run_token adopts
  // it. H200, tg128, one call, two rounds against steps run when asked (and the host's x):
  // 8B Q4_0 527.9 / 525.5 -> 533.0 / 532.7 t/s, qwen3-30b-a3b Q4_0 524.4 / 520.5 -> 529.5 /
  // 530.2; the host's part of a step 0.03-0.04 ms -> 0.01.
  // A hybrid's step ahead reads each recurrent layer's state from the copy the step in flight
  // writes and writes the copy that is current until then (RecurrentMirror), so dropping it
  // leaves the state as it was. qwen3-next-80b-a3b Q4_K_M, 8 layers, tg128 (H200, one call,
  // two rounds): 1848.5 / 1821.4 -> 1886.3 / 1892.4 t/s, host ms a call 0.516 / 0.522 ->
  // 0.502 / 0.502 (graph 0.489-0.492 either way).
  struct AheadStep {
    bool active = false;
    int64_t pos0 = 0;
    int32_t token = -1;  // its input: the pick of the step before it, once that landed
    int pick_k = 0;      // its pick (pick_kind): the argmax, or a draw with `draw`
    DeviceDraw draw;     // u: the uniform it drew with
    DevicePick pen;      // the penalties of the step before it, whose window it took with its token entering
    std::vector<KvCache*> caches;
    std::vector<Pending> pending;
    size_t staging_end = 0;
    RecurrentState* recurrent = nullptr;
    std::vector<std::pair<int64_t, int>> rec_from;  // (recurrent layer, the copy it read)
  };
  AheadStep ahead_;
  int64_t n_ahead_ = 0;
  int copy_groups_ = 0;  // a token graph's copy groups (events copy_groups_ * parity + group)
  PinnedBuf out_host_;  // logits or the residual on their way to the caller's memory
  PinnedBuf in_host_;   // a decode token's x on its way to the device (run_token)
  std::vector<Pending> pending_;
  // Prompt batches copy each layer's new rows back as soon as they are appended, and flush()
  // appends them to the host caches as each copy lands, while the device runs later layers.
  // The copies run on copy_stream_ (after the layer, by `ready`), so they overlap the next
  // layers' kernels too; `landed` marks each one's arrival.
  static constexpr int64_t kEarlyCopyMinTok = 64;
  struct CopyEvents {
    cudaEvent_t ready = nullptr, landed = nullptr;
  };
  std::vector<CopyEvents> copy_events_;
  cudaStream_t copy_stream_ = nullptr;
  void ensure_copy_events(size_t n);  // copy_events_ holds at least n pairs
  void copy_back_early();
  // A token graph's version of copy_back_early, captured after the kernels of the last layer
  // of a group of kGraphCopyLayers attention layers (first .. last: the group's pendings,
  // whose staging is contiguous): their rows copied back on a branch of the graph
  // (copy_stream_), their landing an external event the host waits on
  // (copy_events_[pd.event].landed), so flush() appends each group's rows while the replay runs
  // later layers. A copy a layer, measured (H200, 8B Q4_0 tg128, one call, alternating): host
  // time a step 2.142-2.159 -> 2.112-2.123 ms, 460-463 -> 468-471 t/s; the graph 0.8% slower
  // (2.029 -> 2.045 ms) and its launch 0.006-0.010 -> 0.083-0.090 ms for the 32 copy nodes.
  // A copy a group of 8, the branch rejoining after the pick rather than before the head
  // (where the last copy sat on the head's chain): 8B Q4_0 graph 1.865 / 1.865 -> 1.851 /
  // 1.856 ms, launch 0.064-0.069 -> 0.009-0.018, 518.8 / 518.3 -> 523.7 / 517.5 t/s;
  // qwen3-next Q4_K_M 8 layers graph 0.498 / 0.497 -> 0.483 / 0.484, 1807 / 1812 -> 1887 /
  // 1882 t/s (one call, two rounds; groups of 4 between, all 32 in one group lost 3-5% on the
  // 8B: its host then lands every layer after the replay).
  static constexpr int kGraphCopyLayers = 8;
  void copy_back_in_graph(const Pending& first, const Pending& last);
  cudaEvent_t graph_join_ = nullptr;  // the copies' branch rejoins the graph's stream at its end
  void copy_out(const float* dev, size_t n);  // into out_host_, on the stream
  void copy_out_and_flush(const float* dev, size_t n, float* out);
  // Where a prompt batch's wall time goes on the host (logged by flush at --verbose): enqueue
  // (begin_batch to flush), waiting for the device or a copy, appending rows to the caches.
  // Why: ncu showed an 8B BF16 pp512 batch at 18 ms of kernels in a 46 ms batch.
  std::chrono::steady_clock::time_point batch_begin_{};
  // Appends a prompt batch's layers to their host caches in parallel (flush): a few threads,
  // asleep between batches.
  ThreadPool append_pool_{static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u))};
  int32_t* pos_dev_ = nullptr;   // the batch's pos0, read by RoPE, the K/V append and attention
  // Pinned sources of the copies before a replay: [0] the token of a step run when asked
  // (embeds_tokens), [1] begin_batch's position. A step ahead needs neither (launch_ahead).
  int32_t* pos_host_ = nullptr;
  // run_token's pick: the penalties (device, and the pinned copy sent before a replay), the
  // draw's parameters (pinned, a slot a parity, read by the graph's draw kernel itself), the
  // top k and the chosen id (device; the id's pinned landing place a slot a parity), scratch
  // for the reductions.
  PickDev* pick_host_ = nullptr;      // [2], mapped: a slot a step parity
  DrawDev* draw_host_ = nullptr;     // [2]
  int32_t* pick_ids_dev_ = nullptr;  // [kPickMaxTopK]: the top k; [0] the token after the argmax or draw
  float* pick_vals_dev_ = nullptr;
  int32_t* pick_ids_host_ = nullptr;  // [2]
  DevBuf pick_scratch_;              // the argmax's or top-k's, then a whole-vocabulary draw's chunk sums
  DevBuf exact_scratch_;             // a whole-vocabulary draw's exact form (exact_draw), then its token
  int64_t n_exact_draws_ = 0;
  bool last_draw_exact_ = false;     // the last run_token's pick came to exact_draw
  // Captured token graphs by key, most recent last: a few, so sequences that take turns on
  // one backend (a server's slots) each keep theirs instead of recapturing every step.
  struct TokenGraph {
    std::vector<uintptr_t> key;
    cudaGraphExec_t exec = nullptr;
  };
  static constexpr size_t kMaxTokenGraphs = 8;
  std::vector<TokenGraph> token_graphs_;
  int64_t n_captures_ = 0, n_evictions_ = 0;
  // --verbose: each run_token step's graph time on the device (two timing events around the
  // replay) against the host's: before the replay, the whole call, and between calls (the
  // caller's own work). Why: a token whose device time is well under its period leaves the
  // GPU idle while the host prepares and lands steps, which no kernel change can recover.
  struct StepTimes {
    std::vector<double> graph_ms, prep_ms, launch_ms, wait_ms, land_ms, call_ms, between_ms;
    int64_t n_ahead = 0;
  };
  std::chrono::steady_clock::time_point flush_synced_{};  // when flush's wait for a decode step ended
  StepTimes step_times_;
  cudaEvent_t step_ev_[2][2] = {};  // a pair a parity: the steps in flight are two
  cudaEvent_t step_done_[2] = {};   // a step's end, its results on the host (finish_step)
  std::chrono::steady_clock::time_point last_step_end_{};
};

}  // namespace frink::cuda::detail
