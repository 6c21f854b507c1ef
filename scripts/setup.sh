#!/usr/bin/env bash
# Installs every Debian package accelpool needs to build, test and run. Idempotent: safe to run again.
# Usage: sudo scripts/setup.sh   (root is needed for apt-get)
set -euo pipefail

packages=(
  # toolchain; clang-format checks the sources' layout (scripts/format.sh, the test command's phase "format")
  build-essential cmake ninja-build pkg-config git clang-format
  # tests and benchmarks; clang and its runtimes for the libFuzzer harnesses (fuzz/, docs/testing.md)
  catch2 libbenchmark-dev clang libclang-rt-14-dev
  # JSON, config, logging, CLI
  nlohmann-json3-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libcli11-dev
  # networking: Boost 1.81 (Beast, Asio, JSON) and TLS
  libboost1.81-dev libboost-json1.81-dev libssl-dev
  # TLS tests make their certificates with the openssl command (tests/support/test_pki.hpp)
  openssl
  # store
  libsqlite3-dev sqlite3
  # the manager's allocator (pool-manager/manager/CMakeLists.txt)
  libjemalloc-dev
  # the PostgreSQL store (libpq) and the server its tests start privately (initdb, pg_ctl; docs/ha.md)
  libpq-dev
  postgresql
  # metrics; the metrics tests read GET /metrics with the Prometheus client's own parser (tests/manager/metrics_test.cpp)
  prometheus-cpp-dev
  python3-prometheus-client
  # device backends: XRT, OpenCL ICD loader + PoCL
  libxrt-dev libxrt1 uuid-dev
  ocl-icd-opencl-dev opencl-headers opencl-clhpp-headers pocl-opencl-icd clinfo
  # unmodified OpenCL programs the remote OpenCL tests run through libaccelpool-opencl.so (tests/remote-opencl)
  clpeak clblast-tests
  # hypervisor: libvirt with the QEMU driver
  libvirt-dev libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86
  # guest image for the VM tests: busybox initramfs, kernel unpacked from its package (vm-shim/guest-image)
  busybox-static cpio xz-utils binutils
  # accelpool-sweep tests: a private single-node Slurm (slurmctld, slurmd, sbatch) with munge authentication
  slurm-wlm munge
  # hypervisor attacher: parses libvirt's domain XML and metadata (libvirt-dev does not pull it in)
  libxml2-dev
  # Debian packages (packaging/, ctest -L package): lintian checks them, help2man writes the man pages from --help
  lintian
  help2man
  # the dashboard's browser test (tests/browser): headless Chromium, driven over the DevTools protocol
  chromium
)

# The admin API's contract tools (tests/contract) come from npm: Node.js and npm, from Debian where the machine has
# none.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

# Boost 1.74's dev packages (Debian's default libboost-dev) conflict with 1.81: remove them first.
old_boost=$(dpkg-query -W -f='${Package} ${Status}\n' 'libboost*1.74-dev' 2>/dev/null | awk '/install ok installed/{print $1}' || true)

# The contract tools, pinned, into .cache/contract-tools (ignored by git; tests/contract finds them there):
# Prism's validating proxy and Redocly CLI. Installed again only when the pins change.
install_contract_tools() {
  local dir pins
  dir="$(cd "$(dirname "$0")/.." && pwd)/.cache/contract-tools"
  pins="@stoplight/prism-cli@5.16.0 @redocly/cli@2.77.0"
  if [ "$(cat "$dir/pins" 2>/dev/null)" = "$pins" ] && [ -x "$dir/node_modules/.bin/prism" ]; then
    return 0
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error $pins
  echo "$pins" >"$dir/pins"
  echo "setup: installed the contract tools ($pins) into $dir"
}

if [ ${#missing[@]} -eq 0 ] && [ -z "$old_boost" ]; then
  echo "setup: all packages present"
  install_contract_tools
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ -n "$old_boost" ]; then
  # shellcheck disable=SC2086
  $SUDO apt-get remove -y $old_boost libboost-dev || true
fi
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: installed ${#missing[@]} packages"
install_contract_tools
