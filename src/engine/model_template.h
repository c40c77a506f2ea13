// A model's own chat template and its BOS/EOS texts: the GGUF's tokenizer.chat_template, or
// for a SafeTensors folder tokenizer_config.json's chat_template (or chat_template.jinja).
// One lookup shared by frink template, frink chat and the server.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "format/model_file.h"

namespace frink {

struct ModelTemplate {
  std::string text;  // empty: the model has none
  std::string bos, eos;
};

ModelTemplate model_template(const ModelFile& mf);

// Renders with the model's template; a model without one, or a template using something
// frink's Jinja engine lacks, gets ChatML and `warning` receives why (never silently).
std::string render_with_fallback(const ModelTemplate& mt, const nlohmann::ordered_json& messages,
                                 const nlohmann::ordered_json& tools, const ChatOptions& opts,
                                 std::string* warning);

}  // namespace frink
