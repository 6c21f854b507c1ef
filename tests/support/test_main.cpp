// The main of every test binary: Catch2's session, with an exit code that tells CTest a test was skipped
// (skip.hpp). A failure always exits 1, so it can never be taken for a skip (Catch2 exits with the number of
// failed assertions, which may be any number); a test name that matches nothing is a failure too.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <atomic>

namespace {
std::atomic<bool> skipped{false};
}  // namespace

void accelpool::testing::skip(const std::string& why) {
  skipped = true;
  WARN("SKIPPED: " << why);
}

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (int bad = session.applyCommandLine(argc, argv); bad != 0) return bad;
  auto& config = session.configData();
  // Listing answers with Catch2's own code (the number of names), which test discovery expects.
  if (config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters) return session.run();
  // CTest runs each test case by its name: a name that matches no test case (e.g. one CMake split at a ';') is a
  // failure, not a pass.
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoTests);
  int failed = session.run();
  if (failed != 0) return 1;
  return skipped ? ACCELPOOL_TEST_SKIP_EXIT_CODE : 0;
}
