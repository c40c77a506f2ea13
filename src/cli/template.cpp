// frink template (-m MODEL | --file TEMPLATE.jinja) --messages MESSAGES.json [--tools TOOLS.json]
//   [--add-generation-prompt] [--bos TEXT] [--eos TEXT] [--date YYYY-MM-DD] [--var KEY=JSON]...
// Prints the prompt a chat renders to, as transformers' apply_chat_template(tokenize=False)
// would. The template is the GGUF's tokenizer.chat_template, or for a SafeTensors folder
// chat_template.jinja / tokenizer_config.json's chat_template. With -m, BOS and EOS default to
// the model's own tokens. A template using something frink's Jinja engine lacks gets a
// warning on stderr and ChatML instead; an error the template raises (raise_exception) is an
// error.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/read_file.h"
#include "engine/model_template.h"
#include "format/model_file.h"

namespace frink::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct TemplateArgs {
  std::string model, file, messages, tools, date;
  std::string bos, eos;
  bool has_bos = false, has_eos = false;
  bool add_generation_prompt = false;
  std::vector<std::string> vars;  // KEY=JSON
};

ojson read_json(const std::string& path) {
  ojson j = ojson::parse(read_file(path), nullptr, false);
  if (j.is_discarded()) fail("'{}' is not valid JSON", path);
  return j;
}

int run_template(const TemplateArgs& a) {
  if (a.model.empty() == a.file.empty()) fail("template needs exactly one of -m MODEL or --file TEMPLATE.jinja");
  ModelTemplate mt;
  if (!a.file.empty()) {
    mt.text = read_file(a.file);
  } else {
    mt = model_template(*ModelFile::open(a.model));
  }

  ojson messages = read_json(a.messages);
  ojson tools;
  if (messages.is_object()) {  // {"messages": [...], "tools": [...]} is accepted too
    if (messages.contains("tools")) tools = messages["tools"];
    messages = ojson(messages.value("messages", ojson::array()));
  }
  if (!messages.is_array()) fail("'{}' must hold a JSON array of messages", a.messages);
  if (!a.tools.empty()) tools = read_json(a.tools);

  ChatOptions opts;
  opts.add_generation_prompt = a.add_generation_prompt;
  opts.bos_token = a.has_bos ? a.bos : mt.bos;
  opts.eos_token = a.has_eos ? a.eos : mt.eos;
  opts.date = a.date;
  for (const auto& kv : a.vars) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("--var wants KEY=JSON, got '{}'", kv);
    ojson v = ojson::parse(kv.substr(eq + 1), nullptr, false);
    opts.extra[kv.substr(0, eq)] = v.is_discarded() ? ojson(kv.substr(eq + 1)) : v;  // bare text is a string
  }

  std::string warning;
  const std::string out = render_with_fallback(mt, messages, tools, opts, &warning);
  if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Runner add_template(CLI::App& app) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* sub = app.add_subcommand("template", "Print the prompt a model's chat template makes of a conversation");
  sub->add_option("-m,--model", args->model, "model file (GGUF) or SafeTensors folder");
  sub->add_option("--file", args->file, "a Jinja chat template file instead of a model's");
  sub->add_option("--messages", args->messages, "JSON file: an array of {role, content, ...} messages")->required();
  sub->add_option("--tools", args->tools, "JSON file: an array of tool (function) definitions");
  sub->add_flag("--add-generation-prompt", args->add_generation_prompt, "end with the assistant turn's opening");
  CLI::Option* bos = sub->add_option("--bos", args->bos, "bos_token text (default: the model's)");
  CLI::Option* eos = sub->add_option("--eos", args->eos, "eos_token text (default: the model's)");
  sub->add_option("--date", args->date, "the date strftime_now formats, YYYY-MM-DD (default: today)");
  sub->add_option("--var", args->vars, "an extra template variable KEY=JSON, e.g. enable_thinking=false");
  return [args, bos, eos] {
    args->has_bos = bos->count() > 0;
    args->has_eos = eos->count() > 0;
    return run_template(*args);
  };
}

}  // namespace frink::cli
