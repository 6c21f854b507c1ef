#include <accelpool/backends/config.hpp>
#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/manifest.hpp>

#include <charconv>
#include <cmath>

namespace accelpool::backends {

Error ConfigReader::error(const std::string& key, const std::string& what) const {
  return make_error(Errc::invalid_argument, "backend " + backend_ + ": config key '" + key + "': " + what);
}

std::string ConfigReader::get_string(const std::string& key, const std::string& fallback) {
  read_.insert(key);
  auto it = config_.find(key);
  return it == config_.end() ? fallback : it->second;
}

Result<std::int64_t> ConfigReader::get_int(const std::string& key, std::int64_t fallback, std::int64_t min,
                                           std::int64_t max) {
  read_.insert(key);
  auto it = config_.find(key);
  if (it == config_.end()) return fallback;
  const std::string& s = it->second;
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return error(key, "'" + s + "' is not an integer");
  if (v < min || v > max)
    return error(key, std::to_string(v) + " is outside " + std::to_string(min) + ".." + std::to_string(max));
  return v;
}

Result<double> ConfigReader::get_double(const std::string& key, double fallback, double min) {
  read_.insert(key);
  auto it = config_.find(key);
  if (it == config_.end()) return fallback;
  const std::string& s = it->second;
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || !std::isfinite(v))
    return error(key, "'" + s + "' is not a number");
  if (v < min) return error(key, s + " is below the minimum " + std::to_string(min));
  return v;
}

Result<bool> ConfigReader::get_bool(const std::string& key, bool fallback) {
  read_.insert(key);
  auto it = config_.find(key);
  if (it == config_.end()) return fallback;
  if (it->second == "true" || it->second == "1" || it->second == "yes") return true;
  if (it->second == "false" || it->second == "0" || it->second == "no") return false;
  return error(key, "'" + it->second + "' is not true/false");
}

bool ConfigReader::is_list(const std::string& key) const {
  auto it = config_.find(key);
  return it != config_.end() && !it->second.empty() && it->second.front() == '[';
}

Result<std::vector<std::int64_t>> ConfigReader::get_int_list(const std::string& key) {
  read_.insert(key);
  std::vector<std::int64_t> out;
  auto it = config_.find(key);
  if (it == config_.end()) return out;
  const std::string& s = it->second;
  auto refuse = [&] { return error(key, "'" + s + "' is not a list of integers such as [2, 1, 1]"); };
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return refuse();
  const char* p = s.data() + 1;
  const char* const end = s.data() + s.size() - 1;
  auto skip_spaces = [&] {
    while (p != end && *p == ' ') ++p;
  };
  skip_spaces();
  while (p != end) {
    std::int64_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc()) return refuse();
    out.push_back(v);
    p = next;
    skip_spaces();
    if (p == end) break;
    if (*p != ',') return refuse();
    ++p;
    skip_spaces();
    if (p == end) return refuse();  // a trailing comma
  }
  return out;
}

Status ConfigReader::finish() const {
  std::string unknown;
  for (const auto& [key, value] : config_) {
    if (!read_.count(key)) unknown += (unknown.empty() ? "'" : ", '") + key + "'";
  }
  if (!unknown.empty())
    return make_error(Errc::invalid_argument, "backend " + backend_ + ": unknown config key(s) " + unknown);
  return Status::ok();
}

Status check_compatible(const Image& image, const DeviceInfo& device, std::optional<std::uint32_t> slot) {
  if (image.partial != slot.has_value()) {
    const std::string target =
        slot ? "slot " + std::to_string(*slot) + " of device " + device.local_id : "device " + device.local_id;
    return make_error(Errc::incompatible, "image " + image.name + "@" + image.version + " is a " +
                                              (image.partial ? "partial image (it goes into a slot)"
                                                             : "full image (it takes a whole device)") +
                                              ", not for " + target);
  }
  if (image.compatible.empty() || bitstreams::model_matches(image.compatible, device.model)) return Status::ok();
  std::string list;
  for (const auto& c : image.compatible) list += (list.empty() ? "" : ", ") + c;
  return make_error(Errc::incompatible, "image " + image.name + "@" + image.version + " is not for device " +
                                            device.local_id + " (model '" + device.model +
                                            "'; the image fits: " + list + ")");
}

std::string image_format(const Image& image) {
  if (!image.format.empty()) return image.format;
  auto ext = image.file.extension().string();
  if (ext == ".xclbin") return "xclbin";
  if (ext == ".cl") return "opencl-source";
  return "opaque";
}

Image make_image(const bitstreams::Bitstream& b) {
  Image image;
  image.name = b.manifest.name;
  image.version = b.manifest.version;
  image.sha256 = b.manifest.sha256;
  image.file = b.file_path;
  image.size_bytes = b.size_bytes;
  image.format = std::string(bitstreams::to_string(b.manifest.format));
  image.compatible = b.manifest.compatible;
  image.kernels = b.manifest.kernels;
  image.partial = b.manifest.partial;
  image.slot_shape = b.manifest.slot_shape;
  return image;
}

}  // namespace accelpool::backends
