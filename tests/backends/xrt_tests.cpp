#include <accelpool/backends/xrt_backend.hpp>

#include <cstdlib>

#include "test_support.hpp"

using namespace accelpool::backends;
using namespace accelpool::backends::test;

TEST_CASE("xrt: enumeration works and reports 0 devices without a card", "[xrt]") {
  ScratchDir root("xrt-root");
  auto b = XrtBackend::create({{"runtime_root", (root.path() / "rt").string()}});
  REQUIRE(b.is_ok());
  const char* env = std::getenv("XILINX_XRT");
  REQUIRE(env != nullptr);
  auto devices = (*b)->enumerate();
  REQUIRE(devices.is_ok());
  if (!devices->empty()) {
    WARN("this host has " << devices->size() << " XRT device(s); the 0-device check does not apply");
    for (const auto& d : *devices) {
      CHECK(d.local_id == "xrt:" + d.pci_bdf);
      CHECK_FALSE(d.model.empty());
    }
    return;
  }
  CHECK(devices->empty());
}

TEST_CASE("xrt: calls on absent devices are clear errors", "[xrt][errors]") {
  auto b = XrtBackend::create({});
  REQUIRE(b.is_ok());
  if (!(*b)->enumerate()->empty()) {
    WARN("skipped: this host has XRT devices");
    return;
  }
  auto reg = sample_registry();
  auto vadd = reg.get("vadd_u250");
  REQUIRE(vadd.is_ok());
  auto st = (*b)->program("xrt:0000:65:00.1", make_image(*vadd));
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.error().code == "not_found");
  CHECK_THAT(st.error().message, Catch::Contains("xrt:0000:65:00.1"));
  CHECK((*b)->loaded("xrt:0000:65:00.1").error().code == "not_found");
  CHECK((*b)->reset("xrt:0000:65:00.1").error().code == "not_found");
  CHECK((*b)->health("xrt:0000:65:00.1").health == Health::failed);
}

TEST_CASE("xrt: bad config is refused", "[xrt][errors]") {
  auto b = XrtBackend::create({{"runtime_root", "relative/path"}});
  REQUIRE_FALSE(b.is_ok());
  CHECK(b.error().code == "invalid_argument");
  CHECK_THAT(b.error().message, Catch::Contains("'runtime_root'"));
  auto u = XrtBackend::create({{"xilinx", "/opt"}});
  REQUIRE_FALSE(u.is_ok());
  CHECK_THAT(u.error().message, Catch::Contains("'xilinx'"));
}
