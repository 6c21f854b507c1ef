// Hot-plugging pool devices into guest VMs and taking them out again.
//
// The host agent owns one Attacher per hypervisor connection. A grant of a passthrough device ends in
// `attach`, a release in `detach`. Detaching is asynchronous on every real hypervisor: the guest OS must
// acknowledge the eject, which can take seconds or never happen. Until the hypervisor confirms the removal the
// device is `detaching` and must be granted to no one; if the confirmation does not come within the attacher's
// detach timeout (or the guest refuses), the device is `quarantined`: still in the VM as far as anyone can tell,
// so never free until an operator or the VM's end says otherwise.
//
// Every device an attacher puts into a VM is recorded in that VM's own hypervisor metadata, so an agent that
// restarts learns what it attached before (`list_attached`) and reconciles against the manager's store.
#pragma once

#include <accelpool/common/result.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::hypervisor {

// How a device enters the VM.
enum class AttachMethod : std::uint8_t {
  pci_hostdev,  // a host PCI function passed through (managed: the hypervisor unbinds/rebinds the host driver)
  emulated,     // an emulated PCI device standing in for a simulated accelerator (shared-memory region)
};

// What to attach. `device_id` is the pool's id of the device (unique on the host, e.g. "sim:3" or
// "xrt:0000:65:00.1"); `lease_id` is the lease that asked for it, recorded for reconciliation.
struct DeviceSpec {
  std::string device_id;
  std::string lease_id;
  AttachMethod method = AttachMethod::emulated;
  std::string pci_bdf;  // pci_hostdev only: "DDDD:BB:SS.F" or "BB:SS.F" (hex)
};

enum class AttachState : std::uint8_t {
  attaching,    // recorded, the hypervisor call has not returned yet (seen only after a crash in between)
  attached,     // in the VM and in use
  detaching,    // removal requested, the guest has not acknowledged yet: granted to no one
  quarantined,  // removal timed out or was refused: granted to no one until an operator clears it
};

// One device as recorded in a VM's metadata.
struct AttachedDevice {
  std::string device_id;
  std::string lease_id;
  AttachMethod method = AttachMethod::emulated;
  std::string pci_bdf;  // normalised "DDDD:BB:SS.F", empty for emulated devices
  std::string alias;    // the hypervisor's device alias, unique in the VM
  AttachState state = AttachState::attached;
  std::string note;      // why the device is quarantined; empty otherwise
  bool present = false;  // list_attached only: the device is in the VM's live configuration right now
};

enum class DetachOutcome : std::uint8_t {
  removed,     // the hypervisor confirmed the removal: the device is free
  vm_stopped,  // the VM ended while the removal was pending: the device is free
  timed_out,   // no confirmation within the detach timeout: the device is quarantined
  rejected,    // the guest refused the removal: the device is quarantined
};

struct DetachResult {
  std::string vm;  // the VM as the caller named it
  std::string device_id;
  DetachOutcome outcome = DetachOutcome::removed;
  std::string detail;                    // for people: what happened
  std::chrono::milliseconds elapsed{0};  // from the detach request to the outcome

  // True only when the device may be granted again.
  bool device_free() const { return outcome == DetachOutcome::removed || outcome == DetachOutcome::vm_stopped; }
};

// Becomes ready exactly once, with the outcome of one detach.
using DetachFuture = std::shared_future<DetachResult>;

enum class EventKind : std::uint8_t {
  vm_shutdown,     // the VM shut down (guest or host initiated)
  vm_destroyed,    // the VM was forcibly stopped
  vm_crashed,      // the VM crashed, or QEMU failed
  vm_stopped,      // the VM stopped for another reason (migrated away, saved, ...)
  device_removed,  // a device left a VM with no detach waiting for it (a quarantined device's removal confirmed
                   // late, or an eject the guest started): it is free now, and no longer in the lease's VM
};

// Something the host must react to: a VM ended (release its leases) or a device came free on its own.
struct HypervisorEvent {
  EventKind kind = EventKind::vm_stopped;
  std::string vm_name;
  std::string vm_uuid;
  std::string detail;
  // vm_*: every device accelpool had attached to the VM (all are gone with the VM);
  // device_removed: that one device, as it was recorded.
  std::vector<AttachedDevice> devices;
};

using EventHandler = std::function<void(const HypervisorEvent&)>;

// A VM is named by its hypervisor domain name or its UUID (36-character text form).
class Attacher {
 public:
  virtual ~Attacher() = default;

  // Puts the device into the running VM now and records it in the VM's metadata; returns once the hypervisor
  // has plugged it (tens of milliseconds for an emulated device), with the PCI address at which the guest sees
  // it ("DDDD:BB:SS.F", as the hypervisor assigned it; "" when the hypervisor does not say). Blocks; call from a
  // host's device strand, never from the pool state owner or from an event handler.
  // Errors (nothing is changed on any of them): "invalid_argument" (empty or malformed id, lease or BDF),
  // "not_found" (no such VM), "vm_not_running", "already_attached" (the device is recorded in this VM in any
  // state, or in another VM this attacher knows of, or the VM already holds the device under an alias no record
  // names), "hypervisor" (the hypervisor refused; its message is included), "unavailable" (no connection).
  virtual Result<std::string> attach(std::string_view vm, const DeviceSpec& spec) = 0;

  // Asks the VM to release the device and returns at once with a future for the outcome (see DetachOutcome);
  // the record says `detaching` meanwhile. A second detach of a device that is already detaching returns the
  // same future; detaching a quarantined device asks the guest again. A device that is recorded but no longer in
  // the VM completes at once as `removed`. Must not be waited on from an event handler.
  // Errors: "invalid_argument", "not_found" (no such VM), "not_attached" (not recorded in this VM),
  // "hypervisor", "unavailable".
  virtual Result<DetachFuture> detach(std::string_view vm, std::string_view device_id) = 0;

  // The devices accelpool recorded in the VM's metadata, each with `present` checked against the VM's live
  // configuration. Used to reconcile after an agent restart. Blocks briefly; changes nothing.
  // Errors: "not_found" (no such VM), "vm_not_running", "hypervisor" (also for metadata that cannot be parsed),
  // "unavailable".
  virtual Result<std::vector<AttachedDevice>> list_attached(std::string_view vm) = 0;

  // Installs the handler for VM ends and late removals (replacing any previous one; an empty function removes
  // it). Call before the first attach so no event is missed. The handler runs on the attacher's own event
  // thread, one event at a time; it must return quickly and must not call back into this attacher.
  virtual void set_event_handler(EventHandler handler) = 0;
};

std::string_view to_string(AttachMethod method);
std::string_view to_string(AttachState state);
std::string_view to_string(DetachOutcome outcome);
std::string_view to_string(EventKind kind);

}  // namespace accelpool::hypervisor
