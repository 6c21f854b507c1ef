// The libvirt implementation of Attacher.
//
// One connection to one libvirt URI ("qemu:///system" on a host; "qemu+unix:///system?socket=/path" for a
// daemon with its own socket). Devices are plugged live with virDomainAttachDeviceFlags(VIR_DOMAIN_AFFECT_LIVE):
// PCI functions as managed <hostdev>, simulated devices as an ivshmem-plain <shmem>. Removal uses
// virDomainDetachDeviceAlias, which only sends the request; the outcome comes from the domain events
// DEVICE_REMOVED / DEVICE_REMOVAL_FAILED, or from the detach timeout (quarantine). LIFECYCLE events report VMs
// that stop. What was attached is kept in each domain's live metadata under kMetadataNamespace. Every attach
// gives the device a new alias (device_alias in libvirt_xml.hpp), so a re-plug never reuses the ids of an
// attachment QEMU may still be tearing down.
//
// Threads: the attacher runs libvirt's default event loop on a thread shared by all attachers of the process
// (registered with virEventRegisterDefaultImpl the first time an attacher is created: a process that embeds
// another libvirt event loop implementation must not use this class), plus one worker thread of its own
// that handles events, timeouts and the event handler. Attacher methods may be called from any thread.
// The first attacher also turns off libvirt's default printing of every error to stderr (process-wide, via
// virSetErrorFunc): errors come back as values with libvirt's message instead.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/hypervisor/attacher.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace accelpool::hypervisor {

struct LibvirtOptions {
  std::string uri = "qemu:///system";
  // How long a detach may wait for the guest before the device is quarantined.
  std::chrono::milliseconds detach_timeout{30000};
  // Size of the shared-memory region behind an emulated device (power of two).
  std::uint32_t shmem_size_mib = 1;
  // libvirt keepalive: a dead daemon is noticed after about interval * (count + 1) seconds.
  int keepalive_interval_s = 5;
  unsigned keepalive_count = 3;
};

// Connects to options.uri and subscribes to the domain events. Errors: "invalid_argument" (bad options),
// "unavailable" (no daemon answers at the URI; libvirt's message says why).
Result<std::unique_ptr<Attacher>> make_libvirt_attacher(const LibvirtOptions& options);

}  // namespace accelpool::hypervisor
