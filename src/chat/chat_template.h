// Chat templates: turning a conversation into the prompt text a model was trained on, by
// rendering the model's own Jinja template (GGUF `tokenizer.chat_template`, or
// `chat_template` in tokenizer_config.json) with frink's Jinja engine (jinja_template.h),
// exactly as Hugging Face transformers' apply_chat_template renders it with jinja2.
//
// The template sees: messages, tools (only when given), add_generation_prompt, bos_token,
// eos_token, every key of ChatOptions::extra (enable_thinking, reasoning_effort, ...), and
// the functions raise_exception(msg) and strftime_now(fmt).
//
// Tool-call arguments reach the template as the caller gave them, a JSON string or an
// object, as transformers passes them. Templates disagree on which they expect (Llama 3.1
// prints `arguments | tojson`, DeepSeek V3.2 parses a string with `from_json`, a filter
// jinja2 lacks), and byte equality with jinja2 is the contract, so frink converts nothing;
// converting (as llama.cpp's server does for OpenAI requests) is the caller's decision.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace frink {

struct ChatOptions {
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  std::string date;  // "YYYY-MM-DD" that strftime_now formats; empty: the current local time
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables (enable_thinking)
};

// One message, as OpenAI's chat API and transformers spell it. to_json() omits empty fields
// except role, and writes content null when absent (an assistant turn with only tool calls).
struct ChatMessage {
  std::string role;
  std::optional<std::string> content;
  nlohmann::ordered_json tool_calls;  // null, or [{"type":"function","function":{"name","arguments"}}]
  std::string tool_call_id;
  std::string name;
  std::string reasoning_content;

  nlohmann::ordered_json to_json() const;
};

// Renders `template_text` for `messages` (a JSON array of message objects) and `tools`
// (a JSON array, or null for none). Throws frink::Error "chat template line N: ..." when the
// template raises or fails, and jinja::UnsupportedError (a frink::Error) when it uses
// something the engine does not implement.
// Take ordered_json where you can: templates print tools and arguments with `tojson`, and
// transformers keeps the caller's key order, while nlohmann::json sorts keys alphabetically.
std::string render_chat(const std::string& template_text, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, const ChatOptions& opts);
std::string render_chat(const std::string& template_text, const nlohmann::json& messages,
                        const nlohmann::json& tools, const ChatOptions& opts);

// ChatML, the fallback for a model without a usable template:
// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n"
// when add_generation_prompt.
std::string render_chatml(const nlohmann::ordered_json& messages, bool add_generation_prompt);

}  // namespace frink
