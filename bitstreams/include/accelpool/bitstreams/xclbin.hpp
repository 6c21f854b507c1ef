// Reading .xclbin images. The container structure (magic, length, section table) is checked here; the
// metadata (UUID, target platform, kernels) is read with XRT's own parser (`xrt::xclbin`) when the library
// was built with XRT (see xrt_parser_available()).
#pragma once

#include <accelpool/common/result.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::bitstreams {

struct XclbinInfo {
  std::string uuid;                  // lowercase, dashed, e.g. "3f1c...-..."
  std::string platform;              // target platform / shell VBNV, e.g. "xilinx_u250_gen3x16_xdma_4_1_202210_1"
  std::vector<std::string> kernels;  // kernel names (empty when parsed_by_xrt is false)
  // axlf_header::m_mode, XRT's XCLBIN_MODE: 0 flat (the shell is reprogrammed whole), 1 partial reconfiguration
  // (the image goes into the shell's reconfigurable user region), 2 tandem stage 2, 3 tandem stage 2 with partial
  // reconfiguration, 4 hardware emulation, 5 software emulation, 6 hardware emulation with partial reconfiguration.
  std::uint16_t mode = 0;
  std::uint32_t num_sections = 0;
  std::uint64_t size_bytes = 0;
  bool parsed_by_xrt = false;  // false: only the container header was read (library built without XRT)
};

// True when this build reads xclbin metadata with XRT.
bool xrt_parser_available();

// Checks the container of an in-memory image: size, magic "xclbin2", total length, section table bounds.
// `origin` names the image in messages. Errors: "corrupt_image".
Result<XclbinInfo> check_xclbin_container(std::string_view bytes, std::string_view origin);

// Reads an .xclbin file: container check, then XRT's parser (when available), which must agree with the
// header on UUID and platform. Errors: "io_error", "corrupt_image".
Result<XclbinInfo> read_xclbin(const std::filesystem::path& path);

}  // namespace accelpool::bitstreams
