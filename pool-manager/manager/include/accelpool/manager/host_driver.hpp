// The manager's view of a host: the devices it offers, and the two slow things it does with them.
// The embedded default runs one host in-process (LocalHost over a DeviceBackend); remote host agents join
// behind the same interface.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/host/contract.hpp>
#include <accelpool/manager/clock.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace accelpool::backends {
class DeviceBackend;
}
namespace accelpool::bitstreams {
class SharedRegistry;
class VerifiedImages;
}

namespace accelpool::manager {

struct HostDevice {
  std::string local_id;
  std::string kind;
  std::string model;
  bool passthrough = true;
  std::string loaded;  // bitstream name the device holds now, "" for none or unknown
  bool usable = true;  // false: the host reports it failed (attach_host's caller lists it in HostReport::unusable)
};

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

// The manager's bitstream registry as hosts and acquires see it, and the device models that take its images.
// Threading: every call locks; any thread.
class ImageCatalog {
 public:
  // `clock` tells how old an image file's last write is (see check); it is read from whichever thread calls
  // check, so it must be safe to read from any thread (wall time by default; tests move a ManualClock by hand).
  explicit ImageCatalog(std::shared_ptr<bitstreams::SharedRegistry> registry,
                        std::shared_ptr<const Clock> clock = std::make_shared<SystemClock>());
  ~ImageCatalog();

  const std::shared_ptr<bitstreams::SharedRegistry>& registry() const { return registry_; }

  // Records devices that are programmed only with registry images (an in-process host's, when it enumerates).
  void add_devices(const std::vector<HostDevice>& devices);

  // Checks an acquire of `bitstream` on devices of `kind` before it is queued. Ok when `bitstream` is empty, or
  // when no device of `kind` takes registry images (static hosts and host agents treat names their own way).
  // Else the registry must hold `bitstream` (highest version), its image must verify on disk, and it must fit
  // the model of at least one such device. The image is hashed again only when its file changed (size, times,
  // inode) since it last verified, so an acquire does not read a large image on the owner thread each time
  // (file times tick coarsely, so a file written less than a second before the clock's now is hashed on every
  // check); hosts still verify it in full right before programming. Errors: "not_found", "incompatible",
  // "checksum_mismatch", "corrupt_image", "missing_file"; messages name the bitstream, the kind and the models.
  Status check(const std::string& kind, const std::string& bitstream) const;

  // The sha256 of the highest version of `bitstream` in the registry, "" when it holds no such name.
  std::string sha256_of(const std::string& bitstream) const;

  // Whether some device of `kind` takes registry images.
  bool kind_uses_images(const std::string& kind) const;

 private:
  std::shared_ptr<bitstreams::SharedRegistry> registry_;
  std::shared_ptr<const Clock> clock_;
  mutable std::mutex mu_;
  std::map<std::string, std::set<std::string>> models_;  // kind -> models of devices that take registry images
  std::unique_ptr<bitstreams::VerifiedImages> verified_;  // images verified once per file version
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
