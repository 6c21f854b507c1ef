// accelpool-sim's engine: a discrete-event replay of a trace against a pool, with the scheduler library
// (accelpool::scheduler) making every decision.
//
// Time is simulated seconds. The engine keeps one event heap (arrivals, completions, scheduler wake-ups),
// so a run costs O(events x log events) plus what the scheduler spends per event; there is no per-event
// scan of jobs or devices unless SimOptions::self_check is on.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/scheduler/scheduler.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace accelpool::sim {

// One job of a trace: it asks for `devices` devices of `kind` holding `bitstream` at `arrival_s` and runs
// for `runtime_s` seconds once they are set up.
struct Job {
  std::uint64_t id = 0;       // unique in the trace (row order by default)
  double arrival_s = 0;       // >= 0
  double runtime_s = 0;       // >= 0, the run time on the devices (setup excluded)
  std::uint32_t devices = 1;  // gang size, >= 1, granted all-or-nothing
  std::string bitstream = "default";
  std::string tenant = "default";
  std::optional<double> estimate_s;  // what the guest tells the scheduler (see apply_estimates)
  std::string kind = "fpga";
  std::string host;   // where the guest runs; "" = the pool's first host
  std::string label;  // groups learned run times (e.g. the job's command); "" = none
  // A job of a slot kind ("<kind>/slot", see DeviceGroupSpec::slots) runs a partial image on slots: `demand`
  // is the share of its device's memory bandwidth it uses alone (0 to 1; 0: negligible). It may take only a
  // slot whose share admits it, and it runs slower while the slot leases of its device demand more than the
  // device has (scheduler/interference.hpp).
  double demand = 0;
};

// The kind of the slots of devices of kind K: K + kSlotKindSuffix ("fpga/slot").
inline constexpr const char* kSlotKindSuffix = "/slot";

struct Trace {
  std::vector<Job> jobs;  // any order; the simulator replays by arrival, ties by id
};

// Cost of one device model: seconds to program a new bitstream, and seconds to attach it to a guest.
struct ModelCost {
  double reconfig_s = 0;  // a full image on the whole device
  double attach_s = 0;
  double partial_reconfig_s = 0;  // a partial image on one slot
};

// A group of identical devices on one host.
struct DeviceGroupSpec {
  std::string kind = "fpga";
  std::string model = "generic";
  scheduler::AttachMode attach = scheduler::AttachMode::network;
  std::uint32_t count = 1;
  // Partial-reconfiguration slots per device (0: none). Each device then also offers `slots` devices of kind
  // "<kind>/slot" (scheduler: add_slot), each admitting a lease whose demand is at most `slot_share` of the
  // device's bandwidth; the device is leased whole only while all its slots are free.
  std::uint32_t slots = 0;
  double slot_share = 1;
};

struct HostSpec {
  std::string name;
  std::vector<DeviceGroupSpec> devices;
};

// The pool: hosts with their devices, and what each device model costs to set up. Models not listed in
// `models` cost `default_cost`.
struct PoolSpec {
  std::vector<HostSpec> hosts;
  std::map<std::string, ModelCost> models;
  ModelCost default_cost;

  // `devices` network-attached "fpga" devices of model "generic" on one host "host0".
  static PoolSpec homogeneous(std::uint32_t devices, double reconfig_s = 0, double attach_s = 0);
  // Devices, not counting slots (a slot is part of its device).
  std::uint64_t total_devices() const;
  const ModelCost& cost(const std::string& model) const;
};

struct SimOptions {
  double restore_s = 0;    // extra setup seconds charged when a preempted job is granted again
  std::uint64_t seed = 1;  // for any randomized choice of the engine (none today; kept in the output)
  bool progress = false;   // a progress line on stderr while running
  std::string progress_label;
  // Checks invariants after every event (no device held twice, grants match requests, and, when
  // `check_work_conserving`, no free device while a waiting request fits). Slow: O(devices + jobs in the
  // system) per event. The first violation ends the run with an error "invariant: ...".
  bool self_check = false;
  bool check_work_conserving = false;
  std::size_t max_queue_samples = 2048;  // resolution of RunResult::queue (points kept, >= 16)
  // lower_bound_avg_jct(trace, devices) when the caller already has it (several policies on one trace);
  // computed otherwise.
  std::optional<double> lower_bound_avg_jct_s;
  // Fill RunResult::per_job. Needed for per-job rows (CSV) and JCT plots; without it a run of a million jobs
  // saves about 80 MB and the time to write them, and the summary statistics are the same.
  bool keep_per_job = true;
  // How the scheduler learns run times from finished jobs (see scheduler/estimator.hpp).
  scheduler::EstimatorOptions learning;
  // Completions at the same instant: false (default) reports them to the scheduler one at a time, each
  // followed by a decision, in job order; true reports them together and decides once (see docs/simulator.md).
  bool batch_completions = false;
};

struct JobResult {
  std::uint64_t id = 0;
  double arrival_s = 0;
  double runtime_s = 0;
  std::uint32_t devices = 1;
  double first_start_s = 0;  // time of the first grant
  double finish_s = 0;
  double jct_s = 0;                    // finish - arrival: waiting + setup + run time (+ restore after preemptions)
  double wait_s = 0;                   // first grant - arrival
  double slowdown = 0;                 // jct / max(runtime, 1 s)
  std::uint32_t reconfigurations = 0;  // devices programmed for this job, over all its grants
  std::uint32_t preemptions = 0;
};

// Waiting requests and busy devices at one instant.
struct QueueSample {
  double t = 0;
  std::uint64_t waiting = 0;
  std::uint64_t busy_devices = 0;
};

struct RunResult {
  std::string policy;  // PolicySpec::to_string()
  std::size_t jobs = 0;
  std::uint64_t devices = 0;
  double avg_jct_s = 0, p50_jct_s = 0, p95_jct_s = 0, p99_jct_s = 0, max_jct_s = 0;
  double avg_wait_s = 0, p99_wait_s = 0;
  double avg_slowdown = 0, p99_slowdown = 0;
  // Device-seconds held by leases (setup included) / (devices x makespan).
  double utilization = 0;
  // Device-seconds of run time only / (devices x makespan).
  double useful_utilization = 0;
  double makespan_s = 0;  // last finish - first arrival
  double lower_bound_avg_jct_s = 0;
  double wall_s = 0;                   // host seconds the run took (not deterministic)
  std::uint64_t reconfigurations = 0;  // devices programmed, summed over grants
  std::uint64_t preemptions = 0;
  std::uint64_t events = 0;  // arrivals + completions + scheduler wake-ups processed
  std::uint64_t max_waiting = 0;
  std::vector<JobResult> per_job;  // by job id
  std::vector<QueueSample> queue;  // evenly spaced over the run, at most SimOptions::max_queue_samples
};

// Replays `trace` on `pool` under `policy`. Errors (code "invalid_argument"): an empty trace, a job that can
// never be served by the pool (too many devices, unknown kind, no reachable device), an unknown guest host,
// a bad policy; (code "internal"): the scheduler broke its contract (e.g. granted a busy device) or a
// self-check failed. Never throws for bad input; no partial result on error.
Result<RunResult> simulate(const Trace& trace, const PoolSpec& pool, const scheduler::PolicySpec& policy,
                           const SimOptions& options);

}  // namespace accelpool::sim
