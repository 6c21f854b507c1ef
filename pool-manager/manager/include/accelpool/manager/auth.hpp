// Tokens: generated from the OS's random source, stored as SHA-256 hashes.
#pragma once

#include <string>
#include <string_view>

namespace accelpool::manager {

// Lowercase hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);
// A fresh token: `prefix` followed by 32 random bytes in hex. Aborts if the OS has no randomness.
std::string generate_token(std::string_view prefix);
// Compares two strings in time independent of where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace accelpool::manager
