// frink perplexity -m FILE -f TEXT [-c 512] [-b BATCH] [-t THREADS] [--chunks N]
//                  [--kl-base FILE] [--kl FILE] [--device cpu|cuda|auto]: llama-perplexity's estimate and output
// (src/engine/perplexity.h): running "[1]12.34,[2]..." per window, then the final line. With
// --kl the tokens come from the base file and -f may be left out.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/read_file.h"
#include "engine/perplexity.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace frink::cli {

namespace {

}  // namespace

Runner add_perplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a text (and KL divergence against a base run)");
  struct Options {
    std::string model, file, device = "auto";
    PerplexityParams p;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("-m,--model", opt->model, "model file")->required();
  cmd->add_option("-f,--file", opt->file, "text file to score");
  cmd->add_option("-c,--ctx-size", opt->p.n_ctx, "window size in tokens")->capture_default_str();
  cmd->add_option("-b,--batch-size", opt->p.n_batch, "tokens per eval")->capture_default_str();
  cmd->add_option("-t,--threads", opt->p.n_threads, "threads (0: one per core)");
  cmd->add_option("--chunks", opt->p.n_chunks, "score at most N windows");
  cmd->add_option("--kl-base,--kl-divergence-base", opt->p.kl_base_out, "save the scored log-probs to FILE");
  cmd->add_option("--kl,--kl-divergence", opt->p.kl_in, "compare against a --kl-base FILE");
  add_device_option(*cmd, opt->device, opt->p.n_gpu_layers);
  return [opt]() {
    opt->p.device = device_choice(opt->device);
    if (opt->file.empty() && opt->p.kl_in.empty()) fail("perplexity needs -f TEXT (or --kl FILE)");
    const auto model = load_model(opt->model);
    const auto tok = Tokenizer::from_gguf(model->file->metadata());
    std::vector<int32_t> tokens;
    if (!opt->file.empty()) tokens = perplexity_tokens(*tok, read_file(opt->file));
    const int32_t bos = tok->add_bos() ? tok->bos() : -1;
    if (opt->p.kl_in.empty())
      std::fprintf(stderr, "perplexity: %zu tokens, windows of %lld, scoring the second half of each\n",
                   tokens.size(), static_cast<long long>(opt->p.n_ctx));
    const PerplexityResult r = run_perplexity(*model, tokens, bos, opt->p, [](int64_t i, double ppl) {
      std::printf("[%lld]%.4f,", static_cast<long long>(i + 1), ppl);
      std::fflush(stdout);
    });
    std::printf("\n%s\n", perplexity_final_line(r).c_str());
    if (r.kl) {
      std::printf("Mean PPL(base)  : %.6f\n", r.kl->ppl_base);
      std::printf("Mean PPL(Q)     : %.6f\n", r.ppl);
      std::printf("Mean KLD        : %.6f +/- %.6f\n", r.kl->kld_mean, r.kl->kld_err);
      std::printf("Same top p      : %.3f +/- %.3f %%\n", 100 * r.kl->same_top, 100 * r.kl->same_top_err);
    }
    if (!opt->p.kl_base_out.empty()) std::fprintf(stderr, "saved scored log-probs to %s\n", opt->p.kl_base_out.c_str());
    return 0;
  };
}

}  // namespace frink::cli
