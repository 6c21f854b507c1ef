// JSON shapes shared by the guest protocol and the admin API (Boost.JSON). Internal to the manager.
#pragma once

#include <accelpool/manager/core.hpp>

#include <boost/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::manager {

// `v` as JSON: an integer when it is whole (2, not 2E0), else a double.
boost::json::value json_number(double v);
// `sp`: where the values live (a scratch resource when the caller serializes them at once).
boost::json::object to_json(const Lease& l, boost::json::storage_ptr sp = {});
boost::json::object to_json(const DeviceView& d);
boost::json::object to_json(const HostView& h);      // without its devices
boost::json::object to_json(const TenantRecord& t);  // never the hash
boost::json::object to_json(const Stats& s);
// A group of learned run times: its key (null for what the group does not fix), observations, warm, and what
// it learned (mean_device_s, estimate_s, p50_device_s, p90_device_s).
boost::json::object to_json(const LearnedGroup& g);
boost::json::array to_json(const std::vector<Lease>& leases, boost::json::storage_ptr sp = {});
// A waiting lease as the queue shows it (GET /v1/queue, the event stream): the lease, its `position` in the whole
// queue (1 = served next) and its `expected_start` (PoolCore::expected_start; null without an estimate).
boost::json::object queue_entry_json(const Lease& l, std::size_t position, std::optional<double> expected_start);

// Reads fields of a request object strictly: wrong types, out-of-range numbers and unknown fields are errors
// that name the field. Call finish() after the reads to refuse fields nobody asked for.
class FieldReader {
 public:
  FieldReader(const boost::json::object& obj, std::string where) : obj_(obj), where_(std::move(where)) {}
  std::optional<std::string> string(std::string_view key, bool required, std::size_t max_len = 256);
  std::optional<std::uint64_t> uint(std::string_view key, bool required, std::uint64_t max);
  std::optional<double> number(std::string_view key, bool required, double min, double max);
  std::optional<bool> boolean(std::string_view key, bool required);
  // A required guest (VM) id: common::kGuestIdSyntax.
  std::optional<std::string> guest_id(std::string_view key);
  // The first error, if any read failed or an unknown field is present.
  std::optional<Error> finish();

 private:
  const boost::json::value* take(std::string_view key, bool required);
  void fail(std::string message);
  const boost::json::object& obj_;
  std::string where_;
  std::vector<std::string> seen_;
  std::optional<Error> error_;
};

}  // namespace accelpool::manager
