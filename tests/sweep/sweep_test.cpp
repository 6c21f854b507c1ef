// accelpool-sweep: study parsing, cell ids and statistics in process; the real binary for local runs,
// resume, failed cells, retries and merge, checked against accelpool-sim run directly.
#include <catch2/catch.hpp>

#include "merge.hpp"
#include "run_command.hpp"
#include "scratch_dir.hpp"
#include "study.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using accelpool::testing::run_command;
using accelpool::testing::ScratchDir;
using json = nlohmann::json;

namespace {

const std::string kSweep = ACCELPOOL_SWEEP_BIN;
const std::string kSim = ACCELPOOL_SIM_BIN;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// tests/sweep/small.toml: 2 policies x 2 loads x 3 seeds of a small synthetic workload with noisy estimates
// (seeds matter). The Slurm test runs it too.
const std::string kStudy = slurp(ACCELPOOL_SWEEP_TEST_DIR "/small.toml");

// The accelpool-sim flags of one cell of kStudy.
std::string sim_args(const std::string& policy, double load, int seed) {
  std::ostringstream o;
  o << "--synthetic 300 --runtime-dist lognormal --gangs 1:0.8,2:0.2 --devices 4 --estimates noisy:0.5 --quiet "
    << "--deterministic --policy " << policy << " --load " << load << " --seed " << seed;
  return o.str();
}

accelpool::sweep::Study parse(const std::string& text) {
  auto s = accelpool::sweep::parse_study(text, "study.toml");
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s);
  return std::move(*s);
}

std::string parse_error(const std::string& text) {
  auto s = accelpool::sweep::parse_study(text, "study.toml");
  REQUIRE_FALSE(s);
  return s.error().message;
}

}  // namespace

TEST_CASE("sweep: t quantiles and confidence intervals", "[sweep]") {
  using accelpool::sweep::t95;
  CHECK(t95(1) == Approx(12.7062047));
  CHECK(t95(2) == Approx(4.30265273));
  CHECK(t95(19) == Approx(2.09302405));
  // Above the table: the expansion against known values (df 40: 2.021075, 120: 1.979930, 1000: 1.962339).
  CHECK(t95(40) == Approx(2.0210754).epsilon(1e-6));
  CHECK(t95(120) == Approx(1.9799304).epsilon(1e-6));
  CHECK(t95(1000) == Approx(1.9623391).epsilon(1e-6));
  const std::vector<double> v{10, 12, 14};  // mean 12, sd 2
  const auto ci = accelpool::sweep::mean_ci(v);
  CHECK(ci.mean == Approx(12));
  REQUIRE(ci.half_width);
  CHECK(*ci.half_width == Approx(4.30265273 * 2 / std::sqrt(3.0)));
  const std::vector<double> equal{0.1, 0.1, 0.1};  // no rounding noise: exactly no spread
  CHECK(accelpool::sweep::mean_ci(equal).mean == 0.1);
  CHECK(accelpool::sweep::mean_ci(equal).half_width == 0.0);
  const std::vector<double> one{5};
  CHECK_FALSE(accelpool::sweep::mean_ci(one).half_width);
}

TEST_CASE("sweep: the grid and its stable cell ids", "[sweep]") {
  const auto a = parse(kStudy);
  REQUIRE(a.cells.size() == 12);
  CHECK(a.cells.front().policy == "fifo+first-fit");
  CHECK(a.cells.front().seed == 1);
  CHECK(a.cells[1].seed == 2);  // seeds vary fastest
  std::set<std::string> ids;
  for (const auto& c : a.cells) ids.insert(c.id);
  CHECK(ids.size() == 12);
  // The same parameters in another order, written out in full, give the same ids.
  const auto b = parse(R"(
seeds = [3, 1, 2]
loads = [0.9, 0.6]
policies = ["sjf+first-fit", "fifo"]
estimates = ["noisy:0.5"]
devices = [4]
name = "other name"
[options]
restore_s = 0
[[traces]]
synthetic = 300
name = "syn"
gangs = "1:0.8,2:0.2"
runtime_dist = "lognormal"
mean_runtime = 600
)");
  std::set<std::string> ids_b;
  for (const auto& c : b.cells) ids_b.insert(c.id);
  CHECK(ids_b == ids);
  // A changed parameter changes the id.
  auto changed = kStudy;
  changed.replace(changed.find("synthetic = 300"), 15, "synthetic = 301");
  CHECK(parse(changed).cells.front().id != a.cells.front().id);
}

TEST_CASE("sweep: a bad study is refused with file, place and key", "[sweep]") {
  CHECK(parse_error(kStudy + "colour = 1\n").find("study.toml:14:10: traces[0].colour: unknown key") !=
        std::string::npos);
  CHECK(parse_error("colour = 1\n" + kStudy).find("study.toml:1:10: colour: unknown key") != std::string::npos);
  auto bad_policy = kStudy;
  bad_policy.replace(bad_policy.find("\"sjf\""), 5, "\"sjff\"");
  CHECK(parse_error(bad_policy).find("policies[1]: \"sjff\"") != std::string::npos);
  auto bad_load = kStudy;
  bad_load.replace(bad_load.find("0.9]"), 3, "-1");
  CHECK(parse_error(bad_load).find("loads[1]: expected a number > 0") != std::string::npos);
  CHECK(parse_error("policies = [\"fifo\"]\ndevices = [4]\n").find("give at least one [[traces]] table") !=
        std::string::npos);
  CHECK(parse_error(kStudy + "[[traces]]\nname = \"syn\"\nsynthetic = 5\n").find("\"syn\" names two traces") !=
        std::string::npos);
  auto repeated = kStudy;
  repeated.replace(repeated.find("[0.6, 0.9]"), 10, "[0.6, 0.6]");
  CHECK(parse_error(repeated).find("same parameters") != std::string::npos);
  CHECK(parse_error("devices = [1]\n[[traces]]\nfile = \"a.csv\"\nsynthetic = 3\n")
            .find("study.toml:2:1: traces[0]: give exactly one of") != std::string::npos);
  CHECK(parse_error("x = [").find("study.toml:1:") != std::string::npos);
}

TEST_CASE("sweep: a local run equals accelpool-sim cell by cell, and the merge's means and intervals", "[sweep]") {
  ScratchDir dir("sweep-local");
  const fs::path study = dir.path() / "small.toml", out = dir.path() / "out";
  write(study, kStudy);
  const std::string common = " --study " + study.string() + " --out " + out.string();
  auto r = run_command(kSweep + " run -j 2" + common + " 2>&1");
  INFO(r.text);
  REQUIRE(r.code == 0);
  CHECK(r.text.find("12 ran, 0 already done, 0 failed") != std::string::npos);
  CHECK(r.text.find("sweep: 12 done, 0 failed, 0 remaining") != std::string::npos);  // the final progress line

  // Each cell's result is what accelpool-sim writes for the same run (wall time aside).
  auto parsed = accelpool::sweep::load_study(study);
  REQUIRE(parsed);
  std::map<std::pair<std::string, double>, std::vector<json>> sim_runs;
  for (const auto& c : parsed->cells) {
    const std::string policy = c.policy.substr(0, c.policy.find('+'));
    const fs::path sim_json = dir.path() / (c.id + ".sim.json");
    auto s = run_command(kSim + " " + sim_args(policy, c.load, static_cast<int>(c.seed)) + " --json " +
                         sim_json.string() + " 2>&1");
    INFO(s.text);
    REQUIRE(s.code == 0);
    json expected = json::parse(slurp(sim_json));
    json cell = json::parse(slurp(out / "cells" / (c.id + ".json")));
    CHECK(cell["cell"] == c.id);
    CHECK(cell["jct_quantiles"].size() == accelpool::sweep::kJctQuantiles);
    CHECK(cell["jct_quantiles"].back() == expected["runs"][0]["max_jct_s"]);
    cell["result"]["runs"][0]["wall_s"] = 0.0;
    CHECK(cell["result"] == expected);
    sim_runs[{c.policy, c.load}].push_back(expected["runs"][0]);
  }

  // The merge: one row per cell, and per (policy, load) the mean and t-interval over the 3 seeds.
  auto m = run_command(kSweep + " merge" + common + " 2>&1");
  INFO(m.text);
  REQUIRE(m.code == 0);
  const json merged = json::parse(slurp(out / "merged" / "study.json"));
  CHECK(merged["cells"].size() == 12);
  REQUIRE(merged["groups"].size() == 4);
  for (const auto& g : merged["groups"]) {
    CHECK(g["seeds"] == 3);
    const auto& runs = sim_runs.at({g["policy"].get<std::string>(), g["load"].get<double>()});
    for (const char* metric : {"avg_jct_s", "p99_jct_s", "avg_wait_s", "utilization"}) {
      double sum = 0, ss = 0;
      for (const auto& run : runs) sum += run[metric].get<double>();
      const double mean = sum / 3;
      for (const auto& run : runs) ss += std::pow(run[metric].get<double>() - mean, 2);
      const double half = 4.30265273 * std::sqrt(ss / 2) / std::sqrt(3.0);
      INFO(g["policy"] << " " << g["load"] << " " << metric);
      CHECK(g["metrics"][metric]["mean"].get<double>() == Approx(mean).epsilon(1e-8));
      CHECK(g["metrics"][metric]["ci95"].get<double>() == Approx(half).epsilon(1e-7).margin(1e-9));
    }
  }
  const std::string cells_csv = slurp(out / "merged" / "cells.csv");
  CHECK(std::count(cells_csv.begin(), cells_csv.end(), '\n') == 13);
  CHECK(cells_csv.rfind("cell,trace,pool,estimates,policy,load,seed,offered_load,jobs,devices,avg_jct_s", 0) == 0);
  const std::string groups_csv = slurp(out / "merged" / "groups.csv");
  CHECK(std::count(groups_csv.begin(), groups_csv.end(), '\n') == 5);
  for (const char* svg : {"avg_jct.svg", "p99_jct.svg", "jct_cdf.svg"}) {
    const std::string text = slurp(out / "merged" / "plots" / svg);
    CHECK(text.rfind("<svg", 0) == 0);
    CHECK(text.find("sjf+first-fit") != std::string::npos);
  }
  CHECK(slurp(out / "merged" / "plots" / "avg_jct.svg").find("<polygon") != std::string::npos);  // CI bands

  // Resume: nothing left to run, and the merge is byte-identical.
  const std::string before = slurp(out / "merged" / "study.json");
  auto again = run_command(kSweep + " run --quiet" + common + " 2>&1");
  CHECK(again.code == 0);
  CHECK(again.text.find("0 ran, 12 already done, 0 failed") != std::string::npos);
  REQUIRE(run_command(kSweep + " merge" + common).code == 0);
  CHECK(slurp(out / "merged" / "study.json") == before);

  // A damaged or foreign result file stops the merge, naming the file, and leaves the merged files alone.
  const fs::path last = out / "cells" / (parsed->cells.back().id + ".json");
  json cell = json::parse(slurp(last));
  cell["result"]["runs"][0].erase("events");
  write(last, cell.dump());
  auto bad = run_command(kSweep + " merge" + common + " 2>&1");
  CHECK(bad.code == 1);
  CHECK(bad.text.find(last.string() + ": its metrics differ from those of cell " + parsed->cells.front().id) !=
        std::string::npos);
  write(last, "{\"cell\": \"0\"}");
  bad = run_command(kSweep + " merge" + common + " 2>&1");
  CHECK(bad.text.find(last.string() + ": not a result of cell " + parsed->cells.back().id) != std::string::npos);
  CHECK(slurp(out / "merged" / "study.json") == before);
}

TEST_CASE("sweep: failed cells are reported with their log, retried alone, and block the merge", "[sweep]") {
  ScratchDir dir("sweep-fail");
  const fs::path study = dir.path() / "files.toml", out = dir.path() / "out";
  write(study, R"(
policies = ["fifo", "las"]
devices = [2]
loads = [0.8]
[[traces]]
file = "jobs.csv"
[[traces]]
name = "later"
file = "missing.csv"
)");
  const std::string jobs = "arrival_s,runtime_s\n0,10\n1,20\n2,5\n3,40\n";
  write(dir.path() / "jobs.csv", jobs);
  const std::string common = " --study " + study.string() + " --out " + out.string();
  auto r = run_command(kSweep + " run --quiet" + common + " 2>&1");
  INFO(r.text);
  CHECK(r.code == 2);
  CHECK(r.text.find("2 ran, 0 already done, 2 failed") != std::string::npos);
  CHECK(r.text.find("--cell ") != std::string::npos);

  auto st = run_command(kSweep + " status" + common + " 2>&1");
  INFO(st.text);
  CHECK(st.text.find("2 done, 2 failed, 0 remaining") != std::string::npos);
  CHECK(st.text.find("trace later") != std::string::npos);
  CHECK(st.text.find("exit status 1; log " + (out / "logs").string()) != std::string::npos);
  auto parsed = accelpool::sweep::load_study(study);
  REQUIRE(parsed);
  const auto& failed = parsed->cells[2];
  REQUIRE(failed.trace == "later");
  CHECK(slurp(out / "logs" / (failed.id + ".log")).find("missing.csv") != std::string::npos);

  auto m = run_command(kSweep + " merge" + common + " 2>&1");
  CHECK(m.code == 1);
  CHECK(m.text.find("2 of 4 cells are not done (2 failed") != std::string::npos);

  // The trace appears; retrying the one cell runs only it.
  write(dir.path() / "missing.csv", jobs);
  auto retry = run_command(kSweep + " run --quiet --cell " + failed.id + common + " 2>&1");
  INFO(retry.text);
  CHECK(retry.code == 0);
  CHECK(retry.text.find("1 ran, 0 already done, 0 failed") != std::string::npos);
  CHECK(run_command(kSweep + " status" + common).text.find("3 done, 1 failed, 0 remaining") != std::string::npos);
  // Resuming runs the other failed cell; then the merge goes through.
  CHECK(run_command(kSweep + " run --quiet" + common + " 2>&1").text.find("1 ran, 3 already done, 0 failed") !=
        std::string::npos);
  CHECK(run_command(kSweep + " merge" + common).code == 0);
  const json merged = json::parse(slurp(out / "merged" / "study.json"));
  CHECK(merged["cells"].size() == 4);
  CHECK(merged["groups"][0]["metrics"]["avg_jct_s"]["ci95"].is_null());  // one seed: no interval
}

TEST_CASE("sweep: a cell whose starting process is gone does not run", "[sweep]") {
  // The runner names itself with --parent; a cell that finds another parent (its runner died before the cell
  // could tie its life to it) writes nothing and fails, naming why. Here the named parent is init, which never
  // starts a cell.
  ScratchDir dir("sweep-orphan");
  const fs::path study = dir.path() / "one.toml", out = dir.path() / "out";
  write(study, R"(
policies = ["fifo"]
devices = [2]
loads = [0.8]
[[traces]]
file = "jobs.csv"
)");
  write(dir.path() / "jobs.csv", "arrival_s,runtime_s\n0,10\n1,20\n");
  auto parsed = accelpool::sweep::load_study(study);
  REQUIRE(parsed);
  REQUIRE(parsed->cells.size() == 1);
  const std::string cell =
      " run-cell --study " + study.string() + " --out " + out.string() + " --cell " + parsed->cells[0].id;
  auto orphan = run_command(kSweep + cell + " --parent 1 2>&1");
  INFO(orphan.text);
  CHECK(orphan.code == 1);
  CHECK(orphan.text.find("the process that started this cell (1) is gone") != std::string::npos);
  CHECK_FALSE(fs::exists(out / "cells" / (parsed->cells[0].id + ".json")));
  // Its real parent named, or none (run by hand), it runs.
  auto by_hand = run_command(kSweep + cell + " 2>&1");
  INFO(by_hand.text);
  CHECK(by_hand.code == 0);
  CHECK(run_command(kSweep + " status --study " + study.string() + " --out " + out.string()).text.find("1 done") !=
        std::string::npos);
}

TEST_CASE("sweep: slurm writes an array script over the unfinished slices", "[sweep]") {
  ScratchDir dir("sweep-script");
  const fs::path study = dir.path() / "small.toml", out = dir.path() / "out";
  write(study, kStudy + "[slurm]\ntasks = 5\nsbatch_args = [\"--time=10\"]\n");
  const std::string common = " --study " + study.string() + " --out " + out.string();
  auto r = run_command(kSweep + " slurm --no-submit --sbatch-arg=--hold" + common + " 2>&1");
  INFO(r.text);
  REQUIRE(r.code == 0);
  std::string script = slurp(out / "slurm" / "array.sh");
  CHECK(script.find("#SBATCH --array=0,1,2,3,4\n") != std::string::npos);
  CHECK(script.find("#SBATCH --time=10\n#SBATCH --hold\n") != std::string::npos);
  CHECK(script.find("run-task --study '" + study.string() + "' --out '" + out.string() +
                    "' --tasks 5 --task \"$SLURM_ARRAY_TASK_ID\"") != std::string::npos);
  // Slices 1 and 3 done by hand (run-task, what an array task runs): only 0, 2 and 4 are left.
  for (int task : {1, 3}) {
    auto t = run_command(kSweep + " run-task --tasks 5 --task " + std::to_string(task) + common + " 2>&1");
    INFO(t.text);
    CHECK(t.code == 0);
  }
  CHECK(run_command(kSweep + " status" + common).text.find("5 done, 0 failed, 7 remaining") != std::string::npos);
  REQUIRE(run_command(kSweep + " slurm --no-submit" + common).code == 0);
  script = slurp(out / "slurm" / "array.sh");
  CHECK(script.find("#SBATCH --array=0,2,4\n") != std::string::npos);
}
