#include "engine/bench.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/decoder.h"
#include "engine/sampler.h"
#include "engine/session.h"

namespace frink {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t n_vocab) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// llama_model_ftype_name for the file types llama.cpp writes.
std::string ftype_name(const Model& m) {
  static const std::map<int64_t, const char*> kNames = {
      {0, "all F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"}, {9, "Q5_1"},
      {10, "Q2_K - Medium"}, {11, "Q3_K - Small"}, {12, "Q3_K - Medium"}, {13, "Q3_K - Large"},
      {14, "Q4_K - Small"}, {15, "Q4_K - Medium"}, {16, "Q5_K - Small"}, {17, "Q5_K - Medium"},
      {18, "Q6_K"}, {25, "IQ4_NL - 4.5 bpw"}, {30, "IQ4_XS - 4.25 bpw"}, {32, "BF16"}, {38, "MXFP4 MoE"}};
  if (auto ft = m.file->metadata().try_int("general.file_type"))
    if (auto it = kNames.find(*ft); it != kNames.end()) return it->second;
  std::map<GgmlType, uint64_t> bytes;  // else the type holding the most bytes
  for (const auto& t : m.file->tensors()) bytes[t.type] += t.n_bytes;
  auto best = std::max_element(bytes.begin(), bytes.end(), [](auto& a, auto& b) { return a.second < b.second; });
  return best == bytes.end() ? "?" : std::string(ggml_type_name(best->first));
}

std::string size_label(int64_t n_params) {
  if (n_params >= 1'000'000'000) return fmt::format("{:.0f}B", double(n_params) / 1e9);
  return fmt::format("{:.0f}M", double(n_params) / 1e6);
}

void finish_row(BenchRow& r, int64_t n_tokens, const BenchModelInfo& info, double peak_gbps) {
  std::vector<double> ts;
  for (double s : r.samples_s) ts.push_back(double(n_tokens) / s);
  double mean = 0;
  for (double x : ts) mean += x;
  mean /= double(ts.size());
  double var = 0;
  for (double x : ts) var += (x - mean) * (x - mean);
  r.ts_mean = mean;
  r.ts_stddev = ts.size() > 1 ? std::sqrt(var / double(ts.size() - 1)) : 0.0;
  if (r.n_gen > 0) {
    // Step i (0-based) attends depth + i + 1 positions: on average depth + (n_gen + 1) / 2.
    const double mean_ctx = double(r.depth) + double(r.n_gen + 1) / 2.0;
    r.bytes_per_token = double(info.weight_bytes_per_token) + double(info.kv_bytes_per_position) * mean_ctx;
    r.gbps = r.bytes_per_token * mean / 1e9;
    r.peak_gbps = peak_gbps;
  }
}

// Fills the session with `depth` random tokens (untimed).
void fill_depth(Decoder& dec, Session& s, std::mt19937_64& rng, int64_t depth, int64_t n_batch) {
  std::vector<float> logits;
  for (int64_t done = 0; done < depth;) {
    const int64_t n = std::min(n_batch, depth - done);
    dec.eval(s, random_tokens(rng, n, dec.n_vocab()), false, logits);
    done += n;
  }
}

// Back to `depth` rows before a timed run. A truncation moves the caches back, and a device
// mirror then re-uploads its whole history at its next use (DESIGN.md section 3): llama-bench
// refills the depth untimed before each run, so that upload belongs to the untimed part here
// too. The last depth position is evaluated again (with a fresh random token), untimed.
void rewind_untimed(Decoder& dec, Session& s, int64_t depth, std::mt19937_64& rng) {
  if (depth == 0) {
    s.truncate(0);
    return;
  }
  std::vector<float> logits;
  // A hybrid's recurrent state goes back to its nearest snapshot at or before depth - 1:
  // everything from there to depth is evaluated again.
  const int64_t keep = s.truncate(depth - 1);
  dec.eval(s, random_tokens(rng, depth - keep, dec.n_vocab()), false, logits);
  FRINK_ASSERT(s.n_past() == depth, "bench rewound to {} instead of depth {}", s.n_past(), depth);
}

BenchRow bench_pp(const Model& m, Decoder& dec, const BenchParams& p, int64_t n_prompt, int64_t depth,
                  std::mt19937_64& rng) {
  BenchRow r;
  r.n_prompt = n_prompt;
  r.depth = depth;
  r.test = fmt::format("pp{}", n_prompt) + (depth ? fmt::format(" @ d{}", depth) : "");
  Session s(m, depth + n_prompt);
  fill_depth(dec, s, rng, depth, p.n_batch);
  std::vector<float> logits;
  for (int rep = -1; rep < p.reps; ++rep) {  // rep -1: warm-up
    rewind_untimed(dec, s, depth, rng);
    const auto tokens = random_tokens(rng, n_prompt, dec.n_vocab());
    const auto t0 = Clock::now();
    dec.eval(s, tokens, false, logits);
    if (rep >= 0) r.samples_s.push_back(seconds_since(t0));
  }
  return r;
}

BenchRow bench_tg(const Model& m, Decoder& dec, const BenchParams& p, int64_t n_gen, int64_t depth,
                  std::mt19937_64& rng) {
  BenchRow r;
  r.n_gen = n_gen;
  r.depth = depth;
  r.test = fmt::format("tg{}", n_gen) + (depth ? fmt::format(" @ d{}", depth) : "");
  Session s(m, depth + n_gen);
  fill_depth(dec, s, rng, depth, p.n_batch);
  for (int rep = -1; rep < p.reps; ++rep) {
    rewind_untimed(dec, s, depth, rng);
    const int64_t n = rep < 0 ? 1 : n_gen;  // llama-bench warms tg up with one token
    int32_t tok = random_tokens(rng, 1, dec.n_vocab())[0];
    // Each step ends with the greedy token on the host, as a generating loop needs it (on a
    // device that runs the whole step, the argmax is taken there).
    Sampler greedy(SamplerParams{.temp = 0.0f}, static_cast<int>(dec.n_vocab()));
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) tok = dec.eval_next(s, tok, greedy);
    if (rep >= 0) r.samples_s.push_back(seconds_since(t0));
  }
  return r;
}

int resolve_threads(int n) { return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// The layer of a tensor stacked per expert ("blk.3.ffn_up_exps.weight", and the stack's
// .bias, .scale and any other per-expert companion), or -1 for every other tensor. The
// shared expert (ffn_*_shexp) and the router (ffn_gate_inp) are read whole by every token.
int64_t expert_stack_layer(std::string_view name) {
  static constexpr std::string_view kStacks[] = {"ffn_gate_exps.", "ffn_up_exps.", "ffn_down_exps.",
                                                 "ffn_gate_up_exps."};
  if (!name.starts_with("blk.")) return -1;
  name.remove_prefix(4);
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
  if (ec != std::errc() || end == name.data() + name.size() || *end != '.') return -1;
  name.remove_prefix(static_cast<size_t>(end - name.data()) + 1);
  for (std::string_view s : kStacks)
    if (name.starts_with(s)) return layer;
  return -1;
}

}  // namespace

BenchModelInfo bench_model_info(const Model& m, int n_threads) {
  BenchModelInfo info;
  const TensorView* embd = m.w.tok_embd;
  for (const auto& t : m.file->tensors()) {
    info.size_bytes += t.n_bytes;
    info.n_params += t.n_elements();
    // A decode step reads every tensor once, except token_embd: one row (unless it is also
    // the output matrix, which reads it whole), and a mixture of experts' stacked expert
    // tensors: only the n_expert_used experts the router picks, n_expert_used / n_expert of
    // each stack.
    const int64_t il = expert_stack_layer(t.name);
    const LayerPlan* plan =
        il >= 0 && il < static_cast<int64_t>(m.hp.layers.size()) ? &m.hp.layers[static_cast<size_t>(il)] : nullptr;
    if (&t == embd && m.w.output.w != embd) {
      info.weight_bytes_per_token += t.row_bytes();
    } else if (plan && plan->ffn == FfnKind::kMoe && plan->moe.n_expert > 0) {
      info.weight_bytes_per_token +=
          t.n_bytes * static_cast<uint64_t>(plan->moe.n_expert_used) / static_cast<uint64_t>(plan->moe.n_expert);
    } else {
      info.weight_bytes_per_token += t.n_bytes;
    }
  }
  for (const LayerPlan& p : m.hp.layers)
    if (p.recurrent == RecurrentKind::kNone)  // the layers that keep K/V (Session's rule)
      info.kv_bytes_per_position += static_cast<uint64_t>(p.cache_k_width() + p.cache_v_width()) * sizeof(float);
  info.desc = fmt::format("{} {} {}", m.hp.arch, size_label(info.n_params), ftype_name(m));
  info.n_threads = resolve_threads(n_threads);
  return info;
}

std::vector<BenchRow> run_bench(const Model& m, const BenchParams& p, const std::function<void(const BenchRow&)>& on_row) {
  if (p.reps < 1) fail("-r must be at least 1 (got {})", p.reps);
  BenchModelInfo info = bench_model_info(m, p.n_threads);
  DecoderOptions dopt;
  dopt.n_threads = info.n_threads;
  dopt.n_batch = p.n_batch;
  dopt.device = p.device;
  dopt.n_gpu_layers = p.n_gpu_layers;
  // The longest session a row runs: its depth and its prompt or generated tokens.
  int64_t longest = 0;
  for (const int64_t d : p.depths)
    for (const auto* lens : {&p.n_prompt, &p.n_gen})
      for (const int64_t n : *lens) longest = std::max(longest, d + n);
  dopt.n_ctx = std::max<int64_t>(longest, 1);
  Decoder dec(m, dopt);
  if (dec.on_device()) info.backend = "CUDA";
  std::mt19937_64 rng(p.seed);
  std::vector<BenchRow> rows;
  RefusalCounts before = dec.refusals();
  auto emit = [&](BenchRow r, int64_t n_tokens) {
    finish_row(r, n_tokens, info, p.peak_gbps > 0 ? p.peak_gbps : dec.device_peak_gbps());
    r.backend = info.backend;
    if (dec.on_device()) {  // a host-only run has nothing to refuse; keep its output quiet
      RefusalCounts d = dec.refusals();
      for (size_t i = 0; i < d.n.size(); ++i) d.n[i] -= before.n[i];
      r.refused_layers = static_cast<int64_t>(d.refused());
      r.refusals = d.summary();
      before = dec.refusals();
      r.step_times = dec.take_device_step_times();
    }
    if (on_row) on_row(r);
    rows.push_back(std::move(r));
  };
  for (int64_t depth : p.depths) {
    if (depth < 0) fail("depth {} is negative", depth);
    for (int64_t n : p.n_prompt)
      if (n > 0) emit(bench_pp(m, dec, p, n, depth, rng), n);
    for (int64_t n : p.n_gen)
      if (n > 0) emit(bench_tg(m, dec, p, n, depth, rng), n);
  }
  return rows;
}

std::string bench_markdown_header() {
  return fmt::format("| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} | {:>8} | {:>6} |\n", "model",
                     "size", "params", "backend", "threads", "test", "t/s", "GB/s", "% peak") +
         fmt::format("| {:-<30} | {:->9}: | {:->9}: | {:-<10} | {:->6}: | {:->14}: | {:->19}: | {:->7}: | {:->5}: |\n", "",
                     "", "", "", "", "", "", "", "");
}

std::string bench_markdown_row(const BenchModelInfo& info, const BenchRow& r) {
  const double gib = double(info.size_bytes) / double(1ull << 30);
  const std::string size = gib >= 1.0 ? fmt::format("{:.2f} GiB", gib)
                                      : fmt::format("{:.2f} MiB", double(info.size_bytes) / double(1ull << 20));
  const std::string params = info.n_params >= 1'000'000'000 ? fmt::format("{:.2f} B", double(info.n_params) / 1e9)
                                                            : fmt::format("{:.2f} M", double(info.n_params) / 1e6);
  return fmt::format("| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} | {:>8} | {:>6} |\n", info.desc,
                     size, params, r.backend, info.n_threads, r.test,
                     fmt::format("{:.2f} ± {:.2f}", r.ts_mean, r.ts_stddev),
                     r.gbps ? fmt::format("{:.2f}", *r.gbps) : std::string("-"),
                     r.gbps && r.peak_gbps > 0 ? fmt::format("{:.1f}", 100.0 * *r.gbps / r.peak_gbps) : std::string("-"));
}

nlohmann::ordered_json bench_json(const BenchModelInfo& info, const std::vector<BenchRow>& rows) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    std::vector<double> samples_ns, samples_ts;
    const double n_tokens = double(r.n_prompt + r.n_gen);
    double avg_ns = 0;
    for (double s : r.samples_s) {
      samples_ns.push_back(s * 1e9);
      samples_ts.push_back(n_tokens / s);
      avg_ns += s * 1e9 / double(r.samples_s.size());
    }
    nlohmann::ordered_json j;
    j["model_type"] = info.desc;
    j["model_size"] = info.size_bytes;
    j["model_n_params"] = info.n_params;
    j["backends"] = r.backend;
    j["n_threads"] = info.n_threads;
    j["test"] = r.test;
    j["n_prompt"] = r.n_prompt;
    j["n_gen"] = r.n_gen;
    j["n_depth"] = r.depth;
    j["avg_ns"] = avg_ns;
    j["avg_ts"] = r.ts_mean;
    j["stddev_ts"] = r.ts_stddev;
    j["samples_ns"] = samples_ns;
    j["samples_ts"] = samples_ts;
    j["weight_bytes_per_token"] = info.weight_bytes_per_token;
    j["kv_bytes_per_position"] = info.kv_bytes_per_position;
    j["bytes_per_token"] = r.gbps ? nlohmann::ordered_json(r.bytes_per_token) : nlohmann::ordered_json(nullptr);
    j["gbps"] = r.gbps ? nlohmann::ordered_json(*r.gbps) : nlohmann::ordered_json(nullptr);
    j["peak_gbps"] = r.peak_gbps > 0 ? nlohmann::ordered_json(r.peak_gbps) : nlohmann::ordered_json(nullptr);
    j["refused_layers"] = r.refused_layers ? nlohmann::ordered_json(*r.refused_layers) : nlohmann::ordered_json(nullptr);
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace frink
