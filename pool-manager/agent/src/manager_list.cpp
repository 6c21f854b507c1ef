#include "manager_list.hpp"

#include <boost/json.hpp>

namespace accelpool::agent {

namespace json = boost::json;

std::string standby_names_leader(std::string_view line) {
  boost::system::error_code ec;
  auto v = json::parse(line, ec);
  if (ec || !v.is_object()) return "";
  const auto* err = v.as_object().if_contains("error");
  const auto* data = err && err->is_object() ? err->as_object().if_contains("data") : nullptr;
  const auto* leader = data && data->is_object() ? data->as_object().if_contains("leader") : nullptr;
  return leader && leader->is_string() ? std::string(leader->as_string()) : "";
}

ManagerList::ManagerList(std::vector<std::string> managers) : managers_(std::move(managers)) {
  if (!managers_.empty()) current_ = managers_.front();
}

bool ManagerList::advance(const std::string& leader) {
  if (managers_.empty()) return false;
  // The manager that failed or ended may be gone: the list goes on after it (a named leader is no step of it).
  const bool was_redirected = redirected_;
  if (!was_redirected) next_ = (next_ + 1) % managers_.size();
  if (!leader.empty() && leader != current_) {
    current_ = leader;
    redirected_ = true;
    return !was_redirected;  // two names in a row (the leader changed meanwhile): no tight loop between them
  }
  current_ = managers_[next_];
  redirected_ = false;
  return false;
}

}  // namespace accelpool::agent
