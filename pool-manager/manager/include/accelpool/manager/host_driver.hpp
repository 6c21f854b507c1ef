// The manager's view of a host: the devices it offers, and the two slow things it does with them.
// The embedded default runs one host in-process (LocalHost over a DeviceBackend); remote host agents join
// behind the same interface.
#pragma once

#include <accelpool/common/result.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace accelpool::backends {
class DeviceBackend;
}

namespace accelpool::manager {

struct HostDevice {
  std::string local_id;
  std::string kind;
  std::string model;
  bool passthrough = true;
  std::string loaded;  // bitstream name the device holds now, "" for none or unknown
};

// Runs a completion on the pool's owner thread. Must not run it inline: it queues it.
using Poster = std::function<void(std::function<void()>)>;

class HostDriver {
 public:
  // Called with the outcome of a prepare or release; `loaded` is the bitstream the device holds afterwards.
  using Done = std::function<void(Status status, std::string loaded)>;

  virtual ~HostDriver() = default;

  // The host's name, unique in the pool (e.g. "local").
  virtual const std::string& name() const = 0;

  // The devices present now. Called on the owner thread at start; may block briefly (enumeration).
  virtual Result<std::vector<HostDevice>> devices() = 0;

  // Makes the device ready for a lease of `guest`: programs `bitstream` when `reprogram` is set (or when the
  // device does not hold it), then attaches the device to the guest. Returns at once; `done` runs later on the
  // owner thread (through the Poster). Operations on one device run in the order they were asked.
  virtual void prepare(const std::string& local_id, const std::string& bitstream, bool reprogram,
                       const std::string& guest, Done done) = 0;

  // Takes the device back after a lease: detaches it from the guest and resets it. Same threading as prepare.
  virtual void release(const std::string& local_id, Done done) = 0;

  // Resets a free device (admin request). Same threading as prepare.
  virtual void reset(const std::string& local_id, Done done) = 0;
};

// An in-process host over a device backend: operations run one at a time on a worker thread of its own, and
// completions are posted to the owner thread. Bitstream names map to backend images by name (the registry
// resolves files and checksums when it is wired in). Attach is a no-op: the guest shares the host's process
// space in the embedded default.
std::unique_ptr<HostDriver> make_local_host(std::string name, std::unique_ptr<backends::DeviceBackend> backend,
                                            Poster post);

// A host whose devices are declared in the configuration and driven by nothing: programming and reset only
// record what the device holds; completions are posted at once. For running the manager with no device backend
// (development, tests of the manager's own logic, benchmarks of the control path).
std::unique_ptr<HostDriver> make_static_host(std::string name, std::vector<HostDevice> devices, Poster post);

}  // namespace accelpool::manager
