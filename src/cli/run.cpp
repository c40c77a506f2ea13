// frink run: complete a prompt, streaming the text to stdout as it is produced. Logs and
// the timing summary go to stderr, so stdout is exactly the generated text.
#include <cstdio>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/read_file.h"
#include "engine/generate.h"

namespace frink::cli {

namespace {

struct RunArgs {
  ModelOptions model;
  SamplerParams sampling;
  std::string prompt;
  std::string prompt_file;
  int n_predict = 128;
  bool no_bos = false;
  bool no_display_prompt = false;
};

int run(const RunArgs& a) {
  a.sampling.check();  // before the model loads and the prompt is echoed
  auto m = load_model_for(a.model);
  auto tok = Tokenizer::from_gguf(m->file->metadata());
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty()) prompt = read_file(a.prompt_file);
  std::vector<int32_t> ids = tok->encode(prompt, !a.no_bos, true);
  if (ids.empty()) fail("the prompt is empty; pass -p TEXT");
  Decoder dec(*m, decoder_options(a.model, *m));
  Session s(*m, context_size(a.model, *m));
  GenerateOptions g;
  g.n_predict = a.n_predict;
  g.sampling = a.sampling;
  if (!a.no_display_prompt) {  // llama.cpp's tools print the prompt first, too
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  GenerateStats st = generate(dec, s, *tok, ids, g, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "\nprompt: %lld tokens in %.2f s (%.2f tok/s)\n", static_cast<long long>(st.n_prompt),
               st.prompt_seconds, st.n_prompt / std::max(1e-9, st.prompt_seconds));
  std::fprintf(stderr, "generation: %lld tokens in %.2f s (%.2f tok/s)%s\n", static_cast<long long>(st.n_generated),
               st.generate_seconds, st.n_generated / std::max(1e-9, st.generate_seconds),
               st.hit_eog ? ", stopped at end of text" : st.hit_context_limit ? ", context full" : "");
  if (a.model.verbose) {
    if (const std::string t = dec.take_device_step_times(); !t.empty()) std::fprintf(stderr, "device: %s\n", t.c_str());
    if (dec.exact_draws() > 0)
      std::fprintf(stderr, "device: %lld draws over the whole vocabulary sorted it (more survivors than its 256 "
                   "best)\n", static_cast<long long>(dec.exact_draws()));
  }
  return 0;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt");
  add_model_options(*cmd, a->model);
  add_sampling_options(*cmd, a->sampling);
  cmd->add_option("-p,--prompt", a->prompt, "prompt text");
  cmd->add_option("-f,--file", a->prompt_file, "read the prompt from a file");
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate (-1 = until end of text)");
  cmd->add_flag("--no-bos", a->no_bos, "do not add the BOS token");
  cmd->add_flag("--no-display-prompt", a->no_display_prompt, "print only the generated text");
  return [a] { return run(*a); };
}

}  // namespace frink::cli
