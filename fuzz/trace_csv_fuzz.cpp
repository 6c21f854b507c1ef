// accelpool-sim's trace readers (docs/simulator.md): the input as a native CSV trace and as a Philly CSV trace;
// what reads completely goes through the offered-load and estimate helpers the simulator runs on it.
#include <accelpool/sim/trace.hpp>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool::sim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (auto parse : {&parse_native_csv, &parse_philly_csv}) {
    std::istringstream in(text);
    auto trace = parse(in, "fuzz.csv");
    if (!trace) continue;
    (void)offered_load(*trace, 4);
    apply_estimates(*trace, default_estimates(*trace), 1);
  }
  return 0;
}
