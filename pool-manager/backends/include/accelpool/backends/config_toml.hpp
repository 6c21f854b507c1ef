// How a TOML value of a backend's table (an agent's [backends.<name>], a static host's [hosts.settings]) becomes
// a BackendConfig value. Header-only, for the programs that read TOML (they link toml++); the backends do not.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <optional>
#include <string>

namespace accelpool::backends {

// A string as it is; an integer, float or boolean spelt as text ("2", "0.500000", "true"); an array of integers
// spelt "[2, 1, 1]" ("[]" when empty), which ConfigReader::get_int_list reads back. Nullopt for anything else (a
// table, an array holding anything but integers, a date): the caller refuses the key.
inline std::optional<std::string> backend_config_value(const toml::node& v) {
  if (auto s = v.as_string()) return s->get();
  if (auto i = v.as_integer()) return std::to_string(i->get());
  if (auto f = v.as_floating_point()) return std::to_string(f->get());
  if (auto b = v.as_boolean()) return b->get() ? "true" : "false";
  if (auto a = v.as_array()) {
    std::string list = "[";
    for (const auto& e : *a) {
      auto n = e.as_integer();
      if (!n) return std::nullopt;
      list += (list.size() > 1 ? ", " : "") + std::to_string(n->get());
    }
    return list + "]";
  }
  return std::nullopt;
}

}  // namespace accelpool::backends
