#include "study.hpp"

#include <accelpool/scheduler/scheduler.hpp>

#include <toml++/toml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

namespace accelpool::sweep {

namespace {

namespace fs = std::filesystem;

// Reads typed values out of one TOML table, naming file, line, column and key in errors.
class Reader {
 public:
  Reader(const fs::path& file, const toml::table& table, std::string prefix)
      : file_(file), table_(table), prefix_(std::move(prefix)) {}

  Status known_keys(const std::set<std::string>& known) const {
    for (const auto& [k, v] : table_) {
      if (!known.count(std::string(k.str()))) return error(v, std::string(k.str()), "unknown key");
    }
    return Status::ok();
  }
  const toml::node* get(const char* key) const { return table_.get(key); }

  Error error(const toml::node& n, const std::string& key, const std::string& what) const {
    std::ostringstream o;
    // With no key the error is about the table itself: "traces[1]: ...".
    const std::string name = key.empty() && !prefix_.empty() ? prefix_.substr(0, prefix_.size() - 1) : prefix_ + key;
    o << file_.filename().string() << ':' << n.source().begin.line << ':' << n.source().begin.column << ": " << name
      << ": " << what;
    return make_error(Errc::invalid_argument, o.str());
  }

  Status string(const char* key, std::string& out) const {
    const auto* n = get(key);
    if (!n) return Status::ok();
    if (auto v = n->value<std::string>(); v && n->is_string()) {
      out = *v;
      return Status::ok();
    }
    return error(*n, key, "expected a string");
  }
  Status number(const char* key, double& out, double min, bool min_open = false) const {
    const auto* n = get(key);
    if (!n) return Status::ok();
    if (auto v = number_above(*n, min, min_open)) {
      out = *v;
      return Status::ok();
    }
    return error(*n, key, expected_number_above(min, min_open));
  }
  template <typename T>
  Status integer(const char* key, T& out, std::int64_t min, std::int64_t max) const {
    const auto* n = get(key);
    if (!n) return Status::ok();
    if (n->is_integer()) {
      const auto v = *n->value<std::int64_t>();
      if (v >= min && v <= max) {
        out = static_cast<T>(v);
        return Status::ok();
      }
    }
    return error(*n, key, "expected an integer from " + std::to_string(min) + " to " + std::to_string(max));
  }
  Status boolean(const char* key, bool& out) const {
    const auto* n = get(key);
    if (!n) return Status::ok();
    if (n->is_boolean()) {
      out = *n->value<bool>();
      return Status::ok();
    }
    return error(*n, key, "expected true or false");
  }
  // A list of strings; a missing key leaves `out` as it is, an empty list is an error.
  Status strings(const char* key, std::vector<std::string>& out) const {
    return list(key, out, "strings", "expected a string",
                [](const toml::node& e) { return e.is_string() ? e.value<std::string>() : std::nullopt; });
  }
  // A list of numbers > min (or >= min).
  Status numbers(const char* key, std::vector<double>& out, double min, bool min_open) const {
    return list(key, out, "numbers", expected_number_above(min, min_open),
                [&](const toml::node& e) { return number_above(e, min, min_open); });
  }

  static std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }

 private:
  // A non-empty list at `key`, each element read by `read` (a node to an optional value: none when the element
  // is not one); a missing key leaves `out` as it is. `plural` names the elements, `expected` what one must be.
  template <typename T, typename Read>
  Status list(const char* key, std::vector<T>& out, const char* plural, const std::string& expected, Read read) const {
    const auto* n = get(key);
    if (!n) return Status::ok();
    const auto* arr = n->as_array();
    if (!arr || arr->empty()) return error(*n, key, std::string("expected a non-empty list of ") + plural);
    out.clear();
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const auto& e = *arr->get(i);
      std::optional<T> v = read(e);
      if (!v) return error(e, std::string(key) + "[" + std::to_string(i) + "]", expected);
      out.push_back(std::move(*v));
    }
    return Status::ok();
  }
  // The node's value when it is a number > min (or >= min), else none.
  static std::optional<double> number_above(const toml::node& n, double min, bool min_open) {
    if (!n.is_number()) return std::nullopt;
    const double v = *n.value<double>();
    return (min_open ? v > min : v >= min) ? std::optional<double>(v) : std::nullopt;
  }
  static std::string expected_number_above(double min, bool min_open) {
    return std::string("expected a number ") + (min_open ? "> " : ">= ") + fmt(min);
  }

  const fs::path& file_;
  const toml::table& table_;
  std::string prefix_;
};

#define SWEEP_TRY(expr)                           \
  do {                                            \
    if (auto s_ = (expr); !s_) return s_.error(); \
  } while (0)

struct TraceDef {
  std::string name;
  nlohmann::ordered_json params;  // the whole definition, defaults filled in
  sim::TraceSource source;
};

const char* dist_name(sim::RuntimeDist d) {
  switch (d) {
    case sim::RuntimeDist::lognormal:
      return "lognormal";
    case sim::RuntimeDist::pareto:
      return "pareto";
    case sim::RuntimeDist::exponential:
      break;
  }
  return "exponential";
}

Result<TraceDef> parse_trace(const fs::path& file, const toml::table& t, std::size_t index) {
  const std::string prefix = "traces[" + std::to_string(index) + "].";
  Reader r(file, t, prefix);
  SWEEP_TRY(
      r.known_keys({"name", "file", "format", "window_s", "synthetic", "rate", "runtime_dist", "mean_runtime", "sigma",
                    "pareto_alpha", "pareto_min", "pareto_max", "gangs", "bitstreams", "zipf", "tenants"}));
  TraceDef def;
  std::string path, format = "native";
  SWEEP_TRY(r.string("file", path));
  SWEEP_TRY(r.string("format", format));
  SWEEP_TRY(r.integer("synthetic", def.source.synthetic, 1, 100'000'000));
  SWEEP_TRY(r.string("name", def.name));
  if (path.empty() == (def.source.synthetic == 0)) {
    return r.error(t, "", "give exactly one of file = \"PATH\" or synthetic = JOBS");
  }
  if (format != "native" && format != "philly") {
    return r.error(*t.get("format"), "format", "expected \"native\" or \"philly\", got \"" + format + "\"");
  }
  if (!path.empty()) {
    for (const char* k : {"rate", "runtime_dist", "mean_runtime", "sigma", "pareto_alpha", "pareto_min", "pareto_max",
                          "gangs", "bitstreams", "zipf", "tenants"}) {
      if (t.get(k)) return r.error(*t.get(k), k, "applies only to synthetic traces");
    }
    if (def.name.empty()) def.name = fs::path(path).stem().string();
    def.source.path = fs::path(path).is_absolute() ? path : (file.parent_path() / path).lexically_normal().string();
    def.source.format = format == "philly" ? sim::TraceFormat::philly : sim::TraceFormat::native;
    def.params = {{"name", def.name}, {"file", path}, {"format", format}};
    if (const auto* w = t.get("window_s")) {
      const auto* arr = w->as_array();
      if (!arr || arr->size() != 2 || !arr->get(0)->is_number() || !arr->get(1)->is_number() ||
          !(*arr->get(0)->value<double>() >= 0) || !(*arr->get(1)->value<double>() > *arr->get(0)->value<double>())) {
        return r.error(*w, "window_s", "expected [FROM, TO] seconds with 0 <= FROM < TO");
      }
      def.source.window_from_s = *arr->get(0)->value<double>();
      def.source.window_to_s = *arr->get(1)->value<double>();
      def.params["window_s"] = {*def.source.window_from_s, *def.source.window_to_s};
    }
    return def;
  }
  if (t.get("window_s")) return r.error(*t.get("window_s"), "window_s", "applies only to trace files");
  if (t.get("format")) return r.error(*t.get("format"), "format", "applies only to trace files");
  auto& g = def.source.generator;
  std::string dist = "exponential", gangs;
  SWEEP_TRY(r.number("rate", g.arrival_rate, 0, true));
  SWEEP_TRY(r.string("runtime_dist", dist));
  if (dist == "lognormal") {
    g.runtime = sim::RuntimeDist::lognormal;
  } else if (dist == "pareto") {
    g.runtime = sim::RuntimeDist::pareto;
  } else if (dist != "exponential") {
    return r.error(*t.get("runtime_dist"), "runtime_dist", "expected exponential, lognormal or pareto");
  }
  SWEEP_TRY(r.number("mean_runtime", g.mean_runtime_s, 0, true));
  SWEEP_TRY(r.number("sigma", g.lognormal_sigma, 0));
  SWEEP_TRY(r.number("pareto_alpha", g.pareto_alpha, 0, true));
  SWEEP_TRY(r.number("pareto_min", g.pareto_min_s, 0, true));
  SWEEP_TRY(r.number("pareto_max", g.pareto_max_s, 0, true));
  SWEEP_TRY(r.string("gangs", gangs));
  if (!gangs.empty()) {
    if (auto st = sim::parse_gang_mix(gangs, g); !st) return r.error(*t.get("gangs"), "gangs", st.error().message);
  }
  SWEEP_TRY(r.integer("bitstreams", g.bitstreams, 1, 1'000'000));
  SWEEP_TRY(r.number("zipf", g.zipf_s, 0));
  SWEEP_TRY(r.integer("tenants", g.tenants, 1, 1'000'000));
  if (def.name.empty()) def.name = "synthetic" + std::to_string(index);
  nlohmann::ordered_json mix = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < g.gang_sizes.size(); ++i) mix.push_back({g.gang_sizes[i], g.gang_weights[i]});
  def.params = {{"name", def.name},
                {"synthetic", def.source.synthetic},
                {"rate", g.arrival_rate},
                {"runtime_dist", dist_name(g.runtime)},
                {"mean_runtime", g.mean_runtime_s},
                {"sigma", g.lognormal_sigma},
                {"pareto_alpha", g.pareto_alpha},
                {"pareto_min", g.pareto_min_s},
                {"pareto_max", g.pareto_max_s},
                {"gangs", mix},
                {"bitstreams", g.bitstreams},
                {"zipf", g.zipf_s},
                {"tenants", g.tenants}};
  return def;
}

struct PoolDef {
  std::string label;
  nlohmann::ordered_json params;
  sim::PoolSource source;
};

}  // namespace

std::string cell_id(const nlohmann::ordered_json& params) {
  std::uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : params.dump()) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Result<Study> parse_study(const std::string& toml_text, const fs::path& file) {
  toml::table root;
  try {
    root = toml::parse(toml_text, file.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream o;
    o << file.filename().string() << ':' << e.source().begin.line << ':' << e.source().begin.column << ": "
      << e.description();
    return make_error(Errc::invalid_argument, o.str());
  }
  Reader top(file, root, "");
  SWEEP_TRY(top.known_keys({"name", "traces", "policies", "loads", "devices", "pools", "estimates", "seeds", "cdf_load",
                            "options", "slurm"}));
  Study study;
  study.file = fs::absolute(file);
  study.name = file.stem().string();
  SWEEP_TRY(top.string("name", study.name));

  // Traces.
  std::vector<TraceDef> traces;
  const auto* tn = root.get("traces");
  if (!tn || !tn->is_array_of_tables() || tn->as_array()->empty()) {
    return make_error(Errc::invalid_argument, file.filename().string() + ": give at least one [[traces]] table");
  }
  for (std::size_t i = 0; i < tn->as_array()->size(); ++i) {
    auto def = parse_trace(file, *tn->as_array()->get(i)->as_table(), i);
    if (!def) return def.error();
    for (const auto& other : traces) {
      if (other.name == def->name) {
        return top.error(*tn->as_array()->get(i), "traces[" + std::to_string(i) + "].name",
                         "\"" + def->name + "\" names two traces");
      }
    }
    traces.push_back(std::move(*def));
  }

  // Options shared by every cell.
  double reconfig_s = 0, attach_s = 0;
  sim::SimOptions options;
  options.progress = false;
  options.keep_per_job = true;  // the JCT quantiles of a cell's result
  if (const auto* on = root.get("options")) {
    const auto* ot = on->as_table();
    if (!ot) return top.error(*on, "options", "expected a table");
    Reader r(file, *ot, "options.");
    SWEEP_TRY(
        r.known_keys({"reconfig_s", "attach_s", "restore_s", "batch_completions", "learn_warmup", "learn_half_life"}));
    SWEEP_TRY(r.number("reconfig_s", reconfig_s, 0));
    SWEEP_TRY(r.number("attach_s", attach_s, 0));
    SWEEP_TRY(r.number("restore_s", options.restore_s, 0));
    SWEEP_TRY(r.boolean("batch_completions", options.batch_completions));
    SWEEP_TRY(r.integer("learn_warmup", options.learning.warmup, 1, 1'000'000));
    SWEEP_TRY(r.number("learn_half_life", options.learning.half_life, 0, true));
  }
  const nlohmann::ordered_json options_params = {{"restore_s", options.restore_s},
                                                 {"batch_completions", options.batch_completions},
                                                 {"learn_warmup", options.learning.warmup},
                                                 {"learn_half_life", options.learning.half_life}};

  // Pools: homogeneous device counts and pool files.
  std::vector<PoolDef> pools;
  if (const auto* dn = root.get("devices")) {
    const auto* arr = dn->as_array();
    if (!arr || arr->empty()) return top.error(*dn, "devices", "expected a non-empty list of device counts");
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const auto& e = *arr->get(i);
      const auto v = e.value<std::int64_t>();
      if (!e.is_integer() || *v < 1 || *v > 10'000'000) {
        return top.error(e, "devices[" + std::to_string(i) + "]", "expected an integer from 1 to 10000000");
      }
      PoolDef p;
      p.source = {
          .devices = static_cast<std::uint32_t>(*v), .reconfig_s = reconfig_s, .attach_s = attach_s, .path = ""};
      p.label = "devices=" + std::to_string(*v);
      p.params = {{"devices", *v}, {"reconfig_s", reconfig_s}, {"attach_s", attach_s}};
      pools.push_back(std::move(p));
    }
  }
  std::vector<std::string> pool_files;
  SWEEP_TRY(top.strings("pools", pool_files));
  for (const auto& f : pool_files) {
    PoolDef p;
    p.source.path = fs::path(f).is_absolute() ? f : (file.parent_path() / f).lexically_normal().string();
    p.label = f;
    p.params = {{"file", f}};
    pools.push_back(std::move(p));
  }
  if (pools.empty())
    return make_error(Errc::invalid_argument,
                      file.filename().string() + ": give devices = [N, ...] or pools = [\"pool.json\", ...]");
  if (!pool_files.empty() && (reconfig_s > 0 || attach_s > 0)) {
    return make_error(Errc::invalid_argument, file.filename().string() +
                                                  ": options.reconfig_s and options.attach_s apply to devices; put the "
                                                  "costs of pools in their files");
  }

  // Policies, loads, estimates, seeds.
  std::vector<std::string> policy_names{"fifo"};
  SWEEP_TRY(top.strings("policies", policy_names));
  std::vector<scheduler::PolicySpec> policies;
  for (std::size_t i = 0; i < policy_names.size(); ++i) {
    std::string error;
    auto spec = scheduler::PolicySpec::parse(policy_names[i], &error);
    if (spec && !scheduler::Scheduler::create(*spec, &error)) spec.reset();
    if (!spec)
      return top.error(*root.get("policies"), "policies[" + std::to_string(i) + "]",
                       "\"" + policy_names[i] + "\": " + error);
    policies.push_back(*spec);
  }
  std::vector<double> loads{0};
  SWEEP_TRY(top.numbers("loads", loads, 0, true));
  std::vector<std::string> estimates{"default"};
  SWEEP_TRY(top.strings("estimates", estimates));
  for (std::size_t i = 0; i < estimates.size(); ++i) {
    if (estimates[i] == "default") continue;
    if (auto e = sim::EstimateSpec::parse(estimates[i]); !e) {
      return top.error(*root.get("estimates"), "estimates[" + std::to_string(i) + "]", e.error().message);
    }
  }
  std::vector<std::uint64_t> seeds{1};
  if (const auto* sn = root.get("seeds")) {
    seeds.clear();
    if (sn->is_integer() && *sn->value<std::int64_t>() >= 1 && *sn->value<std::int64_t>() <= 1'000'000) {
      for (std::int64_t s = 1; s <= *sn->value<std::int64_t>(); ++s) seeds.push_back(static_cast<std::uint64_t>(s));
    } else if (const auto* arr = sn->as_array(); arr && !arr->empty()) {
      for (std::size_t i = 0; i < arr->size(); ++i) {
        const auto& e = *arr->get(i);
        if (!e.is_integer() || *e.value<std::int64_t>() < 0) {
          return top.error(e, "seeds[" + std::to_string(i) + "]", "expected an integer >= 0");
        }
        seeds.push_back(static_cast<std::uint64_t>(*e.value<std::int64_t>()));
      }
    } else {
      return top.error(*sn, "seeds", "expected a count N (seeds 1..N) or a non-empty list of seeds");
    }
  }
  if (const auto* cn = root.get("cdf_load")) {
    double v = 0;
    SWEEP_TRY(top.number("cdf_load", v, 0, true));
    if (std::find(loads.begin(), loads.end(), v) == loads.end())
      return top.error(*cn, "cdf_load", "is not one of loads");
    study.cdf_load = v;
  }

  // Slurm.
  if (const auto* sn = root.get("slurm")) {
    const auto* st = sn->as_table();
    if (!st) return top.error(*sn, "slurm", "expected a table");
    Reader r(file, *st, "slurm.");
    SWEEP_TRY(r.known_keys({"tasks", "sbatch_args", "command"}));
    SWEEP_TRY(r.integer("tasks", study.slurm.tasks, 1, 1'000'000));
    SWEEP_TRY(r.strings("sbatch_args", study.slurm.sbatch_args));
    SWEEP_TRY(r.string("command", study.slurm.command));
  }

  // The grid, in study order: trace, pool, estimates, policy, load, seed (seeds vary fastest).
  std::set<std::string> ids;
  for (const auto& trace : traces) {
    for (const auto& pool : pools) {
      for (const auto& est : estimates) {
        for (const auto& policy : policies) {
          for (double load : loads) {
            for (std::uint64_t seed : seeds) {
              Cell c;
              c.index = study.cells.size();
              c.trace = trace.name;
              c.pool = pool.label;
              c.estimates = est;
              c.policy = policy.to_string();
              c.load = load;
              c.seed = seed;
              c.params = {{"trace", trace.params},    {"pool", pool.params}, {"estimates", est},
                          {"policy", c.policy},       {"load", load},        {"seed", seed},
                          {"options", options_params}};
              c.id = cell_id(c.params);
              if (!ids.insert(c.id).second) {
                return make_error(Errc::invalid_argument, file.filename().string() +
                                                              ": two cells have the same parameters (" +
                                                              c.params.dump() + "): a value is repeated in a list");
              }
              c.experiment.trace = trace.source;
              c.experiment.pool = pool.source;
              c.experiment.load = load;
              c.experiment.estimates = est == "default" ? "" : est;
              c.experiment.policies = {policy};
              c.experiment.options = options;
              c.experiment.options.seed = seed;
              study.cells.push_back(std::move(c));
            }
          }
        }
      }
    }
  }
  return study;
}

Result<Study> load_study(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(Errc::not_found, "cannot read study file " + file.string());
  std::stringstream s;
  s << in.rdbuf();
  return parse_study(s.str(), file);
}

}  // namespace accelpool::sweep
