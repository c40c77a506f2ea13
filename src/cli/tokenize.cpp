// frink tokenize -m MODEL [-p TEXT | -f FILE] [--ids] [--no-bos] [--no-parse-special]:
// llama-tokenize's output, one "    id -> 'piece'" line per token, or "[id, id, ...]" with
// --ids. A GGUF model's tokenizer comes from its tokenizer.ggml.* keys; a SafeTensors folder's
// from the tokenizer.json beside it.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/read_file.h"
#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

namespace frink::cli {

namespace {

struct TokenizeArgs {
  std::string model, prompt, file;
  bool has_prompt = false, has_file = false;  // -p "" is a valid (empty) text
  bool ids_only = false, no_bos = false, no_parse_special = false;
};

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const auto mf = ModelFile::open(path);
  if (mf->format() == FileFormat::kGguf) return Tokenizer::from_gguf(mf->metadata());
  const auto json_path = std::filesystem::path(mf->hf_dir()) / "tokenizer.json";
  if (!std::filesystem::exists(json_path)) fail("no tokenizer.json beside '{}'", path);
  return Tokenizer::from_hf_json(read_file(json_path.string()));
}

int run_tokenize(const TokenizeArgs& a) {
  if (!a.has_prompt && !a.has_file) fail("tokenize needs -p TEXT or -f FILE");
  const std::string text = a.file.empty() ? a.prompt : read_file(a.file);
  const auto tok = load_tokenizer(a.model);
  const std::vector<int32_t> ids = tok->encode(text, !a.no_bos, !a.no_parse_special);
  if (a.ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? ", " : "", ids[i]);
    std::printf("%s]\n", line.c_str());
    return 0;
  }
  for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, tok->token_to_piece(id).c_str());
  return 0;
}

}  // namespace

Runner add_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "Print the tokens a model's tokenizer makes of a text");
  sub->add_option("-m,--model", args->model, "model file (GGUF) or SafeTensors folder")->required();
  CLI::Option* p = sub->add_option("-p,--prompt", args->prompt, "text to tokenize");
  CLI::Option* f = sub->add_option("-f,--file", args->file, "file whose text to tokenize");
  p->excludes(f);
  sub->add_flag("--ids", args->ids_only, "print only the ids, as [1, 2, 3]");
  sub->add_flag("--no-bos", args->no_bos, "do not add BOS (or EOS) even if the model asks for it");
  sub->add_flag("--no-parse-special", args->no_parse_special,
                "treat control-token text such as <|eot_id|> as plain text");
  return [args, p, f] {
    args->has_prompt = p->count() > 0;
    args->has_file = f->count() > 0;
    return run_tokenize(*args);
  };
}

}  // namespace frink::cli
