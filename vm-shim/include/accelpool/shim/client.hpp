// The guest-side client of the accelpool guest protocol (docs/guest-protocol.md): connect to the pool, acquire
// devices as RAII leases, keep them alive with background heartbeats, learn about revocation, and survive a
// dropped stream. Depends on the wire protocol only; plain POSIX sockets and poll(), so it links statically into
// small guest binaries.
//
// Threads: a Client owns one I/O thread (reads the stream, sends heartbeats, reconnects) and one callback thread
// (runs user callbacks in order). Every public method is thread-safe. Callbacks run on the callback thread: they
// may call the client (blocking calls included) but must not destroy the Client.
//
// Errors are values (accelpool::Error{code, message}). Codes a caller may branch on:
//   unreachable      the pool could not be reached (connect failed, no such socket or serial port)
//   unauthorized     the token was refused
//   infeasible       the pool has no devices that could ever serve the request
//   quota_exceeded   the tenant's device quota would be exceeded
//   timeout          the acquire (or a call) did not complete in time
//   cancelled        the acquire was cancelled by the caller
//   disconnected     the stream dropped while the call was in flight (its outcome is unknown)
//   not_found, invalid_state, invalid_argument, unsupported_version   as the protocol reports them
//   ended            the lease ended (expired, revoked) before it was granted or while waiting
//   protocol         the server sent something this client does not understand
//   closed           the Client was closed
//   internal         anything else
#pragma once

#include <accelpool/common/result.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accelpool::shim {

using Seconds = std::chrono::duration<double>;

// Where the pool is, who we are, and how patient to be.
struct ClientOptions {
  // tcp://HOST:PORT, tls://HOST:PORT (TCP with TLS), unix:///abs/path, or serial://NAME (the virtio-serial port
  // whose /sys/class/virtio-ports/*/name is NAME, opened as /dev/<port>); or a comma-separated list of them, the
  // managers of one pool (docs/ha.md): the client connects to the one that leads, trying them in turn from the
  // last that answered, and follows a standby's answer to the leader's address; on every reconnect too.
  std::string uri;
  // tls://: the PEM CA file that verifies the pool's certificate ("": $ACCELPOOL_POOL_CA, else the system's CAs).
  std::string tls_ca_file;
  std::string token;             // tenant token (apt_...)
  std::string guest;             // guest id, 1-128 of [A-Za-z0-9._:-]; the same id after a reconnect resumes the leases
  std::string guest_host;        // optional: the host the guest runs on
  Seconds connect_timeout{5.0};  // per connection attempt
  Seconds call_timeout{10.0};    // a call with no reply within this fails with "timeout"
  bool reconnect = true;         // reconnect and resume leases when the stream drops
  Seconds reconnect_max_backoff{2.0};                      // backoff between attempts doubles from 50 ms up to this
  std::optional<Seconds> heartbeat_interval;               // default: a third of the lease TTL the server reports
  std::string serial_sys_dir = "/sys/class/virtio-ports";  // where serial:// names are looked up
  std::string serial_dev_dir = "/dev";                     // where the port's device node is
};

// One device of a grant. Fields other than `name` are filled from what the lease carries: the lease's
// "device_info" entry for the device (docs/guest-protocol.md, "The lease": what its host did when it prepared it)
// where the server sent one, which is taken as it is; the OpenCL and XRT indexes, which the server does not send,
// from what the documented device id formats say (HOST/opencl:P:D[.N], HOST/xrt:BDF, HOST/sim:N), as is the PCI
// address of an xrt device when the server sent no entry.
struct DeviceInfo {
  std::string name;                 // pool device name, e.g. "local/sim:0"
  std::string host;                 // the part before '/', e.g. "local"
  std::string local_id;             // the part after '/', e.g. "opencl:0:0.1"
  std::string backend;              // "opencl", "xrt", "sim", ... (prefix of local_id)
  std::string kind;                 // "fpga", "gpu", ... when the server reports it
  std::string model;                // when the server reports it
  std::string vendor;               // when the server reports it
  std::uint32_t pci_vendor_id = 0;  // PCI ids (0: unknown)
  std::uint32_t pci_device_id = 0;
  std::uint64_t memory_bytes = 0;  // device memory (0: unknown)
  // How the guest reaches the device: "pci_hostdev" or "emulated" (a PCI device in this VM, at pci_address),
  // "network" (at endpoint), "in_process" (the manager's own host), "none"; "" when the server did not say.
  std::string attach;
  std::string loaded;                   // bitstream the device held when it was prepared
  std::string pci_address;              // PCI address (in the guest when attached, else the host's BDF)
  std::optional<int> opencl_platform;   // OpenCL platform index (device local to the caller)
  std::optional<int> opencl_device;     // OpenCL device index
  std::optional<int> opencl_subdevice;  // sub-device index when the pool splits a device
  std::optional<int> xrt_index;         // XRT device index when reported
  std::string endpoint;                 // network endpoint for network-attached devices, when reported
};

enum class LeaseState { queued, granted, revoking, released, cancelled, expired, revoked, unknown };
const char* to_string(LeaseState s);
bool is_terminal(LeaseState s);

// A snapshot of a lease as the server last described it.
struct LeaseInfo {
  std::uint64_t id = 0;
  LeaseState state = LeaseState::unknown;
  bool ready = false;
  std::string tenant, guest, kind, bitstream, end_reason;
  std::string label;  // the job's name given at acquire ("" none)
  std::uint32_t count = 0;
  std::vector<DeviceInfo> devices;
  double created_at = 0, granted_at = 0, expires_at = 0;
  std::optional<double> revoke_deadline;  // set while revoking: release before this (seconds since the epoch)
  std::string json;                       // the lease object exactly as received (one line of JSON)
};

// Parses a lease object (the JSON text of one lease). Errors: "protocol" naming the missing/bad field.
Result<LeaseInfo> parse_lease(const std::string& json_text);

// Called when a held lease enters its grace period (lease.revoking) or ends on the server's side
// (expired/revoked). Runs on the client's callback thread.
using LeaseCallback = std::function<void(const LeaseInfo&)>;

struct AcquireOptions {
  std::string kind;                  // required, e.g. "fpga"
  std::string bitstream;             // optional
  std::uint32_t count = 1;           // all or nothing
  std::optional<double> estimate_s;  // run-time estimate for sjf/srpt policies
  std::string label;                 // optional name of the job, e.g. its command: the pool learns run
                                     // times per label (1-64 characters of [A-Za-z0-9._:-])
  std::optional<Seconds> timeout;    // none: wait as long as it takes
  LeaseCallback on_revoking;         // optional; set here so a revocation right after the grant is seen
  LeaseCallback on_ended;            // optional: the lease ended without our release (expired, revoked)
};

class Client;
namespace detail {
struct ClientCore;
struct LeaseSlot;
struct AcquireSlot;
}  // namespace detail

// A granted lease. Released when destroyed (or by release()). Move-only. Outliving its Client is allowed: the
// lease is then already released (the Client releases what it holds when it is closed).
class Lease {
 public:
  Lease() = default;
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;  // releases the lease held before
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();  // releases (blocking up to the call timeout; errors are swallowed: use release() to see them)

  bool valid() const { return static_cast<bool>(slot_); }
  std::uint64_t id() const;
  // The latest description (updated by notifications). Empty LeaseInfo when !valid().
  LeaseInfo info() const;
  LeaseState state() const;
  bool revoking() const { return state() == LeaseState::revoking; }

  // Sets the revocation callback; if the lease is already revoking it runs at once (on the callback thread).
  void on_revoking(LeaseCallback cb);
  void on_ended(LeaseCallback cb);

  // Waits until the lease is granted and ready again after a requeue (lease.requeued). Errors: "timeout",
  // "ended" (it ended meanwhile).
  Status wait_ready(std::optional<Seconds> timeout = std::nullopt);

  // Ends the lease now. Idempotent: a second call, or one on a lease the server already ended, is ok.
  // Retries once after a reconnect when the stream dropped during the call. Errors: "closed", "timeout",
  // "unreachable" when the pool cannot be reached.
  Status release();

 private:
  friend class Client;
  friend class PendingAcquire;
  Lease(std::shared_ptr<detail::ClientCore> core, std::shared_ptr<detail::LeaseSlot> slot);
  std::shared_ptr<detail::ClientCore> core_;
  std::shared_ptr<detail::LeaseSlot> slot_;
};

// An acquire in progress (Client::acquire_async). Destroying it without taking the lease cancels the request (or
// releases the lease if it was granted meanwhile).
class PendingAcquire {
 public:
  PendingAcquire() = default;
  PendingAcquire(PendingAcquire&&) noexcept;
  PendingAcquire& operator=(PendingAcquire&&) noexcept;
  PendingAcquire(const PendingAcquire&) = delete;
  PendingAcquire& operator=(const PendingAcquire&) = delete;
  ~PendingAcquire();

  // The lease id once the server has accepted the request (0 before, or when the request failed).
  std::uint64_t lease_id() const;
  // True once wait() would return at once.
  bool done() const;
  // Waits up to `timeout` (none: the acquire's own timeout, or forever). Returns the lease once, then
  // "invalid_state". Errors: those of Client::acquire, and "timeout" when this wait's timeout (not the
  // acquire's) passed: the request is still pending then and wait() may be called again.
  Result<Lease> wait(std::optional<Seconds> timeout = std::nullopt);
  // Gives up: cancels a queued request, releases a lease granted meanwhile. wait() then returns "cancelled".
  Status cancel();

 private:
  friend class Client;
  std::shared_ptr<detail::ClientCore> core_;
  std::shared_ptr<detail::AcquireSlot> slot_;
  bool taken_ = false;
};

class Client {
 public:
  // Connects and says hello. Errors: "invalid_argument" (bad URI/guest), "unreachable", "unauthorized",
  // "unsupported_version", "timeout".
  static Result<std::unique_ptr<Client>> connect(ClientOptions options);
  ~Client();  // releases the leases still held (best effort), then stops the threads
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Acquires and waits until the devices are ready. On timeout the request is cancelled (a lease granted in the
  // race is released). Errors: "invalid_argument", "infeasible", "quota_exceeded", "timeout", "ended",
  // "disconnected" (the stream dropped during the acquire call itself), "unreachable", "closed".
  Result<Lease> acquire(const AcquireOptions& options);
  // Starts an acquire and returns at once. `on_done`, if given, runs on the callback thread when the request is
  // granted and ready, fails, or is cancelled (with the lease id, 0 if none, and the error if any); the lease
  // itself is taken with PendingAcquire::wait().
  PendingAcquire acquire_async(const AcquireOptions& options,
                               std::function<void(std::uint64_t lease, const Status&)> on_done = {});

  // The server's view of one of the tenant's leases, or this guest's live ones.
  Result<LeaseInfo> get(std::uint64_t lease);
  Result<std::vector<LeaseInfo>> list();

  // Tenant the server authenticated us as; the number of (re)connections made so far (1 after connect()).
  std::string tenant() const;
  std::uint64_t connections() const;
  bool connected() const;

  // Test and diagnostics hook: closes the current stream as if it dropped (the client reconnects if enabled).
  void drop_connection_for_testing();

 private:
  explicit Client(std::shared_ptr<detail::ClientCore> core);
  std::shared_ptr<detail::ClientCore> core_;
};

}  // namespace accelpool::shim
