// The two places a host's images come from: the manager's shared registry (in-process host) and a host's own
// registry folder that fetches what it lacks (accelpool-agent).
#include <accelpool/bitstreams/image_fetch.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/host/runtime.hpp>

#include <mutex>

namespace accelpool::host {

namespace {

// The entry of `bitstream` with image `sha256` ("" for its highest version) in `registry` (a Registry or a
// SharedRegistry), checked to be an image of that bitstream.
template <typename AnyRegistry>
Result<bitstreams::Bitstream> find_entry(const AnyRegistry& registry, const std::string& bitstream,
                                         const std::string& sha256) {
  auto b = sha256.empty() ? registry.get(bitstream) : registry.find_by_sha256(sha256);
  if (!b) return make_error(b.error().code, "bitstream '" + bitstream + "': " + b.error().message);
  if (b->manifest.name != bitstream) {
    return make_error("invalid_argument", "bitstream '" + bitstream + "': sha256 " + sha256 + " is image '" +
                                              b->manifest.name + "'");
  }
  return b;
}

template <typename AnyRegistry>
std::string sha256_in(const AnyRegistry& registry, const std::string& bitstream) {
  auto b = registry.get(bitstream);
  return b ? b->manifest.sha256 : std::string();
}

template <typename AnyRegistry>
std::string name_in(const AnyRegistry& registry, const std::string& sha256) {
  auto b = registry.find_by_sha256(sha256);
  return b ? b->manifest.name : std::string();
}

class RegistryImages final : public ImageSource {
 public:
  explicit RegistryImages(std::shared_ptr<bitstreams::SharedRegistry> registry) : registry_(std::move(registry)) {}
  Result<bitstreams::Bitstream> locate(const std::string& bitstream, const std::string& sha256) override {
    return find_entry(*registry_, bitstream, sha256);
  }
  std::string sha256_of(const std::string& bitstream) override { return sha256_in(*registry_, bitstream); }
  std::string name_of(const std::string& sha256) override { return name_in(*registry_, sha256); }

 private:
  std::shared_ptr<bitstreams::SharedRegistry> registry_;  // locks itself
};

class FolderImages final : public ImageSource {
 public:
  FolderImages(bitstreams::Registry registry, std::string url, std::string token)
      : registry_(std::move(registry)), url_(std::move(url)), token_(std::move(token)) {}

  Result<bitstreams::Bitstream> locate(const std::string& bitstream, const std::string& sha256) override {
    std::lock_guard lock(mu_);
    if (!sha256.empty() && !registry_.find_by_sha256(sha256)) {
      // Not here yet: the manager's copy is fetched, verified and kept in the folder.
      if (url_.empty()) {
        return make_error("missing_file", "bitstream '" + bitstream + "': no image with sha256 " + sha256 +
                                              " here, and agent.images_url is not set to fetch it");
      }
      auto f = bitstreams::fetch_image(registry_, url_, token_, sha256);
      if (!f) return make_error(f.error().code, "bitstream '" + bitstream + "': fetching it: " + f.error().message);
    }
    return find_entry(registry_, bitstream, sha256);
  }
  std::string sha256_of(const std::string& bitstream) override {
    std::lock_guard lock(mu_);
    return sha256_in(registry_, bitstream);
  }
  std::string name_of(const std::string& sha256) override {
    std::lock_guard lock(mu_);
    return name_in(registry_, sha256);
  }

 private:
  std::mutex mu_;  // the Registry is not synchronised; a fetch holds it (fetches of one host run one at a time)
  bitstreams::Registry registry_;
  std::string url_, token_;
};

}  // namespace

std::unique_ptr<ImageSource> registry_images(std::shared_ptr<bitstreams::SharedRegistry> registry) {
  return std::make_unique<RegistryImages>(std::move(registry));
}

Result<std::unique_ptr<ImageSource>> folder_images(const std::filesystem::path& dir, std::string images_url,
                                                   std::string token) {
  // A cache that fetches what it lacks may start empty: create it (a fresh host's state folder has none yet).
  if (std::error_code ec; !images_url.empty() && !std::filesystem::exists(dir, ec)) {
    if (std::filesystem::create_directories(dir, ec); ec)
      return make_error("io_error", "bitstream registry: cannot create " + dir.string() + ": " + ec.message());
  }
  auto registry = bitstreams::Registry::open(dir);
  if (!registry) return registry.error();
  return std::unique_ptr<ImageSource>(
      std::make_unique<FolderImages>(std::move(*registry), std::move(images_url), std::move(token)));
}

}  // namespace accelpool::host
