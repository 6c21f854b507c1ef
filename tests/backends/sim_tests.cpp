#include <accelpool/backends/sim_backend.hpp>

#include <chrono>
#include <vector>

#include "skip.hpp"
#include "test_support.hpp"

using namespace accelpool::backends;
using accelpool::Errc;
using namespace accelpool::backends::test;
using namespace std::chrono_literals;

namespace {

const std::string kU250 = "xilinx_u250_gen3x16_xdma_4_1_202210_1";

// Records every wait instead of sleeping.
struct RecordingSleeper {
  std::vector<std::chrono::nanoseconds> waits;
  Sleeper sleeper() {
    return [this](std::chrono::nanoseconds d) { waits.push_back(d); };
  }
};

Image image_of_size(std::uint64_t bytes, std::vector<std::string> compatible = {}) {
  Image image;
  image.name = "synthetic";
  image.version = "1";
  image.sha256 = std::string(64, 'c');
  image.size_bytes = bytes;
  image.compatible = std::move(compatible);
  return image;
}

std::unique_ptr<SimBackend> make_sim(const BackendConfig& config, RecordingSleeper& rec) {
  auto sim = SimBackend::create(config, rec.sleeper());
  REQUIRE(sim.is_ok());
  return std::move(*sim);
}

}  // namespace

TEST_CASE("sim: devices come from the config with kinds, models and stable ids", "[sim]") {
  RecordingSleeper rec;
  auto sim = make_sim({{"devices", "fpga:" + kU250 + ":2, gpu:sim-gpu:3"}, {"attach", "shmem"}}, rec);
  auto devices = sim->enumerate();
  REQUIRE(devices.is_ok());
  REQUIRE(devices->size() == 5);
  CHECK((*devices)[0].local_id == "sim:0");
  CHECK((*devices)[0].kind == "fpga");
  CHECK((*devices)[0].model == kU250);
  CHECK((*devices)[0].passthrough);
  CHECK((*devices)[0].attributes.at("shmem_name") == "accelpool-sim-0");
  CHECK((*devices)[4].local_id == "sim:4");
  CHECK((*devices)[4].kind == "gpu");
  CHECK((*devices)[4].model == "sim-gpu");

  auto net = make_sim({{"devices", "gpu:sim-gpu:1"}, {"attach", "network"}}, rec);
  CHECK_FALSE((*net->enumerate())[0].passthrough);
}

TEST_CASE("sim: a model with colons (VBNV style) parses", "[sim]") {
  RecordingSleeper rec;
  auto sim = make_sim({{"devices", "fpga:xilinx:u250:gen3x16:3"}}, rec);
  auto devices = sim->enumerate();
  REQUIRE(devices->size() == 3);
  CHECK((*devices)[2].model == "xilinx:u250:gen3x16");
}

TEST_CASE("sim: bad config is refused with the key named", "[sim][errors]") {
  std::vector<std::pair<BackendConfig, std::string>> cases = {
      {{{"devices", "fpga:u250"}}, "'devices'"},
      {{{"devices", "fpga:u250:many"}}, "'devices'"},
      {{{"devices", "fpga:u250:0"}}, "'devices'"},
      {{{"program_mib_per_s", "fast"}}, "'program_mib_per_s'"},
      {{{"program_mib_per_s", "0"}}, "'program_mib_per_s'"},
      {{{"attach", "usb"}}, "'attach'"},
      {{{"failed_devices", "sim:99"}}, "'failed_devices'"},
      {{{"devcies", "fpga:x:1"}}, "'devcies'"},
      {{{"slots", "65"}}, "'slots'"},
      {{{"slots", "two"}}, "'slots'"},
      {{{"partial_program_base_ms", "-1"}}, "'partial_program_base_ms'"},
  };
  for (const auto& [config, key] : cases) {
    INFO(key);
    auto sim = SimBackend::create(config);
    REQUIRE_FALSE(sim.is_ok());
    CHECK(sim.error().code == Errc::invalid_argument);
    CHECK_THAT(sim.error().message, Catch::Contains(key));
  }
}

TEST_CASE("sim: programming takes base + size / rate and tracks the loaded image", "[sim]") {
  RecordingSleeper rec;
  auto sim =
      make_sim({{"devices", "fpga:" + kU250 + ":2"}, {"program_mib_per_s", "16"}, {"program_base_ms", "100"}}, rec);
  Image image = image_of_size(64ull * 1024 * 1024);
  CHECK(sim->programming_time(image) == 100ms + 4s);
  CHECK(sim->loaded("sim:1")->empty());
  REQUIRE(sim->program("sim:1", image).is_ok());
  REQUIRE(rec.waits.size() == 1);
  CHECK(rec.waits[0] == 4100ms);
  CHECK(*sim->loaded("sim:1") == image.sha256);
  CHECK(sim->loaded("sim:0")->empty());
  CHECK(*sim->program_count("sim:1") == 1);

  // Twice the size, twice the transfer time.
  Image bigger = image_of_size(128ull * 1024 * 1024);
  bigger.sha256 = std::string(64, 'd');
  REQUIRE(sim->program("sim:1", bigger).is_ok());
  CHECK(rec.waits[1] == 8100ms);
  CHECK(*sim->loaded("sim:1") == bigger.sha256);

  // reset keeps the image unless configured otherwise.
  REQUIRE(sim->reset("sim:1").is_ok());
  CHECK(*sim->loaded("sim:1") == bigger.sha256);
  auto unloading = make_sim({{"devices", "fpga:" + kU250 + ":1"}, {"reset_unloads", "true"}}, rec);
  REQUIRE(unloading->program("sim:0", image).is_ok());
  REQUIRE(unloading->reset("sim:0").is_ok());
  CHECK(unloading->loaded("sim:0")->empty());
}

TEST_CASE("sim: slots take partial images side by side, and a full image empties them", "[sim][slots]") {
  RecordingSleeper rec;
  auto sim = make_sim({{"devices", "fpga:" + kU250 + ":2"},
                       {"slots", "2"},
                       {"program_mib_per_s", "16"},
                       {"program_base_ms", "100"},
                       {"partial_program_base_ms", "30"}},
                      rec);
  auto devices = sim->enumerate();
  REQUIRE(devices.is_ok());
  REQUIRE(devices->size() == 2);  // devices are listed whole, each with its slots
  CHECK((*devices)[0].slots == 2);

  Image a = image_of_size(16ull * 1024 * 1024, {kU250});
  a.partial = true;
  Image b = a;
  b.sha256 = std::string(64, 'e');
  CHECK(sim->programming_time(a) == 30ms + 1s);  // a partial image: the partial base + size / rate
  REQUIRE(sim->program("sim:0:slot0", a).is_ok());
  REQUIRE(sim->program("sim:0:slot1", b).is_ok());
  CHECK(rec.waits == std::vector<std::chrono::nanoseconds>{1030ms, 1030ms});
  CHECK(*sim->loaded("sim:0:slot0") == a.sha256);
  CHECK(*sim->loaded("sim:0:slot1") == b.sha256);
  CHECK(sim->loaded("sim:0")->empty());
  CHECK(*sim->program_count("sim:0:slot1") == 1);
  CHECK(*sim->program_count("sim:0") == 0);
  CHECK(sim->loaded("sim:1:slot0")->empty());

  // A partial image never takes a whole device, a full one never a slot: refused without touching anything.
  auto whole = sim->program("sim:0", a);
  REQUIRE_FALSE(whole.is_ok());
  CHECK(whole.error().code == Errc::incompatible);
  CHECK_THAT(whole.error().message, Catch::Contains("partial image"));
  Image full = image_of_size(16ull * 1024 * 1024);
  auto into_slot = sim->program("sim:0:slot1", full);
  REQUIRE_FALSE(into_slot.is_ok());
  CHECK(into_slot.error().code == Errc::incompatible);
  CHECK_THAT(into_slot.error().message, Catch::Contains("slot 1 of device sim:0"));
  CHECK(*sim->loaded("sim:0:slot1") == b.sha256);
  CHECK(rec.waits.size() == 2);

  // Slots that do not exist are not found; a failed device fails its slots.
  for (const char* id : {"sim:0:slot2", "sim:9:slot0", "sim:0:slot01", "sim:0:slotx"}) {
    INFO(id);
    CHECK(sim->program(id, a).error().code == Errc::not_found);
    CHECK(sim->health(id).health == Health::failed);
  }
  REQUIRE(sim->fail_device("sim:0", "burnt").is_ok());
  CHECK(sim->health("sim:0:slot0").health == Health::failed);
  CHECK(sim->program("sim:0:slot0", b).error().code == Errc::program_failed);
  REQUIRE(sim->recover_device("sim:0").is_ok());

  // A full image replaces the shell's regions: the slots hold nothing afterwards.
  REQUIRE(sim->program("sim:0", full).is_ok());
  CHECK(*sim->loaded("sim:0") == full.sha256);
  CHECK(sim->loaded("sim:0:slot0")->empty());
  CHECK(sim->loaded("sim:0:slot1")->empty());
}

TEST_CASE("sim: the default sleeper really waits", "[sim]") {
  auto sim = SimBackend::create({{"devices", "fpga:" + kU250 + ":1"}, {"program_base_ms", "30"}});
  REQUIRE(sim.is_ok());
  auto start = std::chrono::steady_clock::now();
  REQUIRE((*sim)->program("sim:0", image_of_size(0)).is_ok());
  CHECK(std::chrono::steady_clock::now() - start >= 30ms);
}

TEST_CASE("sim: registry images program by compatibility", "[sim]") {
  RecordingSleeper rec;
  auto sim = make_sim({{"devices", "fpga:" + kU250 + ":1,cpu:sim-cpu:1"}}, rec);
  auto reg = sample_registry();
  auto vadd_u250 = reg.get("vadd_u250");
  if (!vadd_u250) {
    ACCELPOOL_SKIP("no generated xclbin samples (built without XRT headers)");
  }
  Image image = make_image(*vadd_u250);
  CHECK(image.size_bytes > 256 * 1024);
  REQUIRE(sim->program("sim:0", image).is_ok());
  CHECK(*sim->loaded("sim:0") == vadd_u250->manifest.sha256);

  auto wrong = sim->program("sim:0", make_image(*reg.get("matmul_u280")));
  REQUIRE_FALSE(wrong.is_ok());
  CHECK(wrong.error().code == Errc::incompatible);
  CHECK_THAT(wrong.error().message, Catch::Contains("sim:0") && Catch::Contains(kU250));
  CHECK(*sim->loaded("sim:0") == vadd_u250->manifest.sha256);  // unchanged
  CHECK(rec.waits.size() == 1);                                // no time spent on the refused image

  REQUIRE(sim->program("sim:1", make_image(*reg.get("vadd"))).is_ok());  // OpenCL sample fits "sim-*"
}

TEST_CASE("sim: injected failures", "[sim][failures]") {
  RecordingSleeper rec;
  auto sim = make_sim({{"devices", "fpga:" + kU250 + ":3"}, {"hang_ms", "5000"}}, rec);
  Image image = image_of_size(1024);

  SECTION("programming fails the requested number of times, then works") {
    REQUIRE(sim->program("sim:0", image).is_ok());
    REQUIRE(sim->fail_next_programs("sim:0", 2).is_ok());
    CHECK(sim->health("sim:0").health == Health::degraded);
    for (int i = 0; i < 2; ++i) {
      auto st = sim->program("sim:0", image);
      REQUIRE_FALSE(st.is_ok());
      CHECK(st.error().code == Errc::program_failed);
      CHECK(sim->loaded("sim:0")->empty());  // a failed programming leaves no image
    }
    REQUIRE(sim->program("sim:0", image).is_ok());
    CHECK(*sim->loaded("sim:0") == image.sha256);
    CHECK(sim->health("sim:0").health == Health::ok);
  }
  SECTION("a hang blocks for the hang duration, then fails") {
    REQUIRE(sim->hang_next_program("sim:1").is_ok());
    auto st = sim->program("sim:1", image);
    REQUIRE_FALSE(st.is_ok());
    CHECK(st.error().code == Errc::program_failed);
    CHECK_THAT(st.error().message, Catch::Contains("hung"));
    REQUIRE(rec.waits.size() == 1);
    CHECK(rec.waits[0] == 5s);
    REQUIRE(sim->program("sim:1", image).is_ok());
  }
  SECTION("a failed device fails health, programming and reset until recovered") {
    REQUIRE(sim->fail_device("sim:2", "fan stopped").is_ok());
    auto h = sim->health("sim:2");
    CHECK(h.health == Health::failed);
    CHECK(h.detail == "fan stopped");
    CHECK(sim->program("sim:2", image).error().code == Errc::program_failed);
    CHECK_FALSE(sim->reset("sim:2").is_ok());
    CHECK(sim->health("sim:1").health == Health::ok);  // others unaffected
    REQUIRE(sim->recover_device("sim:2").is_ok());
    CHECK(sim->health("sim:2").health == Health::ok);
    CHECK(sim->program("sim:2", image).is_ok());
  }
  SECTION("a device that fails while programming ends without an image") {
    std::unique_ptr<SimBackend> slow;
    // The device fails during the programming wait itself (the sleeper runs outside the backend's lock).
    auto created =
        SimBackend::create({{"devices", "fpga:" + kU250 + ":1"}, {"program_base_ms", "200"}},
                           [&](std::chrono::nanoseconds) { (void)slow->fail_device("sim:0", "power loss"); });
    REQUIRE(created.is_ok());
    slow = std::move(*created);
    auto st = slow->program("sim:0", image);
    REQUIRE_FALSE(st.is_ok());
    CHECK_THAT(st.error().message, Catch::Contains("power loss"));
    CHECK(slow->loaded("sim:0")->empty());
  }
  SECTION("unknown devices are errors everywhere") {
    CHECK(sim->program("sim:9", image).error().code == Errc::not_found);
    CHECK(sim->loaded("sim:9").error().code == Errc::not_found);
    CHECK(sim->reset("sim:9").error().code == Errc::not_found);
    CHECK(sim->fail_device("gpu0").error().code == Errc::not_found);
    CHECK(sim->health("sim:9").health == Health::failed);
  }
}

TEST_CASE("sim: failures can be set in the config", "[sim][failures]") {
  RecordingSleeper rec;
  auto sim = make_sim({{"devices", "fpga:" + kU250 + ":4"},
                       {"failed_devices", "sim:1"},
                       {"program_failures", "sim:2=1"},
                       {"hanging_devices", "sim:3"}},
                      rec);
  Image image = image_of_size(10);
  CHECK(sim->health("sim:0").health == Health::ok);
  CHECK(sim->health("sim:1").health == Health::failed);
  CHECK_FALSE(sim->program("sim:1", image).is_ok());
  CHECK_FALSE(sim->program("sim:2", image).is_ok());
  CHECK(sim->program("sim:2", image).is_ok());
  CHECK_FALSE(sim->program("sim:3", image).is_ok());
  CHECK(rec.waits.back() == 60s);  // default hang duration
}
