#include <accelpool/bitstreams/manifest.hpp>

#include <toml++/toml.h>

#include "read_file.hpp"

#include <cctype>
#include <cmath>
#include <set>
#include <sstream>
#include <utility>

namespace accelpool::bitstreams {
namespace {

Error field_error(std::string_view origin, std::string_view field, std::string_view what) {
  return make_error(Errc::invalid_manifest,
                    "manifest " + std::string(origin) + ": field '" + std::string(field) + "': " + std::string(what));
}

bool all_of(std::string_view s, std::string_view allowed_punct) {
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || allowed_punct.find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Shell-style match of '*' and '?' (iterative, linear backtracking on the last '*').
bool glob_match(std::string_view pattern, std::string_view text) {
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string toml_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + toml_quote(items[i]);
  return out + "]";
}

Result<std::vector<std::string>> string_array(const toml::table& t, std::string_view key, std::string_view origin) {
  const toml::node* node = t.get(key);
  if (!node) return field_error(origin, key, "missing (an array of strings)");
  const toml::array* arr = node->as_array();
  if (!arr) return field_error(origin, key, "expected an array of strings");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < arr->size(); ++i) {
    auto v = (*arr)[i].value<std::string>();
    if (!v) return field_error(origin, key, "element " + std::to_string(i) + " is not a string");
    out.push_back(*v);
  }
  return out;
}

Result<std::string> required_string(const toml::table& t, std::string_view key, std::string_view origin) {
  const toml::node* node = t.get(key);
  if (!node) return field_error(origin, key, "missing (a string)");
  auto v = node->value<std::string>();
  if (!v || !node->is_string()) return field_error(origin, key, "expected a string");
  return *v;
}

ImageFormat infer_format(std::string_view file) {
  auto ends_with = [&](std::string_view suffix) {
    return file.size() >= suffix.size() && file.substr(file.size() - suffix.size()) == suffix;
  };
  if (ends_with(".xclbin")) return ImageFormat::xclbin;
  if (ends_with(".cl")) return ImageFormat::opencl_source;
  return ImageFormat::opaque;
}

// An image's file name: 1-255 of [A-Za-z0-9._+-], not starting with '.' (hidden and temporary names), not
// ending in ".toml" (a manifest's name: the image would be overwritten by its manifest or read as one).
Status validate_image_file_name(std::string_view file, std::string_view origin) {
  if (file.empty()) return field_error(origin, "file", "missing or empty");
  // Messages show control characters (a NUL, which the file system would cut the name at) as '?'.
  std::string shown;
  for (char c : file) shown += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
  if (file.size() > 255 || file.front() == '.' || !all_of(file, "._+-ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    return field_error(origin, "file",
                       "'" + shown +
                           "' must be a plain file name in the manifest's folder: 1-255 of "
                           "[A-Za-z0-9._+-], not starting with '.'");
  std::string lower;
  for (char c : file) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.size() >= 5 && lower.compare(lower.size() - 5, 5, ".toml") == 0)
    return field_error(origin, "file",
                       "'" + shown + "' ends in .toml: the registry would read the image as a manifest");
  return Status::ok();
}

}  // namespace

std::string_view to_string(ImageFormat format) {
  switch (format) {
    case ImageFormat::xclbin:
      return "xclbin";
    case ImageFormat::opencl_source:
      return "opencl-source";
    case ImageFormat::opencl_binary:
      return "opencl-binary";
    case ImageFormat::opaque:
      return "opaque";
  }
  return "opaque";
}

bool model_matches(const std::vector<std::string>& patterns, std::string_view model) {
  for (const auto& p : patterns) {
    if (glob_match(p, model)) return true;
  }
  return false;
}

Status validate_manifest(const Manifest& m, std::string_view origin) {
  if (m.name.empty() || !all_of(m.name, "._-") || m.name.front() == '.' || m.name.front() == '-')
    return field_error(origin, "name",
                       "'" + m.name + "' must be non-empty [a-z0-9._-], starting with a letter or digit");
  if (m.version.empty() || m.version.front() == '.' || !all_of(m.version, "._+-ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    return field_error(origin, "version", "'" + m.version + "' must be non-empty [A-Za-z0-9._+-]");
  if (m.kind.empty() || !all_of(m.kind, "_"))
    return field_error(origin, "kind", "'" + m.kind + "' must be a lowercase word such as fpga, gpu, cpu");
  if (m.compatible.empty()) return field_error(origin, "compatible", "must list at least one device model or shell");
  for (const auto& c : m.compatible) {
    if (c.empty()) return field_error(origin, "compatible", "contains an empty model name");
  }
  if (auto st = validate_image_file_name(m.file, origin); !st) return st;
  if (!is_hex64(m.sha256)) return field_error(origin, "sha256", "'" + m.sha256 + "' is not 64 lowercase hex digits");
  if (!(m.programming_seconds >= 0) || !std::isfinite(m.programming_seconds))
    return field_error(origin, "programming_seconds", "must be a number >= 0");
  if (m.partial && (m.slot_shape.empty() || !all_of(m.slot_shape, "._-")))
    return field_error(origin, "slot_shape", "a partial image must name the slot shape it fits ([a-z0-9._-])");
  if (!m.partial && !m.slot_shape.empty())
    return field_error(origin, "slot_shape", "only a partial image (image = \"partial\") fits a slot");
  if (!(m.bandwidth_demand >= 0 && m.bandwidth_demand <= 1))
    return field_error(origin, "bandwidth_demand", "must be a share of the device's bandwidth, from 0 to 1");
  std::set<std::string> seen;
  for (const auto& k : m.kernels) {
    if (k.empty()) return field_error(origin, "kernels", "contains an empty kernel name");
    if (!seen.insert(k).second) return field_error(origin, "kernels", "lists '" + k + "' twice");
  }
  if ((m.format == ImageFormat::xclbin || m.format == ImageFormat::opencl_source ||
       m.format == ImageFormat::opencl_binary) &&
      m.kernels.empty())
    return field_error(origin, "kernels",
                       "must name at least one kernel for format " + std::string(to_string(m.format)));
  return Status::ok();
}

Result<Manifest> parse_manifest(std::string_view toml_text, std::string_view origin) {
  toml::table t;
  try {
    t = toml::parse(toml_text, std::string(origin));
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "manifest " << origin << ": not valid TOML at line " << e.source().begin.line << ", column "
       << e.source().begin.column << ": " << e.description();
    return make_error(Errc::invalid_manifest, os.str());
  }
  static const std::set<std::string, std::less<>> known = {
      "name",    "version", "kind",        "compatible", "file",       "sha256",          "programming_seconds",
      "kernels", "format",  "description", "image",      "slot_shape", "bandwidth_demand"};
  for (const auto& [key, node] : t) {
    if (!known.count(key.str())) return field_error(origin, key.str(), "unknown field");
  }
  Manifest m;
  // Field `key`, read by `read` (required_string or string_array), into `out`; a missing field that is not
  // `required` leaves `out` as it is.
  auto field = [&](const char* key, auto& out, bool required, auto read) -> Status {
    if (!required && !t.contains(key)) return Status::ok();
    auto v = read(t, key, origin);
    if (!v) return v.error();
    out = std::move(*v);
    return Status::ok();
  };
  for (auto [key, out] : {std::pair{"name", &m.name},
                          {"version", &m.version},
                          {"kind", &m.kind},
                          {"file", &m.file},
                          {"sha256", &m.sha256}}) {
    if (auto st = field(key, *out, true, required_string); !st) return st.error();
  }
  if (auto st = field("compatible", m.compatible, true, string_array); !st) return st.error();
  if (auto st = field("kernels", m.kernels, false, string_array); !st) return st.error();
  // A number field (integer or float) into `out`; an error if it is of another type.
  auto number = [&](const char* key, double& out) -> Status {
    const toml::node* n = t.get(key);
    if (n->is_integer()) {
      out = static_cast<double>(*n->value<std::int64_t>());
    } else if (n->is_floating_point()) {
      out = *n->value<double>();
    } else {
      return field_error(origin, key, "expected a number");
    }
    return Status::ok();
  };
  if (!t.contains("programming_seconds")) {
    return field_error(origin, "programming_seconds", "missing (a number of seconds)");
  }
  if (auto st = number("programming_seconds", m.programming_seconds); !st) return st.error();
  if (t.contains("image")) {
    auto image = required_string(t, "image", origin);
    if (!image) return image.error();
    if (*image != "full" && *image != "partial") {
      return field_error(origin, "image", "'" + *image + "' is not one of full, partial");
    }
    m.partial = *image == "partial";
  }
  if (auto st = field("slot_shape", m.slot_shape, false, required_string); !st) return st.error();
  if (t.contains("bandwidth_demand")) {
    if (auto st = number("bandwidth_demand", m.bandwidth_demand); !st) return st.error();
  }
  if (auto st = field("description", m.description, false, required_string); !st) return st.error();
  m.format = infer_format(m.file);
  if (t.contains("format")) {
    auto f = required_string(t, "format", origin);
    if (!f) return f.error();
    if (*f == "xclbin")
      m.format = ImageFormat::xclbin;
    else if (*f == "opencl-source")
      m.format = ImageFormat::opencl_source;
    else if (*f == "opencl-binary")
      m.format = ImageFormat::opencl_binary;
    else if (*f == "opaque")
      m.format = ImageFormat::opaque;
    else
      return field_error(origin, "format", "'" + *f + "' is not one of xclbin, opencl-source, opencl-binary, opaque");
  }
  if (auto st = validate_manifest(m, origin); !st) return st.error();
  return m;
}

Result<Manifest> load_manifest(const std::filesystem::path& path) {
  auto text = detail::read_file(path, "manifest " + path.string());
  if (!text) return text.error();
  return parse_manifest(*text, path.string());
}

std::string to_toml(const Manifest& m) {
  std::ostringstream os;
  os << "name = " << toml_quote(m.name) << "\n";
  os << "version = " << toml_quote(m.version) << "\n";
  os << "kind = " << toml_quote(m.kind) << "\n";
  if (!m.description.empty()) os << "description = " << toml_quote(m.description) << "\n";
  os << "file = " << toml_quote(m.file) << "\n";
  os << "format = " << toml_quote(to_string(m.format)) << "\n";
  os << "sha256 = " << toml_quote(m.sha256) << "\n";
  char secs[64];
  std::snprintf(secs, sizeof secs, "%.17g", m.programming_seconds);
  std::string s = secs;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  os << "programming_seconds = " << s << "\n";
  os << "compatible = " << toml_array(m.compatible) << "\n";
  os << "kernels = " << toml_array(m.kernels) << "\n";
  if (m.partial) os << "image = \"partial\"\nslot_shape = " << toml_quote(m.slot_shape) << "\n";
  if (m.bandwidth_demand > 0) {
    std::snprintf(secs, sizeof secs, "%.17g", m.bandwidth_demand);
    os << "bandwidth_demand = " << secs << "\n";
  }
  return os.str();
}

}  // namespace accelpool::bitstreams
