// The dashboard's files (pool-manager/manager/dashboard/), built into the binary: CMake generates
// dashboard_assets.cpp from the folder, so the manager serves exactly the files it was built with and no
// request leaves the machine. Internal to the manager.
#pragma once

#include <string_view>

namespace accelpool::manager {

struct DashboardAsset {
  std::string_view name;          // the file's name in the folder, e.g. "app.js"
  std::string_view content_type;  // from its extension
  std::string_view body;
  std::string_view etag;  // "\"<sha256 of the body>\""
};

// The asset named `name` ("index.html", "app.js", ...), or nullptr.
const DashboardAsset* find_dashboard_asset(std::string_view name);

}  // namespace accelpool::manager
