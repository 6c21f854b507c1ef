// accelpool-mkxclbin: writes an .xclbin image and its registry manifest from a small TOML spec, using the
// `axlf` structures of XRT's <xclbin.h>. The build uses it to generate the sample images (no binaries are
// kept in the source tree). The output is deterministic: the UUID is derived from the spec's content, the
// timestamp is 0, and the BITSTREAM payload is a pseudo-random filler seeded from the spec.
//
// Usage: accelpool-mkxclbin SPEC.toml OUTDIR      -> OUTDIR/<name>.xclbin and OUTDIR/<name>.toml
// Spec keys: name, version, kind ("fpga"), platform (VBNV), compatible (default [platform]),
// programming_seconds, bitstream_bytes (filler size, default 4096), description, mode ("flat", the default: for a
// shell that is reprogrammed whole, XCLBIN_FLAT; "pr": for a shell's partially reconfigured user region,
// XCLBIN_PR), and [[kernels]] tables
// with name, args (["a:int*", "n:uint"]; pointer types go through the memory bank), instances (default 1).
#include <accelpool/bitstreams/manifest.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/common/cli.hpp>

#include <toml++/toml.h>
#include <xclbin.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace bs = accelpool::bitstreams;

struct KernelSpec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> args;  // name, C type
  int instances = 1;
};

struct Spec {
  bs::Manifest manifest;
  std::string platform;
  std::uint64_t bitstream_bytes = 4096;
  std::uint16_t mode = XCLBIN_FLAT;
  std::vector<KernelSpec> kernels;
};

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "accelpool-mkxclbin: " << message << "\n";
  std::exit(1);
}

std::string str(const toml::table& t, const char* key, const std::string& where, const char* fallback = nullptr) {
  if (auto v = t[key].value<std::string>()) return *v;
  if (fallback) return fallback;
  fail(where + ": missing string field '" + key + "'");
}

Spec read_spec(const std::filesystem::path& path) {
  toml::table t;
  try {
    t = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << path.string() << ": " << e.description() << " at line " << e.source().begin.line;
    fail(os.str());
  }
  std::string where = path.string();
  static const std::set<std::string> known = {
      "name",    "version", "kind", "description", "platform", "compatible", "programming_seconds", "bitstream_bytes",
      "kernels", "mode"};
  for (const auto& [key, node] : t) {
    if (!known.count(std::string(key.str()))) fail(where + ": unknown field '" + std::string(key.str()) + "'");
  }
  Spec s;
  s.manifest.name = str(t, "name", where);
  s.manifest.version = str(t, "version", where);
  s.manifest.kind = str(t, "kind", where, "fpga");
  s.manifest.description = str(t, "description", where, "");
  s.platform = str(t, "platform", where);
  const std::string mode = str(t, "mode", where, "flat");
  if (mode != "flat" && mode != "pr") fail(where + ": field 'mode': '" + mode + "' is not flat or pr");
  s.mode = mode == "pr" ? XCLBIN_PR : XCLBIN_FLAT;
  if (s.platform.size() >= 64) fail(where + ": field 'platform' must be shorter than 64 characters");
  s.manifest.programming_seconds = t["programming_seconds"].value<double>().value_or(1.0);
  s.bitstream_bytes = t["bitstream_bytes"].value<std::uint64_t>().value_or(4096);
  if (auto* c = t["compatible"].as_array()) {
    for (auto& e : *c) s.manifest.compatible.push_back(e.value<std::string>().value_or(""));
  } else {
    s.manifest.compatible = {s.platform};
  }
  auto* ks = t["kernels"].as_array();
  if (!ks || ks->empty()) fail(where + ": needs at least one [[kernels]] table");
  for (auto& node : *ks) {
    auto* kt = node.as_table();
    if (!kt) fail(where + ": [[kernels]] entries must be tables");
    for (const auto& [key, value] : *kt) {
      if (key.str() != "name" && key.str() != "args" && key.str() != "instances")
        fail(where + ": [[kernels]]: unknown field '" + std::string(key.str()) + "'");
    }
    KernelSpec k;
    k.name = str(*kt, "name", where + " [[kernels]]");
    k.instances = kt->get("instances") ? static_cast<int>((*kt)["instances"].value<std::int64_t>().value_or(1)) : 1;
    if (k.instances < 1 || k.instances > 16) fail(where + ": kernel '" + k.name + "': instances must be 1..16");
    if (auto* args = (*kt)["args"].as_array()) {
      for (auto& a : *args) {
        std::string spec = a.value<std::string>().value_or("");
        auto colon = spec.find(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
          fail(where + ": kernel '" + k.name + "': argument '" + spec + "' must be 'name:type'");
        k.args.emplace_back(spec.substr(0, colon), spec.substr(colon + 1));
      }
    }
    s.manifest.kernels.push_back(k.name);
    s.kernels.push_back(std::move(k));
  }
  return s;
}

bool is_pointer(const std::string& type) { return !type.empty() && type.back() == '*'; }

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

constexpr std::uint64_t kCuBase = 0x1800000;
constexpr std::uint64_t kCuStride = 0x10000;

// Kernel metadata in the XML dialect XRT's parser reads (project/platform/device/core/kernel).
std::string kernel_xml(const Spec& s) {
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<project name=\"" << s.manifest.name << "\">\n"
    << "  <platform vendor=\"xilinx\" boardid=\"accelpool\" name=\"" << s.platform << "\" featureRomTime=\"0\">\n"
    << "    <version major=\"1\" minor=\"0\"/>\n"
    << "    <description/>\n"
    << "    <board name=\"\" vendor=\"\" fpga=\"\"/>\n"
    << "    <device name=\"fpga0\" fpgaDevice=\"\" addrWidth=\"0\">\n"
    << "      <core name=\"OCL_REGION_0\" target=\"hw\" type=\"clc_region\" clockFreq=\"300MHz\" "
       "numComputeUnits=\"1\">\n";
  std::uint64_t cu = 0;
  for (const auto& k : s.kernels) {
    x << "        <kernel name=\"" << k.name << "\" language=\"c\" vlnv=\"accelpool:hls:" << k.name
      << ":1.0\" preferredWorkGroupSizeMultiple=\"0\" workGroupSize=\"1\" interrupt=\"true\" "
         "hwControlProtocol=\"ap_ctrl_hs\">\n"
      << "          <port name=\"M_AXI_GMEM\" mode=\"master\" range=\"0xFFFFFFFF\" dataWidth=\"32\" "
         "portType=\"addressable\" base=\"0x0\"/>\n"
      << "          <port name=\"S_AXI_CONTROL\" mode=\"slave\" range=\"0x1000\" dataWidth=\"32\" "
         "portType=\"addressable\" base=\"0x0\"/>\n";
    std::uint64_t offset = 0x10;
    for (std::size_t i = 0; i < k.args.size(); ++i) {
      const auto& [name, type] = k.args[i];
      bool ptr = is_pointer(type);
      std::uint64_t size = ptr ? 8 : 4;
      x << "          <arg name=\"" << name << "\" addressQualifier=\"" << (ptr ? 1 : 0) << "\" id=\"" << i
        << "\" port=\"" << (ptr ? "M_AXI_GMEM" : "S_AXI_CONTROL") << "\" size=\"" << hex(size) << "\" offset=\""
        << hex(offset) << "\" hostOffset=\"0x0\" hostSize=\"" << hex(size) << "\" type=\"" << type << "\"/>\n";
      offset += ptr ? 0xc : 0x8;
    }
    for (int i = 0; i < k.instances; ++i) {
      x << "          <instance name=\"" << k.name << "_" << (i + 1) << "\">\n"
        << "            <addrRemap base=\"" << hex(kCuBase + cu * kCuStride) << "\" port=\"S_AXI_CONTROL\"/>\n"
        << "          </instance>\n";
      ++cu;
    }
    x << "        </kernel>\n";
  }
  x << "      </core>\n    </device>\n  </platform>\n</project>\n";
  return x.str();
}

template <typename T>
void append(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::string mem_topology_section() {
  std::string out;
  std::int32_t count = 1;
  append(out, count);
  out.append(4, '\0');  // align m_mem_data to 8 as in struct mem_topology
  mem_data bank{};
  bank.m_type = MEM_DDR4;
  bank.m_used = 1;
  bank.m_size = 16ull * 1024 * 1024;  // KB: 16 GiB
  bank.m_base_address = 0x4000000000ull;
  std::strncpy(reinterpret_cast<char*>(bank.m_tag), "bank0", sizeof bank.m_tag - 1);
  append(out, bank);
  return out;
}

std::string ip_layout_section(const Spec& s) {
  std::string out;
  std::int32_t count = 0;
  for (const auto& k : s.kernels) count += k.instances;
  append(out, count);
  out.append(4, '\0');  // m_ip_data is 8-aligned
  std::uint64_t cu = 0;
  for (const auto& k : s.kernels) {
    for (int i = 0; i < k.instances; ++i) {
      ip_data ip{};
      ip.m_type = IP_KERNEL;
      ip.properties = 0;  // ap_ctrl_hs, no interrupt
      ip.m_base_address = kCuBase + cu * kCuStride;
      std::string name = k.name + ":" + k.name + "_" + std::to_string(i + 1);
      std::strncpy(reinterpret_cast<char*>(ip.m_name), name.c_str(), sizeof ip.m_name - 1);
      append(out, ip);
      ++cu;
    }
  }
  return out;
}

std::string connectivity_section(const Spec& s) {
  std::vector<connection> conns;
  std::int32_t ip_index = 0;
  for (const auto& k : s.kernels) {
    for (int i = 0; i < k.instances; ++i, ++ip_index) {
      for (std::size_t a = 0; a < k.args.size(); ++a) {
        if (is_pointer(k.args[a].second)) conns.push_back({static_cast<std::int32_t>(a), ip_index, 0});
      }
    }
  }
  std::string out;
  append(out, static_cast<std::int32_t>(conns.size()));
  for (const auto& c : conns) append(out, c);
  return out;
}

std::string filler(std::uint64_t bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(bytes, '\0');
  for (auto& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

struct Section {
  axlf_section_kind kind;
  const char* name;
  std::string data;
};

std::string build_image(const Spec& s, const std::string& spec_digest) {
  std::vector<Section> sections;
  sections.push_back({EMBEDDED_METADATA, "metadata", kernel_xml(s)});
  sections.push_back({MEM_TOPOLOGY, "mem_topology", mem_topology_section()});
  sections.push_back({IP_LAYOUT, "ip_layout", ip_layout_section(s)});
  sections.push_back({CONNECTIVITY, "connectivity", connectivity_section(s)});
  if (s.bitstream_bytes > 0) {
    sections.push_back(
        {BITSTREAM, "bitstream", filler(s.bitstream_bytes, std::stoull(spec_digest.substr(0, 16), nullptr, 16))});
  }

  std::size_t header_size = sizeof(axlf) + (sections.size() - 1) * sizeof(axlf_section_header);
  std::vector<axlf_section_header> headers;
  std::size_t offset = (header_size + 7) & ~std::size_t{7};
  for (const auto& sec : sections) {
    axlf_section_header h{};
    h.m_sectionKind = sec.kind;
    std::strncpy(h.m_sectionName, sec.name, sizeof h.m_sectionName - 1);
    h.m_sectionOffset = offset;
    h.m_sectionSize = sec.data.size();
    headers.push_back(h);
    offset = (offset + sec.data.size() + 7) & ~std::size_t{7};
  }
  std::size_t total = offset;

  axlf top{};
  std::memcpy(top.m_magic, "xclbin2", 8);
  top.m_signature_length = -1;
  std::memset(top.reserved, 0xff, sizeof top.reserved);
  top.m_uniqueId = std::stoull(spec_digest.substr(16, 16), nullptr, 16);
  top.m_header.m_length = total;
  top.m_header.m_timeStamp = 0;
  top.m_header.m_versionMajor = 2;
  top.m_header.m_versionMinor = 13;
  top.m_header.m_mode = s.mode;
  std::strncpy(reinterpret_cast<char*>(top.m_header.m_platformVBNV), s.platform.c_str(),
               sizeof top.m_header.m_platformVBNV - 1);
  for (int i = 0; i < 16; ++i) {
    top.m_header.uuid[i] = static_cast<unsigned char>(std::stoi(spec_digest.substr(32 + 2 * i, 2), nullptr, 16));
  }
  top.m_header.uuid[6] = static_cast<unsigned char>((top.m_header.uuid[6] & 0x0f) | 0x40);  // version 4 layout
  top.m_header.uuid[8] = static_cast<unsigned char>((top.m_header.uuid[8] & 0x3f) | 0x80);  // RFC 4122 variant
  top.m_header.m_numSections = static_cast<std::uint32_t>(sections.size());

  std::string image(total, '\0');
  std::memcpy(image.data(), &top, offsetof(axlf, m_sections));
  std::memcpy(image.data() + offsetof(axlf, m_sections), headers.data(), headers.size() * sizeof(axlf_section_header));
  for (std::size_t i = 0; i < sections.size(); ++i) {
    std::memcpy(image.data() + headers[i].m_sectionOffset, sections[i].data.data(), sections[i].data.size());
  }
  return image;
}

void write_file(const std::filesystem::path& path, const std::string& data) {
  std::filesystem::path tmp = path;
  tmp += ".part";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) fail("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{R"(accelpool-mkxclbin: write an .xclbin image and its registry manifest from a small TOML spec.

Writes OUTDIR/<name>.xclbin and OUTDIR/<name>.toml, deterministically (the UUID derives from the spec's content,
the timestamp is 0, the bitstream payload is a filler seeded from the spec). The spec file is named
<name>.spec.toml; its keys: name, version, kind ("fpga"), platform (VBNV), compatible (default [platform]),
programming_seconds, bitstream_bytes (filler size, default 4096), description, mode ("flat", the default, or "pr":
the header's XCLBIN_FLAT or XCLBIN_PR), and [[kernels]] tables with name, args (["a:int*", "n:uint"]; pointer
types go through the memory bank) and instances (default 1).
Examples: bitstreams/samples/xclbin/*.spec.toml.)"};
  accelpool::common::init_cli(app, "accelpool-mkxclbin");
  std::filesystem::path spec_path, outdir;
  app.add_option("spec", spec_path, "the spec, <name>.spec.toml")->type_name("SPEC.toml")->required();
  app.add_option("outdir", outdir, "where the image and its manifest go (created if missing)")
      ->type_name("OUTDIR")
      ->required();
  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  std::ifstream in(spec_path, std::ios::binary);
  if (!in) fail(spec_path.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  Spec spec = read_spec(spec_path);
  if (spec_path.filename().string() != spec.manifest.name + ".spec.toml")
    fail(spec_path.string() + ": the file must be named " + spec.manifest.name + ".spec.toml (after field 'name')");
  std::string digest = bs::sha256_bytes(text.str());
  std::string image = build_image(spec, digest);

  std::filesystem::create_directories(outdir);
  spec.manifest.file = spec.manifest.name + ".xclbin";
  spec.manifest.format = bs::ImageFormat::xclbin;
  spec.manifest.sha256 = bs::sha256_bytes(image);
  if (auto st = bs::validate_manifest(spec.manifest, spec_path.string()); !st) fail(st.error().message);
  write_file(outdir / spec.manifest.file, image);
  write_file(outdir / (spec.manifest.name + ".toml"), bs::to_toml(spec.manifest));
  return 0;
}
