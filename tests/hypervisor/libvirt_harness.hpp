// A private, real libvirtd with the QEMU driver for tests, and a builder for the transient VMs they run.
//
// The daemon runs as root in its own mount namespace: its configuration, state, runtime and log folders
// (/etc/libvirt, /var/lib/libvirt, /run/libvirt, /var/log/libvirt) are bind-mounted from a fresh temporary
// folder, so it neither sees nor disturbs a libvirtd of the host or of a concurrently running test, and it
// listens only on its own socket (uri() is "qemu+unix:///system?socket=<dir>/sock/libvirt-sock"). QEMU's
// capability cache (/var/cache/libvirt) is the host's, shared on purpose: probing QEMU takes ~8 s the first
// time and ~0 s after. The QEMU driver insists that the `libvirt-qemu` user and the `kvm` group exist; when the
// host lacks them they are added to the namespace's private copy of /etc/passwd and /etc/group only.
// QEMU runs as root without cgroups, namespaces or a security driver (a container may offer none of them).
//
// Logs stay in dir()/log (libvirtd.log, daemon.out, qemu/<vm>.log); set ACCELPOOL_KEEP_LIBVIRTD_DIR=1 to keep
// the folder after the test.
#pragma once

#include <accelpool/common/result.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

typedef struct _virConnect virConnect;

namespace accelpool::hypervisor::testing {

// A virtio-serial port the guest sees as /dev/virtio-ports/<name>; the host end is a Unix socket libvirt binds.
struct VirtioChannel {
  std::string name;  // e.g. "org.accelpool.guest.0"
  std::filesystem::path socket;
};

struct VmOptions {
  std::string name;
  std::string machine = "pc";  // i440FX: ACPI PCI hot-plug on the root bus
  std::uint32_t memory_mib = 96;
  std::uint32_t vcpus = 1;
  std::filesystem::path emulator = "/usr/bin/qemu-system-x86_64";
  // Direct kernel boot when `kernel` is set; otherwise the VM has no OS (firmware only, never acknowledges a
  // PCI eject).
  std::filesystem::path kernel;
  std::filesystem::path initrd;
  std::string cmdline;
  std::filesystem::path console_log;  // when set, the first serial port is written to this file
  std::vector<VirtioChannel> channels;
  std::string extra_devices_xml;  // appended inside <devices> verbatim
};

// A transient domain of type 'qemu' (pure emulation), ACPI on, no disks, no network, no graphics.
// Errors: "invalid_argument" (empty name, zero memory or vcpus, initrd/cmdline without a kernel).
Result<std::string> domain_xml(const VmOptions& options);

struct DaemonOptions {
  std::filesystem::path libvirtd = "/usr/sbin/libvirtd";
  std::filesystem::path emulator = "/usr/bin/qemu-system-x86_64";
  std::chrono::seconds start_timeout{60};  // the first start on a host probes QEMU (~8 s)
};

class LibvirtDaemon {
 public:
  // Starts the daemon and waits until it answers. The daemon gets SIGTERM when the calling thread ends
  // (PR_SET_PDEATHSIG), so call it from a thread that outlives the daemon (e.g. the test's main thread). Errors:
  // "unavailable" with the reason (not root, binary missing, namespace refused, daemon died or did not answer; the
  // log's tail is included).
  static Result<std::unique_ptr<LibvirtDaemon>> start(const DaemonOptions& options = {});

  // One daemon per test process, started on first use and stopped at exit. Returns nullptr and sets
  // `why_not` when it cannot run here.
  static LibvirtDaemon* shared(std::string* why_not);

  LibvirtDaemon(const LibvirtDaemon&) = delete;
  LibvirtDaemon& operator=(const LibvirtDaemon&) = delete;
  // Kills every running VM, stops the daemon, removes the folder.
  ~LibvirtDaemon();

  const std::string& uri() const { return uri_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::string log_tail(std::size_t max_bytes = 3000) const;

  // Starts a transient VM; returns its UUID. Errors: "hypervisor" with libvirt's message.
  Result<std::string> create_vm(const VmOptions& options);
  // virDomainDestroy: a forced stop through libvirt (lifecycle event STOPPED/DESTROYED).
  Status destroy_vm(const std::string& name);
  // SIGKILL to the VM's QEMU process behind libvirt's back: what a crash looks like (STOPPED/FAILED).
  Status kill_vm(const std::string& name);
  // Writes (or with an empty `xml`, removes) an element in the VM's live metadata, as an operator or another
  // tool could. Errors: "not_found", "hypervisor".
  Status set_metadata(const std::string& name, const std::string& ns_uri, const std::string& key,
                      const std::string& xml);
  // The live domain XML (virDomainGetXMLDesc).
  Result<std::string> live_xml(const std::string& name);
  // Hot-plugs the device element `xml` into the running VM (virDomainAttachDeviceFlags, live only), as another
  // tool or an older agent could. Errors: "not_found", "hypervisor".
  Status attach_device(const std::string& name, const std::string& xml);

  // Stops libvirtd (its VMs keep running, as with a daemon upgrade on a host) and starts it again on the same
  // folders and socket; it reconnects to the running VMs. Clients see their connection drop.
  Status restart();

  // A device id unique to this test process ("<base>@<pid>"), so concurrent tests never share a /dev/shm
  // region; the regions of such ids are removed when the daemon stops.
  std::string unique_device_id(const std::string& base) const;

 private:
  LibvirtDaemon() = default;
  Status launch(const DaemonOptions& options);
  Status spawn();
  void stop_daemon();
  void stop();

  DaemonOptions options_;
  std::vector<std::string> bind_from_;
  std::vector<std::string> bind_to_;

  std::filesystem::path dir_;
  std::string uri_;
  pid_t pid_ = -1;
  virConnect* conn_ = nullptr;
};

}  // namespace accelpool::hypervisor::testing
