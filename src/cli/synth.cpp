// frink synth --preset NAME --type T -o FILE [--layers N] [--seed S] [-t THREADS]: writes a
// GGUF with random weights in a real model's exact layout (src/model/synth.h), for benchmarks
// that need no download. --list prints the presets.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "model/synth.h"

namespace frink::cli {

Runner add_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a random-weight GGUF with a real model's tensor layout");
  struct Options {
    SynthOptions synth;
    std::string out;
    bool list = false;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("--preset", opt->synth.preset, "model shape (see --list)");
  cmd->add_option("--type", opt->synth.type, "F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, MXFP4, ...")
      ->capture_default_str();
  cmd->add_option("-o,--output", opt->out, "output .gguf file");
  cmd->add_option("--layers", opt->synth.n_layer, "write only the first N layers (0: all)");
  cmd->add_option("--seed", opt->synth.seed, "random seed")->capture_default_str();
  cmd->add_option("-t,--threads", opt->synth.n_threads, "threads (0: one per core)");
  cmd->add_flag("--list", opt->list, "list the presets and exit");
  return [opt]() {
    if (opt->list) {
      for (const auto& p : synth_presets())
        fmt::print("{:<20} {:<10} {:>3} layers, n_embd {}, vocab {}{}\n", p.name, p.arch, p.n_layer, p.n_embd,
                   p.n_vocab, p.n_expert ? fmt::format(", {} experts ({} used)", p.n_expert, p.n_expert_used) : "");
      return 0;
    }
    if (opt->synth.preset.empty() || opt->out.empty()) fail("synth needs --preset NAME and -o FILE (see --list)");
    const auto t0 = std::chrono::steady_clock::now();
    const SynthPlan plan = plan_synth(opt->synth);
    write_synth(plan, opt->out, opt->synth.n_threads);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("wrote {}: {} {} layers, {} tensors, {:.3f} B parameters, {:.2f} GiB of tensor data in {:.1f} s\n",
               opt->out, plan.preset->name, plan.n_layer, plan.tensors.size(), double(plan.n_params()) / 1e9,
               double(plan.n_bytes()) / double(1ull << 30), s);
    return 0;
  };
}

}  // namespace frink::cli
