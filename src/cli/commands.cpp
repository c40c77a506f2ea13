#include "cli/commands.h"

namespace frink::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"info", add_info},
      {"tokenize", add_tokenize},
  };
  return kCommands;
}

}  // namespace frink::cli
