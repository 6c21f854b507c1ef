// Base64 (RFC 4648, standard alphabet, '=' padding): how image bytes travel inside JSON (admin API uploads,
// agents fetching images).
#pragma once

#include <accelpool/common/result.hpp>

#include <string>
#include <string_view>

namespace accelpool::bitstreams {

std::string base64_encode(std::string_view bytes);

// Decodes padded base64; white space is not allowed. Errors: "invalid_argument" naming the offset of the first
// bad character (or a bad length).
Result<std::string> base64_decode(std::string_view text);

}  // namespace accelpool::bitstreams
