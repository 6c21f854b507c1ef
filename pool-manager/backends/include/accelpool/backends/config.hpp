// Backend configuration: flat string key/value pairs (what an agent reads from its config file's
// [backends.<name>] table; a TOML array of integers arrives spelt "[2, 1, 1]", config_toml.hpp). Each backend
// documents its keys in docs/hosts.md; unknown keys are errors.
#pragma once

#include <accelpool/backends/device_backend.hpp>
#include <accelpool/common/result.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::backends {

using BackendConfig = std::map<std::string, std::string>;

// Reads typed values out of a BackendConfig and remembers which keys were read, so that finish() can refuse
// unknown (usually misspelt) keys. Errors: "invalid_argument", message "backend <name>: config key '<key>': ...".
class ConfigReader {
 public:
  ConfigReader(std::string backend, const BackendConfig& config) : backend_(std::move(backend)), config_(config) {}

  std::string get_string(const std::string& key, const std::string& fallback);
  Result<std::int64_t> get_int(const std::string& key, std::int64_t fallback, std::int64_t min, std::int64_t max);
  Result<double> get_double(const std::string& key, double fallback, double min);
  Result<bool> get_bool(const std::string& key, bool fallback);
  // Whether `key` is set to a list: its value starts with '[' (read it with get_int_list).
  bool is_list(const std::string& key) const;
  // The integers of a list value "[a, b, ...]" (spaces optional; "[]" is an empty list), in order; an empty list
  // when the key is not set. Error: the value is not such a list.
  Result<std::vector<std::int64_t>> get_int_list(const std::string& key);

  // An "invalid_argument" error for `key` (for checks the caller makes on a value).
  Error error(const std::string& key, const std::string& what) const;

  // Ok when every key in the config was read; else an error naming the unknown keys.
  Status finish() const;

 private:
  std::string backend_;
  const BackendConfig& config_;
  std::set<std::string> read_;
};

// Checks that `image` may be programmed on `device`, or on its slot `slot` when given: a partial image goes into a
// slot and a full one on the whole device, and its compatible list (when not empty) matches the device model.
// Errors: "incompatible" naming the image, the device (or slot) and why.
Status check_compatible(const Image& image, const DeviceInfo& device, std::optional<std::uint32_t> slot = std::nullopt);

// The image's format: Image::format, or inferred from the file extension (".xclbin", ".cl") when empty.
std::string image_format(const Image& image);

}  // namespace accelpool::backends
