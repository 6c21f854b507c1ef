#!/usr/bin/env bash
# Sets up a fresh machine, builds accelpool, and runs its main job: the pool manager (SQLite store, one local
# host with simulated FPGAs) and a host agent (a second host with simulated FPGAs of its own) serving a burst of
# guest jobs through accelpool-run. Prints each job's JCT and the pool's statistics, then leaves the pool running for
# you to explore (accelpoolctl, the admin API, metrics) and says how to stop it (out/demo/stop.sh).
#
#   scripts/demo.sh [JOBS]   development mode: the guests are processes here (default 10 jobs on 6 devices: some queue)
#   scripts/demo.sh --vm     real VMs: a private libvirtd boots two guests whose accelpool-run acquires the agent's
#                            simulated FPGA through accelpool-guestd, the agent's port relay and PCI hot-plug
#                            (the end-to-end test tests/guest/guest_e2e_test.cpp; needs root, QEMU and libvirtd)
# Set BUILD_DIR to use another build folder. Everything the run writes goes to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
vm=0
if [ "${1:-}" = "--vm" ]; then vm=1; shift; fi
jobs=${1:-10}
build=${BUILD_DIR:-build}
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

if [ "$vm" = 1 ]; then
  cmake --build "$build" --target guest_e2e_tests
  mkdir -p out
  echo "Booting two guests under a private libvirtd (pure emulation, 1-2 minutes):"
  ACCELPOOL_E2E_VERBOSE=1 "$build/bin/guest_e2e_tests" -s 2>&1 | tee out/demo-vm.log |
    grep -E 'accelpool-guest: (job|pci added|pci removed)|relay: VM|timings|SKIPPED|passed|failed' || true
  echo "Full output (manager and agent logs, both consoles): out/demo-vm.log"
  exit 0
fi

cmake --build "$build" --target accelpool-manager accelpool-agent accelpoolctl accelpool-run accelpool_opencl
bin="$build/bin"

out=out/demo
[ -x "$out/stop.sh" ] && "$out/stop.sh"  # the pool an earlier run left running
rm -rf "$out" && mkdir -p "$out"
agent_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf 'data_dir = "%s"\n[agents]\nlisten = ["127.0.0.1:0"]\ntoken = "%s"\n' "$PWD/$out/data" "$agent_token" >"$out/manager.toml"
"$bin/accelpool-manager" --config "$out/manager.toml" --guest-tcp 127.0.0.1:0 --admin 127.0.0.1:0 \
  >"$out/manager.log" 2>&1 &
manager=$!
agent=""
# A run that fails stops what it started; one that succeeds leaves the pool running (see the end).
stop_pool() { kill $agent "$manager" 2>/dev/null || true; wait $agent "$manager" 2>/dev/null || true; }
trap stop_pool EXIT
for _ in $(seq 100); do
  [ -s "$out/data/endpoints.json" ] && grep -q "admin token" "$out/manager.log" && break
  sleep 0.1
done
[ -s "$out/data/endpoints.json" ] || { cat "$out/manager.log"; echo "demo: the manager did not start" >&2; exit 1; }

field() { sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" "$out/data/endpoints.json"; }
admin_url=$(field admin)
guest_tcp=$(field guest_tcp)
guest_token=$(sed -n 's/^guest token for tenant default (shown once): //p' "$out/manager.log")
admin_token=$(sed -n 's/^admin token (shown once): //p' "$out/manager.log")
ctl() { "$bin/accelpoolctl" --url "$admin_url" --token "$admin_token" "$@"; }

# A host agent in development mode: simulated devices and no libvirt; its FPGAs are network-attached, so the
# guests of any host may use them.
printf '[agent]\nmanager = "%s"\ntoken = "%s"\nhost = "demo-hv"\n[backends.sim]\ndevices = "fpga:sim-u250:2"\nattach = "network"\nprogram_base_ms = 200\n' \
  "$(field agents)" "$agent_token" >"$out/agent.toml"
"$bin/accelpool-agent" --config "$out/agent.toml" >"$out/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do
  grep -q "registered with the manager" "$out/agent.log" && break
  sleep 0.1
done
grep -q "registered with the manager" "$out/agent.log" || { cat "$out/agent.log"; echo "demo: the agent did not register" >&2; exit 1; }

echo "accelpool-manager is up: admin API $admin_url (metrics at $admin_url/metrics), guests at tcp://$guest_tcp"
echo "accelpool-agent is up: host demo-hv with 2 simulated FPGAs"
echo
ctl devices
echo
echo "Submitting $jobs guest jobs (1-3 s of work each) from $jobs guests at once:"
pids=()
for i in $(seq "$jobs"); do
  (
    work=$(( (i % 3) + 1 ))
    start=$(date +%s.%N)
    status=0
    "$bin/accelpool-run" --pool "tcp://$guest_tcp" --token "$guest_token" --guest "vm-$i" \
      --kind fpga --estimate "$work" --timeout 120 -- sh -c "sleep $work" >"$out/job-$i.log" 2>&1 || status=$?
    end=$(date +%s.%N)
    jct=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    printf 'job %2d  vm-%-3s work %ss  JCT %6ss  exit %d\n' "$i" "$i" "$work" "$jct" "$status"
  ) &
  pids+=($!)
done
wait "${pids[@]}"
echo
echo "Leases (most recent first):"
ctl leases --all --newest --limit "$jobs"
echo
echo "Pool statistics:"
ctl stats
echo
# An unmodified OpenCL program through the pool's OpenCL driver: it sees only the device the pool grants it.
opencl_env=(env OCL_ICD_VENDORS="$PWD/$build/opencl-vendors" ACCELPOOL_POOL="tcp://$guest_tcp"
            ACCELPOOL_TOKEN="$guest_token" ACCELPOOL_OPENCL_KIND=cpu)
if [ -d "$build/opencl-vendors" ] && command -v clinfo >/dev/null && ctl devices | grep -q ' cpu '; then
  echo "An unmodified OpenCL program (clinfo -l) through the pool's OpenCL driver (docs/remote-opencl.md):"
  "${opencl_env[@]}" clinfo -l
  echo
fi
printf '#!/bin/sh\n# Stops the pool scripts/demo.sh left running.\nkill %s %s 2>/dev/null && echo "demo pool stopped" || echo "demo pool was not running"\n' \
  "$agent" "$manager" >"$out/stop.sh"
chmod +x "$out/stop.sh"
trap - EXIT
echo
echo "The pool keeps running (manager pid $manager, agent pid $agent). Explore it:"
echo "  $bin/accelpoolctl --url $admin_url --token $admin_token devices"
echo "  curl -s -H 'Authorization: Bearer $admin_token' $admin_url/v1/leases?all=true   # the admin API"
echo "  curl -s $admin_url/metrics"
echo "  $bin/accelpool-run --pool tcp://$guest_tcp --token $guest_token -- sh -c 'env | grep ACCELPOOL_'"
echo "  ${opencl_env[*]} clpeak --kernel-latency   # any OpenCL program"
echo "Manager and agent logs, data: $out/"
echo "Stop it with: $out/stop.sh"
echo "The scheduling policies compared on the real Philly trace: scripts/results.sh (see docs/results.md)."
