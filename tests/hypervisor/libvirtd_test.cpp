// The libvirt attacher against a real, private libvirtd with the QEMU driver and real QEMU VMs that have no
// OS (so a detach is never acknowledged). Skipped with a warning where such a daemon cannot run.
#include "libvirt_harness.hpp"

#include <accelpool/hypervisor/libvirt_attacher.hpp>
#include <accelpool/hypervisor/libvirt_xml.hpp>

#include <catch2/catch.hpp>

#include "hung_after.hpp"
#include "skip.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <regex>

using namespace accelpool;
using namespace accelpool::hypervisor;
using namespace std::chrono_literals;

namespace {

hypervisor::testing::LibvirtDaemon* daemon_or_warn() {
  std::string why;
  auto* d = hypervisor::testing::LibvirtDaemon::shared(&why);
  if (d == nullptr) accelpool::testing::skip("no private libvirtd with the QEMU driver can run here: " + why);
  return d;
}

#define REQUIRE_LIBVIRTD(name)   \
  auto* name = daemon_or_warn(); \
  if ((name) == nullptr) return

std::string vm_name(const char* what) { return "ap-" + std::to_string(getpid()) + "-" + what; }

std::string start_vm(hypervisor::testing::LibvirtDaemon& d, const std::string& name) {
  hypervisor::testing::VmOptions o;
  o.name = name;
  auto uuid = d.create_vm(o);
  INFO((uuid.is_ok() ? std::string() : uuid.error().message));
  REQUIRE(uuid.is_ok());
  return *uuid;
}

std::unique_ptr<Attacher> attacher_for(hypervisor::testing::LibvirtDaemon& d,
                                       std::chrono::milliseconds detach_timeout) {
  LibvirtOptions o;
  o.uri = d.uri();
  o.detach_timeout = detach_timeout;
  auto a = make_libvirt_attacher(o);
  INFO((a.is_ok() ? std::string() : a.error().message));
  REQUIRE(a.is_ok());
  return std::move(*a);
}

DeviceSpec sim(const std::string& id, const std::string& lease) {
  return DeviceSpec{id, lease, AttachMethod::emulated, ""};
}

std::vector<std::string> live_aliases(hypervisor::testing::LibvirtDaemon& d, const std::string& vm) {
  auto xml = d.live_xml(vm);
  REQUIRE(xml.is_ok());
  auto aliases = device_aliases(*xml);
  REQUIRE(aliases.is_ok());
  return *aliases;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The alias `device` carries in `vm`, as the attacher recorded it.
std::string recorded_alias(Attacher& attacher, const std::string& vm, const std::string& device) {
  auto records = attacher.list_attached(vm);
  REQUIRE(records.is_ok());
  auto it =
      std::find_if(records->begin(), records->end(), [&](const AttachedDevice& r) { return r.device_id == device; });
  REQUIRE(it != records->end());
  return it->alias;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Records the events an attacher reports (it becomes the attacher's event handler).
class EventLog {
 public:
  explicit EventLog(Attacher& attacher) {
    attacher.set_event_handler([this](const HypervisorEvent& e) {
      std::lock_guard lock(m_);
      events_.push_back(e);
      cv_.notify_all();
    });
  }
  // All events so far once there are at least `n`; nullopt when fewer arrive within kHungAfter.
  std::optional<std::vector<HypervisorEvent>> wait_for(std::size_t n) {
    std::unique_lock lock(m_);
    if (!cv_.wait_for(lock, accelpool::testing::kHungAfter, [&] { return events_.size() >= n; })) return std::nullopt;
    return events_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<HypervisorEvent> events_;
};

}  // namespace

TEST_CASE("a simulated device hot-plugs into a running VM and its record survives a new connection",
          "[hypervisor][libvirtd]") {
  REQUIRE_LIBVIRTD(daemon);
  const std::string vm = vm_name("attach");
  const std::string uuid = start_vm(*daemon, vm);
  auto attacher = attacher_for(*daemon, 500ms);
  const std::string dev0 = daemon->unique_device_id("sim:0");
  const std::string dev1 = daemon->unique_device_id("sim:1");

  const auto t0 = std::chrono::steady_clock::now();
  auto st = attacher->attach(vm, sim(dev0, "lease-0"));
  const double attach_ms = ms_since(t0);
  INFO((st.is_ok() ? std::string() : st.error().message));
  REQUIRE(st.is_ok());
  std::printf("hypervisor: live attach of an ivshmem-plain device took %.1f ms\n", attach_ms);

  // Visible in the live domain definition, backed by its shared-memory region, at the guest PCI address that
  // attach returned (the one libvirt assigned: a slot on the guest's PCI bus 0).
  auto xml = daemon->live_xml(vm);
  REQUIRE(xml.is_ok());
  CHECK(std::regex_match(*st, std::regex("0000:00:[01][0-9a-f]\\.0")));
  const std::string alias0 = recorded_alias(*attacher, vm, dev0);
  auto parsed_alias0 = parse_device_alias(alias0);
  REQUIRE(parsed_alias0.is_ok());
  CHECK(parsed_alias0->device_id == dev0);
  CHECK(parsed_alias0->attachment.has_value());
  auto listed_at = guest_pci_address(*xml, alias0);
  REQUIRE(listed_at.is_ok());
  CHECK(*listed_at == *st);
  CHECK(xml->find("<shmem name='" + shmem_name(dev0) + "'>") != std::string::npos);
  CHECK(xml->find("<model type='ivshmem-plain'/>") != std::string::npos);
  CHECK(contains(live_aliases(*daemon, vm), alias0));
  CHECK(std::filesystem::exists("/dev/shm/" + shmem_name(dev0)));

  // The VM can also be named by UUID.
  REQUIRE(attacher->attach(uuid, sim(dev1, "lease-1")).is_ok());

  auto listed = attacher->list_attached(vm);
  REQUIRE(listed.is_ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].device_id == dev0);
  CHECK((*listed)[0].lease_id == "lease-0");
  CHECK((*listed)[0].state == AttachState::attached);
  CHECK((*listed)[0].present);
  CHECK((*listed)[1].device_id == dev1);

  // An agent restart: a fresh attacher on a fresh connection reads the same records from the VM.
  attacher.reset();
  auto restarted = attacher_for(*daemon, 500ms);
  auto again = restarted->list_attached(uuid);
  REQUIRE(again.is_ok());
  REQUIRE(again->size() == 2);
  CHECK((*again)[0].device_id == dev0);
  CHECK((*again)[0].lease_id == "lease-0");
  CHECK((*again)[0].alias == alias0);
  CHECK((*again)[0].present);
  CHECK((*again)[1].lease_id == "lease-1");
}

TEST_CASE("bad input to the attacher is refused with a clear error and changes nothing", "[hypervisor][libvirtd]") {
  REQUIRE_LIBVIRTD(daemon);
  const std::string vm = vm_name("bad");
  const std::string other_vm = vm_name("bad-other");
  start_vm(*daemon, vm);
  start_vm(*daemon, other_vm);
  auto attacher = attacher_for(*daemon, 500ms);
  const std::string dev = daemon->unique_device_id("sim:0");
  REQUIRE(attacher->attach(vm, sim(dev, "lease-0")).is_ok());

  const auto aliases_before = live_aliases(*daemon, vm);
  const auto other_before = live_aliases(*daemon, other_vm);
  auto records_before = attacher->list_attached(vm);
  REQUIRE(records_before.is_ok());

  auto no_vm = attacher->attach("no-such-vm", sim(daemon->unique_device_id("sim:9"), "l"));
  REQUIRE_FALSE(no_vm.is_ok());
  CHECK(no_vm.error().code == Errc::not_found);
  CHECK(no_vm.error().message.find("no-such-vm") != std::string::npos);

  auto twice = attacher->attach(vm, sim(dev, "lease-other"));
  REQUIRE_FALSE(twice.is_ok());
  CHECK(twice.error().code == Errc::already_attached);
  CHECK(twice.error().message.find("lease-0") != std::string::npos);

  auto elsewhere = attacher->attach(other_vm, sim(dev, "lease-other"));
  REQUIRE_FALSE(elsewhere.is_ok());
  CHECK(elsewhere.error().code == Errc::already_attached);
  CHECK(elsewhere.error().message.find(vm) != std::string::npos);

  auto bad_bdf = attacher->attach(vm, DeviceSpec{"xrt:x", "l", AttachMethod::pci_hostdev, "0000:65:00.9"});
  REQUIRE_FALSE(bad_bdf.is_ok());
  CHECK(bad_bdf.error().code == Errc::invalid_argument);
  CHECK(bad_bdf.error().message.find("0000:65:00.9") != std::string::npos);

  // Well-formed, but no such PCI function on this host: libvirt refuses, the record is rolled back.
  auto absent_pci = attacher->attach(vm, DeviceSpec{"xrt:absent", "l", AttachMethod::pci_hostdev, "0000:fe:1f.7"});
  REQUIRE_FALSE(absent_pci.is_ok());
  CHECK(absent_pci.error().code == Errc::hypervisor);
  CHECK(absent_pci.error().message.find("xrt:absent") != std::string::npos);
  INFO(absent_pci.error().message);

  // The same in a VM with no records at all: the rollback leaves no metadata behind.
  auto absent_pci_other =
      attacher->attach(other_vm, DeviceSpec{"xrt:absent", "l", AttachMethod::pci_hostdev, "0000:fe:1f.7"});
  CHECK(absent_pci_other.error().code == Errc::hypervisor);
  auto other_xml = daemon->live_xml(other_vm);
  REQUIRE(other_xml.is_ok());
  CHECK(other_xml->find(std::string(kMetadataNamespace)) == std::string::npos);

  auto no_lease = attacher->attach(vm, sim(daemon->unique_device_id("sim:8"), ""));
  REQUIRE_FALSE(no_lease.is_ok());
  CHECK(no_lease.error().code == Errc::invalid_argument);

  auto not_attached = attacher->detach(vm, "sim:never");
  REQUIRE_FALSE(not_attached.is_ok());
  CHECK(not_attached.error().code == Errc::not_attached);
  CHECK(attacher->detach("no-such-vm", dev).error().code == Errc::not_found);
  CHECK(attacher->list_attached("no-such-vm").error().code == Errc::not_found);

  CHECK(live_aliases(*daemon, vm) == aliases_before);
  CHECK(live_aliases(*daemon, other_vm) == other_before);
  auto records_after = attacher->list_attached(vm);
  REQUIRE(records_after.is_ok());
  REQUIRE(records_after->size() == records_before->size());
  CHECK((*records_after)[0].device_id == dev);
  CHECK((*records_after)[0].lease_id == "lease-0");
  CHECK((*records_after)[0].state == AttachState::attached);
  auto other_records = attacher->list_attached(other_vm);
  REQUIRE(other_records.is_ok());
  CHECK(other_records->empty());
}

TEST_CASE("a device an older agent plugged under an alias without an attachment number is still recognised",
          "[hypervisor][libvirtd]") {
  REQUIRE_LIBVIRTD(daemon);
  const std::string vm = vm_name("upgrade");
  start_vm(*daemon, vm);
  auto attacher = attacher_for(*daemon, 400ms);
  const std::string old_dev = daemon->unique_device_id("sim:old");
  const std::string old_alias = std::string(kAliasPrefix) + escape_device_id(old_dev);
  REQUIRE(daemon
              ->attach_device(vm, "<shmem name='" + shmem_name(old_dev) +
                                      "'><model type='ivshmem-plain'/><size unit='M'>1</size><alias name='" +
                                      old_alias + "'/></shmem>")
              .is_ok());

  // In the VM under the old alias but not recorded (the older agent died before writing its record): refused,
  // naming the alias, and nothing is plugged on top of it.
  const auto aliases_before = live_aliases(*daemon, vm);
  auto unrecorded = attacher->attach(vm, sim(old_dev, "lease-new"));
  REQUIRE_FALSE(unrecorded.is_ok());
  CHECK(unrecorded.error().code == Errc::already_attached);
  CHECK(unrecorded.error().message.find(old_alias) != std::string::npos);
  CHECK(live_aliases(*daemon, vm) == aliases_before);

  // Recorded as the older agent recorded it: listed as present, kept beside a device plugged now, and both are
  // what a restarted agent reads back.
  AttachedDevice old_record;
  old_record.device_id = old_dev;
  old_record.lease_id = "lease-old";
  old_record.alias = old_alias;
  old_record.state = AttachState::attached;
  REQUIRE(
      daemon->set_metadata(vm, std::string(kMetadataNamespace), std::string(kMetadataKey), metadata_xml({old_record}))
          .is_ok());
  const std::string new_dev = daemon->unique_device_id("sim:new");
  REQUIRE(attacher->attach(vm, sim(new_dev, "lease-new")).is_ok());
  auto restarted = attacher_for(*daemon, 400ms);
  auto listed = restarted->list_attached(vm);
  REQUIRE(listed.is_ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].alias == old_alias);
  CHECK((*listed)[0].present);
  CHECK((*listed)[1].device_id == new_dev);
  CHECK((*listed)[1].present);
  CHECK(parse_device_alias((*listed)[1].alias)->attachment.has_value());

  // Its detach asks libvirt to remove the device by the old alias (libvirt refuses an alias it does not know);
  // this VM has no OS to acknowledge it, so it ends in quarantine like any other.
  auto detach = restarted->detach(vm, old_dev);
  INFO((detach.is_ok() ? std::string() : detach.error().message));
  REQUIRE(detach.is_ok());
  REQUIRE(detach->wait_for(accelpool::testing::kHungAfter) == std::future_status::ready);
  CHECK(detach->get().outcome == DetachOutcome::timed_out);
  CHECK(recorded_alias(*restarted, vm, old_dev) == old_alias);
}

TEST_CASE("records of devices no longer in the VM reconcile, and unreadable records change nothing",
          "[hypervisor][libvirtd]") {
  REQUIRE_LIBVIRTD(daemon);
  const std::string vm = vm_name("reconcile");
  start_vm(*daemon, vm);
  auto attacher = attacher_for(*daemon, 400ms);
  const std::string dev = daemon->unique_device_id("sim:0");
  REQUIRE(attacher->attach(vm, sim(dev, "lease-0")).is_ok());

  // A record of a device that left the VM while no agent was watching (written as the attacher would).
  auto records = attacher->list_attached(vm);
  REQUIRE(records.is_ok());
  AttachedDevice ghost;
  ghost.device_id = daemon->unique_device_id("sim:ghost");
  ghost.lease_id = "lease-ghost";
  ghost.alias = device_alias(ghost.device_id, 1);
  ghost.state = AttachState::attached;
  records->push_back(ghost);
  REQUIRE(daemon->set_metadata(vm, std::string(kMetadataNamespace), std::string(kMetadataKey), metadata_xml(*records))
              .is_ok());

  auto listed = attacher->list_attached(vm);
  REQUIRE(listed.is_ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].present);
  CHECK_FALSE((*listed)[1].present);
  CHECK((*listed)[1].lease_id == "lease-ghost");

  // Detaching it completes at once: there is nothing for the guest to release.
  auto detach = attacher->detach(vm, ghost.device_id);
  REQUIRE(detach.is_ok());
  REQUIRE(detach->wait_for(0ms) == std::future_status::ready);
  CHECK(detach->get().outcome == DetachOutcome::removed);
  auto after = attacher->list_attached(vm);
  REQUIRE(after.is_ok());
  REQUIRE(after->size() == 1);
  CHECK((*after)[0].device_id == dev);

  // Records someone else garbled: reported with what is wrong, and nothing is attached on top of them.
  const auto aliases_before = live_aliases(*daemon, vm);
  REQUIRE(daemon
              ->set_metadata(vm, std::string(kMetadataNamespace), std::string(kMetadataKey),
                             "<accelpool><device id='x' lease='l' method='emulated' alias='a' state='lost'/>"
                             "</accelpool>")
              .is_ok());
  auto garbled = attacher->list_attached(vm);
  REQUIRE_FALSE(garbled.is_ok());
  CHECK(garbled.error().code == Errc::hypervisor);
  CHECK(garbled.error().message.find("unknown state 'lost'") != std::string::npos);
  CHECK(garbled.error().message.find(vm) != std::string::npos);
  auto refused = attacher->attach(vm, sim(daemon->unique_device_id("sim:1"), "lease-1"));
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::hypervisor);
  CHECK(live_aliases(*daemon, vm) == aliases_before);
}

TEST_CASE("a detach the guest never acknowledges ends in quarantine, not in a free device", "[hypervisor][libvirtd]") {
  REQUIRE_LIBVIRTD(daemon);
  const std::string vm = vm_name("quarantine");
  start_vm(*daemon, vm);
  // Long enough that the checks while detaching cannot race the timeout on a loaded machine.
  const auto timeout = 1000ms;
  auto attacher = attacher_for(*daemon, timeout);
  const std::string dev = daemon->unique_device_id("sim:0");
  REQUIRE(attacher->attach(vm, sim(dev, "lease-q")).is_ok());
  const std::string alias = recorded_alias(*attacher, vm, dev);

  const auto t0 = std::chrono::steady_clock::now();
  auto detach = attacher->detach(vm, dev);
  INFO((detach.is_ok() ? std::string() : detach.error().message));
  REQUIRE(detach.is_ok());
  std::printf("hypervisor: detach request returned after %.1f ms\n", ms_since(t0));
  DetachFuture future = *detach;
  CHECK(future.wait_for(0ms) == std::future_status::timeout);

  // While the guest has not answered: detaching, still in the VM.
  auto during = attacher->list_attached(vm);
  REQUIRE(during.is_ok());
  REQUIRE(during->size() == 1);
  CHECK((*during)[0].state == AttachState::detaching);
  CHECK((*during)[0].present);
  // Asking again waits for the same outcome.
  auto second = attacher->detach(vm, dev);
  REQUIRE(second.is_ok());

  REQUIRE(future.wait_for(accelpool::testing::kHungAfter) == std::future_status::ready);
  const DetachResult result = future.get();
  std::printf("hypervisor: unacknowledged detach quarantined after %lld ms (timeout %lld ms)\n",
              static_cast<long long>(result.elapsed.count()), static_cast<long long>(timeout.count()));
  CHECK(result.outcome == DetachOutcome::timed_out);
  CHECK_FALSE(result.device_free());
  CHECK(result.elapsed >= timeout);
  CHECK(result.detail.find("quarantined") != std::string::npos);
  REQUIRE(second->wait_for(accelpool::testing::kHungAfter) == std::future_status::ready);
  CHECK(second->get().outcome == DetachOutcome::timed_out);

  // Quarantined: recorded as such, still in the VM, and not handed out again.
  CHECK(contains(live_aliases(*daemon, vm), alias));
  auto after = attacher->list_attached(vm);
  REQUIRE(after.is_ok());
  REQUIRE(after->size() == 1);
  CHECK((*after)[0].state == AttachState::quarantined);
  CHECK((*after)[0].note.find("no removal confirmation") != std::string::npos);
  auto regrant = attacher->attach(vm, sim(dev, "lease-next"));
  REQUIRE_FALSE(regrant.is_ok());
  CHECK(regrant.error().code == Errc::already_attached);
  CHECK(regrant.error().message.find("quarantined") != std::string::npos);

  // The quarantine is in the VM's metadata, so a restarted agent sees it too.
  auto restarted = attacher_for(*daemon, 300ms);
  auto seen = restarted->list_attached(vm);
  REQUIRE(seen.is_ok());
  REQUIRE(seen->size() == 1);
  CHECK((*seen)[0].state == AttachState::quarantined);

  // Detaching a quarantined device asks the guest again; unanswered, it is quarantined again.
  auto retry = restarted->detach(vm, dev);
  REQUIRE(retry.is_ok());
  REQUIRE(retry->wait_for(accelpool::testing::kHungAfter) == std::future_status::ready);
  CHECK(retry->get().outcome == DetachOutcome::timed_out);
}

TEST_CASE("a destroyed VM fires the lifecycle handler with its devices and ends pending detaches",
          "[hypervisor][libvirtd]") {
  REQUIRE_LIBVIRTD(daemon);
  const std::string vm = vm_name("lifecycle");
  const std::string uuid = start_vm(*daemon, vm);
  auto attacher = attacher_for(*daemon, 30s);
  EventLog event_log(*attacher);
  const std::string dev0 = daemon->unique_device_id("sim:0");
  const std::string dev1 = daemon->unique_device_id("sim:1");
  REQUIRE(attacher->attach(vm, sim(dev0, "lease-0")).is_ok());
  REQUIRE(attacher->attach(vm, sim(dev1, "lease-1")).is_ok());
  auto pending = attacher->detach(vm, dev1);
  REQUIRE(pending.is_ok());

  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(daemon->destroy_vm(vm).is_ok());
  const auto first = event_log.wait_for(1);
  REQUIRE(first);
  std::printf("hypervisor: lifecycle event %.1f ms after the destroy call started\n", ms_since(t0));
  const HypervisorEvent e = first->front();
  CHECK(e.kind == EventKind::vm_destroyed);
  CHECK(e.vm_name == vm);
  CHECK(e.vm_uuid == uuid);
  REQUIRE(e.devices.size() == 2);
  CHECK(e.devices[0].device_id == dev0);
  CHECK(e.devices[0].lease_id == "lease-0");
  CHECK(e.devices[1].device_id == dev1);

  REQUIRE(pending->wait_for(accelpool::testing::kHungAfter) == std::future_status::ready);
  CHECK(pending->get().outcome == DetachOutcome::vm_stopped);
  CHECK(pending->get().device_free());

  auto gone = attacher->list_attached(vm);
  REQUIRE_FALSE(gone.is_ok());
  CHECK((gone.error().code == Errc::not_found || gone.error().code == Errc::vm_not_running));

  // A VM whose QEMU dies (a crash, as far as libvirt can tell) is reported as crashed, with its devices.
  const std::string crash_vm = vm_name("crash");
  start_vm(*daemon, crash_vm);
  const std::string dev2 = daemon->unique_device_id("sim:2");
  REQUIRE(attacher->attach(crash_vm, sim(dev2, "lease-2")).is_ok());
  REQUIRE(daemon->kill_vm(crash_vm).is_ok());
  const auto both = event_log.wait_for(2);
  REQUIRE(both);
  const HypervisorEvent crash = both->back();
  CHECK(crash.kind == EventKind::vm_crashed);
  CHECK(crash.vm_name == crash_vm);
  REQUIRE(crash.devices.size() == 1);
  CHECK(crash.devices[0].device_id == dev2);
  CHECK(crash.devices[0].lease_id == "lease-2");
}

TEST_CASE("the attacher reconnects after libvirtd restarts, and the VM's records survive the restart",
          "[hypervisor][libvirtd]") {
  // A daemon of its own: restarting the shared one would disturb other test cases of this process.
  auto started = hypervisor::testing::LibvirtDaemon::start();
  if (!started) {
    ACCELPOOL_SKIP("no private libvirtd with the QEMU driver can run here: " << started.error().message);
  }
  hypervisor::testing::LibvirtDaemon& daemon = **started;
  const std::string vm = vm_name("restart");
  start_vm(daemon, vm);
  auto attacher = attacher_for(daemon, 400ms);
  EventLog event_log(*attacher);
  const std::string dev0 = daemon.unique_device_id("sim:r0");
  const std::string dev1 = daemon.unique_device_id("sim:r1");
  REQUIRE(attacher->attach(vm, sim(dev0, "lease-r0")).is_ok());

  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(daemon.restart().is_ok());
  std::printf("hypervisor: private libvirtd restarted in %.1f ms\n", ms_since(t0));

  auto listed = attacher->list_attached(vm);
  INFO((listed.is_ok() ? std::string() : listed.error().message));
  REQUIRE(listed.is_ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].device_id == dev0);
  CHECK((*listed)[0].state == AttachState::attached);
  CHECK((*listed)[0].present);
  REQUIRE(attacher->attach(vm, sim(dev1, "lease-r1")).is_ok());

  // Events arrive on the new connection.
  REQUIRE(daemon.kill_vm(vm).is_ok());
  const auto events = event_log.wait_for(1);
  REQUIRE(events);
  CHECK(events->front().kind == EventKind::vm_crashed);
  CHECK(events->front().devices.size() == 2);
}
