// Internal: the one place the bitstreams library talks to XRT (xclbin_parser_xrt.cpp), with a stand-in
// (xclbin_parser_none.cpp) for builds without XRT.
#pragma once

#include <accelpool/bitstreams/xclbin.hpp>

namespace accelpool::bitstreams::detail {

// Fills uuid, platform and kernels from XRT's parser for the image in `bytes` (container already checked).
// Errors: "corrupt_image" (XRT rejected it), "unsupported" (built without XRT).
Status parse_with_xrt(const std::string& bytes, std::string_view origin, XclbinInfo& info);

bool have_xrt();

}  // namespace accelpool::bitstreams::detail
