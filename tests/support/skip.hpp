// Skipping a test that cannot run here (no device, no root, a part this build lacks). Catch2 v2 has no SKIP, so
// a skipped test case says why (a Catch2 warning), is marked skipped and returns; the tests' main
// (test_main.cpp) then exits with ACCELPOOL_TEST_SKIP_EXIT_CODE when nothing failed. CTest runs every test case
// on its own with that code as its SKIP_RETURN_CODE, so it reports the test as skipped, not passed.
#pragma once

#include <sstream>
#include <string>

namespace accelpool::testing {

// Marks the running test case as skipped and warns why. The caller returns from the test case at once.
void skip(const std::string& why);

}  // namespace accelpool::testing

// In a test case: skips it, saying why (anything `<<` can print), and returns.
#define ACCELPOOL_SKIP(why)                               \
  do {                                                    \
    std::ostringstream accelpool_skip_why;                \
    accelpool_skip_why << why;                            \
    ::accelpool::testing::skip(accelpool_skip_why.str()); \
    return;                                               \
  } while (false)
