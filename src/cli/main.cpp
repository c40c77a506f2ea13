// frink: one binary, one subcommand per job, spelled like llama.cpp's tools.
// Each subcommand lives in its own file here and registers through kCommands below.
// Bad input anywhere below surfaces as frink::Error: printed as one line, exit code 1.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"frink: run large language models from GGUF or SafeTensors files"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("frink ") + FRINK_VERSION);
  std::vector<std::function<int()>> runners;
  for (const auto& cmd : frink::cli::commands()) runners.push_back(cmd.add(app));
  // llama.cpp spells a few options with one dash and several letters, which CLI11 reads as
  // bundled short flags; translate those few before parsing.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (auto& arg : args)
    if (arg == "-sys") {
      arg = "--system-prompt";
    } else if (arg == "-ngl") {
      arg = "--gpu-layers";
    }
  std::reverse(args.begin(), args.end());  // CLI11's vector overload takes them last-first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const auto& cmds = frink::cli::commands();
    for (size_t i = 0; i < cmds.size(); ++i)
      if (app.got_subcommand(cmds[i].name)) return runners[i]();
  } catch (const frink::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  }
  return 1;
}
