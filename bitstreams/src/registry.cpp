#include <accelpool/bitstreams/registry.hpp>

#include <accelpool/bitstreams/sha256.hpp>

#include "read_file.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

namespace accelpool::bitstreams {
namespace fs = std::filesystem;
namespace {

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// True when OpenCL C `source` defines `name` as a kernel: "kernel" or "__kernel", then "void", then the name
// and "(", separated by white space. Comments are not parsed (a commented-out definition also counts).
bool defines_kernel(std::string_view source, std::string_view name) {
  auto skip_space = [&](std::size_t i) {
    while (i < source.size() && std::isspace(static_cast<unsigned char>(source[i]))) ++i;
    return i;
  };
  auto word_at = [&](std::size_t i, std::string_view word) {
    return source.substr(i, word.size()) == word &&
           (i + word.size() >= source.size() || !is_ident(source[i + word.size()]));
  };
  for (std::size_t at = source.find("kernel"); at != std::string_view::npos; at = source.find("kernel", at + 1)) {
    std::size_t start = at >= 2 && source.substr(at - 2, 2) == "__" ? at - 2 : at;
    if (start > 0 && is_ident(source[start - 1])) continue;
    if (!word_at(at, "kernel")) continue;
    std::size_t i = skip_space(at + 6);
    if (i == at + 6 || !word_at(i, "void")) continue;
    std::size_t j = skip_space(i + 4);
    if (j == i + 4 || !word_at(j, name)) continue;
    std::size_t k = skip_space(j + name.size());
    if (k < source.size() && source[k] == '(') return true;
  }
  return false;
}

// Checks what the image's format allows checking; `where` names manifest and file in messages.
Status check_image(const Manifest& m, const fs::path& image, const std::string& where, Bitstream& out) {
  switch (m.format) {
    case ImageFormat::xclbin: {
      auto info = read_xclbin(image);
      if (!info) return make_error(info.error().code, where + ": " + info.error().message);
      if (!model_matches(m.compatible, info->platform))
        return make_error(Errc::incompatible, where + ": field 'compatible': the xclbin targets platform '" +
                                                  info->platform + "', which the manifest does not list");
      if (info->parsed_by_xrt) {
        for (const auto& k : m.kernels) {
          if (std::find(info->kernels.begin(), info->kernels.end(), k) == info->kernels.end())
            return make_error(Errc::invalid_manifest,
                              where + ": field 'kernels': the xclbin has no kernel '" + k + "'");
        }
      }
      out.xclbin = *info;
      return Status::ok();
    }
    case ImageFormat::opencl_source: {
      auto text = detail::read_file(image, image.string());
      if (!text) return make_error(text.error().code, where + ": " + text.error().message);
      for (const auto& k : m.kernels) {
        if (!defines_kernel(*text, k))
          return make_error(Errc::invalid_manifest,
                            where + ": field 'kernels': the source defines no kernel '" + k + "'");
      }
      return Status::ok();
    }
    case ImageFormat::opencl_binary:
    case ImageFormat::opaque:
      return Status::ok();
  }
  return Status::ok();
}

// Verifies `m` against the image at `image` (which may be a temporary copy); fills `out`.
Result<Bitstream> verify_image(const Manifest& m, const fs::path& manifest_path, const fs::path& image) {
  std::string where = "manifest " + manifest_path.string() + " (file " + m.file + ")";
  std::error_code ec;
  if (!fs::is_regular_file(image, ec))
    return make_error(Errc::missing_file,
                      where + ": field 'file': " + image.string() + " does not exist or is not a file");
  Bitstream b;
  b.manifest = m;
  b.manifest_path = manifest_path;
  b.file_path = image;
  b.size_bytes = fs::file_size(image, ec);
  if (ec) return make_error(Errc::io_error, where + ": cannot stat " + image.string() + ": " + ec.message());
  auto sha = sha256_file(image);
  if (!sha) return make_error(sha.error().code, where + ": " + sha.error().message);
  if (*sha != m.sha256)
    return make_error(Errc::checksum_mismatch,
                      where + ": field 'sha256': the manifest says " + m.sha256 + " but the file hashes to " + *sha);
  if (auto st = check_image(m, image, where, b); !st) return st.error();
  return b;
}

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::ostringstream os;
  os << std::hex << rng();
  return os.str();
}

Status write_file_synced(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(Errc::io_error, path.string() + ": cannot be created");
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.flush();
  if (!out) return make_error(Errc::io_error, path.string() + ": write failed");
  return Status::ok();
}

}  // namespace

int compare_versions(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && is_digit(a[ie])) ++ie;
      while (je < b.size() && is_digit(b[je])) ++je;
      std::string_view na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size() ? -1 : 1;
      if (int c = na.compare(nb); c != 0) return c < 0 ? -1 : 1;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j] ? -1 : 1;
      ++i;
      ++j;
    }
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  return 0;
}

Result<Bitstream> verify_bitstream(const Manifest& manifest, const fs::path& manifest_path) {
  fs::path abs = fs::absolute(manifest_path);
  return verify_image(manifest, abs, abs.parent_path() / manifest.file);
}

Result<Registry> Registry::open(const fs::path& dir) {
  Registry r(fs::absolute(dir));
  if (auto st = r.reload(); !st) return st.error();
  return r;
}

Status Registry::reload() {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec))
    return make_error(Errc::not_found, "bitstream registry: " + dir_.string() + " is not a folder");
  std::vector<fs::path> manifests;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().extension() == ".toml" && entry.is_regular_file()) manifests.push_back(entry.path());
  }
  if (ec) return make_error(Errc::io_error, "bitstream registry: cannot list " + dir_.string() + ": " + ec.message());
  std::sort(manifests.begin(), manifests.end());
  std::map<std::string, Bitstream> by_id;
  std::vector<Rejected> rejected;
  for (const auto& path : manifests) {
    auto m = load_manifest(path);
    if (!m) {
      rejected.push_back({path, m.error()});
      continue;
    }
    auto b = verify_bitstream(*m, path);
    if (!b) {
      rejected.push_back({path, b.error()});
      continue;
    }
    auto [it, inserted] = by_id.emplace(b->id(), *b);
    if (!inserted) {
      rejected.push_back(
          {path, make_error(Errc::already_exists, "manifest " + path.string() + ": " + b->id() +
                                                      " is already defined by " + it->second.manifest_path.string())});
    }
  }
  by_id_ = std::move(by_id);
  rejected_ = std::move(rejected);
  return Status::ok();
}

std::vector<Bitstream> Registry::list() const {
  std::vector<Bitstream> out;
  for (const auto& [id, b] : by_id_) out.push_back(b);
  std::sort(out.begin(), out.end(), [](const Bitstream& a, const Bitstream& b) {
    if (a.manifest.name != b.manifest.name) return a.manifest.name < b.manifest.name;
    return compare_versions(a.manifest.version, b.manifest.version) < 0;
  });
  return out;
}

Result<Bitstream> Registry::get(std::string_view name, std::string_view version) const {
  const Bitstream* best = nullptr;
  for (const auto& [id, b] : by_id_) {
    if (b.manifest.name != name) continue;
    if (!version.empty()) {
      if (b.manifest.version == version) return b;
      continue;
    }
    if (!best || compare_versions(b.manifest.version, best->manifest.version) > 0) best = &b;
  }
  if (best) return *best;
  std::string what = std::string(name) + (version.empty() ? "" : "@" + std::string(version));
  return make_error(Errc::not_found, "bitstream registry " + dir_.string() + ": no bitstream " + what);
}

Result<Bitstream> Registry::find_by_sha256(std::string_view sha256) const {
  for (const auto& [id, b] : by_id_) {
    if (b.manifest.sha256 == sha256) return b;
  }
  return make_error(Errc::not_found,
                    "bitstream registry " + dir_.string() + ": no image with sha256 " + std::string(sha256));
}

Status Registry::compatible(const Bitstream& bitstream, std::string_view device_model) {
  if (model_matches(bitstream.manifest.compatible, device_model)) return Status::ok();
  std::string list;
  for (const auto& c : bitstream.manifest.compatible) list += (list.empty() ? "" : ", ") + c;
  return make_error(Errc::incompatible, "bitstream " + bitstream.id() + " is not for device model '" +
                                            std::string(device_model) + "' (it fits: " + list + ")");
}

Result<Bitstream> Registry::verify(std::string_view name, std::string_view version) const {
  auto b = get(name, version);
  if (!b) return b;
  return verify_bitstream(b->manifest, b->manifest_path);
}

Registry::Staged::~Staged() {
  std::error_code ignore;
  if (!image_.empty()) fs::remove(image_, ignore);
  if (!manifest_file_.empty()) fs::remove(manifest_file_, ignore);
}

Registry::Staged::Staged(Staged&& other) noexcept
    : verified_(std::move(other.verified_)),
      image_(std::exchange(other.image_, {})),
      manifest_file_(std::exchange(other.manifest_file_, {})) {}

Status Registry::can_add(const Manifest& manifest) const {
  fs::path manifest_path = dir_ / (manifest.name + "-" + manifest.version + ".toml");
  if (auto st = validate_manifest(manifest, manifest_path.string()); !st) return st.error();
  if (by_id_.count(manifest.id()))
    return make_error(Errc::already_exists, "bitstream registry: " + manifest.id() + " is already registered");
  std::error_code ec;
  if (fs::exists(manifest_path, ec))
    return make_error(Errc::already_exists, "bitstream registry: " + manifest_path.string() + " already exists");
  fs::path target = dir_ / manifest.file;
  if (fs::exists(target, ec))
    return make_error(Errc::already_exists, "bitstream registry: field 'file': " + target.string() + " already exists");
  return Status::ok();
}

Result<Registry::Staged> Registry::stage(const fs::path& dir, const Manifest& manifest, const fs::path& source_file) {
  fs::path manifest_path = dir / (manifest.name + "-" + manifest.version + ".toml");
  if (auto st = validate_manifest(manifest, manifest_path.string()); !st) return st.error();
  std::error_code ec;
  if (!fs::is_regular_file(source_file, ec))
    return make_error(Errc::missing_file, "register " + manifest.id() + ": source " + source_file.string() +
                                              " does not exist or is not a file");
  std::string suffix = random_suffix();
  Staged staged;
  staged.image_ = dir / (".tmp-" + manifest.file + "-" + suffix);
  if (!fs::copy_file(source_file, staged.image_, fs::copy_options::none, ec)) {
    return make_error(Errc::io_error, "register " + manifest.id() + ": copying " + source_file.string() + " into " +
                                          dir.string() + " failed: " + ec.message());
  }
  auto verified = verify_image(manifest, manifest_path, staged.image_);
  if (!verified) return verified.error();
  staged.verified_ = std::move(*verified);
  staged.manifest_file_ = dir / (".tmp-" + manifest.name + "-" + suffix + ".toml.part");
  if (auto st = write_file_synced(staged.manifest_file_, to_toml(manifest)); !st) return st.error();
  return staged;
}

Result<Bitstream> Registry::commit(Staged staged) {
  const Manifest& manifest = staged.verified_.manifest;
  if (auto st = can_add(manifest); !st) return st.error();
  fs::path manifest_path = dir_ / (manifest.name + "-" + manifest.version + ".toml");
  fs::path target = dir_ / manifest.file;
  std::error_code ec;
  fs::rename(staged.image_, target, ec);
  if (ec) {
    return make_error(Errc::io_error,
                      "register " + manifest.id() + ": rename into " + target.string() + " failed: " + ec.message());
  }
  staged.image_.clear();
  fs::rename(staged.manifest_file_, manifest_path, ec);
  if (ec) {
    std::error_code ignore;
    fs::remove(target, ignore);
    return make_error(Errc::io_error, "register " + manifest.id() + ": rename into " + manifest_path.string() +
                                          " failed: " + ec.message());
  }
  staged.manifest_file_.clear();
  Bitstream b = std::move(staged.verified_);
  b.file_path = target;
  b.manifest_path = manifest_path;
  by_id_.emplace(b.id(), b);
  return b;
}

Result<Bitstream> Registry::add(const Manifest& manifest, const fs::path& source_file) {
  if (auto st = can_add(manifest); !st) return st.error();
  auto staged = stage(dir_, manifest, source_file);
  if (!staged) return staged.error();
  return commit(std::move(*staged));
}

Status Registry::remove(std::string_view name, std::string_view version) {
  auto it = by_id_.find(std::string(name) + "@" + std::string(version));
  if (it == by_id_.end())
    return make_error(Errc::not_found, "bitstream registry " + dir_.string() + ": no bitstream " + std::string(name) +
                                           "@" + std::string(version));
  std::error_code ec;
  fs::remove(it->second.manifest_path, ec);
  if (ec)
    return make_error(Errc::io_error,
                      "remove " + it->first + ": " + it->second.manifest_path.string() + ": " + ec.message());
  // The image may be shared with another manifest (same file name): keep it then.
  bool shared = false;
  for (const auto& [id, b] : by_id_) {
    if (id != it->first && b.file_path == it->second.file_path) shared = true;
  }
  if (!shared) fs::remove(it->second.file_path, ec);
  by_id_.erase(it);
  if (ec) return make_error(Errc::io_error, "remove: manifest removed but its image could not be: " + ec.message());
  return Status::ok();
}

}  // namespace accelpool::bitstreams
