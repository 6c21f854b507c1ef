#!/usr/bin/env bash
# The Debian packages of packaging/CMakeLists.txt, checked from the outside (ctest label `package`).
#   package_test.sh build    BUILD_DIR DEBS_DIR   cpack -G DEB in BUILD_DIR (already built) into DEBS_DIR
#   package_test.sh lintian  DEBS_DIR             lintian: no error or warning
#   package_test.sh contents DEBS_DIR             each package holds its programs, man pages, conffiles, units
#   package_test.sh pool     DEBS_DIR             the packages extracted into a temporary root: the packaged manager
#                                                 starts from the packaged manager.toml with the sample bitstreams,
#                                                 programs built outside the tree against libaccelpool-shim-dev
#                                                 (pkg-config and find_package) and the static accelpool-run lease
#                                                 a device from it; the packaged agent joins it
#   package_test.sh systemd  DEBS_DIR             systemd-analyze verify accepts the packaged units
# A tool that is absent makes the check say so and exit 77 (skipped).
set -euo pipefail

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed (scripts/setup.sh installs it)"; }

what=$1
shift
debs() { ls "$1"/*.deb 2>/dev/null || skip "no packages in $1 (package:build skipped them: see its output)"; }
deb_of() { ls "$1"/"$2"_*.deb 2>/dev/null | head -1 || true; }

# A scratch folder removed on exit, and the processes started here stopped.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/accelpool-package.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT

# Waits (at most 60 s: only a hung program takes that long) until the command "$@" succeeds.
eventually() {
  local deadline=$((SECONDS + 60))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

extract_all() {  # extracts every package of $1 into the root $2
  local d
  for d in $(debs "$1"); do dpkg-deb -x "$d" "$2"; done
}

case "$what" in
build)
  need cpack
  need dpkg-deb
  build=$1 out=$2
  [ -f "$build/CPackConfig.cmake" ] || skip "$build builds no packages: a sanitizer or fuzz build, or CMAKE_INSTALL_PREFIX is not /usr (reconfigure with -DCMAKE_INSTALL_PREFIX=/usr)"
  rm -rf "$out"
  mkdir -p "$out"
  cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out" >"$out/cpack.log" 2>&1 || { cat "$out/cpack.log"; fail "cpack failed"; }
  rm -rf "$out/_CPack_Packages"
  for p in accelpool-manager accelpool-agent accelpool-guest-tools libaccelpool-shim-dev; do
    [ -n "$(deb_of "$out" $p)" ] || fail "cpack wrote no package $p (in $out: $(ls "$out"))"
  done
  ls -l "$out"/*.deb
  ;;

lintian)
  need lintian
  out=$1
  debs "$out" >/dev/null  # skips when package:build wrote none
  # Errors and warnings fail; the packages' own overrides (/usr/share/lintian/overrides) say why they are taken.
  report=$(lintian --fail-on error,warning --tag-display-limit 0 $(debs "$out") 2>&1) && rc=0 || rc=$?
  echo "$report"
  [ $rc -eq 0 ] || fail "lintian reports errors or warnings (above)"
  echo "lintian: no error or warning on $(debs "$out" | wc -l) packages"
  ;;

contents)
  need dpkg-deb
  out=$1
  debs "$out" >/dev/null  # skips when package:build wrote none
  check_files() {  # package, then paths it must hold
    local deb list
    deb=$(deb_of "$out" "$1")
    [ -n "$deb" ] || fail "no package $1"
    list=$(dpkg-deb -c "$deb" | awk '{print $6}')
    shift
    for f in "$@"; do
      grep -qx "\./${f#/}" <<<"$list" || fail "$(basename "$deb") lacks $f; it holds:
$list"
    done
  }
  check_files accelpool-manager /usr/bin/accelpool-manager /usr/bin/accelpoolctl /etc/accelpool/manager.toml \
    /lib/systemd/system/accelpool-manager.service /usr/share/man/man1/accelpool-manager.1.gz \
    /usr/share/man/man1/accelpoolctl.1.gz /usr/share/accelpool/bitstreams/vadd.toml \
    /usr/share/accelpool/bitstreams/vadd.cl /usr/share/doc/accelpool-manager/copyright
  check_files accelpool-agent /usr/bin/accelpool-agent /etc/accelpool/agent.toml \
    /lib/systemd/system/accelpool-agent.service /usr/share/man/man1/accelpool-agent.1.gz
  check_files accelpool-guest-tools /usr/bin/accelpool-run /usr/bin/accelpool-guestd \
    /usr/share/man/man1/accelpool-run.1.gz /usr/share/man/man1/accelpool-guestd.1.gz \
    /usr/lib/x86_64-linux-gnu/accelpool/libaccelpool-opencl.so /etc/OpenCL/vendors/accelpool.icd \
    /etc/accelpool/opencl.conf
  check_files libaccelpool-shim-dev /usr/include/accelpool/accelpool.h /usr/include/accelpool/shim/client.hpp \
    /usr/include/accelpool/common/result.hpp /usr/include/accelpool/common/errors.hpp
  shim_files=$(dpkg-deb -c "$(deb_of "$out" libaccelpool-shim-dev)")
  grep -q 'pkgconfig/accelpool-shim.pc$' <<<"$shim_files" || fail "no accelpool-shim.pc"
  grep -q 'cmake/accelpool-shim/accelpool-shim-config.cmake$' <<<"$shim_files" || fail "no CMake package accelpool-shim"
  for p in accelpool-manager accelpool-agent; do
    deb=$(deb_of "$out" $p)
    conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)
    grep -qx "/etc/accelpool/${p#accelpool-}.toml" <<<"$conffiles" || fail "$p does not mark its configuration file as a conffile"
    depends=$(dpkg-deb -f "$deb" Depends)
    grep -q 'libc6' <<<"$depends" || fail "$p Depends has no shared-library dependencies: '$depends'"
  done
  # The guest tools are static: no dynamic section. The OpenCL driver is a library the ICD loader finds through its
  # vendor file, which names the installed path; both configuration files are conffiles.
  root="$scratch/root"
  guest_deb=$(deb_of "$out" accelpool-guest-tools)
  dpkg-deb -x "$guest_deb" "$root"
  icd=$(cat "$root/etc/OpenCL/vendors/accelpool.icd")
  [ "$icd" = /usr/lib/x86_64-linux-gnu/accelpool/libaccelpool-opencl.so ] || fail "accelpool.icd names '$icd', not the installed driver"
  conffiles=$(dpkg-deb --ctrl-tarfile "$guest_deb" | tar -xO ./conffiles)
  for f in /etc/OpenCL/vendors/accelpool.icd /etc/accelpool/opencl.conf; do
    grep -qx "$f" <<<"$conffiles" || fail "accelpool-guest-tools does not mark $f as a conffile"
  done
  exports=$(nm -D --defined-only "$root/usr/lib/x86_64-linux-gnu/accelpool/libaccelpool-opencl.so" | awk '{print $3}' | sort | paste -sd' ')
  [ "$exports" = "clGetExtensionFunctionAddress clGetPlatformInfo clIcdGetPlatformIDsKHR" ] ||
    fail "libaccelpool-opencl.so exports more than the ICD entry points: $exports"
  for b in accelpool-run accelpool-guestd; do
    file_type=$(readelf -d "$root/usr/bin/$b" 2>&1 || true)
    grep -q 'There is no dynamic section' <<<"$file_type" || fail "$b is not static: $file_type"
  done
  # Every man page comes from its program's --help: it names the program's options.
  dpkg-deb -x "$(deb_of "$out" accelpool-manager)" "$root"
  man_page=$(zcat "$root/usr/share/man/man1/accelpool-manager.1.gz")
  grep -q -- 'data\\-dir' <<<"$man_page" || fail "accelpool-manager.1 does not list --data-dir"
  echo "contents: every package holds its files"
  ;;

pool)
  need dpkg-deb
  need curl
  out=$1
  debs "$out" >/dev/null  # skips when package:build wrote none
  root="$scratch/root" state="$scratch/state"
  extract_all "$out" "$root"
  mkdir -p "$state"
  # The packaged config, with the state folder and free ports given on the command line.
  "$root/usr/bin/accelpool-manager" --config "$root/etc/accelpool/manager.toml" --data-dir "$state" \
    --guest-tcp 127.0.0.1:0 --admin 127.0.0.1:0 >"$scratch/manager.log" 2>&1 &
  pids+=($!)
  eventually test -s "$state/endpoints.json" || { cat "$scratch/manager.log"; fail "the packaged manager did not start"; }
  cat "$scratch/manager.log"
  grep -q 'is empty' "$scratch/manager.log" && fail "the packaged manager's bitstream registry is empty"
  count=$(sed -n 's/.*bitstream registry .* (\([0-9]*\) bitstreams)$/\1/p' "$scratch/manager.log")
  [ -n "$count" ] && [ "$count" -gt 0 ] || fail "the packaged manager registered no bitstream"
  admin_url=$(sed -n 's/.*"admin":"\([^"]*\)".*/\1/p' "$state/endpoints.json")
  guest_tcp=$(sed -n 's/.*"guest_tcp":"\([^"]*\)".*/\1/p' "$state/endpoints.json")
  admin_token=$(sed -n 's/^admin token (shown once): //p' "$scratch/manager.log")
  guest_token=$(sed -n 's/^guest token for tenant default (shown once): //p' "$scratch/manager.log")
  [ -n "$admin_token" ] && [ -n "$guest_token" ] || fail "no tokens printed"
  listed=$(curl -sf -H "Authorization: Bearer $admin_token" "$admin_url/v1/bitstreams")
  grep -q '"name":"vadd"' <<<"$listed" || fail "GET /v1/bitstreams lacks the sample vadd: $listed"
  echo "packaged manager: $count sample bitstreams registered"

  # The static accelpool-run of accelpool-guest-tools leases a device.
  ACCELPOOL_POOL="tcp://$guest_tcp" ACCELPOOL_TOKEN="$guest_token" \
    "$root/usr/bin/accelpool-run" --kind fpga --bitstream vadd_u250 -- sh -c 'echo "devices: $ACCELPOOL_DEVICES"' >"$scratch/run.log" 2>&1 ||
    { cat "$scratch/run.log"; fail "accelpool-run (static) failed"; }
  grep -q 'devices: local/' "$scratch/run.log" || { cat "$scratch/run.log"; fail "accelpool-run printed no device"; }

  # A C program built with pkg-config against the extracted libaccelpool-shim-dev only (no source tree).
  need pkg-config
  need cc
  libdir=$(dirname "$(find "$root" -name accelpool-shim.pc)")
  flags=$(PKG_CONFIG_PATH="$libdir" PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR=/nonexistent \
    pkg-config --cflags --libs accelpool-shim)
  cp "$(dirname "$0")/../../vm-shim/examples/acquire_print.c" "$scratch/acquire.c"
  # shellcheck disable=SC2086
  cc -o "$scratch/acquire-c" "$scratch/acquire.c" $flags || fail "the C program does not build with: $flags"
  "$scratch/acquire-c" "tcp://$guest_tcp" "$guest_token" outside-c fpga | tee "$scratch/c.log"
  grep -q '^released' "$scratch/c.log" || fail "the C program did not acquire and release"

  # A C++ program built with CMake's find_package(accelpool-shim).
  need cmake
  mkdir -p "$scratch/cxx"
  cat >"$scratch/cxx/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(outside CXX)
find_package(accelpool-shim 0.1 CONFIG REQUIRED)
add_executable(outside main.cpp)
target_compile_features(outside PRIVATE cxx_std_20)
target_link_libraries(outside PRIVATE accelpool::shim)
CM
  cat >"$scratch/cxx/main.cpp" <<'CPP'
#include <accelpool/shim/client.hpp>
#include <cstdio>
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  accelpool::shim::ClientOptions o;
  o.uri = argv[1];
  o.token = argv[2];
  o.guest = "outside-cxx";
  auto client = accelpool::shim::Client::connect(o);
  if (!client) { std::fprintf(stderr, "connect: %s\n", client.error().message.c_str()); return 1; }
  accelpool::shim::AcquireOptions a;
  a.kind = "fpga";
  auto lease = (*client)->acquire(a);
  if (!lease) { std::fprintf(stderr, "acquire: %s\n", lease.error().message.c_str()); return 1; }
  std::printf("lease %llu granted\n", static_cast<unsigned long long>(lease->id()));
  return 0;
}
CPP
  cmake -S "$scratch/cxx" -B "$scratch/cxx/build" -DCMAKE_PREFIX_PATH="$root/usr" \
    >"$scratch/cxx.log" 2>&1 && cmake --build "$scratch/cxx/build" >>"$scratch/cxx.log" 2>&1 ||
    { cat "$scratch/cxx.log"; fail "the C++ program does not build with find_package(accelpool-shim)"; }
  "$scratch/cxx/build/outside" "tcp://$guest_tcp" "$guest_token" | tee "$scratch/cxx-run.log"
  grep -q 'granted' "$scratch/cxx-run.log" || fail "the C++ program did not acquire"

  kill -TERM "${pids[0]}"
  wait "${pids[0]}" || fail "the packaged manager did not stop cleanly on SIGTERM"
  pids=()

  # The packaged agent joins: the manager again on the same state, its packaged config with the [agents] table its
  # comments describe; the packaged agent.toml with this manager, a token file, folders in the scratch folder and
  # no libvirt (no VMs here).
  echo "agent-token-of-the-package-test" >"$scratch/agent.token"
  { cat "$root/etc/accelpool/manager.toml"
    printf '[agents]\nlisten = ["127.0.0.1:0"]\ntoken_file = "%s"\n' "$scratch/agent.token"; } >"$scratch/manager-agents.toml"
  rm -f "$state/endpoints.json"
  "$root/usr/bin/accelpool-manager" --config "$scratch/manager-agents.toml" --data-dir "$state" \
    --guest-tcp 127.0.0.1:0 --admin 127.0.0.1:0 >"$scratch/manager2.log" 2>&1 &
  pids+=($!)
  eventually test -s "$state/endpoints.json" || { cat "$scratch/manager2.log"; fail "the manager with agents did not start"; }
  admin_url=$(sed -n 's/.*"admin":"\([^"]*\)".*/\1/p' "$state/endpoints.json")
  agents=$(sed -n 's/.*"agents":"\([^"]*\)".*/\1/p' "$state/endpoints.json")
  sed -e "s#^manager = .*#manager = \"$agents\"#" -e "s#^token_file = .*#token_file = \"$scratch/agent.token\"#" \
      -e "s#/var/lib/accelpool-agent/#$scratch/agent/#" \
      -e '/^\[libvirt\]/d' -e '/^uri = /d' "$root/etc/accelpool/agent.toml" >"$scratch/agent.toml"
  "$root/usr/bin/accelpool-agent" --config "$scratch/agent.toml" >"$scratch/agent.log" 2>&1 &
  pids+=($!)
  agent_joined() { curl -sf -o /dev/null -H "Authorization: Bearer $admin_token" "$admin_url/v1/devices/hv-01/sim:1"; }
  eventually agent_joined || { cat "$scratch/agent.log" "$scratch/manager2.log"; fail "the packaged agent did not join"; }
  # The agent's log has a thread of its own: the line may come a little after the manager lists the devices.
  eventually grep -q 'registered with the manager' "$scratch/agent.log" ||
    { cat "$scratch/agent.log"; fail "the agent did not say it registered"; }
  [ -d "$scratch/agent/bitstreams" ] || fail "the agent did not create its image cache folder"
  echo "pool: the packaged agent joined with the packaged agent.toml's devices (hv-01/sim:0, hv-01/sim:1)"
  for p in "${pids[@]}"; do kill -TERM "$p"; done
  for p in "${pids[@]}"; do wait "$p" || fail "a packaged daemon did not stop cleanly on SIGTERM"; done
  pids=()
  echo "pool: the packaged manager, agent, guest tools and shim work together"
  ;;

systemd)
  need systemd-analyze
  need dpkg-deb
  out=$1
  debs "$out" >/dev/null  # skips when package:build wrote none
  root="$scratch/root"
  extract_all "$out" "$root"
  # systemd-analyze verify checks the programs ExecStart= names on this machine: the units are verified as packaged
  # with the programs' folder moved into the extracted root (`contents` checks the man pages, hence --man=no).
  mkdir -p "$scratch/units"
  for unit in accelpool-manager accelpool-agent; do
    packaged="$root/lib/systemd/system/$unit.service"
    [ -f "$packaged" ] || fail "no $unit.service in the packages"
    grep -q "^ExecStart=/usr/bin/$unit " "$packaged" || fail "$unit.service does not start /usr/bin/$unit"
    sed "s#^ExecStart=/usr/bin/#ExecStart=$root/usr/bin/#" "$packaged" >"$scratch/units/$unit.service"
    report=$(systemd-analyze verify --man=no "$scratch/units/$unit.service" 2>&1) && rc=0 || rc=$?
    [ $rc -eq 0 ] && [ -z "$report" ] || fail "systemd-analyze verify $unit.service (exit $rc): $report"
  done
  echo "systemd: systemd-analyze verify accepts both units"
  ;;

*)
  fail "unknown check '$what'"
  ;;
esac
