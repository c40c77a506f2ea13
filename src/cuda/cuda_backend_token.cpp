// CudaBackend's whole token (run_token): the token graphs by key, their capture and replay, and
// the step ahead (cuda_backend.cpp's opening comment says how they work).
#include "cuda/cuda_backend_impl.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_check.h"
#include "cuda/elementwise.cuh"
#include "cuda/embed.cuh"
#include "cuda/kv_mirror.h"
#include "cuda/pick.cuh"

namespace frink::cuda::detail {

// A token graph's pick (graph_key's pick_k): none (the logits out), the argmax, top-k and the
// draw, or the draw over every logit.
static constexpr int kNoPick = -1, kWholePick = kPickMaxTopK + 1;
static int pick_kind(const TokenPick* p) {
  return !p ? kNoPick : p->request.whole_vocab ? kWholePick : p->request.top_k;
}
static int64_t n_pen(const TokenPick* p) { return p ? static_cast<int64_t>(p->request.pen_ids.size()) : 0; }
static bool penalizes(const TokenPick* p) { return p && p->request.penalize; }

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

}  // namespace frink::cuda::detail
