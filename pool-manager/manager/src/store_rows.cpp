#include "store_rows.hpp"

#include <accelpool/agent/wire.hpp>

#include <boost/json.hpp>

#include <charconv>
#include <cstdlib>
#include <sstream>

namespace accelpool::manager::store_rows {

std::string lease_update_set() {
  std::string out;
  const std::string cols = kLeaseColumns;
  for (std::size_t at = 0; at < cols.size();) {
    std::size_t comma = cols.find(',', at);
    std::string col = cols.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    col.erase(0, col.find_first_not_of(' '));
    at = comma == std::string::npos ? cols.size() : comma + 1;
    if (col == "id") continue;
    out += (out.empty() ? "" : ", ") + col + "=excluded." + col;
  }
  return out;
}

std::string format_numbers(const std::vector<double>& values) {
  std::string out;
  out.reserve(values.size() * 4);
  char buf[32];
  for (double v : values) {
    if (!out.empty()) out += ' ';
    // The shortest text that reads back as exactly `v` (std::to_chars round-trips; strtod parses it), about ten
    // times quicker than printf's "%.17g": a release writes its learned group's row every time.
    const auto written = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, written.ptr);
  }
  return out;
}

std::optional<std::vector<double>> parse_numbers(const std::string& text) {
  std::vector<double> out;
  const char* p = text.c_str();
  while (*p) {
    char* end = nullptr;
    const double v = std::strtod(p, &end);
    if (end == p) return std::nullopt;
    out.push_back(v);
    p = end;
    while (*p == ' ') ++p;
  }
  return out;
}

std::string join_devices(const std::vector<std::string>& devices) {
  std::string out;
  for (const auto& d : devices) {
    if (!out.empty()) out += ',';
    out += d;
  }
  return out;
}

std::vector<std::string> split_devices(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string grants_text(const std::vector<host::PrepareResult>& grants) {
  if (grants.empty()) return "";
  boost::json::array a;
  for (const auto& g : grants) a.emplace_back(agent::prepare_result_json(g));
  return boost::json::serialize(a);
}

Result<std::vector<host::PrepareResult>> grants_from_text(LeaseId id, const std::string& text) {
  std::vector<host::PrepareResult> out;
  if (text.empty()) return out;
  const std::string where = "lease " + std::to_string(id) + " grants";
  boost::system::error_code ec;
  auto parsed = boost::json::parse(text, ec);
  if (ec || !parsed.is_array()) return make_error(Errc::corrupt, where + ": not a JSON array");
  for (const auto& v : parsed.get_array()) {
    auto g = agent::parse_prepare_result(v, where + "[" + std::to_string(out.size()) + "]");
    if (!g) return make_error(Errc::corrupt, g.error().message);
    out.push_back(std::move(*g));
  }
  return out;
}

}  // namespace accelpool::manager::store_rows
