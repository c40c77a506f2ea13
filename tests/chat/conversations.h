// The conversations every chat template is rendered with, in the parity test against jinja2
// (chat_template_parity_test.cpp) and the command-line test. Each is one JSON context in the
// form tools/render_chat_template.py reads: messages, tools, add_generation_prompt, extra.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace frink::test {

struct Conversation {
  std::string name;
  nlohmann::ordered_json context;  // {"messages", "tools"?, "add_generation_prompt", "extra"?}
};

inline std::vector<Conversation> chat_conversations() {
  using json = nlohmann::ordered_json;
  json tools = json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Get the current weather in a city",
      "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
      "required": ["location"]}}}])");
  // The id is 9 alphanumerics: Mistral's templates raise on any other form.
  auto call = [](json args) {
    return json::array({{{"id", "call12345"}, {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", args}}}}});
  };
  json args_obj = {{"location", "Paris"}, {"unit", "celsius"}};
  auto tool_turns = [&](json args) {
    return json::array({
        {{"role", "system"}, {"content", "You are a helpful assistant."}},
        {{"role", "user"}, {"content", "What is the weather in Paris?"}},
        {{"role", "assistant"}, {"content", ""}, {"tool_calls", call(args)}},
        {{"role", "tool"}, {"tool_call_id", "call12345"}, {"name", "get_weather"},
         {"content", "{\"temperature\": 18, \"condition\": \"sunny\"}"}},
        {{"role", "assistant"}, {"content", "It is 18 °C and sunny in Paris."}},
    });
  };
  std::vector<Conversation> c;
  c.push_back({"system_user_gen", {{"add_generation_prompt", true}, {"messages", json::array({
      {{"role", "system"}, {"content", "You are a helpful assistant."}},
      {{"role", "user"}, {"content", "Hello! Grüße, 世界."}}})}}});
  c.push_back({"user_only_nogen", {{"add_generation_prompt", false}, {"messages", json::array({
      {{"role", "user"}, {"content", "Write a haiku about the sea."}}})}}});
  c.push_back({"multi_turn_gen", {{"add_generation_prompt", true}, {"messages", json::array({
      {{"role", "system"}, {"content", "Answer briefly."}},
      {{"role", "user"}, {"content", "What is 2+2?"}},
      {{"role", "assistant"}, {"content", "4"}},
      {{"role", "user"}, {"content", "And 3+3?\nExplain in one line."}}})}}});
  c.push_back({"multi_turn_no_system_nogen", {{"add_generation_prompt", false}, {"messages", json::array({
      {{"role", "user"}, {"content", "Hi"}},
      {{"role", "assistant"}, {"content", "Hello! How can I help?"}},
      {{"role", "user"}, {"content", "Tell me a joke."}},
      {{"role", "assistant"}, {"content", "Why did the chicken cross the road?"}}})}}});
  c.push_back({"tools_user_gen", {{"add_generation_prompt", true}, {"tools", tools}, {"messages", json::array({
      {{"role", "user"}, {"content", "What is the weather in Paris?"}}})}}});
  c.push_back({"tool_calls_object_args", {{"add_generation_prompt", false}, {"tools", tools},
                                           {"messages", tool_turns(args_obj)}}});
  c.push_back({"tool_calls_string_args", {{"add_generation_prompt", true}, {"tools", tools},
                                           {"messages", tool_turns(args_obj.dump())}}});
  c.push_back({"thinking_disabled_gen", {{"add_generation_prompt", true},
                                          {"extra", {{"enable_thinking", false}}}, {"messages", json::array({
      {{"role", "user"}, {"content", "Hi there"}}})}}});
  c.push_back({"reasoning_content", {{"add_generation_prompt", false}, {"messages", json::array({
      {{"role", "user"}, {"content", "Is 17 prime?"}},
      {{"role", "assistant"}, {"reasoning_content", "17 has no divisors but 1 and itself."},
       {"content", "Yes, 17 is prime."}}})}}});
  for (auto& conv : c) {
    conv.context["bos_token"] = "<BOS>";
    conv.context["eos_token"] = "<EOS>";
    conv.context["date"] = "2026-01-15";
  }
  return c;
}

}  // namespace frink::test
