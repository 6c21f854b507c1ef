// The xclbin reader (bitstreams/src/xclbin.cpp): the container check on the input and, when it passes and this
// build has XRT, XRT's parser on the same bytes, as read_xclbin does for a file.
#include <accelpool/bitstreams/xclbin.hpp>

#include "../bitstreams/src/xclbin_parser.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool::bitstreams;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto info = check_xclbin_container(bytes, "fuzz.xclbin");
  if (!info || !detail::have_xrt()) return 0;
  XclbinInfo parsed = *info;
  (void)detail::parse_with_xrt(bytes, "fuzz.xclbin", parsed);
  return 0;
}
