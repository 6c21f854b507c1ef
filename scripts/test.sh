#!/usr/bin/env bash
# Sets up a fresh machine, builds everything and runs every test. The one command CI runs (docs/testing.md).
#
# Phases, each timed:
#   0. the C and C++ sources formatted as .clang-format says (scripts/format.sh --check);
#   1. the normal build (build/) and the whole suite;
#   2. the suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/);
#   3. the suite under ThreadSanitizer (build-tsan/).
# The sanitizer builds compile at -Og with line tables only (-g1): their reports keep file and line, they build in
# about half the time -O2 -g takes and their suites run as fast as at -O1, which keeps the whole run within CI's
# budget (docs/testing.md).
# Each suite replays the fuzzers' seed corpora (fuzz/corpus/) through the harnesses (tests "fuzz: ..."); the
# opt-in phase "fuzz" does the same with the libFuzzer build (build-fuzz/, clang).
# The sanitizer runs leave out the tests labelled "vm" (real VMs booted under libvirt: minutes each, and their
# programs are the static guest tools, which cannot be built with a sanitizer), "package" (a sanitizer build makes
# no Debian packages) and "docs" (the documentation's examples, run as a user would, with the normal build).
# ACCELPOOL_TEST_PHASES (default "format normal asan tsan") picks phases, e.g. ACCELPOOL_TEST_PHASES="asan fuzz".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

phases=${ACCELPOOL_TEST_PHASES:-format normal asan tsan}
jobs=$(nproc)
timings=()

# Runs "$@", prints and records how long it took under the name $1 (then shifted off); returns its status.
timed() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  timings+=("$name: $((SECONDS - start)) s")
  echo "test.sh: ${timings[-1]}"
  return $rc
}

# Builds the project with ACCELPOOL_SANITIZE=$2 in build-$1 and runs the suite without the tests whose labels match
# $3 (a ctest -LE regular expression). Every
# report goes to a file under build-$1/sanitizer-reports as well (log_path): a report from a child process (a
# manager or agent a test started) fails the phase even when the test itself did not notice it.
sanitized_suite() {
  local name=$1 sanitizer=$2 exclude=$3 dir=build-$1
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCELPOOL_SANITIZE="$sanitizer" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" \
    -DACCELPOOL_BUILD_BENCHMARKS=OFF -DACCELPOOL_SHIM_STATIC_TOOLS=OFF || return 1
  timed "$name build" cmake --build "$dir" -j"$jobs" || return 1
  local reports=$PWD/$dir/sanitizer-reports
  rm -rf "$reports"
  mkdir -p "$reports"
  local status=0
  # halt_on_error: the first report ends the process with a failure exit code, so the test fails.
  # print_suppressions=0: LeakSanitizer's list of suppressed leaks is not a report and must not land in $reports.
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:log_path=$reports/asan" \
  LSAN_OPTIONS="suppressions=$PWD/scripts/sanitizers/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan" \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/sanitizers/tsan.supp:log_path=$reports/tsan" \
    timed "$name ctest" ctest --test-dir "$dir" --output-on-failure -j2 --timeout 900 -LE "$exclude" || status=$?
  if compgen -G "$reports/*" >/dev/null; then
    echo "$name: sanitizer reports:"
    for f in "$reports"/*; do
      echo "== $f"
      cat "$f"
    done
    status=1
  fi
  return $status
}

normal_suite() {
  # /usr: the prefix of the Debian packages the tests labelled "package" build and check (docs/testing.md).
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr || return 1
  timed "normal build" cmake --build build -j"$jobs" || return 1
  timed "normal ctest" ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900
}

# Every phase runs even when an earlier one failed, so that one CI run shows every failure.
failed=()
for phase in $phases; do
  case $phase in
    normal) normal_suite || failed+=("$phase") ;;
    asan) sanitized_suite asan address "vm|package|docs" || failed+=("$phase") ;;
    tsan) sanitized_suite tsan thread "vm|package|docs" || failed+=("$phase") ;;
    fuzz) timed "fuzz regress" scripts/fuzz.sh --regress || failed+=("$phase") ;;
    format) timed "format check" scripts/format.sh --check || failed+=("$phase") ;;
    *)
      echo "test.sh: unknown phase '$phase' (format, normal, asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
done
printf 'test.sh: %s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: failed phases: ${failed[*]}"
  exit 1
fi
