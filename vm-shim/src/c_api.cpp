// The C ABI over the C++ client. Every entry point catches everything: no exception crosses into C.
#include <accelpool/accelpool.h>
#include <accelpool/shim/client.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

using accelpool::Errc;
using accelpool::Error;
using namespace accelpool::shim;

struct accelpool_client {
  std::unique_ptr<Client> client;
};

struct accelpool_lease {
  Lease lease;
  LeaseInfo snapshot;  // strings handed out point into this
  std::string json;
};

struct accelpool_request {
  PendingAcquire pending;
};

namespace {

thread_local std::string t_last_error;

accelpool_status status_of(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
    case Errc::unsupported_version:
      return ACCELPOOL_ERR_INVALID_ARGUMENT;
    case Errc::unreachable:
      return ACCELPOOL_ERR_UNREACHABLE;
    case Errc::unauthorized:
      return ACCELPOOL_ERR_UNAUTHORIZED;
    case Errc::infeasible:
      return ACCELPOOL_ERR_INFEASIBLE;
    case Errc::timeout:
      return ACCELPOOL_ERR_TIMEOUT;
    case Errc::cancelled:
      return ACCELPOOL_ERR_CANCELLED;
    case Errc::not_found:
      return ACCELPOOL_ERR_NOT_FOUND;
    case Errc::invalid_state:
      return ACCELPOOL_ERR_INVALID_STATE;
    case Errc::quota_exceeded:
      return ACCELPOOL_ERR_QUOTA_EXCEEDED;
    case Errc::disconnected:
      return ACCELPOOL_ERR_DISCONNECTED;
    case Errc::ended:
      return ACCELPOOL_ERR_ENDED;
    case Errc::protocol:
      return ACCELPOOL_ERR_PROTOCOL;
    case Errc::closed:
      return ACCELPOOL_ERR_CLOSED;
    default:
      return ACCELPOOL_ERR_INTERNAL;
  }
}

accelpool_status fail(const Error& e) {
  t_last_error = e.message;
  return status_of(e.code);
}

accelpool_status fail(accelpool_status s, const std::string& message) {
  t_last_error = message;
  return s;
}

template <typename F>
accelpool_status guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return fail(ACCELPOOL_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(ACCELPOOL_ERR_INTERNAL, "internal error");
  }
}

// The options of the acquire call `call` ("acquire", "acquire_start"), whose client and out must not be NULL.
accelpool::Result<AcquireOptions> to_options(const char* call, const accelpool_client* client,
                                             const accelpool_acquire_options* o, const void* out) {
  if (!client || !out) {
    return accelpool::make_error(Errc::invalid_argument, std::string(call) + ": client and out are required");
  }
  if (!o) return accelpool::make_error(Errc::invalid_argument, "acquire: options are NULL");
  if (!o->kind || !*o->kind) return accelpool::make_error(Errc::invalid_argument, "acquire: 'kind' is required");
  AcquireOptions a;
  a.kind = o->kind;
  if (o->bitstream) a.bitstream = o->bitstream;
  a.count = o->count == 0 ? 1 : o->count;
  if (o->estimate_s >= 0) a.estimate_s = o->estimate_s;
  if (o->timeout_s >= 0) a.timeout = Seconds(o->timeout_s);
  if (o->label) a.label = o->label;
  return a;
}

accelpool_lease* wrap(Lease&& l) {
  auto* h = new accelpool_lease{std::move(l), {}, {}};
  h->snapshot = h->lease.info();
  return h;
}

// ACCELPOOL_OK, or the status of the error (which accelpool_last_error then returns).
accelpool_status ok_or_fail(const accelpool::Status& s) { return s ? ACCELPOOL_OK : fail(s.error()); }

// Hands the lease in `l` to C through `out` (a handle the caller frees), or fails with its error.
accelpool_status hand_out(accelpool::Result<Lease>&& l, accelpool_lease** out) {
  if (!l) return fail(l.error());
  *out = wrap(std::move(*l));
  return ACCELPOOL_OK;
}

// Frees a handle given to C (NULL is a no-op); no exception escapes.
template <typename Handle>
void free_handle(Handle* h) noexcept {
  try {
    delete h;
  } catch (...) {
  }
}

}  // namespace

extern "C" {

const char* accelpool_last_error(void) { return t_last_error.c_str(); }

const char* accelpool_status_name(accelpool_status s) {
  switch (s) {
    case ACCELPOOL_OK:
      return "ok";
    case ACCELPOOL_ERR_INVALID_ARGUMENT:
      return "invalid_argument";
    case ACCELPOOL_ERR_UNREACHABLE:
      return "unreachable";
    case ACCELPOOL_ERR_UNAUTHORIZED:
      return "unauthorized";
    case ACCELPOOL_ERR_INFEASIBLE:
      return "infeasible";
    case ACCELPOOL_ERR_TIMEOUT:
      return "timeout";
    case ACCELPOOL_ERR_CANCELLED:
      return "cancelled";
    case ACCELPOOL_ERR_NOT_FOUND:
      return "not_found";
    case ACCELPOOL_ERR_INVALID_STATE:
      return "invalid_state";
    case ACCELPOOL_ERR_QUOTA_EXCEEDED:
      return "quota_exceeded";
    case ACCELPOOL_ERR_DISCONNECTED:
      return "disconnected";
    case ACCELPOOL_ERR_ENDED:
      return "ended";
    case ACCELPOOL_ERR_PROTOCOL:
      return "protocol";
    case ACCELPOOL_ERR_CLOSED:
      return "closed";
    case ACCELPOOL_ERR_INTERNAL:
      return "internal";
  }
  return "unknown";
}

accelpool_status accelpool_connect(const char* uri, const char* token, const char* guest, accelpool_client** out) {
  return guarded([&] {
    if (!uri || !token || !out) return fail(ACCELPOOL_ERR_INVALID_ARGUMENT, "connect: uri, token and out are required");
    ClientOptions o;
    o.uri = uri;
    o.token = token;
    if (guest) o.guest = guest;
    auto c = Client::connect(o);
    if (!c) return fail(c.error());
    *out = new accelpool_client{std::move(*c)};
    return ACCELPOOL_OK;
  });
}

void accelpool_client_free(accelpool_client* client) { free_handle(client); }

accelpool_acquire_options accelpool_acquire_options_default(void) {
  accelpool_acquire_options o;
  o.kind = nullptr;
  o.bitstream = nullptr;
  o.count = 1;
  o.estimate_s = -1;
  o.timeout_s = -1;
  o.label = nullptr;
  return o;
}

accelpool_status accelpool_acquire(accelpool_client* client, const accelpool_acquire_options* options,
                                   accelpool_lease** out) {
  return guarded([&] {
    auto o = to_options("acquire", client, options, out);
    if (!o) return fail(o.error());
    return hand_out(client->client->acquire(*o), out);
  });
}

accelpool_status accelpool_acquire_start(accelpool_client* client, const accelpool_acquire_options* options,
                                         accelpool_request** out) {
  return guarded([&] {
    auto o = to_options("acquire_start", client, options, out);
    if (!o) return fail(o.error());
    *out = new accelpool_request{client->client->acquire_async(*o)};
    return ACCELPOOL_OK;
  });
}

accelpool_status accelpool_request_wait(accelpool_request* request, double timeout_s, accelpool_lease** out) {
  return guarded([&] {
    if (!request || !out) return fail(ACCELPOOL_ERR_INVALID_ARGUMENT, "request_wait: request and out are required");
    return hand_out(timeout_s < 0 ? request->pending.wait() : request->pending.wait(Seconds(timeout_s)), out);
  });
}

accelpool_status accelpool_request_cancel(accelpool_request* request) {
  return guarded([&] {
    if (!request) return fail(ACCELPOOL_ERR_INVALID_ARGUMENT, "request_cancel: request is NULL");
    return ok_or_fail(request->pending.cancel());
  });
}

void accelpool_request_free(accelpool_request* request) { free_handle(request); }

uint64_t accelpool_lease_id(const accelpool_lease* lease) { return lease ? lease->snapshot.id : 0; }
const char* accelpool_lease_kind(const accelpool_lease* lease) { return lease ? lease->snapshot.kind.c_str() : ""; }
const char* accelpool_lease_bitstream(const accelpool_lease* lease) {
  return lease ? lease->snapshot.bitstream.c_str() : "";
}
size_t accelpool_lease_device_count(const accelpool_lease* lease) { return lease ? lease->snapshot.devices.size() : 0; }
const char* accelpool_lease_device(const accelpool_lease* lease, size_t index) {
  if (!lease || index >= lease->snapshot.devices.size()) return nullptr;
  return lease->snapshot.devices[index].name.c_str();
}

int accelpool_lease_device_opencl(const accelpool_lease* lease, size_t index, int* platform, int* device,
                                  int* subdevice) {
  if (!lease || index >= lease->snapshot.devices.size()) return 0;
  const DeviceInfo& d = lease->snapshot.devices[index];
  if (!d.opencl_platform || !d.opencl_device) return 0;
  if (platform) *platform = *d.opencl_platform;
  if (device) *device = *d.opencl_device;
  if (subdevice) *subdevice = d.opencl_subdevice.value_or(-1);
  return 1;
}

const char* accelpool_lease_device_info(const accelpool_lease* lease, size_t index, const char* field) {
  if (!lease || !field || index >= lease->snapshot.devices.size()) return "";
  const DeviceInfo& d = lease->snapshot.devices[index];
  const std::string_view f(field);
  for (const auto& [name, value] : {std::pair<std::string_view, const std::string*>{"kind", &d.kind},
                                    {"model", &d.model},
                                    {"vendor", &d.vendor},
                                    {"attach", &d.attach},
                                    {"endpoint", &d.endpoint},
                                    {"loaded", &d.loaded}}) {
    if (f == name) return value->c_str();
  }
  return "";
}
uint64_t accelpool_lease_device_number(const accelpool_lease* lease, size_t index, const char* field) {
  if (!lease || !field || index >= lease->snapshot.devices.size()) return 0;
  const DeviceInfo& d = lease->snapshot.devices[index];
  const std::string_view f(field);
  if (f == "pci_vendor_id") return d.pci_vendor_id;
  if (f == "pci_device_id") return d.pci_device_id;
  if (f == "memory_bytes") return d.memory_bytes;
  return 0;
}
const char* accelpool_lease_device_pci(const accelpool_lease* lease, size_t index) {
  if (!lease || index >= lease->snapshot.devices.size()) return "";
  return lease->snapshot.devices[index].pci_address.c_str();
}

const char* accelpool_lease_json(accelpool_lease* lease) {
  if (!lease) return "";
  try {
    lease->json = lease->lease.info().json;
  } catch (...) {
  }
  return lease->json.c_str();
}

int accelpool_lease_revoking(const accelpool_lease* lease) {
  try {
    return lease && lease->lease.revoking() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void accelpool_lease_on_revoking(accelpool_lease* lease, accelpool_revoke_fn fn, void* user) {
  if (!lease) return;
  try {
    if (!fn) {
      lease->lease.on_revoking({});
      return;
    }
    lease->lease.on_revoking(
        [fn, user](const LeaseInfo& info) { fn(info.id, info.revoke_deadline.value_or(0), user); });
  } catch (...) {
  }
}

accelpool_status accelpool_lease_release(accelpool_lease* lease) {
  return guarded([&] {
    if (!lease) return fail(ACCELPOOL_ERR_INVALID_ARGUMENT, "release: lease is NULL");
    return ok_or_fail(lease->lease.release());
  });
}

void accelpool_lease_free(accelpool_lease* lease) { free_handle(lease); }

}  // extern "C"
