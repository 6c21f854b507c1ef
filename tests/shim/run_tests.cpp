// accelpool-run and the C ABI program against the real accelpool-manager on loopback.
#include "client_options.hpp"
#include "manager_fixture.hpp"
#include "skip.hpp"

#include "../../vm-shim/tools/run_environment.hpp"

#include <accelpool/shim/client.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

using namespace accelpool::shim;
using accelpool::shim::test::eventually;
using accelpool::shim::test::fpga_pool;
using accelpool::shim::test::ManagerProcess;
using accelpool::shim::test::renewed_past_ttl;
using Clock = std::chrono::steady_clock;
using accelpool::shim::test::Child;
using accelpool::shim::test::read_file;
using accelpool::shim::test::spawn;

namespace {

std::string run_bin() { return ACCELPOOL_RUN_BIN; }

std::map<std::string, std::string> pool_env(const ManagerProcess& m, const std::string& guest) {
  return {{"ACCELPOOL_POOL", m.tcp_uri()}, {"ACCELPOOL_TOKEN", m.guest_token()}, {"ACCELPOOL_GUEST", guest}};
}

// A second client of `guest`, to look at its leases: a lease is visible to its own guest only.
std::unique_ptr<Client> observer(const ManagerProcess& m, const std::string& guest) {
  auto c = Client::connect(test::connect_options(m.tcp_uri(), m.guest_token(), guest));
  REQUIRE(c);
  return std::move(*c);
}

std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> env;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// The variables that restrict vendor runtimes, as accelpool-run would give them to its command for a lease whose
// only device is `device_info` (one entry of the lease's "device_info", as JSON), on the machine `machine`.
struct VendorView {
  std::map<std::string, std::string> vendor;  // only the vendor runtimes' variables
  std::map<std::string, std::string> all;
  std::vector<std::string> notes;
};

VendorView command_view(const std::string& device_info, const run::MachineFiles& machine) {
  auto info = nlohmann::json::parse(device_info);
  nlohmann::json lease = {{"id", 7}, {"state", "granted"}, {"ready", true}, {"kind", info["kind"]}};
  lease["devices"] = nlohmann::json::array({info["name"]});
  lease["device_info"] = nlohmann::json::array({info});
  auto parsed = parse_lease(lease.dump());
  REQUIRE(parsed);
  auto env = run::lease_environment(*parsed, "tcp://pool:7070", "", "vm-1", machine);
  VendorView view;
  view.notes = env.notes;
  for (const auto& kv : env.variables) {
    const std::string name = kv.substr(0, kv.find('='));
    const std::string value = kv.substr(kv.find('=') + 1);
    view.all[name] = value;
    for (const char* prefix : {"CUDA_", "ROCR_", "HIP_", "ZE_", "POCL_", "GPU_DEVICE_ORDINAL"}) {
      if (name.rfind(prefix, 0) == 0) view.vendor[name] = value;
    }
  }
  return view;
}

// A machine with an NVIDIA GPU at 0000:00:07.0 (driver loaded), an AMD GPU at 0000:08:00.0 (KFD node 1; node 0 is
// the CPU), and Intel functions: GPUs driven by i915 at 0000:00:02.0 and 0000:03:00.0, one not bound to a driver
// at 0000:02:00.0, and a network function at 0000:04:00.0.
run::MachineFiles fake_machine(const std::string& root) {
  namespace fs = std::filesystem;
  run::MachineFiles m{root + "/proc-nvidia", root + "/kfd-nodes", root + "/pci"};
  auto write = [](const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  };
  write(fs::path(m.nvidia_gpus_dir) / "0000:00:07.0/information",
        "Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 45\nGPU UUID: \t GPU-8932f937-d72c-4106-c12f-20bd9faed9f6\n"
        "Video BIOS: \t 92.00.19.00.10\nBus Type: \t PCIe\nBus Location: \t 0000:00:07.0\n");
  write(fs::path(m.kfd_nodes_dir) / "0/properties",
        "cpu_cores_count 2\nsimd_count 0\nlocation_id 0\ndomain 0\nunique_id 0\n");
  write(fs::path(m.kfd_nodes_dir) / "1/properties",
        "cpu_cores_count 0\nsimd_count 440\nlocation_id 2048\ndomain 0\nunique_id 14627953128474402132\n");
  auto function = [&](const std::string& bdf, const std::string& vendor, const std::string& cls,
                      const std::string& driver) {
    const fs::path dir = fs::path(m.pci_devices_dir) / bdf;
    write(dir / "vendor", vendor + "\n");
    write(dir / "class", cls + "\n");
    if (!driver.empty()) {
      fs::create_directories(fs::path(root) / "drivers" / driver);
      fs::create_symlink(fs::path(root) / "drivers" / driver, dir / "driver");
    }
  };
  function("0000:00:02.0", "0x8086", "0x030000", "i915");
  function("0000:02:00.0", "0x8086", "0x038000", "");
  function("0000:03:00.0", "0x8086", "0x038000", "i915");
  function("0000:04:00.0", "0x8086", "0x020000", "ice");
  function("0000:00:07.0", "0x10de", "0x030200", "nvidia");
  return m;
}

}  // namespace

TEST_CASE("accelpool-run shows each vendor runtime only the granted devices, and names no device it cannot identify",
          "[shim][run]") {
  const std::string root = test::make_temp_dir("accelpool-machine-");
  REQUIRE_FALSE(root.empty());
  const run::MachineFiles machine = fake_machine(root);
  using Vars = std::map<std::string, std::string>;

  // An NVIDIA GPU passed into this VM: CUDA by the GPU's UUID, which does not depend on enumeration order.
  auto nvidia = command_view(R"({"name":"hv-1/opencl:1:0","kind":"gpu","model":"NVIDIA A100-SXM4-40GB",
      "vendor":"NVIDIA Corporation","pci_vendor_id":4318,"attach":"pci_hostdev","pci":"0000:00:07.0"})",
                             machine);
  CHECK(nvidia.vendor == Vars{{"CUDA_VISIBLE_DEVICES", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"}});
  CHECK(nvidia.notes.empty());

  // An AMD GPU of the manager's own host: ROCr by the UUID it gives the KFD node ("GPU-" + unique_id in hex).
  auto amd = command_view(R"({"name":"local/opencl:0:1","kind":"gpu","model":"gfx90a",
      "vendor":"Advanced Micro Devices, Inc.","pci_vendor_id":4098,"attach":"in_process","pci":"0000:08:00.0"})",
                          machine);
  CHECK(amd.vendor == Vars{{"ROCR_VISIBLE_DEVICES", "GPU-cb00edde3dc7dd54"}});

  // An Intel GPU: Level Zero by its index in PCI order among the Intel GPUs a driver runs (the unbound one and
  // the network function do not count), one root device per PCI device.
  auto intel = command_view(R"({"name":"hv-1/opencl:2:1","kind":"gpu","model":"Intel(R) Data Center GPU Flex 170",
      "vendor":"Intel(R) Corporation","pci_vendor_id":32902,"attach":"pci_hostdev","pci":"0000:03:00.0"})",
                            machine);
  CHECK(intel.vendor == Vars{{"ZE_AFFINITY_MASK", "1"},
                             {"ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1"},
                             {"ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE"}});

  // A PoCL CPU sub-device (device 1 of the host's PoCL platform): PoCL is limited to its driver, which makes the
  // device number 0 for the command, and ACCELPOOL_OPENCL_* say so. Its vendor is the CPU's ("AuthenticAMD"): no
  // AMD GPU variable. How many compute units the sub-device has the lease does not say: no limit, and a note.
  auto pocl = command_view(R"({"name":"local/opencl:0:1.1","kind":"cpu","model":"pthread-skylake-avx512-AMD EPYC",
      "vendor":"AuthenticAMD","attach":"network"})",
                           machine);
  CHECK(pocl.vendor == Vars{{"POCL_DEVICES", "pthread"}});
  CHECK(pocl.all["ACCELPOOL_OPENCL_DEVICES"] == "0:0/1");
  CHECK(pocl.all["ACCELPOOL_OPENCL_PLATFORM"] == "0");
  CHECK(pocl.all["ACCELPOOL_OPENCL_DEVICE"] == "0");
  CHECK(pocl.all["ACCELPOOL_OPENCL_SUBDEVICE"] == "1");
  REQUIRE(pocl.notes.size() == 1);
  CHECK(pocl.notes[0].find("compute units") != std::string::npos);

  // A simulated FPGA: no vendor runtime serves it.
  auto fpga = command_view(R"({"name":"hv-1/sim:0","kind":"fpga","model":"sim-u250","vendor":"accelpool simulator",
      "attach":"emulated","pci":"0000:00:0a.0"})",
                           machine);
  CHECK(fpga.vendor.empty());
  CHECK(fpga.notes.empty());

  // Never a guess: a GPU whose address here is unknown (attached to nothing: the address is its host's), or that
  // this machine's driver does not know, gets no variable, and the note says why.
  auto elsewhere = command_view(R"({"name":"hv-2/opencl:0:0","kind":"gpu","model":"NVIDIA A100-SXM4-40GB",
      "vendor":"NVIDIA Corporation","pci_vendor_id":4318,"attach":"none","pci":"0000:00:07.0"})",
                                machine);
  CHECK(elsewhere.vendor.empty());
  REQUIRE(elsewhere.notes.size() == 1);
  CHECK(elsewhere.notes[0].find("CUDA_VISIBLE_DEVICES not set") == 0);
  CHECK(elsewhere.notes[0].find("attach 'none'") != std::string::npos);
  auto unknown = command_view(R"({"name":"hv-1/opencl:1:1","kind":"gpu","model":"NVIDIA A100-SXM4-40GB",
      "vendor":"NVIDIA Corporation","pci_vendor_id":4318,"attach":"pci_hostdev","pci":"0000:00:09.0"})",
                              machine);
  CHECK(unknown.vendor.empty());
  REQUIRE(unknown.notes.size() == 1);
  CHECK(unknown.notes[0].find(machine.nvidia_gpus_dir + "/0000:00:09.0/information") != std::string::npos);
  auto no_kfd = command_view(R"({"name":"local/opencl:0:2","kind":"gpu","model":"gfx90a",
      "vendor":"Advanced Micro Devices, Inc.","pci_vendor_id":4098,"attach":"in_process","pci":"0000:09:00.0"})",
                             machine);
  CHECK(no_kfd.vendor.empty());
  REQUIRE(no_kfd.notes.size() == 1);
  CHECK(no_kfd.notes[0].find("0000:09:00.0") != std::string::npos);
  test::remove_tree(root);
}

TEST_CASE("a PoCL command under accelpool-run sees only the granted PoCL driver, whatever POCL_DEVICES it had",
          "[integration][shim][run][opencl]") {
  if (ManagerProcess::binary().empty()) ACCELPOOL_SKIP("this build has no accelpool-manager target");
  // Only PoCL's ICD, so that no other OpenCL platform of this machine takes part.
  const std::string pocl_icd = "/etc/OpenCL/vendors/pocl.icd";
  if (access(pocl_icd.c_str(), R_OK) != 0) ACCELPOOL_SKIP("no " << pocl_icd << " (pocl-opencl-icd is not installed)");
  const std::string list = "clinfo -l";
  const std::map<std::string, std::string> user_env = {{"OCL_ICD_VENDORS", pocl_icd},
                                                       {"POCL_DEVICES", "basic pthread"}};
  const std::string scratch = test::make_temp_dir("accelpool-clinfo-");
  REQUIRE_FALSE(scratch.empty());
  // What the command would see by itself: both drivers' devices.
  auto alone =
      spawn({"/bin/sh", "-c", "command -v clinfo >/dev/null || exit 77; " + list}, user_env, scratch + "/alone.out");
  REQUIRE(alone.wait());
  if (alone.exit_code() == 77) ACCELPOOL_SKIP("clinfo is not installed");
  INFO("clinfo -l alone:\n" << alone.output());
  REQUIRE(alone.exit_code() == 0);
  REQUIRE(alone.output().find("Device #1: pthread-") != std::string::npos);
  REQUIRE(alone.output().find("Device #0: basic-") != std::string::npos);

  ManagerProcess m(test::pocl_pool());
  if (!m.start()) FAIL("accelpool-manager did not start: " << m.error());
  auto env = pool_env(m, "vm-clinfo");
  env.insert(user_env.begin(), user_env.end());
  auto wrapped = spawn({run_bin(), "--kind", "cpu", "--timeout", "60", "--", "/bin/sh", "-c",
                        list + "; env | grep -E '^(POCL_DEVICES|ACCELPOOL_OPENCL_DEVICES|ACCELPOOL_DEVICE_0_MODEL)='"},
                       env, scratch + "/run.out");
  REQUIRE(wrapped.wait());
  const std::string out = wrapped.output();
  INFO("under accelpool-run:\n" << out);
  if (wrapped.exit_code() == 5) ACCELPOOL_SKIP("the manager's OpenCL backend found no CPU device: " << out);
  REQUIRE(wrapped.exit_code() == 0);
  REQUIRE(out.find("ACCELPOOL_DEVICE_0_MODEL=") != std::string::npos);
  const std::string model = out.substr(out.find("ACCELPOOL_DEVICE_0_MODEL=") + 25);
  const std::string driver = model.substr(0, model.find('-'));
  CHECK(out.find("POCL_DEVICES=" + driver + "\n") != std::string::npos);
  CHECK(out.find("ACCELPOOL_OPENCL_DEVICES=0:0\n") != std::string::npos);
  // clinfo lists exactly the granted device, as device 0: the user's "basic pthread" did not survive the grant.
  CHECK(out.find(" `-- Device #0: " + driver + "-") != std::string::npos);
  CHECK(out.find("Device #1") == std::string::npos);
  test::remove_tree(scratch);
}

TEST_CASE("accelpool-run exports the grant, exits with the command's status and releases the lease",
          "[integration][shim][run]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  std::string envfile = m.dir() + "/env.txt";
  auto c = spawn({run_bin(), "--kind", "fpga", "--estimate", "3", "--timeout", "5", "--", "/bin/sh", "-c",
                  "env | grep ^ACCELPOOL_ > " + envfile + "; exit 7"},
                 pool_env(m, "vm-run"), m.dir() + "/run.out");
  REQUIRE(c.wait());
  INFO(c.output());
  CHECK(c.exit_code() == 7);
  auto env = read_env_file(envfile);
  REQUIRE(env.count("ACCELPOOL_LEASE"));
  CHECK(env["ACCELPOOL_KIND"] == "fpga");
  CHECK(env["ACCELPOOL_COUNT"] == "1");
  CHECK(env["ACCELPOOL_DEVICES"].rfind("local/", 0) == 0);
  CHECK(env["ACCELPOOL_GUEST"] == "vm-run");
  CHECK(env["ACCELPOOL_POOL"] == m.tcp_uri());
  CHECK(env["ACCELPOOL_LEASE_JSON"].find("\"granted\"") != std::string::npos);
  // The device on its own, as the pool's host described it.
  CHECK(env["ACCELPOOL_DEVICE_0_NAME"] == env["ACCELPOOL_DEVICES"]);
  CHECK(env["ACCELPOOL_DEVICE_0_KIND"] == "fpga");
  CHECK(env["ACCELPOOL_DEVICE_0_MODEL"] == "u250");
  CHECK(env["ACCELPOOL_DEVICE_0_ATTACH"] == "none");  // the static host attaches nothing
  CHECK(env.count("ACCELPOOL_DEVICE_0_PCI") == 1);
  CHECK(env.count("ACCELPOOL_DEVICE_1_NAME") == 0);
  auto obs = observer(m, "vm-run");
  auto lease = obs->get(std::stoull(env["ACCELPOOL_LEASE"]));
  REQUIRE(lease);
  CHECK(lease->state == LeaseState::released);
  CHECK(lease->guest == "vm-run");
  CHECK(lease->label == "sh");  // the command's file name, by default

  // Killed by a signal: 128 + signal, and still released.
  auto k = spawn({run_bin(), "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + m.dir() + "/id; kill -KILL $$"},
                 pool_env(m, "vm-run"), m.dir() + "/run2.out");
  REQUIRE(k.wait());
  CHECK(k.exit_code() == 128 + SIGKILL);
  auto l2 = obs->get(std::stoull(read_file(m.dir() + "/id")));
  REQUIRE(l2);
  CHECK(l2->state == LeaseState::released);

  // --label names the job, --label '' sends none, and a label the pool refuses fails before the command runs.
  auto labelled = [&](const std::string& label) {
    auto r = spawn({run_bin(), "--label", label, "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + m.dir() + "/id"},
                   pool_env(m, "vm-run"), m.dir() + "/run3.out");
    REQUIRE(r.wait());
    INFO(r.output());
    REQUIRE(r.exit_code() == 0);
    auto l = obs->get(std::stoull(read_file(m.dir() + "/id")));
    REQUIRE(l);
    return l->label;
  };
  CHECK(labelled("train-step") == "train-step");
  CHECK(labelled("").empty());
  std::remove((m.dir() + "/id").c_str());
  auto refused = spawn({run_bin(), "--label", "two words", "--", "/bin/sh", "-c", "touch " + m.dir() + "/ran"},
                       pool_env(m, "vm-run"), m.dir() + "/run4.out");
  REQUIRE(refused.wait());
  INFO(refused.output());
  CHECK(refused.exit_code() != 0);
  CHECK(refused.output().find("label must be") != std::string::npos);
  CHECK(access((m.dir() + "/ran").c_str(), F_OK) != 0);
}

TEST_CASE("accelpool-run reports pool errors with distinct exit codes", "[integration][shim][run]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto env = pool_env(m, "vm-err");
  auto infeasible = spawn({run_bin(), "--kind", "gpu", "--", "/bin/true"}, env, m.dir() + "/a.out");
  REQUIRE(infeasible.wait());
  CHECK(infeasible.exit_code() == 5);
  CHECK(infeasible.output().find("gpu") != std::string::npos);

  auto bad_env = env;
  bad_env["ACCELPOOL_TOKEN"] = "apt_wrong";
  auto token = spawn({run_bin(), "--", "/bin/true"}, bad_env, m.dir() + "/b.out");
  REQUIRE(token.wait());
  CHECK(token.exit_code() == 4);

  auto missing = spawn({run_bin(), "--", "/nonexistent/command"}, env, m.dir() + "/c.out");
  REQUIRE(missing.wait());
  CHECK(missing.exit_code() == 127);
  CHECK(missing.output().find("/nonexistent/command") != std::string::npos);

  auto usage = spawn({run_bin(), "--count", "zero", "--", "/bin/true"}, env, m.dir() + "/d.out");
  REQUIRE(usage.wait());
  CHECK(usage.exit_code() == 2);
  CHECK(usage.output().find("--count") != std::string::npos);

  std::string tcp = m.tcp_uri();
  m.stop();
  auto unreachable = spawn({run_bin(), "--pool", tcp, "--", "/bin/true"}, env, m.dir() + "/e.out");
  REQUIRE(unreachable.wait());
  CHECK(unreachable.exit_code() == 3);
  CHECK(unreachable.output().find("unreachable") != std::string::npos);
}

TEST_CASE("accelpool-run waits for a busy pool and gives up after --timeout", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  auto env = pool_env(m, "vm-busy");
  // The holder runs with the only device until the test creates `go`.
  const std::string held = m.dir() + "/held", go = m.dir() + "/go";
  auto holder = spawn({run_bin(), "--", "/bin/sh", "-c",
                       "echo $ACCELPOOL_LEASE > " + held + "; while [ ! -e " + go + " ]; do sleep 0.05; done"},
                      env, m.dir() + "/h.out");
  REQUIRE(eventually([&] { return !read_file(held).empty(); }));
  auto late = spawn({run_bin(), "--timeout", "0.4", "--", "/bin/true"}, env, m.dir() + "/l.out");
  REQUIRE(late.wait());
  INFO(late.output());
  CHECK(late.exit_code() == 6);
  // Without --timeout the next one waits in the queue as long as the device is held...
  auto waiter = spawn({run_bin(), "--", "/bin/sh", "-c", "exit 0"}, env, m.dir() + "/w.out");
  REQUIRE(eventually([&] {
    std::string body;
    if (m.admin_request("GET", "/v1/leases?state=queued", "", body) != 200) return false;
    auto queued = nlohmann::json::parse(body, nullptr, false);
    return !queued.is_discarded() && queued["leases"].size() == 1;
  }));
  CHECK(waitpid(waiter.pid, &waiter.status, WNOHANG) == 0);
  // ...and runs once it is given back.
  std::ofstream(go).put('\n');
  REQUIRE(holder.wait());
  CHECK(holder.exit_code() == 0);
  REQUIRE(waiter.wait());
  INFO(waiter.output());
  CHECK(waiter.exit_code() == 0);
}

namespace {

// accelpool-run with a command that writes "TERM" to `termfile` on SIGTERM and then runs `after_term` ("exit 3", or
// "" to ignore the signal). Once the command runs, its lease is revoked through the admin API.
struct Revoked {
  Child child;
  std::uint64_t lease = 0;
  std::string termfile;
  Clock::time_point at;  // when the revocation was asked for

  // Waits for accelpool-run to end; returns the seconds since the revocation.
  double finish() {
    bool ended = child.wait();
    if (!ended) child.kill_group();
    REQUIRE(ended);
    return std::chrono::duration<double>(Clock::now() - at).count();
  }
};

Revoked run_and_revoke(const ManagerProcess& m, const std::string& guest, const std::string& after_term) {
  Revoked r;
  std::string idfile = m.dir() + "/" + guest + ".id";
  r.termfile = m.dir() + "/" + guest + ".term";
  r.child = spawn({run_bin(), "--", "/bin/sh", "-c",
                   "trap 'echo TERM > " + r.termfile + "; " + after_term + "' TERM; echo $ACCELPOOL_LEASE > " + idfile +
                       "; while :; do sleep 0.05; done"},
                  pool_env(m, guest), m.dir() + "/" + guest + ".out");
  REQUIRE(eventually([&] { return !read_file(idfile).empty(); }));
  r.lease = std::stoull(read_file(idfile));
  std::string body;
  r.at = Clock::now();
  REQUIRE(m.admin_request("POST", "/v1/leases/" + std::to_string(r.lease) + "/revoke", R"({"reason":"test"})", body) ==
          200);
  return r;
}

}  // namespace

TEST_CASE("a revoked lease's command gets SIGTERM within the grace period", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1, 30, 5));
  REQUIRE_MANAGER(m);
  Revoked r = run_and_revoke(m, "vm-revoke", "exit 3");
  r.finish();
  INFO(r.child.output());
  CHECK(r.child.exit_code() == 3);
  CHECK(read_file(r.termfile) == "TERM\n");
  auto lease = observer(m, "vm-revoke")->get(r.lease);
  REQUIRE(lease);
  CHECK(lease->state == LeaseState::released);  // given back before the deadline
}

TEST_CASE("a command that ignores SIGTERM is killed at the revocation deadline", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1, 30, 1.5));
  REQUIRE_MANAGER(m);
  Revoked r = run_and_revoke(m, "vm-stubborn", "");
  double took = r.finish();
  INFO(r.child.output());
  CHECK(read_file(r.termfile) == "TERM\n");     // warned first
  CHECK(r.child.exit_code() == 128 + SIGKILL);  // then killed
  CHECK(r.child.output().find("revocation deadline; sending SIGKILL") != std::string::npos);
  CHECK(took >= 1.3);  // not before the grace period (1.5 s) ended
}

TEST_CASE("accelpool-run forwards SIGTERM and SIGHUP to the command and still releases", "[integration][shim][run]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  for (int sig : {SIGTERM, SIGHUP, SIGINT}) {
    std::string idfile = m.dir() + "/id" + std::to_string(sig);
    auto c = spawn({run_bin(), "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + idfile + "; exec sleep 30"},
                   pool_env(m, "vm-sig"), m.dir() + "/s.out");
    REQUIRE(eventually([&] { return !read_file(idfile).empty(); }));  // the command runs
    ::kill(c.pid, sig);                                               // to accelpool-run alone, as a supervisor would
    bool ended = c.wait();
    if (!ended) c.kill_group();
    REQUIRE(ended);
    CHECK(c.exit_code() == 128 + sig);
    auto lease = observer(m, "vm-sig")->get(std::stoull(read_file(idfile)));
    REQUIRE(lease);
    CHECK(lease->state == LeaseState::released);
  }
}

TEST_CASE("a crashed client's lease is reclaimed after its TTL", "[integration][shim][run]") {
  ManagerProcess m(fpga_pool(1, 1.0));
  REQUIRE_MANAGER(m);
  std::string idfile = m.dir() + "/id";
  auto c = spawn({run_bin(), "--", "/bin/sh", "-c", "echo $ACCELPOOL_LEASE > " + idfile + "; exec sleep 30"},
                 pool_env(m, "vm-crash"), m.dir() + "/c.out");
  REQUIRE(eventually([&] { return !read_file(idfile).empty(); }));
  std::uint64_t id = std::stoull(read_file(idfile));
  auto obs = observer(m, "vm-crash");
  REQUIRE(renewed_past_ttl(*obs, id, 1.0));  // heartbeats keep it past one TTL
  CHECK(obs->get(id)->state == LeaseState::granted);
  c.kill_group();  // accelpool-run and its command die without releasing
  REQUIRE(eventually([&] {
    auto l = obs->get(id);
    return l && l->state == LeaseState::expired;
  }));
  // The device serves the next request.
  AcquireOptions a;
  a.kind = "fpga";
  a.timeout = accelpool::testing::kHungAfter;
  CHECK(obs->acquire(a));
}

TEST_CASE("the C ABI works from a C program", "[integration][shim][c]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  auto c = spawn({SHIM_C_CHECK_BIN, m.unix_uri(), m.guest_token(), "vm-c"}, {}, m.dir() + "/c.out");
  bool ended = c.wait();
  if (!ended) c.kill_group();
  REQUIRE(ended);
  std::string out = c.output();
  INFO(out);
  CHECK(c.exit_code() == 0);
  CHECK(out.find("0 failure(s)") != std::string::npos);
  CHECK(out.find("FAIL") == std::string::npos);
}
