#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan+UBSan) in build-fuzz and runs them (docs/testing.md).
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]   fuzz each harness for SECONDS (default 60), seeded from
#                                            fuzz/corpus/<harness>/; prints the executions per harness
#   scripts/fuzz.sh --regress [HARNESS...]   run each harness once over every file of its seed corpus (seconds);
#                                            fails when one crashes. scripts/test.sh runs this.
#
# New inputs a run finds go to build-fuzz/corpus/<harness>/ (kept between runs, not in the repository); a crash
# leaves its input as build-fuzz/crashes/<harness>-crash-<sha1>. A crash input fixed in the code belongs in
# fuzz/corpus/<harness>/ so that --regress keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=fuzz
seconds=60
if [ "${1:-}" = "--regress" ]; then
  mode=regress
  shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for d in fuzz/corpus/*/; do harnesses+=("$(basename "$d")"); done
fi

if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCELPOOL_FUZZ=ON \
    -DACCELPOOL_BUILD_TESTS=OFF -DACCELPOOL_BUILD_BENCHMARKS=OFF -DACCELPOOL_SHIM_STATIC_TOOLS=OFF
fi
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"

mkdir -p build-fuzz/crashes
failed=()
total=0
for h in "${harnesses[@]}"; do
  bin=build-fuzz/bin/fuzz_$h
  seeds=(fuzz/corpus/"$h"/*)
  if [ "$mode" = regress ]; then
    # Given files, libFuzzer runs each input once and exits non-zero on the first crash.
    if "$bin" "${seeds[@]}" >"build-fuzz/regress-$h.log" 2>&1; then
      echo "fuzz regress $h: ${#seeds[@]} inputs ok"
    else
      echo "fuzz regress $h: FAILED (build-fuzz/regress-$h.log):"
      tail -n 40 "build-fuzz/regress-$h.log"
      failed+=("$h")
    fi
    continue
  fi
  mkdir -p "build-fuzz/corpus/$h"
  log=build-fuzz/fuzz-$h.log
  status=ok
  "$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/crashes/$h-" "build-fuzz/corpus/$h" "fuzz/corpus/$h" >"$log" 2>&1 || status=FAILED
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  runs=${runs:-0}
  total=$((total + runs))
  echo "fuzz $h: $status, $runs executions in ${seconds} s ($log)"
  if [ "$status" != ok ]; then
    grep -m 1 -A 20 "ERROR:\|runtime error\|deadly signal" "$log" || tail -n 20 "$log"
    failed+=("$h")
  fi
done
[ "$mode" = fuzz ] && echo "fuzz: $total executions in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
