// OpenCL slots end to end: the real accelpool-manager binary whose own host runs the OpenCL backend with `slots = 2`
// over PoCL's CPU device, partial kernel images from its registry, guests over TCP, the admin API over HTTP.
#include "test_client.hpp"

#include "skip.hpp"

#include <catch2/catch.hpp>

#ifdef ACCELPOOL_TEST_HAVE_OPENCL
#include <accelpool/backends/opencl_backend.hpp>
#include <accelpool/bitstreams/sha256.hpp>

#include <fstream>
#endif

using namespace accelpool::manager::itest;

#ifdef ACCELPOOL_TEST_HAVE_OPENCL
namespace {

namespace fs = std::filesystem;

// The backend settings of the manager's host, and of the backend this test opens to learn the slots' shape.
const accelpool::backends::BackendConfig kSlotSettings{
    {"slots", "2"}, {"device_type", "cpu"}, {"cache_dir", ACCELPOOL_POCL_CACHE_DIR}};

// Writes kernel image `name` (one kernel of that name) and its manifest into the seed folder `dir`: a partial
// image for slots of `slot_shape`, or a full one when `slot_shape` is empty.
void seed_image(const fs::path& dir, const std::string& name, const std::string& slot_shape) {
  const std::string source = "__kernel void " + name + "(__global uint* x) { x[get_global_id(0)] += 1u; }\n";
  std::ofstream(dir / (name + ".cl")) << source;
  std::ofstream(dir / (name + ".toml")) << "name = \"" << name << "\"\nversion = \"1\"\nkind = \"cpu\"\nfile = \""
                                        << name << ".cl\"\nsha256 = \"" << accelpool::bitstreams::sha256_bytes(source)
                                        << "\"\nprogramming_seconds = 0.05\ncompatible = [\"pthread-*\"]\n"
                                        << "kernels = [\"" << name << "\"]\n"
                                        << (slot_shape.empty() ? ""
                                                               : "image = \"partial\"\nslot_shape = \"" + slot_shape +
                                                                     "\"\nbandwidth_demand = 0.6\n");
}

// The one device a granted lease holds, once its host has prepared it (the lease.granted notification).
std::string prepared_device(GuestClient& g, const json::object& acquired) {
  REQUIRE(lease_state(acquired) == "granted");
  auto granted = g.wait_notification("lease.granted", lease_id(acquired));
  REQUIRE(granted);
  const auto& devices = granted->at("params").at("lease").at("devices").as_array();
  REQUIRE(devices.size() == 1);
  return std::string(devices[0].as_string());
}

}  // namespace
#endif

TEST_CASE("two guests run partial OpenCL images in the two slots of PoCL's CPU device, a full image waits for both",
          "[integration][slots][opencl]") {
#ifndef ACCELPOOL_TEST_HAVE_OPENCL
  ACCELPOOL_SKIP("this build has no OpenCL backend (no ICD loader)");
#else
  // The device and its slots' shape, as the manager's host will find them.
  std::string device, shape;
  {
    auto backend = accelpool::backends::OpenClBackend::create(kSlotSettings);
    if (!backend) ACCELPOOL_SKIP("PoCL's CPU device cannot hold 2 slots here: " << backend.error().message);
    auto listed = (*backend)->enumerate();
    REQUIRE(listed.is_ok());
    if (listed->empty()) ACCELPOOL_SKIP("the OpenCL ICD loader reports no CPU device (install pocl-opencl-icd)");
    device = "local/" + listed->front().local_id;
    shape = listed->front().attributes.at("slot_shape");
  }
  const fs::path seed = temp_dir("apm-opencl-seed-");
  seed_image(seed, "ping", shape);
  seed_image(seed, "pong", shape);
  seed_image(seed, "whole", "");
  std::string settings = "[hosts.settings]\n";
  for (const auto& [key, value] : kSlotSettings) settings += key + " = \"" + value + "\"\n";
  ScratchDaemon m("apm-opencl-slots-",
                  "[leases]\nttl_s = 60\nrevoke_grace_s = 1\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n"
                  "[admin]\nlisten = \"127.0.0.1:0\"\n[bitstreams]\nseed = \"" +
                      seed.string() +
                      "\"\n"
                      "[[hosts]]\nname = \"local\"\nbackend = \"opencl\"\n" +
                      settings + "[[tenants]]\nname = \"a\"\n");
  m.daemon.start();
  fs::remove_all(seed);
  const std::string admin = m.daemon.token("admin token"), token = m.daemon.token("guest token for tenant a");
  auto view = [&](const std::string& name) {
    auto r = http(m.daemon.endpoints().admin_port, "GET", "/v1/devices/" + name, admin);
    REQUIRE(r.status == 200);
    return r.json().as_object();
  };
  auto guest = [&](const std::string& id) {
    auto g = GuestClient::tcp(m.daemon.endpoints().guest_port);
    REQUIRE(g.hello(token, id).contains("result"));
    return g;
  };
  REQUIRE(view(device).at("slots").as_array().size() == 2);

  // Partial images asked of kind "cpu" go on slots: each slot is programmed with its own image.
  auto g1 = guest("vm1");
  auto g2 = guest("vm2");
  auto g3 = guest("vm3");
  auto ping = g1.call("acquire", {{"kind", "cpu"}, {"bitstream", "ping"}});
  auto pong = g2.call("acquire", {{"kind", "cpu"}, {"bitstream", "pong"}});
  const std::string ping_slot = prepared_device(g1, ping);
  const std::string pong_slot = prepared_device(g2, pong);
  CHECK(ping_slot != pong_slot);
  CHECK(ping_slot.rfind(device + ":slot", 0) == 0);
  CHECK(pong_slot.rfind(device + ":slot", 0) == 0);
  auto shared = view(device);
  CHECK(shared.at("state") == "shared");
  for (const auto& s : shared.at("slots").as_array()) {
    const auto& slot = s.as_object();
    CHECK(slot.at("state") == "leased");
    CHECK(slot.at("shape") == "cu1");  // two equal slots of the two compute units
    CHECK(slot.at("loaded") == (slot.at("name").as_string() == ping_slot ? "ping" : "pong"));
  }

  // A full image is refused on a slot, and waits for the whole device while its slots are held.
  CHECK(error_word(g3.call("acquire", {{"kind", "cpu:slot"}, {"bitstream", "whole"}})) == "incompatible");
  auto whole = g3.call("acquire", {{"kind", "cpu"}, {"bitstream", "whole"}});
  REQUIRE(lease_state(whole) == "queued");
  REQUIRE(lease_state(g1.call("release", {{"lease", lease_id(ping)}})) == "released");
  REQUIRE(lease_state(g2.call("release", {{"lease", lease_id(pong)}})) == "released");
  auto granted = g3.wait_notification("lease.granted", lease_id(whole));
  REQUIRE(granted);
  CHECK(granted->at("params").at("lease").at("devices").as_array().at(0).as_string() == device);
  CHECK(view(device).at("loaded") == "whole");
#endif
}
