// Helpers for the bitstream tests: scratch folders in the build tree and file utilities.
#pragma once

#include "../support/scratch_dir.hpp"

#include <accelpool/bitstreams/registry.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace accelpool::bitstreams::test {

using accelpool::testing::ScratchDir;

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (auto pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

// The registry of the folder `dir`, which must open.
inline Registry open_registry(const std::filesystem::path& dir) {
  auto r = Registry::open(dir);
  REQUIRE(r.is_ok());
  return std::move(*r);
}

inline const std::filesystem::path opencl_samples{ACCELPOOL_OPENCL_SAMPLES_DIR};
inline const std::filesystem::path build_samples{ACCELPOOL_BUILD_SAMPLES_DIR};

}  // namespace accelpool::bitstreams::test
