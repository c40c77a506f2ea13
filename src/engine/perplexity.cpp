#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/decoder.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

namespace frink {

namespace {

constexpr char kMagic[8] = {'F', 'R', 'I', 'N', 'K', 'K', 'L', 'D'};
constexpr uint32_t kVersion = 1;
constexpr double kLpRange = 32.0;  // log-probs below max - 32 clamp (e^-32 ~ 1e-14)

struct KlHeader {
  uint32_t n_ctx = 0, n_vocab = 0, n_chunk = 0, first = 0;
};

// log-softmax of one row, in double (the reference is more exact than what it checks).
void log_softmax(const float* logits, int64_t n, std::vector<double>& lp) {
  lp.resize(size_t(n));
  const double mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) lp[size_t(i)] = double(logits[i]) - lse;
}

class KlWriter {
 public:
  KlWriter(const std::string& path, const KlHeader& h, const std::vector<int32_t>& tokens) : f_(path, std::ios::binary) {
    if (!f_) fail("cannot write KL base file '{}'", path);
    const uint32_t head[6] = {kVersion, h.n_ctx, h.n_vocab, h.n_chunk, h.first, 0};
    f_.write(kMagic, 8);
    f_.write(reinterpret_cast<const char*>(head), sizeof head);
    f_.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(size_t(h.n_chunk) * h.n_ctx * 4));
    path_ = path;
  }
  void row(const std::vector<double>& lp) {
    const double mx = *std::max_element(lp.begin(), lp.end());
    const double mn = std::max(*std::min_element(lp.begin(), lp.end()), mx - kLpRange);
    const float min_lp = float(mn), scale = float(std::max(mx - mn, 1e-30) / 65535.0);
    q_.resize(lp.size());
    for (size_t i = 0; i < lp.size(); ++i)
      q_[i] = uint16_t(std::clamp(std::lround((lp[i] - double(min_lp)) / double(scale)), 0L, 65535L));
    f_.write(reinterpret_cast<const char*>(&min_lp), 4);
    f_.write(reinterpret_cast<const char*>(&scale), 4);
    f_.write(reinterpret_cast<const char*>(q_.data()), std::streamsize(q_.size() * 2));
  }
  void close() {
    f_.close();
    if (!f_) fail("cannot write KL base file '{}'", path_);
  }

 private:
  std::ofstream f_;
  std::string path_;
  std::vector<uint16_t> q_;
};

class KlReader {
 public:
  explicit KlReader(const std::string& path) : f_(path, std::ios::binary), path_(path) {
    if (!f_) fail("cannot open KL base file '{}'", path);
    char magic[8];
    uint32_t head[6];
    f_.read(magic, 8);
    f_.read(reinterpret_cast<char*>(head), sizeof head);
    if (!f_ || std::memcmp(magic, kMagic, 8) != 0) fail("'{}' is not a frink KL base file", path);
    if (head[0] != kVersion) fail("KL base file '{}' has version {}, expected {}", path, head[0], kVersion);
    h_ = {head[1], head[2], head[3], head[4]};
    if (h_.n_ctx < 2 || h_.n_vocab == 0 || h_.n_chunk == 0 || h_.first != h_.n_ctx / 2 || h_.n_ctx > (1u << 24))
      fail("KL base file '{}' has a bad header", path);
    tokens_.resize(size_t(h_.n_chunk) * h_.n_ctx);
    f_.read(reinterpret_cast<char*>(tokens_.data()), std::streamsize(tokens_.size() * 4));
    if (!f_) fail("KL base file '{}' is truncated", path);
  }
  const KlHeader& header() const { return h_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The next row's log-probs, renormalised.
  void row(std::vector<double>& lp) {
    float min_lp = 0, scale = 0;
    f_.read(reinterpret_cast<char*>(&min_lp), 4);
    f_.read(reinterpret_cast<char*>(&scale), 4);
    q_.resize(h_.n_vocab);
    f_.read(reinterpret_cast<char*>(q_.data()), std::streamsize(q_.size() * 2));
    if (!f_) fail("KL base file '{}' is truncated", path_);
    lp.resize(q_.size());
    double mx = -INFINITY;
    for (size_t i = 0; i < q_.size(); ++i) mx = std::max(mx, lp[i] = double(min_lp) + double(scale) * q_[i]);
    double sum = 0;
    for (double v : lp) sum += std::exp(v - mx);
    const double lse = mx + std::log(sum);
    for (double& v : lp) v -= lse;
  }

 private:
  std::ifstream f_;
  std::string path_;
  KlHeader h_;
  std::vector<int32_t> tokens_;
  std::vector<uint16_t> q_;
};

struct KlAccum {
  double sum = 0, sum2 = 0, same = 0, nll_base = 0;
  int64_t n = 0;
  void add(const std::vector<double>& base, const std::vector<double>& cur, int32_t next) {
    double kl = 0;
    for (size_t i = 0; i < base.size(); ++i) kl += std::exp(base[i]) * (base[i] - cur[i]);
    sum += kl;
    sum2 += kl * kl;
    same += (std::max_element(base.begin(), base.end()) == base.begin() + (std::max_element(cur.begin(), cur.end()) - cur.begin()));
    nll_base -= base[size_t(next)];
    ++n;
  }
  KlStats stats() const {
    KlStats s;
    s.n = n;
    const double dn = double(n);
    s.kld_mean = sum / dn;
    s.kld_err = n > 1 ? std::sqrt(std::max(0.0, sum2 / dn - s.kld_mean * s.kld_mean) / (dn - 1)) : 0.0;
    s.same_top = same / dn;
    s.same_top_err = n > 1 ? std::sqrt(s.same_top * (1 - s.same_top) / (dn - 1)) : 0.0;
    s.ppl_base = std::exp(nll_base / dn);
    return s;
  }
};

}  // namespace

std::vector<int32_t> perplexity_tokens(const Tokenizer& tok, const std::string& text) {
  return tok.encode(text, tok.add_bos(), /*parse_special=*/false);
}

PerplexityResult run_perplexity(const Model& m, std::vector<int32_t> tokens, int32_t bos, const PerplexityParams& p,
                                const std::function<void(int64_t, double)>& on_chunk) {
  const int64_t V = m.hp.n_vocab;
  std::unique_ptr<KlReader> kl_in;
  int64_t n_ctx = p.n_ctx;
  if (!p.kl_in.empty()) {
    kl_in = std::make_unique<KlReader>(p.kl_in);
    if (kl_in->header().n_vocab != uint32_t(V))
      fail("KL base file '{}' has {} vocabulary entries, the model {}", p.kl_in, kl_in->header().n_vocab, V);
    tokens = kl_in->tokens();
    n_ctx = kl_in->header().n_ctx;
  }
  if (n_ctx < 4) fail("context size {} is too small for perplexity (-c)", n_ctx);
  if (int64_t(tokens.size()) < 2 * n_ctx)
    fail("you need at least {} tokens to evaluate perplexity with a context of {} (the text has {})", 2 * n_ctx, n_ctx,
         tokens.size());
  int64_t n_chunk = int64_t(tokens.size()) / n_ctx;
  if (p.n_chunks > 0) n_chunk = std::min(n_chunk, p.n_chunks);
  const int64_t first = n_ctx / 2;
  const int64_t n_batch = std::min(std::max<int64_t>(p.n_batch, 1), n_ctx);

  std::unique_ptr<KlWriter> kl_out;
  if (!p.kl_base_out.empty()) {
    tokens.resize(size_t(n_chunk * n_ctx));
    kl_out = std::make_unique<KlWriter>(p.kl_base_out, KlHeader{uint32_t(n_ctx), uint32_t(V), uint32_t(n_chunk), uint32_t(first)}, tokens);
  }

  DecoderOptions dopt;
  dopt.n_threads = p.n_threads;
  dopt.n_batch = n_batch;
  dopt.device = p.device;
  dopt.n_gpu_layers = p.n_gpu_layers;
  dopt.n_ctx = n_ctx;
  Decoder dec(m, dopt);
  PerplexityResult r;
  KlAccum kl;
  double nll = 0, nll2 = 0;
  std::vector<float> logits;
  std::vector<double> lp, lp_base;
  for (int64_t c = 0; c < n_chunk; ++c) {
    const int64_t start = c * n_ctx;
    std::vector<int32_t> window(tokens.begin() + start, tokens.begin() + start + n_ctx);
    if (bos >= 0) window[0] = bos;
    Session s(m, n_ctx);
    for (int64_t b = 0; b < n_ctx; b += n_batch) {
      const int64_t nb = std::min(n_batch, n_ctx - b);
      const std::vector<int32_t> batch(window.begin() + b, window.begin() + b + nb);
      const bool scored = b + nb > first;
      dec.eval(s, batch, scored, logits);
      if (!scored) continue;
      for (int64_t j = std::max(b, first); j < std::min(b + nb, n_ctx - 1); ++j) {
        const int32_t next = tokens[size_t(start + j + 1)];
        log_softmax(logits.data() + (j - b) * V, V, lp);
        const double v = -lp[size_t(next)];
        nll += v;
        nll2 += v * v;
        ++r.n_scored;
        if (kl_out) kl_out->row(lp);
        if (kl_in) {
          kl_in->row(lp_base);
          kl.add(lp_base, lp, next);
        }
      }
    }
    r.chunk_ppl.push_back(std::exp(nll / double(r.n_scored)));
    if (on_chunk) on_chunk(c, r.chunk_ppl.back());
  }
  if (kl_out) kl_out->close();
  const double n = double(r.n_scored);
  r.nll_mean = nll / n;
  r.ppl = std::exp(r.nll_mean);
  const double var = nll2 / n - r.nll_mean * r.nll_mean;
  r.ppl_err = var > 0 && r.n_scored > 1 ? std::sqrt(var / (n - 1)) * r.ppl : 0.0;
  if (kl_in) r.kl = kl.stats();
  return r;
}

std::string perplexity_final_line(const PerplexityResult& r) {
  return fmt::format("Final estimate: PPL = {:.4f} +/- {:.5f}", r.ppl, r.ppl_err);
}

}  // namespace frink
