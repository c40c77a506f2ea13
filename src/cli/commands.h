// The table of subcommands. Each add_* registers its options on a CLI11 subcommand and
// returns the function that runs it after parsing (returning the process exit code).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace frink::cli {

using Runner = std::function<int()>;

struct Command {
  std::string name;
  std::function<Runner(CLI::App&)> add;
};

const std::vector<Command>& commands();

// One per file in src/cli/ (<name>.cpp).
Runner add_info(CLI::App& app);
Runner add_synth(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_perplexity(CLI::App& app);
Runner add_run(CLI::App& app);
Runner add_logits(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_template(CLI::App& app);
Runner add_convert(CLI::App& app);

}  // namespace frink::cli
