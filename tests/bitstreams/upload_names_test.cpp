// Uploads over the admin API of the real accelpool-manager whose image file name would collide with a manifest:
// refused before anything is stored, and still absent after a restart.
#include "../manager/test_client.hpp"
#include "test_support.hpp"

#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/sha256.hpp>

#include <catch2/catch.hpp>

#include <signal.h>

#include <map>

using namespace accelpool;
using namespace accelpool::manager::itest;
namespace fs = std::filesystem;

namespace {

std::map<std::string, std::string> folder_hashes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = *bitstreams::sha256_file(e.path());
  return out;
}

}  // namespace

TEST_CASE(
    "an upload whose image would be named like a manifest is refused and never registered, even after a "
    "restart",
    "[integration][bitstreams][names]") {
  accelpool::testing::ScratchDir dir("upload-names");
  DaemonProcess daemon(
      dir.path(),
      "[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
      "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"fpga\"\ncount = 1\n");
  daemon.start();
  std::string admin = daemon.token("admin token");
  fs::path registry = dir.path() / "bitstreams";
  auto before = folder_hashes(registry);

  // The image's bytes are themselves a manifest, for a bitstream "ghost" whose image is the upload too.
  std::string bytes = "name = \"ghost\"\nversion = \"1.0\"\nkind = \"fpga\"\nfile = \"img.bin\"\nsha256 = \"" +
                      std::string(64, '0') + "\"\nprogramming_seconds = 0\ncompatible = [\"*\"]\n";
  for (const char* file : {"k-1.0.toml", "ghost-1.0.toml", "k.bin\\u0000.toml"}) {
    std::string manifest = "name = \"k\"\nversion = \"1.0\"\nkind = \"fpga\"\nfile = \"" + std::string(file) +
                           "\"\nsha256 = \"" + bitstreams::sha256_bytes(bytes) +
                           "\"\nprogramming_seconds = 0\ncompatible = [\"*\"]\n";
    json::object body{{"manifest", manifest}, {"content_base64", bitstreams::base64_encode(bytes)}};
    auto r = http(daemon.endpoints().admin_port, "POST", "/v1/bitstreams", admin, json::serialize(body));
    CHECK(r.status == 400);
    CHECK(r.json().at("error").at("code").as_string() == "invalid_manifest");
    CHECK_THAT(std::string(r.json().at("error").at("message").as_string()), Catch::Contains("'file'"));
  }
  CHECK(folder_hashes(registry) == before);

  daemon.stop(SIGTERM);
  daemon.start();
  for (const char* name : {"k", "ghost"})
    CHECK(http(daemon.endpoints().admin_port, "GET", std::string("/v1/bitstreams/") + name, admin).status == 404);
  CHECK(folder_hashes(registry) == before);
}
