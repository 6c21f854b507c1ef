// CSV trace readers, load rescaling and estimate modes.
#include <accelpool/sim/trace.hpp>

#include "random.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <string_view>

namespace accelpool::sim {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      out.push_back(trim(line.substr(start)));
      return out;
    }
    out.push_back(trim(line.substr(start, comma - start)));
    start = comma + 1;
  }
}

// Reads lines and builds "file:line:column: what" errors.
class LineReader {
 public:
  LineReader(std::istream& in, std::string source) : in_(in), source_(std::move(source)) {}

  // Next line that is neither blank nor a '#' comment; false at the end.
  bool next(std::string& line) {
    while (std::getline(in_, line)) {
      ++line_no_;
      const auto t = trim(line);
      if (t.empty() || t.front() == '#') continue;
      return true;
    }
    return false;
  }
  std::size_t line_no() const { return line_no_; }
  Error error(std::size_t column, const std::string& what) const {
    return make_error(Errc::invalid_argument, source_ + ":" + std::to_string(std::max<std::size_t>(line_no_, 1)) + ":" +
                                                  std::to_string(column) + ": " + what);
  }
  // Calls `row` with the fields of each remaining data row, in order. Stops at the first error: a row without
  // `width` fields, an error `row` returns, or a read error.
  Status each_row(std::size_t width, const std::function<Status(const std::vector<std::string_view>&)>& row) {
    std::string line;
    while (next(line)) {
      const auto fields = split(line);
      if (fields.size() != width) {
        return error(std::min(fields.size(), width) + 1,
                     "expected " + std::to_string(width) + " fields, got " + std::to_string(fields.size()));
      }
      if (auto s = row(fields); !s) return s;
    }
    if (in_.bad()) return make_error(Errc::io_error, source_ + ": read error");
    return Status::ok();
  }

 private:
  std::istream& in_;
  std::string source_;
  std::size_t line_no_ = 0;
};

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 40)) out += (static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  if (s.size() > 40) out += "...";
  return out + "\"";
}

// "NAME: expected WHAT, got "VALUE"" at the column of field `index` (counted from 0) of the current row.
Error field_error(const LineReader& reader, std::size_t index, const std::string& name, const std::string& expected,
                  std::string_view value) {
  return reader.error(index + 1, name + ": expected " + expected + ", got " + quoted(value));
}

// A finite number >= 0.
std::optional<double> parse_seconds(std::string_view s) {
  double v = 0;
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

// An integer >= 1 that fits 32 bits; "4.0" is accepted as 4 (some traces write counts as floats).
std::optional<std::uint32_t> parse_count(std::string_view s) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc() && ptr != s.data() + s.size()) {
    std::string_view rest(ptr, static_cast<std::size_t>(s.data() + s.size() - ptr));
    if (rest.size() >= 2 && rest.front() == '.' && rest.find_first_not_of('0', 1) == std::string_view::npos) {
      ptr = s.data() + s.size();
    }
  }
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v == 0 || v > 0xFFFFFFFFULL) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

// Days since 1970-01-01 of a civil date (proleptic Gregorian).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// "YYYY-MM-DD HH:MM:SS" (UTC) to seconds since the epoch.
std::optional<double> parse_timestamp(std::string_view s) {
  if (s.size() != 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') || s[13] != ':' || s[16] != ':') {
    return std::nullopt;
  }
  auto num = [&](std::size_t pos, std::size_t len) -> std::optional<int> {
    int v = 0;
    auto [ptr, ec] = std::from_chars(s.data() + pos, s.data() + pos + len, v);
    if (ec != std::errc() || ptr != s.data() + pos + len || s[pos] == '-' || s[pos] == '+') return std::nullopt;
    return v;
  };
  auto y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), se = num(17, 2);
  if (!y || !mo || !d || !h || !mi || !se) return std::nullopt;
  static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (*mo < 1 || *mo > 12 || *d < 1 || *d > kDays[*mo - 1] || *h > 23 || *mi > 59 || *se > 60) return std::nullopt;
  const bool leap = (*y % 4 == 0 && *y % 100 != 0) || *y % 400 == 0;
  if (*mo == 2 && *d == 29 && !leap) return std::nullopt;
  const auto days = days_from_civil(*y, static_cast<unsigned>(*mo), static_cast<unsigned>(*d));
  return static_cast<double>(days * 86400 + *h * 3600 + *mi * 60 + *se);
}

// A field's parser and what it accepts, in words for errors.
template <class T>
struct FieldType {
  std::optional<T> (*parse)(std::string_view);
  const char* expected;
};
constexpr FieldType<double> kSeconds{parse_seconds, "a number >= 0"};
constexpr FieldType<std::uint32_t> kCount{parse_count, "an integer >= 1"};
constexpr FieldType<double> kTimestamp{parse_timestamp, "\"YYYY-MM-DD HH:MM:SS\""};
constexpr FieldType<double> kShare{[](std::string_view text) -> std::optional<double> {
                                     auto v = parse_seconds(text);
                                     if (v && *v > 1) return std::nullopt;
                                     return v;
                                   },
                                   "a number from 0 to 1"};

// Parses field `index` of row `f` (column `name`) into `out`; the field_error when it is not of `type`.
template <class T, class Out>
Status parse_field(const LineReader& reader, const std::vector<std::string_view>& f, std::size_t index,
                   const std::string& name, const FieldType<T>& type, Out& out) {
  auto v = type.parse(f[index]);
  if (!v) return field_error(reader, index, name, type.expected, f[index]);
  out = *v;
  return Status::ok();
}

// Maps header names to column positions; rejects unknown and repeated names.
Result<std::map<std::string, std::size_t>> read_header(LineReader& reader, const std::vector<std::string>& known,
                                                       const std::vector<std::string>& required, std::size_t& width) {
  std::string line;
  if (!reader.next(line)) return reader.error(1, "no header line (expected columns " + required.front() + ",...)");
  const auto fields = split(line);
  width = fields.size();
  std::map<std::string, std::size_t> cols;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const std::string name(fields[i]);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return reader.error(i + 1, "unknown column " + quoted(name) + " (known: " + list + ")");
    }
    if (!cols.emplace(name, i).second) return reader.error(i + 1, "column " + quoted(name) + " appears twice");
  }
  for (const auto& r : required) {
    if (!cols.count(r)) return reader.error(1, "the header has no column " + quoted(r));
  }
  return cols;
}

Error no_jobs(const std::string& source) {
  return make_error(Errc::invalid_argument, source + ": the trace has no jobs");
}

}  // namespace

Result<Trace> parse_native_csv(std::istream& in, const std::string& source) {
  LineReader reader(in, source);
  std::size_t width = 0;
  auto header = read_header(
      reader,
      {"arrival_s", "runtime_s", "devices", "bitstream", "tenant", "estimate_s", "kind", "host", "label", "demand"},
      {"arrival_s", "runtime_s"}, width);
  if (!header) return header.error();
  const auto& cols = *header;
  auto col = [&](const char* name) -> std::optional<std::size_t> {
    auto it = cols.find(name);
    return it == cols.end() ? std::nullopt : std::optional<std::size_t>(it->second);
  };
  const auto c_arrival = *col("arrival_s"), c_runtime = *col("runtime_s");
  const auto c_devices = col("devices"), c_bitstream = col("bitstream"), c_tenant = col("tenant"),
             c_estimate = col("estimate_s"), c_kind = col("kind"), c_host = col("host"), c_label = col("label"),
             c_demand = col("demand");

  Trace trace;
  auto rows = reader.each_row(width, [&](const std::vector<std::string_view>& f) -> Status {
    Job job;
    job.id = trace.jobs.size();
    if (auto s = parse_field(reader, f, c_arrival, "arrival_s", kSeconds, job.arrival_s); !s) return s;
    if (auto s = parse_field(reader, f, c_runtime, "runtime_s", kSeconds, job.runtime_s); !s) return s;
    if (c_devices && !f[*c_devices].empty()) {
      if (auto s = parse_field(reader, f, *c_devices, "devices", kCount, job.devices); !s) return s;
    }
    if (c_estimate && !f[*c_estimate].empty()) {
      if (auto s = parse_field(reader, f, *c_estimate, "estimate_s", kSeconds, job.estimate_s); !s) return s;
    }
    if (c_bitstream && !f[*c_bitstream].empty()) job.bitstream = std::string(f[*c_bitstream]);
    if (c_tenant && !f[*c_tenant].empty()) job.tenant = std::string(f[*c_tenant]);
    if (c_kind && !f[*c_kind].empty()) job.kind = std::string(f[*c_kind]);
    if (c_host && !f[*c_host].empty()) job.host = std::string(f[*c_host]);
    if (c_label && !f[*c_label].empty()) job.label = std::string(f[*c_label]);
    if (c_demand && !f[*c_demand].empty()) {
      if (auto s = parse_field(reader, f, *c_demand, "demand", kShare, job.demand); !s) return s;
    }
    trace.jobs.push_back(std::move(job));
    return Status::ok();
  });
  if (!rows) return rows.error();
  if (trace.jobs.empty()) return no_jobs(source);
  return trace;
}

Result<Trace> parse_philly_csv(std::istream& in, const std::string& source) {
  LineReader reader(in, source);
  std::size_t width = 0;
  const std::vector<std::string> names{"timestamp", "duration", "num_gpus", "gpu_time", "cluster"};
  auto header = read_header(reader, names, names, width);
  if (!header) return header.error();
  const auto& cols = *header;
  const auto c_ts = cols.at("timestamp"), c_dur = cols.at("duration"), c_gpus = cols.at("num_gpus"),
             c_gpu_time = cols.at("gpu_time"), c_cluster = cols.at("cluster");

  std::vector<double> stamps;
  Trace trace;
  auto rows = reader.each_row(width, [&](const std::vector<std::string_view>& f) -> Status {
    Job job;
    double stamp = 0, gpu_time = 0;
    if (auto s = parse_field(reader, f, c_ts, "timestamp", kTimestamp, stamp); !s) return s;
    if (auto s = parse_field(reader, f, c_dur, "duration", kSeconds, job.runtime_s); !s) return s;
    if (auto s = parse_field(reader, f, c_gpus, "num_gpus", kCount, job.devices); !s) return s;
    if (auto s = parse_field(reader, f, c_gpu_time, "gpu_time", kSeconds, gpu_time); !s) return s;  // checked only
    if (!f[c_cluster].empty()) job.tenant = std::string(f[c_cluster]);
    stamps.push_back(stamp);
    trace.jobs.push_back(std::move(job));
    return Status::ok();
  });
  if (!rows) return rows.error();
  if (trace.jobs.empty()) return no_jobs(source);
  const double first = *std::min_element(stamps.begin(), stamps.end());
  for (std::size_t i = 0; i < trace.jobs.size(); ++i) trace.jobs[i].arrival_s = stamps[i] - first;
  // Ids follow arrival order (ties by row), so per-job outputs read in time order.
  std::stable_sort(trace.jobs.begin(), trace.jobs.end(),
                   [](const Job& a, const Job& b) { return a.arrival_s < b.arrival_s; });
  for (std::size_t i = 0; i < trace.jobs.size(); ++i) trace.jobs[i].id = i;
  return trace;
}

Result<Trace> load_trace(const std::string& path, TraceFormat format) {
  std::ifstream in(path);
  if (!in) return make_error(Errc::not_found, "cannot open trace file " + path + ": " + std::strerror(errno));
  return format == TraceFormat::philly ? parse_philly_csv(in, path) : parse_native_csv(in, path);
}

double offered_load(const Trace& trace, std::uint64_t pool_devices) {
  if (trace.jobs.empty() || pool_devices == 0) return 0;
  double lo = trace.jobs.front().arrival_s, hi = lo, work = 0;
  for (const Job& j : trace.jobs) {
    lo = std::min(lo, j.arrival_s);
    hi = std::max(hi, j.arrival_s);
    work += static_cast<double>(j.devices) * j.runtime_s;
  }
  const double span = hi - lo;
  return span > 0 ? work / (static_cast<double>(pool_devices) * span) : 0;
}

Status rescale_load(Trace& trace, std::uint64_t pool_devices, double load) {
  if (!(load > 0) || !std::isfinite(load)) return make_error(Errc::invalid_argument, "load must be a number > 0");
  if (pool_devices == 0) return make_error(Errc::invalid_argument, "the pool has no devices");
  const double current = offered_load(trace, pool_devices);
  if (current <= 0) {
    return make_error(Errc::invalid_argument,
                      "cannot rescale the load: the trace needs two distinct arrival times and some work");
  }
  double first = trace.jobs.front().arrival_s;
  for (const Job& j : trace.jobs) first = std::min(first, j.arrival_s);
  const double factor = current / load;  // stretching the span by f divides the load by f
  for (Job& j : trace.jobs) j.arrival_s = first + (j.arrival_s - first) * factor;
  return Status::ok();
}

Result<EstimateSpec> EstimateSpec::parse(const std::string& text) {
  EstimateSpec spec;
  if (text == "trace") {
    spec.mode = Mode::trace;
  } else if (text == "oracle") {
    spec.mode = Mode::oracle;
  } else if (text == "none") {
    spec.mode = Mode::none;
  } else if (text == "learned") {
    // Not a mode: the scheduler learns in every mode. Once an alias of none, refused so that nobody reads
    // it as a different experiment.
    return make_error(Errc::invalid_argument,
                      "estimates: \"learned\" is not a mode (the scheduler learns from finished jobs in every mode); "
                      "use none for requests that carry no estimate");
  } else if (text.rfind("noisy:", 0) == 0) {
    auto sigma = parse_seconds(std::string_view(text).substr(6));
    if (!sigma)
      return make_error(Errc::invalid_argument, "estimates: noisy:SIGMA needs a number >= 0, got \"" + text + "\"");
    spec.mode = Mode::noisy;
    spec.sigma = *sigma;
  } else {
    return make_error(Errc::invalid_argument,
                      "estimates: expected trace, oracle, none or noisy:SIGMA, got \"" + text + "\"");
  }
  return spec;
}

std::string EstimateSpec::to_string() const {
  switch (mode) {
    case Mode::trace:
      return "trace";
    case Mode::oracle:
      return "oracle";
    case Mode::none:
      return "none";
    case Mode::noisy: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "noisy:%g", sigma);
      return buf;
    }
  }
  return "trace";
}

EstimateSpec default_estimates(const Trace& trace) {
  EstimateSpec spec;
  const bool any =
      std::any_of(trace.jobs.begin(), trace.jobs.end(), [](const Job& j) { return j.estimate_s.has_value(); });
  spec.mode = any ? EstimateSpec::Mode::trace : EstimateSpec::Mode::oracle;
  return spec;
}

void apply_estimates(Trace& trace, const EstimateSpec& spec, std::uint64_t seed) {
  // A stream of its own so that changing the estimate mode never changes the generated trace.
  detail::Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  for (Job& j : trace.jobs) {
    switch (spec.mode) {
      case EstimateSpec::Mode::trace:
        break;
      case EstimateSpec::Mode::oracle:
        j.estimate_s = j.runtime_s;
        break;
      case EstimateSpec::Mode::none:
        j.estimate_s.reset();
        break;
      case EstimateSpec::Mode::noisy:
        j.estimate_s = j.runtime_s * rng.lognormal(0, spec.sigma);
        break;
    }
  }
}

}  // namespace accelpool::sim
