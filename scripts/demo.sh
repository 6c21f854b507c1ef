#!/usr/bin/env bash
# Sets up a fresh machine, builds accelpool, and runs its main job: every scheduling policy replayed on the real
# Philly trace (82,247 jobs) at offered load 0.85, printing the JCT table and writing plots and JSON to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target accelpool-sim
mkdir -p out/demo
build/bin/accelpool-sim \
  --trace scheduler/sim/traces/philly.csv --format philly \
  --devices 374 --load 0.85 \
  --policy fifo,sjf,srpt,las,djsf,fair,las+affinity+guard=86400 \
  --json out/demo/results.json --csv out/demo/jobs.csv --plot out/demo
echo
echo "Plots: out/demo/jct_cdf.svg out/demo/queue.svg   JSON: out/demo/results.json   per job: out/demo/jobs.csv"
