#include <accelpool/manager/auth.hpp>

#include <accelpool/common/guest_id.hpp>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>

namespace accelpool::manager {

namespace {
std::string to_hex(const unsigned char* data, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}
}  // namespace

std::string sha256_hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr) != 1) {
    std::fputs("accelpool: SHA-256 failed in OpenSSL\n", stderr);
    std::abort();
  }
  return to_hex(md.data(), len);
}

std::string generate_token(std::string_view prefix) {
  std::array<unsigned char, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    std::fputs("accelpool: no randomness available for a token\n", stderr);
    std::abort();
  }
  return std::string(prefix) + to_hex(bytes.data(), bytes.size());
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string new_tenant_token(TenantRecord& tenant) {
  std::string token = generate_token("apt_");
  tenant.token_hash = sha256_hex(token);
  return token;
}

namespace {
constexpr std::string_view kAdminTokenKey = "admin_token:";
constexpr const char* kLegacyAdminTokenKey = "admin_token_hash";
}  // namespace

AdminTokens::AdminTokens(const std::map<std::string, std::string>& meta) {
  for (auto it = meta.lower_bound(std::string(kAdminTokenKey));
       it != meta.end() && it->first.starts_with(kAdminTokenKey); ++it) {
    if (!it->second.empty()) by_name_[it->first.substr(kAdminTokenKey.size())] = it->second;
  }
  // The token of a store from before named tokens, unless a row of the name "admin" (revoked too) supersedes it.
  if (auto it = meta.find(kLegacyAdminTokenKey);
      it != meta.end() && !it->second.empty() && !meta.count(std::string(kAdminTokenKey) + std::string(kFirstName))) {
    by_name_[std::string(kFirstName)] = it->second;
  }
  for (const auto& [name, hash] : by_name_) by_hash_[hash] = name;
}

void AdminTokens::put(const std::string& name, std::string hash, MetaRows& rows) {
  if (auto it = by_name_.find(name); it != by_name_.end()) by_hash_.erase(it->second);
  if (hash.empty()) {
    by_name_.erase(name);
  } else {
    by_hash_[hash] = name;
    by_name_[name] = hash;
  }
  rows.emplace_back(std::string(kAdminTokenKey) + name, std::move(hash));
}

Result<std::string> AdminTokens::issue(const std::string& name, bool replace, MetaRows& rows) {
  if (name.empty() || name.size() > 64 || !std::all_of(name.begin(), name.end(), common::is_name_char)) {
    return make_error(Errc::invalid_argument,
                      "admin token name '" + name + "' must be 1-64 characters of [A-Za-z0-9._:-]");
  }
  bool exists = by_name_.count(name) > 0;
  if (replace && !exists) return make_error(Errc::not_found, "no admin token named " + name);
  if (!replace && exists) return make_error(Errc::conflict, "admin token " + name + " exists (rotate it instead)");
  std::string token = generate_token("apa_");
  put(name, sha256_hex(token), rows);
  return token;
}

Status AdminTokens::set(const std::string& name, const std::string& token, MetaRows& rows) {
  if (token.size() < 16) return make_error(Errc::invalid_argument, "an admin token needs at least 16 characters");
  put(name, sha256_hex(token), rows);
  return Status::ok();
}

Status AdminTokens::revoke(const std::string& name, MetaRows& rows) {
  if (!by_name_.count(name)) return make_error(Errc::not_found, "no admin token named " + name);
  put(name, "", rows);
  return Status::ok();
}

std::string AdminTokens::check(std::string_view token) const {
  if (token.empty() || token.size() > 256) return {};
  auto it = by_hash_.find(sha256_hex(token));
  return it == by_hash_.end() ? std::string() : it->second;
}

std::vector<std::string> AdminTokens::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : by_name_) out.push_back(name);
  return out;
}

}  // namespace accelpool::manager
