#include <accelpool/bitstreams/shared_registry.hpp>

#include <fstream>
#include <system_error>

namespace accelpool::bitstreams {
namespace fs = std::filesystem;

Result<std::shared_ptr<SharedRegistry>> SharedRegistry::open(const fs::path& dir, const fs::path& seed) {
  std::error_code ec;
  bool created = false;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec)
      return make_error(Errc::io_error, "bitstream registry: cannot create " + dir.string() + ": " + ec.message());
    created = true;
  }
  auto reg = Registry::open(dir);
  if (!reg) return reg.error();
  if (created && !seed.empty() && fs::is_directory(seed, ec)) {
    auto samples = Registry::open(seed);
    if (!samples) return samples.error();
    for (const auto& b : samples->list()) {
      if (auto added = reg->add(b.manifest, b.file_path); !added)
        return make_error(added.error().code, "bitstream registry: seeding " + dir.string() + " from " + seed.string() +
                                                  ": " + added.error().message);
    }
  }
  return std::shared_ptr<SharedRegistry>(new SharedRegistry(std::move(*reg)));
}

fs::path SharedRegistry::dir() const {
  std::lock_guard lock(mu_);
  return registry_.dir();
}

std::vector<Bitstream> SharedRegistry::list() const {
  std::lock_guard lock(mu_);
  return registry_.list();
}

std::vector<Rejected> SharedRegistry::rejected() const {
  std::lock_guard lock(mu_);
  return registry_.rejected();
}

Result<Bitstream> SharedRegistry::get(std::string_view name, std::string_view version) const {
  std::lock_guard lock(mu_);
  return registry_.get(name, version);
}

Result<Bitstream> SharedRegistry::find_by_sha256(std::string_view sha256) const {
  std::lock_guard lock(mu_);
  return registry_.find_by_sha256(sha256);
}

Result<Bitstream> SharedRegistry::verify(std::string_view name, std::string_view version) const {
  std::lock_guard lock(mu_);
  auto b = registry_.get(name, version);
  if (!b) return b;
  return registry_.verify(b->manifest.name, b->manifest.version);
}

Result<Bitstream> SharedRegistry::add(const Manifest& manifest, const fs::path& source_file,
                                      const std::function<void()>& staged_hook) {
  fs::path dir;
  {
    std::lock_guard lock(mu_);
    if (auto st = registry_.can_add(manifest); !st) return st.error();
    dir = registry_.dir();
  }
  // Copied and hashed without the lock: lookups (an acquire's, a host's) do not wait for it.
  auto staged = Registry::stage(dir, manifest, source_file);
  if (!staged) return staged.error();
  if (staged_hook) staged_hook();
  std::lock_guard lock(mu_);
  return registry_.commit(std::move(*staged));  // checks again: another add may have come first
}

Status SharedRegistry::remove(std::string_view name, std::string_view version) {
  std::lock_guard lock(mu_);
  return registry_.remove(name, version);
}

Result<std::string> SharedRegistry::read_image(std::string_view sha256, std::uint64_t offset, std::size_t max_bytes,
                                               std::uint64_t& total) const {
  auto b = find_by_sha256(sha256);  // the file is read without the lock
  if (!b) return b.error();
  std::ifstream in(b->file_path, std::ios::binary);
  if (!in) return make_error(Errc::io_error, "bitstream " + b->id() + ": " + b->file_path.string() + " cannot be read");
  std::error_code ec;
  total = fs::file_size(b->file_path, ec);
  if (ec)
    return make_error(Errc::io_error,
                      "bitstream " + b->id() + ": cannot stat " + b->file_path.string() + ": " + ec.message());
  if (offset >= total) return std::string();
  std::string out(static_cast<std::size_t>(std::min<std::uint64_t>(max_bytes, total - offset)), '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  if (!in) return make_error(Errc::io_error, "bitstream " + b->id() + ": reading " + b->file_path.string() + " failed");
  return out;
}

}  // namespace accelpool::bitstreams
