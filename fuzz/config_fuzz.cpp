// The manager's TOML config loader (docs/operations.md): load_config on the input as a file, then the per-host
// backend settings and the endpoints of what loaded, as the daemon reads them at start.
#include <config.hpp>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

// One file per process, rewritten for each input (load_config reads a path).
const std::filesystem::path& config_file() {
  static const std::filesystem::path file = [] {
    std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::string templ = (base / "accelpool-fuzz-config-XXXXXX").string();
    if (!::mkdtemp(templ.data())) {
      std::fprintf(stderr, "fuzz fixture: cannot create a temporary folder under %s\n", base.c_str());
      std::abort();
    }
    return std::filesystem::path(templ) / "manager.toml";
  }();
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool::manager;
  {
    std::ofstream out(config_file(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto config = load_config(config_file());
  if (!config) return 0;
  for (const auto& host : config->hosts) (void)host_backends(host);
  (void)parse_endpoint(config->guest_tcp);
  (void)parse_endpoint(config->admin_listen);
  (void)config->bitstreams_dir();
  return 0;
}
