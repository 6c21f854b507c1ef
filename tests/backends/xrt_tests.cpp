#include <accelpool/backends/xrt_backend.hpp>
#include <accelpool/bitstreams/xclbin.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

TEST_CASE("xrt: create points XILINX_XRT at its runtime root, and enumeration lists exactly the xocl cards", "[xrt]") {
  ScratchDir root("xrt-root");
  ::unsetenv("XILINX_XRT");  // as in a daemon started without it: create() must set it up
  auto b = XrtBackend::create(
      {{"runtime_root", (root.path() / "rt").string()}, {"xrt_lib_dir", "/usr/lib/x86_64-linux-gnu"}});
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

#ifdef ACCELPOOL_MKXCLBIN
namespace {

// Builds `<dir>/<name>.xclbin` for the U250 shell with accelpool-mkxclbin, its shell mode `mode` ("flat" or "pr"),
// and reads it back with the registry's reader (XRT's parser). The tool's exit status when it fails.
accelpool::Result<accelpool::bitstreams::XclbinInfo> built_xclbin(const ScratchDir& dir, const std::string& name,
                                                                  const std::string& mode) {
  const auto spec = dir.path() / (name + ".spec.toml");
  std::ofstream(spec) << "name = \"" << name
                      << "\"\nversion = \"1\"\nplatform = \"xilinx_u250_gen3x16_xdma_4_1_202210_1\"\n"
                      << "mode = \"" << mode
                      << "\"\n[[kernels]]\nname = \"vadd\"\nargs = [\"a:int*\", \"n:unsigned int\"]\n";
  const std::string command = std::string(ACCELPOOL_MKXCLBIN) + " " + spec.string() + " " + dir.path().string() +
                              " 2>" + (dir.path() / (name + ".err")).string();
  if (const int status = std::system(command.c_str()); status != 0)
    return accelpool::make_error(Errc::invalid_argument,
                                 "accelpool-mkxclbin exited with status " + std::to_string(status));
  return accelpool::bitstreams::read_xclbin(dir.path() / (name + ".xclbin"));
}

}  // namespace

TEST_CASE("xrt: a card's shell is offered whole, and the report says whether it reconfigures its user region",
          "[xrt][slots]") {
  ScratchDir dir("xrt-shells");
  auto flat = built_xclbin(dir, "flat_shell", "flat");
  auto pr = built_xclbin(dir, "pr_shell", "pr");
  REQUIRE(flat.is_ok());
  REQUIRE(pr.is_ok());
  CHECK(flat->parsed_by_xrt);
  CHECK(pr->parsed_by_xrt);
  CHECK(flat->mode == 0);  // XCLBIN_FLAT, as the header says and XRT's parser accepts
  CHECK(pr->mode == 1);    // XCLBIN_PR

  const auto flat_shell = xrt_shell_slots(flat->platform, flat->mode);
  CHECK_FALSE(flat_shell.partial_reconfiguration);
  CHECK(flat_shell.slots == 0);
  CHECK(flat_shell.report ==
        "shell 'xilinx_u250_gen3x16_xdma_4_1_202210_1' is flat (XCLBIN_FLAT): an xclbin replaces "
        "the whole device, so the card is offered whole (no slots)");
  const auto pr_shell = xrt_shell_slots(pr->platform, pr->mode);
  CHECK(pr_shell.partial_reconfiguration);
  CHECK(pr_shell.slots == 0);
  CHECK(pr_shell.report ==
        "shell 'xilinx_u250_gen3x16_xdma_4_1_202210_1' reconfigures one user region (XCLBIN_PR): an "
        "xclbin fills all of it and XRT loads one per card, so the card is offered whole (no slots)");
  // The sample images the build writes are for flat shells.
  auto sample = accelpool::bitstreams::read_xclbin(build_samples / "vadd_u250.xclbin");
  REQUIRE(sample.is_ok());
  CHECK(sample->mode == 0);
  // A mode XRT does not define is reported as such, still whole.
  const auto unknown = xrt_shell_slots("x", 7);
  CHECK(unknown.slots == 0);
  CHECK_FALSE(unknown.partial_reconfiguration);
  CHECK(unknown.report == "shell 'x': unknown XCLBIN_MODE 7, so the card is offered whole (no slots)");
  // The writer refuses a mode it does not know, naming the field.
  CHECK_FALSE(built_xclbin(dir, "bad_mode", "dfx").is_ok());
  std::ifstream err(dir.path() / "bad_mode.err");
  std::string line;
  std::getline(err, line);
  CHECK_THAT(line, Catch::Contains("field 'mode': 'dfx' is not flat or pr"));
}
#endif
