#include <accelpool/common/log.hpp>
#include <accelpool/common/number_text.hpp>

#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

namespace accelpool::log {

namespace {

std::atomic<Level> g_level{Level::info};
std::atomic<Format> g_format{Format::text};
std::atomic<const std::string*> g_program{nullptr};  // null: "accelpool"

// The program name as a stable pointer: every name configured is kept (a handful per process).
const std::string* interned(std::string_view program) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> names;
  std::lock_guard lock(mu);
  auto it = names.find(program);
  if (it == names.end()) it = names.emplace(program).first;
  return &*it;
}

std::string_view program_name() {
  const std::string* p = g_program.load(std::memory_order_acquire);
  return p ? std::string_view(*p) : std::string_view("accelpool");
}

// The writer gathers lines for up to kBatchDelay (or kWakeBytes of them) before it writes: one wake-up and one
// write per batch, not per line, so logging costs the callers little more than formatting.
constexpr auto kBatchDelay = std::chrono::milliseconds(50);
constexpr std::size_t kWakeBytes = 64u << 10;

// Text values are written bare when they are one plain word, else in double quotes with JSON's escapes.
bool plain_word(std::string_view v) {
  if (v.empty()) return false;
  for (unsigned char c : v) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f) return false;
  }
  return true;
}

void append_quoted(std::string& out, std::string_view v) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (unsigned char c : v) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through as is
        }
    }
  }
  out += '"';
}

std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  // The date and time to the second, formatted once a second per thread: a busy manager logs thousands of lines a
  // second, and gmtime_r with snprintf for each was a few percent of its owner thread.
  thread_local std::time_t cached_secs = -1;
  thread_local char cached[64] = "";
  if (secs != cached_secs) {
    std::tm tm{};
    gmtime_r(&secs, &tm);
    std::snprintf(cached, sizeof cached, "%04d-%02d-%02dT%02d:%02d:%02d.", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec);
    cached_secs = secs;
  }
  std::string out(cached);
  out += static_cast<char>('0' + ms / 100);
  out += static_cast<char>('0' + ms / 10 % 10);
  out += static_cast<char>('0' + ms % 10);
  out += 'Z';
  return out;
}

// Queued lines and the thread that writes them to stderr. Never destroyed: threads may log until the process ends.
class Writer {
 public:
  void push(std::string line) {
    std::unique_lock lock(mu_);
    if (queued_bytes_ + line.size() > kMaxQueuedBytes) {
      ++dropped_;
      return;
    }
    if (!running_) {
      running_ = true;
      std::thread([this] { run(); }).detach();
      std::atexit([] { log::flush(); });
    }
    const bool was_empty = lines_.empty();
    queued_bytes_ += line.size();
    lines_.push_back(std::move(line));
    ++queued_;
    // The writer sleeps until a first line comes, then gathers more for a while: wake it only then, or when
    // enough is gathered.
    if (was_empty || queued_bytes_ >= kWakeBytes) wake_.notify_one();
  }

  void flush() {
    std::unique_lock lock(mu_);
    std::uint64_t target = queued_;
    if (written_ >= target) return;
    ++flushing_;
    wake_.notify_one();
    written_cv_.wait(lock, [&] { return written_ >= target; });
    --flushing_;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (true) {
      wake_.wait(lock, [&] { return !lines_.empty() || dropped_ > reported_dropped_; });
      wake_.wait_for(lock, kBatchDelay, [&] { return flushing_ > 0 || queued_bytes_ >= kWakeBytes; });
      std::deque<std::string> batch;
      batch.swap(lines_);
      std::size_t bytes = queued_bytes_;
      queued_bytes_ = 0;
      std::uint64_t dropped = dropped_ - reported_dropped_;
      reported_dropped_ = dropped_;
      lock.unlock();
      std::string out;
      out.reserve(bytes + 128);
      for (auto& l : batch) out += l;
      if (dropped > 0) {
        out += format_line(g_format.load(), program_name(), Level::warn, "log lines dropped",
                           {{"count", dropped}, {"reason", "stderr did not keep up"}}, timestamp_now());
      }
      write_all(out);
      lock.lock();
      written_ += batch.size();
      written_cv_.notify_all();
    }
  }

  static void write_all(std::string_view s) {
    while (!s.empty()) {
      ssize_t n = ::write(STDERR_FILENO, s.data(), s.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // stderr is gone: nothing else to tell
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, written_cv_;
  std::deque<std::string> lines_;
  std::size_t queued_bytes_ = 0;
  std::uint64_t queued_ = 0, written_ = 0, dropped_ = 0, reported_dropped_ = 0;
  int flushing_ = 0;      // callers of flush() waiting
  bool running_ = false;  // the writer thread starts with the first line
};

Writer& writer() {
  static Writer* w = new Writer;  // never destroyed (see Writer)
  return *w;
}

}  // namespace

std::optional<Level> parse_level(std::string_view text) {
  if (text == "debug") return Level::debug;
  if (text == "info") return Level::info;
  if (text == "warn" || text == "warning") return Level::warn;
  if (text == "error") return Level::error;
  return std::nullopt;
}

std::string_view to_string(Level level) {
  switch (level) {
    case Level::debug:
      return "debug";
    case Level::info:
      return "info";
    case Level::warn:
      return "warn";
    case Level::error:
      return "error";
  }
  return "info";
}

std::optional<Format> parse_format(std::string_view text) {
  if (text == "text") return Format::text;
  if (text == "json") return Format::json;
  return std::nullopt;
}

std::string Field::number(double v) { return std::isfinite(v) ? common::number_text(v) : "null"; }

void configure(std::string_view program, Level level, Format format) {
  g_program.store(interned(program), std::memory_order_release);
  g_level.store(level);
  g_format.store(format);
}

bool enabled(Level level) { return level >= g_level.load(std::memory_order_relaxed); }

std::string format_line(Format format, std::string_view program, Level level, std::string_view event, Fields fields,
                        std::string_view timestamp) {
  std::string out;
  out.reserve(96 + event.size() + 24 * fields.size());
  if (format == Format::json) {
    out += "{\"ts\":";
    append_quoted(out, timestamp);
    out += ",\"level\":";
    append_quoted(out, to_string(level));
    out += ",\"program\":";
    append_quoted(out, program);
    out += ",\"event\":";
    append_quoted(out, event);
    for (const auto& f : fields) {
      out += ',';
      append_quoted(out, f.key());
      out += ':';
      if (f.quoted()) {
        append_quoted(out, f.value());
      } else {
        out += f.value();
      }
    }
    out += "}\n";
    return out;
  }
  out += timestamp;
  out += ' ';
  out += to_string(level);
  out += ' ';
  out += program;
  out += ": ";
  out += event;
  for (const auto& f : fields) {
    out += ' ';
    out += f.key();
    out += '=';
    if (!f.quoted() || plain_word(f.value())) {
      out += f.value();
    } else {
      append_quoted(out, f.value());
    }
  }
  out += '\n';
  return out;
}

void write(Level level, std::string_view event, Fields fields) {
  if (!enabled(level)) return;
  writer().push(
      format_line(g_format.load(std::memory_order_relaxed), program_name(), level, event, fields, timestamp_now()));
}

void flush() { writer().flush(); }

}  // namespace accelpool::log
