// RemoteHost: a HostDriver whose operations are requests over the agent's connection. The requests and the
// reading of their replies are all here; the listener only moves bytes.
#include "link.hpp"

#include <accelpool/agent/wire.hpp>

#include <utility>

namespace accelpool::agent {

namespace json = boost::json;

Error host_lost_error(const std::string& host, const std::string& why) {
  return make_error(Errc::host_lost, "host '" + host + "' lost: " + why);
}

void call(Link& link, std::string_view method, json::object params, ReplyDone done) {
  const std::int64_t id = link.next_id;
  if (link.lost || !link.send(request_line(id, method, std::move(params)), true)) {
    auto err = host_lost_error(link.host, "the agent is not connected");
    link.post([done = std::move(done), err] { done(err, nullptr); });
    return;
  }
  ++link.next_id;
  link.pending.emplace(id, std::move(done));
}

void complete(const std::shared_ptr<Link>& link, const json::value& id, const std::optional<json::value>& result,
              const std::optional<Error>& error) {
  if (!id.is_int64()) return;
  Status s = error ? Status(*error) : Status::ok();
  json::value value = error || !result ? json::value(nullptr) : *result;
  link->post_reply([link, id = id.get_int64(), s = std::move(s), value = std::move(value)]() mutable {
    auto it = link->pending.find(id);
    if (it == link->pending.end()) return;
    ReplyDone done = std::move(it->second);
    link->pending.erase(it);
    done(std::move(s), std::move(value));
  });
}

void end_requests(Link& link, const Error& error) {
  link.lost = true;
  auto pending = std::exchange(link.pending, {});
  for (auto& [id, done] : pending) done(error, nullptr);
}

namespace {

// A release or reset reply: what the device holds afterwards.
ReplyDone loaded_reply(manager::HostDriver::Done done) {
  return [done = std::move(done)](Status s, json::value result) {
    std::string loaded;
    if (result.is_object()) {
      if (auto* l = result.get_object().if_contains("loaded"); l && l->is_string())
        loaded = std::string(l->get_string());
    }
    done(std::move(s), std::move(loaded));
  };
}

}  // namespace

RemoteHost::RemoteHost(std::shared_ptr<Link> link, std::vector<AgentDevice> devices)
    : link_(std::move(link)), name_(link_->host), devices_(std::move(devices)) {}

RemoteHost::~RemoteHost() = default;

Result<std::vector<manager::HostDevice>> RemoteHost::devices() {
  std::vector<manager::HostDevice> out;
  for (const auto& d : devices_) out.push_back(d.device);
  return out;
}

void RemoteHost::prepare(const host::PrepareRequest& request, PrepareDone done) {
  call(*link_, "device.prepare", prepare_request_json(request), [done = std::move(done)](Status s, json::value result) {
    if (!s) return done(std::move(s), host::PrepareResult{});
    auto parsed = parse_prepare_result(result, "device.prepare result");
    if (!parsed) return done(parsed.error(), host::PrepareResult{});
    done(Status::ok(), std::move(*parsed));
  });
}

void RemoteHost::release(const std::string& local_id, Done done) {
  call(*link_, "device.release", json::object{{"device", local_id}}, loaded_reply(std::move(done)));
}

void RemoteHost::reset(const std::string& local_id, Done done) {
  call(*link_, "device.reset", json::object{{"device", local_id}}, loaded_reply(std::move(done)));
}

bool RemoteHost::connected() const {
  std::lock_guard lock(link_->mu);
  return link_->alive;
}

}  // namespace accelpool::agent
