#include "cli/commands.h"

namespace frink::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"info", add_info},
  };
  return kCommands;
}

}  // namespace frink::cli
