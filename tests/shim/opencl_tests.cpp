// Concurrent accelpool-run jobs on PoCL devices running the sample vadd kernel on real data.
#include "client_options.hpp"
#include "manager_fixture.hpp"

#include <accelpool/shim/client.hpp>

#include <catch2/catch.hpp>

#include "skip.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>
#include <set>

using namespace accelpool::shim;
using accelpool::Errc;
using accelpool::shim::test::Child;
using accelpool::shim::test::ManagerOptions;
using accelpool::shim::test::ManagerProcess;
using accelpool::shim::test::spawn;

#ifdef SHIM_OPENCL_EXAMPLE_BIN
TEST_CASE("concurrent accelpool-run jobs run the vadd sample on PoCL through the pool", "[integration][shim][opencl]") {
  if (ManagerProcess::binary().empty()) {
    ACCELPOOL_SKIP("this build has no accelpool-manager target");
  }
  const ManagerOptions o = test::pocl_pool();
  ManagerProcess m(o);
  if (!m.start()) FAIL("accelpool-manager did not start: " << m.error());
  {
    auto c = Client::connect(test::connect_options(m.tcp_uri(), m.guest_token(), "probe"));
    REQUIRE(c);
    AcquireOptions a;
    a.kind = "cpu";
    a.timeout = accelpool::testing::kHungAfter;
    auto l = (*c)->acquire(a);
    if (!l && l.error().code == Errc::infeasible) {
      ACCELPOOL_SKIP("the manager's OpenCL backend found no CPU device (is pocl-opencl-icd installed?): " +
                     l.error().message);
    }
    REQUIRE(l);
  }
  constexpr int kJobs = 3;
  std::vector<Child> jobs;
  for (int i = 0; i < kJobs; ++i) {
    const std::map<std::string, std::string> env = {{"ACCELPOOL_POOL", m.unix_uri()},
                                                    {"ACCELPOOL_TOKEN", m.guest_token()},
                                                    {"ACCELPOOL_GUEST", "vm-job" + std::to_string(i)},
                                                    {"POCL_CACHE_DIR", o.pocl_cache_dir}};
    jobs.push_back(spawn({ACCELPOOL_RUN_BIN, "--kind", "cpu", "--estimate", "2", "--timeout", "60", "--",
                          SHIM_OPENCL_EXAMPLE_BIN, SHIM_VADD_SOURCE, "262144"},
                         env, m.dir() + "/job" + std::to_string(i) + ".out"));
  }
  std::set<std::string> leases;
  for (auto& job : jobs) {
    REQUIRE(job.wait());
    const std::string out = job.output();
    INFO(out);
    CHECK(job.exit_code() == 0);
    CHECK(out.find("262144 elements verified") != std::string::npos);
    auto p = out.find("lease ");
    REQUIRE(p != std::string::npos);
    leases.insert(out.substr(p + 6, out.find(' ', p + 6) - p - 6));
  }
  CHECK(leases.size() == kJobs);  // three grants, one after the other on the pool's device(s)

  // The examples acquire by themselves through the library: the C++ one and the C one (C ABI), at the same time.
  auto start = [&](const std::string& name, const std::vector<std::string>& args) {
    const std::map<std::string, std::string> env = {
        {"ACCELPOOL_LEASE", ""},  // removed
        {"ACCELPOOL_POOL", m.tcp_uri()}, {"ACCELPOOL_TOKEN", m.guest_token()}, {"ACCELPOOL_GUEST", name},
        {"ACCELPOOL_KIND", "cpu"},       {"POCL_CACHE_DIR", o.pocl_cache_dir}};
    return spawn(args, env, m.dir() + "/" + name + ".out");
  };
  Child cpp = start("cpp", {SHIM_OPENCL_EXAMPLE_BIN, SHIM_VADD_SOURCE, "65536"});
  Child c =
      start("c", {SHIM_OPENCL_C_EXAMPLE_BIN, m.unix_uri(), m.guest_token(), "vm-c", "cpu", SHIM_VADD_SOURCE, "65536"});
  for (auto [child, name] : {std::pair{&cpp, "cpp"}, std::pair{&c, "c"}}) {
    REQUIRE(child->wait());
    const std::string out = child->output();
    INFO(name << ": " << out);
    CHECK(child->exit_code() == 0);
    CHECK(out.find("65536 elements verified") != std::string::npos);
    CHECK(out.find("local/opencl:") != std::string::npos);
  }
}
#else
TEST_CASE("concurrent accelpool-run jobs run the vadd sample on PoCL through the pool", "[integration][shim][opencl]") {
  ACCELPOOL_SKIP("built without OpenCL (no ICD loader found), so the OpenCL example does not exist");
}
#endif
