// frink chat: an interactive conversation in the terminal with the model's chat template.
// Replies stream as they are produced; the KV cache carries over between turns so only the
// new message is processed. Ctrl-C stops a reply and returns to the prompt; Ctrl-D (end of
// input) exits. Commands: /reset, /save FILE (the transcript as JSON messages), /help.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/chat_session.h"

namespace frink::cli {

namespace {

struct ChatArgs {
  ModelOptions model;
  SamplerParams sampling;
  std::string system;
  int n_predict = -1;
};

// Set by SIGINT, polled between tokens. A lock-free atomic is what a handler may touch.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt leaves the read waiting, not failed
  sigaction(SIGINT, &sa, nullptr);
}

int run(const ChatArgs& a) {
  a.sampling.check();  // before the model loads, not at the first reply
  auto m = load_model_for(a.model);
  auto tok = Tokenizer::from_gguf(m->file->metadata());
  Decoder dec(*m, decoder_options(a.model, *m));
  ChatSession chat(dec, *tok, model_template(*m->file), context_size(a.model, *m), a.system);
  GenerateOptions g;
  g.n_predict = a.n_predict;
  g.sampling = a.sampling;
  install_sigint();
  const bool tty = isatty(fileno(stdin));
  std::fprintf(stderr, "frink chat: /reset, /save FILE, Ctrl-C stops a reply, Ctrl-D exits\n");
  std::string line;
  bool warned = false;
  for (;;) {
    if (tty) std::fputs("> ", stdout);
    std::fflush(stdout);
    g_interrupted.store(false);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/reset") {
      chat.reset();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.rfind("/save", 0) == 0) {
      const std::string path = line.size() > 6 ? line.substr(6) : "";
      if (path.empty()) {
        std::fprintf(stderr, "usage: /save FILE\n");
        continue;
      }
      std::ofstream f(path);
      f << chat.messages().dump(2) << "\n";
      std::fprintf(stderr, f ? "(saved %s)\n" : "error: cannot write %s\n", path.c_str());
      continue;
    }
    if (line == "/help") {
      std::fprintf(stderr, "/reset clears the conversation, /save FILE writes it as JSON, Ctrl-D exits\n");
      continue;
    }
    try {
      auto turn = chat.reply(line, g, [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }, &g_interrupted);
      std::fputc('\n', stdout);
      if (!turn.warning.empty() && !warned) {
        std::fprintf(stderr, "warning: %s\n", turn.warning.c_str());
        warned = true;
      }
      if (turn.stats.stopped) std::fprintf(stderr, "(stopped)\n");
      if (a.model.verbose)
        std::fprintf(stderr, "[%lld prompt tokens reused, %lld new, %lld generated at %.1f tok/s]\n",
                     static_cast<long long>(turn.reused_tokens), static_cast<long long>(turn.stats.n_prompt),
                     static_cast<long long>(turn.stats.n_generated),
                     turn.stats.n_generated / std::max(1e-9, turn.stats.generate_seconds));
    } catch (const Error& e) {
      // A turn that cannot run (context full) is reported; the conversation goes on.
      std::fprintf(stderr, "error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace

Runner add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal");
  add_model_options(*cmd, a->model);
  add_sampling_options(*cmd, a->sampling);
  cmd->add_option("--system-prompt", a->system, "system prompt (llama.cpp's -sys works too)");
  cmd->add_option("-n,--n-predict", a->n_predict, "most tokens per reply (-1 = until end of turn)");
  return [a] { return run(*a); };
}

}  // namespace frink::cli
