#include <accelpool/backends/xrt_backend.hpp>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

#include "skip.hpp"
#include "test_support.hpp"

using namespace accelpool::backends;
using accelpool::Errc;
using namespace accelpool::backends::test;

namespace {

namespace fs = std::filesystem;

// The PCI functions the XRT user driver (xocl) is bound to, read from sysfs: the cards XRT can open, known
// without asking XRT.
std::set<std::string> xocl_functions() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/bus/pci/drivers/xocl", ec)) {
    std::string name = e.path().filename().string();
    if (std::regex_match(name, std::regex(R"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])"))) out.insert(name);
  }
  return out;
}

}  // namespace

TEST_CASE("xrt: create points XILINX_XRT at its runtime root, and enumeration lists exactly the xocl cards",
          "[xrt]") {
  ScratchDir root("xrt-root");
  ::unsetenv("XILINX_XRT");  // as in a daemon started without it: create() must set it up
  auto b = XrtBackend::create({{"runtime_root", (root.path() / "rt").string()},
                               {"xrt_lib_dir", "/usr/lib/x86_64-linux-gnu"}});
  REQUIRE(b.is_ok());
  const char* env = std::getenv("XILINX_XRT");
  REQUIRE(env != nullptr);
  CHECK(fs::path(env) == root.path() / "rt");
  CHECK(fs::read_symlink(root.path() / "rt" / "lib") == "/usr/lib/x86_64-linux-gnu");

  // Without a card XRT lists none; with cards it lists exactly those the driver holds, named by their BDF.
  auto devices = (*b)->enumerate();
  INFO((devices ? std::string() : devices.error().message));
  REQUIRE(devices.is_ok());
  std::set<std::string> listed;
  for (const auto& d : *devices) {
    CHECK(d.local_id == "xrt:" + d.pci_bdf);
    CHECK(d.kind == "fpga");
    CHECK_FALSE(d.model.empty());
    listed.insert(d.pci_bdf);
  }
  CHECK(listed == xocl_functions());
  CHECK(listed.size() == devices->size());

  // A XILINX_XRT already set (here by the first create, as an operator would) is left alone.
  auto again = XrtBackend::create({{"runtime_root", (root.path() / "other").string()}});
  REQUIRE(again.is_ok());
  CHECK(std::string(std::getenv("XILINX_XRT")) == (root.path() / "rt").string());
  CHECK_FALSE(fs::exists(root.path() / "other"));
}

TEST_CASE("xrt: calls on absent devices are clear errors", "[xrt][errors]") {
  auto b = XrtBackend::create({});
  REQUIRE(b.is_ok());
  if (!(*b)->enumerate()->empty()) {
    ACCELPOOL_SKIP("this host has XRT devices");
  }
  auto reg = sample_registry();
  auto vadd = reg.get("vadd_u250");
  REQUIRE(vadd.is_ok());
  auto st = (*b)->program("xrt:0000:65:00.1", make_image(*vadd));
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.error().code == Errc::not_found);
  CHECK_THAT(st.error().message, Catch::Contains("xrt:0000:65:00.1"));
  CHECK((*b)->loaded("xrt:0000:65:00.1").error().code == Errc::not_found);
  CHECK((*b)->reset("xrt:0000:65:00.1").error().code == Errc::not_found);
  CHECK((*b)->health("xrt:0000:65:00.1").health == Health::failed);
}

TEST_CASE("xrt: bad config is refused", "[xrt][errors]") {
  auto b = XrtBackend::create({{"runtime_root", "relative/path"}});
  REQUIRE_FALSE(b.is_ok());
  CHECK(b.error().code == Errc::invalid_argument);
  CHECK_THAT(b.error().message, Catch::Contains("'runtime_root'"));
  auto u = XrtBackend::create({{"xilinx", "/opt"}});
  REQUIRE_FALSE(u.is_ok());
  CHECK_THAT(u.error().message, Catch::Contains("'xilinx'"));
}
