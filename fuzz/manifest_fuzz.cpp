// The bitstream manifest reader (docs/bitstreams.md): parse_manifest on the input; a manifest that parses must
// serialise with to_toml and read back unchanged (the round trip the registry relies on when it writes one).
#include <accelpool/bitstreams/manifest.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool::bitstreams;
  auto manifest = parse_manifest(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.toml");
  if (!manifest) return 0;
  (void)validate_manifest(*manifest, "fuzz.toml");
  const std::string text = to_toml(*manifest);
  auto again = parse_manifest(text, "to_toml");
  if (!again || to_toml(*again) != text) {
    std::fprintf(stderr, "to_toml output does not read back unchanged:\n%s\n%s\n", text.c_str(),
                 again ? "(reads back differently)" : again.error().message.c_str());
    std::abort();
  }
  return 0;
}
