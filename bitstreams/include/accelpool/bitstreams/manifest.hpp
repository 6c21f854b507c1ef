// Bitstream manifests: one TOML file per bitstream image, describing what the image is, which devices it fits
// and how to verify it. The format is documented in docs/bitstreams.md.
#pragma once

#include <accelpool/common/result.hpp>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::bitstreams {

// How a backend loads an image. Inferred from the file extension unless the manifest sets `format`.
enum class ImageFormat {
  xclbin,         // Xilinx .xclbin container, loaded by the XRT backend
  opencl_source,  // OpenCL C source (.cl), built for the device when programmed
  opencl_binary,  // a device-specific OpenCL program binary (clCreateProgramWithBinary)
  opaque,         // anything else (e.g. images only the simulated backend "programs")
};

std::string_view to_string(ImageFormat format);

struct Manifest {
  std::string name;                     // [a-z0-9._-], starts with a letter or digit
  std::string version;                  // [A-Za-z0-9._+-]
  std::string kind;                     // scheduling class of the devices it targets: "fpga", "gpu", "cpu", ...
  std::vector<std::string> compatible;  // device models / shells (VBNV); '*' and '?' wildcards allowed
  std::string file;    // image file name in the manifest's folder: [A-Za-z0-9._+-], no leading '.', not *.toml
  std::string sha256;  // 64 lowercase hex digits of the image file
  double programming_seconds = 0;    // expected time to program a device with it (a partial image: one slot)
  std::vector<std::string> kernels;  // kernel names the image provides
  ImageFormat format = ImageFormat::opaque;
  std::string description;  // optional, free text
  // Partial reconfiguration (docs/bitstreams.md, "Partial images"): a partial image is programmed into one slot
  // of a device whose shell has slots of shape `slot_shape`; `bandwidth_demand` is the share of the device's
  // memory bandwidth it uses alone (0 to 1; 0: not stated), which decides the slots it is admitted to.
  bool partial = false;
  std::string slot_shape;  // required for a partial image, empty for a full one
  double bandwidth_demand = 0;

  std::string id() const { return name + "@" + version; }
};

// Parses and validates a manifest. `origin` names the source in error messages (usually the file path).
// Errors: code "invalid_manifest", message "manifest <origin>: field '<field>': <what is wrong>".
// Unknown top-level keys are errors (they are usually typos).
Result<Manifest> parse_manifest(std::string_view toml_text, std::string_view origin);

// Reads and parses a manifest file. Errors: "io_error" (unreadable), "invalid_manifest".
Result<Manifest> load_manifest(const std::filesystem::path& path);

// Validates a manifest built in code (the same checks parse_manifest makes). Errors: "invalid_manifest".
// Every path that stores a bitstream (registry load, Registry::add, the admin upload, an agent's image cache)
// goes through it, so name, version and file name follow one rule wherever they are stored.
Status validate_manifest(const Manifest& manifest, std::string_view origin);

// Serialises a manifest to TOML that parse_manifest reads back unchanged.
std::string to_toml(const Manifest& manifest);

// True when `model` matches one of `patterns` (shell-style: '*' any run of characters, '?' one character).
bool model_matches(const std::vector<std::string>& patterns, std::string_view model);

}  // namespace accelpool::bitstreams
