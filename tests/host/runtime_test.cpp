// HostRuntime on the simulated backend: strands (order per device, parallel across devices), health, the image
// cache over real files in a scratch registry, and with a private libvirtd the real attacher (guest PCI address,
// quarantine, state file and reconcile).
#include <accelpool/backends/sim_backend.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/host/runtime.hpp>

#include <catch2/catch.hpp>

#include "hung_after.hpp"
#include "scratch_dir.hpp"
#include "sim_image.hpp"
#include "skip.hpp"

#ifdef ACCELPOOL_HOST_TEST_LIBVIRT
#include <accelpool/hypervisor/libvirt_attacher.hpp>

#include "libvirt_harness.hpp"
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <future>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace accelpool;
using namespace accelpool::host;
using accelpool::testing::eventually;
using accelpool::testing::kHungAfter;

namespace {

// A gate a sim programming waits at: it counts who is inside and lets them through once `needed` are inside at
// the same time (or the test opens it). `met` says whether they really were together.
class Gate {
 public:
  explicit Gate(int needed) : needed_(needed) {}
  void enter() {
    std::unique_lock lock(mu_);
    ++inside_;
    if (inside_ >= needed_) met_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, kHungAfter, [this] { return met_ || open_; });
    --inside_;
  }
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool met() const {
    std::lock_guard lock(mu_);
    return met_;
  }
  int inside() const {
    std::lock_guard lock(mu_);
    return inside_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int needed_;
  int inside_ = 0;
  bool met_ = false, open_ = false;
};

backends::SimConfig sim_config(int devices) {
  backends::SimConfig c;
  c.devices = {{"fpga", "sim-u250", devices}};
  c.program_base = std::chrono::milliseconds(1);
  return c;
}

struct Made {
  std::unique_ptr<HostRuntime> runtime;
  backends::SimBackend* sim = nullptr;  // owned by the runtime
};

Made make_runtime(backends::SimConfig config, backends::Sleeper sleeper = {}, std::unique_ptr<ImageSource> images = {},
                  RuntimeOptions options = {}, RuntimeEvents events = {},
                  std::unique_ptr<hypervisor::Attacher> attacher = {}) {
  auto sim = std::make_unique<backends::SimBackend>(std::move(config), std::move(sleeper));
  Made m;
  m.sim = sim.get();
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  list.push_back(std::move(sim));
  auto r = HostRuntime::create(std::move(options), std::move(list), std::move(images), std::move(attacher),
                               std::move(events));
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r.is_ok());
  m.runtime = std::move(*r);
  return m;
}

struct Prepared {
  Status status;
  PrepareResult result;
};

std::future<Prepared> prepare(HostRuntime& rt, PrepareRequest request) {
  auto p = std::make_shared<std::promise<Prepared>>();
  rt.prepare(request, [p](Status s, PrepareResult r) { p->set_value({std::move(s), std::move(r)}); });
  return p->get_future();
}

template <typename T>
T wait(std::future<T>& f) {
  REQUIRE(f.wait_for(kHungAfter) == std::future_status::ready);
  return f.get();
}

Prepared prepare_now(HostRuntime& rt, PrepareRequest request) {
  auto f = prepare(rt, std::move(request));
  return wait(f);
}

// The error of a prepare that must fail.
accelpool::Error refused(HostRuntime& rt, PrepareRequest request) {
  auto p = prepare_now(rt, std::move(request));
  REQUIRE_FALSE(p.status.is_ok());
  return p.status.error();
}

PrepareRequest program(const std::string& device, const std::string& bitstream, bool reprogram = false) {
  PrepareRequest r;
  r.device = device;
  r.bitstream = bitstream;
  r.reprogram = reprogram;
  return r;
}

std::string message_of(const Status& s) { return s ? std::string() : accelpool::describe(s.error()); }

// A registry folder holding one opaque image `name` for the sim model, with its bytes.
struct ScratchRegistry {
  accelpool::testing::ScratchDir dir{"host-registry"};
  std::filesystem::path image;
  std::shared_ptr<bitstreams::SharedRegistry> registry;

  // `edit` changes the manifest before it is written (a partial image, say).
  explicit ScratchRegistry(const std::string& name, const std::string& bytes,
                           const std::function<void(bitstreams::Manifest&)>& edit = {}) {
    image = dir.path() / (name + ".bin");
    write(bytes);
    auto manifest = accelpool::testing::sim_image_manifest(name, name + ".bin", bytes);
    if (edit) edit(manifest);
    std::ofstream(dir.path() / (name + "-1.toml")) << bitstreams::to_toml(manifest);
    auto r = bitstreams::SharedRegistry::open(dir.path());
    REQUIRE(r.is_ok());
    REQUIRE((*r)->list().size() == 1);
    registry = *r;
  }
  // Replaces the file (a new inode and times: a new version of the file, whatever its bytes).
  void write(const std::string& bytes) const {
    auto tmp = image;
    tmp += ".tmp";
    std::ofstream(tmp, std::ios::binary | std::ios::trunc) << bytes;
    std::filesystem::rename(tmp, image);
  }
};

// Wall time far enough ahead that every file in the scratch registry counts as settled (not written within the
// last second), so a verified stamp is remembered.
std::int64_t settled_wall_clock() {
  return static_cast<std::int64_t>(
             std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count()) +
         10'000'000'000;
}

}  // namespace

TEST_CASE("operations on one device run in the order they were asked", "[host]") {
  Gate gate(99);  // opened by hand: the first programming holds the strand until then
  bool first = true;
  std::mutex first_mu;
  auto m = make_runtime(sim_config(2), [&](std::chrono::nanoseconds) {
    std::unique_lock lock(first_mu);
    if (!first) return;
    first = false;
    lock.unlock();
    gate.enter();
  });
  std::mutex mu;
  std::vector<std::string> done;
  auto note = [&](std::string what) {
    std::lock_guard lock(mu);
    done.push_back(std::move(what));
  };
  m.runtime->prepare(program("sim:0", "a"),
                     [&](Status s, PrepareResult r) { note(message_of(s) + "prepare->" + r.loaded); });
  REQUIRE(eventually([&] { return gate.inside() == 1; }));
  m.runtime->prepare(program("sim:0", "b"),
                     [&](Status s, PrepareResult r) { note(message_of(s) + "prepare->" + r.loaded); });
  m.runtime->reset("sim:0", [&](Status s, std::string loaded) { note(message_of(s) + "reset->" + loaded); });
  m.runtime->prepare(program("sim:0", "b"),
                     [&](Status s, PrepareResult r) { note(message_of(s) + "prepare->" + r.loaded); });
  m.runtime->release("sim:0", [&](Status s, ReleaseResult r) { note(message_of(s) + "release->" + r.loaded); });
  gate.open();
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return done.size() == 5;
  }));
  CHECK(done == std::vector<std::string>{"prepare->a", "prepare->b", "reset->b", "prepare->b", "release->b"});
  // "b" was programmed once: the third prepare found the device holding it.
  CHECK(*m.sim->program_count("sim:0") == 2);
}

TEST_CASE("the devices of a gang are programmed at the same time", "[host]") {
  Gate gate(4);
  auto m = make_runtime(sim_config(4), [&](std::chrono::nanoseconds) { gate.enter(); });
  std::vector<std::future<Prepared>> pending;
  for (int i = 0; i < 4; ++i) pending.push_back(prepare(*m.runtime, program("sim:" + std::to_string(i), "gang")));
  for (auto& f : pending) {
    auto p = wait(f);
    INFO(message_of(p.status));
    CHECK(p.status.is_ok());
    CHECK(p.result.loaded == "gang");
  }
  CHECK(gate.met());  // all four were inside program() together
}

namespace {

// The simulated backend behind a backend that does not declare parallel_devices(), as XRT and OpenCL do not.
class SerialSim final : public backends::DeviceBackend {
 public:
  SerialSim(backends::SimConfig config, backends::Sleeper sleeper) : inner_(std::move(config), std::move(sleeper)) {}
  std::string_view name() const override { return "serial-sim"; }
  Result<std::vector<backends::DeviceInfo>> enumerate() override { return inner_.enumerate(); }
  Status program(std::string_view id, const backends::Image& image) override { return inner_.program(id, image); }
  Result<std::string> loaded(std::string_view id) override { return inner_.loaded(id); }
  Status reset(std::string_view id) override { return inner_.reset(id); }
  backends::HealthReport health(std::string_view id) override { return inner_.health(id); }

 private:
  backends::SimBackend inner_;
};

}  // namespace

TEST_CASE("a backend that does not declare parallel devices is called by one thread at a time", "[host]") {
  std::mutex mu;
  int inside = 0, most = 0;
  auto config = sim_config(4);
  config.program_base = std::chrono::milliseconds(20);  // each programming takes a while, as on hardware
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  list.push_back(std::make_unique<SerialSim>(config, [&](std::chrono::nanoseconds d) {
    {
      std::lock_guard lock(mu);
      most = std::max(most, ++inside);
    }
    std::this_thread::sleep_for(d);
    std::lock_guard lock(mu);
    --inside;
  }));
  auto rt = HostRuntime::create({}, std::move(list), {}, {}, {});
  REQUIRE(rt.is_ok());
  std::vector<std::future<Prepared>> pending;
  for (int i = 0; i < 4; ++i) pending.push_back(prepare(**rt, program("sim:" + std::to_string(i), "img")));
  for (auto& f : pending) CHECK(wait(f).status.is_ok());
  CHECK(most == 1);
}

TEST_CASE("a prepare answers the device's details and how the guest reaches it", "[host]") {
  RuntimeOptions o;
  o.host = "h1";
  o.unattached = AttachMode::in_process;
  auto m = make_runtime(sim_config(1), {}, {}, o);
  auto p = prepare_now(*m.runtime, program("sim:0", "vadd"));
  REQUIRE(p.status.is_ok());
  CHECK(p.result.loaded == "vadd");
  CHECK(p.result.attach == AttachMode::in_process);
  CHECK(p.result.guest_pci.empty());
  CHECK(p.result.details.kind == "fpga");
  CHECK(p.result.details.model == "sim-u250");

  auto unknown = prepare_now(*m.runtime, program("sim:7", "vadd"));
  REQUIRE_FALSE(unknown.status.is_ok());
  CHECK(unknown.status.error().code == Errc::not_found);
  CHECK(unknown.status.error().message.find("'h1'") != std::string::npos);
  CHECK(unknown.status.error().message.find("sim:7") != std::string::npos);

  // A device recorded for one VM (no attacher here) is not prepared for another until it is released.
  auto a = program("sim:0", "vadd");
  a.vm = "vm-a";
  REQUIRE(prepare_now(*m.runtime, a).status.is_ok());
  CHECK(m.runtime->devices().front().attach_state() == "recorded");
  auto b = a;
  b.vm = "vm-b";
  auto other = refused(*m.runtime, b);
  CHECK(other.code == Errc::invalid_state);
  CHECK(other.message.find("vm-a") != std::string::npos);
}

TEST_CASE("a device's slots are prepared by their own ids, each for its own VM, and listed with the device",
          "[host][slots]") {
  ScratchRegistry reg("kern", "partial image bytes", [](bitstreams::Manifest& m) {
    m.partial = true;
    m.slot_shape = "quarter";
  });
  auto config = sim_config(1);
  config.slots = 2;
  std::mutex mu;
  std::vector<std::string> health_of;  // the ids health changes were reported for
  RuntimeEvents events;
  events.health_changed = [&](const std::string& device, const std::string&, const std::string&) {
    std::lock_guard lock(mu);
    health_of.push_back(device);
  };
  auto m = make_runtime(config, {}, registry_images(reg.registry), {}, events);
  auto listed = m.runtime->devices();
  REQUIRE(listed.size() == 1);  // the device, with its slots
  CHECK(listed[0].info.local_id == "sim:0");
  CHECK(listed[0].info.slots == 2);

  auto a = program("sim:0:slot0", "kern");
  a.vm = "vm-a";
  auto b = program("sim:0:slot1", "kern");
  b.vm = "vm-b";
  auto pa = prepare(*m.runtime, a);
  auto pb = prepare(*m.runtime, b);
  for (auto* f : {&pa, &pb}) {
    auto p = wait(*f);
    INFO(message_of(p.status));
    REQUIRE(p.status.is_ok());
    CHECK(p.result.loaded == "kern");
    CHECK(p.result.details.kind == "fpga:slot");
    CHECK(p.result.details.model == "sim-u250");
    CHECK(p.result.attach == AttachMode::none);  // the device is passthrough: a slot is recorded, never hot-plugged
  }
  CHECK(*m.sim->program_count("sim:0:slot0") == 1);
  CHECK(*m.sim->program_count("sim:0:slot1") == 1);
  CHECK(*m.sim->program_count("sim:0") == 0);

  // Each slot serves its own VM; the whole device takes no partial image.
  auto c = b;
  c.vm = "vm-c";
  auto busy = refused(*m.runtime, c);
  CHECK(busy.code == Errc::invalid_state);
  CHECK(busy.message.find("vm-b") != std::string::npos);
  CHECK(refused(*m.runtime, program("sim:0", "kern")).code == Errc::incompatible);
  auto released = std::make_shared<std::promise<Status>>();
  m.runtime->release("sim:0:slot1", [released](Status s, ReleaseResult) { released->set_value(std::move(s)); });
  auto rf = released->get_future();
  REQUIRE(wait(rf).is_ok());
  REQUIRE(prepare_now(*m.runtime, c).status.is_ok());
  CHECK(refused(*m.runtime, program("sim:0:slot2", "kern")).code == Errc::not_found);

  // Health is the device's: a failure is reported for it, not for each slot.
  REQUIRE(m.sim->fail_device("sim:0", "burnt").is_ok());
  m.runtime->check_health();
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return !health_of.empty();
  }));
  m.runtime.reset();  // every queued check has finished
  CHECK(health_of == std::vector<std::string>{"sim:0"});
}

TEST_CASE("health is checked at create and on request, and changes are reported", "[host]") {
  auto config = sim_config(3);
  config.failed_devices = {"sim:2"};
  std::mutex mu;
  std::vector<std::string> changes;
  RuntimeEvents ev;
  ev.health_changed = [&](const std::string& id, const std::string& health, const std::string& detail) {
    std::lock_guard lock(mu);
    changes.push_back(id + "=" + health + (detail.empty() ? "" : ":" + detail));
  };
  auto m = make_runtime(config, {}, {}, {}, ev);
  // Known before create returns: a device configured failed is never offered as healthy.
  for (const auto& d : m.runtime->devices()) {
    CHECK(d.health == (d.info.local_id == "sim:2" ? "failed" : "ok"));
  }
  {
    std::lock_guard lock(mu);
    CHECK(changes == std::vector<std::string>{"sim:2=failed:failed by configuration"});
    changes.clear();
  }
  REQUIRE(m.sim->fail_device("sim:1", "fan stopped").is_ok());
  m.runtime->check_health();
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return changes == std::vector<std::string>{"sim:1=failed:fan stopped"};
  }));
  REQUIRE(m.sim->recover_device("sim:1").is_ok());
  m.runtime->check_health();
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return changes.size() == 2 && changes[1] == "sim:1=ok";
  }));
}

TEST_CASE("the runtime's own timer checks health", "[host]") {
  std::promise<std::string> failed;
  std::once_flag once;
  RuntimeOptions o;
  o.health_interval = std::chrono::milliseconds(10);
  RuntimeEvents ev;
  ev.health_changed = [&](const std::string& id, const std::string& health, const std::string&) {
    if (health == "failed") std::call_once(once, [&] { failed.set_value(id); });
  };
  auto m = make_runtime(sim_config(2), {}, {}, o, ev);
  REQUIRE(m.sim->fail_device("sim:0").is_ok());
  auto f = failed.get_future();
  CHECK(wait(f) == "sim:0");  // nobody called check_health()
}

TEST_CASE("an image is hashed once per version of its file, and never for a device that holds it", "[host]") {
  ScratchRegistry reg("img", std::string(4096, 'x'));
  RuntimeOptions o;
  o.wall_clock_ns = settled_wall_clock;
  auto m = make_runtime(sim_config(4), {}, registry_images(reg.registry), o);
  auto& rt = *m.runtime;

  auto first = prepare_now(rt, program("sim:0", "img"));
  INFO(message_of(first.status));
  REQUIRE(first.status.is_ok());
  CHECK(first.result.loaded == "img");
  CHECK(rt.image_hashes() == 1);

  // Another device: the file is unchanged, so the verification stands (cache hit).
  REQUIRE(prepare_now(rt, program("sim:1", "img")).status.is_ok());
  CHECK(rt.image_hashes() == 1);
  CHECK(*m.sim->program_count("sim:1") == 1);

  // A new version of the file (same bytes): hashed again.
  reg.write(std::string(4096, 'x'));
  REQUIRE(prepare_now(rt, program("sim:2", "img")).status.is_ok());
  CHECK(rt.image_hashes() == 2);

  // Changed bytes: the hash catches it, the device is not programmed.
  reg.write(std::string(4096, 'y'));
  auto bad = prepare_now(rt, program("sim:3", "img"));
  REQUIRE_FALSE(bad.status.is_ok());
  CHECK(bad.status.error().code == Errc::checksum_mismatch);
  CHECK(bad.result.loaded.empty());
  CHECK(*m.sim->program_count("sim:3") == 0);
  CHECK(rt.image_hashes() == 3);

  // A device that already holds the image: its (now corrupt) file is not read at all.
  auto held = prepare_now(rt, program("sim:0", "img"));
  INFO(message_of(held.status));
  CHECK(held.status.is_ok());
  CHECK(held.result.loaded == "img");
  CHECK(rt.image_hashes() == 3);
  CHECK(*m.sim->program_count("sim:0") == 1);
  // Also when the manager names the image by its sha256.
  auto by_sha = program("sim:1", "img");
  by_sha.sha256 = reg.registry->get("img")->manifest.sha256;
  std::filesystem::remove(reg.image);
  CHECK(prepare_now(rt, by_sha).status.is_ok());
  CHECK(rt.image_hashes() == 3);
  // Unless asked to reprogram.
  auto again = prepare_now(rt, program("sim:0", "img", true));
  REQUIRE_FALSE(again.status.is_ok());
  CHECK(again.status.error().code == Errc::missing_file);
}

TEST_CASE("an image whose sha256 belongs to another bitstream is refused", "[host]") {
  ScratchRegistry reg("img", "bytes");
  auto m = make_runtime(sim_config(1), {}, registry_images(reg.registry));
  auto r = program("sim:0", "other");
  r.sha256 = reg.registry->get("img")->manifest.sha256;
  auto p = prepare_now(*m.runtime, r);
  REQUIRE_FALSE(p.status.is_ok());
  CHECK(p.status.error().code == Errc::invalid_argument);
  CHECK(p.status.error().message.find("'img'") != std::string::npos);
  CHECK(*m.sim->program_count("sim:0") == 0);
}

TEST_CASE("create refuses bad backends with a clear error", "[host]") {
  std::vector<std::unique_ptr<backends::DeviceBackend>> none;
  auto empty = HostRuntime::create({}, std::move(none), {}, {}, {});
  REQUIRE_FALSE(empty.is_ok());
  CHECK(empty.error().code == Errc::invalid_argument);

  std::vector<std::unique_ptr<backends::DeviceBackend>> twice;
  twice.push_back(std::make_unique<backends::SimBackend>(sim_config(1)));
  twice.push_back(std::make_unique<backends::SimBackend>(sim_config(1)));
  auto dup = HostRuntime::create({}, std::move(twice), {}, {}, {});
  REQUIRE_FALSE(dup.is_ok());
  CHECK(dup.error().code == Errc::invalid_argument);
  CHECK(dup.error().message.find("'sim:0'") != std::string::npos);
}

#ifdef ACCELPOOL_HOST_TEST_LIBVIRT
TEST_CASE("a prepare with a VM hot-plugs the device, and an unacknowledged release quarantines it until the VM ends",
          "[host][libvirtd]") {
  std::string why;
  auto* daemon = hypervisor::testing::LibvirtDaemon::shared(&why);
  if (daemon == nullptr) ACCELPOOL_SKIP("no private libvirtd with the QEMU driver can run here: " << why);
  const std::string vm = "ap-host-" + std::to_string(getpid());
  hypervisor::testing::VmOptions vo;
  vo.name = vm;  // no OS: it never acknowledges an eject
  auto uuid = daemon->create_vm(vo);
  REQUIRE(uuid.is_ok());
  accelpool::testing::ScratchDir dir("host-state");
  const auto state_file = dir.path() / "attached";
  const std::string device = "sim:0";

  auto attacher = [&] {
    hypervisor::LibvirtOptions lo;
    lo.uri = daemon->uri();
    lo.detach_timeout = std::chrono::milliseconds(300);
    auto a = hypervisor::make_libvirt_attacher(lo);
    REQUIRE(a.is_ok());
    return std::move(*a);
  };
  std::mutex mu;
  std::vector<std::string> health;
  std::vector<VmStopped> stopped;
  RuntimeEvents ev;
  ev.health_changed = [&](const std::string& id, const std::string& h, const std::string&) {
    std::lock_guard lock(mu);
    health.push_back(id + "=" + h);
  };
  ev.vm_stopped = [&](const VmStopped& s) {
    std::lock_guard lock(mu);
    stopped.push_back(s);
  };
  RuntimeOptions o;
  o.state_file = state_file;
  auto m = make_runtime(sim_config(1), {}, {}, o, ev, attacher());

  auto request = program(device, "vadd");
  request.vm = vm;
  request.lease = "lease-7";
  auto p = prepare_now(*m.runtime, request);
  INFO(message_of(p.status));
  REQUIRE(p.status.is_ok());
  CHECK(p.result.attach == AttachMode::emulated);
  CHECK(std::regex_match(p.result.guest_pci, std::regex("0000:00:[01][0-9a-f]\\.0")));
  CHECK(m.runtime->devices().front().attach_state() == "attached");
  CHECK(m.runtime->devices().front().guest_pci == p.result.guest_pci);
  std::string listed;
  std::getline(std::ifstream(state_file), listed);
  CHECK(listed == vm);

  auto released = std::make_shared<std::promise<std::pair<Status, ReleaseResult>>>();
  m.runtime->release(device, [released](Status s, ReleaseResult r) {
    released->set_value({std::move(s), std::move(r)});
  });
  auto rf = released->get_future();
  auto [rs, rr] = wait(rf);
  REQUIRE_FALSE(rs.is_ok());
  CHECK(rs.error().code == Errc::quarantined);
  REQUIRE(rr.detach.has_value());
  CHECK(rr.detach->outcome == hypervisor::DetachOutcome::timed_out);
  CHECK(m.runtime->devices().front().health == "failed");
  CHECK(m.runtime->devices().front().attach_state() == "quarantined");
  auto refused = prepare_now(*m.runtime, request);
  REQUIRE_FALSE(refused.status.is_ok());
  CHECK(refused.status.error().code == Errc::invalid_state);

  // A restart reconciles from the state file: still quarantined in that VM.
  m.runtime.reset();
  auto again = make_runtime(sim_config(1), {}, {}, o, ev, attacher());
  auto d = again.runtime->devices().front();
  CHECK(d.vm == vm);
  CHECK(d.lease == "lease-7");
  CHECK(d.attach_state() == "quarantined");
  CHECK(d.health == "failed");

  // The VM ends: the device is free and healthy again.
  {
    std::lock_guard lock(mu);
    health.clear();
  }
  REQUIRE(daemon->destroy_vm(vm).is_ok());
  REQUIRE(eventually([&] {
    std::lock_guard lock(mu);
    return !stopped.empty() && !health.empty();
  }));
  {
    std::lock_guard lock(mu);
    CHECK(stopped.back().vm_name == vm);
    CHECK(stopped.back().devices == std::vector<std::string>{device});
    CHECK(health.back() == device + "=ok");
  }
  CHECK(again.runtime->devices().front().attach_state().empty());
}
#endif
