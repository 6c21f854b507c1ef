// The two places a host's images come from: the manager's shared registry (in-process host) and a host's own
// registry folder that fetches what it lacks (accelpool-agent).
#include <accelpool/bitstreams/image_fetch.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/host/runtime.hpp>

#include <filesystem>

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
    return make_error(Errc::invalid_argument,
                      "bitstream '" + bitstream + "': sha256 " + sha256 + " is image '" + b->manifest.name + "'");
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
  FolderImages(std::shared_ptr<bitstreams::SharedRegistry> registry, std::shared_ptr<bitstreams::ImageFetcher> fetcher)
      : registry_(std::move(registry)), fetcher_(std::move(fetcher)) {}

  Result<bitstreams::Bitstream> locate(const std::string& bitstream, const std::string& sha256) override {
    if (!sha256.empty() && !registry_->find_by_sha256(sha256)) {
      // Not here yet: the manager's copy is fetched, verified and kept in the folder.
      if (!fetcher_) {
        return make_error(Errc::missing_file, "bitstream '" + bitstream + "': no image with sha256 " + sha256 +
                                                  " here, and nothing to fetch it from");
      }
      std::lock_guard lock(fetching_);  // one fetch at a time; a second asker of the same image finds it fetched
      auto f = bitstreams::fetch_image(*registry_, sha256, *fetcher_);
      if (!f) return make_error(f.error().code, "bitstream '" + bitstream + "': fetching it: " + f.error().message);
    }
    return find_entry(*registry_, bitstream, sha256);
  }
  std::string sha256_of(const std::string& bitstream) override { return sha256_in(*registry_, bitstream); }
  std::string name_of(const std::string& sha256) override { return name_in(*registry_, sha256); }

 private:
  std::shared_ptr<bitstreams::SharedRegistry> registry_;  // locks itself, not while a fetch streams or hashes
  std::mutex fetching_;
  std::shared_ptr<bitstreams::ImageFetcher> fetcher_;
};

}  // namespace

std::unique_ptr<ImageSource> registry_images(std::shared_ptr<bitstreams::SharedRegistry> registry) {
  return std::make_unique<RegistryImages>(std::move(registry));
}

Result<std::unique_ptr<ImageSource>> folder_images(const std::filesystem::path& dir,
                                                   std::shared_ptr<bitstreams::ImageFetcher> fetcher) {
  // A cache that fetches what it lacks may start empty: SharedRegistry::open creates it (a fresh host's state
  // folder has none yet). One that cannot fetch must exist.
  if (std::error_code ec; !fetcher && !std::filesystem::is_directory(dir, ec))
    return make_error(Errc::not_found, "bitstream registry: " + dir.string() + " is not a folder");
  auto registry = bitstreams::SharedRegistry::open(dir);
  if (!registry) return registry.error();
  return std::unique_ptr<ImageSource>(std::make_unique<FolderImages>(std::move(*registry), std::move(fetcher)));
}

}  // namespace accelpool::host
