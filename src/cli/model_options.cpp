#include "cli/model_options.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace frink::cli {

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("-m,--model", o.model,
                 "model file (.gguf) or SafeTensors folder (default: $FRINK_MODEL, else the shipped models/frink-demo.gguf)");
  cmd.add_option("-t,--threads", o.threads, "CPU threads (default: all cores)")->check(at_least(0));
  cmd.add_option("-c,--ctx-size", o.ctx, "context size in tokens (default: 4096 or the model's if smaller; 0: the model's)");
  cmd.add_option("-b,--batch-size", o.batch, "prompt tokens per batch")->check(at_least(1));
  add_device_option(cmd, o.device, o.gpu_layers);
  cmd.add_flag("-v,--verbose", o.verbose, "log more to stderr");
}

CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& s) {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return fmt::format("{} is not a whole number", s);
        return v < lo ? fmt::format("must be at least {}, not {}", lo, v) : std::string();
      },
      fmt::format(">={}", lo));
}

void add_device_option(CLI::App& cmd, std::string& name, int64_t& gpu_layers) {
  cmd.add_option("--device", name, "cpu, cuda or auto (auto: CUDA when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd.add_option("--gpu-layers,--n-gpu-layers", gpu_layers,
                 "layers on the GPU (llama.cpp's -ngl works too): the last ones, the output head too past the layer "
                 "count; default -1: as many as its memory holds")
      ->check(at_least(-1));
}

DeviceChoice device_choice(const std::string& name) {
  return name == "cuda" ? DeviceChoice::kCuda : name == "auto" ? DeviceChoice::kAuto : DeviceChoice::kCpu;
}

void add_sampling_options(CLI::App& cmd, SamplerParams& p) {
  cmd.add_option("--temp", p.temp, "temperature; 0 = greedy");
  cmd.add_option("--top-k", p.top_k, "top-k sampling (0 = off)");
  cmd.add_option("--top-p", p.top_p, "top-p sampling (1 = off)");
  cmd.add_option("--min-p", p.min_p, "min-p sampling (0 = off)");
  cmd.add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1 = off)");
  cmd.add_option("--repeat-last-n", p.penalty_last_n, "tokens the penalties look back on");
  cmd.add_option("--presence-penalty", p.presence_penalty, "presence penalty");
  cmd.add_option("--frequency-penalty", p.frequency_penalty, "frequency penalty");
  cmd.add_option("-s,--seed", p.seed, "random seed (-1 = random)");
}

std::unique_ptr<Model> load_model_for(const ModelOptions& o) {
  if (o.verbose) set_log_level(LogLevel::kDebug);
  std::string path = o.model;
  if (path.empty()) {
    // No -m: $FRINK_MODEL, else the demo model shipped in the checkout this binary was built
    // in (<repo>/build/frink -> <repo>/models/frink-demo.gguf), searched up to 3 folders up.
    if (const char* env = std::getenv("FRINK_MODEL"); env && *env) {
      path = env;
    } else {
      std::error_code ec;
      const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
      std::filesystem::path dir = ec ? std::filesystem::path() : exe.parent_path();
      for (int up = 0; up < 3 && !dir.empty() && path.empty(); ++up, dir = dir.parent_path()) {
        const auto candidate = dir / "models" / "frink-demo.gguf";
        if (std::filesystem::is_regular_file(candidate, ec)) path = candidate.string();
        if (dir == dir.root_path()) break;
      }
      if (path.empty())
        fail("no model given and no shipped model (models/frink-demo.gguf) beside {}: pass -m MODEL or set FRINK_MODEL",
             exe.empty() ? std::string("this binary") : exe.string());
    }
    FRINK_LOG_INFO("model: {} (no -m given)", path);
  }
  return load_model(path);
}

DecoderOptions decoder_options(const ModelOptions& o, const Model& m) {
  DecoderOptions d;
  d.n_threads = o.threads;
  d.n_batch = o.batch;
  d.device = device_choice(o.device);
  d.n_gpu_layers = o.gpu_layers;
  d.n_ctx = context_size(o, m);
  return d;
}

// llama.cpp's default of 4096 (capped by the model's own): the KV cache, and on a GPU its
// mirror, are sized for the whole context up front, so a 128k default would reserve tens of
// GB for a short run.
int64_t context_size(const ModelOptions& o, const Model& m) {
  if (o.ctx < -1) fail("-c must not be negative");
  if (o.ctx == -1) return m.hp.n_ctx_train > 0 ? std::min<int64_t>(4096, m.hp.n_ctx_train) : 4096;
  return o.ctx > 0 ? o.ctx : m.hp.n_ctx_train;
}

}  // namespace frink::cli
