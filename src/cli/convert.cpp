// frink convert SAFETENSORS_DIR -o OUT.gguf [--type F16|Q8_0|BF16|F32] [--name N] [--description D]:
// a Hugging Face folder (config.json, model*.safetensors, tokenizer.json) to one GGUF file in
// llama.cpp's layout, through frink's own SafeTensors reader and GGUF writer
// (src/model/convert.h says what is written and what is refused).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/convert.h"

namespace frink::cli {

Runner add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "convert a SafeTensors folder to GGUF");
  struct Options {
    std::string src, out, type = "F16";
    ConvertOptions c;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("src", opt->src, "SafeTensors folder (config.json, tokenizer.json)")->required();
  cmd->add_option("-o,--outfile", opt->out, "GGUF file to write")->required();
  cmd->add_option("--type,--outtype", opt->type, "matrix type: F16, Q8_0, BF16 or F32 (norms stay F32)")
      ->capture_default_str();
  cmd->add_option("--name", opt->c.name, "general.name (default: the folder's name)");
  cmd->add_option("--description", opt->c.description, "general.description");
  return [opt]() {
    opt->c.type = parse_convert_type(opt->type);
    const ConvertSummary s = convert_to_gguf(opt->src, opt->out, opt->c);
    std::fprintf(stderr, "convert: %lld tensors, %lld parameters, %lld tokens, %s matrices -> %s (%llu bytes)\n",
                 static_cast<long long>(s.n_tensors), static_cast<long long>(s.n_params),
                 static_cast<long long>(s.n_vocab), opt->type.c_str(), opt->out.c_str(),
                 static_cast<unsigned long long>(s.file_bytes));
    return 0;
  };
}

}  // namespace frink::cli
