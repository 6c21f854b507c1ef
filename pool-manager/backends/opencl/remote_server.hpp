// The opencl backend's remote server: serves a leased device to programs on other machines (and in VMs) through
// the guest's OpenCL library, libaccelpool-opencl.so (docs/remote-opencl.md). The program's OpenCL calls arrive as
// frames of the remote OpenCL wire format (<accelpool/common/cl_wire.hpp>) and run here on the real device.
//
// A device is served only while it is open for a lease: open() mints a capability (a random 256-bit secret, part
// of the endpoint the grant carries to the guest) and close() ends it, cuts the device's connections and releases
// every OpenCL object their programs made, so the next tenant finds the device clean. A connection that does not
// present an open capability as its first frame is closed.
//
// Threads: one thread accepts, one thread per connection runs its calls in order. Every public method may be
// called from any thread. Private to the opencl backend: the OpenCL device handle is passed as `void*`.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/common/tls.hpp>

#include <functional>
#include <memory>
#include <string>

namespace accelpool::backends {

class RemoteServer {
 public:
  // Listens on `listen` ("HOST:PORT", port 0 picks a free one). Endpoints name `advertise` ("HOST:PORT"; "" the
  // listening address, which must then not be a wildcard). With a `tls` server context every connection is TLS
  // (endpoints "ocl+tls://..."). `log` gets one line per connection event. Errors: "invalid_argument" (a malformed
  // address), "io_error" (the address cannot be bound).
  static Result<std::unique_ptr<RemoteServer>> start(const std::string& listen, const std::string& advertise,
                                                     common::tls::Context tls,
                                                     std::function<void(const std::string&)> log);
  // Stops accepting, cuts every connection and releases their objects.
  ~RemoteServer();

  // Opens `local_id` (OpenCL device `device`, a cl_device_id) for one lease and returns its endpoint
  // "ocl+tcp://HOST:PORT/CAPABILITY" ("ocl+tls://" with TLS). A device that is open already is closed first (its old
  // capability ends).
  std::string open(const std::string& local_id, void* device);

  // Ends `local_id`'s capability, cuts its connections and returns once every object they made is released
  // (a kernel running then finishes first: OpenCL cannot abort one). A device that is not open: nothing to do.
  void close(const std::string& local_id);

  // "HOST:PORT" the server listens on (the port it picked when asked for 0).
  std::string address() const;

  struct Impl;

 private:
  explicit RemoteServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelpool::backends
