#include "cli/commands.h"

namespace frink::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"info", add_info},
      {"synth", add_synth},
      {"bench", add_bench},
      {"perplexity", add_perplexity},
      {"run", add_run},
      {"logits", add_logits},
      {"chat", add_chat},
      {"tokenize", add_tokenize},
      {"template", add_template},
      {"convert", add_convert},
  };
  return kCommands;
}

}  // namespace frink::cli
