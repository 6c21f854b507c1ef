// The one logging facade of the daemons (docs/operations.md "Logs"): an event name, a level and key=value fields,
// written as text for people or as JSON lines for collectors, on stderr (journald keeps it under systemd).
//
// Lines are formatted on the calling thread and written by a writer thread, so a caller (the manager's owner
// thread) never waits on a slow stderr: when more than kMaxQueuedBytes wait to be written, new lines are dropped
// and counted, and the writer says how many were dropped once it catches up. flush() waits until every line
// queued before it is written; the process writes what is queued at a normal exit, and must call flush() before
// _Exit or abort.
//
// Never pass a secret (token, password) as a field or in a message: the facade cannot tell one from other text.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace accelpool::log {

enum class Level : std::uint8_t { debug, info, warn, error };
enum class Format : std::uint8_t { text, json };

// "debug", "info", "warn" (or "warning"), "error"; nullopt for anything else.
std::optional<Level> parse_level(std::string_view text);
std::string_view to_string(Level level);
// "text" or "json"; nullopt for anything else.
std::optional<Format> parse_format(std::string_view text);

// One key=value field. A value is text, or a number or boolean (unquoted in JSON).
class Field {
 public:
  Field(std::string_view key, std::string_view text) : key_(key), value_(text), quoted_(true) {}
  Field(std::string_view key, const std::string& text) : Field(key, std::string_view(text)) {}
  Field(std::string_view key, const char* text) : Field(key, std::string_view(text)) {}
  Field(std::string_view key, bool b) : key_(key), value_(b ? "true" : "false"), quoted_(false) {}
  template <typename N>
  requires(std::is_arithmetic_v<N> && !std::is_same_v<N, bool> && !std::is_same_v<N, char>)
      Field(std::string_view key, N n)
      : key_(key), value_(text_of(n)), quoted_(false) {}

  std::string_view key() const { return key_; }
  const std::string& value() const { return value_; }
  bool quoted() const { return quoted_; }

 private:
  static std::string number(double v);  // shortest text that reads back as v ("0.25", "1e-06"); null if not finite
  template <typename N>
  static std::string text_of(N n) {
    if constexpr (std::is_integral_v<N>) {
      return std::to_string(n);
    } else {
      return number(static_cast<double>(n));
    }
  }
  std::string_view key_;
  std::string value_;
  bool quoted_;
};

using Fields = std::initializer_list<Field>;

// Sets the program name every line carries, the lowest level written and the format. Call once at start, before
// other threads log (later calls are safe but may interleave with lines being written). Default: "accelpool",
// info, text.
void configure(std::string_view program, Level level, Format format);

// Whether a line at `level` would be written (to skip building costly fields).
bool enabled(Level level);

// Queues one line: `event` is a short fixed phrase ("lease granted"), `fields` the facts. Thread-safe.
void write(Level level, std::string_view event, Fields fields = {});
inline void debug(std::string_view event, Fields fields = {}) { write(Level::debug, event, fields); }
inline void info(std::string_view event, Fields fields = {}) { write(Level::info, event, fields); }
inline void warn(std::string_view event, Fields fields = {}) { write(Level::warn, event, fields); }
inline void error(std::string_view event, Fields fields = {}) { write(Level::error, event, fields); }

// Blocks until every line queued before the call is written.
void flush();

// The line `write` would queue now, without its timestamp (tests; docs). Formats only.
std::string format_line(Format format, std::string_view program, Level level, std::string_view event, Fields fields,
                        std::string_view timestamp);

// At most this many bytes wait for the writer; lines beyond it are dropped (and counted).
inline constexpr std::size_t kMaxQueuedBytes = 8u << 20;

}  // namespace accelpool::log
