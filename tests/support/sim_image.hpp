// The manifest of an opaque image for the simulated backend's device models: what tests register when they need
// an image of given bytes (any size) that the simulated devices program.
#pragma once

#include <accelpool/bitstreams/manifest.hpp>
#include <accelpool/bitstreams/sha256.hpp>

#include <string>

namespace accelpool::testing {

// Bitstream `name`, version "1", kind "fpga", for models "sim-*", image file `file` holding `bytes`.
inline bitstreams::Manifest sim_image_manifest(const std::string& name, const std::string& file,
                                               const std::string& bytes) {
  bitstreams::Manifest m;
  m.name = name;
  m.version = "1";
  m.kind = "fpga";
  m.compatible = {"sim-*"};
  m.file = file;
  m.sha256 = bitstreams::sha256_bytes(bytes);
  return m;
}

}  // namespace accelpool::testing
