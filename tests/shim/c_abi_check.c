/* Exercises the C ABI against a running pool. Usage: shim_c_abi_check URI TOKEN GUEST
 * Prints one line per check; exits 0 when every check passed, 1 otherwise. */
#include <accelpool/accelpool.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (cond) {                                                                               \
      printf("ok   %s\n", #cond);                                                             \
    } else {                                                                                  \
      printf("FAIL %s (line %d; last error: %s)\n", #cond, __LINE__, accelpool_last_error()); \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s URI TOKEN GUEST\n", argv[0]);
    return 2;
  }
  accelpool_client* client = NULL;

  CHECK(accelpool_connect(argv[1], "apt_wrong", argv[3], &client) == ACCELPOOL_ERR_UNAUTHORIZED);
  CHECK(strlen(accelpool_last_error()) > 0);
  CHECK(accelpool_connect("bogus://x", argv[2], argv[3], &client) == ACCELPOOL_ERR_INVALID_ARGUMENT);
  CHECK(accelpool_connect("unix:///nonexistent/accelpool.sock", argv[2], argv[3], &client) ==
        ACCELPOOL_ERR_UNREACHABLE);
  CHECK(strcmp(accelpool_status_name(ACCELPOOL_ERR_INFEASIBLE), "infeasible") == 0);

  if (accelpool_connect(argv[1], argv[2], argv[3], &client) != ACCELPOOL_OK) {
    printf("FAIL connect: %s\n", accelpool_last_error());
    return 1;
  }

  accelpool_acquire_options o = accelpool_acquire_options_default();
  accelpool_lease* lease = NULL;
  CHECK(accelpool_acquire(client, &o, &lease) == ACCELPOOL_ERR_INVALID_ARGUMENT); /* no kind */
  o.kind = "no-such-kind";
  CHECK(accelpool_acquire(client, &o, &lease) == ACCELPOOL_ERR_INFEASIBLE);
  CHECK(lease == NULL);

  o.kind = "fpga";
  o.timeout_s = 5;
  CHECK(o.label == NULL);
  o.label = "bad label";
  CHECK(accelpool_acquire(client, &o, &lease) == ACCELPOOL_ERR_INVALID_ARGUMENT);
  o.label = "c-check";
  CHECK(accelpool_acquire(client, &o, &lease) == ACCELPOOL_OK);
  if (lease) {
    CHECK(strstr(accelpool_lease_json(lease), "\"label\":\"c-check\"") != NULL);
    CHECK(accelpool_lease_id(lease) > 0);
    CHECK(strcmp(accelpool_lease_kind(lease), "fpga") == 0);
    CHECK(accelpool_lease_device_count(lease) == 1);
    CHECK(accelpool_lease_device(lease, 0) != NULL && strncmp(accelpool_lease_device(lease, 0), "local/", 6) == 0);
    CHECK(accelpool_lease_device(lease, 1) == NULL);
    CHECK(strstr(accelpool_lease_json(lease), "\"granted\"") != NULL);
    CHECK(accelpool_lease_revoking(lease) == 0);
    int pl = -2, dv = -2, sub = -2;
    CHECK(accelpool_lease_device_opencl(lease, 0, &pl, &dv, &sub) == 0); /* a static fpga is no OpenCL device */
    CHECK(pl == -2 && dv == -2);
    CHECK(accelpool_lease_device_opencl(lease, 5, &pl, &dv, &sub) == 0);
    CHECK(strcmp(accelpool_lease_device_pci(lease, 0), "") == 0);
    /* What the (static) host said of it: its kind and model as configured, nothing attached. */
    CHECK(strcmp(accelpool_lease_device_info(lease, 0, "kind"), "fpga") == 0);
    CHECK(strcmp(accelpool_lease_device_info(lease, 0, "model"), "u250") == 0);
    CHECK(strcmp(accelpool_lease_device_info(lease, 0, "attach"), "none") == 0);
    CHECK(strcmp(accelpool_lease_device_info(lease, 0, "colour"), "") == 0);
    CHECK(strcmp(accelpool_lease_device_info(lease, 9, "kind"), "") == 0);
    CHECK(accelpool_lease_device_number(lease, 0, "memory_bytes") == 0);
    printf("lease %llu device %s\n", (unsigned long long)accelpool_lease_id(lease), accelpool_lease_device(lease, 0));
  }

  /* The pool has one device: an asynchronous acquire waits, a short wait times out, cancel gives it up. */
  accelpool_request* req = NULL;
  accelpool_lease* second = NULL;
  CHECK(accelpool_acquire_start(client, &o, &req) == ACCELPOOL_OK);
  CHECK(accelpool_request_wait(req, 0.2, &second) == ACCELPOOL_ERR_TIMEOUT);
  CHECK(second == NULL);
  CHECK(accelpool_request_cancel(req) == ACCELPOOL_OK);
  CHECK(accelpool_request_wait(req, 1, &second) == ACCELPOOL_ERR_CANCELLED);
  accelpool_request_free(req);

  /* Release, then the next acquire is granted. */
  CHECK(accelpool_lease_release(lease) == ACCELPOOL_OK);
  CHECK(accelpool_lease_release(lease) == ACCELPOOL_OK); /* idempotent */
  CHECK(strstr(accelpool_lease_json(lease), "\"released\"") != NULL);
  accelpool_lease_free(lease);

  CHECK(accelpool_acquire_start(client, &o, &req) == ACCELPOOL_OK);
  CHECK(accelpool_request_wait(req, 5, &second) == ACCELPOOL_OK);
  CHECK(accelpool_request_wait(req, 1, &second) == ACCELPOOL_ERR_INVALID_STATE); /* taken already */
  accelpool_request_free(req);
  accelpool_lease_free(second); /* releases */

  accelpool_lease_free(NULL);
  accelpool_request_free(NULL);
  accelpool_client_free(client);
  accelpool_client_free(NULL);
  printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
