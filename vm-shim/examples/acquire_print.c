/* Acquire a device through the C ABI, print its description, release it.
 *
 *   accelpool-example-acquire-c URI TOKEN GUEST KIND [BITSTREAM]
 */
#include <accelpool/accelpool.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s URI TOKEN GUEST KIND [BITSTREAM]\n", argv[0]);
    return 2;
  }
  accelpool_client* client = NULL;
  accelpool_status st = accelpool_connect(argv[1], argv[2], argv[3], &client);
  if (st != ACCELPOOL_OK) {
    fprintf(stderr, "connect: [%s] %s\n", accelpool_status_name(st), accelpool_last_error());
    return 1;
  }
  accelpool_acquire_options opts = accelpool_acquire_options_default();
  opts.kind = argv[4];
  opts.bitstream = argc > 5 ? argv[5] : NULL;
  opts.timeout_s = 60;
  accelpool_lease* lease = NULL;
  st = accelpool_acquire(client, &opts, &lease);
  if (st != ACCELPOOL_OK) {
    fprintf(stderr, "acquire: [%s] %s\n", accelpool_status_name(st), accelpool_last_error());
    accelpool_client_free(client);
    return 1;
  }
  printf("lease %llu: kind %s, bitstream %s\n", (unsigned long long)accelpool_lease_id(lease),
         accelpool_lease_kind(lease), accelpool_lease_bitstream(lease));
  for (size_t i = 0; i < accelpool_lease_device_count(lease); ++i) {
    printf("  device %s\n", accelpool_lease_device(lease, i));
  }
  printf("  json %s\n", accelpool_lease_json(lease));
  st = accelpool_lease_release(lease);
  accelpool_lease_free(lease);
  accelpool_client_free(client);
  if (st != ACCELPOOL_OK) {
    fprintf(stderr, "release: [%s] %s\n", accelpool_status_name(st), accelpool_last_error());
    return 1;
  }
  printf("released\n");
  return 0;
}
