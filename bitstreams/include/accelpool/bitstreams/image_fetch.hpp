// Fetching an image a host lacks from the manager, by sha256, into a local registry folder (the host's cache).
// The manager serves GET /v1/images/{sha256} (the bytes) and GET /v1/images/{sha256}/manifest (the manifest as
// TOML) on its admin listener to the agent token (docs/agent-protocol.md, "Images").
#pragma once

#include <accelpool/bitstreams/registry.hpp>
#include <accelpool/common/result.hpp>

#include <chrono>
#include <string>
#include <string_view>

namespace accelpool::bitstreams {

// Returns the registry's bitstream with image `sha256`; when the registry lacks it, downloads manifest and image
// from `url` ("http://HOST:PORT", plain HTTP/1.1) with `token`, checks that the manifest names this sha256, and
// registers them (Registry::add verifies the bytes before anything is stored). Blocks up to `timeout` per request.
// Errors: "invalid_argument" (bad url or sha256), "unavailable" (cannot connect, I/O error, timeout),
// "unauthorized", "not_found" (the manager has no such image), "checksum_mismatch", Registry::add's errors.
Result<Bitstream> fetch_image(Registry& registry, std::string_view url, std::string_view token,
                              std::string_view sha256, std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace accelpool::bitstreams
