// Tokens: generated from the OS's random source, stored as SHA-256 hashes.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/manager/types.hpp>

#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accelpool::manager {

// Lowercase hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);
// A fresh token: `prefix` followed by 32 random bytes in hex. Aborts if the OS has no randomness.
std::string generate_token(std::string_view prefix);
// Compares two strings in time independent of where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

// Gives `tenant` a fresh guest token ("apt_..."): sets its token_hash, returns the token.
std::string new_tenant_token(TenantRecord& tenant);

// Rows of the store's meta table, as a Batch writes them.
using MetaRows = std::vector<std::pair<std::string, std::string>>;

// The named admin tokens (one per operator), as the store keeps them: one meta row per token, key
// "admin_token:NAME", value the token's SHA-256 (an empty value: revoked). A store from before named tokens holds
// one unnamed token under "admin_token_hash": it reads as the token named "admin". Only hashes are kept.
// Used by the core (the running manager) and by `accelpool-manager token` (the stopped manager's store), so both
// read and write the same rows. Not thread-safe: one owner.
class AdminTokens {
 public:
  static constexpr std::string_view kFirstName = "admin";  // the token a new pool's first start creates

  AdminTokens() = default;
  // The tokens the meta rows name.
  explicit AdminTokens(const std::map<std::string, std::string>& meta);

  // A new token for `name` ("apa_..."), returned once; appends the meta row to write to `rows`. With `replace`
  // the name must exist and its old token stops working (rotation); without, it must not.
  // Errors: "invalid_argument" (a name not of 1-64 characters of [A-Za-z0-9._:-]), "conflict", "not_found".
  Result<std::string> issue(const std::string& name, bool replace, MetaRows& rows);
  // Sets `name`'s token to `token` (at least 16 characters), created or replaced. Errors: "invalid_argument".
  Status set(const std::string& name, const std::string& token, MetaRows& rows);
  // The token stops working. Errors: "not_found".
  Status revoke(const std::string& name, MetaRows& rows);
  // The name of the admin token `token`, or "" when it is none.
  std::string check(std::string_view token) const;
  std::vector<std::string> names() const;
  bool empty() const { return by_name_.empty(); }

 private:
  void put(const std::string& name, std::string hash, MetaRows& rows);
  std::map<std::string, std::string> by_name_;            // name -> hash
  std::unordered_map<std::string, std::string> by_hash_;  // hash -> name
};

}  // namespace accelpool::manager
