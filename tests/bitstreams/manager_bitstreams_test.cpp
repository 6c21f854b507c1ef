// The manager's bitstream registry end to end: the real accelpool-manager binary on loopback with its SQLite
// store on disk, images uploaded over the admin API, acquires checked against the registry, devices programmed
// through the real backends (PoCL through the ICD loader, the simulated backend with XRT-parsed xclbins), and
// images fetched by sha256 over the agent link by a real accelpool-agent.
#include "../manager/test_client.hpp"
#include "test_support.hpp"

#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#ifdef ACCELPOOL_TEST_HAVE_OPENCL
#include <accelpool/backends/factory.hpp>
#include <accelpool/backends/opencl_backend.hpp>
#endif

#include <catch2/catch.hpp>

#include "skip.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <set>
#include <sstream>
#include <thread>

using namespace accelpool;
using namespace accelpool::manager::itest;
using accelpool::bitstreams::test::read_file;
using accelpool::bitstreams::test::write_file;
namespace fs = std::filesystem;

namespace {

constexpr const char* kU250 = "xilinx_u250_gen3x16_xdma_4_1_202210_1";
constexpr const char* kAgentToken = "agent-token-0123456789";

const char* kSaxpy =
    "// y[i] = a * x[i] + y[i]\n"
    "__kernel void saxpy(const float a, __global const float* x, __global float* y, const uint n) {\n"
    "  const size_t i = get_global_id(0);\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

std::string base_config(const std::string& hosts) {
  std::ostringstream o;
  o << "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"guest.sock\"\n"
    << "[admin]\nlisten = \"127.0.0.1:0\"\n"
    << "[agents]\nlisten = [\"127.0.0.1:0\"]\ntoken = \"" << kAgentToken << "\"\n"
    << "[leases]\nttl_s = 60\nrevoke_grace_s = 1\n"
    << hosts;
  return o.str();
}

// One simulated U250 card: the sample xclbins are programmed onto it (checked by XRT's parser on upload).
std::string sim_u250_host() {
  return std::string("[[hosts]]\nname = \"local\"\nbackend = \"sim\"\n[hosts.settings]\ndevices = \"fpga:") + kU250 +
         ":1\"\nprogram_base_ms = 5\n";
}

// The embedded default's host (simulated cards and OpenCL devices) with the OpenCL devices split in two.
std::string split_pocl_host() {
  return std::string("[[hosts]]\nname = \"local\"\nbackend = \"sim+opencl\"\n[hosts.settings]\n") +
         "\"opencl.subdevices\" = 2\n\"opencl.cache_dir\" = \"" + ACCELPOOL_POCL_CACHE_DIR + "\"\n";
}

struct Manager {
  accelpool::testing::ScratchDir dir{"manager"};
  DaemonProcess daemon;
  std::string admin, guest_token;
  explicit Manager(const std::string& config) : daemon(dir.path(), config) {
    daemon.start();
    admin = daemon.token("admin token");
    guest_token = daemon.token("guest token for tenant default");
  }
  ~Manager() { daemon.stop(SIGKILL); }
  int port() const { return daemon.endpoints().admin_port; }
  HttpResult get(const std::string& target) { return http(port(), "GET", target, admin); }
  HttpResult del(const std::string& target) { return http(port(), "DELETE", target, admin); }
  HttpResult upload(const std::string& manifest, const std::string& bytes) {
    json::object body{{"manifest", manifest}, {"content_base64", bitstreams::base64_encode(bytes)}};
    return http(port(), "POST", "/v1/bitstreams", admin, json::serialize(body));
  }
  GuestClient guest(const std::string& id) {
    auto g = GuestClient::tcp(daemon.endpoints().guest_port);
    REQUIRE(g.hello(guest_token, id).contains("result"));
    return g;
  }
  fs::path registry_dir() const { return daemon.data_dir() / "bitstreams"; }
};

std::string manifest_toml(const std::string& name, const std::string& version, const std::string& kind,
                          const std::string& file, const std::string& bytes, const std::string& compatible,
                          const std::string& kernels, const std::string& extra = "") {
  std::ostringstream o;
  o << "name = \"" << name << "\"\nversion = \"" << version << "\"\nkind = \"" << kind << "\"\nfile = \"" << file
    << "\"\nsha256 = \"" << bitstreams::sha256_bytes(bytes) << "\"\nprogramming_seconds = 0.5\ncompatible = ["
    << compatible << "]\nkernels = [" << kernels << "]\n"
    << extra;
  return o.str();
}

// Every file of a folder with its size and hash: "nothing changed" means this stays equal.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = *bitstreams::sha256_file(e.path());
  return out;
}

std::string error_code(const HttpResult& r) { return std::string(r.json().at("error").at("code").as_string()); }
std::string error_message(const HttpResult& r) { return std::string(r.json().at("error").at("message").as_string()); }
std::string call_error(const json::object& reply) { return std::string(reply.at("error").at("message").as_string()); }

}  // namespace

TEST_CASE("an uploaded OpenCL bitstream is granted on a split PoCL sub-device, programmed, and its kernel runs",
          "[integration][bitstreams][opencl]") {
#ifndef ACCELPOOL_TEST_HAVE_OPENCL
  ACCELPOOL_SKIP("this build has no OpenCL backend (no ICD loader)");
#else
  Manager m(base_config(split_pocl_host()));
  auto devices = m.get("/v1/devices");
  REQUIRE(devices.status == 200);
  std::set<std::string> subdevices;
  auto listed = devices.json();
  for (const auto& d : listed.at("devices").as_array()) {
    std::string name(d.at("name").as_string());
    if (d.at("kind").as_string() == "cpu") subdevices.insert(name);
  }
  if (subdevices.empty()) {
    ACCELPOOL_SKIP("the ICD loader reports no OpenCL CPU device (install pocl-opencl-icd)");
  }
  // Sub-device ids are valid pool device names: HOST/opencl:<platform>:<device>.<sub-device>.
  for (const auto& name : subdevices) CHECK(std::regex_match(name, std::regex(R"(local/opencl:\d+:\d+\.\d+)")));
  CHECK(subdevices.size() >= 2);

  // Upload: verified and stored in the registry folder.
  auto up = m.upload(manifest_toml("saxpy", "1.0.0", "cpu", "saxpy.cl", kSaxpy, "\"pthread-*\"", "\"saxpy\""), kSaxpy);
  REQUIRE(up.status == 201);
  CHECK(up.json().at("sha256").as_string() == bitstreams::sha256_bytes(kSaxpy));
  CHECK(read_file(m.registry_dir() / "saxpy.cl") == kSaxpy);
  CHECK(fs::exists(m.registry_dir() / "saxpy-1.0.0.toml"));
  CHECK(m.get("/v1/bitstreams/saxpy").status == 200);

  // Acquire: granted on one sub-device, which the manager programs with the uploaded source.
  auto g = m.guest("vm-cl");
  auto r = g.call("acquire", {{"kind", "cpu"}, {"bitstream", "saxpy"}});
  REQUIRE(lease_state(r) == "granted");
  auto id = lease_id(r);
  auto ready = g.wait_notification("lease.granted", id);
  REQUIRE(ready);
  auto lease = ready->at("params").at("lease").as_object();
  REQUIRE(lease.at("devices").as_array().size() == 1);
  std::string device(lease.at("devices").as_array()[0].as_string());
  CHECK(subdevices.count(device) == 1);
  auto held = m.get("/v1/devices/" + device);
  REQUIRE(held.status == 200);
  CHECK(held.json().at("loaded").as_string() == "saxpy");
  CHECK(held.json().at("state").as_string() == "leased");

  // The guest's side: the same sub-device through the ICD loader, the registry's image, a real kernel run.
  std::string local_id = device.substr(device.find('/') + 1);
  auto cl = backends::OpenClBackend::create({{"subdevices", "2"}, {"cache_dir", ACCELPOOL_POCL_CACHE_DIR}});
  REQUIRE(cl.is_ok());
  auto registry = bitstreams::Registry::open(m.registry_dir());
  REQUIRE(registry.is_ok());
  auto image = registry->find_by_sha256(bitstreams::sha256_bytes(kSaxpy));
  REQUIRE(image.is_ok());
  REQUIRE((*cl)->program(local_id, backends::make_image(*image)).is_ok());
  const std::uint32_t n = 1000;
  std::vector<float> x(n), y(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  std::vector<backends::KernelArg> args{backends::KernelArg::scalar<float>(2.0f), backends::KernelArg::in<float>(x),
                                        backends::KernelArg::inout<float>(y),
                                        backends::KernelArg::scalar<std::uint32_t>(n)};
  REQUIRE((*cl)->run_kernel(local_id, "saxpy", args, {n}).is_ok());
  auto out = args[2].as<float>();
  for (std::uint32_t i = 0; i < n; i += 97) CHECK(out[i] == Approx(2.0f * static_cast<float>(i) + 1.0f));

  CHECK(lease_state(g.call("release", {{"lease", id}})) == "released");
#endif
}

TEST_CASE("a manager warns at start when its bitstream registry is empty, not when it is seeded",
          "[integration][bitstreams]") {
  Manager empty(base_config(sim_u250_host() + "[bitstreams]\nseed = \"\"\n"));
  // Logs are written by the log's own thread: the line comes soon after the start, not necessarily before it.
  CHECK(accelpool::testing::eventually([&] {
    const std::string out = empty.daemon.output();
    return out.find("warn accelpool-manager: bitstream registry empty") != std::string::npos &&
           out.find(empty.registry_dir().string()) != std::string::npos;
  }));
  Manager seeded(base_config(sim_u250_host()));
  // "serving" is logged after the registry is read: once it is out, a warning about the registry would be too.
  REQUIRE(
      accelpool::testing::eventually([&] { return seeded.daemon.output().find(" serving ") != std::string::npos; }));
  CHECK_THAT(seeded.daemon.output(), !Catch::Contains("bitstream registry empty"));
  CHECK(seeded.get("/v1/bitstreams").json().at("bitstreams").as_array().size() > 0);
}

TEST_CASE("a new version of a bitstream needs a new image file name", "[integration][bitstreams]") {
  Manager m(base_config(sim_u250_host()));
  const std::string compatible = "\"pthread-*\"", kernels = "\"saxpy\"";
  REQUIRE(m.upload(manifest_toml("saxpy", "1.0.0", "cpu", "saxpy.cl", kSaxpy, compatible, kernels), kSaxpy).status ==
          201);
  // Version 2.0.0 naming the image file of 1.0.0 is refused and changes nothing.
  auto before = m.get("/v1/bitstreams").body;
  auto same_file = m.upload(manifest_toml("saxpy", "2.0.0", "cpu", "saxpy.cl", kSaxpy, compatible, kernels), kSaxpy);
  CHECK(same_file.status == 409);
  CHECK(error_code(same_file) == "already_exists");
  CHECK_THAT(error_message(same_file), Catch::Contains("field 'file'") && Catch::Contains("saxpy.cl"));
  CHECK(m.get("/v1/bitstreams").body == before);
  // Under a file name of its own it is registered, and becomes the version acquires get.
  auto own_file =
      m.upload(manifest_toml("saxpy", "2.0.0", "cpu", "saxpy-2.0.0.cl", kSaxpy, compatible, kernels), kSaxpy);
  CHECK(own_file.status == 201);
  CHECK(m.get("/v1/bitstreams/saxpy").json().at("version").as_string() == "2.0.0");
  CHECK(m.get("/v1/bitstreams/saxpy/1.0.0").status == 200);
}

TEST_CASE("deleting a bitstream is refused while a queued or granted lease uses it", "[integration][bitstreams]") {
  Manager m(base_config(sim_u250_host()));
  auto g = m.guest("vm-del");
  auto first = lease_id(g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}}));
  auto second_reply = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  REQUIRE(lease_state(second_reply) == "queued");
  auto second = lease_id(second_reply);
  REQUIRE(g.wait_notification("lease.granted", first));

  auto refused = m.del("/v1/bitstreams/vadd_u250/1.0.0");
  CHECK(refused.status == 409);
  CHECK(error_code(refused) == "conflict");
  CHECK_THAT(error_message(refused), Catch::Contains(std::to_string(first) + " (granted)") &&
                                         Catch::Contains(std::to_string(second) + " (queued)"));
  CHECK(fs::exists(m.registry_dir() / "vadd_u250.xclbin"));
  auto listed = m.get("/v1/bitstreams/vadd_u250");
  REQUIRE(listed.status == 200);
  CHECK(listed.json().at("leases").as_array().size() == 2);
  CHECK(listed.json().at("loaded_on").as_array().size() == 1);
  CHECK(listed.json().at("xclbin").at("platform").as_string() == kU250);

  CHECK(lease_state(g.call("release", {{"lease", first}})) == "released");
  REQUIRE(g.wait_notification("lease.granted", second));
  CHECK(m.del("/v1/bitstreams/vadd_u250/1.0.0").status == 409);  // the second one still uses it
  CHECK(lease_state(g.call("release", {{"lease", second}})) == "released");

  auto deleted = m.del("/v1/bitstreams/vadd_u250/1.0.0");
  REQUIRE(deleted.status == 200);
  CHECK(deleted.json().at("deleted").as_string() == "vadd_u250@1.0.0");
  CHECK_FALSE(fs::exists(m.registry_dir() / "vadd_u250.xclbin"));
  CHECK_FALSE(fs::exists(m.registry_dir() / "vadd_u250-1.0.0.toml"));
  CHECK(m.get("/v1/bitstreams/vadd_u250").status == 404);
  CHECK(m.del("/v1/bitstreams/vadd_u250/1.0.0").status == 404);
  // Gone for acquires too: refused at once, not queued.
  auto after = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  CHECK(error_word(after) == "not_found");
  CHECK(m.get("/v1/queue").json().at("queue").as_array().empty());
}

TEST_CASE("corrupt and invalid uploads are refused and change nothing, a file corrupted on disk is never programmed",
          "[integration][bitstreams][errors]") {
  Manager m(base_config(sim_u250_host()));
  auto before_files = snapshot(m.registry_dir());
  auto before_list = m.get("/v1/bitstreams").body;

  std::string xclbin = read_file(m.registry_dir() / "vadd_u250.xclbin");
  REQUIRE(xclbin.size() > 4096);
  // The bytes do not hash to the manifest's sha256.
  std::string other = xclbin;
  other[other.size() / 2] ^= 0x5a;
  auto mismatch = m.upload(
      manifest_toml("vadd_x", "1.0.0", "fpga", "vadd_x.xclbin", xclbin, std::string("\"") + kU250 + "\"", "\"vadd\""),
      other);
  CHECK(mismatch.status == 422);
  CHECK(error_code(mismatch) == "checksum_mismatch");
  // A truncated xclbin whose checksum is right: XRT's container checks refuse it.
  std::string cut = xclbin.substr(0, xclbin.size() / 2);
  auto corrupt = m.upload(
      manifest_toml("vadd_cut", "1.0.0", "fpga", "vadd_cut.xclbin", cut, std::string("\"") + kU250 + "\"", "\"vadd\""),
      cut);
  CHECK(corrupt.status == 422);
  CHECK(error_code(corrupt) == "corrupt_image");
  CHECK_THAT(error_message(corrupt), Catch::Contains("vadd_cut.xclbin"));
  // An xclbin for a platform the manifest does not list.
  auto wrong_platform = m.upload(
      manifest_toml("vadd_w", "1.0.0", "fpga", "vadd_w.xclbin", xclbin, "\"xilinx_u280_*\"", "\"vadd\""), xclbin);
  CHECK(wrong_platform.status == 422);
  CHECK(error_code(wrong_platform) == "incompatible");
  // Bad manifests, bad base64, a name@version that exists.
  auto unknown_key = m.upload(
      manifest_toml("k", "1.0.0", "cpu", "k.cl", kSaxpy, "\"pthread-*\"", "\"saxpy\"", "colour = \"red\"\n"), kSaxpy);
  CHECK(unknown_key.status == 400);
  CHECK(error_code(unknown_key) == "invalid_manifest");
  CHECK_THAT(error_message(unknown_key), Catch::Contains("colour"));
  auto no_kernel = m.upload(manifest_toml("k", "1.0.0", "cpu", "k.cl", kSaxpy, "\"pthread-*\"", "\"daxpy\""), kSaxpy);
  CHECK(no_kernel.status == 400);
  CHECK_THAT(error_message(no_kernel), Catch::Contains("daxpy"));
  json::object bad_b64{{"manifest", manifest_toml("k", "1.0.0", "cpu", "k.cl", kSaxpy, "\"pthread-*\"", "\"saxpy\"")},
                       {"content_base64", "not base64!"}};
  auto b64 = http(m.port(), "POST", "/v1/bitstreams", m.admin, json::serialize(bad_b64));
  CHECK(b64.status == 400);
  CHECK_THAT(error_message(b64), Catch::Contains("content_base64"));
  auto dup = m.upload(read_file(m.registry_dir() / "vadd_u250-1.0.0.toml"), xclbin);
  CHECK(dup.status == 409);
  CHECK(error_code(dup) == "already_exists");
  auto missing = http(m.port(), "POST", "/v1/bitstreams", m.admin, R"({"manifest":"name = \"x\"\n"})");
  CHECK(missing.status == 400);
  auto tenant = http(m.port(), "POST", "/v1/bitstreams", m.guest_token, "{}");
  CHECK(tenant.status == 403);

  CHECK(snapshot(m.registry_dir()) == before_files);
  CHECK(m.get("/v1/bitstreams").body == before_list);

  // The registered image changes on disk while a lease for it waits: when the card comes free the image fails
  // verification, the card is not programmed and stays usable, and the lease ends saying why.
  auto g = m.guest("vm-corrupt");
  auto holder = lease_id(g.call("acquire", {{"kind", "fpga"}}));
  auto waiting_reply = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  REQUIRE(lease_state(waiting_reply) == "queued");
  auto waiting = lease_id(waiting_reply);
  { std::ofstream(m.registry_dir() / "vadd_u250.xclbin", std::ios::binary | std::ios::app) << "garbage"; }
  CHECK(lease_state(g.call("release", {{"lease", holder}})) == "released");
  auto ended = g.wait_notification("lease.ended", waiting);
  REQUIRE(ended);
  CHECK(ended->at("params").at("lease").at("state").as_string() == "revoked");
  CHECK_THAT(std::string(ended->at("params").at("lease").at("end_reason").as_string()),
             Catch::Contains("vadd_u250") && Catch::Contains("sha256"));
  auto settled = [&] {
    auto d = m.get("/v1/devices/local/sim:0").json();
    return d.at("state").as_string() == "free" && d.at("loaded").as_string() == "";
  };
  REQUIRE(accelpool::testing::eventually(settled));

  // Now the acquire is refused at once: nothing queues, and the card stays usable.
  auto refused = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  CHECK(error_word(refused) == "checksum_mismatch");
  CHECK_THAT(call_error(refused), Catch::Contains("vadd_u250.xclbin"));
  CHECK(m.get("/v1/queue").json().at("queue").as_array().empty());
  CHECK(m.get("/v1/leases").json().at("leases").as_array().empty());
  auto card = m.get("/v1/devices/local/sim:0");
  REQUIRE(card.status == 200);
  CHECK(card.json().at("state").as_string() == "free");
  CHECK(card.json().at("available").as_bool());
  CHECK(card.json().at("loaded").as_string() == "");
  auto plain = g.call("acquire", {{"kind", "fpga"}});
  CHECK(lease_state(plain) == "granted");
}

TEST_CASE("a bitstream for another device model, or an unknown one, is refused at once",
          "[integration][bitstreams][errors]") {
  Manager m(base_config(sim_u250_host()));
  auto g = m.guest("vm-model");
  auto wrong = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "matmul_u280"}});
  CHECK(error_word(wrong) == "incompatible");
  CHECK_THAT(call_error(wrong), Catch::Contains("matmul_u280") && Catch::Contains(kU250) && Catch::Contains("u280"));
  auto cpu_image = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd"}});
  CHECK(error_word(cpu_image) == "incompatible");
  auto unknown = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "no_such_image"}});
  CHECK(error_word(unknown) == "not_found");
  CHECK_THAT(call_error(unknown), Catch::Contains("no_such_image") && Catch::Contains("registry"));
  // Nothing was queued or recorded, and a fitting image is granted and programmed.
  CHECK(m.get("/v1/leases?all=true").json().at("leases").as_array().empty());
  auto right = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  REQUIRE(lease_state(right) == "granted");
  auto ready = g.wait_notification("lease.granted", lease_id(right));
  REQUIRE(ready);
  CHECK(ready->at("params").at("lease").at("reprogrammed").to_number<int>() == 1);
  CHECK(m.get("/v1/devices/local/sim:0").json().at("loaded").as_string() == "vadd_u250");
}

TEST_CASE("the admin API serves an image and its manifest by sha256 to the agent or admin token",
          "[integration][bitstreams][agents]") {
  Manager m(base_config(sim_u250_host()));
  auto sample = m.get("/v1/bitstreams/vadd_u250");
  REQUIRE(sample.status == 200);
  std::string sha(sample.json().at("sha256").as_string());
  const std::string image = "/v1/images/" + sha;

  // The bytes are read on the image catalog's worker and answered through the owner thread.
  auto bytes = http(m.port(), "GET", image, kAgentToken);
  REQUIRE(bytes.status == 200);
  CHECK(bytes.body == read_file(m.registry_dir() / "vadd_u250.xclbin"));
  CHECK(http(m.port(), "GET", image, m.admin).body == bytes.body);
  auto manifest = http(m.port(), "GET", image + "/manifest", kAgentToken);
  REQUIRE(manifest.status == 200);
  auto parsed = bitstreams::parse_manifest(manifest.body, "answer");
  REQUIRE(parsed.is_ok());
  CHECK(parsed->sha256 == sha);
  CHECK(http(m.port(), "GET", image, "wrong-token").status == 401);
  CHECK(http(m.port(), "GET", image, m.guest_token).status == 403);
  auto unknown = http(m.port(), "GET", "/v1/images/" + std::string(64, 'a'), kAgentToken);
  CHECK(unknown.status == 404);
  CHECK(error_code(unknown) == "not_found");
  // The agent token reads images and nothing else.
  CHECK(http(m.port(), "GET", "/v1/bitstreams", kAgentToken).status == 401);
}

TEST_CASE("accelpoolctl registers, lists and deletes bitstreams", "[integration][bitstreams][ctl]") {
  Manager m(base_config(sim_u250_host()));
  accelpool::testing::ScratchDir src("ctl-src");
  write_file(src.path() / "saxpy.cl", kSaxpy);
  write_file(src.path() / "saxpy.toml",
             manifest_toml("saxpy", "2.0.0", "cpu", "saxpy.cl", kSaxpy, "\"pthread-*\"", "\"saxpy\""));
  auto run = [&](const std::string& args, int& rc) {
    std::string cmd = std::string(ACCELPOOLCTL_BIN) + " --url http://127.0.0.1:" + std::to_string(m.port()) +
                      " --token " + m.admin + " " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    rc = WEXITSTATUS(::pclose(p));
    return out;
  };
  int rc = -1;
  auto reg = run("bitstreams register " + (src.path() / "saxpy.toml").string(), rc);
  CHECK(rc == 0);
  CHECK_THAT(reg, Catch::Contains("registered saxpy@2.0.0"));
  auto list = run("bitstreams", rc);
  CHECK(rc == 0);
  CHECK_THAT(list, Catch::Contains("saxpy") && Catch::Contains("2.0.0") && Catch::Contains("vadd_u250"));
  auto again = run("bitstreams register " + (src.path() / "saxpy.toml").string(), rc);
  CHECK(rc == 1);
  CHECK_THAT(again, Catch::Contains("already registered") && Catch::Contains("HTTP 409"));
  auto del = run("bitstreams delete saxpy 2.0.0", rc);
  CHECK(rc == 0);
  CHECK_THAT(del, Catch::Contains("deleted saxpy@2.0.0"));
  CHECK_FALSE(fs::exists(m.registry_dir() / "saxpy.cl"));
}

TEST_CASE("a host agent creates its missing cache folder, fetches the manager's images over its link and programs them",
          "[integration][bitstreams][agents]") {
#ifndef ACCELPOOL_AGENT_BIN
  ACCELPOOL_SKIP("accelpool-agent is not built in this configuration (device backends off)");
#else
  // The manager's own host serves another kind, so FPGAs come only from the agent.
  // Uploads up to 8 MiB (the image below is 1.5 MiB, base64 in JSON).
  Manager m(base_config("[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"asic\"\n") +
            "[limits]\nmax_body_bytes = 8388608\n");
  std::string sha(m.get("/v1/bitstreams/vadd_u250").json().at("sha256").as_string());
  // An image of several pieces of the link (agent::kImageChunk, 512 KiB): it streams in bounded pieces.
  std::string big(3 * 512 * 1024 + 1000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  REQUIRE(
      m.upload(manifest_toml("big_u250", "1.0.0", "fpga", "big_u250.bin", big, std::string("\"") + kU250 + "\"", ""),
               big)
          .status == 201);

  // The host's registry folder does not exist yet: the agent creates it and fetches what the manager names over
  // its agent connection.
  accelpool::testing::ScratchDir host_dir("agent-host");
  REQUIRE_FALSE(fs::exists(host_dir.path() / "bitstreams"));
  auto config = host_dir.path() / "agent.toml";
  write_file(config, "[agent]\nmanager = \"" + m.daemon.endpoints().agents + "\"\ntoken = \"" + kAgentToken +
                         "\"\nhost = \"hv1\"\nheartbeat_interval_ms = 100\nbitstreams = \"" +
                         (host_dir.path() / "bitstreams").string() + "\"\n[backends.sim]\ndevices = \"fpga:" + kU250 +
                         ":1\"\nprogram_base_ms = 5\nattach = \"network\"\n");
  pid_t agent = ::fork();
  if (agent == 0) {
    int fd = ::open((host_dir.path() / "agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 2);
    ::execl(ACCELPOOL_AGENT_BIN, ACCELPOOL_AGENT_BIN, "--config", config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{agent};
  REQUIRE(accelpool::testing::eventually([&] { return m.get("/v1/devices/hv1/sim:0").status == 200; }));

  auto g = m.guest("vm-agent");
  auto r = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "vadd_u250"}});
  REQUIRE(lease_state(r) == "granted");
  auto ready = g.wait_notification("lease.granted", lease_id(r));
  REQUIRE(ready);
  CHECK(ready->at("params").at("lease").at("devices").as_array()[0].as_string() == "hv1/sim:0");
  CHECK(m.get("/v1/devices/hv1/sim:0").json().at("loaded").as_string() == "vadd_u250");
  // The agent fetched the image by the sha256 the manager sent: its folder now holds exactly that one image.
  auto host_registry = bitstreams::Registry::open(host_dir.path() / "bitstreams");
  REQUIRE(host_registry.is_ok());
  REQUIRE(host_registry->list().size() == 1);
  CHECK(host_registry->list()[0].manifest.sha256 == sha);
  CHECK(lease_state(g.call("release", {{"lease", lease_id(r)}})) == "released");

  auto second = g.call("acquire", {{"kind", "fpga"}, {"bitstream", "big_u250"}});
  REQUIRE(lease_state(second) == "granted");
  REQUIRE(g.wait_notification("lease.granted", lease_id(second)));
  CHECK(m.get("/v1/devices/hv1/sim:0").json().at("loaded").as_string() == "big_u250");
  REQUIRE(host_registry->reload().is_ok());
  auto kept = host_registry->get("big_u250");
  REQUIRE(kept.is_ok());
  CHECK(read_file(kept->file_path) == big);
#endif
}
