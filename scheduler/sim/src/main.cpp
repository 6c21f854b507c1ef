// accelpool-sim: replays a trace (a file or a synthetic one) against a pool under one or more policies and
// reports JCT statistics, per-job rows and plots. See docs/simulator.md.
#include <accelpool/sim/experiment.hpp>
#include <accelpool/sim/report.hpp>
#include <accelpool/sim/simulator.hpp>
#include <accelpool/sim/trace.hpp>

#include <accelpool/common/cli.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace {

namespace sim = accelpool::sim;
namespace sch = accelpool::scheduler;

std::string join(std::span<const std::string_view> names) {
  std::string out;
  for (auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

int fail(const std::string& message) {
  std::cerr << "accelpool-sim: " << message << '\n';
  return 1;
}

// Writes a whole file, or says why not.
bool write_text_file(const std::string& path, const std::string& text, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  out.flush();
  if (!out) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "accelpool-sim: discrete-event replay of accelerator jobs against a pool, with the accelpool scheduler "
      "deciding.\nExample: accelpool-sim --trace philly.csv --format philly --devices 374 --load 0.85 "
      "--policy fifo,las+affinity --json out.json --plot plots/"};
  accelpool::common::init_cli(app, "accelpool-sim");
  app.set_help_all_flag("--help-all", "Show all options");
  app.option_defaults()->always_capture_default(true);

  std::string trace_path, format = "native";
  std::size_t synthetic = 0;
  auto* trace_opt = app.add_option("--trace", trace_path, "Trace file (CSV)")->type_name("FILE")->group("Trace");
  app.add_option("--format", format, "Trace format: native (arrival_s,runtime_s,...) or philly")
      ->check(CLI::IsMember({"native", "philly"}))
      ->group("Trace");
  auto* syn_opt = app.add_option("--synthetic", synthetic, "Generate N synthetic jobs instead of reading a trace")
                      ->check(CLI::Range(std::size_t{1}, std::size_t{100'000'000}))
                      ->group("Trace");
  trace_opt->excludes(syn_opt);

  sim::GeneratorSpec gen;
  std::string runtime_dist = "exponential", gangs;
  app.add_option("--rate", gen.arrival_rate, "Synthetic: Poisson arrival rate, jobs per second (--load rescales it)")
      ->group("Synthetic trace");
  app.add_option("--runtime-dist", runtime_dist, "Synthetic: exponential, lognormal or pareto (bounded)")
      ->check(CLI::IsMember({"exponential", "lognormal", "pareto"}))
      ->group("Synthetic trace");
  app.add_option("--mean-runtime", gen.mean_runtime_s, "Synthetic: mean run time in seconds (exponential, lognormal)")
      ->group("Synthetic trace");
  app.add_option("--sigma", gen.lognormal_sigma, "Synthetic: lognormal sigma")->group("Synthetic trace");
  app.add_option("--pareto-alpha", gen.pareto_alpha, "Synthetic: bounded Pareto shape")->group("Synthetic trace");
  app.add_option("--pareto-min", gen.pareto_min_s, "Synthetic: bounded Pareto lower bound, seconds")
      ->group("Synthetic trace");
  app.add_option("--pareto-max", gen.pareto_max_s, "Synthetic: bounded Pareto upper bound, seconds")
      ->group("Synthetic trace");
  app.add_option("--gangs", gangs, "Synthetic: gang-size mix SIZE:WEIGHT,... (default 1:1)")
      ->type_name("MIX")
      ->group("Synthetic trace");
  app.add_option("--bitstreams", gen.bitstreams, "Synthetic: number of bitstreams, Zipf-popular")
      ->group("Synthetic trace");
  app.add_option("--zipf", gen.zipf_s, "Synthetic: Zipf exponent of bitstream popularity")->group("Synthetic trace");
  app.add_option("--tenants", gen.tenants, "Synthetic: number of tenants (uniform)")->group("Synthetic trace");
  app.add_option("--partial-fraction", gen.partial_fraction,
                 "Synthetic: chance that a bitstream is a partial image (its jobs ask for slots, kind <kind>/slot)")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Synthetic trace");
  std::string demand_range;
  app.add_option("--demand", demand_range,
                 "Synthetic: MIN:MAX, bandwidth demand of each partial image (share of its device), uniform")
      ->type_name("MIN:MAX")
      ->group("Synthetic trace");

  std::uint32_t devices = 0;
  double reconfig_s = 0, attach_s = 0;
  std::string pool_path;
  auto* dev_opt = app.add_option("--devices", devices, "Homogeneous pool of N network-attached fpga devices")
                      ->check(CLI::Range(1U, 10'000'000U))
                      ->group("Pool");
  auto* pool_opt = app.add_option("--pool", pool_path, "Pool description (JSON, see docs/simulator.md)")
                       ->type_name("FILE")
                       ->group("Pool");
  dev_opt->excludes(pool_opt);
  app.add_option("--reconfig-s", reconfig_s, "With --devices: seconds to program a bitstream")
      ->check(CLI::NonNegativeNumber)
      ->group("Pool");
  app.add_option("--attach-s", attach_s, "With --devices: seconds to attach a device to a guest")
      ->check(CLI::NonNegativeNumber)
      ->group("Pool");
  std::uint32_t slots = 0;
  double slot_share = 1, partial_reconfig_s = 0;
  app.add_option("--slots", slots, "With --devices: partial-reconfiguration slots per device (kind fpga/slot)")
      ->check(CLI::Range(0U, 64U))
      ->group("Pool");
  app.add_option("--slot-share", slot_share, "With --slots: share of its device's bandwidth a slot's lease may demand")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Pool");
  app.add_option("--partial-reconfig-s", partial_reconfig_s,
                 "With --slots: seconds to program a slot with a partial image")
      ->check(CLI::NonNegativeNumber)
      ->group("Pool");

  std::string policies;
  double load = 0;
  std::string estimates;
  sim::SimOptions options;
  app.add_option(
         "--policy", policies,
         "Comma-separated policies ORDERING[+PLACEMENT][+guard=S][+age[=SLOWDOWN]][+hold[=S]][+reuse[=S]][+nopreempt], "
         "each run on the same trace. "
         "Orderings: " +
             join(sch::ordering_names()) + ". Placements: " + join(sch::placement_names()) +
             ". Default: fifo, sjf, srpt, las, djsf and fair with first-fit")
      ->type_name("LIST")
      ->group("Experiment");
  app.add_option("--load", load, "Rescale arrival times so the offered load is X (device-seconds asked / available)")
      ->check(CLI::PositiveNumber)
      ->group("Experiment");
  app.add_option("--estimates", estimates,
                 "Run-time estimates the requests carry: trace, oracle, none (the scheduler knows only "
                 "what it learns from finished jobs), noisy:SIGMA "
                 "(default: trace if the trace has estimate_s, else oracle)")
      ->type_name("MODE")
      ->group("Experiment");
  app.add_option("--restore-s", options.restore_s, "Seconds charged to resume a preempted job")
      ->check(CLI::NonNegativeNumber)
      ->group("Experiment");
  app.add_option("--seed", options.seed, "Seed of the generator and of noisy estimates")->group("Experiment");
  app.add_option("--learn-warmup", options.learning.warmup,
                 "Finished jobs of a group before its learned run time is trusted")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1'000'000}))
      ->group("Experiment");
  app.add_option("--learn-half-life", options.learning.half_life,
                 "Finished jobs of a group after which an observation weighs half (drift)")
      ->check(CLI::PositiveNumber)
      ->group("Experiment");
  app.add_flag("--batch-completions", options.batch_completions,
               "Report completions at the same instant together and decide once (default: one at a time)")
      ->group("Experiment");
  bool self_check = false;
  app.add_flag("--self-check", self_check, "Check invariants after every event (slow)")->group("Experiment");
  bool check_wc = false;
  app.add_flag("--check-work-conserving", check_wc,
               "With --self-check: also fail if a device idles while a waiting job fits on it")
      ->group("Experiment");

  std::string json_path, csv_path, plot_dir;
  bool deterministic = false, quiet = false;
  app.add_option("--json", json_path, "Write {\"meta\":..., \"runs\":[...]} to FILE")
      ->type_name("FILE")
      ->group("Output");
  app.add_option("--csv", csv_path, "Write one row per job and policy to FILE")->type_name("FILE")->group("Output");
  app.add_option("--plot", plot_dir, "Write jct_cdf.svg and queue.svg to DIR")->type_name("DIR")->group("Output");
  app.add_flag("--deterministic", deterministic,
               "Write wall_s as 0 in the JSON so that equal inputs give byte-identical files")
      ->group("Output");
  app.add_flag("--quiet", quiet, "No progress line on stderr")->group("Output");

  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;

  if (trace_path.empty() && synthetic == 0) return fail("give a trace: --trace FILE or --synthetic N (see --help)");
  if (devices == 0 && pool_path.empty()) return fail("give a pool: --devices N or --pool FILE (see --help)");
  if (!pool_path.empty() && (reconfig_s > 0 || attach_s > 0 || slots > 0)) {
    return fail("--reconfig-s, --attach-s and --slots apply to --devices; with --pool put them in the pool file");
  }
  if (synthetic == 0) {
    for (const char* flag :
         {"--rate", "--runtime-dist", "--mean-runtime", "--sigma", "--pareto-alpha", "--pareto-min", "--pareto-max",
          "--gangs", "--bitstreams", "--zipf", "--tenants", "--partial-fraction", "--demand"}) {
      if (app.count(flag) > 0) return fail(std::string(flag) + " applies only to --synthetic");
    }
  }

  // Policies, all checked before anything runs.
  std::vector<sch::PolicySpec> specs;
  {
    std::vector<std::string> names;
    if (policies.empty()) {
      for (auto n : {"fifo", "sjf", "srpt", "las", "djsf", "fair"}) names.emplace_back(n);
    } else {
      std::stringstream ss(policies);
      std::string item;
      while (std::getline(ss, item, ',')) names.push_back(item);
    }
    for (const auto& name : names) {
      std::string error;
      auto spec = sch::PolicySpec::parse(name, &error);
      if (!spec) return fail("--policy \"" + name + "\": " + error);
      if (!sch::Scheduler::create(*spec, &error)) return fail("--policy \"" + name + "\": " + error);
      specs.push_back(*spec);
    }
    if (specs.empty()) return fail("--policy names no policy");
  }

  // Trace, pool, load, estimates and runs: the library's experiment (the same path as accelpool-sweep's cells).
  sim::Experiment experiment;
  if (synthetic > 0) {
    experiment.trace.synthetic = synthetic;
    gen.runtime = runtime_dist == "lognormal" ? sim::RuntimeDist::lognormal
                  : runtime_dist == "pareto"  ? sim::RuntimeDist::pareto
                                              : sim::RuntimeDist::exponential;
    if (!gangs.empty()) {
      if (auto st = sim::parse_gang_mix(gangs, gen); !st) return fail(st.error().message);
    }
    if (!demand_range.empty()) {
      const auto colon = demand_range.find(':');
      try {
        if (colon == std::string::npos) throw std::invalid_argument("no colon");
        std::size_t used = 0;
        gen.demand_min = std::stod(demand_range.substr(0, colon), &used);
        if (used != colon) throw std::invalid_argument("trailing");
        const std::string max = demand_range.substr(colon + 1);
        gen.demand_max = std::stod(max, &used);
        if (used != max.size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        return fail("--demand \"" + demand_range + "\": expected MIN:MAX, e.g. 0.1:0.5");
      }
    }
    experiment.trace.generator = gen;
  } else {
    experiment.trace.path = trace_path;
    experiment.trace.format = format == "philly" ? sim::TraceFormat::philly : sim::TraceFormat::native;
  }
  experiment.pool = {.devices = devices,
                     .reconfig_s = reconfig_s,
                     .attach_s = attach_s,
                     .slots = slots,
                     .slot_share = slot_share,
                     .partial_reconfig_s = partial_reconfig_s,
                     .path = pool_path};
  experiment.load = load;
  experiment.estimates = estimates;
  experiment.policies = specs;
  options.progress = !quiet;
  options.self_check = self_check || check_wc;
  options.check_work_conserving = check_wc;
  options.keep_per_job = !csv_path.empty() || !plot_dir.empty();  // the only outputs that read per-job rows
  experiment.options = options;
  auto result = sim::run_experiment(experiment);
  if (!result) return fail(result.error().message);
  const sim::RunMeta& meta = result->meta;
  const std::vector<sim::RunResult>& runs = result->runs;

  // Outputs.
  sim::write_table(std::cout, meta, runs);
  std::string error;
  if (!json_path.empty()) {
    std::ostringstream s;
    sim::write_json(s, meta, runs, !deterministic);
    if (!write_text_file(json_path, s.str(), &error)) return fail(error);
  }
  if (!csv_path.empty()) {
    std::ostringstream s;
    sim::write_csv(s, runs);
    if (!write_text_file(csv_path, s.str(), &error)) return fail(error);
  }
  if (!plot_dir.empty()) {
    if (auto st = sim::write_plots(plot_dir, runs); !st) return fail(st.error().message);
  }
  return 0;
}
