// The in-process host over a DeviceBackend, with a small in-memory backend written for this test.
#include "test_support.hpp"

#include <admin_api.hpp>
#include <metrics.hpp>

#include <boost/json.hpp>

#include <accelpool/backends/device_backend.hpp>
#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

using namespace accelpool;
using namespace accelpool::manager;
using namespace accelpool::manager::test;

namespace {

struct MemoryBackend : backends::DeviceBackend {
  std::map<std::string, std::string> held;  // local id -> sha256
  int programs = 0;
  int resets = 0;
  std::string_view name() const override { return "memory"; }
  Result<std::vector<backends::DeviceInfo>> enumerate() override {
    std::vector<backends::DeviceInfo> out;
    for (const auto& [id, _] : held) out.push_back({id, "fpga", "mem", "", true, {}});
    return out;
  }
  Status program(std::string_view id, const backends::Image& image) override {
    auto it = held.find(std::string(id));
    if (it == held.end()) return make_error(Errc::not_found, "no device");
    if (image.name == "broken") return make_error(Errc::program_failed, "bad image");
    ++programs;
    it->second = image.sha256;
    return Status::ok();
  }
  Result<std::string> loaded(std::string_view id) override {
    auto it = held.find(std::string(id));
    if (it == held.end()) return make_error(Errc::not_found, "no device");
    return it->second;
  }
  Status reset(std::string_view id) override {
    ++resets;
    held[std::string(id)] = "";
    return Status::ok();
  }
  backends::HealthReport health(std::string_view) override { return {}; }
};

// A prepare of `device` with `bitstream` for a lease of guest "vm1".
host::PrepareRequest request(std::string device, std::string bitstream, bool reprogram) {
  host::PrepareRequest r;
  r.device = std::move(device);
  r.lease = "1";
  r.vm = "vm1";
  r.bitstream = std::move(bitstream);
  r.reprogram = reprogram;
  return r;
}

// Completions the host's worker thread posts, run by the test when it wants (it plays the owner thread).
struct WorkerPosts {
  std::mutex mu;
  std::condition_variable posted;
  PostQueue queue;

  Poster poster() {
    return [this](std::function<void()> f) {
      std::lock_guard lock(mu);
      queue.jobs.push_back(std::move(f));
      posted.notify_all();
    };
  }
  // Waits for `n` completions (a minute at most: only a hung host takes that long), then runs them all.
  void settle(std::size_t n) {
    std::unique_lock lock(mu);
    REQUIRE(posted.wait_for(lock, std::chrono::minutes(1), [&] { return queue.jobs.size() >= n; }));
    queue.drain();
  }
};

}  // namespace

TEST_CASE("the local host programs and then resets a device through its backend", "[host]") {
  auto backend = std::make_unique<MemoryBackend>();
  backend->held = {{"d0", ""}, {"d1", ""}};
  auto* raw = backend.get();
  WorkerPosts posts;
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  list.push_back(std::move(backend));
  auto made = make_local_host("h", std::move(list), nullptr, posts.poster());
  REQUIRE(made.is_ok());
  auto& host = *made;
  auto devs = host->devices();
  REQUIRE(devs.is_ok());
  CHECK(devs->size() == 2);

  // Two devices: their operations run in parallel, so their completions may come in either order.
  std::map<std::string, std::string> results;
  host->prepare(request("d0", "vadd", true), [&](Status s, host::PrepareResult result) {
    CHECK(s.is_ok());
    CHECK(result.attach == host::AttachMode::in_process);
    CHECK(result.details.kind == "fpga");  // what the backend enumerated
    CHECK(result.details.model == "mem");
    results["d0"] = result.loaded;
  });
  host->prepare(request("d1", "broken", true), [&](Status s, host::PrepareResult) {
    CHECK_FALSE(s.is_ok());
    results["d1"] = "error:" + std::string(to_string(s.error().code));
  });
  posts.settle(2);
  CHECK(results == std::map<std::string, std::string>{{"d0", "vadd"}, {"d1", "error:program_failed"}});
  CHECK(raw->programs == 1);

  host->release("d0", [&](Status s, std::string loaded) {
    CHECK(s.is_ok());
    results["d0"] = "after-reset:" + loaded;
  });
  posts.settle(1);
  CHECK(results["d0"] == "after-reset:");
  CHECK(raw->resets == 1);
}

namespace {

// A registry folder holding one opaque image "img" for model "mem".
std::shared_ptr<bitstreams::SharedRegistry> one_image_registry(const TempDir& dir, std::string& sha) {
  auto src = dir.path / "img.bin";
  std::ofstream(src, std::ios::binary) << "image bytes";
  sha = *bitstreams::sha256_file(src);
  auto reg = bitstreams::SharedRegistry::open(dir.path / "registry");
  REQUIRE(reg.is_ok());
  bitstreams::Manifest m;
  m.name = "img";
  m.version = "1.0";
  m.kind = "fpga";
  m.file = "img.bin";
  m.sha256 = sha;
  m.compatible = {"mem"};
  REQUIRE((*reg)->add(m, src).is_ok());
  return *reg;
}

}  // namespace

TEST_CASE("the local host programs registry images, and never a file that no longer verifies", "[host][bitstreams]") {
  TempDir dir;
  std::string sha;
  auto registry = one_image_registry(dir, sha);
  auto catalog = std::make_shared<ImageCatalog>(registry);
  auto backend = std::make_unique<MemoryBackend>();
  backend->held = {{"d0", ""}};
  auto* raw = backend.get();
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  list.push_back(std::move(backend));
  WorkerPosts posts;
  auto host = make_local_host("h", std::move(list), catalog, posts.poster());
  REQUIRE(host.is_ok());
  REQUIRE((*host)->devices().is_ok());
  CHECK(catalog->kind_uses_images("fpga"));
  CHECK(catalog->check("fpga", "img").is_ok());
  CHECK(catalog->check("fpga", "nope").error().code == Errc::not_found);
  CHECK(catalog->check("gpu", "nope").is_ok());  // no device of that kind takes registry images

  std::vector<std::string> results;
  auto record = [&](Status s, host::PrepareResult r) {
    results.push_back(s ? r.loaded : "error:" + std::string(to_string(s.error().code)));
  };
  (*host)->prepare(request("d0", "img", false), record);
  (*host)->prepare(request("d0", "nope", false), record);
  posts.settle(2);
  REQUIRE(results.size() == 2);
  CHECK(results[0] == "img");
  CHECK(results[1] == "error:not_found");
  CHECK(raw->held.at("d0") == sha);
  CHECK(raw->programs == 1);

  // The file changes on disk after registration: the check and the host refuse it; the device is untouched. The
  // check reads no file: it answers from the last verdict (good) and queues the image for the catalog's worker,
  // whose verdict the checks after it give.
  catalog->settle();
  std::ofstream(registry->dir() / "img.bin", std::ios::binary | std::ios::app) << "tampered";
  CHECK(catalog->check("fpga", "img").is_ok());
  catalog->settle();
  auto refused = catalog->check("fpga", "img");
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::checksum_mismatch);
  CHECK(refused.error().message.find("img.bin") != std::string::npos);
  (*host)->prepare(request("d0", "img", true), record);
  posts.settle(1);
  CHECK(results.back() == "error:checksum_mismatch");
  CHECK(raw->programs == 1);
  CHECK(raw->held.at("d0") == sha);
}

TEST_CASE("the catalog remembers a verified image until its file changes, even at the same size",
          "[host][bitstreams]") {
  TempDir dir;
  std::string sha;
  auto registry = one_image_registry(dir, sha);
  auto image = registry->dir() / "img.bin";
  // The file's modification time an hour back, so that the same-size write below changes it whatever the
  // file system's time granularity; its change time stays now.
  std::filesystem::last_write_time(image, std::filesystem::last_write_time(image) - std::chrono::hours(1));
  // A file written within the last second is hashed on every check; one older than that is remembered. The
  // catalog's clock is moved past that second instead of waiting for it.
  auto clock = std::make_shared<ManualClock>(SystemClock().now() + 2);
  auto catalog = std::make_shared<ImageCatalog>(registry, clock);
  catalog->add_devices({HostDevice{"d0", "fpga", "mem", true, ""}});
  REQUIRE(catalog->check("fpga", "img").is_ok());
  catalog->settle();
  REQUIRE(catalog->check("fpga", "img").is_ok());
  catalog->settle();
  CHECK(catalog->image_hashes() == 1);  // verified twice, hashed once
  auto size = std::filesystem::file_size(image);
  {
    std::fstream f(image, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(0);
    f << 'Z';  // same size, other bytes
  }
  REQUIRE(std::filesystem::file_size(image) == size);
  (void)catalog->check("fpga", "img");
  catalog->settle();
  CHECK(catalog->image_hashes() == 2);
  auto refused = catalog->check("fpga", "img");
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::checksum_mismatch);
}

TEST_CASE("the catalog's check reads no image: an image never verified is accepted until the worker refuses it",
          "[host][bitstreams]") {
  TempDir dir;
  std::string sha;
  auto registry = one_image_registry(dir, sha);
  std::ofstream(registry->dir() / "img.bin", std::ios::binary | std::ios::app) << "corrupt before any check";
  auto catalog = std::make_shared<ImageCatalog>(registry);
  catalog->add_devices({HostDevice{"d0", "fpga", "mem", true, ""}});
  CHECK(catalog->check("fpga", "img").is_ok());  // no verdict yet: hosts verify before programming
  catalog->settle();
  CHECK(catalog->image_hashes() == 1);
  auto refused = catalog->check("fpga", "img");
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::checksum_mismatch);
  // A failure an in-process host reports counts at once, for the image's sha256.
  std::ofstream(registry->dir() / "img.bin", std::ios::binary | std::ios::trunc) << "";
  auto fresh = std::make_shared<ImageCatalog>(registry);
  fresh->add_devices({HostDevice{"d0", "fpga", "mem", true, ""}});
  fresh->record_failure(sha, make_error(Errc::missing_file, "img.bin is gone"));
  CHECK(fresh->check("fpga", "img").error().code == Errc::missing_file);
}

TEST_CASE("the catalog tells a registry bitstream's identity and the device models it fits", "[host][bitstreams]") {
  TempDir dir;
  std::string sha;
  auto catalog = std::make_shared<ImageCatalog>(one_image_registry(dir, sha));
  REQUIRE(catalog->compatible_of("img"));
  CHECK(*catalog->compatible_of("img") == std::vector<std::string>{"mem"});
  CHECK_FALSE(catalog->compatible_of("nope"));
  CHECK(catalog->sha256_of("img") == sha);
  CHECK(catalog->sha256_of("nope").empty());
}

TEST_CASE("a local host refuses two backends reporting the same device id", "[host]") {
  std::vector<std::unique_ptr<backends::DeviceBackend>> list;
  for (int i = 0; i < 2; ++i) {
    auto b = std::make_unique<MemoryBackend>();
    b->held = {{"d0", ""}};
    list.push_back(std::move(b));
  }
  TempDir dir;
  auto reg = bitstreams::SharedRegistry::open(dir.path / "r");
  REQUIRE(reg.is_ok());
  auto host = make_local_host("h", std::move(list), std::make_shared<ImageCatalog>(*reg), [](std::function<void()>) {});
  REQUIRE_FALSE(host.is_ok());
  CHECK(host.error().code == Errc::invalid_argument);
  CHECK(host.error().message.find("'d0'") != std::string::npos);
}

namespace {

// The admin API over a pool and a one-image catalog, whose deferred answers come through `owner` (the test plays
// the owner thread).
struct DeferringApi {
  Pool pool;
  const std::string admin = "admin-token-0123456789";
  TempDir dir;
  std::string sha;
  std::shared_ptr<ImageCatalog> catalog;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<AdminApi> api;
  PostQueue owner;
  DeferringApi() {
    REQUIRE(pool.core->set_admin_token(admin).is_ok());
    catalog = std::make_shared<ImageCatalog>(one_image_registry(dir, sha));
    metrics = std::make_unique<Metrics>(*pool.core);
    api = std::make_unique<AdminApi>(*pool.core, *metrics, "", [] { return true; });
    api->set_catalog(catalog);
    api->set_poster(owner.poster());
  }
  // Sends `request` (with the admin token); the answer is filled in when it comes.
  std::shared_ptr<std::optional<ApiResponse>> handle(const std::string& method, const std::string& target,
                                                     const std::string& body = "") {
    auto answer = std::make_shared<std::optional<ApiResponse>>();
    api->handle(ApiRequest{method, target, "Bearer " + admin, body},
                [answer](ApiResponse r) { *answer = std::move(r); });
    return answer;
  }
};

}  // namespace

TEST_CASE("an admin upload is parsed, written and verified on the catalog's worker and answered on the owner thread",
          "[host][bitstreams][admin]") {
  DeferringApi d;
  Pool& pool = d.pool;
  const std::string& admin = d.admin;
  auto& catalog = d.catalog;
  auto& owner = d.owner;
  Metrics& metrics = *d.metrics;
  catalog->add_devices({HostDevice{"d0", "fpga", "mem", true, ""}});

  bitstreams::Manifest m;
  m.name = "uploaded";
  m.version = "1.0";
  m.kind = "fpga";
  m.file = "uploaded.bin";
  m.sha256 = bitstreams::sha256_bytes("uploaded image");
  m.compatible = {"mem"};
  auto upload = [&](const std::string& content_base64) {
    return d.handle("POST", "/v1/bitstreams",
                    boost::json::serialize(
                        boost::json::object{{"manifest", bitstreams::to_toml(m)}, {"content_base64", content_base64}}));
  };

  auto answer = upload(bitstreams::base64_encode("uploaded image"));
  CHECK_FALSE(*answer);  // nothing done on the calling thread
  catalog->settle();     // the worker registered it and posted the answer to the owner's queue
  CHECK(catalog->registry()->get("uploaded").is_ok());
  CHECK_FALSE(*answer);
  CHECK(catalog->image_hashes() == 1);  // and verified it once for the acquire checks to come
  owner.drain();
  REQUIRE(*answer);
  CHECK((*answer)->status == 201);
  CHECK((*answer)->body.find("\"uploaded\"") != std::string::npos);
  CHECK(catalog->check("fpga", "uploaded").is_ok());

  // A refused upload is answered the same way, and changes nothing.
  m.version = "2.0";
  auto refused = upload("not base64!");
  catalog->settle();
  owner.drain();
  REQUIRE(*refused);
  CHECK((*refused)->status == 400);
  CHECK((*refused)->body.find("content_base64") != std::string::npos);
  CHECK_FALSE(catalog->registry()->get("uploaded", "2.0").is_ok());
  // Without a poster everything happens on the calling thread (as under fuzzing).
  AdminApi direct(*pool.core, metrics, "", [] { return true; });
  direct.set_catalog(catalog);
  m.file = "uploaded-2.bin";
  m.sha256 = bitstreams::sha256_bytes("v2");
  const std::string body = boost::json::serialize(
      boost::json::object{{"manifest", bitstreams::to_toml(m)}, {"content_base64", bitstreams::base64_encode("v2")}});
  CHECK(direct.handle(ApiRequest{"POST", "/v1/bitstreams", "Bearer " + admin, body}).status == 201);
}

TEST_CASE("GET /v1/images/{sha256} reads the image on the catalog's worker and answers on the owner thread",
          "[host][bitstreams][admin]") {
  DeferringApi d;
  auto get = [&](const std::string& target) { return d.handle("GET", target); };
  const std::string& sha = d.sha;
  auto& catalog = d.catalog;
  auto& owner = d.owner;

  auto image = get("/v1/images/" + sha);
  CHECK_FALSE(*image);  // the calling (owner) thread read nothing
  catalog->settle();    // the worker read it and posted the answer
  CHECK_FALSE(*image);
  owner.drain();
  REQUIRE(*image);
  CHECK((*image)->status == 200);
  CHECK((*image)->content_type == "application/octet-stream");
  CHECK((*image)->body == "image bytes");
  // The manifest and the refusals need no file: answered at once.
  auto manifest = get("/v1/images/" + sha + "/manifest");
  REQUIRE(*manifest);
  CHECK((*manifest)->status == 200);
  auto unknown = get("/v1/images/" + std::string(64, '0'));
  REQUIRE(*unknown);
  CHECK((*unknown)->status == 404);
}
