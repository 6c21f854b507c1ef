#include <accelpool/backends/opencl_backend.hpp>

#include <accelpool/common/slots.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <optional>
#include <thread>

#include "skip.hpp"
#include "test_support.hpp"

using namespace accelpool::backends;
using accelpool::Errc;
using namespace accelpool::backends::test;

namespace {

// With `subdevices`, CPU devices only: the splits these tests make are PoCL's (a GPU that cannot be partitioned,
// as an NVIDIA H200 under NVIDIA's OpenCL, would make the backend refuse the key, which is not what they test).
BackendConfig pocl_config(int subdevices) {
  BackendConfig c{{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}};
  if (subdevices) {
    c["subdevices"] = std::to_string(subdevices);
    c["device_type"] = "cpu";
  }
  return c;
}

// The backend, or null (the test is then skipped, saying why) when this machine reports no OpenCL device.
std::unique_ptr<OpenClBackend> open_backend(int subdevices = 0) {
  auto b = OpenClBackend::create(pocl_config(subdevices));
  REQUIRE(b.is_ok());
  if ((*b)->enumerate()->empty()) {
    accelpool::testing::skip("the OpenCL ICD loader reports no device (install pocl-opencl-icd)");
    return nullptr;
  }
  return std::move(*b);
}

// The backend's devices, which it must list.
std::vector<DeviceInfo> listed(OpenClBackend& b) {
  auto devices = b.enumerate();
  REQUIRE(devices.is_ok());
  return std::move(*devices);
}

std::string first_cpu(OpenClBackend& b) {
  for (const auto& d : listed(b)) {
    if (d.kind == "cpu") return d.local_id;
  }
  return "";
}

// A backend and its first CPU device (with `subdevices`, a sub-device: "opencl:P:D.S"), or a null backend when
// there is none: the test is then skipped, saying why.
std::pair<std::unique_ptr<OpenClBackend>, std::string> open_on_cpu(int subdevices = 0) {
  auto b = open_backend(subdevices);
  if (!b) return {};
  std::string cpu = first_cpu(*b);
  if (cpu.empty() || (subdevices && cpu.find('.') == std::string::npos)) {
    accelpool::testing::skip(subdevices ? "no splittable OpenCL CPU device" : "no OpenCL CPU device");
    return {};
  }
  return {std::move(b), cpu};
}

// The first CPU device as a backend without slots lists it, or a null optional (the test is then skipped).
std::optional<DeviceInfo> whole_cpu() {
  auto [whole, cpu] = open_on_cpu();
  if (!whole) return std::nullopt;
  for (const auto& d : listed(*whole)) {
    if (d.local_id == cpu) return d;
  }
  return std::nullopt;
}

// Why creating the backend with `config` fails, which it must.
accelpool::Error refusal(const BackendConfig& config) {
  auto b = OpenClBackend::create(config);
  REQUIRE_FALSE(b.is_ok());
  return b.error();
}

// The message of a config refusal ("invalid_argument") of `config`.
std::string message(const BackendConfig& config) {
  auto e = refusal(config);
  CHECK(e.code == Errc::invalid_argument);
  return e.message;
}

}  // namespace

TEST_CASE("opencl: the ICD loader's devices are enumerated", "[opencl]") {
  auto b = open_backend();
  if (!b) return;
  for (const auto& d : listed(*b)) {
    INFO(d.local_id << " " << d.model);
    CHECK(d.local_id.rfind("opencl:", 0) == 0);
    CHECK_FALSE(d.model.empty());
    CHECK_FALSE(d.attributes.at("platform").empty());
    CHECK(std::stoi(d.attributes.at("compute_units")) >= 1);
    CHECK(d.passthrough == !d.pci_bdf.empty());
  }
}

TEST_CASE("opencl: a device splits into equal sub-devices", "[opencl][pocl]") {
  auto [whole, cpu] = open_on_cpu();
  if (!whole) return;
  int cus = 0;
  for (const auto& d : listed(*whole)) {
    if (d.local_id == cpu) cus = std::stoi(d.attributes.at("compute_units"));
  }
  if (cus < 2) {
    ACCELPOOL_SKIP("the CPU device has only " << cus << " compute unit");
  }
  whole.reset();
  auto split = open_backend(2);
  REQUIRE(split);
  int subs = 0;
  for (const auto& d : listed(*split)) {
    if (d.attributes.count("parent") && d.attributes.at("parent") == cpu) {
      ++subs;
      CHECK(std::stoi(d.attributes.at("compute_units")) == cus / 2);
      CHECK(d.kind == "cpu");
      // Sub-device ids are "<parent>.<n>", valid as pool device ids ([A-Za-z0-9._:-], no '/').
      CHECK(d.local_id.rfind(cpu + ".", 0) == 0);
      CHECK(d.local_id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") ==
            std::string::npos);
    }
  }
  CHECK(subs == 2);
  CHECK(split->health(cpu + ".0").health == Health::ok);
  CHECK(split->health(cpu + ".1").health == Health::ok);
}

TEST_CASE("opencl: splitting into more sub-devices than compute units is refused", "[opencl][errors]") {
  auto b = OpenClBackend::create(pocl_config(1024));
  if (b.is_ok()) {
    // Only possible when no CPU device exists at all.
    REQUIRE((*b)->enumerate()->empty());
    accelpool::testing::skip("the OpenCL ICD loader reports no CPU device (install pocl-opencl-icd)");
    return;
  }
  CHECK(b.error().code == Errc::invalid_argument);
  CHECK_THAT(b.error().message, Catch::Contains("'subdevices'") && Catch::Contains("compute units"));
}

TEST_CASE("opencl: a PoCL sub-device is programmed with the vadd sample and runs it", "[opencl][pocl]") {
  auto [b, cpu] = open_on_cpu(2);
  if (!b) return;
  std::string sub = cpu.substr(0, cpu.find('.')) + ".1";
  Image vadd = sample_image("vadd");
  CHECK(b->loaded(sub)->empty());

  auto start = std::chrono::steady_clock::now();
  REQUIRE(b->program(sub, vadd).is_ok());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  WARN("programming " << sub << " with vadd took " << ms << " ms");
  CHECK(*b->loaded(sub) == vadd.sha256);
  CHECK(b->kernel_names(sub).value() == std::vector<std::string>{"vadd"});

  const std::uint32_t n = 100000;
  std::vector<float> x(n), y(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i) * 0.5f;
    y[i] = 1000.0f - static_cast<float>(i);
  }
  std::vector<KernelArg> args{KernelArg::in<float>(x), KernelArg::in<float>(y), KernelArg::out<float>(n),
                              KernelArg::scalar<std::uint32_t>(n)};
  REQUIRE(b->run_kernel(sub, "vadd", args, {n}).is_ok());
  auto out = args[2].as<float>();
  REQUIRE(out.size() == n);
  for (std::uint32_t i = 0; i < n; i += 997) CHECK(out[i] == x[i] + y[i]);
  CHECK(out[n - 1] == x[n - 1] + y[n - 1]);

  // The other sub-device holds nothing.
  std::string other = cpu.substr(0, cpu.find('.')) + ".0";
  CHECK(b->loaded(other)->empty());
  auto not_programmed = b->run_kernel(other, "vadd", args, {n});
  REQUIRE_FALSE(not_programmed.is_ok());
  CHECK(not_programmed.error().code == Errc::not_programmed);

  // Bad calls are clear errors.
  CHECK(b->run_kernel(sub, "vsub", args, {n}).error().code == Errc::not_found);
  std::vector<KernelArg> too_few{KernelArg::in<float>(x)};
  CHECK(b->run_kernel(sub, "vadd", too_few, {n}).error().code == Errc::invalid_argument);

  REQUIRE(b->reset(sub).is_ok());
  CHECK(b->loaded(sub)->empty());
}

TEST_CASE("opencl: a program binary built on one sub-device programs another", "[opencl][pocl]") {
  auto [b, cpu] = open_on_cpu(2);
  if (!b) return;
  std::string root = cpu.substr(0, cpu.find('.'));
  REQUIRE(b->program(root + ".0", sample_image("vadd")).is_ok());
  auto binary = b->program_binary(root + ".0");
  REQUIRE(binary.is_ok());
  CHECK(binary->size() > 0);

  ScratchDir dir("binary");
  Image image;
  image.name = "vadd-bin";
  image.version = "1";
  image.sha256 = std::string(64, 'e');
  image.file = dir.path() / "vadd.pocl";
  image.format = "opencl-binary";
  std::ofstream(image.file, std::ios::binary) << *binary;
  REQUIRE(b->program(root + ".1", image).is_ok());
  CHECK(*b->loaded(root + ".1") == image.sha256);
  const std::uint32_t n = 513;
  std::vector<float> x(n, 1.5f), y(n, 2.25f);
  std::vector<KernelArg> args{KernelArg::in<float>(x), KernelArg::in<float>(y), KernelArg::out<float>(n),
                              KernelArg::scalar<std::uint32_t>(n)};
  REQUIRE(b->run_kernel(root + ".1", "vadd", args, {n}).is_ok());
  for (float v : args[2].as<float>()) CHECK(v == 3.75f);

  // Garbage is not a binary.
  std::ofstream(image.file, std::ios::binary | std::ios::trunc) << "not a program binary";
  auto bad = b->program(root + ".1", image);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.error().code == Errc::program_failed);
  CHECK(b->program_binary("opencl:9:9").error().code == Errc::not_found);
}

TEST_CASE("opencl: the checksum and matmul samples compute correct results", "[opencl][pocl]") {
  auto [b, cpu] = open_on_cpu();
  if (!b) return;
  Image checksum = sample_image("checksum");
  REQUIRE(b->program(cpu, checksum).is_ok());
  const std::uint32_t n = 4096;
  std::vector<std::uint32_t> data(n);
  std::uint32_t expected = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    data[i] = i * 7919u + 13u;
    expected += data[i] ^ (i * 2654435761u);
  }
  std::uint32_t zero = 0;
  std::vector<KernelArg> args{KernelArg::in<std::uint32_t>(data), KernelArg::scalar<std::uint32_t>(n),
                              KernelArg::inout<std::uint32_t>(std::span<const std::uint32_t>(&zero, 1))};
  REQUIRE(b->run_kernel(cpu, "checksum", args, {n}).is_ok());
  CHECK(args[2].as<std::uint32_t>()[0] == expected);

  Image matmul = sample_image("matmul");
  REQUIRE(b->program(cpu, matmul).is_ok());
  CHECK(*b->loaded(cpu) == matmul.sha256);
  const std::uint32_t m = 24;
  std::vector<float> a(m * m), bm(m * m), want(m * m, 0.0f);
  for (std::uint32_t i = 0; i < m * m; ++i) {
    a[i] = static_cast<float>(i % 7) - 3.0f;
    bm[i] = static_cast<float>(i % 5) * 0.5f;
  }
  for (std::uint32_t r = 0; r < m; ++r)
    for (std::uint32_t c = 0; c < m; ++c)
      for (std::uint32_t k = 0; k < m; ++k) want[r * m + c] += a[r * m + k] * bm[k * m + c];
  std::vector<KernelArg> margs{KernelArg::in<float>(a), KernelArg::in<float>(bm), KernelArg::out<float>(m * m),
                               KernelArg::scalar<std::uint32_t>(m)};
  REQUIRE(b->run_kernel(cpu, "matmul", margs, {m, m}).is_ok());
  auto got = margs[2].as<float>();
  for (std::uint32_t i = 0; i < m * m; ++i) CHECK(got[i] == Approx(want[i]));
}

TEST_CASE("opencl: wrong images are refused and leave the loaded image in place", "[opencl][errors]") {
  auto [b, cpu] = open_on_cpu();
  if (!b) return;
  Image vadd = sample_image("vadd");
  REQUIRE(b->program(cpu, vadd).is_ok());

  auto reg = sample_registry();
  if (auto x = reg.get("vadd_u250")) {
    auto st = b->program(cpu, make_image(*x));
    REQUIRE_FALSE(st.is_ok());
    CHECK(st.error().code == Errc::incompatible);
    CHECK_THAT(st.error().message, Catch::Contains("xclbin"));
  }

  Image other_model = vadd;
  other_model.compatible = {"NVIDIA *"};
  auto st = b->program(cpu, other_model);
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.error().code == Errc::incompatible);
  CHECK_THAT(st.error().message, Catch::Contains(cpu) && Catch::Contains("NVIDIA *"));

  ScratchDir dir("badcl");
  auto bad = dir.path() / "broken.cl";
  std::ofstream(bad) << "__kernel void broken(__global int* x) { x[0] = undefined_thing; }\n";
  Image broken;
  broken.name = "broken";
  broken.version = "1";
  broken.sha256 = std::string(64, 'b');
  broken.file = bad;
  st = b->program(cpu, broken);
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.error().code == Errc::program_failed);
  CHECK_THAT(st.error().message, Catch::Contains("undefined_thing"));  // the compiler's log

  broken.file = dir.path() / "absent.cl";
  CHECK(b->program(cpu, broken).error().code == Errc::program_failed);
  CHECK(*b->loaded(cpu) == vadd.sha256);
  CHECK(b->program("opencl:9:9", vadd).error().code == Errc::not_found);
}

TEST_CASE("opencl: health runs a tiny kernel, again and again", "[opencl][health]") {
  auto b = open_backend();
  if (!b) return;
  for (const auto& d : listed(*b)) {
    auto first = b->health(d.local_id);
    CHECK(first.health == Health::ok);
    // Once its kernel is built, a check only runs it (the time is reported, not asserted).
    auto start = std::chrono::steady_clock::now();
    auto again = b->health(d.local_id);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    CHECK(again.health == Health::ok);
    WARN("health of " << d.local_id << " with its kernel built took " << ms << " ms");
  }
  CHECK(b->health("opencl:9:9").health == Health::failed);
}

namespace {

// A backend whose first CPU device declares `slots` slots, and that device's id; a null backend when there is
// no OpenCL CPU device with that many compute units (the test is then skipped, saying why).
std::pair<std::unique_ptr<OpenClBackend>, std::string> open_with_slots(std::uint32_t slots) {
  auto device = whole_cpu();
  if (!device) return {};
  const int cus = std::stoi(device->attributes.at("compute_units"));
  if (cus < static_cast<int>(slots)) {
    accelpool::testing::skip("the CPU device has " + std::to_string(cus) + " compute units, fewer than " +
                             std::to_string(slots) + " slots");
    return {};
  }
  auto b = OpenClBackend::create({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"slots", std::to_string(slots)}});
  REQUIRE(b.is_ok());
  return {std::move(*b), device->local_id};
}

// An OpenCL C image written to `dir`: partial (for a slot of `slot_shape`) unless `slot_shape` is empty.
Image cl_image(const ScratchDir& dir, const std::string& name, const std::string& source,
               const std::string& slot_shape) {
  Image image;
  image.name = name;
  image.version = "1";
  image.sha256 = std::string(63, '0') + static_cast<char>('a' + name.size() % 6);
  image.file = dir.path() / (name + ".cl");
  std::ofstream(image.file) << source;
  image.partial = !slot_shape.empty();
  image.slot_shape = slot_shape;
  return image;
}

// Kernel `name` raises flags[mine], then waits until flags[theirs] is raised (or gives up after 2^31 looks) and
// writes 1 to seen[0] if it saw it, 0 if it gave up. Two such kernels both see the other's flag only if each
// was running while the other raised its flag: they ran at the same time.
std::string handshake_source(const std::string& name, int mine, int theirs) {
  return "__kernel void " + name +
         "(__global volatile uint* flags, __global uint* seen) {\n"
         "  flags[" +
         std::to_string(mine) +
         "] = 1u;\n"
         "  ulong looks = 0;\n"
         "  while (flags[" +
         std::to_string(theirs) +
         "] == 0u && looks < 2147483648ul) ++looks;\n"
         "  seen[0] = flags[" +
         std::to_string(theirs) +
         "] != 0u ? 1u : 0u;\n"
         "}\n";
}

}  // namespace

TEST_CASE("opencl: two slots of a PoCL CPU device run two programs at the same time", "[opencl][pocl][slots]") {
  auto [b, cpu] = open_with_slots(2);
  if (!b) return;
  // The device is listed once, with its slots; the slots are addressed by their own ids.
  const auto devices = listed(*b);
  REQUIRE(devices.size() >= 1);
  const DeviceInfo* device = nullptr;
  for (const auto& d : devices) {
    CHECK(accelpool::parse_slot_local_id(d.local_id) == std::nullopt);
    if (d.local_id == cpu) device = &d;
  }
  REQUIRE(device != nullptr);
  CHECK(device->slots == 2);
  const int slot_cus = std::stoi(device->attributes.at("compute_units")) / 2;
  const std::string shape = "cu" + std::to_string(slot_cus);
  CHECK(device->attributes.at("slot_shape") == shape);
  CHECK(accelpool::backends::slot_shapes_of(*device) == std::vector<std::string>{shape, shape});  // what hosts report
  const std::string slot0 = accelpool::slot_local_id(cpu, 0), slot1 = accelpool::slot_local_id(cpu, 1);
  CHECK(b->health(slot0).health == Health::ok);
  CHECK(b->health(slot1).health == Health::ok);
  CHECK(b->loaded(accelpool::slot_local_id(cpu, 2)).error().code == Errc::not_found);

  ScratchDir dir("slots");
  Image ping = cl_image(dir, "ping", handshake_source("ping", 0, 1), shape);
  Image pong = cl_image(dir, "pong", handshake_source("pong", 1, 0), shape);
  REQUIRE(b->program(slot0, ping).is_ok());
  REQUIRE(b->program(slot1, pong).is_ok());
  CHECK(*b->loaded(slot0) == ping.sha256);
  CHECK(*b->loaded(slot1) == pong.sha256);
  CHECK(b->loaded(cpu)->empty());
  CHECK(b->kernel_names(slot1).value() == std::vector<std::string>{"pong"});

  alignas(128) std::array<std::uint32_t, 32> flags{};  // the memory both kernels work in
  // Runs `kernel` on `slot`: what it wrote to seen[0], or the error.
  auto run = [&](const std::string& slot, const std::string& kernel) -> accelpool::Result<std::uint32_t> {
    std::vector<KernelArg> args{KernelArg::shared<std::uint32_t>(flags), KernelArg::out<std::uint32_t>(1)};
    if (auto st = b->run_kernel(slot, kernel, args, {1}); !st) return st.error();
    return args[1].as<std::uint32_t>().at(0);
  };
  accelpool::Result<std::uint32_t> ping_saw = 0u, pong_saw = 0u;
  std::thread other([&] { pong_saw = run(slot1, "pong"); });
  ping_saw = run(slot0, "ping");
  other.join();
  INFO((ping_saw ? std::string() : ping_saw.error().message) << (pong_saw ? std::string() : pong_saw.error().message));
  REQUIRE(ping_saw.is_ok());
  REQUIRE(pong_saw.is_ok());
  CHECK(flags[0] == 1);
  CHECK(flags[1] == 1);
  CHECK(*ping_saw == 1);  // ping was running when pong raised its flag...
  CHECK(*pong_saw == 1);  // ... and pong when ping raised its own

  // A full image on the whole device empties its slots.
  REQUIRE(b->program(cpu, sample_image("vadd")).is_ok());
  CHECK(b->loaded(slot0)->empty());
  CHECK(b->loaded(slot1)->empty());
  std::vector<KernelArg> none;
  CHECK(b->run_kernel(slot0, "ping", none, {1}).error().code == Errc::not_programmed);
  REQUIRE(b->reset(cpu).is_ok());
  CHECK(b->loaded(cpu)->empty());
}

TEST_CASE("opencl: a slot takes partial images of its shape only, the whole device full images only",
          "[opencl][pocl][slots][errors]") {
  auto [b, cpu] = open_with_slots(2);
  if (!b) return;
  const std::string slot0 = accelpool::slot_local_id(cpu, 0);
  std::string shape;
  for (const auto& d : listed(*b)) {
    if (d.local_id == cpu) shape = d.attributes.at("slot_shape");
  }
  REQUIRE_FALSE(shape.empty());
  ScratchDir dir("slot-errors");
  const std::string source = "__kernel void twice(__global uint* x) { x[get_global_id(0)] *= 2u; }\n";
  Image partial = cl_image(dir, "twice", source, shape);
  REQUIRE(b->program(slot0, partial).is_ok());

  Image vadd = sample_image("vadd");  // a full image
  auto whole_on_slot = b->program(slot0, vadd);
  REQUIRE_FALSE(whole_on_slot.is_ok());
  CHECK(whole_on_slot.error().code == Errc::incompatible);
  CHECK(whole_on_slot.error().message ==
        "image vadd@" + vadd.version + " is a full image (it takes a whole device), not for slot 0 of device " + cpu);

  auto partial_on_device = b->program(cpu, partial);
  REQUIRE_FALSE(partial_on_device.is_ok());
  CHECK(partial_on_device.error().code == Errc::incompatible);
  CHECK(partial_on_device.error().message ==
        "image twice@1 is a partial image (it goes into a slot), not for device " + cpu);

  Image other_shape = cl_image(dir, "other", source, shape + "0");
  auto wrong_shape = b->program(slot0, other_shape);
  REQUIRE_FALSE(wrong_shape.is_ok());
  CHECK(wrong_shape.error().code == Errc::incompatible);
  CHECK(wrong_shape.error().message == "opencl backend: image other@1 fits slots of shape '" + shape +
                                           "0', but slot 0 of device " + cpu + " has shape '" + shape + "'");
  // Refusals change nothing: the slot keeps its image, the device holds none.
  CHECK(*b->loaded(slot0) == partial.sha256);
  CHECK(b->loaded(cpu)->empty());
}

TEST_CASE("opencl: a bad slots value is refused naming the key", "[opencl][slots][errors]") {
  CHECK(message({{"slots", "two"}}) == "backend opencl: config key 'slots': 'two' is not an integer");
  CHECK(message({{"slots", "-1"}}) == "backend opencl: config key 'slots': -1 is outside 0..64");
  CHECK(message({{"slots", "65"}}) == "backend opencl: config key 'slots': 65 is outside 0..64");
  CHECK(message({{"slots", "2"}, {"subdevices", "2"}}) ==
        "backend opencl: config key 'slots': a device is either split into sub-devices ('subdevices') or declares "
        "slots, not both");
  // More slots than a device has compute units.
  auto device = whole_cpu();
  if (!device) return;
  const int cus = std::stoi(device->attributes.at("compute_units"));
  if (cus >= 64) return;
  CHECK(
      message({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"device_type", "cpu"}, {"slots", std::to_string(cus + 1)}}) ==
      "backend opencl: config key 'slots': device " + device->local_id + " ('" + device->model + "') has " +
          std::to_string(cus) + " compute units, too few for " + std::to_string(cus + 1) + " slots");
}

TEST_CASE(
    "opencl: slots of given compute-unit counts have those shapes, and a partial image goes to a slot of its shape "
    "only",
    "[opencl][pocl][slots]") {
  // PoCL's CPU device offers as many compute units as it is told (PoCL 3.1: POCL_MAX_PTHREAD_COUNT, threads it may
  // start; later releases: POCL_CPU_MAX_CU_NUM), read when PoCL starts in this process, which ctest makes the
  // start of this test case.
  ::setenv("POCL_MAX_PTHREAD_COUNT", "4", 1);
  ::setenv("POCL_CPU_MAX_CU_NUM", "4", 1);
  auto device = whole_cpu();
  if (!device) return;
  const std::string cpu = device->local_id;
  const int cus = std::stoi(device->attributes.at("compute_units"));
  if (cus < 4)
    ACCELPOOL_SKIP("the CPU device has " << cus
                                         << " compute units, fewer than slots [2, 1, 1] take (PoCL started "
                                            "before the variables were set, or reads neither)");
  auto b =
      OpenClBackend::create({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"device_type", "cpu"}, {"slots", "[2, 1, 1]"}});
  REQUIRE(b.is_ok());
  const DeviceInfo* with_slots = nullptr;
  const auto devices = listed(**b);
  for (const auto& d : devices) {
    if (d.local_id == cpu) with_slots = &d;
  }
  REQUIRE(with_slots != nullptr);
  CHECK(with_slots->slots == 3);
  CHECK(with_slots->attributes.at("compute_units") == std::to_string(cus));  // the device itself stays whole
  // Each shape is the compute units its sub-device reports (CL_DEVICE_MAX_COMPUTE_UNITS).
  CHECK(with_slots->attributes.at("slot_shapes") == "cu2,cu1,cu1");
  CHECK(with_slots->attributes.count("slot_shape") == 0);  // the slots have no one shape
  CHECK(accelpool::backends::slot_shapes_of(*with_slots) == std::vector<std::string>{"cu2", "cu1", "cu1"});
  const std::string slot0 = accelpool::slot_local_id(cpu, 0), slot1 = accelpool::slot_local_id(cpu, 1),
                    slot2 = accelpool::slot_local_id(cpu, 2);
  for (const auto& slot : {slot0, slot1, slot2}) CHECK(b.value()->health(slot).health == Health::ok);
  CHECK((*b)->loaded(accelpool::slot_local_id(cpu, 3)).error().code == Errc::not_found);

  ScratchDir dir("slot-counts");
  const std::string source = "__kernel void twice(__global uint* x) { x[get_global_id(0)] *= 2u; }\n";
  Image wide = cl_image(dir, "wide", source, "cu2");
  Image narrow = cl_image(dir, "narrow", source, "cu1");
  // A cu2 image fits slot 0 only; a cu1 image fits slots 1 and 2, not slot 0.
  for (const auto& slot : {slot1, slot2}) {
    auto refused = (*b)->program(slot, wide);
    REQUIRE_FALSE(refused.is_ok());
    CHECK(refused.error().code == Errc::incompatible);
    CHECK(refused.error().message == "opencl backend: image wide@1 fits slots of shape 'cu2', but slot " +
                                         slot.substr(slot.size() - 1) + " of device " + cpu + " has shape 'cu1'");
  }
  auto narrow_on_wide = (*b)->program(slot0, narrow);
  REQUIRE_FALSE(narrow_on_wide.is_ok());
  CHECK(narrow_on_wide.error().message ==
        "opencl backend: image narrow@1 fits slots of shape 'cu1', but slot 0 of device " + cpu + " has shape 'cu2'");
  for (const auto& slot : {slot0, slot1, slot2}) CHECK((*b)->loaded(slot)->empty());  // refusals load nothing

  REQUIRE((*b)->program(slot0, wide).is_ok());
  REQUIRE((*b)->program(slot2, narrow).is_ok());
  CHECK(*(*b)->loaded(slot0) == wide.sha256);
  CHECK((*b)->loaded(slot1)->empty());
  CHECK(*(*b)->loaded(slot2) == narrow.sha256);
  for (const auto& slot : {slot0, slot2}) {
    std::vector<std::uint32_t> values{1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<KernelArg> args{KernelArg::inout<std::uint32_t>(values)};
    REQUIRE((*b)->run_kernel(slot, "twice", args, {values.size()}).is_ok());
    CHECK(args[0].as<std::uint32_t>() == std::vector<std::uint32_t>{2, 4, 6, 8, 10, 12, 14, 16});
  }
}

TEST_CASE("opencl: bad slot counts are refused naming the key, and the device that cannot hold them",
          "[opencl][slots][errors]") {
  CHECK(message({{"slots", "[]"}}) ==
        "backend opencl: config key 'slots': [] declares no slots: give each slot's compute "
        "units, e.g. [2, 1, 1], or a number of equal slots");
  CHECK(message({{"slots", "[2, 0, 1]"}}) ==
        "backend opencl: config key 'slots': count 2 of [2, 0, 1] is 0: a slot takes at least one compute unit");
  CHECK(message({{"slots", "[1, -2]"}}) ==
        "backend opencl: config key 'slots': count 2 of [1, -2] is -2: a slot takes at least one compute unit");
  CHECK(message({{"slots", "[1, 2, x]"}}) ==
        "backend opencl: config key 'slots': '[1, 2, x]' is not a list of integers such as [2, 1, 1]");
  CHECK(message({{"slots", "[1, 1]"}, {"subdevices", "2"}}) ==
        "backend opencl: config key 'slots': a device is either split into sub-devices ('subdevices') or declares "
        "slots, not both");
  std::string many = "[1";
  for (int i = 1; i < 65; ++i) many += ", 1";
  many += "]";
  CHECK(message({{"slots", many}}) ==
        "backend opencl: config key 'slots': " + many + " declares 65 slots, more than 64");

  // Counts the first CPU device cannot hold: more compute units than it has, more sub-devices than it allows.
  auto device = whole_cpu();
  if (!device) return;
  const int cus = std::stoi(device->attributes.at("compute_units"));
  if (cus >= 64) return;
  const std::string named =
      "backend opencl: config key 'slots': device " + device->local_id + " ('" + device->model + "') ";
  const std::string too_wide = "[" + std::to_string(cus) + ", 1]";
  CHECK(message({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"device_type", "cpu"}, {"slots", too_wide}}) ==
        named + "has " + std::to_string(cus) + " compute units, fewer than the " + std::to_string(cus + 1) +
            " that slots " + too_wide + " take");
  std::string too_many = "[1";
  for (int i = 0; i < cus; ++i) too_many += ", 1";
  too_many += "]";
  // No device allows more sub-devices than it has compute units; the check on the count comes first.
  CHECK_THAT(message({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"device_type", "cpu"}, {"slots", too_many}}),
             Catch::StartsWith(named + "can be split into at most ") &&
                 Catch::EndsWith(" sub-devices, not the " + std::to_string(cus + 1) + " slots of " + too_many));
}

TEST_CASE("opencl: slots on a device that cannot be partitioned are refused naming the key and the device",
          "[opencl][pocl][slots][errors]") {
  // PoCL's "basic" CPU device offers no partitioning (CL_DEVICE_PARTITION_PROPERTIES is empty). POCL_DEVICES is
  // read when PoCL starts in this process, which ctest makes the start of this test case.
  ::setenv("POCL_DEVICES", "basic", 1);
  auto b = OpenClBackend::create({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"device_type", "cpu"}, {"slots", "1"}});
  if (b.is_ok()) {
    std::string models;
    for (const auto& d : listed(**b)) models += " '" + d.model + "'";
    ACCELPOOL_SKIP(
        "PoCL offers no unpartitionable CPU device here (it started before POCL_DEVICES was set, or has no "
        "'basic' device; devices:"
        << models << ")");
  }
  CHECK(b.error().code == Errc::invalid_argument);
  CHECK_THAT(b.error().message,
             Catch::StartsWith("backend opencl: config key 'slots': device opencl:") && Catch::Contains("('basic-") &&
                 Catch::EndsWith("cannot be partitioned into equal sub-devices (CL_DEVICE_PARTITION_PROPERTIES lacks "
                                 "CL_DEVICE_PARTITION_EQUALLY): it can be offered whole only"));
  // Slots of given counts need partitioning by counts, which it lacks as well.
  CHECK_THAT(refusal({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"device_type", "cpu"}, {"slots", "[1]"}}).message,
             Catch::StartsWith("backend opencl: config key 'slots': device opencl:") && Catch::Contains("('basic-") &&
                 Catch::EndsWith("cannot be partitioned by counts (CL_DEVICE_PARTITION_PROPERTIES lacks "
                                 "CL_DEVICE_PARTITION_BY_COUNTS): slots [1] cannot be made on it"));
}
