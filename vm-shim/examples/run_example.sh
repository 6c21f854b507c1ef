#!/bin/sh
# Runs a command with a pool device through accelpool-run. The command sees the grant in its environment.
#
#   ACCELPOOL_POOL=tcp://127.0.0.1:7070 ACCELPOOL_TOKEN=apt_... vm-shim/examples/run_example.sh [KIND]
set -eu
# accelpool-run: $ACCELPOOL_RUN, else the one on PATH, else the build tree's (build/bin) beside this source tree.
RUN=${ACCELPOOL_RUN:-accelpool-run}
if [ -z "${ACCELPOOL_RUN:-}" ] && ! command -v accelpool-run >/dev/null 2>&1; then
  RUN="$(dirname "$0")/../../build/bin/accelpool-run"
fi
KIND=${1:-fpga}
exec "$RUN" --kind "$KIND" --timeout 60 --estimate 5 -- sh -c '
  echo "lease $ACCELPOOL_LEASE: $ACCELPOOL_COUNT $ACCELPOOL_KIND device(s): $ACCELPOOL_DEVICES"
  echo "bitstream: ${ACCELPOOL_BITSTREAM:-(any)}"
  if [ -n "${ACCELPOOL_OPENCL_DEVICES:-}" ]; then echo "OpenCL devices (platform:device): $ACCELPOOL_OPENCL_DEVICES"; fi
  if [ -n "${ACCELPOOL_PCI:-}" ]; then echo "PCI: $ACCELPOOL_PCI"; fi
  trap "echo revoked: finishing early; exit 143" TERM
  sleep 1
  echo done
'
