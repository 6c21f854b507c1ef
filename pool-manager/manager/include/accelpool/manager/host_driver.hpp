// The manager's view of a host: the devices it offers, and the two slow things it does with them.
// The embedded default runs one host in-process (LocalHost over a DeviceBackend); remote host agents join
// behind the same interface.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/common/slots.hpp>
#include <accelpool/host/contract.hpp>
#include <accelpool/manager/clock.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace accelpool::backends {
class DeviceBackend;
}
namespace accelpool::bitstreams {
class SharedRegistry;
class VerifiedImages;
}  // namespace accelpool::bitstreams

namespace accelpool::manager {

struct HostDevice {
  std::string local_id;
  std::string kind;
  std::string model;
  bool passthrough = true;
  std::string loaded;  // bitstream name the device holds now, "" for none or unknown
  bool usable = true;  // false: the host reports it failed (attach_host's caller lists it in HostReport::unusable)
  // Partial-reconfiguration slots of the device (docs/hosts.md, "Slots"): 0 for none. Each slot joins the pool
  // as a device of kind slot_kind(kind) named slot_local_id(local_id, n), n in [0, slots); the host is asked to
  // prepare and release it under that local id.
  std::uint32_t slots = 0;
  // The shape of each slot, in slot order (e.g. "cu2", "cu1", "cu1"; backends::slot_shapes_of): empty for
  // slots without shapes, else exactly `slots` names, "" for a slot without one. A slot with a shape takes only
  // partial images of that `slot_shape` (docs/hosts.md, "Slot shapes").
  std::vector<std::string> slot_shapes{};
};

using accelpool::kMaxSlotsPerDevice;  // the slot names and limits every side shares (common/slots.hpp)
using accelpool::slot_kind;
using accelpool::slot_local_id;

// Runs a completion on the pool's owner thread. Must not run it inline: it queues it.
using Poster = std::function<void(std::function<void()>)>;

class HostDriver {
 public:
  // Called with the outcome of a release or reset; `loaded` is the bitstream the device holds afterwards.
  using Done = std::function<void(Status status, std::string loaded)>;
  // Called with the outcome of a prepare: what the host did (on failure, result.loaded still says what the
  // device holds afterwards; the other fields are unset).
  using PrepareDone = std::function<void(Status status, host::PrepareResult result)>;

  virtual ~HostDriver() = default;

  // The host's name, unique in the pool (e.g. "local").
  virtual const std::string& name() const = 0;

  // The devices present now. Called on the owner thread at start; may block briefly (enumeration).
  virtual Result<std::vector<HostDevice>> devices() = 0;

  // Makes `request.device` ready for lease `request.lease`: programs `request.bitstream` when `request.reprogram`
  // is set (or when the device does not hold it; `request.sha256`, when not empty, is the image's identity in the
  // manager's registry), then attaches the device to `request.vm` when the host can. Returns at once; `done`
  // runs later on the owner thread (through the Poster) with what the host did. Operations on one device run in
  // the order they were asked.
  virtual void prepare(const host::PrepareRequest& request, PrepareDone done) = 0;

  // Takes the device back after a lease: detaches it from the guest and resets it. Same threading as prepare.
  virtual void release(const std::string& local_id, Done done) = 0;

  // Resets a free device (admin request). Same threading as prepare.
  virtual void reset(const std::string& local_id, Done done) = 0;
};

// The manager's bitstream registry as hosts and acquires see it, and the device kinds that take its images.
// Images are verified on a worker thread of the catalog's own, so that no caller (the owner thread above all)
// reads or hashes an image file; callers read the verdicts it left.
// Threading: every call locks; any thread.
class ImageCatalog {
 public:
  // `clock` tells how old an image file's last write is (see check); it is read from whichever thread calls
  // check, so it must be safe to read from any thread (wall time by default; tests move a ManualClock by hand).
  explicit ImageCatalog(std::shared_ptr<bitstreams::SharedRegistry> registry,
                        std::shared_ptr<const Clock> clock = std::make_shared<SystemClock>());
  ~ImageCatalog();  // stops the worker after the verification it is running
  ImageCatalog(const ImageCatalog&) = delete;
  ImageCatalog& operator=(const ImageCatalog&) = delete;

  const std::shared_ptr<bitstreams::SharedRegistry>& registry() const { return registry_; }

  // Records devices that are programmed only with registry images (an in-process host's, when it enumerates).
  void add_devices(const std::vector<HostDevice>& devices);

  // Checks an acquire of `bitstream` on devices of `kind` before it is queued, from memory only: reads no file.
  // Ok when `bitstream` is empty, or when no device of `kind` takes registry images (static hosts and host agents
  // treat names their own way). Else the registry must hold `bitstream` (highest version), and its image must not
  // have failed its last verification. Every check also queues the image for the worker, which verifies it again
  // (bitstreams::VerifiedImages: a stat, and a hash only when the file changed since it last verified), so a
  // changed file is refused by the checks that follow it; an image not verified yet is accepted (hosts verify it
  // in full right before programming). Whether it fits the devices' models is the core's business
  // (CoreOptions::image_models). Errors: "not_found", and the last verification's "checksum_mismatch",
  // "corrupt_image", "missing_file"; messages name the bitstream and the file.
  Status check(const std::string& kind, const std::string& bitstream) const;

  // An in-process host found the image with `sha256` bad right before programming it: checks refuse it from now
  // until the worker verifies it good again.
  void record_failure(const std::string& sha256, const Error& error);

  // Runs `job` on the catalog's worker, after what is queued already (slow file work: an upload's decoding,
  // writing and hashing). `job` must not call into the core; it posts what it has to say to the owner thread.
  void run_on_worker(std::function<void()> job);
  // Queues the image of `bitstream` (its highest version) for verification on the worker, once.
  void queue_verification(const std::string& bitstream) const;

  // Waits until the worker has run everything queued so far (tests, benchmarks).
  void settle() const;
  // How many times the worker hashed an image in full so far.
  std::uint64_t image_hashes() const;

  // The `compatible` patterns of the highest version of `bitstream` in the registry; nullopt when it holds no
  // such name. In memory: reads no file.
  std::optional<std::vector<std::string>> compatible_of(const std::string& bitstream) const;

  // Whether the highest version of `bitstream` in the registry is a partial image (manifest `image = partial`);
  // nullopt when it holds no such name. In memory: reads no file.
  std::optional<bool> is_partial(const std::string& bitstream) const;

  // The `bandwidth_demand` of the highest version of `bitstream` in the registry (0 to 1; 0 when not stated or when
  // it holds no such name). In memory: reads no file.
  double demand_of(const std::string& bitstream) const;
  // The slot shape a partial image fits (its manifest's `slot_shape`); "" for a full image or an unknown one.
  std::string slot_shape_of(const std::string& bitstream) const;

  // The sha256 of the highest version of `bitstream` in the registry, "" when it holds no such name.
  std::string sha256_of(const std::string& bitstream) const;

  // Whether some device of `kind` takes registry images.
  bool kind_uses_images(const std::string& kind) const;

 private:
  std::shared_ptr<bitstreams::SharedRegistry> registry_;
  std::shared_ptr<const Clock> clock_;
  mutable std::mutex mu_;
  std::set<std::string> image_kinds_;                     // kinds with devices that take registry images
  std::unique_ptr<bitstreams::VerifiedImages> verified_;  // images verified once per file version
  // The worker: its jobs, the bitstream names queued for verification (at most once each), and the verdict of
  // each image's last verification by sha256. Guarded by mu_.
  void work();
  void verify(const std::string& bitstream);
  void queue_verification_locked(const std::string& bitstream) const;
  mutable std::deque<std::function<void()>> jobs_;
  mutable std::set<std::string> queued_;
  mutable std::map<std::string, Status> verdicts_;
  // Counts record_failure calls: a verification that began before one must not store its verdict over the failure
  // (it may have read the file before it changed; the next check queues a fresh verification).
  std::uint64_t failures_recorded_ = 0;
  mutable bool busy_ = false;
  bool stopping_ = false;
  mutable std::condition_variable wake_, idle_;
  std::thread worker_;  // last: started once everything above exists
};

// A device's health changed on an in-process host: "ok", "degraded" or "failed", and why. Runs on the owner thread.
using DeviceHealth =
    std::function<void(const std::string& local_id, const std::string& health, const std::string& detail)>;

// An in-process host: a host::HostRuntime (pool-manager/host) over the backends, whose completions are posted to
// the owner thread. Operations on one device run in order, different devices in parallel. Bitstream names are
// resolved in `catalog`'s registry (null: a name stands for an image whose identity is the hash of the name,
// which only the simulated backend programs); an image is verified on disk before programming, once per version
// of its file, so a changed or corrupt file is never programmed, and a device that already holds the image (by
// sha256) is neither programmed nor is its file read. Every device is recorded in the catalog as taking registry
// images. Nothing is attached (AttachMode::in_process: the guest shares the host's process space). Health is
// checked at creation (devices() reports failed ones as not usable) and every 5 s after; changes go to
// `on_health`. Errors: "invalid_argument" (no backend, or a device id two backends report), an enumeration error.
Result<std::unique_ptr<HostDriver>> make_local_host(std::string name,
                                                    std::vector<std::unique_ptr<backends::DeviceBackend>> backends,
                                                    std::shared_ptr<ImageCatalog> catalog, Poster post,
                                                    DeviceHealth on_health = {});

// A host whose devices are declared in the configuration and driven by nothing: programming and reset only
// record what the device holds; completions are posted at once. For running the manager with no device backend
// (development, tests of the manager's own logic, benchmarks of the control path).
std::unique_ptr<HostDriver> make_static_host(std::string name, std::vector<HostDevice> devices, Poster post);

}  // namespace accelpool::manager
