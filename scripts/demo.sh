#!/usr/bin/env bash
# Sets up a fresh machine, builds accelpool, and runs its main job: the pool manager on its embedded default
# (SQLite store, one local host with simulated FPGAs) serving a burst of guest jobs through accelpool-run.
# Prints each job's JCT and the pool's statistics, and where the admin API and metrics are.
#
#   scripts/demo.sh [JOBS]      (default 10 jobs on 4 devices: some queue)
# Set BUILD_DIR to use another build folder. Everything the run writes goes to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-10}
build=${BUILD_DIR:-build}
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target accelpool-manager accelpoolctl accelpool-run
bin="$build/bin"

out=out/demo
rm -rf "$out" && mkdir -p "$out"
"$bin/accelpool-manager" --data-dir "$out/data" --guest-tcp 127.0.0.1:0 --admin 127.0.0.1:0 >"$out/manager.log" 2>&1 &
manager=$!
trap 'kill "$manager" 2>/dev/null || true; wait "$manager" 2>/dev/null || true' EXIT
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

echo "accelpool-manager is up: admin API $admin_url (metrics at $admin_url/metrics), guests at tcp://$guest_tcp"
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
ctl leases --all 2>/dev/null | head -n $((jobs + 2)) || ctl leases
echo
echo "Pool statistics:"
ctl stats
echo
echo "Admin API: $admin_url   metrics: $admin_url/metrics   admin token: $admin_token"
echo "Manager log and data: $out/"
echo "The scheduling policies compared on the real Philly trace: scripts/results.sh (see docs/results.md)."
