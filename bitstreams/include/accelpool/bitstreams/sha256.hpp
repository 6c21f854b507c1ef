// SHA-256 of files and byte strings (OpenSSL), as 64 lowercase hex digits.
#pragma once

#include <accelpool/common/result.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace accelpool::bitstreams {

// Errors: "io_error" naming the path when the file cannot be read.
Result<std::string> sha256_file(const std::filesystem::path& path);

std::string sha256_bytes(std::string_view bytes);

}  // namespace accelpool::bitstreams
