#include "engine/model_template.h"

#include <filesystem>

#include "chat/jinja_value.h"
#include "core/error.h"
#include "core/read_file.h"

namespace frink {

namespace {

using ojson = nlohmann::ordered_json;

// tokenizer_config.json spells a special token as "text" or {"content": "text", ...}.
std::string token_text(const ojson& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

ModelTemplate gguf_template(const ModelFile& mf) {
  ModelTemplate t;
  const Metadata& md = mf.metadata();
  t.text = md.try_string("tokenizer.chat_template").value_or("");
  const MetaValue* tokens = md.find("tokenizer.ggml.tokens");
  auto token = [&](const char* key) -> std::string {
    auto id = md.try_int(key);
    if (!tokens || !id || *id < 0 || static_cast<size_t>(*id) >= tokens->size()) return "";
    return tokens->as_array()[static_cast<size_t>(*id)].as_string();
  };
  t.bos = token("tokenizer.ggml.bos_token_id");
  t.eos = token("tokenizer.ggml.eos_token_id");
  return t;
}

ModelTemplate hf_template(const ModelFile& mf) {
  namespace fs = std::filesystem;
  ModelTemplate t;
  fs::path dir = mf.hf_dir();
  fs::path config = dir / "tokenizer_config.json";
  if (fs::exists(config)) {
    ojson c = ojson::parse(read_file(config.string()), nullptr, false);
    if (c.is_discarded()) fail("'{}' is not valid JSON", config.string());
    if (c.contains("bos_token")) t.bos = token_text(c["bos_token"]);
    if (c.contains("eos_token")) t.eos = token_text(c["eos_token"]);
    if (c.contains("chat_template")) {
      const ojson& ct = c["chat_template"];
      if (ct.is_string()) t.text = ct.get<std::string>();
      // A list of named templates: transformers uses the one named "default".
      else if (ct.is_array())
        for (const auto& e : ct)
          if (e.value("name", "") == "default") t.text = e.value("template", "");
    }
  }
  if (t.text.empty() && fs::exists(dir / "chat_template.jinja")) t.text = read_file((dir / "chat_template.jinja").string());
  return t;
}

}  // namespace

ModelTemplate model_template(const ModelFile& mf) {
  return mf.format() == FileFormat::kGguf ? gguf_template(mf) : hf_template(mf);
}

std::string render_with_fallback(const ModelTemplate& mt, const ojson& messages, const ojson& tools,
                                 const ChatOptions& opts, std::string* warning) {
  if (mt.text.empty()) {
    if (warning) *warning = "the model has no chat template; using ChatML";
    return render_chatml(messages, opts.add_generation_prompt);
  }
  try {
    return render_chat(mt.text, messages, tools, opts);
  } catch (const jinja::UnsupportedError& e) {
    if (warning) *warning = std::string("chat template not supported (") + e.what() + "); using ChatML";
    return render_chatml(messages, opts.add_generation_prompt);
  }
}

}  // namespace frink
