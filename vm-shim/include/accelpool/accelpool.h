/* accelpool guest client, C ABI.
 *
 * Opaque handles over the C++ client (accelpool/shim/client.hpp); no exception crosses this interface. Every
 * function that can fail returns an accelpool_status; the message of the last failure on the calling thread is
 * accelpool_last_error(). Strings returned by the library stay valid as long as the handle they came from.
 *
 *   accelpool_client* c;
 *   if (accelpool_connect("tcp://127.0.0.1:7070", token, "vm-7", &c) != ACCELPOOL_OK) die(accelpool_last_error());
 *   accelpool_acquire_options o = accelpool_acquire_options_default();
 *   o.kind = "fpga"; o.bitstream = "vadd"; o.timeout_s = 60;
 *   accelpool_lease* l;
 *   if (accelpool_acquire(c, &o, &l) == ACCELPOOL_OK) { ... accelpool_lease_free(l); }   // free releases
 *   accelpool_client_free(c);
 */
#ifndef ACCELPOOL_ACCELPOOL_H
#define ACCELPOOL_ACCELPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum accelpool_status {
  ACCELPOOL_OK = 0,
  ACCELPOOL_ERR_INVALID_ARGUMENT = 1, /* bad URI, guest id, options, or a NULL handle */
  ACCELPOOL_ERR_UNREACHABLE = 2,      /* the pool cannot be reached */
  ACCELPOOL_ERR_UNAUTHORIZED = 3,     /* the token was refused */
  ACCELPOOL_ERR_INFEASIBLE = 4,       /* no device could ever serve the request */
  ACCELPOOL_ERR_TIMEOUT = 5,          /* not granted (or no answer) in time */
  ACCELPOOL_ERR_CANCELLED = 6,        /* the acquire was cancelled */
  ACCELPOOL_ERR_NOT_FOUND = 7,        /* no such lease */
  ACCELPOOL_ERR_INVALID_STATE = 8,    /* e.g. taking a lease twice */
  ACCELPOOL_ERR_QUOTA_EXCEEDED = 9,   /* the tenant's device quota would be exceeded */
  ACCELPOOL_ERR_DISCONNECTED = 10,    /* the stream dropped during the call; its outcome is unknown */
  ACCELPOOL_ERR_ENDED = 11,           /* the lease ended (expired, revoked) */
  ACCELPOOL_ERR_PROTOCOL = 12,        /* the server sent something this client does not understand */
  ACCELPOOL_ERR_CLOSED = 13,          /* the client was closed */
  ACCELPOOL_ERR_INTERNAL = 14         /* anything else */
} accelpool_status;

typedef struct accelpool_client accelpool_client;
typedef struct accelpool_lease accelpool_lease;
typedef struct accelpool_request accelpool_request;

/* The message of the last failure on this thread ("" if none). Valid until the next call on this thread. */
const char* accelpool_last_error(void);
/* A stable name for a status, e.g. "unreachable". */
const char* accelpool_status_name(accelpool_status status);

/* Connects to `uri` (tcp://HOST:PORT, unix:///PATH, serial://NAME) and says hello with `token` as `guest` (NULL or
 * "": the host name). Resumes the guest's leases after a reconnect. */
accelpool_status accelpool_connect(const char* uri, const char* token, const char* guest, accelpool_client** out);
/* Releases the leases the client still holds, then closes it. NULL is allowed. */
void accelpool_client_free(accelpool_client* client);

typedef struct accelpool_acquire_options {
  const char* kind;      /* required */
  const char* bitstream; /* NULL or "": any */
  uint32_t count;        /* 0 means 1 */
  double estimate_s;     /* < 0: no estimate */
  double timeout_s;      /* < 0: wait forever */
  const char* label;     /* NULL or "": none; the job's name (e.g. its command), the pool learns run times by it */
} accelpool_acquire_options;

/* kind NULL, bitstream NULL, count 1, no estimate, no timeout, no label. */
accelpool_acquire_options accelpool_acquire_options_default(void);

/* Acquires and waits until the devices are ready. */
accelpool_status accelpool_acquire(accelpool_client* client, const accelpool_acquire_options* options,
                                   accelpool_lease** out);

/* Asynchronous acquire: start, then wait (with a timeout per wait) or cancel; free the request when done. */
accelpool_status accelpool_acquire_start(accelpool_client* client, const accelpool_acquire_options* options,
                                         accelpool_request** out);
/* Waits up to timeout_s (< 0: until done). ACCELPOOL_ERR_TIMEOUT with *out untouched when this wait timed out and
 * the request is still pending. */
accelpool_status accelpool_request_wait(accelpool_request* request, double timeout_s, accelpool_lease** out);
accelpool_status accelpool_request_cancel(accelpool_request* request);
/* Cancels the request if its lease was not taken. NULL is allowed. */
void accelpool_request_free(accelpool_request* request);

uint64_t accelpool_lease_id(const accelpool_lease* lease);
const char* accelpool_lease_kind(const accelpool_lease* lease);
const char* accelpool_lease_bitstream(const accelpool_lease* lease);
size_t accelpool_lease_device_count(const accelpool_lease* lease);
/* The pool's name of device `index` ("host/local-id"), NULL when out of range. */
const char* accelpool_lease_device(const accelpool_lease* lease, size_t index);
/* 1 when device `index` is an OpenCL device local to the caller; fills its platform and device index (in the ICD
 * loader's order) and its sub-device index (-1 when the pool does not split it). 0 otherwise. */
int accelpool_lease_device_opencl(const accelpool_lease* lease, size_t index, int* platform, int* device,
                                  int* subdevice);
/* The PCI address of device `index` when known ("" otherwise): in this VM when the device was attached to it. */
const char* accelpool_lease_device_pci(const accelpool_lease* lease, size_t index);
/* What the pool's host said of device `index` (docs/guest-protocol.md, "The lease", device_info): `field` is one of
 * "kind", "model", "vendor", "attach" ("pci_hostdev", "emulated", "network", "in_process", "none"), "endpoint",
 * "loaded". "" when the host did not say, and for an unknown field or an index out of range. */
const char* accelpool_lease_device_info(const accelpool_lease* lease, size_t index, const char* field);
/* The same for the numbers: `field` is "pci_vendor_id", "pci_device_id" or "memory_bytes". 0 when unknown. */
uint64_t accelpool_lease_device_number(const accelpool_lease* lease, size_t index, const char* field);
/* The lease object as the server last described it (JSON text). */
const char* accelpool_lease_json(accelpool_lease* lease);
/* 1 while the lease is in its revocation grace period. */
int accelpool_lease_revoking(const accelpool_lease* lease);

/* Called on the client's callback thread when the lease enters its grace period; `deadline` is seconds since the
 * epoch. If the lease is already revoking, it is called at once. */
typedef void (*accelpool_revoke_fn)(uint64_t lease_id, double deadline, void* user);
void accelpool_lease_on_revoking(accelpool_lease* lease, accelpool_revoke_fn fn, void* user);

/* Releases the lease (idempotent). */
accelpool_status accelpool_lease_release(accelpool_lease* lease);
/* Releases the lease if still held and frees the handle. NULL is allowed. */
void accelpool_lease_free(accelpool_lease* lease);

#ifdef __cplusplus
}
#endif

#endif /* ACCELPOOL_ACCELPOOL_H */
