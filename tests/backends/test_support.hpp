// Helpers for the backend tests: the build's sample registry and scratch folders.
#pragma once

#include "../support/scratch_dir.hpp"

#include <accelpool/backends/factory.hpp>
#include <accelpool/bitstreams/registry.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace accelpool::backends::test {

inline const std::filesystem::path build_samples{ACCELPOOL_BUILD_SAMPLES_DIR};

// The sample registry the build generated (OpenCL sources and generated xclbins).
inline bitstreams::Registry sample_registry() {
  auto r = bitstreams::Registry::open(build_samples);
  REQUIRE(r.is_ok());
  for (const auto& x : r->rejected()) FAIL_CHECK(x.error.message);
  return std::move(*r);
}

inline Image sample_image(const std::string& name) {
  auto b = sample_registry().get(name);
  REQUIRE(b.is_ok());
  return make_image(*b);
}

using accelpool::testing::ScratchDir;

}  // namespace accelpool::backends::test
