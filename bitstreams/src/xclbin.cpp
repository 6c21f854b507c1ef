// Container checks for .xclbin images. The offsets are those of `struct axlf` in XRT's <xclbin.h>
// (checked against the header with static_asserts in the XRT-backed parser and the writer tool); they are
// repeated here so that damaged images are refused before any parser walks them, with or without XRT.
#include <accelpool/bitstreams/xclbin.hpp>

#include "read_file.hpp"
#include "xclbin_parser.hpp"

#include <cstring>
#include <map>
#include <sstream>
#include <vector>

namespace accelpool::bitstreams {
namespace {

constexpr std::size_t kMagicSize = 8;
constexpr std::size_t kHeaderOffset = 304;                       // offsetof(axlf, m_header)
constexpr std::size_t kLengthOffset = kHeaderOffset + 0;         // axlf_header::m_length
constexpr std::size_t kModeOffset = kHeaderOffset + 28;          // axlf_header::m_mode
constexpr std::size_t kVbnvOffset = kHeaderOffset + 48;          // axlf_header::m_platformVBNV[64]
constexpr std::size_t kUuidOffset = kHeaderOffset + 112;         // axlf_header::uuid[16]
constexpr std::size_t kNumSectionsOffset = kHeaderOffset + 144;  // axlf_header::m_numSections
constexpr std::size_t kSectionsOffset = 456;                     // offsetof(axlf, m_sections)
constexpr std::size_t kSectionHeaderSize = 40;                   // sizeof(axlf_section_header)
constexpr std::size_t kMinSize = 496;                            // sizeof(axlf): header plus one section header

// Sections that XRT's parser reads as a count followed by an array of fixed-size entries. XRT trusts the count:
// a count larger than its section makes it allocate and read that many entries (an image found by fuzzing asked
// for 40 GB), so the container check refuses such a section first. Offsets and sizes are those of <xclbin.h>
// (static_asserts in xclbin_parser_xrt.cpp).
struct CountedSection {
  std::uint32_t kind;
  std::string_view name;
  std::size_t count_size;    // bytes of m_count: 4 (int32_t) or 2 (int16_t / uint16_t)
  std::size_t array_offset;  // offset of the first entry
  std::size_t entry_size;    // sizeof one entry
};
constexpr CountedSection kCountedSections[] = {
    {6, "MEM_TOPOLOGY", 4, 8, 40},
    {26, "ASK_GROUP_TOPOLOGY", 4, 8, 40},
    {7, "CONNECTIVITY", 4, 4, 12},
    {27, "ASK_GROUP_CONNECTIVITY", 4, 4, 12},
    {8, "IP_LAYOUT", 4, 8, 80},
    {9, "DEBUG_IP_LAYOUT", 2, 8, 144},
    {11, "CLOCK_FREQ_TOPOLOGY", 2, 2, 136},
};

// XRT sizes a kernel's argument list by the largest argument index among the CONNECTIVITY entries and indexes the
// IP_LAYOUT and MEM_TOPOLOGY arrays by theirs without a check (a fuzzed entry asked for 6 GB). No kernel has more
// arguments than this; the other two indices must name an entry of their section.
constexpr std::int32_t kMaxKernelArgs = 4096;
constexpr std::uint32_t kConnectivity = 7, kAskGroupConnectivity = 27, kMemTopology = 6, kAskGroupTopology = 26,
                        kIpLayout = 8;

template <typename T>
T read_le(std::string_view bytes, std::size_t offset) {
  T v{};
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

Error corrupt(std::string_view origin, std::string_view what) {
  return make_error(Errc::corrupt_image, "xclbin " + std::string(origin) + ": " + std::string(what));
}

std::string format_uuid(const unsigned char* u) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += digits[u[i] >> 4];
    out += digits[u[i] & 0xf];
  }
  return out;
}

}  // namespace

bool xrt_parser_available() { return detail::have_xrt(); }

Result<XclbinInfo> check_xclbin_container(std::string_view bytes, std::string_view origin) {
  if (bytes.size() < kMinSize)
    return corrupt(origin, "too small (" + std::to_string(bytes.size()) + " bytes; a header alone is " +
                               std::to_string(kMinSize) + ")");
  if (std::memcmp(bytes.data(), "xclbin2\0", kMagicSize) != 0)
    return corrupt(origin, "bad magic (expected \"xclbin2\")");
  auto length = read_le<std::uint64_t>(bytes, kLengthOffset);
  if (length != bytes.size())
    return corrupt(origin, "header says " + std::to_string(length) + " bytes but the file has " +
                               std::to_string(bytes.size()) + " (truncated or padded)");
  auto sections = read_le<std::uint32_t>(bytes, kNumSectionsOffset);
  if (sections == 0) return corrupt(origin, "no sections");
  if (sections > 0x10000 || kSectionsOffset + std::uint64_t{sections} * kSectionHeaderSize > bytes.size())
    return corrupt(origin, "section table of " + std::to_string(sections) + " entries does not fit in the file");
  std::map<std::uint32_t, std::int64_t> counts;  // entries of the first section of each counted kind
  struct Connections {
    std::uint32_t section, kind;
    std::uint64_t offset;
    std::int64_t count;
  };
  std::vector<Connections> connectivity;
  for (std::uint32_t i = 0; i < sections; ++i) {
    std::size_t at = kSectionsOffset + std::size_t{i} * kSectionHeaderSize;
    auto offset = read_le<std::uint64_t>(bytes, at + 24);
    auto size = read_le<std::uint64_t>(bytes, at + 32);
    auto kind = read_le<std::uint32_t>(bytes, at);
    if (offset > bytes.size() || size > bytes.size() - offset)
      return corrupt(origin,
                     "section " + std::to_string(i) + " (kind " + std::to_string(kind) + ") lies outside the file");
    for (const auto& counted : kCountedSections) {
      if (counted.kind != kind) continue;
      if (size < counted.count_size) {
        return corrupt(origin, "section " + std::to_string(i) + " (" + std::string(counted.name) + ") of " +
                                   std::to_string(size) + " bytes is too small for its entry count");
      }
      std::int64_t count = counted.count_size == 4 ? read_le<std::int32_t>(bytes, offset)
                           : kind == 9             ? std::int64_t{read_le<std::uint16_t>(bytes, offset)}
                                                   : std::int64_t{read_le<std::int16_t>(bytes, offset)};
      if (count < 0 || (count > 0 && counted.array_offset + std::uint64_t(count) * counted.entry_size > size)) {
        return corrupt(origin, "section " + std::to_string(i) + " (" + std::string(counted.name) + ") lists " +
                                   std::to_string(count) + " entries, more than its " + std::to_string(size) +
                                   " bytes hold");
      }
      counts.emplace(kind, count);
      if (kind == kConnectivity || kind == kAskGroupConnectivity) connectivity.push_back({i, kind, offset, count});
    }
  }
  for (const auto& c : connectivity) {
    const std::int64_t mems = counts[c.kind == kConnectivity ? kMemTopology : kAskGroupTopology];
    const std::int64_t ips = counts[kIpLayout];
    for (std::int64_t e = 0; e < c.count; ++e) {
      const std::size_t entry = c.offset + 4 + static_cast<std::size_t>(e) * 12;
      const auto arg = read_le<std::int32_t>(bytes, entry);
      const auto ip = read_le<std::int32_t>(bytes, entry + 4);
      const auto mem = read_le<std::int32_t>(bytes, entry + 8);
      if (arg < 0 || arg >= kMaxKernelArgs || ip < 0 || ip >= ips || mem < 0 || mem >= mems) {
        return corrupt(origin, "section " + std::to_string(c.section) + " (" +
                                   (c.kind == kConnectivity ? "CONNECTIVITY" : "ASK_GROUP_CONNECTIVITY") + ") entry " +
                                   std::to_string(e) + " connects argument " + std::to_string(arg) + " of IP " +
                                   std::to_string(ip) + " to memory " + std::to_string(mem) + ": arguments go up to " +
                                   std::to_string(kMaxKernelArgs - 1) + ", and the image has " + std::to_string(ips) +
                                   " IPs and " + std::to_string(mems) + " memories");
      }
    }
  }
  const char* vbnv = bytes.data() + kVbnvOffset;
  std::size_t vbnv_len = strnlen(vbnv, 64);
  if (vbnv_len == 64) return corrupt(origin, "platform VBNV is not NUL-terminated");
  XclbinInfo info;
  info.platform.assign(vbnv, vbnv_len);
  info.uuid = format_uuid(reinterpret_cast<const unsigned char*>(bytes.data() + kUuidOffset));
  info.mode = read_le<std::uint16_t>(bytes, kModeOffset);
  info.num_sections = sections;
  info.size_bytes = bytes.size();
  return info;
}

Result<XclbinInfo> read_xclbin(const std::filesystem::path& path) {
  auto bytes = detail::read_file(path, "xclbin " + path.string());
  if (!bytes) return bytes.error();
  auto info = check_xclbin_container(*bytes, path.string());
  if (!info) return info;
  if (detail::have_xrt()) {
    XclbinInfo parsed = *info;
    if (auto st = detail::parse_with_xrt(*bytes, path.string(), parsed); !st) return st.error();
    if (parsed.uuid != info->uuid)
      return corrupt(path.string(), "XRT reads UUID " + parsed.uuid + " but the header holds " + info->uuid);
    if (parsed.platform != info->platform)
      return corrupt(path.string(),
                     "XRT reads platform '" + parsed.platform + "' but the header holds '" + info->platform + "'");
    parsed.parsed_by_xrt = true;
    return parsed;
  }
  return info;
}

}  // namespace accelpool::bitstreams
