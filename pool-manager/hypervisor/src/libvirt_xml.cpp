#include <accelpool/hypervisor/libvirt_xml.hpp>

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>

namespace accelpool::hypervisor {

namespace {

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

bool all_hex(std::string_view s) {
  for (char c : s) {
    if (!is_hex(c)) return false;
  }
  return !s.empty();
}

// Non-empty and only the digits 0-9a-f, as snprintf's "%x" and escape_device_id write them.
bool all_lower_hex(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using DocPtr = std::unique_ptr<xmlDoc, DocFree>;

// Parses without network access, entity expansion into the tree or error output on stderr.
Result<DocPtr> parse_document(std::string_view xml, std::string_view what) {
  if (xml.size() > static_cast<std::size_t>(INT32_MAX)) {
    return make_error(Errc::invalid_argument, std::string(what) + ": document too large");
  }
  DocPtr doc(xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "memory.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
  if (!doc) {
    const xmlError* err = xmlGetLastError();
    std::string detail = err != nullptr && err->message != nullptr ? err->message : "unknown parse error";
    while (!detail.empty() && (detail.back() == '\n' || detail.back() == ' ')) detail.pop_back();
    if (err != nullptr) detail += " (line " + std::to_string(err->line) + ")";
    return make_error(Errc::invalid_argument, std::string(what) + " is not well-formed XML: " + detail);
  }
  return doc;
}

bool named(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE && std::strcmp(reinterpret_cast<const char*>(node->name), name) == 0;
}

std::optional<std::string> attribute(const xmlNode* node, const char* name) {
  xmlChar* value = xmlGetProp(node, reinterpret_cast<const xmlChar*>(name));
  if (value == nullptr) return std::nullopt;
  std::string out(reinterpret_cast<const char*>(value));
  xmlFree(value);
  return out;
}

std::optional<AttachState> parse_state(std::string_view s) {
  for (auto st : {AttachState::attaching, AttachState::attached, AttachState::detaching, AttachState::quarantined}) {
    if (to_string(st) == s) return st;
  }
  return std::nullopt;
}

std::optional<AttachMethod> parse_method(std::string_view s) {
  for (auto m : {AttachMethod::pci_hostdev, AttachMethod::emulated}) {
    if (to_string(m) == s) return m;
  }
  return std::nullopt;
}

}  // namespace

Status validate_device_id(std::string_view device_id) {
  if (device_id.empty()) return make_error(Errc::invalid_argument, "device id is empty");
  if (device_id.size() > kMaxDeviceIdLength) {
    return make_error(Errc::invalid_argument, "device id '" + std::string(device_id.substr(0, 20)) +
                                                  "...' is longer than " + std::to_string(kMaxDeviceIdLength) +
                                                  " characters");
  }
  for (char c : device_id) {
    if (c <= ' ' || c > '~') {
      return make_error(Errc::invalid_argument,
                        "device id '" + std::string(device_id) + "' contains a space or a non-printable character");
    }
  }
  return Status::ok();
}

Status validate_spec(const DeviceSpec& spec) {
  if (Status s = validate_device_id(spec.device_id); !s) return s;
  if (spec.lease_id.empty()) {
    return make_error(Errc::invalid_argument, "lease id for device '" + spec.device_id + "' is empty");
  }
  if (spec.lease_id.size() > kMaxLeaseIdLength) {
    return make_error(Errc::invalid_argument, "lease id for device '" + spec.device_id + "' is longer than " +
                                                  std::to_string(kMaxLeaseIdLength) + " characters");
  }
  for (char c : spec.lease_id) {
    if (static_cast<unsigned char>(c) < ' ') {
      return make_error(Errc::invalid_argument, "lease id for device '" + spec.device_id + "' has a control character");
    }
  }
  if (spec.method == AttachMethod::pci_hostdev) {
    if (auto bdf = normalize_bdf(spec.pci_bdf); !bdf) {
      return make_error(Errc::invalid_argument, "device '" + spec.device_id + "': " + bdf.error().message);
    }
  }
  return Status::ok();
}

Result<std::string> normalize_bdf(std::string_view bdf) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::invalid_argument, "PCI address '" + std::string(bdf) + "' is malformed (" +
                                                  std::string(why) + "); expected DDDD:BB:SS.F or BB:SS.F in hex");
  };
  std::string_view rest = bdf;
  std::string domain = "0000";
  if (std::count(rest.begin(), rest.end(), ':') == 2) {
    auto colon = rest.find(':');
    if (colon != 4 || !all_hex(rest.substr(0, 4))) return Result<std::string>(bad("domain must be 4 hex digits"));
    domain = std::string(rest.substr(0, 4));
    rest.remove_prefix(5);
  }
  // rest: BB:SS.F
  if (rest.size() != 7 || rest[2] != ':' || rest[5] != '.') return Result<std::string>(bad("wrong shape"));
  std::string_view bus = rest.substr(0, 2);
  std::string_view slot = rest.substr(3, 2);
  char function = rest[6];
  if (!all_hex(bus) || !all_hex(slot)) return Result<std::string>(bad("bus and slot must be 2 hex digits"));
  if (std::stoul(std::string(slot), nullptr, 16) > 0x1f) return Result<std::string>(bad("slot above 1f"));
  if (function < '0' || function > '7') return Result<std::string>(bad("function must be 0-7"));
  return lower(domain + ":" + std::string(bus) + ":" + std::string(slot) + "." + function);
}

std::string escape_device_id(std::string_view device_id) {
  static constexpr std::array<char, 16> kHex = {'0', '1', '2', '3', '4', '5', '6', '7',
                                                '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'};
  std::string out;
  out.reserve(device_id.size() * 3);
  for (char c : device_id) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '-') {
      out.push_back(c);
    } else {
      out.push_back('_');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
  }
  return out;
}

std::string device_alias(std::string_view device_id, std::uint64_t attachment) {
  char number[17];
  std::snprintf(number, sizeof number, "%llx", static_cast<unsigned long long>(attachment));
  return std::string(kAliasPrefix) + escape_device_id(device_id) + std::string(kAttachmentMarker) + number;
}

Result<ParsedAlias> parse_device_alias(std::string_view alias) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::invalid_argument,
                      "alias '" + std::string(alias) + "' is not one accelpool writes: " + std::string(why));
  };
  if (alias.substr(0, kAliasPrefix.size()) != kAliasPrefix)
    return bad("it does not start with " + std::string(kAliasPrefix));
  std::string_view escaped = alias.substr(kAliasPrefix.size());
  ParsedAlias parsed;
  if (auto marker = escaped.find(kAttachmentMarker); marker != std::string_view::npos) {
    std::string_view number = escaped.substr(marker + kAttachmentMarker.size());
    if (number.size() > 16 || !all_lower_hex(number))
      return bad("its attachment number is not 1-16 lower-case hex digits");
    parsed.attachment = std::stoull(std::string(number), nullptr, 16);
    escaped = escaped.substr(0, marker);
  }
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] != '_') {
      parsed.device_id.push_back(escaped[i]);
      continue;
    }
    std::string_view code = escaped.substr(i + 1, 2);
    if (code.size() != 2 || !all_lower_hex(code)) return bad("'_' is not followed by two lower-case hex digits");
    parsed.device_id.push_back(static_cast<char>(std::stoul(std::string(code), nullptr, 16)));
    i += 2;
  }
  if (parsed.device_id.empty()) return bad("it names no device");
  // The escape is injective only in its shortest form: "_41" would name the device "A", whose alias says "A".
  if (escape_device_id(parsed.device_id) != escaped) return bad("its device id is not escaped as accelpool escapes it");
  return parsed;
}

std::string shmem_name(std::string_view device_id) { return "accelpool-" + escape_device_id(device_id); }

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

Status validate_shmem_size(std::uint32_t shmem_size_mib) {
  if (shmem_size_mib == 0 || shmem_size_mib > 1024 || (shmem_size_mib & (shmem_size_mib - 1)) != 0) {
    return make_error(Errc::invalid_argument,
                      "shared-memory size " + std::to_string(shmem_size_mib) + " MiB is not a power of two in 1..1024");
  }
  return Status::ok();
}

Result<std::string> device_xml(const DeviceSpec& spec, std::uint64_t attachment, std::uint32_t shmem_size_mib) {
  if (Status s = validate_spec(spec); !s) return s.error();
  const std::string alias = device_alias(spec.device_id, attachment);
  if (spec.method == AttachMethod::pci_hostdev) {
    auto bdf = normalize_bdf(spec.pci_bdf);
    if (!bdf) return bdf.error();
    const std::string& b = *bdf;  // dddd:bb:ss.f
    return "<hostdev mode='subsystem' type='pci' managed='yes'>"
           "<source><address domain='0x" +
           b.substr(0, 4) + "' bus='0x" + b.substr(5, 2) + "' slot='0x" + b.substr(8, 2) + "' function='0x" +
           b.substr(11, 1) +
           "'/></source>"
           "<alias name='" +
           alias + "'/></hostdev>";
  }
  if (Status s = validate_shmem_size(shmem_size_mib); !s) return s.error();
  return "<shmem name='" + shmem_name(spec.device_id) + "'><model type='ivshmem-plain'/><size unit='M'>" +
         std::to_string(shmem_size_mib) + "</size><alias name='" + alias + "'/></shmem>";
}

std::string metadata_xml(const std::vector<AttachedDevice>& devices) {
  std::string out = "<accelpool version='1'>";
  for (const auto& d : devices) {
    out += "<device id='" + xml_escape(d.device_id) + "' lease='" + xml_escape(d.lease_id) + "' method='" +
           std::string(to_string(d.method)) + "' alias='" + xml_escape(d.alias) + "' state='" +
           std::string(to_string(d.state)) + "'";
    if (!d.pci_bdf.empty()) out += " bdf='" + xml_escape(d.pci_bdf) + "'";
    if (!d.note.empty()) out += " note='" + xml_escape(d.note) + "'";
    out += "/>";
  }
  out += "</accelpool>";
  return out;
}

Result<std::vector<AttachedDevice>> parse_metadata_xml(std::string_view xml) {
  auto doc = parse_document(xml, "accelpool metadata");
  if (!doc) return doc.error();
  const xmlNode* root = xmlDocGetRootElement(doc->get());
  if (root == nullptr || !named(root, "accelpool")) {
    return make_error(Errc::invalid_argument, "accelpool metadata: root element is not <accelpool>");
  }
  std::vector<AttachedDevice> out;
  int index = 0;
  for (const xmlNode* n = root->children; n != nullptr; n = n->next) {
    if (n->type != XML_ELEMENT_NODE) continue;
    ++index;
    const std::string where = "accelpool metadata, element " + std::to_string(index);
    if (!named(n, "device")) {
      return make_error(Errc::invalid_argument,
                        where + ": unexpected <" + reinterpret_cast<const char*>(n->name) + ">, expected <device>");
    }
    AttachedDevice d;
    auto id = attribute(n, "id");
    auto lease = attribute(n, "lease");
    auto method = attribute(n, "method");
    auto alias = attribute(n, "alias");
    auto state = attribute(n, "state");
    if (!id || !lease || !method || !alias || !state) {
      return make_error(Errc::invalid_argument, where + ": <device> needs id, lease, method, alias and state");
    }
    auto m = parse_method(*method);
    if (!m) return make_error(Errc::invalid_argument, where + ": unknown method '" + *method + "'");
    auto st = parse_state(*state);
    if (!st) return make_error(Errc::invalid_argument, where + ": unknown state '" + *state + "'");
    d.device_id = *id;
    d.lease_id = *lease;
    d.method = *m;
    d.alias = *alias;
    d.state = *st;
    d.pci_bdf = attribute(n, "bdf").value_or("");
    d.note = attribute(n, "note").value_or("");
    if (Status s = validate_device_id(d.device_id); !s)
      return make_error(Errc::invalid_argument, where + ": " + s.error().message);
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

// Calls `visit` with every device element under <devices> of a domain definition and that device's alias ("" for
// none). Errors: "invalid_argument" on malformed XML or a root that is not <domain>.
Status for_each_device(std::string_view domain_xml,
                       const std::function<void(const xmlNode* device, const std::string& alias)>& visit) {
  auto doc = parse_document(domain_xml, "domain definition");
  if (!doc) return doc.error();
  const xmlNode* root = xmlDocGetRootElement(doc->get());
  if (root == nullptr || !named(root, "domain")) {
    return make_error(Errc::invalid_argument, "domain definition: root element is not <domain>");
  }
  for (const xmlNode* n = root->children; n != nullptr; n = n->next) {
    if (!named(n, "devices")) continue;
    for (const xmlNode* dev = n->children; dev != nullptr; dev = dev->next) {
      if (dev->type != XML_ELEMENT_NODE) continue;
      std::string alias;
      for (const xmlNode* c = dev->children; c != nullptr; c = c->next) {
        if (!named(c, "alias")) continue;
        if (auto name = attribute(c, "name")) alias = *name;
      }
      visit(dev, alias);
    }
  }
  return Status::ok();
}

// "0x0000" -> 0 (hex, with or without the 0x prefix); false when it is not a number below `limit`.
bool parse_hex(const std::string& text, unsigned limit, unsigned& out) {
  std::string digits = text.rfind("0x", 0) == 0 || text.rfind("0X", 0) == 0 ? text.substr(2) : text;
  if (digits.empty() || digits.size() > 8) return false;
  unsigned value = 0;
  for (char ch : digits) {
    int v = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
            : (ch >= 'a' && ch <= 'f')                   ? ch - 'a' + 10
            : (ch >= 'A' && ch <= 'F')                   ? ch - 'A' + 10
                                                         : -1;
    if (v < 0) return false;
    value = value * 16 + static_cast<unsigned>(v);
  }
  if (value >= limit) return false;
  out = value;
  return true;
}

}  // namespace

Result<std::vector<std::string>> device_aliases(std::string_view domain_xml) {
  std::vector<std::string> out;
  auto s = for_each_device(domain_xml, [&](const xmlNode*, const std::string& alias) {
    if (!alias.empty()) out.push_back(alias);
  });
  if (!s) return s.error();
  return out;
}

Result<std::string> guest_pci_address(std::string_view domain_xml, std::string_view alias) {
  bool found = false;
  std::string address;
  Status bad = Status::ok();
  auto s = for_each_device(domain_xml, [&](const xmlNode* dev, const std::string& a) {
    if (a != alias || found) return;
    found = true;
    // The device's own <address> (a direct child); a hostdev's host address sits inside <source> instead.
    for (const xmlNode* c = dev->children; c != nullptr; c = c->next) {
      if (!named(c, "address") || attribute(c, "type").value_or("") != "pci") continue;
      unsigned domain = 0, bus = 0, slot = 0, function = 0;
      if (!parse_hex(attribute(c, "domain").value_or("0"), 0x10000, domain) ||
          !parse_hex(attribute(c, "bus").value_or(""), 0x100, bus) ||
          !parse_hex(attribute(c, "slot").value_or(""), 0x20, slot) ||
          !parse_hex(attribute(c, "function").value_or(""), 0x8, function)) {
        bad = make_error(Errc::invalid_argument, "domain definition: device '" + a + "' has a malformed PCI address");
        return;
      }
      char text[16];
      std::snprintf(text, sizeof(text), "%04x:%02x:%02x.%x", domain, bus, slot, function);
      address = text;
    }
  });
  if (!s) return s.error();
  if (!bad) return bad.error();
  if (!found)
    return make_error(Errc::not_found, "domain definition: no device with alias '" + std::string(alias) + "'");
  return address;
}

}  // namespace accelpool::hypervisor
