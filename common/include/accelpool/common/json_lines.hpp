// The framing every accelpool stream speaks: newline-delimited JSON-RPC 2.0 messages (the guest protocol, the agent
// protocol, the guest daemon's socket; docs/guest-protocol.md, docs/agent-protocol.md). What is independent of the
// JSON library lives here: splitting a byte stream into lines. The JSON-RPC error codes of the error words every
// side uses are in the one table of <accelpool/common/errors.hpp>. Header-only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace accelpool::common {

// Splits a byte stream into lines. A trailing '\r' is dropped; empty lines are skipped. A line longer than
// `max_line` sets overflow(), and next_line() returns nullopt from then on: the stream cannot be resynchronised.
class LineBuffer {
 public:
  explicit LineBuffer(std::size_t max_line) : max_line_(max_line) {}

  void append(std::string_view bytes) { buf_.append(bytes); }

  // The next complete line without its newline, or nullopt when none is complete yet (or after an overflow).
  std::optional<std::string> next_line() {
    while (!overflow_) {
      const auto nl = buf_.find('\n');
      if (nl == std::string::npos) {
        overflow_ = buf_.size() > max_line_;
        return std::nullopt;
      }
      if (nl > max_line_) {
        overflow_ = true;
        return std::nullopt;
      }
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) return line;
    }
    return std::nullopt;
  }

  bool overflow() const { return overflow_; }
  std::size_t max_line() const { return max_line_; }
  // Forgets everything buffered (a new stream starts).
  void reset() {
    buf_.clear();
    overflow_ = false;
  }

 private:
  std::string buf_;
  std::size_t max_line_;
  bool overflow_ = false;
};

}  // namespace accelpool::common
