// The discrete-event engine. One heap holds completions and scheduler wake-ups; arrivals are read from the
// trace sorted by time, so the heap never holds more than (running leases + stale completions + 1) events.
#include <accelpool/sim/lower_bound.hpp>
#include <accelpool/sim/simulator.hpp>

#include <accelpool/scheduler/interference.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace accelpool::sim {

namespace sch = accelpool::scheduler;

PoolSpec PoolSpec::homogeneous(std::uint32_t devices, double reconfig_s, double attach_s) {
  PoolSpec pool;
  HostSpec host;
  host.name = "host0";
  DeviceGroupSpec group;
  group.count = devices;
  host.devices.push_back(group);
  pool.hosts.push_back(std::move(host));
  pool.default_cost = {reconfig_s, attach_s};
  return pool;
}

std::uint64_t PoolSpec::total_devices() const {
  std::uint64_t n = 0;
  for (const auto& h : hosts) {
    for (const auto& g : h.devices) n += g.count;
  }
  return n;
}

const ModelCost& PoolSpec::cost(const std::string& model) const {
  auto it = models.find(model);
  return it == models.end() ? default_cost : it->second;
}

namespace {

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

// Nearest-rank percentiles (the smallest value with at least a fraction p of the values at or below it) for
// ascending `ps`, by successive selections: O(n) instead of a sort. Reorders `v`.
std::vector<double> percentiles(std::vector<double>& v, std::initializer_list<double> ps) {
  std::vector<double> out;
  auto from = v.begin();
  for (double p : ps) {
    if (v.empty()) {
      out.push_back(0);
      continue;
    }
    auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
    rank = std::clamp<std::size_t>(rank, 1, v.size());
    const auto nth = v.begin() + static_cast<std::ptrdiff_t>(rank - 1);
    if (nth >= from) {
      std::nth_element(from, nth, v.end());
      from = nth;
    }
    out.push_back(*nth);
  }
  return out;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

std::string fmt_num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

enum class EventType : std::uint8_t { completion = 0, tick = 1 };

struct Event {
  double t;
  EventType type;
  std::uint32_t job;
  std::uint32_t gen;
  bool operator>(const Event& o) const {
    if (t != o.t) return t > o.t;
    if (type != o.type) return type > o.type;
    if (job != o.job) return job > o.job;
    return gen > o.gen;
  }
};

// What the event loop reads and writes of a job when its lease starts, is preempted or ends, in one cache
// line: completions come in no particular order, so every further per-job array read there would cost a
// cache miss of its own.
struct alignas(64) JobState {
  double remaining = 0;                // run seconds still to do
  double lease_start = 0;              // grant time of the current lease
  double run_start = 0;                // lease_start + setup
  double finish = 0;                   // when it completed
  std::uint32_t first_device = kNone;  // the lease's devices, chained through DeviceInfo::next_in_lease
  std::uint32_t count = 1;             // gang size
  std::uint32_t gen = 0;               // bumped on every grant and preemption; stale completions carry an old one
  std::uint32_t reconfigs = 0;
  std::uint32_t preemptions = 0;
  bool arrived = false;
  bool running = false;
  bool done = false;
  float weight = 1;  // devices' worth of the lease: 1 a whole device, 1/n a slot of n
};

// What a device is and who holds it, for checking grants, setup costs and the self-checks. The devices of
// a lease form a chain from JobState::first_device, so that the lease's device list lives in this small,
// often cached array rather than in a per-job one.
struct DeviceInfo {
  sch::HostId host = 0;
  sch::KindId kind = 0;
  std::uint32_t holder = kNone;         // job index holding it, or kNone
  std::uint32_t next_in_lease = kNone;  // the holder's next device, or kNone
  std::uint32_t cost = 0;               // index into Engine::costs_
  sch::AttachMode attach = sch::AttachMode::network;
  std::uint32_t parent = kNone;  // a slot: its device
  float weight = 1;              // 1 a whole device, 1/n a slot of n
};

// A job running on slots: its speed (1 alone, less while its devices' slot leases demand more bandwidth than
// the device has) and when its remaining work was last brought up to date.
struct SlotRun {
  double rate = 1;
  double since = 0;
};

class Engine {
 public:
  Engine(const Trace& trace, const PoolSpec& pool, const SimOptions& options)
      : trace_(trace), pool_(pool), options_(options) {}

  Result<RunResult> run(const sch::PolicySpec& policy);

 private:
  Status setup(const sch::PolicySpec& policy);
  Status handle(sch::Decisions& out, double now);
  Status grant(const sch::Grant& g, double now);
  Status preempt(const sch::Preemption& p, double now, sch::Decisions& out);
  Status complete(std::uint32_t j, double now, sch::Decisions& out);
  // complete() for every job of `jobs` at once: one decision after all their devices are free.
  Status complete_together(const std::vector<std::uint32_t>& jobs, double now, sch::Decisions& out);
  // The engine's side of a completion: the job is done and its devices free.
  void finish_job(std::uint32_t j, double now);
  Status check_forgotten(std::uint32_t j);
  Status arrive(std::uint32_t j, double now, sch::Decisions& out);
  Status self_check(double now);
  void schedule_tick(double now);
  void sample_queue(double now);
  void progress(double now, bool last);
  Error internal(const std::string& what) const { return make_error(Errc::internal, what); }
  std::string job_name(std::uint32_t j) const { return "job " + std::to_string(trace_.jobs[order_[j]].id); }
  const Job& job(std::uint32_t j) const { return trace_.jobs[order_[j]]; }

  const Trace& trace_;
  const PoolSpec& pool_;
  const SimOptions& options_;

  std::unique_ptr<sch::Scheduler> sched_;
  sch::NameTable kinds_, bitstreams_, tenants_, hosts_, labels_;
  std::map<sch::KindId, std::vector<double>> shares_;  // slot kinds: the share of each shape (model)
  std::vector<DeviceInfo> devices_;
  std::vector<ModelCost> costs_;  // of each device group of the pool
  // Per job index (the request id, replay order). The trace's Job records are large, so the run reads each
  // of them once in setup and keeps compact copies of what it needs.
  std::vector<std::uint32_t> order_;  // job index -> position in trace_.jobs
  std::vector<sch::Request> requests_;
  std::vector<JobState> state_;
  std::vector<std::uint64_t> ids_;  // Job::id
  std::vector<double> arrival_;
  std::vector<double> runtime_;
  std::vector<double> first_start_;  // -1 until the first grant
  void free_lease(JobState& s);
  // Slot jobs (interference): brings a running slot job's remaining work up to `now` at its current rate.
  void settle(std::uint32_t j, double now);
  // Adds (+1) or removes (-1) a slot job's demand on its devices, then re-rates every slot job on them.
  void change_demand(std::uint32_t j, int sign, double now);
  bool on_slots(std::uint32_t j) const { return devices_[state_[j].first_device].parent != kNone; }
  std::vector<double> device_demand_;                  // by device: demand of the slot leases on its slots
  std::vector<std::vector<std::uint32_t>> slot_jobs_;  // by device: jobs running on its slots
  std::vector<SlotRun> slot_run_;                      // by job index; empty unless the pool has slots
  std::uint64_t top_devices_ = 0;                      // devices, not counting slots
  std::priority_queue<Event, std::vector<Event>, std::greater<>> heap_;
  std::optional<double> pending_tick_;
  std::optional<double> ticked_at_;  // time of the last tick, while no other event has happened since

  // Self-check only: jobs that arrived and are not done, with each one's position in the list.
  std::vector<std::uint32_t> active_;
  std::vector<std::uint32_t> active_pos_;

  std::uint64_t busy_ = 0;
  std::uint64_t events_ = 0;
  std::uint64_t done_ = 0;
  std::uint64_t reconfigs_ = 0;
  std::uint64_t preemptions_ = 0;
  std::uint64_t max_waiting_ = 0;
  double held_device_s_ = 0;
  double useful_device_s_ = 0;

  std::vector<QueueSample> queue_;
  double sample_dt_ = 1;
  double next_sample_ = 0;

  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_progress_;
  bool printed_ = false;
};

Status Engine::setup(const sch::PolicySpec& policy) {
  if (trace_.jobs.empty()) return make_error(Errc::invalid_argument, "the trace has no jobs");
  if (trace_.jobs.size() >= kNone) return make_error(Errc::invalid_argument, "the trace has too many jobs");
  if (options_.restore_s < 0 || !std::isfinite(options_.restore_s)) {
    return make_error(Errc::invalid_argument, "restore_s must be a finite number >= 0");
  }
  std::string error;
  sched_ = sch::Scheduler::create(policy, &error);
  if (!sched_) return make_error(Errc::invalid_argument, "policy " + policy.to_string() + ": " + error);
  if (options_.learning.warmup < 1 || !(options_.learning.half_life > 0)) {
    return make_error(Errc::invalid_argument, "learning: warmup must be >= 1 and half_life > 0");
  }
  sched_->set_estimator(sch::RuntimeEstimator(options_.learning));

  // Pool: hosts and devices in declaration order get dense ids.
  if (pool_.hosts.empty()) return make_error(Errc::invalid_argument, "the pool has no hosts");
  std::map<std::pair<sch::KindId, sch::HostId>, std::uint64_t> passthrough;  // reachable counts
  std::map<sch::KindId, std::uint64_t> network;
  sch::Decisions out;
  for (const auto& h : pool_.hosts) {
    if (hosts_.find(h.name))
      return make_error(Errc::invalid_argument, "pool: host \"" + h.name + "\" is declared twice");
    const sch::HostId host = hosts_.intern(h.name);
    for (const auto& g : h.devices) {
      const sch::KindId kind = kinds_.intern(g.kind);
      const ModelCost& cost = pool_.cost(g.model);
      if (cost.reconfig_s < 0 || cost.attach_s < 0 || !std::isfinite(cost.reconfig_s) ||
          !std::isfinite(cost.attach_s)) {
        return make_error(Errc::invalid_argument, "pool: model \"" + g.model + "\" has a negative or non-finite cost");
      }
      const auto cost_index = static_cast<std::uint32_t>(costs_.size());
      costs_.push_back(cost);
      if (g.slots > 0 && !(g.slot_share > 0 && g.slot_share <= 1)) {
        return make_error(Errc::invalid_argument, "pool: slot_share must be in (0, 1], got " + fmt_num(g.slot_share));
      }
      // Slot shapes are the slot kind's models, one per distinct share.
      sch::KindId slot_kind = 0;
      sch::ModelId shape = 0;
      if (g.slots > 0) {
        slot_kind = kinds_.intern(g.kind + kSlotKindSuffix);
        std::vector<double>& shares = shares_[slot_kind];
        auto it = std::find(shares.begin(), shares.end(), g.slot_share);
        if (it == shares.end() && shares.size() >= sch::kMaxModelsPerKind) {
          return make_error(Errc::invalid_argument, "pool: too many slot shares for kind " + g.kind);
        }
        if (it == shares.end()) it = shares.insert(shares.end(), g.slot_share);
        shape = static_cast<sch::ModelId>(it - shares.begin());
      }
      auto count_reachable = [&](sch::KindId k, std::uint64_t n) {
        if (g.attach == sch::AttachMode::network) {
          network[k] += n;
        } else {
          passthrough[{k, host}] += n;
        }
      };
      for (std::uint32_t i = 0; i < g.count; ++i) {
        sch::Device d;
        d.id = static_cast<sch::DeviceId>(devices_.size());
        d.host = host;
        d.kind = kind;
        d.attach = g.attach;
        if (auto rej = sched_->add_device(d, 0, out)) {
          return internal("scheduler rejected device " + std::to_string(d.id) + ": " + rej->error);
        }
        devices_.push_back({host, kind, kNone, kNone, cost_index, g.attach});
        ++top_devices_;
        count_reachable(kind, 1);
        const sch::DeviceId parent = d.id;
        for (std::uint32_t k = 0; k < g.slots; ++k) {
          sch::Device slot = d;
          slot.id = static_cast<sch::DeviceId>(devices_.size());
          slot.kind = slot_kind;
          slot.model = shape;
          if (auto rej = sched_->add_slot(slot, parent, 0, out)) {
            return internal("scheduler rejected slot " + std::to_string(slot.id) + ": " + rej->error);
          }
          devices_.push_back(
              {host, slot_kind, kNone, kNone, cost_index, g.attach, parent, 1.0F / static_cast<float>(g.slots)});
        }
        if (g.slots > 0) count_reachable(slot_kind, g.slots);
      }
    }
  }
  if (devices_.empty()) return make_error(Errc::invalid_argument, "the pool has no devices");
  if (!shares_.empty()) {
    device_demand_.assign(devices_.size(), 0.0);
    slot_jobs_.resize(devices_.size());
  }
  if (!out.empty()) return internal("scheduler made decisions with no requests");

  // Jobs: replay order is (arrival, id); the request id is the position in that order. The Job records are
  // large: one pass checks them, a second (in replay order) fills the per-job arrays. Traces usually come
  // sorted by arrival with increasing ids; then neither the order nor the id check needs a sort.
  const auto n = static_cast<std::uint32_t>(trace_.jobs.size());
  bool in_order = true;        // sorted by (arrival, id)
  bool ids_increasing = true;  // so no id repeats
  for (std::uint32_t i = 0; i < n; ++i) {
    const Job& jb = trace_.jobs[i];
    auto bad = [&](const char* what) {
      return make_error(Errc::invalid_argument, "job " + std::to_string(jb.id) + ": " + what);
    };
    if (!std::isfinite(jb.arrival_s) || jb.arrival_s < 0) return bad("arrival_s must be a finite number >= 0");
    if (!std::isfinite(jb.runtime_s) || jb.runtime_s < 0) return bad("runtime_s must be a finite number >= 0");
    if (jb.devices == 0) return bad("devices must be >= 1");
    if (i > 0) {
      const Job& prev = trace_.jobs[i - 1];
      ids_increasing = ids_increasing && prev.id < jb.id;
      in_order = in_order && (prev.arrival_s != jb.arrival_s ? prev.arrival_s < jb.arrival_s : prev.id < jb.id);
    }
  }
  if (!ids_increasing) {
    std::vector<std::uint64_t> ids(n);
    for (std::uint32_t i = 0; i < n; ++i) ids[i] = trace_.jobs[i].id;
    std::sort(ids.begin(), ids.end());
    auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end()) return make_error(Errc::invalid_argument, "job " + std::to_string(*dup) + ": id used twice");
  }
  order_.resize(n);
  if (in_order) {
    std::iota(order_.begin(), order_.end(), 0U);
  } else {
    // Sort compact keys rather than the Job records.
    struct Key {
      double arrival;
      std::uint64_t id;
      std::uint32_t index;
    };
    std::vector<Key> keys(n);
    for (std::uint32_t i = 0; i < n; ++i) keys[i] = {trace_.jobs[i].arrival_s, trace_.jobs[i].id, i};
    std::sort(keys.begin(), keys.end(),
              [](const Key& a, const Key& b) { return a.arrival != b.arrival ? a.arrival < b.arrival : a.id < b.id; });
    for (std::uint32_t j = 0; j < n; ++j) order_[j] = keys[j].index;
  }
  requests_.resize(n);
  state_.resize(n);
  ids_.resize(n);
  arrival_.resize(n);
  runtime_.resize(n);
  first_start_.assign(n, -1.0);
  if (!shares_.empty()) slot_run_.resize(n);
  // Names repeat across jobs: look them up by view in small caches (no string copies), and remember the
  // reachable device count of the last (kind, host).
  std::unordered_map<std::string_view, std::uint32_t> tenant_ids, bitstream_ids, label_ids;
  auto cached = [](std::unordered_map<std::string_view, std::uint32_t>& cache, sch::NameTable& table,
                   const std::string& name) {
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    const std::uint32_t id = table.intern(name);
    cache.emplace(name, id);
    return id;
  };
  const std::string* last_kind_name = nullptr;
  const std::string* last_host_name = nullptr;
  sch::KindId last_kind = 0;
  sch::HostId last_host = 0;
  std::uint64_t last_reachable = 0;
  for (std::uint32_t j = 0; j < n; ++j) {
    const Job& jb = job(j);
    if (!last_kind_name || jb.kind != *last_kind_name || jb.host != *last_host_name) {
      auto kind = kinds_.find(jb.kind);
      if (!kind)
        return make_error(Errc::invalid_argument,
                          job_name(j) + ": the pool has no devices of kind \"" + jb.kind + "\"");
      sch::HostId host = 0;
      if (!jb.host.empty()) {
        auto h = hosts_.find(jb.host);
        if (!h) return make_error(Errc::invalid_argument, job_name(j) + ": the pool has no host \"" + jb.host + "\"");
        host = *h;
      }
      std::uint64_t reachable = 0;
      if (auto it = network.find(*kind); it != network.end()) reachable += it->second;
      if (auto it = passthrough.find({*kind, host}); it != passthrough.end()) reachable += it->second;
      last_kind_name = &jb.kind;
      last_host_name = &jb.host;
      last_kind = *kind;
      last_host = host;
      last_reachable = reachable;
    }
    const sch::KindId kind = last_kind;
    const sch::HostId host = last_host;
    const std::uint64_t reachable = last_reachable;
    if (jb.devices > reachable) {
      return make_error(Errc::invalid_argument, job_name(j) + " asks for " + std::to_string(jb.devices) + " " +
                                                    jb.kind + " devices but only " + std::to_string(reachable) +
                                                    " are reachable from host \"" + hosts_.name(host) + "\"");
    }
    sch::Request& r = requests_[j];
    r.id = j;
    r.tenant = cached(tenant_ids, tenants_, jb.tenant);
    r.kind = kind;
    r.bitstream = jb.bitstream.empty() ? sch::kNoBitstream : cached(bitstream_ids, bitstreams_, jb.bitstream);
    r.label = jb.label.empty() ? sch::kNoLabel : cached(label_ids, labels_, jb.label);
    r.count = jb.devices;
    r.guest_host = host;
    if (auto shares = shares_.find(kind); shares != shares_.end()) {
      if (!(jb.demand >= 0 && jb.demand <= 1))
        return make_error(Errc::invalid_argument, job_name(j) + ": demand must be in [0, 1]");
      r.models = sch::shapes_admitting(shares->second, 1.0, jb.demand);
      r.demand = jb.demand;
      if (r.models == 0) {
        return make_error(Errc::invalid_argument,
                          job_name(j) + ": demand " + fmt_num(jb.demand) + " exceeds the share of every slot");
      }
    }
    r.estimate_s = jb.estimate_s;
    r.arrival = jb.arrival_s;
    JobState& s = state_[j];
    s.remaining = jb.runtime_s;
    s.count = jb.devices;
    ids_[j] = jb.id;
    arrival_[j] = jb.arrival_s;
    runtime_[j] = jb.runtime_s;
  }

  // Queue samples start at the first arrival; the interval doubles whenever the buffer fills.
  const double span = std::max(1.0, arrival_[n - 1] - arrival_[0]);
  sample_dt_ = span / static_cast<double>(std::max<std::size_t>(options_.max_queue_samples, 16));
  next_sample_ = arrival_[0];
  return Status::ok();
}

void Engine::sample_queue(double now) {
  const std::size_t cap = std::max<std::size_t>(options_.max_queue_samples, 16);
  while (next_sample_ <= now) {
    queue_.push_back({next_sample_, sched_->waiting_count(), busy_});
    next_sample_ += sample_dt_;
    if (queue_.size() >= cap) {
      // Keep every other sample: the series stays evenly spaced at twice the interval.
      std::size_t k = 0;
      for (std::size_t i = 0; i < queue_.size(); i += 2) queue_[k++] = queue_[i];
      queue_.resize(k);
      sample_dt_ *= 2;
      next_sample_ = queue_.back().t + sample_dt_;
    }
  }
}

Status Engine::grant(const sch::Grant& g, double now) {
  if (g.request >= state_.size()) return internal("grant for unknown request " + std::to_string(g.request));
  const auto j = static_cast<std::uint32_t>(g.request);
  JobState& s = state_[j];
  if (!s.arrived || s.running || s.done) return internal("grant for " + job_name(j) + " which is not waiting");
  if (g.devices.size() != s.count) {
    return internal("grant for " + job_name(j) + " has " + std::to_string(g.devices.size()) +
                    " devices, it asked for " + std::to_string(s.count));
  }
  double reconfig = 0;
  double attach = 0;
  float weight = 0;
  std::uint32_t* link = &s.first_device;
  for (const auto& dg : g.devices) {
    if (dg.device >= devices_.size()) return internal("grant of unknown device " + std::to_string(dg.device));
    DeviceInfo& d = devices_[dg.device];
    if (d.holder != kNone) {
      return internal("device " + std::to_string(dg.device) + " granted to " + job_name(j) + " while held by " +
                      job_name(d.holder));
    }
    if (d.kind != requests_[j].kind)
      return internal("device " + std::to_string(dg.device) + " of another kind granted to " + job_name(j));
    if (d.attach == sch::AttachMode::passthrough && d.host != requests_[j].guest_host) {
      return internal("passthrough device " + std::to_string(dg.device) + " granted to a guest on another host (" +
                      job_name(j) + ")");
    }
    d.holder = j;
    *link = dg.device;
    link = &d.next_in_lease;
    const ModelCost& cost = costs_[d.cost];
    weight += d.weight;
    if (dg.reprogram) {
      reconfig = std::max(reconfig, d.parent == kNone ? cost.reconfig_s : cost.partial_reconfig_s);
      ++s.reconfigs;
      ++reconfigs_;
    }
    attach = std::max(attach, cost.attach_s);
  }
  *link = kNone;
  const double setup = reconfig + attach + (s.preemptions > 0 ? options_.restore_s : 0);
  if (first_start_[j] < 0) first_start_[j] = now;
  s.running = true;
  s.lease_start = now;
  s.run_start = now + setup;
  s.weight = weight;
  ++s.gen;
  busy_ += s.count;
  heap_.push({s.run_start + s.remaining, EventType::completion, j, s.gen});
  if (!slot_run_.empty() && on_slots(j)) {
    slot_run_[j] = {1.0, now};
    change_demand(j, +1, now);
  }
  return Status::ok();
}

void Engine::settle(std::uint32_t j, double now) {
  JobState& s = state_[j];
  SlotRun& run = slot_run_[j];
  const double from = std::max(s.run_start, run.since);
  if (now > from) {
    const double work = std::min(s.remaining, run.rate * (now - from));
    s.remaining -= work;
    useful_device_s_ += s.weight * work;
  }
  run.since = std::max(run.since, now);
  s.run_start = std::max(s.run_start, now);  // the work before now is counted: progress restarts from here
}

void Engine::change_demand(std::uint32_t j, int sign, double now) {
  const double demand = job(j).demand * sign;
  std::vector<std::uint32_t> boards;
  for (std::uint32_t d = state_[j].first_device; d != kNone; d = devices_[d].next_in_lease) {
    const std::uint32_t board = devices_[d].parent;
    device_demand_[board] += demand;
    auto& jobs = slot_jobs_[board];
    if (sign > 0) {
      jobs.push_back(j);
    } else {
      jobs.erase(std::find(jobs.begin(), jobs.end(), j));
    }
    if (std::find(boards.begin(), boards.end(), board) == boards.end()) boards.push_back(board);
  }
  // Every slot job on those devices runs at the speed its most crowded device allows from now on.
  std::vector<std::uint32_t> affected;
  for (std::uint32_t board : boards) {
    for (std::uint32_t k : slot_jobs_[board]) {
      if (std::find(affected.begin(), affected.end(), k) == affected.end()) affected.push_back(k);
    }
  }
  for (std::uint32_t k : affected) {
    settle(k, now);
    JobState& s = state_[k];
    double rate = 1;
    for (std::uint32_t d = s.first_device; d != kNone; d = devices_[d].next_in_lease) {
      rate = std::min(rate, 1.0 / sch::slowdown(device_demand_[devices_[d].parent], 1.0));
    }
    slot_run_[k].rate = rate;
    ++s.gen;
    heap_.push({s.run_start + s.remaining / rate, EventType::completion, k, s.gen});
  }
}

// Gives the devices of the job's lease back: no holder, no chain.
void Engine::free_lease(JobState& s) {
  for (std::uint32_t d = s.first_device; d != kNone;) {
    DeviceInfo& info = devices_[d];
    d = info.next_in_lease;
    info.holder = kNone;
    info.next_in_lease = kNone;
  }
  s.first_device = kNone;
  busy_ -= s.count;
}

Status Engine::preempt(const sch::Preemption& p, double now, sch::Decisions& out) {
  if (p.request >= state_.size()) return internal("preemption of unknown request " + std::to_string(p.request));
  const auto j = static_cast<std::uint32_t>(p.request);
  JobState& s = state_[j];
  if (!s.running) return internal("preemption of " + job_name(j) + " which is not running");
  if (!slot_run_.empty() && on_slots(j)) {
    settle(j, now);
    change_demand(j, -1, now);
  }
  const double progress = std::clamp(now - s.run_start, 0.0, s.remaining);
  s.remaining -= progress;
  const double weight = s.weight;
  useful_device_s_ += weight * progress;
  held_device_s_ += weight * (now - s.lease_start);
  free_lease(s);
  s.running = false;
  ++s.gen;
  ++s.preemptions;
  ++preemptions_;
  if (auto rej = sched_->requeue(p.request, now, out)) {
    return internal("scheduler rejected requeue of " + job_name(j) + ": " + rej->error);
  }
  return Status::ok();
}

Status Engine::handle(sch::Decisions& out, double now) {
  std::size_t gi = 0;
  std::size_t pi = 0;
  // A preemption frees devices for at most one grant each, so an event that keeps producing decisions far
  // beyond the pool's size is a scheduler livelock (grant, preempt, grant back, ...): stop it.
  const std::size_t limit = 4 * (devices_.size() + sched_->waiting_count()) + 1024;
  // requeue() appends to `out` while we walk it: index, never iterate.
  while (gi < out.grants.size() || pi < out.preemptions.size()) {
    if (gi + pi > limit) {
      std::string recent;
      for (std::size_t k = pi >= 6 ? pi - 6 : 0; k < pi; ++k) {
        recent += (recent.empty() ? "" : ", ") + job_name(static_cast<std::uint32_t>(out.preemptions[k].request));
      }
      return internal("scheduler livelock at t=" + fmt_num(now) + ": " + std::to_string(gi) + " grants and " +
                      std::to_string(pi) + " preemptions in one event (last preempted: " + recent + ")");
    }
    while (gi < out.grants.size()) {
      // grant() does not call the scheduler, so `out` stays put while the reference lives.
      if (auto st = grant(out.grants[gi++], now); !st) return st;
    }
    while (pi < out.preemptions.size() && gi == out.grants.size()) {
      const sch::Preemption p = out.preemptions[pi++];
      if (auto st = preempt(p, now, out); !st) return st;
    }
  }
  out.grants.clear();
  out.preemptions.clear();
  return Status::ok();
}

Status Engine::arrive(std::uint32_t j, double now, sch::Decisions& out) {
  state_[j].arrived = true;
  if (options_.self_check) {
    if (active_pos_.empty()) active_pos_.resize(state_.size());
    active_pos_[j] = static_cast<std::uint32_t>(active_.size());
    active_.push_back(j);
  }
  if (auto rej = sched_->submit(requests_[j], now, out)) {
    return make_error(Errc::invalid_argument, job_name(j) + ": the scheduler rejected it: " + rej->error);
  }
  return Status::ok();
}

Status Engine::complete(std::uint32_t j, double now, sch::Decisions& out) {
  finish_job(j, now);
  if (auto rej = sched_->release(j, now, out)) {
    return internal("scheduler rejected release of " + job_name(j) + ": " + rej->error);
  }
  return check_forgotten(j);
}

Status Engine::complete_together(const std::vector<std::uint32_t>& jobs, double now, sch::Decisions& out) {
  std::vector<sch::RequestId> ids;
  ids.reserve(jobs.size());
  for (std::uint32_t j : jobs) {
    finish_job(j, now);
    ids.push_back(j);
  }
  if (auto rej = sched_->release(ids, now, out)) return internal("scheduler rejected a batch release: " + rej->error);
  for (std::uint32_t j : jobs) {
    if (auto st = check_forgotten(j); !st) return st;
  }
  return Status::ok();
}

void Engine::finish_job(std::uint32_t j, double now) {
  JobState& s = state_[j];
  if (!slot_run_.empty() && on_slots(j)) {
    settle(j, now);
    change_demand(j, -1, now);
  }
  const double weight = s.weight;
  useful_device_s_ += weight * s.remaining;
  held_device_s_ += weight * (now - s.lease_start);
  s.remaining = 0;
  free_lease(s);
  s.running = false;
  s.done = true;
  s.finish = now;
  ++done_;
}

Status Engine::check_forgotten(std::uint32_t j) {
  if (options_.self_check) {
    if (sched_->phase(j)) return internal("invariant: the scheduler still knows finished " + job_name(j));
    const std::uint32_t pos = active_pos_[j];
    active_[pos] = active_.back();
    active_pos_[active_[pos]] = pos;
    active_.pop_back();
  }
  return Status::ok();
}

void Engine::schedule_tick(double now) {
  auto w = sched_->next_wakeup();
  if (!w) return;
  const double t = std::max(*w, now);
  // The scheduler is a pure function of its state and the time: a second tick at the same time with no
  // event in between cannot decide anything new, even if next_wakeup() still says it is due.
  if (ticked_at_ && t <= *ticked_at_) return;
  if (pending_tick_ && *pending_tick_ <= t) return;
  pending_tick_ = t;
  heap_.push({t, EventType::tick, 0, 0});
}

Status Engine::self_check(double now) {
  std::uint64_t held = 0;
  for (const std::uint32_t j : active_) {
    const JobState& s = state_[j];
    auto phase = sched_->phase(j);
    if (s.running) {
      std::uint32_t chained = 0;
      for (std::uint32_t d = s.first_device; d != kNone && chained <= s.count; d = devices_[d].next_in_lease) {
        if (devices_[d].holder != j) return internal("invariant: device " + std::to_string(d) + " is held twice");
        ++chained;
      }
      if (chained != s.count) return internal("invariant: the lease of " + job_name(j) + " lists the wrong devices");
      held += s.count;
      if (phase != sch::RequestPhase::running) {
        return internal("invariant: " + job_name(j) + " runs but the scheduler does not say it is running");
      }
    } else if (phase != sch::RequestPhase::waiting) {
      return internal("invariant: " + job_name(j) + " waits but the scheduler does not say it is waiting");
    }
  }
  if (held != busy_) return internal("invariant: busy device count drifted");
  // Devices no lease holds are free, on hold, or shared (a device with a slot in use, a slot of a leased device).
  const std::size_t idle = sched_->free_count() + sched_->count_in_state(sch::DeviceState::holding) +
                           sched_->count_in_state(sch::DeviceState::shared);
  if (idle + busy_ != devices_.size()) {
    return internal("invariant: scheduler has " + std::to_string(sched_->free_count()) + " free devices, expected " +
                    std::to_string(devices_.size() - busy_) + " at t=" + fmt_num(now));
  }
  if (!options_.check_work_conserving) return Status::ok();
  std::map<std::pair<sch::KindId, sch::HostId>, std::uint64_t> free_pt;
  std::map<sch::KindId, std::uint64_t> free_net;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    if (sched_->device_state(static_cast<sch::DeviceId>(d)) != sch::DeviceState::free) continue;
    if (devices_[d].attach == sch::AttachMode::network) {
      ++free_net[devices_[d].kind];
    } else {
      ++free_pt[{devices_[d].kind, devices_[d].host}];
    }
  }
  for (const std::uint32_t j : active_) {
    const JobState& s = state_[j];
    if (s.running) continue;
    const sch::Request& r = requests_[j];
    std::uint64_t avail = free_net[r.kind] + free_pt[{r.kind, r.guest_host}];
    if (avail >= r.count) {
      return internal("invariant: not work-conserving at t=" + fmt_num(now) + ": " + job_name(j) + " waits for " +
                      std::to_string(r.count) + " devices while " + std::to_string(avail) +
                      " fitting devices are free");
    }
  }
  return Status::ok();
}

void Engine::progress(double now, bool last) {
  if (!options_.progress) return;
  auto t = std::chrono::steady_clock::now();
  // Short runs print nothing; long ones refresh one line twice a second and end it with a newline.
  if (last ? !printed_ : t - last_progress_ < std::chrono::milliseconds(500)) return;
  last_progress_ = t;
  printed_ = true;
  const double wall = std::chrono::duration<double>(t - started_).count();
  std::fprintf(stderr, "\r%s: %llu/%zu jobs done, %zu waiting, sim t=%.0f s, %.1f s%s",
               options_.progress_label.empty() ? "sim" : options_.progress_label.c_str(),
               static_cast<unsigned long long>(done_), state_.size(), sched_->waiting_count(), now, wall,
               last ? "\n" : "   ");
  std::fflush(stderr);
}

Result<RunResult> Engine::run(const sch::PolicySpec& policy) {
  started_ = std::chrono::steady_clock::now();
  last_progress_ = started_;
  if (auto st = setup(policy); !st) return st.error();

  const auto n = static_cast<std::uint32_t>(order_.size());
  std::uint32_t next_arrival = 0;
  sch::Decisions out;
  double now = 0;
  while (next_arrival < n || !heap_.empty()) {
    // Completions and ticks before arrivals at the same time: freed devices are visible to newcomers.
    const bool take_arrival = next_arrival < n && (heap_.empty() || arrival_[next_arrival] < heap_.top().t);
    if (take_arrival) {
      const std::uint32_t j = next_arrival++;
      now = arrival_[j];
      ticked_at_.reset();
      sample_queue(now);
      if (auto st = arrive(j, now, out); !st) return st.error();
    } else {
      const Event e = heap_.top();
      heap_.pop();
      // Completions come in no particular order, so the next one's record is likely not in cache: start
      // loading it now, while this event is handled.
      if (!heap_.empty()) __builtin_prefetch(&state_[heap_.top().job]);
      now = e.t;
      if (e.type == EventType::completion) {
        const JobState& s = state_[e.job];
        if (!s.running || s.gen != e.gen) continue;  // stale: the lease was preempted
        ticked_at_.reset();
        sample_queue(now);
        if (options_.batch_completions) {
          // Every completion due now, in job order as the heap gives them, then one decision.
          std::vector<std::uint32_t> together{e.job};
          while (!heap_.empty() && heap_.top().t == now && heap_.top().type == EventType::completion) {
            const Event more = heap_.top();
            heap_.pop();
            const JobState& m = state_[more.job];
            if (m.running && m.gen == more.gen) together.push_back(more.job);
          }
          if (auto st = complete_together(together, now, out); !st) return st.error();
        } else if (auto st = complete(e.job, now, out); !st) {
          return st.error();
        }
      } else {
        if (pending_tick_ && *pending_tick_ == e.t) pending_tick_.reset();
        auto w = sched_->next_wakeup();
        if (!w || *w > now) {
          schedule_tick(now);
          continue;
        }
        sample_queue(now);
        sched_->tick(now, out);
        ticked_at_ = now;
      }
    }
    ++events_;
    if (auto st = handle(out, now); !st) return st.error();
    max_waiting_ = std::max<std::uint64_t>(max_waiting_, sched_->waiting_count());
    schedule_tick(now);
    if (options_.self_check) {
      if (auto st = self_check(now); !st) return st.error();
    }
    if ((events_ & 0xFFF) == 0) progress(now, false);
  }
  progress(now, true);

  if (done_ != n) {
    std::uint32_t j = 0;
    while (j < n && state_[j].done) ++j;
    return internal(std::to_string(n - done_) + " jobs never finished (first: " + job_name(j) +
                    "): the scheduler left them waiting with nothing left to happen");
  }

  RunResult r;
  r.policy = policy.to_string();
  r.jobs = n;
  r.devices = top_devices_;
  if (options_.keep_per_job) r.per_job.reserve(n);
  std::vector<double> jct;
  std::vector<double> wait;
  std::vector<double> slow;
  jct.reserve(n);
  wait.reserve(n);
  slow.reserve(n);
  double first_arrival = arrival_[0];
  double last_finish = 0;
  for (std::uint32_t j = 0; j < n; ++j) {
    const JobState& s = state_[j];
    const double jct_s = s.finish - arrival_[j];
    const double wait_s = first_start_[j] - arrival_[j];
    const double slowdown = jct_s / std::max(runtime_[j], 1.0);
    last_finish = std::max(last_finish, s.finish);
    jct.push_back(jct_s);
    wait.push_back(wait_s);
    slow.push_back(slowdown);
    if (!options_.keep_per_job) continue;
    JobResult jr;
    jr.id = ids_[j];
    jr.arrival_s = arrival_[j];
    jr.runtime_s = runtime_[j];
    jr.devices = s.count;
    jr.first_start_s = first_start_[j];
    jr.finish_s = s.finish;
    jr.jct_s = jct_s;
    jr.wait_s = wait_s;
    jr.slowdown = slowdown;
    jr.reconfigurations = s.reconfigs;
    jr.preemptions = s.preemptions;
    r.per_job.push_back(jr);
  }
  auto by_id = [](const JobResult& a, const JobResult& b) { return a.id < b.id; };
  if (!std::is_sorted(r.per_job.begin(), r.per_job.end(), by_id)) std::sort(r.per_job.begin(), r.per_job.end(), by_id);
  r.avg_jct_s = mean(jct);
  r.avg_wait_s = mean(wait);
  r.avg_slowdown = mean(slow);
  const auto jq = percentiles(jct, {0.50, 0.95, 0.99, 1.0});
  r.p50_jct_s = jq[0];
  r.p95_jct_s = jq[1];
  r.p99_jct_s = jq[2];
  r.max_jct_s = jq[3];
  r.p99_wait_s = percentiles(wait, {0.99})[0];
  r.p99_slowdown = percentiles(slow, {0.99})[0];
  r.makespan_s = last_finish - first_arrival;
  const double capacity = static_cast<double>(top_devices_) * r.makespan_s;
  r.utilization = capacity > 0 ? held_device_s_ / capacity : 0;
  r.useful_utilization = capacity > 0 ? useful_device_s_ / capacity : 0;
  r.lower_bound_avg_jct_s =
      options_.lower_bound_avg_jct_s ? *options_.lower_bound_avg_jct_s : lower_bound_avg_jct(trace_, top_devices_);
  r.reconfigurations = reconfigs_;
  r.preemptions = preemptions_;
  r.events = events_;
  r.max_waiting = max_waiting_;
  sample_queue(last_finish);
  r.queue = std::move(queue_);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return r;
}

}  // namespace

Result<RunResult> simulate(const Trace& trace, const PoolSpec& pool, const scheduler::PolicySpec& policy,
                           const SimOptions& options) {
  Engine engine(trace, pool, options);
  return engine.run(policy);
}

}  // namespace accelpool::sim
