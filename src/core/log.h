// Logs go to stderr so stdout carries only the program's product (generated text, JSON).
#pragma once

#include <cstdio>

#include <fmt/format.h>

namespace frink {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Process-wide verbosity, set once by the CLI from --verbose/--quiet before any work starts.
LogLevel log_level();
void set_log_level(LogLevel level);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level > log_level()) return;
  fmt::print(stderr, f, std::forward<Args>(args)...);
  std::fputc('\n', stderr);
}
#define FRINK_LOG_INFO(...) ::frink::log(::frink::LogLevel::kInfo, __VA_ARGS__)
#define FRINK_LOG_WARN(...) ::frink::log(::frink::LogLevel::kWarn, __VA_ARGS__)
#define FRINK_LOG_DEBUG(...) ::frink::log(::frink::LogLevel::kDebug, __VA_ARGS__)

}  // namespace frink
