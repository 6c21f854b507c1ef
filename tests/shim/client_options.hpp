// Client options for the shim's tests (they link the shim library; manager_fixture.hpp does not).
#pragma once

#include <accelpool/shim/client.hpp>

#include <string>
#include <utility>

namespace accelpool::shim::test {

// Options to connect to `uri` with `token` as `guest`, the rest default; the caller may change more.
inline ClientOptions connect_options(std::string uri, std::string token, std::string guest) {
  ClientOptions o;
  o.uri = std::move(uri);
  o.token = std::move(token);
  o.guest = std::move(guest);
  return o;
}

}  // namespace accelpool::shim::test
