// The names of the attacher's enumerations (attacher.hpp), in their own file so that the interface builds
// without libvirt.
#include <accelpool/hypervisor/attacher.hpp>

namespace accelpool::hypervisor {

std::string_view to_string(AttachMethod method) {
  switch (method) {
    case AttachMethod::pci_hostdev:
      return "pci_hostdev";
    case AttachMethod::emulated:
      return "emulated";
  }
  return "unknown";
}

std::string_view to_string(AttachState state) {
  switch (state) {
    case AttachState::attaching:
      return "attaching";
    case AttachState::attached:
      return "attached";
    case AttachState::detaching:
      return "detaching";
    case AttachState::quarantined:
      return "quarantined";
  }
  return "unknown";
}

std::string_view to_string(DetachOutcome outcome) {
  switch (outcome) {
    case DetachOutcome::removed:
      return "removed";
    case DetachOutcome::vm_stopped:
      return "vm_stopped";
    case DetachOutcome::timed_out:
      return "timed_out";
    case DetachOutcome::rejected:
      return "rejected";
  }
  return "unknown";
}

std::string_view to_string(EventKind kind) {
  switch (kind) {
    case EventKind::vm_shutdown:
      return "vm_shutdown";
    case EventKind::vm_destroyed:
      return "vm_destroyed";
    case EventKind::vm_crashed:
      return "vm_crashed";
    case EventKind::vm_stopped:
      return "vm_stopped";
    case EventKind::device_removed:
      return "device_removed";
  }
  return "unknown";
}

}  // namespace accelpool::hypervisor
