#!/usr/bin/env bash
# Unmodified OpenCL programs from Debian run through the pool on a device another host serves over the network
# (docs/remote-opencl.md): a real accelpool-manager with no OpenCL device of its own, a real accelpool-agent that
# serves its PoCL device, and libaccelpool-opencl.so found by the real ICD loader through OCL_ICD_VENDORS. No
# program is changed or wrapped.
#
# Usage: remote_opencl_test.sh BIN_DIR VENDORS_DIR CASE
#   CASE: clinfo | clblast | clpeak | faults | network | queue | tls
# Prints "ok: ..." per check, "SKIPPED: ..." and exits 77 when a program it needs is not installed.
set -u
bin=$1 vendors=$2 case=$3
work=$(mktemp -d /tmp/accelpool-rocl.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
check() {  # check WHAT COMMAND...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failed=1; fi
}
# Waits (up to a limit only a hung component reaches) until COMMAND succeeds.
wait_for() {
  local what=$1
  shift
  for _ in $(seq 1200); do
    "$@" && return 0
    sleep 0.1
  done
  echo "FAILED: waiting for $what"
  return 1
}
need() {
  command -v "$1" >/dev/null || { echo "SKIPPED: $1 is not installed (scripts/setup.sh installs it)"; exit 77; }
}

export POCL_CACHE_DIR=$work/pocl-cache
agent_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$work/manager.toml" <<EOF
data_dir = "$work/data"
[agents]
listen = ["unix:$work/agents.sock"]
token = "$agent_token"
[leases]
revoke_grace_s = 1
[[hosts]]
name = "local"
backend = "sim"
EOF
# Unix sockets for guests and agents: a restarted manager is found where the old one was.
start_manager() {
  rm -f "$work/data/endpoints.json"
  "$bin/accelpool-manager" --config "$work/manager.toml" --guest-tcp "" --admin 127.0.0.1:0 >>"$work/manager.log" 2>&1 &
  manager=$!
  pids+=($manager)
  wait_for "the manager to start" started || { cat "$work/manager.log"; exit 1; }
}
started() { [ -s "$work/data/endpoints.json" ] && grep -q "admin token" "$work/manager.log"; }
start_manager
field() { sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" "$work/data/endpoints.json"; }
guest_token=$(sed -n 's/^guest token for tenant default (shown once): //p' "$work/manager.log")
admin_token=$(sed -n 's/^admin token (shown once): //p' "$work/manager.log")
ctl() { "$bin/accelpoolctl" --url "$(field admin)" --token "$admin_token" "$@"; }

# Starts the agent serving its device on $1 (default loopback); the rest of the arguments run it (e.g. inside a
# network namespace).
start_agent() {
  local listen=${1:-127.0.0.1:0}
  shift || true
  cat >"$work/agent.toml" <<EOF
[agent]
manager = "unix:$work/agents.sock"
token = "$agent_token"
host = "gpu-host"
heartbeat_interval_ms = 200
[backends.opencl]
remote_listen = "$listen"
cache_dir = "$POCL_CACHE_DIR"
${agent_tls:-}
EOF
  : >"$work/agent.log"
  "$@" "$bin/accelpool-agent" --config "$work/agent.toml" >>"$work/agent.log" 2>&1 &
  agent=$!
  pids+=($agent)
  wait_for "the agent to register" grep -q "registered with the manager" "$work/agent.log" || { cat "$work/agent.log"; exit 1; }
}
if [ "$case" = tls ]; then
  # A CA of the test's, and the host's certificate for the address the endpoints name.
  pki() { openssl "$@" >/dev/null 2>&1 || { echo "FAILED: openssl $*"; exit 1; }; }
  pki req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj '/CN=remote opencl test CA' \
    -keyout "$work/ca.key" -out "$work/ca.pem"
  pki req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj '/CN=gpu-host' -keyout "$work/host.key" -out "$work/host.csr"
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$work/host.ext"
  pki x509 -req -days 1 -in "$work/host.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
    -extfile "$work/host.ext" -out "$work/host.pem"
  agent_tls="remote_tls_cert = \"$work/host.pem\"
remote_tls_key = \"$work/host.key\""
fi
[ "$case" = network ] || start_agent

# The environment an unmodified program gets: the loader sees only accelpool's ICD, and the ICD asks the pool.
remote_env=(env OCL_ICD_VENDORS="$vendors" ACCELPOOL_POOL="unix://$work/data/guest.sock" ACCELPOOL_TOKEN="$guest_token"
            ACCELPOOL_OPENCL_KIND=cpu ACCELPOOL_OPENCL_IDLE_S=0)
local_env=(env OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd)
leases_held() { ctl leases --all 2>/dev/null | grep -c ' granted ' ; }
no_lease_held() { [ "$(leases_held)" = 0 ]; }
# Runs `clpeak $1` on the remote device, runs the rest of the arguments once its output shows $2, and waits for it
# to end (a program that hangs instead is ended by ctest's timeout, which fails the test). Its output is in
# $work/interrupted.log (the end of it is shown), its exit status in $rc.
interrupt_clpeak() {
  local test=$1 started=$2 prog
  shift 2
  "${remote_env[@]}" clpeak "$test" >"$work/interrupted.log" 2>&1 &
  prog=$!
  pids+=($prog)
  wait_for "the program to reach the device" grep -q "$started" "$work/interrupted.log"
  "$@"
  wait "$prog"
  rc=$?
  tail -8 "$work/interrupted.log"
}
# A short program runs on the remote device to its end.
runs_a_program() { "${remote_env[@]}" clpeak --kernel-latency 2>&1 | grep -qE 'Kernel launch latency : [0-9.]+ us'; }
# The sum of CLBlast's "N test(s) WORD" lines on standard input (its colours taken out).
count() { sed 's/\x1b\[[0-9;]*m//g' | awk -v w="$1" '$2 == "test(s)" && $3 == w { n += $1 } END { print n + 0 }'; }

case $case in
  clinfo)
    need clinfo
    out=$("${remote_env[@]}" clinfo -l 2>&1)
    echo "$out"
    check "clinfo -l lists one platform, accelpool" test "$(grep -c '^Platform #' <<<"$out")" = 1 -a -n "$(grep '^Platform #0: accelpool$' <<<"$out")"
    check "clinfo -l lists exactly one device" test "$(grep -c 'Device #' <<<"$out")" = 1
    local_name=$("${local_env[@]}" clinfo -l 2>&1 | sed -n 's/.*Device #0: //p')
    check "the device is the agent's PoCL device ('$local_name')" grep -qF "Device #0: $local_name" <<<"$out"
    full=$("${remote_env[@]}" clinfo 2>&1)
    check "clinfo's full report names the remote device's version through accelpool" grep -q 'OpenCL 1.2 accelpool (' <<<"$full"
    check "clinfo built and ran its probe kernel on the device (no kernel errors)" test -z "$(grep -i 'CL_BUILD_PROGRAM_FAILURE\|CL_INVALID_PROGRAM_EXECUTABLE' <<<"$full")"
    check "the lease ends when clinfo exits" wait_for "the lease to end" no_lease_held
    ;;
  clblast)
    need clblast_test_xaxpy
    for routine in xaxpy xdot xgemv xgemm; do
      remote=$("${remote_env[@]}" "clblast_test_$routine" 2>&1)
      rc=$?
      passed=$(count passed <<<"$remote")
      failed_n=$(count failed <<<"$remote")
      local_passed=$("${local_env[@]}" "clblast_test_$routine" 2>&1 | count passed)
      echo "$routine: remote passed ${passed:-0} failed ${failed_n:-?}, local passed ${local_passed:-0}"
      check "clblast_test_$routine exits 0 on the remote device (got $rc)" test "$rc" = 0
      check "clblast_test_$routine: no test fails on the remote device" test "${failed_n:-1}" = 0
      check "clblast_test_$routine: as many tests pass remotely as locally (${passed:-0} = ${local_passed:-0})" \
        test "${passed:-0}" -gt 0 -a "${passed:-0}" = "${local_passed:-0}"
    done
    ;;
  clpeak)
    need clpeak
    out=$("${remote_env[@]}" clpeak --kernel-latency --compute-sp 2>&1)
    rc=$?
    echo "$out"
    check "clpeak exits 0 on the remote device (got $rc)" test "$rc" = 0
    check "clpeak ran on the accelpool platform" grep -q 'Platform: accelpool' <<<"$out"
    check "clpeak measured the kernel launch latency" grep -qE 'Kernel launch latency : [0-9.]+ us' <<<"$out"
    check "clpeak measured single-precision compute" grep -qE "float16 +: [0-9.]+" <<<"$out"
    ;;
  faults)
    need clpeak
    # 1. The lease is revoked while the program runs: it gets OpenCL errors and exits; the device comes back.
    revoke_its_lease() {
      local lease
      lease=$(ctl leases --all 2>/dev/null | awk '/ granted /{print $1; exit}')
      ctl revoke "$lease" --reason "test" >/dev/null
    }
    interrupt_clpeak --global-bandwidth 'Global memory bandwidth' revoke_its_lease
    check "a program whose lease is revoked ends (exit $rc) instead of hanging" true
    check "it was told through OpenCL errors or the revocation message" grep -qiE 'error|revoked|ended' "$work/interrupted.log"
    check "the device is free again after the revocation" wait_for "the device to be free" no_lease_held
    # 2. The agent is killed mid-program: the program gets errors and exits; the pool ends the lease.
    interrupt_clpeak --global-bandwidth 'Global memory bandwidth' kill -9 "$agent"
    check "a program whose device's agent is killed ends (exit $rc) instead of hanging" true
    check "the lease of a dead agent's device ends" wait_for "the lease to end" no_lease_held
    # 3. A new agent serves again, and a program runs to the end.
    start_agent
    check "after the agent restarts a program runs on the device again" runs_a_program
    # 4. The manager is killed and restarted while a program computes: the program's calls go to the agent, which
    # keeps serving its lease, and the program finishes; its lease ends afterwards.
    restart_manager() {
      kill -9 "$manager"
      start_manager
    }
    interrupt_clpeak --compute-sp 'Single-precision compute' restart_manager
    check "a program runs to the end across a manager restart (exit $rc)" test "$rc" = 0
    check "... with all its figures" grep -qE 'float16 +: [0-9.]+' "$work/interrupted.log"
    check "its lease ends after it exits" wait_for "the lease to end" no_lease_held
    ;;
  network)
    # The network between the program and the device's host is cut (the host's end of a veth pair into a network
    # namespace of this test, where the agent runs, goes down): the program's calls fail within the connection's
    # keepalive (about 15 s) instead of hanging, it exits, and the device is released and served again.
    need clpeak
    need ip
    ns=aprocl$$ host_if=apr$$h ns_if=apr$$n
    ip netns add "$ns" 2>/dev/null || { echo "SKIPPED: cannot make a network namespace (needs root)"; exit 77; }
    trap 'cleanup; ip netns del "$ns" 2>/dev/null; ip link del "$host_if" 2>/dev/null' EXIT
    ip link add "$host_if" type veth peer name "$ns_if" && ip link set "$ns_if" netns "$ns" &&
      ip addr add 169.254.213.1/30 dev "$host_if" && ip link set "$host_if" up &&
      ip netns exec "$ns" ip addr add 169.254.213.2/30 dev "$ns_if" && ip netns exec "$ns" ip link set "$ns_if" up &&
      ip netns exec "$ns" ip link set lo up || { echo "FAILED: setting up the veth pair"; exit 1; }
    start_agent 169.254.213.2:0 ip netns exec "$ns"
    check "a program reaches the device across the veth pair" runs_a_program
    interrupt_clpeak --global-bandwidth 'Global memory bandwidth' ip link set "$host_if" down
    check "a program whose network to the device is cut ends (exit $rc) instead of hanging" true
    check "it was told through OpenCL errors" grep -qE '\(-2\)|error' "$work/interrupted.log"
    check "its lease ends" wait_for "the lease to end" no_lease_held
    ip link set "$host_if" up
    check "once the network is back the device serves a program again" runs_a_program
    ;;
  queue)
    # The only device is held by one program; a second program's first call waits in the pool's queue (its lease
    # queued, labelled with the program's name, as the shim's are) and goes on once the first program is done.
    need clpeak
    need curl
    lease_lines() { curl -s -H "Authorization: Bearer $admin_token" "$(field admin)/v1/leases?all=true" | tr '{' '\n'; }
    queued_clinfo() { lease_lines | grep '"state":"queued"' | grep -q '"label":"clinfo"'; }
    "${remote_env[@]}" clpeak --global-bandwidth >"$work/first.log" 2>&1 &
    first=$!
    pids+=($first)
    wait_for "the first program to hold the device" grep -q 'Global memory bandwidth' "$work/first.log"
    "${remote_env[@]}" clinfo -l >"$work/second.log" 2>&1 &
    second=$!
    pids+=($second)
    check "the second program's lease waits in the queue, labelled clinfo" wait_for "a queued lease" queued_clinfo
    check "the first program's lease is labelled clpeak" grep -q '"label":"clpeak"' <<<"$(lease_lines)"
    check "the second program has not run yet" test ! -s "$work/second.log"
    wait "$first"
    wait "$second"
    rc=$?
    cat "$work/second.log"
    check "the second program ran once the device was free (exit $rc)" grep -q 'Device #0' "$work/second.log"
    check "both leases end" wait_for "the leases to end" no_lease_held
    ;;
  tls)
    # The agent serves over TLS: a program that trusts the host's CA runs; one that does not is refused, told why.
    need clinfo
    out=$("${remote_env[@]}" ACCELPOOL_OPENCL_CA="$work/ca.pem" clinfo -l 2>&1)
    echo "$out"
    check "over TLS, clinfo -l lists the accelpool platform and its one device" test "$(grep -c 'Device #' <<<"$out")" = 1
    out=$("${remote_env[@]}" ACCELPOOL_OPENCL_CA="$work/ca.pem" clpeak --kernel-latency 2>&1)
    check "over TLS, clpeak runs on the device" grep -qE 'Kernel launch latency : [0-9.]+ us' <<<"$out"
    out=$("${remote_env[@]}" ACCELPOOL_OPENCL_CA=/etc/ssl/certs/ca-certificates.crt clinfo -l 2>&1)
    echo "$out"
    check "a program that does not trust the host's certificate sees no device" test "$(grep -c 'Device #' <<<"$out")" = 0
    check "... and is told why (the certificate)" grep -qi 'accelpool OpenCL:.*certificate' <<<"$out"
    check "its lease ends" wait_for "the lease to end" no_lease_held
    ;;
  bench)
    # Run by hand, not by ctest (docs/benchmarks.md, "Remote OpenCL"): `... bench BENCH [ARGS...]` runs the benchmark
    # program BENCH (accelpool-opencl-bench) with ARGS on local PoCL and on the same device through the pool,
    # alternated three times each, then `clpeak --kernel-latency` both ways. Each remote run starts with no lease
    # held, so its first call includes a fresh acquire and connection.
    bench=${4:?usage: remote_opencl_test.sh BIN_DIR VENDORS_DIR bench BENCH [ARGS...]}
    for round in 1 2 3; do
      echo "=== local PoCL, round $round"
      "${local_env[@]}" "$bench" "${@:5}" 2>&1
      rc=$?
      check "the benchmark runs on local PoCL (round $round, exit $rc)" test "$rc" = 0
      wait_for "the lease to end" no_lease_held
      echo "=== remote over loopback, round $round"
      "${remote_env[@]}" "$bench" "${@:5}" 2>&1
      rc=$?
      check "the benchmark runs on the remote device (round $round, exit $rc)" test "$rc" = 0
    done
    if command -v clpeak >/dev/null; then
      echo "=== clpeak --kernel-latency, local PoCL"
      "${local_env[@]}" clpeak --kernel-latency 2>&1
      wait_for "the lease to end" no_lease_held
      echo "=== clpeak --kernel-latency, remote over loopback"
      "${remote_env[@]}" clpeak --kernel-latency 2>&1
    else
      echo "clpeak is not installed: its figures are left out"
    fi
    ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
[ "$failed" = 0 ] || { echo "--- manager log"; tail -40 "$work/manager.log"; echo "--- agent log"; tail -40 "$work/agent.log"; }
exit $failed
