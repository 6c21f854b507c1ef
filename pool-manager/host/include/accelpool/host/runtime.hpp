// The host runtime: what a host does with its devices, written once for both kinds of host (the manager's
// in-process host and accelpool-agent). It owns the host's device backends and, optionally, a hypervisor
// attacher; it prepares, releases and resets devices, checks their health, and quarantines a device whose
// detach the guest never acknowledged. The owner keeps only its own link to the pool (the manager's owner
// thread, or the agent's connection) and turns completions and events into that link's messages.
//
// Threads: every operation on one device runs on that device's strand, in the order it was asked; operations on
// different devices run in parallel on a small pool of threads, so the devices of a gang are programmed at the
// same time. A backend that does not declare parallel_devices() is still called by one thread at a time.
// Completions and events are called on the runtime's threads (and hypervisor events on the attacher's event
// thread): they must return quickly and must not wait for another operation of this runtime; owners post them
// where they need them. Every public method may be called from any thread.
#pragma once

#include <accelpool/backends/device_backend.hpp>
#include <accelpool/bitstreams/image_fetch.hpp>
#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/common/result.hpp>
#include <accelpool/host/contract.hpp>
#include <accelpool/hypervisor/attacher.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accelpool::bitstreams {
class SharedRegistry;
}

namespace accelpool::host {

// Where a host's bitstream images come from. Called on device strands, possibly from several at once: an
// implementation synchronises itself.
class ImageSource {
 public:
  virtual ~ImageSource() = default;

  // The entry of `bitstream` whose image has `sha256` ("" for the highest version of `bitstream`), with its file
  // on this host; a source that can fetch gets a missing image first. Does not hash the image (the runtime
  // verifies it, once per file version). Errors: "not_found" (no such image here, nor to fetch),
  // "invalid_argument" (`sha256` is the image of another bitstream), a fetch's errors; messages name the image.
  virtual Result<bitstreams::Bitstream> locate(const std::string& bitstream, const std::string& sha256) = 0;

  // The sha256 the source records for the highest version of `bitstream` ("" when it has no such name), and the
  // name of the image with `sha256` ("" when it has none). Neither reads an image file.
  virtual std::string sha256_of(const std::string& bitstream) = 0;
  virtual std::string name_of(const std::string& sha256) = 0;
};

// The manager's registry, shared with its other users (the in-process host). Never fetches.
std::unique_ptr<ImageSource> registry_images(std::shared_ptr<bitstreams::SharedRegistry> registry);

// A host's own registry folder (accelpool-agent's cache). An image it lacks is fetched by sha256 from `fetcher`
// (accelpool-agent: the manager, over the agent link; null fetches nothing), verified like an upload and added
// to the folder (bitstreams::fetch_image). With a fetcher, a missing `dir` is created (an empty cache); without
// one it must exist. Errors: Registry::open's ("not_found" when `dir` is not a folder), "io_error" when it cannot
// be created.
Result<std::unique_ptr<ImageSource>> folder_images(const std::filesystem::path& dir,
                                                   std::shared_ptr<bitstreams::ImageFetcher> fetcher);

struct RuntimeOptions {
  std::string host = "local";  // the host's name, in messages
  // Threads that run device operations; 0: one per device, at most 16.
  std::size_t threads = 0;
  // How often every device's health is checked by the runtime's own timer thread; 0: no timer (the owner calls
  // check_health()). create() checks every device once either way, before it returns.
  std::chrono::milliseconds health_interval{0};
  // How the guest reaches a passthrough device the runtime prepared without attaching it: AttachMode::none on a
  // host with no attacher, AttachMode::in_process for the manager's in-process host.
  AttachMode unattached = AttachMode::none;
  // With an attacher: the file that lists the VMs holding devices of this host (one name a line), rewritten on
  // every attach and release and read back by create() to reconcile; "" keeps no file.
  std::filesystem::path state_file;
  // Wall time in nanoseconds since the epoch, for the verified-image cache (bitstreams::VerifiedImages); empty:
  // the system clock. Tests move it by hand.
  std::function<std::int64_t()> wall_clock_ns;
};

// One device as the runtime knows it now.
struct DeviceState {
  backends::DeviceInfo info;
  std::string loaded;         // bitstream name the device holds, "" for none
  std::string health = "ok";  // "ok", "degraded", "failed"
  std::string detail;         // why, when not ok
  std::string vm;             // the VM the device serves ("" for none): attached, or only recorded
  std::string lease;          // the lease it serves, as the prepare said
  std::string guest_pci;      // where the VM sees it, when attached
  bool attached = false;      // put into `vm` through the attacher
  bool quarantined = false;   // a detach the guest never acknowledged: granted to no one
  std::string endpoint;       // where the lease's program reaches it over the network, while served so
  // "" (serves no VM), "recorded", "attached" or "quarantined" (the agent protocol's attach_state).
  std::string attach_state() const;
};

// What a release did besides resetting the device.
struct ReleaseResult {
  std::string loaded;                              // bitstream name the device holds afterwards
  std::optional<hypervisor::DetachResult> detach;  // set when the device was detached from its VM
};

// A VM the runtime had devices in has ended; those devices are free again.
struct VmStopped {
  std::string vm_name, vm_uuid;
  std::string reason;                // "shutdown", "destroyed", "crashed", "stopped"
  std::vector<std::string> devices;  // the runtime's devices that were in it
};

struct RuntimeEvents {
  // A device's health changed (checks, quarantine, a quarantined device's late removal).
  std::function<void(const std::string& device, const std::string& health, const std::string& detail)> health_changed;
  // A VM holding devices of this runtime ended (attacher event thread).
  std::function<void(const VmStopped& stopped)> vm_stopped;
  // A line for the host's log.
  std::function<void(const std::string& line)> log;
};

class HostRuntime {
 public:
  using PrepareDone = std::function<void(Status status, PrepareResult result)>;
  using ReleaseDone = std::function<void(Status status, ReleaseResult result)>;
  using ResetDone = std::function<void(Status status, std::string loaded)>;

  // Enumerates every backend's devices (ids must be unique over the backends), checks each device's health once,
  // and with an attacher reconciles the VMs the state file names (devices recorded in them serve them again;
  // quarantined ones stay quarantined). `images` null: a bitstream name stands for an image whose identity is
  // the hash of the name (only the simulated backend programs those). The attacher's event handler is the
  // runtime's from here on. Errors: "invalid_argument" (no backend, a null one, a device id two backends report;
  // named), an enumeration error naming the backend.
  static Result<std::unique_ptr<HostRuntime>> create(RuntimeOptions options,
                                                     std::vector<std::unique_ptr<backends::DeviceBackend>> backends,
                                                     std::unique_ptr<ImageSource> images,
                                                     std::unique_ptr<hypervisor::Attacher> attacher,
                                                     RuntimeEvents events);

  // Stops the health timer, lets every queued operation finish (their completions still run), and returns.
  virtual ~HostRuntime() = default;

  // The devices and what the runtime knows of them now, by id. Never blocks on an operation. A device with slots
  // (DeviceInfo::slots) is listed once; its slots are prepared, released and reset by their own local ids
  // (slot_local_id), run on the device's strand, share its health, and are never hot-plugged into a VM (the VM
  // is recorded; a network-attached device's slot is reached over the network).
  virtual std::vector<DeviceState> devices() const = 0;

  // Makes `request.device` ready for `request.lease`: programs `request.bitstream` unless the device already
  // holds that image (by sha256: the request's, else the image source's; then the image file is not read) or
  // `request.reprogram` is set; an image to program is located through the ImageSource and verified on disk
  // unless its file is unchanged since it last verified. Then, with `request.vm` set, attaches a passthrough
  // device to that VM through the attacher (when there is one; else the VM is only recorded). `done` gets the
  // result: what the device holds (also on failure), how the guest reaches it, the guest PCI address, the
  // device's details (on failure only what the device holds). Errors: "not_found" (no such device), "invalid_state"
  // (quarantined, or serving another VM), the image's errors ("not_found", "checksum_mismatch", "corrupt_image",
  // "missing_file", fetch errors), the backend's programming errors, "attach_failed"; every message names the host and
  // the device.
  virtual void prepare(const PrepareRequest& request, PrepareDone done) = 0;

  // Takes the device back after a lease: detaches it from its VM (waiting for the guest; a removal the guest
  // never confirms quarantines the device: health "failed", granted to no one until the VM ends or the removal
  // is confirmed late), forgets the VM and resets the device. Errors: "not_found", "quarantined",
  // "detach_failed", the backend's reset errors.
  virtual void release(const std::string& device, ReleaseDone done) = 0;

  // Resets a device that serves no VM. Errors: "not_found", "invalid_state" (quarantined or serving a VM), the
  // backend's reset errors.
  virtual void reset(const std::string& device, ResetDone done) = 0;

  // How many times an image file was hashed (verified in full) so far: once per version of each file programmed.
  virtual std::uint64_t image_hashes() const = 0;

  // Queues a health check of every device that is not quarantined, each on its strand; changes are reported
  // through RuntimeEvents::health_changed. Returns at once.
  virtual void check_health() = 0;
};

}  // namespace accelpool::host
