#include "core/log.h"

#include <atomic>

namespace frink {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

}  // namespace frink
