#include "cell.hpp"

#include <accelpool/sim/report.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace accelpool::sweep {

namespace fs = std::filesystem;

Status Layout::create() const {
  std::error_code ec;
  for (const char* sub : {"cells", "logs", "failed"}) {
    fs::create_directories(out / sub, ec);
    if (ec) return make_error(Errc::io_error, "cannot create " + (out / sub).string() + ": " + ec.message());
  }
  return Status::ok();
}

Result<nlohmann::ordered_json> run_cell(const Cell& cell) {
  auto r = sim::run_experiment(cell.experiment);
  if (!r) return r.error();
  std::ostringstream json;
  sim::write_json(json, r->meta, r->runs, true);

  std::vector<double> jct;
  for (const auto& j : r->runs.front().per_job) jct.push_back(j.jct_s);
  std::sort(jct.begin(), jct.end());
  nlohmann::ordered_json quantiles = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < kJctQuantiles && !jct.empty(); ++i) {
    const double q = static_cast<double>(i) / static_cast<double>(kJctQuantiles - 1);
    const auto rank =
        std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(jct.size()) - 1e-9)));
    quantiles.push_back(sim::round_sig(jct[std::min(rank, jct.size()) - 1]));
  }
  nlohmann::ordered_json doc;
  doc["cell"] = cell.id;
  doc["params"] = cell.params;
  doc["result"] = nlohmann::ordered_json::parse(json.str());
  doc["jct_quantiles"] = std::move(quantiles);
  return doc;
}

Status write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp" + std::to_string(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (out) out << text;
    out.flush();
    if (!out) return make_error(Errc::io_error, "cannot write " + tmp.string() + ": " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return make_error(Errc::io_error, "cannot rename into " + path.string() + ": " + ec.message());
  }
  return Status::ok();
}

Result<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(Errc::not_found, "cannot read " + path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace accelpool::sweep
