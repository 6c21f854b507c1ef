// Numbers as people (and JSON) write them.
#pragma once

#include <charconv>
#include <cmath>
#include <string>

namespace accelpool::common {

// The shortest text that reads back as `v`: 0, 1, 0.5, 31536000, 1e-09 (never Boost.JSON's 0E0 or 3.1536E7).
// Valid JSON for every finite `v`; "inf", "-inf" or "nan" otherwise.
inline std::string number_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace accelpool::common
