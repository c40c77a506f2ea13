#include "engine/decoder.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "cpu/layer_body.h"
#include "cpu/recurrent_layer.h"
#include "engine/sampler.h"
#ifdef FRINK_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/device_probe.h"
#endif

namespace frink {

namespace {

// The backend for the --device choice: null for the host path. kCuda without a GPU (or in a
// build without CUDA) is the user's error; kAuto quietly falls back and counts kNoDevice.
std::unique_ptr<DeviceBackend> make_device(const Model& m, const DecoderOptions& o) {
  if (o.device == DeviceChoice::kCpu) return nullptr;
#ifdef FRINK_HAVE_CUDA
  const cuda::DeviceInfo info = cuda::probe_device();
  if (!info.present) {
    if (o.device == DeviceChoice::kCuda) fail("--device cuda: no usable CUDA device ({})", info.why_absent);
    return nullptr;
  }
  return cuda::make_cuda_backend(m, o.hooks, o.n_gpu_layers, o.n_ctx);
#else
  if (o.device == DeviceChoice::kCuda) fail("--device cuda: this build has no CUDA device path (configure with -DFRINK_CUDA=ON)");
  return nullptr;
#endif
}

}  // namespace

Decoder::Decoder(const Model& m, DecoderOptions opts)
    : m_(m), opts_(opts), pool_(opts.n_threads), device_(make_device(m, opts)) {
  if (device_) FRINK_LOG_INFO("device: {}", device_->describe());
  token_graph_ = whole_token_on_device();
}

// Decode steps may go to run_token when nothing would take the host path: every layer
// (attention or gated delta net) and the head on the device.
bool Decoder::whole_token_on_device() const {
  if (!device_ || opts_.hooks.no_token_graph) return false;
  for (int64_t il = 0; il <= m_.hp.n_layer; ++il)
    if (ask_device(il) != Refusal::kNone) return false;
  return true;
}

Decoder::~Decoder() {
  if (opts_.device != DeviceChoice::kCpu) FRINK_LOG_DEBUG("device layer refusals: {}", refusals_.summary());
}

std::string Decoder::device_description() const { return device_ ? device_->describe() : "cpu"; }

double Decoder::device_peak_gbps() const { return device_ ? device_->peak_gbps() : 0.0; }

void Decoder::check_tokens(const Session& s, const int32_t* tokens, int64_t n) const {
  if (n == 0) fail("nothing to evaluate: the token list is empty");
  if (s.n_ctx() > 0 && s.n_past() + n > s.n_ctx())
    fail("{} tokens do not fit the context: {} already used of {} (raise -c)", n, s.n_past(), s.n_ctx());
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= m_.hp.n_vocab)
      fail("token id {} is outside the vocabulary of {} tokens", tokens[i], m_.hp.n_vocab);
}

int32_t Decoder::eval_next(Session& s, int32_t token, Sampler& sampler) {
  if (token_graph_ && m_.hp.n_vocab <= kMaxPickVocab) {
    std::optional<DevicePick> dp = sampler.device_pick();
    if (dp && dp->top_k <= kMaxPickTopK && static_cast<int64_t>(dp->pen_ids.size()) <= kMaxPickPenalties &&
        (!dp->whole_vocab || m_.hp.n_vocab > kMaxPickTopK)) {
      check_tokens(s, &token, 1);
      TokenPick pick{std::move(*dp)};
      eval_batch(s, &token, 1, nullptr, false, &pick);
      return sampler.take_device_draw(pick.id);
    }
  }
  eval(s, {token}, false, next_logits_);
  return sampler.sample(next_logits_.data());
}

void Decoder::eval(Session& s, const std::vector<int32_t>& tokens, bool all_logits,
                   std::vector<float>& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  check_tokens(s, tokens.data(), n);
  const int64_t V = m_.hp.n_vocab;
  logits.assign(static_cast<size_t>((all_logits ? n : 1) * V), 0.0f);
  for (int64_t b = 0; b < n; b += opts_.n_batch) {
    const int64_t nb = std::min(opts_.n_batch, n - b);
    const bool last = b + nb == n;
    float* out = all_logits ? logits.data() + b * V : (last ? logits.data() : nullptr);
    eval_batch(s, tokens.data() + b, nb, out, all_logits);
  }
}

// The device's answer for layer il (il == n_layer: the output head); pure.
Refusal Decoder::ask_device(int64_t il) const {
  if (!device_) return Refusal::kNoDevice;
  if (il == opts_.hooks.refuse_layer) return Refusal::kForcedByTest;
  return il == m_.hp.n_layer ? device_->check_output() : device_->check_layer(il);
}

void Decoder::eval_batch(Session& s, const int32_t* tokens, int64_t n, float* logits_out, bool all_logits,
                         TokenPick* pick) {
  const Hparams& hp = m_.hp;
  const int64_t pos0 = s.n_past();
  const bool count = opts_.device != DeviceChoice::kCpu;
  // The residual rows in one buffer kept across batches: a fresh 8 MB vector (512 tokens of
  // 4096) takes 2 ms of allocation, zeroing and page faults (dev machine) before the batch
  // reaches the device.
  std::vector<float>& x = x_;
  if (x.size() < static_cast<size_t>(n * hp.n_embd)) x.resize(static_cast<size_t>(n * hp.n_embd));
  const bool whole_token = token_graph_ && n == 1 && (logits_out || pick);
  const bool device_embeds = whole_token && device_->embeds_tokens();
  if (!device_embeds) cpu::embed_tokens(m_, tokens, n, x.data());
  // The sequence's caches, every layer's (a recurrent layer's stays empty), as the device
  // sees them, and its recurrent state (the device keeps its own copy of the layers it runs;
  // a host layer body reading the state pulls that copy first: RecurrentState's rule).
  std::vector<KvCache*> caches;
  if (device_)
    for (int64_t il = 0; il < hp.n_layer; ++il) caches.push_back(&s.cache(il));
  RecurrentState* rec = s.recurrent().empty() ? nullptr : &s.recurrent();
  if (whole_token) {
    for (int64_t il = 0; il <= hp.n_layer; ++il) refusals_.add(Refusal::kNone);
    device_->run_token(pos0, tokens[0], device_embeds ? nullptr : x.data(), caches, rec, logits_out, pick);
    ++whole_token_steps_;
    s.commit(tokens, n);
    return;
  }
  if (device_) device_->begin_batch(n, pos0, caches, rec);
  bool x_on_device = false;  // where the current residual lives
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const bool recurrent = hp.layers[static_cast<size_t>(il)].recurrent != RecurrentKind::kNone;
    const Refusal r = ask_device(il);
    if (count) refusals_.add(r);
    if (r == Refusal::kNone) {
      if (!x_on_device) device_->upload(x.data());
      x_on_device = true;
      if (recurrent)
        device_->run_recurrent_layer(il, s.recurrent());
      else
        device_->run_layer(il, s.cache(il));
    } else {
      if (x_on_device) device_->download(x.data());
      x_on_device = false;
      if (recurrent)
        cpu::recurrent_layer(m_, il, s.recurrent(), x.data(), n, pos0, s.recurrent().delta_chunk(), pool_);
      else
        cpu::attention_layer(m_, il, s.cache(il), x.data(), n, pos0, pool_);
    }
  }
  const int64_t first = all_logits ? 0 : n - 1, n_out = all_logits ? n : 1;
  if (!logits_out) {
    if (x_on_device) device_->download(x.data());  // lands the pending K/V rows on the host
  } else {
    const Refusal r = ask_device(hp.n_layer);
    if (count) refusals_.add(r);
    if (r == Refusal::kNone) {
      if (!x_on_device) device_->upload(x.data());
      device_->output_logits(first, n_out, logits_out);
    } else {
      if (x_on_device) device_->download(x.data());
      cpu::output_logits(m_, x.data() + first * hp.n_embd, n_out, logits_out, pool_);
    }
  }
  s.commit(tokens, n);
}

}  // namespace frink
