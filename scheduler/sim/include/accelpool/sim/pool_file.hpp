// Reading a pool description (PoolSpec) from JSON.
//
//   {
//     "models": { "u250": { "reconfig_s": 12.0, "attach_s": 0.5 } },       // optional
//     "default": { "reconfig_s": 0, "attach_s": 0 },                         // optional
//     "hosts": [
//       { "name": "h", "repeat": 4,                                          // repeat: optional, names h0..h3
//         "devices": [ { "kind": "fpga", "model": "u250", "attach": "passthrough", "count": 2 } ] }
//     ]
//   }
//
// Device fields default to kind "fpga", model "generic", attach "network", count 1. Unknown keys are errors.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/sim/simulator.hpp>

#include <string>

namespace accelpool::sim {

// Parses JSON text; errors start with `source` ("pool.json: hosts[1].devices[0].count: expected a positive
// integer"), JSON syntax errors give the byte offset.
Result<PoolSpec> parse_pool_json(const std::string& text, const std::string& source);
// Reads and parses a file; a missing file is an error naming it.
Result<PoolSpec> load_pool_file(const std::string& path);

}  // namespace accelpool::sim
