// Built when XRT is absent: xclbin metadata beyond the container header cannot be read.
#include "xclbin_parser.hpp"

namespace accelpool::bitstreams::detail {

bool have_xrt() { return false; }

Status parse_with_xrt(const std::string&, std::string_view origin, XclbinInfo&) {
  return make_error(Errc::unsupported, "xclbin " + std::string(origin) + ": this build has no XRT to parse it");
}

}  // namespace accelpool::bitstreams::detail
