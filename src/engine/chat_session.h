// A conversation with one model: the messages so far, rendered with the model's chat
// template at every turn, and ONE Session whose KV cache is reused between turns. Each turn
// re-renders the whole conversation (templates may rewrite earlier turns, e.g. drop past
// reasoning), tokenizes it, keeps the longest prefix the cache already holds and runs only
// the rest, so a normal turn processes just the new message.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/model_template.h"

namespace frink {

class ChatSession {
 public:
  ChatSession(Decoder& dec, const Tokenizer& tok, ModelTemplate tmpl, int64_t n_ctx, std::string system_prompt);

  struct Turn {
    std::string reply;
    GenerateStats stats;
    int64_t reused_tokens = 0;  // prompt tokens the cache already held
    std::string warning;        // e.g. the template fell back to ChatML
  };
  // Adds the user's message and generates the assistant's reply, streaming it to on_text.
  // A reply cut short by `stop` is kept as far as it got. Throws frink::Error (and forgets
  // the message) when the conversation no longer fits the context.
  Turn reply(const std::string& user_text, const GenerateOptions& opts,
             const std::function<void(const std::string&)>& on_text, const std::atomic<bool>* stop);

  // Forgets every message but the system prompt.
  void reset();
  const nlohmann::ordered_json& messages() const { return messages_; }

 private:
  std::vector<int32_t> render_tokens(std::string* warning) const;

  Decoder& dec_;
  const Tokenizer& tok_;
  ModelTemplate tmpl_;
  Session session_;
  std::string system_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
};

}  // namespace frink
