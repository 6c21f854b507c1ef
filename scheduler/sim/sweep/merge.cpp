#include "merge.hpp"

#include "runner.hpp"
#include "svg.hpp"

#include <accelpool/sim/report.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

namespace accelpool::sweep {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

double t95(std::size_t df) {
  static constexpr double kTable[] = {12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851,
                                      2.364624252,  2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830,
                                      2.160368656,  2.144786688, 2.131449546, 2.119905299, 2.109815578, 2.100922040,
                                      2.093024054,  2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
                                      2.059538553,  2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456};
  if (df >= 1 && df <= 30) return kTable[df - 1];
  const double z = 1.959963984540054, v = static_cast<double>(df);
  const double z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * v * v * v);
}

MeanCi mean_ci(std::span<const double> values) {
  MeanCi out;
  const auto n = static_cast<double>(values.size());
  for (double v : values) out.mean += v;
  out.mean /= n;
  if (values.size() < 2) return out;
  if (std::all_of(values.begin(), values.end(), [&](double v) { return v == values.front(); })) {
    out.mean = values.front();  // exact: no rounding noise for equal samples
    out.half_width = 0.0;
    return out;
  }
  double ss = 0;
  for (double v : values) ss += (v - out.mean) * (v - out.mean);
  out.half_width = t95(values.size() - 1) * std::sqrt(ss / (n - 1)) / std::sqrt(n);
  return out;
}

namespace {

// Numbers in merged files: 9 significant digits, as accelpool-sim's JSON.
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A CSV field: quoted when it holds a comma or a quote.
std::string csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

struct CellResult {
  const Cell* cell = nullptr;
  std::vector<std::pair<std::string, double>> metrics;  // in the order of accelpool-sim's JSON
  std::vector<double> quantiles;
  double offered_load = 0;
};

// Metrics of a run object: every number except wall_s (host time, not a result of the inputs).
std::vector<std::pair<std::string, double>> metrics_of(const json& run) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [k, v] : run.items()) {
    if (v.is_number() && k != "wall_s") out.emplace_back(k, v.get<double>());
  }
  return out;
}

bool same_names(const std::vector<std::pair<std::string, double>>& a,
                const std::vector<std::pair<std::string, double>>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const auto& x, const auto& y) { return x.first == y.first; });
}

Result<CellResult> read_result(const Layout& layout, const Cell& cell, double* wall_s) {
  const auto path = layout.result(cell.id);
  auto text = read_file(path);
  if (!text) return text.error();
  json doc = json::parse(*text, nullptr, false);
  if (doc.is_discarded() || !doc.contains("result") || !doc["result"].contains("runs") ||
      doc["result"]["runs"].size() != 1 || !doc.contains("jct_quantiles") || doc.value("cell", "") != cell.id) {
    return make_error(Errc::invalid_argument,
                      path.string() + ": not a result of cell " + cell.id + " (delete it and run the cell again)");
  }
  CellResult r;
  r.cell = &cell;
  const json& run = doc["result"]["runs"][0];
  r.metrics = metrics_of(run);
  *wall_s += run.value("wall_s", 0.0);
  r.offered_load = doc["result"]["meta"].value("offered_load", 0.0);
  for (const auto& q : doc["jct_quantiles"]) r.quantiles.push_back(q.get<double>());
  return r;
}

using PanelKey = std::tuple<std::string, std::string, std::string>;  // trace, pool, estimates

struct Group {
  PanelKey panel;
  std::string policy;
  double load = 0;
  std::vector<const CellResult*> cells;
};

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  return out;
}

}  // namespace

Result<MergeSummary> merge(const Study& study, const Layout& layout, bool partial) {
  const Tally t = tally(layout, study.cells);
  const std::size_t missing = t.failed.size() + t.remaining.size();
  if (missing > 0 && !partial) {
    const Cell* first = !t.failed.empty() ? t.failed.front() : t.remaining.front();
    return make_error(Errc::incomplete, std::to_string(missing) + " of " + std::to_string(study.cells.size()) +
                                            " cells are not done (" + std::to_string(t.failed.size()) +
                                            " failed; first: " + first->id + "); run them or merge with --partial");
  }
  if (t.done.empty()) return make_error(Errc::incomplete, "no cell is done yet");

  MergeSummary summary;
  std::vector<CellResult> results;
  for (const auto* c : t.done) {
    auto r = read_result(layout, *c, &summary.run_wall_s);
    if (!r) return r.error();
    if (!results.empty() && !same_names(r->metrics, results.front().metrics)) {
      return make_error(Errc::invalid_argument, layout.result(c->id).string() +
                                                    ": its metrics differ from those of cell " +
                                                    results.front().cell->id +
                                                    " (written by another accelpool-sweep version?); delete it and run "
                                                    "the cell again");
    }
    results.push_back(std::move(*r));
  }
  // Groups in grid order (cells are in grid order and seeds vary fastest).
  std::vector<Group> groups;
  std::map<std::tuple<PanelKey, std::string, double>, std::size_t> group_of;
  for (const auto& r : results) {
    const auto& c = *r.cell;
    const auto key = std::make_tuple(PanelKey{c.trace, c.pool, c.estimates}, c.policy, c.load);
    auto [it, inserted] = group_of.try_emplace(key, groups.size());
    if (inserted) groups.push_back(Group{std::get<0>(key), c.policy, c.load, {}});
    groups[it->second].cells.push_back(&r);
  }

  // study.json and the CSVs.
  json doc;
  doc["study"] = study.name;
  doc["cells"] = json::array();
  std::ostringstream cells_csv, groups_csv;
  const auto& metric_names = results.front().metrics;
  cells_csv << "cell,trace,pool,estimates,policy,load,seed,offered_load";
  groups_csv << "trace,pool,estimates,policy,load,seeds";
  for (const auto& [name, v] : metric_names) {
    cells_csv << ',' << name;
    groups_csv << ',' << name << "_mean," << name << "_ci95";
  }
  cells_csv << '\n';
  groups_csv << '\n';
  for (const auto& r : results) {
    const auto& c = *r.cell;
    json j = {{"cell", c.id},       {"trace", c.trace}, {"pool", c.pool}, {"estimates", c.estimates},
              {"policy", c.policy}, {"load", c.load},   {"seed", c.seed}, {"offered_load", r.offered_load}};
    cells_csv << c.id << ',' << csv(c.trace) << ',' << csv(c.pool) << ',' << csv(c.estimates) << ',' << csv(c.policy)
              << ',' << num(c.load) << ',' << c.seed << ',' << num(r.offered_load);
    for (const auto& [name, v] : r.metrics) {
      j[name] = v;
      cells_csv << ',' << num(v);
    }
    cells_csv << '\n';
    doc["cells"].push_back(std::move(j));
  }
  doc["groups"] = json::array();
  for (const auto& g : groups) {
    json j = {{"trace", std::get<0>(g.panel)},
              {"pool", std::get<1>(g.panel)},
              {"estimates", std::get<2>(g.panel)},
              {"policy", g.policy},
              {"load", g.load},
              {"seeds", g.cells.size()}};
    groups_csv << csv(std::get<0>(g.panel)) << ',' << csv(std::get<1>(g.panel)) << ',' << csv(std::get<2>(g.panel))
               << ',' << csv(g.policy) << ',' << num(g.load) << ',' << g.cells.size();
    json metrics = json::object();
    for (std::size_t m = 0; m < metric_names.size(); ++m) {
      std::vector<double> values;
      for (const auto* r : g.cells) values.push_back(r->metrics.at(m).second);
      const MeanCi ci = mean_ci(values);
      json mj = {{"mean", sim::round_sig(ci.mean)}};
      mj["ci95"] = ci.half_width ? json(sim::round_sig(*ci.half_width)) : json(nullptr);
      metrics[metric_names[m].first] = std::move(mj);
      groups_csv << ',' << num(ci.mean) << ',' << (ci.half_width ? num(*ci.half_width) : "");
    }
    j["metrics"] = std::move(metrics);
    groups_csv << '\n';
    doc["groups"].push_back(std::move(j));
  }

  const fs::path dir = layout.out / "merged";
  std::error_code ec;
  fs::create_directories(dir / "plots", ec);
  if (ec) return make_error(Errc::io_error, "cannot create " + (dir / "plots").string() + ": " + ec.message());
  auto write = [&](const fs::path& path, const std::string& text) -> Status {
    if (auto st = write_atomically(path, text); !st) return st;
    summary.files.push_back(path.string());
    return Status::ok();
  };
  if (auto st = write(dir / "study.json", doc.dump(2) + "\n"); !st) return st.error();
  if (auto st = write(dir / "cells.csv", cells_csv.str()); !st) return st.error();
  if (auto st = write(dir / "groups.csv", groups_csv.str()); !st) return st.error();

  // Plots, one set per (trace, pool, estimates).
  std::vector<PanelKey> panels;
  for (const auto& g : groups) {
    if (std::find(panels.begin(), panels.end(), g.panel) == panels.end()) panels.push_back(g.panel);
  }
  double cdf_load = 0;
  for (const auto& g : groups) cdf_load = std::max(cdf_load, g.load);
  if (study.cdf_load) cdf_load = *study.cdf_load;
  const auto index_of = [&](const std::string& name) {
    for (std::size_t m = 0; m < metric_names.size(); ++m) {
      if (metric_names[m].first == name) return m;
    }
    return metric_names.size();
  };
  for (const auto& panel : panels) {
    const auto& [trace, pool, est] = panel;
    const std::string subtitle = trace + ", " + pool + ", estimates " + est;
    const std::string suffix = panels.size() == 1 ? "" : "-" + slug(trace + "-" + pool + "-" + est);
    for (const auto& [metric, label] : {std::pair<std::string, std::string>{"avg_jct_s", "average JCT (s)"},
                                        std::pair<std::string, std::string>{"p99_jct_s", "p99 JCT (s)"}}) {
      const std::size_t m = index_of(metric);
      if (m == metric_names.size()) continue;
      sim::detail::Chart chart;
      chart.title = label + " vs load, mean and 95% CI over seeds (" + subtitle + ")";
      chart.x_label = "offered load";
      chart.y_label = label;
      std::vector<std::string> policies;
      for (const auto& g : groups) {
        if (g.panel == panel && std::find(policies.begin(), policies.end(), g.policy) == policies.end()) {
          policies.push_back(g.policy);
        }
      }
      for (const auto& policy : policies) {
        sim::detail::Series s{policy, {}, false, {}};
        std::vector<const Group*> by_load;
        for (const auto& g : groups) {
          if (g.panel == panel && g.policy == policy) by_load.push_back(&g);
        }
        std::sort(by_load.begin(), by_load.end(), [](const Group* a, const Group* b) { return a->load < b->load; });
        for (const auto* g : by_load) {
          std::vector<double> values, loads;
          for (const auto* r : g->cells) {
            values.push_back(r->metrics.at(m).second);
            loads.push_back(r->offered_load);
          }
          const MeanCi ci = mean_ci(values);
          const double x = g->load > 0 ? g->load : mean_ci(loads).mean;
          s.points.emplace_back(x, ci.mean);
          const double h = ci.half_width.value_or(0);
          s.band.push_back({x, ci.mean - h, ci.mean + h});
        }
        chart.series.push_back(std::move(s));
      }
      const std::string name = (metric == "avg_jct_s" ? "avg_jct" : "p99_jct") + suffix + ".svg";
      if (auto st = write(dir / "plots" / name, sim::detail::render_svg(chart)); !st) return st.error();
    }
    // The JCT CDF per policy at cdf_load: the quantile functions of the seeds averaged point by point.
    sim::detail::Chart cdf;
    cdf.title = "JCT distribution at load " + num(cdf_load) + ", mean over seeds (" + subtitle + ")";
    cdf.x_label = "job completion time (s, log scale)";
    cdf.y_label = "fraction of jobs";
    cdf.log_x = true;
    cdf.fixed_y = true;
    for (const auto& g : groups) {
      if (g.panel != panel || g.load != cdf_load) continue;
      sim::detail::Series s{g.policy, {}, true, {}};
      for (std::size_t i = 0; i < kJctQuantiles; ++i) {
        double sum = 0;
        std::size_t n = 0;
        for (const auto* r : g.cells) {
          if (i < r->quantiles.size()) sum += r->quantiles[i], ++n;
        }
        if (n > 0 && i > 0)
          s.points.emplace_back(sum / static_cast<double>(n), static_cast<double>(i) / (kJctQuantiles - 1));
      }
      cdf.series.push_back(std::move(s));
    }
    if (auto st = write(dir / "plots" / ("jct_cdf" + suffix + ".svg"), sim::detail::render_svg(cdf)); !st) {
      return st.error();
    }
  }
  summary.cells = results.size();
  summary.groups = groups.size();
  return summary;
}

}  // namespace accelpool::sweep
