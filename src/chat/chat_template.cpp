// render_chat: the template variables transformers' apply_chat_template passes, then the
// Jinja engine. See chat_template.h.
#include "chat/chat_template.h"

#include <ctime>

#include "chat/jinja_template.h"
#include "core/error.h"

namespace frink {

nlohmann::ordered_json ChatMessage::to_json() const {
  nlohmann::ordered_json m = {{"role", role}};
  m["content"] = content ? nlohmann::ordered_json(*content) : nlohmann::ordered_json(nullptr);
  if (!tool_calls.is_null()) m["tool_calls"] = tool_calls;
  if (!tool_call_id.empty()) m["tool_call_id"] = tool_call_id;
  if (!name.empty()) m["name"] = name;
  if (!reasoning_content.empty()) m["reasoning_content"] = reasoning_content;
  return m;
}

namespace {

std::tm date_or_now(const std::string& date) {
  std::tm tm{};
  if (date.empty()) {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
    return tm;
  }
  int y = 0, m = 0, d = 0;
  if (std::sscanf(date.c_str(), "%d-%d-%d", &y, &m, &d) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
    fail("chat date '{}' is not YYYY-MM-DD", date);
  tm.tm_year = y - 1900;
  tm.tm_mon = m - 1;
  tm.tm_mday = d;
  tm.tm_hour = 0;
  tm.tm_isdst = -1;
  timegm(&tm);  // fills tm_wday / tm_yday for %A, %j
  return tm;
}

}  // namespace

std::string render_chat(const std::string& template_text, const nlohmann::json& messages,
                        const nlohmann::json& tools, const ChatOptions& opts) {
  return render_chat(template_text, nlohmann::ordered_json::parse(messages.dump()),
                     nlohmann::ordered_json::parse(tools.dump()), opts);
}

std::string render_chat(const std::string& template_text, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, const ChatOptions& opts) {
  using jinja::Value;
  jinja::Template tmpl(template_text);
  Value vars = Value::dict();
  jinja::Dict& d = vars.dict_ref();
  if (opts.extra.is_object())
    for (auto it = opts.extra.begin(); it != opts.extra.end(); ++it)
      d.set(Value(it.key()), Value::from_json(it.value()));
  d.set(Value("messages"), Value::from_json(messages));
  if (!tools.is_null()) d.set(Value("tools"), Value::from_json(tools));
  d.set(Value("add_generation_prompt"), Value(opts.add_generation_prompt));
  d.set(Value("bos_token"), Value(opts.bos_token));
  d.set(Value("eos_token"), Value(opts.eos_token));
  d.set(Value("raise_exception"), Value::callable("raise_exception", [](jinja::CallArgs& a) -> Value {
    fail("template raised: {}", a.pos.empty() ? std::string() : a.pos[0].to_str());
  }));
  std::tm tm = date_or_now(opts.date);
  d.set(Value("strftime_now"), Value::callable("strftime_now", [tm](jinja::CallArgs& a) -> Value {
    std::string f = a.pos.empty() ? "" : a.pos[0].to_str();
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
    return Value(std::string(buf, n));
  }));
  return tmpl.render(vars);
}

std::string render_chatml(const nlohmann::ordered_json& messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages) {
    const auto& c = m.contains("content") ? m["content"] : nlohmann::ordered_json();
    out += "<|im_start|>" + m.value("role", std::string("user")) + "\n" +
           (c.is_string() ? c.get<std::string>() : c.is_null() ? std::string() : c.dump()) + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace frink
