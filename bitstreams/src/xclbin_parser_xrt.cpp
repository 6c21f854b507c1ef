// The bitstreams library's only use of XRT: `xrt::xclbin` reads the metadata of an image (no device needed).
#include "xclbin_parser.hpp"

#include <experimental/xrt_xclbin.h>
#include <xclbin.h>

#include <cstddef>
#include <exception>
#include <vector>

namespace accelpool::bitstreams::detail {

// The container checks in xclbin.cpp use these offsets.
static_assert(offsetof(axlf, m_header) == 304);
static_assert(offsetof(axlf_header, m_length) == 0);
static_assert(offsetof(axlf_header, m_mode) == 28 && sizeof(axlf_header::m_mode) == 2);
static_assert(XCLBIN_FLAT == 0 && XCLBIN_PR == 1 && XCLBIN_TANDEM_STAGE2 == 2 && XCLBIN_TANDEM_STAGE2_WITH_PR == 3 &&
              XCLBIN_HW_EMU == 4 && XCLBIN_SW_EMU == 5 && XCLBIN_HW_EMU_PR == 6);
static_assert(offsetof(axlf_header, m_platformVBNV) == 48);
static_assert(offsetof(axlf_header, uuid) == 112);
static_assert(offsetof(axlf_header, m_numSections) == 144);
static_assert(offsetof(axlf, m_sections) == 456);
static_assert(sizeof(axlf_section_header) == 40);
static_assert(offsetof(axlf_section_header, m_sectionOffset) == 24);
static_assert(offsetof(axlf_section_header, m_sectionSize) == 32);
// ... and these layouts of the sections XRT reads as a count and an array (kCountedSections).
static_assert(offsetof(mem_topology, m_mem_data) == 8 && sizeof(mem_data) == 40);
static_assert(offsetof(connectivity, m_connection) == 4 && sizeof(connection) == 12);
static_assert(offsetof(ip_layout, m_ip_data) == 8 && sizeof(ip_data) == 80);
static_assert(offsetof(debug_ip_layout, m_debug_ip_data) == 8 && sizeof(debug_ip_data) == 144);
static_assert(offsetof(clock_freq_topology, m_clock_freq) == 2 && sizeof(clock_freq) == 136);
static_assert(sizeof(mem_topology::m_count) == 4 && sizeof(connectivity::m_count) == 4 &&
              sizeof(ip_layout::m_count) == 4);
static_assert(sizeof(debug_ip_layout::m_count) == 2 && sizeof(clock_freq_topology::m_count) == 2);
static_assert(MEM_TOPOLOGY == 6 && CONNECTIVITY == 7 && IP_LAYOUT == 8 && DEBUG_IP_LAYOUT == 9 &&
              CLOCK_FREQ_TOPOLOGY == 11 && ASK_GROUP_TOPOLOGY == 26 && ASK_GROUP_CONNECTIVITY == 27);

bool have_xrt() { return true; }

Status parse_with_xrt(const std::string& bytes, std::string_view origin, XclbinInfo& info) {
  try {
    xrt::xclbin xclbin(std::vector<char>(bytes.begin(), bytes.end()));
    info.uuid = xclbin.get_uuid().to_string();
    info.platform = xclbin.get_xsa_name();
    info.kernels.clear();
    for (const auto& kernel : xclbin.get_kernels()) info.kernels.push_back(kernel.get_name());
    return Status::ok();
  } catch (const std::exception& e) {
    return make_error(Errc::corrupt_image, "xclbin " + std::string(origin) + ": XRT's parser rejects it: " + e.what());
  } catch (...) {
    return make_error(Errc::corrupt_image,
                      "xclbin " + std::string(origin) + ": XRT's parser rejects it (unknown error)");
  }
}

}  // namespace accelpool::bitstreams::detail
