// The two halves under libaccelpool-opencl.so's OpenCL entry points (icd.cpp): a Link, one connection to a device a
// host serves over the network (the remote OpenCL wire format, <accelpool/common/cl_wire.hpp>), and the Pool, which
// holds the process's lease and opens the link to the device it was granted (docs/remote-opencl.md).
//
// Threads: every public method may be called from any thread; a Link sends one request at a time.
#pragma once

#include <accelpool/common/cl_wire.hpp>
#include <accelpool/shim/transport.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace accelpool::clicd {

// What the program reads when the host cannot be reached any more: an OpenCL status for every call.
inline constexpr std::int32_t kLinkLost = -2;  // CL_DEVICE_NOT_AVAILABLE

class Link {
 public:
  // Connects to `endpoint` ("ocl+tcp://HOST:PORT/CAPABILITY", or "ocl+tls://..." verified against the PEM CA file
  // `ca_file`, "" the system's CAs) and presents its capability. Errors: nullptr, with `error` saying why.
  static std::shared_ptr<Link> connect(const std::string& endpoint, const std::string& ca_file, std::string& error);
  ~Link();

  // A request with no reply: queued and sent with the next request that has one, at flush(), or when the queue
  // holds a megabyte. False when the link is lost (the request is dropped). `tail`: the data of the request's last
  // field (see Writer::frame), sent from where it is, at once: the caller may reuse that memory when this returns.
  bool post(clwire::Writer& request, const std::string_view* tail = nullptr);
  // A request and its reply: sends what is queued, then `request` (and `tail`), and waits for the answer. Returns
  // the reply's status (kLinkLost when the link is lost) and leaves the reply's fields in `reply`.
  std::int32_t call(clwire::Writer& request, std::string& reply, const std::string_view* tail = nullptr);
  // A request whose reply is a status and one bytes field of `size` bytes, read straight into `out` (untouched
  // unless the status is 0). Returns the status; kLinkLost also when the data is not of that size.
  std::int32_t call_into(clwire::Writer& request, void* out, std::size_t size);
  // Sends what is queued. False when the link is lost.
  bool flush();

  // A fresh id for an object of this link (never 0).
  std::uint64_t next_id() { return ids_.fetch_add(1); }
  bool lost() const { return lost_.load(); }

 private:
  explicit Link(shim::Stream stream) : stream_(stream) {}
  bool send_locked(const char* data, std::size_t size);
  bool send_request_locked(clwire::Writer& request, const std::string_view* tail);
  bool flush_locked();
  void lose_locked();

  shim::Stream stream_;  // blocking
  std::mutex mu_;
  std::string queued_;
  std::atomic<bool> lost_{false};
  std::atomic<std::uint64_t> ids_{1};
};

// The device a lease granted this process, reached through its link.
struct Granted {
  std::shared_ptr<Link> link;
  std::string name;  // the pool's device name, e.g. "hv1/opencl:0:0"
};

// The process's lease. Acquired when a program first needs a device; released when the idle time passed after its
// last context was released, or when the process exits (a crash: the pool's lease TTL reclaims it). A lease that
// never had a context (a program that only lists devices) is held until the process exits.
class Pool {
 public:
  static Pool& instance();

  // The granted device, acquiring a lease first when none is held (this waits while the request queues). Errors:
  // nullptr, with `error` saying why (also printed once on stderr).
  std::shared_ptr<Granted> device(std::string& error);

  // Contexts alive: when the count falls to zero the idle timer starts; at its end the lease is released.
  void context_created();
  void context_released();

  ~Pool();

 private:
  Pool() = default;
  struct State;
  State& state();
  std::mutex mu_;
  std::unique_ptr<State> state_;
};

}  // namespace accelpool::clicd
