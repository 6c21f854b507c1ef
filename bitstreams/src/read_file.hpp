// Internal: the one whole-file reader of the bitstreams library (manifests, xclbins, OpenCL sources).
#pragma once

#include <accelpool/common/result.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace accelpool::bitstreams::detail {

// The bytes of the file at `path`. Errors: "io_error", "<label>: cannot be read" (missing, a folder, no
// permission) or "<label>: read failed".
inline Result<std::string> read_file(const std::filesystem::path& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(Errc::io_error, label + ": cannot be read");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) return make_error(Errc::io_error, label + ": read failed");
  return os.str();
}

}  // namespace accelpool::bitstreams::detail
