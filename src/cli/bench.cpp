// frink bench -m FILE [-p 512] [-n 128] [-d 0,4096,16384] [-r 5] [-t THREADS]
//             [--device cpu|cuda|auto] [--peak-gbps GB/s] [-o md|json] [-v]: llama-bench's pp/tg
// table (src/engine/bench.h) with effective bandwidth and its fraction of the peak.
// Lists take commas (-p 128,512). --device cuda runs layers on the GPU (refusals per row on
// stderr); auto: CUDA when a GPU is present.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/bench.h"
#include "model/model.h"

namespace frink::cli {

Runner add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure prompt processing and generation speed, like llama-bench");
  struct Options {
    std::string model;
    BenchParams p;
    std::string device = "auto";
    std::string output = "md";
    bool verbose = false;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("-m,--model", opt->model, "model file")->required();
  cmd->add_option("-p,--n-prompt", opt->p.n_prompt, "prompt tokens (comma list)")
      ->delimiter(',')->capture_default_str()->check(at_least(0));
  cmd->add_option("-n,--n-gen", opt->p.n_gen, "generated tokens (comma list)")
      ->delimiter(',')->capture_default_str()->check(at_least(0));
  cmd->add_option("-d,--n-depth", opt->p.depths, "context depths (comma list)")
      ->delimiter(',')->capture_default_str()->check(at_least(0));
  cmd->add_option("-r,--repetitions", opt->p.reps, "timed runs per test")->capture_default_str()->check(at_least(1));
  cmd->add_option("-t,--threads", opt->p.n_threads, "threads (0: one per core)")->check(at_least(0));
  cmd->add_option("-b,--batch-size", opt->p.n_batch, "prompt tokens per layer pass")
      ->capture_default_str()->check(at_least(1));
  add_device_option(*cmd, opt->device, opt->p.n_gpu_layers);
  cmd->add_option("--peak-gbps", opt->p.peak_gbps,
                  "memory bandwidth limit in GB/s for the % peak column (default: the device's theoretical peak)");
  cmd->add_option("-o,--output", opt->output, "md or json")->check(CLI::IsMember({"md", "json"}));
  cmd->add_flag("-v,--verbose", opt->verbose, "log more to stderr (with --device cuda: where each prompt batch's and decode step's time goes)");
  return [opt]() {
    if (opt->verbose) set_log_level(LogLevel::kDebug);
    opt->p.device = device_choice(opt->device);
    const auto model = load_model(opt->model);
    const BenchModelInfo info = bench_model_info(*model, opt->p.n_threads);
    const bool md = opt->output == "md";
    if (md) {
      std::fputs(bench_markdown_header().c_str(), stdout);
      std::fflush(stdout);
    }
    const auto rows = run_bench(*model, opt->p, [&](const BenchRow& r) {
      if (!md) return;
      std::fputs(bench_markdown_row(info, r).c_str(), stdout);
      std::fflush(stdout);
      if (!r.refusals.empty()) std::fprintf(stderr, "%s: device layers %s\n", r.test.c_str(), r.refusals.c_str());
      if (!r.step_times.empty()) std::fprintf(stderr, "%s: %s\n", r.test.c_str(), r.step_times.c_str());
    });
    if (!md) fmt::print("{}\n", bench_json(info, rows).dump(2));
    return 0;
  };
}

}  // namespace frink::cli
