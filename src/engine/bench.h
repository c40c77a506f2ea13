// Throughput measurement in llama-bench's spirit: prompt processing (pp: n_prompt tokens in
// batches) and token generation (tg: n_gen tokens one at a time, each the greedy argmax of
// the previous step's logits, back on the host before the next step: Decoder::eval_next,
// which takes the argmax on the device when the whole step runs there), at chosen depths.
//
// Method: per (test, depth), the session is filled with `depth` random tokens (not timed),
// one warm-up run follows, then `reps` timed runs; before each run the session is truncated
// back to `depth` and its last position evaluated again, untimed (so a device mirror's
// re-upload after the truncation is not timed, as llama-bench refills the depth untimed). A rate is tokens / wall seconds
// of the whole run (every eval, sampling included), reported as mean and sample stddev over
// the runs. Weight bytes per token count every tensor a decode step reads (all layer
// weights and the output matrix, one row of token_embd; of a mixture of experts' stacked
// expert tensors only the n_expert_used / n_expert share the chosen experts hold). A tg step
// also reads the K/V rows of every attention layer up to its position (f32, as the caches
// and mirrors hold them): kv_bytes_per_position times the row's mean context. A tg rate times
// both is the effective bandwidth, shown against the device's peak where one is known.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/decoder.h"
#include "model/model.h"

namespace frink {

struct BenchParams {
  std::vector<int64_t> n_prompt = {512};  // 0 entries skip pp
  std::vector<int64_t> n_gen = {128};     // 0 entries skip tg
  std::vector<int64_t> depths = {0};
  int reps = 5;
  int n_threads = 0;                      // 0: one per core
  int64_t n_batch = 512;
  uint64_t seed = 1234;                   // random prompt and depth tokens
  DeviceChoice device = DeviceChoice::kCpu;
  int64_t n_gpu_layers = -1;              // DecoderOptions::n_gpu_layers
  double peak_gbps = 0;                   // > 0: the bandwidth limit rows are shown against
                                          // (0: the device's own theoretical peak, if any)
};

struct BenchRow {
  std::string test;                       // "pp512", "tg128", "pp512 @ d4096"
  int64_t n_prompt = 0, n_gen = 0, depth = 0;
  std::vector<double> samples_s;          // seconds per timed run
  double ts_mean = 0, ts_stddev = 0;      // tokens / second
  std::optional<double> gbps;             // tg only: (weight + K/V bytes) per token * t/s
  double bytes_per_token = 0;             // tg only: weight bytes + the mean K/V bytes read
  double peak_gbps = 0;                   // the limit gbps is measured against (0: unknown)
  // Layer evaluations (and output heads) the device path refused during the row's runs, read
  // from the Decoder's refusal counters; empty on the host path.
  std::optional<int64_t> refused_layers;
  std::string refusals;                   // per reason, "ran 4128, moe 64"
  std::string step_times;                 // where whole-token device steps spent their time (--verbose)
  std::string backend = "CPU";            // where the layers ran: "CPU" or "CUDA"
};

struct BenchModelInfo {
  std::string desc;                       // "llama 1B Q4_0", like llama_model_desc
  uint64_t size_bytes = 0;                // all tensor data
  int64_t n_params = 0;
  uint64_t weight_bytes_per_token = 0;    // what one decode token reads (see the top)
  uint64_t kv_bytes_per_position = 0;     // K + V bytes of one position, all attention layers
  std::string backend = "CPU";
  int n_threads = 0;
};

BenchModelInfo bench_model_info(const Model& m, int n_threads);

// Runs every test; on_row (if set) sees each row as soon as it is measured.
std::vector<BenchRow> run_bench(const Model& m, const BenchParams& p,
                                const std::function<void(const BenchRow&)>& on_row = nullptr);

// llama-bench's markdown table (header, separator, one line per row) plus effective GB/s
// and, where a peak is known, its fraction.
std::string bench_markdown_header();
std::string bench_markdown_row(const BenchModelInfo& info, const BenchRow& r);
nlohmann::ordered_json bench_json(const BenchModelInfo& info, const std::vector<BenchRow>& rows);

}  // namespace frink
