// The client: one I/O thread owns the stream (reads lines, writes queued requests, heartbeats, reconnects), one
// callback thread runs user callbacks. Shared state is guarded by ClientCore::mu; completion handlers of calls run
// on the I/O thread without the lock and never block.
#include <accelpool/common/guest_id.hpp>
#include <accelpool/common/json_lines.hpp>
#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include "lease_json.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>

namespace accelpool::shim {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kMaxLine = 4 * 1024 * 1024;
constexpr int kProtocolVersion = 1;

std::chrono::milliseconds to_ms(Seconds s) {
  return std::chrono::milliseconds(static_cast<long long>(std::max(0.0, s.count()) * 1000.0));
}

// "0.5", "10", "2.25": seconds for messages.
std::string seconds_text(Seconds s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s.count());
  return buf;
}

// The protocol's error object -> Error, with data.code as the code (without one, the JSON-RPC code's first word;
// a word this client does not know becomes "internal" with the word in the message: error_from_wire).
Error rpc_error(const json& err, const std::string& method) {
  std::string code;
  std::string message = "error";
  if (err.is_object()) {
    if (auto m = err.find("message"); m != err.end() && m->is_string()) message = m->get<std::string>();
    if (auto d = err.find("data"); d != err.end() && d->is_object()) {
      if (auto c = d->find("code"); c != d->end() && c->is_string()) code = c->get<std::string>();
    }
    if (code.empty()) {
      const auto rpc = err.find("code");
      code = to_string(rpc != err.end() && rpc->is_number_integer() ? errc_from_rpc(rpc->get<int>()) : Errc::internal);
    }
  }
  return error_from_wire(code, method + ": " + message);
}

std::string default_guest() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "guest";
  return common::guest_id_from(buf);
}

// Writes all of `data`, waiting with poll() until `deadline`. Returns the error text, empty on success.
std::string write_all(const Stream& s, const std::string& data, Clock::time_point deadline) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = stream_write(s, data.data() + off, data.size() - off);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return "write timed out";
    pollfd p{s.fd, POLLOUT, 0};
    poll(&p, 1, static_cast<int>(left));
  }
  return {};
}

// Reads one line (without '\n' or '\r') into `line`, keeping the rest in `buf`. Returns the error text.
std::string read_line(const Stream& s, common::LineBuffer& buf, std::string& line, Clock::time_point deadline) {
  for (;;) {
    if (auto next = buf.next_line()) {
      line = std::move(*next);
      return {};
    }
    if (buf.overflow()) return "line longer than " + std::to_string(kMaxLine) + " bytes";
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return "no answer in time";
    pollfd p{s.fd, POLLIN, 0};
    int pr = poll(&p, 1, static_cast<int>(left));
    if (pr < 0 && errno != EINTR) return std::strerror(errno);
    if (pr <= 0) continue;
    char tmp[65536];
    ssize_t n = stream_read(s, tmp, sizeof tmp);
    if (n == 0) return "the pool closed the connection";
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) {
        if (p.revents & (POLLHUP | POLLERR)) return "the pool closed the connection";
        continue;
      }
      return std::strerror(errno);
    }
    buf.append(std::string_view(tmp, static_cast<std::size_t>(n)));
  }
}

}  // namespace

namespace detail {

struct LeaseSlot {
  std::uint64_t id = 0;
  LeaseInfo info;
  LeaseCallback on_revoking, on_ended;
  bool releasing = false;     // we are giving it back: its end is no surprise, stop heartbeating it
  bool release_done = false;  // the release/cancel finished (or was abandoned)
  Clock::time_point next_heartbeat{};
};

struct AcquireSlot {
  AcquireOptions options;
  std::function<void(std::uint64_t, const Status&)> on_done;
  std::shared_ptr<LeaseSlot> lease;
  bool done = false;
  bool abandoned = false;
  bool taken = false;
  std::optional<Error> error;
  std::optional<Clock::time_point> deadline;
};

struct PendingCall {
  std::string method;
  std::string line;
  bool sent = false;
  Clock::time_point deadline;
  std::function<void(Result<json>)> done;
};

struct ClientCore : std::enable_shared_from_this<ClientCore> {
  ClientOptions options;
  std::vector<PoolUri> uris;  // the pool's managers, as given
  PoolUri uri;                // the one connected last (I/O thread, and connect() before it starts)

  mutable std::mutex mu;
  std::condition_variable cv;
  // Stream state: fd and buffers are touched by the I/O thread only (and by connect() before it starts).
  Stream stream;
  common::LineBuffer rbuf{kMaxLine};
  std::string wbuf;
  bool connected = false;
  bool closing = false;
  bool closed = false;
  bool drop_requested = false;
  std::optional<Error> fatal;  // reconnecting gave up (e.g. the token is no longer accepted)
  std::string last_error;
  std::string obuf;  // lines queued for the I/O thread to write
  int wake_rd = -1, wake_wr = -1;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, PendingCall> calls;
  std::map<std::uint64_t, std::shared_ptr<LeaseSlot>> leases;  // live leases this client holds or waits for
  std::vector<std::shared_ptr<AcquireSlot>> acquires;          // acquires not done yet
  std::string tenant;
  std::uint64_t connections = 0;
  double ttl_s = 0;

  std::thread io_thread;
  std::thread cb_thread;
  std::mutex cb_mu;
  std::condition_variable cb_cv;
  std::deque<std::function<void()>> cb_queue;
  bool cb_stop = false;

  ~ClientCore() {
    close_stream(stream);
    if (wake_rd >= 0) ::close(wake_rd);
    if (wake_wr >= 0) ::close(wake_wr);
  }

  // ---- small helpers -------------------------------------------------------------------------------------

  void wake_io() {
    char c = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_wr, &c, 1);
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(cb_mu);
      if (cb_stop) return;
      cb_queue.push_back(std::move(fn));
    }
    cb_cv.notify_one();
  }

  void cb_main() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(cb_mu);
        cb_cv.wait(lk, [&] { return cb_stop || !cb_queue.empty(); });
        if (cb_queue.empty()) return;
        fn = std::move(cb_queue.front());
        cb_queue.pop_front();
      }
      try {
        fn();
      } catch (...) {
        // A throwing user callback must not end the callback thread.
      }
    }
  }

  Seconds heartbeat_interval() const {
    if (options.heartbeat_interval) return std::max(*options.heartbeat_interval, Seconds(0.05));
    double ttl = ttl_s > 0 ? ttl_s : 30.0;
    return Seconds(std::max(ttl / 3.0, 0.05));
  }

  // Queues a call. `done` runs exactly once: on the I/O thread with the reply, or with an error ("timeout",
  // "unreachable", "disconnected", "closed"). Must be called without `mu` held.
  void call_async(const std::string& method, json params, std::function<void(Result<json>)> done) {
    std::unique_lock<std::mutex> lk(mu);
    if (closed || closing) {
      lk.unlock();
      done(make_error(Errc::closed, method + ": the client is closed"));
      return;
    }
    if (fatal) {
      Error e = *fatal;
      lk.unlock();
      done(e);
      return;
    }
    std::uint64_t id = next_id++;
    PendingCall c;
    c.method = method;
    c.line = json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}}.dump() + "\n";
    c.deadline = Clock::now() + to_ms(options.call_timeout);
    c.done = std::move(done);
    if (connected) {
      obuf += c.line;
      c.sent = true;
    }
    calls.emplace(id, std::move(c));
    lk.unlock();
    wake_io();
  }

  // Blocking call. Must not run on the I/O thread.
  Result<json> call(const std::string& method, json params) {
    auto p = std::make_shared<std::promise<Result<json>>>();
    auto f = p->get_future();
    call_async(method, std::move(params), [p](Result<json> r) { p->set_value(std::move(r)); });
    return f.get();
  }

  // ---- lease bookkeeping (I/O thread, or any thread without `mu`) ----------------------------------------------

  // Called with `mu` held. Marks an acquire done and tells its waiters.
  void complete(const std::shared_ptr<AcquireSlot>& a, std::optional<Error> err) {
    if (a->done) return;
    a->done = true;
    a->error = std::move(err);
    acquires.erase(std::remove(acquires.begin(), acquires.end(), a), acquires.end());
    if (a->on_done) {
      std::uint64_t id = a->lease ? a->lease->id : 0;
      Status st = a->error ? Status(*a->error) : Status::ok();
      auto fn = a->on_done;
      post([fn, id, st] { fn(id, st); });
    }
    cv.notify_all();
  }

  // Applies the server's newest description of a lease: state, callbacks, acquires waiting for it.
  void apply(const LeaseInfo& info) {
    std::lock_guard<std::mutex> lk(mu);
    auto it = leases.find(info.id);
    if (it == leases.end()) return;  // not ours (another client of the same guest) or already ended
    auto slot = it->second;
    LeaseState prev = slot->info.state;
    slot->info = info;
    if (info.state == LeaseState::revoking && prev != LeaseState::revoking && slot->on_revoking && !slot->releasing) {
      auto fn = slot->on_revoking;
      post([fn, info] { fn(info); });
    }
    if (is_terminal(info.state)) {
      leases.erase(it);
      if (!slot->releasing && slot->on_ended) {
        auto fn = slot->on_ended;
        post([fn, info] { fn(info); });
      }
    }
    for (auto& a : std::vector<std::shared_ptr<AcquireSlot>>(acquires)) {
      if (a->lease != slot || a->done) continue;
      if ((info.state == LeaseState::granted || info.state == LeaseState::revoking) && info.ready) {
        complete(a, std::nullopt);
      } else if (is_terminal(info.state)) {
        complete(a, make_error(Errc::ended, "lease " + std::to_string(info.id) + " ended (" + to_string(info.state) +
                                                (info.end_reason.empty() ? "" : ": " + info.end_reason) +
                                                ") before it was granted"));
      }
    }
    cv.notify_all();
  }

  void apply_json(const json& j) {
    auto l = lease_from_json(j);
    if (l) apply(*l);
  }

  void forget(const std::shared_ptr<LeaseSlot>& slot) {
    std::lock_guard<std::mutex> lk(mu);
    slot->release_done = true;
    auto it = leases.find(slot->id);
    if (it != leases.end() && it->second == slot) leases.erase(it);
    cv.notify_all();
  }

  // Gives a lease back without waiting: cancel while queued, release otherwise. Without `mu` held.
  void give_back(const std::shared_ptr<LeaseSlot>& slot) {
    bool queued;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (slot->releasing) return;
      slot->releasing = true;
      queued = slot->info.state == LeaseState::queued;
    }
    auto self = shared_from_this();
    auto release = [self, slot] {
      self->call_async("release", json{{"lease", slot->id}}, [self, slot](Result<json> r) {
        if (r && r->contains("lease")) self->apply_json((*r)["lease"]);
        self->forget(slot);
      });
    };
    if (!queued) {
      release();
      return;
    }
    call_async("cancel", json{{"lease", slot->id}}, [self, slot, release](Result<json> r) {
      if (!r && r.error().code == Errc::invalid_state) {
        release();  // granted in the meantime
        return;
      }
      if (r && r->contains("lease")) self->apply_json((*r)["lease"]);
      self->forget(slot);
    });
  }

  // Asks the server for a lease we lost track of (after a reconnect or a failed heartbeat).
  void refresh(const std::shared_ptr<LeaseSlot>& slot) {
    auto self = shared_from_this();
    call_async("get", json{{"lease", slot->id}}, [self, slot](Result<json> r) {
      if (r && r->contains("lease")) {
        self->apply_json((*r)["lease"]);
      } else if (!r && r.error().code == Errc::not_found) {
        LeaseInfo gone;
        {
          std::lock_guard<std::mutex> lk(self->mu);
          gone = slot->info;
        }
        gone.state = LeaseState::expired;
        gone.end_reason = "the pool no longer knows this lease";
        self->apply(gone);
      }
    });
  }

  // ---- connection -----------------------------------------------------------------------------------------

  // Says hello to the pool's managers in turn, beginning with the one connected last: the first that answers as
  // the leader wins and becomes `uri`. A standby's answer (not_leader) names the leader's address, which is tried
  // next (also when it is not in the list). Touches `s`, `buf` and `uri`. Errors: a refusal for good
  // (unauthorized, unsupported_version) at once; with one manager tried, its error; else "unreachable" (or
  // "not_leader" when only standbys answered) with each manager's reason.
  Result<json> connect_leader(Stream& s, common::LineBuffer& buf) {
    std::vector<PoolUri> order;
    for (std::size_t i = 0; i < uris.size(); ++i) {
      const PoolUri& u = uris[i];
      if (u.text == uri.text)
        order.insert(order.begin(), u);
      else
        order.push_back(u);
    }
    std::vector<std::string> tried;
    std::string reasons;
    bool only_standbys = true;
    std::optional<Error> first;
    for (std::size_t i = 0; i < order.size() && tried.size() < uris.size() + 2; ++i) {
      const PoolUri target = order[i];
      if (std::find(tried.begin(), tried.end(), target.text) != tried.end()) continue;
      tried.push_back(target.text);
      std::string leader;
      auto hello = open_and_hello(target, s, buf, leader);
      if (hello) {
        uri = target;
        return hello;
      }
      const Error& e = hello.error();
      if (e.code == Errc::unauthorized || e.code == Errc::unsupported_version) return e;
      if (!first) first = e;
      if (e.code != Errc::not_leader) only_standbys = false;
      reasons += (reasons.empty() ? "" : "; ") + e.message;
      if (!leader.empty()) {
        if (auto to = parse_pool_uri(leader)) order.insert(order.begin() + static_cast<long>(i) + 1, *to);
      }
    }
    if (tried.size() == 1) return *first;
    return make_error(only_standbys ? Errc::not_leader : Errc::unreachable,
                      "no leading manager among " + std::to_string(tried.size()) + " tried: " + reasons);
  }

  // Opens the stream to `target` and says hello. Returns the hello result; a standby's refusal sets `leader` to
  // the leader's address it names. Touches only `s`, `buf` and `leader`.
  Result<json> open_and_hello(const PoolUri& target, Stream& s, common::LineBuffer& buf, std::string& leader) const {
    auto st = open_stream(target, to_ms(options.connect_timeout),
                          SerialDirs{options.serial_sys_dir, options.serial_dev_dir}, TlsOptions{options.tls_ca_file});
    if (!st) return st.error();
    s = *st;
    buf.reset();
    auto deadline = Clock::now() + to_ms(options.connect_timeout);
    json params{{"protocol", kProtocolVersion}, {"token", options.token}, {"guest", options.guest}};
    if (!options.guest_host.empty()) params["guest_host"] = options.guest_host;
    std::string line = json{{"jsonrpc", "2.0"}, {"id", 0}, {"method", "hello"}, {"params", params}}.dump() + "\n";
    if (auto e = write_all(s, line, deadline); !e.empty()) {
      close_stream(s);
      return make_error(Errc::unreachable, "pool " + target.text + ": sending hello: " + e);
    }
    for (;;) {
      std::string reply;
      if (auto e = read_line(s, buf, reply, deadline); !e.empty()) {
        close_stream(s);
        return make_error(e == "no answer in time" ? Errc::timeout : Errc::unreachable,
                          "pool " + target.text + ": waiting for the answer to hello: " + e);
      }
      json j = json::parse(reply, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        close_stream(s);
        return make_error(Errc::protocol, "pool " + target.text +
                                              ": the answer to hello is not a JSON object: " + reply.substr(0, 200));
      }
      auto id = j.find("id");
      if (id == j.end() || !id->is_number_integer() || id->get<long long>() != 0) continue;  // not our answer
      if (auto err = j.find("error"); err != j.end()) {
        close_stream(s);
        Error e = rpc_error(*err, "hello");
        if (e.code == Errc::unauthorized) e.message = "pool " + target.text + " refused the token: " + e.message;
        if (e.code == Errc::not_leader) {
          e.message = "pool " + target.text + ": " + e.message;
          if (auto d = err->find("data"); d != err->end() && d->is_object()) {
            if (auto l = d->find("leader"); l != d->end() && l->is_string()) leader = l->get<std::string>();
          }
        }
        return e;
      }
      auto res = j.find("result");
      if (res == j.end() || !res->is_object()) {
        close_stream(s);
        return make_error(Errc::protocol, "pool " + target.text + ": hello answered without a result");
      }
      return *res;
    }
  }

  // I/O thread: the stream dropped. Fails the calls that were in flight on it.
  void disconnect(const std::string& why) {
    close_stream(stream);
    rbuf.reset();
    wbuf.clear();
    std::vector<std::function<void(Result<json>)>> failed;
    std::vector<std::string> methods;
    {
      std::lock_guard<std::mutex> lk(mu);
      connected = false;
      last_error = why;
      obuf.clear();
      for (auto it = calls.begin(); it != calls.end();) {
        if (it->second.sent) {
          failed.push_back(std::move(it->second.done));
          methods.push_back(it->second.method);
          it = calls.erase(it);
        } else {
          ++it;
        }
      }
      cv.notify_all();
    }
    for (std::size_t i = 0; i < failed.size(); ++i) {
      failed[i](make_error(Errc::disconnected, methods[i] + ": the stream to pool " + uri.text + " dropped (" + why +
                                                   ") before the answer came; its outcome is unknown"));
    }
  }

  // I/O thread: a (re)connection succeeded. Resumes our leases.
  void connected_now(const json& hello) {
    std::vector<LeaseInfo> live;
    if (auto ls = hello.find("leases"); ls != hello.end() && ls->is_array()) {
      for (const auto& j : *ls) {
        if (auto l = lease_from_json(j)) live.push_back(*l);
      }
    }
    std::vector<std::shared_ptr<LeaseSlot>> missing;
    {
      std::lock_guard<std::mutex> lk(mu);
      connected = true;
      ++connections;
      if (auto t = hello.find("tenant"); t != hello.end() && t->is_string()) tenant = t->get<std::string>();
      for (auto& [id, c] : calls) {
        if (!c.sent) {
          obuf += c.line;
          c.sent = true;
        }
      }
      for (auto& [id, slot] : leases) {
        slot->next_heartbeat = Clock::now();
        bool found = std::any_of(live.begin(), live.end(), [&](const LeaseInfo& l) { return l.id == id; });
        if (!found) missing.push_back(slot);
      }
      cv.notify_all();
    }
    for (const auto& l : live) apply(l);
    for (const auto& s : missing) refresh(s);
  }

  void handle_line(const std::string& line) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::lock_guard<std::mutex> lk(mu);
      last_error = "the pool sent a line that is not a JSON object: " + line.substr(0, 200);
      return;
    }
    auto id = j.find("id");
    if (id != j.end() && !id->is_null()) {
      if (!id->is_number_unsigned()) return;  // not one of ours
      std::function<void(Result<json>)> done;
      std::string method;
      {
        std::lock_guard<std::mutex> lk(mu);
        auto it = calls.find(id->get<std::uint64_t>());
        if (it == calls.end()) return;  // timed out earlier
        done = std::move(it->second.done);
        method = it->second.method;
        calls.erase(it);
      }
      if (auto err = j.find("error"); err != j.end()) {
        done(rpc_error(*err, method));
      } else if (auto res = j.find("result"); res != j.end()) {
        done(*res);
      } else {
        done(make_error(Errc::protocol, method + ": the answer has neither result nor error"));
      }
      return;
    }
    auto m = j.find("method");
    if (m == j.end() || !m->is_string()) return;
    std::string method = m->get<std::string>();
    if (method.rfind("lease.", 0) != 0) return;  // notifications this client does not know are ignored
    auto p = j.find("params");
    if (p == j.end() || !p->is_object() || !p->contains("lease")) return;
    apply_json((*p)["lease"]);
  }

  // I/O thread: deadlines of calls and acquires, heartbeats.
  void run_timers() {
    auto now = Clock::now();
    std::vector<std::pair<std::function<void(Result<json>)>, Error>> expired;
    std::vector<std::shared_ptr<LeaseSlot>> to_give_back, to_heartbeat;
    {
      std::lock_guard<std::mutex> lk(mu);
      for (auto it = calls.begin(); it != calls.end();) {
        if (it->second.deadline <= now) {
          Error e = connected ? make_error(Errc::timeout, it->second.method + ": no answer from pool " + uri.text +
                                                              " within " + seconds_text(options.call_timeout) + " s")
                              : make_error(Errc::unreachable, it->second.method + ": pool " + uri.text +
                                                                  " is unreachable (" + last_error + ")");
          expired.emplace_back(std::move(it->second.done), e);
          it = calls.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& a : std::vector<std::shared_ptr<AcquireSlot>>(acquires)) {
        if (a->done || !a->deadline || *a->deadline > now) continue;
        a->abandoned = true;
        complete(a, make_error(Errc::timeout,
                               "acquire " + a->options.kind +
                                   (a->options.bitstream.empty() ? "" : " with " + a->options.bitstream) +
                                   ": not granted within " + seconds_text(a->options.timeout.value_or(Seconds(0))) +
                                   " s; the request was given up"));
        if (a->lease) to_give_back.push_back(a->lease);
      }
      if (connected) {
        auto interval = std::chrono::duration_cast<Clock::duration>(heartbeat_interval());
        for (auto& [id, slot] : leases) {
          if (slot->releasing || slot->next_heartbeat > now) continue;
          slot->next_heartbeat = now + interval;
          to_heartbeat.push_back(slot);
        }
      }
    }
    for (auto& [fn, e] : expired) fn(e);
    for (auto& s : to_give_back) give_back(s);
    auto self = shared_from_this();
    for (auto& s : to_heartbeat) {
      call_async("heartbeat", json{{"lease", s->id}}, [self, s](Result<json> r) {
        if (r) {
          if (auto ls = r->find("leases"); ls != r->end() && ls->is_array()) {
            for (const auto& j : *ls) self->apply_json(j);
          }
        } else if (r.error().code == Errc::not_found || r.error().code == Errc::invalid_state) {
          self->refresh(s);
        }
      });
    }
  }

  void io_main() {
    auto backoff = std::chrono::milliseconds(50);
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (closing) break;
      }
      if (stream.fd < 0) {
        bool give_up;
        {
          std::lock_guard<std::mutex> lk(mu);
          give_up = !options.reconnect || fatal.has_value();
          if (!options.reconnect && !fatal) {
            fatal = make_error(Errc::disconnected, "the stream to pool " + uri.text + " dropped (" + last_error +
                                                       ") and reconnecting is disabled");
          }
        }
        if (!give_up) {
          Stream s;
          common::LineBuffer buf{kMaxLine};
          auto hello = connect_leader(s, buf);
          if (hello) {
            stream = s;
            rbuf = std::move(buf);
            backoff = std::chrono::milliseconds(50);
            connected_now(*hello);
            continue;
          }
          std::lock_guard<std::mutex> lk(mu);
          last_error = hello.error().message;
          if (hello.error().code == Errc::unauthorized || hello.error().code == Errc::unsupported_version)
            fatal = hello.error();
        }
        run_timers();
        fail_all_if_fatal();
        pollfd p{wake_rd, POLLIN, 0};
        poll(&p, 1, static_cast<int>(give_up ? 100 : backoff.count()));
        drain_wake();
        backoff = std::min(backoff * 2, std::max(std::chrono::milliseconds(50), to_ms(options.reconnect_max_backoff)));
        continue;
      }
      bool drop;
      {
        std::lock_guard<std::mutex> lk(mu);
        wbuf += obuf;
        obuf.clear();
        drop = drop_requested;
        drop_requested = false;
      }
      if (drop) {
        disconnect("dropped on request");
        continue;
      }
      pollfd fds[2] = {{stream.fd, static_cast<short>(POLLIN | (wbuf.empty() ? 0 : POLLOUT)), 0}, {wake_rd, POLLIN, 0}};
      int pr = poll(fds, 2, 50);
      if (pr < 0 && errno != EINTR) {
        disconnect(std::strerror(errno));
        continue;
      }
      if (fds[1].revents & POLLIN) drain_wake();
      if (!wbuf.empty() && (fds[0].revents & POLLOUT)) {
        ssize_t n = stream_write(stream, wbuf.data(), wbuf.size());
        if (n > 0) {
          wbuf.erase(0, static_cast<std::size_t>(n));
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          disconnect(std::string("write: ") + std::strerror(errno));
          continue;
        }
      }
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        char tmp[65536];
        ssize_t n = stream_read(stream, tmp, sizeof tmp);
        if (n == 0) {
          disconnect("the pool closed the connection");
          continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          disconnect(std::string("read: ") + std::strerror(errno));
          continue;
        }
        if (n > 0) rbuf.append(std::string_view(tmp, static_cast<std::size_t>(n)));
        while (auto line = rbuf.next_line()) handle_line(*line);
        if (rbuf.overflow()) {
          disconnect("the pool sent a line longer than " + std::to_string(kMaxLine) + " bytes");
          continue;
        }
      }
      run_timers();
    }
    close_stream(stream);
  }

  void drain_wake() {
    char tmp[256];
    while (::read(wake_rd, tmp, sizeof tmp) > 0) {
    }
  }

  // With reconnecting given up, nothing queued can ever be answered.
  void fail_all_if_fatal() {
    std::vector<std::function<void(Result<json>)>> failed;
    Error e;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!fatal) return;
      e = *fatal;
      for (auto& [id, c] : calls) failed.push_back(std::move(c.done));
      calls.clear();
      for (auto& a : std::vector<std::shared_ptr<AcquireSlot>>(acquires)) complete(a, e);
    }
    for (auto& f : failed) f(e);
  }

  // Releases what is still held (in parallel, bounded by the call timeout), then stops both threads.
  void close() {
    std::vector<std::shared_ptr<LeaseSlot>> held;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (closed) return;
      for (auto& a : std::vector<std::shared_ptr<AcquireSlot>>(acquires)) {
        a->abandoned = true;
        complete(a, make_error(Errc::closed, "the client was closed"));
      }
      for (auto& [id, s] : leases) held.push_back(s);
    }
    for (auto& s : held) give_back(s);
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait_until(lk, Clock::now() + to_ms(options.call_timeout), [&] {
        return std::all_of(held.begin(), held.end(), [](const auto& s) { return s->release_done; });
      });
      closing = true;
    }
    wake_io();
    if (io_thread.joinable()) io_thread.join();
    std::vector<std::function<void(Result<json>)>> failed;
    {
      std::lock_guard<std::mutex> lk(mu);
      closed = true;
      connected = false;
      for (auto& [id, c] : calls) failed.push_back(std::move(c.done));
      calls.clear();
      for (auto& [id, s] : leases) s->release_done = true;
      leases.clear();
      cv.notify_all();
    }
    for (auto& f : failed) f(make_error(Errc::closed, "the client was closed"));
    {
      std::lock_guard<std::mutex> lk(cb_mu);
      cb_stop = true;
    }
    cb_cv.notify_all();
    if (cb_thread.joinable() && cb_thread.get_id() != std::this_thread::get_id()) cb_thread.join();
  }
};

}  // namespace detail

using detail::AcquireSlot;
using detail::ClientCore;
using detail::LeaseSlot;

// ---- Lease ------------------------------------------------------------------------------------------------------

Lease::Lease(std::shared_ptr<ClientCore> core, std::shared_ptr<LeaseSlot> slot)
    : core_(std::move(core)), slot_(std::move(slot)) {}

Lease::Lease(Lease&& o) noexcept : core_(std::move(o.core_)), slot_(std::move(o.slot_)) {}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    (void)release();
    core_ = std::move(o.core_);
    slot_ = std::move(o.slot_);
  }
  return *this;
}

Lease::~Lease() { (void)release(); }

std::uint64_t Lease::id() const { return slot_ ? slot_->id : 0; }

LeaseInfo Lease::info() const {
  if (!slot_) return {};
  std::lock_guard<std::mutex> lk(core_->mu);
  return slot_->info;
}

LeaseState Lease::state() const {
  if (!slot_) return LeaseState::unknown;
  std::lock_guard<std::mutex> lk(core_->mu);
  return slot_->info.state;
}

void Lease::on_revoking(LeaseCallback cb) {
  if (!slot_) return;
  std::lock_guard<std::mutex> lk(core_->mu);
  slot_->on_revoking = cb;
  if (cb && slot_->info.state == LeaseState::revoking && !slot_->releasing) {
    LeaseInfo info = slot_->info;
    core_->post([cb, info] { cb(info); });
  }
}

void Lease::on_ended(LeaseCallback cb) {
  if (!slot_) return;
  std::lock_guard<std::mutex> lk(core_->mu);
  slot_->on_ended = std::move(cb);
}

Status Lease::wait_ready(std::optional<Seconds> timeout) {
  if (!slot_) return make_error(Errc::invalid_state, "no lease");
  std::unique_lock<std::mutex> lk(core_->mu);
  auto ready = [&] {
    const auto& i = slot_->info;
    return is_terminal(i.state) || core_->closed ||
           ((i.state == LeaseState::granted || i.state == LeaseState::revoking) && i.ready);
  };
  if (timeout) {
    if (!core_->cv.wait_for(lk, to_ms(*timeout), ready)) {
      return make_error(Errc::timeout,
                        "lease " + std::to_string(slot_->id) + " not ready within " + seconds_text(*timeout) + " s");
    }
  } else {
    core_->cv.wait(lk, ready);
  }
  if (core_->closed) return make_error(Errc::closed, "the client was closed");
  if (is_terminal(slot_->info.state)) {
    return make_error(Errc::ended,
                      "lease " + std::to_string(slot_->id) + " ended (" + to_string(slot_->info.state) + ")");
  }
  return Status::ok();
}

Status Lease::release() {
  if (!slot_) return Status::ok();
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    if (slot_->release_done) return Status::ok();
    if (core_->closed) return make_error(Errc::closed, "the client was closed");
    if (is_terminal(slot_->info.state)) {
      slot_->release_done = true;
      return Status::ok();
    }
    slot_->releasing = true;
  }
  Status result = Status::ok();
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto r = core_->call("release", nlohmann::json{{"lease", slot_->id}});
    if (r) {
      if (r->contains("lease")) core_->apply_json((*r)["lease"]);
      break;
    }
    const auto& code = r.error().code;
    if (code == Errc::disconnected && attempt == 0) continue;  // the pool keeps leases across reconnects: ask again
    if (code == Errc::not_found || code == Errc::invalid_state) break;  // already ended
    result = r.error();
    break;
  }
  core_->forget(slot_);
  return result;
}

// ---- PendingAcquire ------------------------------------------------------------------------------------------------

PendingAcquire::PendingAcquire(PendingAcquire&& o) noexcept
    : core_(std::move(o.core_)), slot_(std::move(o.slot_)), taken_(o.taken_) {}

PendingAcquire& PendingAcquire::operator=(PendingAcquire&& o) noexcept {
  if (this != &o) {
    if (slot_ && !taken_) (void)cancel();
    core_ = std::move(o.core_);
    slot_ = std::move(o.slot_);
    taken_ = o.taken_;
  }
  return *this;
}

PendingAcquire::~PendingAcquire() {
  if (slot_ && !taken_) (void)cancel();
}

std::uint64_t PendingAcquire::lease_id() const {
  if (!slot_) return 0;
  std::lock_guard<std::mutex> lk(core_->mu);
  return slot_->lease ? slot_->lease->id : 0;
}

bool PendingAcquire::done() const {
  if (!slot_) return true;
  std::lock_guard<std::mutex> lk(core_->mu);
  return slot_->done;
}

Result<Lease> PendingAcquire::wait(std::optional<Seconds> timeout) {
  if (!slot_) return make_error(Errc::invalid_state, "no acquire in progress");
  std::unique_lock<std::mutex> lk(core_->mu);
  if (timeout) {
    if (!core_->cv.wait_for(lk, to_ms(*timeout), [&] { return slot_->done; })) {
      return make_error(Errc::timeout,
                        "acquire " + slot_->options.kind + " still pending after " + seconds_text(*timeout) + " s");
    }
  } else {
    core_->cv.wait(lk, [&] { return slot_->done; });
  }
  if (slot_->error) return *slot_->error;
  if (slot_->taken) return make_error(Errc::invalid_state, "the lease was already taken from this acquire");
  slot_->taken = true;
  taken_ = true;
  return Lease(core_, slot_->lease);
}

Status PendingAcquire::cancel() {
  if (!slot_) return Status::ok();
  std::shared_ptr<LeaseSlot> give;
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    if (slot_->taken) return make_error(Errc::invalid_state, "the lease was already taken; release it instead");
    slot_->abandoned = true;
    if (!slot_->done) {
      core_->complete(slot_, make_error(Errc::cancelled, "acquire " + slot_->options.kind + " was cancelled"));
    } else if (!slot_->error) {
      slot_->error = make_error(Errc::cancelled, "acquire " + slot_->options.kind + " was cancelled");
    }
    slot_->taken = true;
    taken_ = true;
    give = slot_->lease;
  }
  if (give) core_->give_back(give);
  return Status::ok();
}

// ---- Client ---------------------------------------------------------------------------------------------------------

Client::Client(std::shared_ptr<ClientCore> core) : core_(std::move(core)) {}

Client::~Client() {
  if (core_) core_->close();
}

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  auto uris = parse_pool_uris(options.uri);
  if (!uris) return uris.error();
  if (options.guest.empty()) options.guest = default_guest();
  if (!common::valid_guest_id(options.guest)) {
    return make_error(Errc::invalid_argument, "guest id '" + options.guest + "' must be " + common::kGuestIdSyntax);
  }
  if (options.token.empty()) return make_error(Errc::unauthorized, "no token given for pool " + options.uri);
  auto core = std::make_shared<ClientCore>();
  core->options = std::move(options);
  core->uris = *uris;
  core->uri = core->uris.front();
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
    return make_error(Errc::internal, std::string("pipe: ") + std::strerror(errno));
  core->wake_rd = p[0];
  core->wake_wr = p[1];
  Stream s;
  common::LineBuffer buf{kMaxLine};
  auto hello = core->connect_leader(s, buf);
  if (!hello) return hello.error();
  core->stream = s;
  core->rbuf = std::move(buf);
  core->connected_now(*hello);
  core->io_thread = std::thread([c = core.get()] { c->io_main(); });
  core->cb_thread = std::thread([c = core.get()] { c->cb_main(); });
  return std::unique_ptr<Client>(new Client(core));
}

PendingAcquire Client::acquire_async(const AcquireOptions& options,
                                     std::function<void(std::uint64_t, const Status&)> on_done) {
  PendingAcquire p;
  p.core_ = core_;
  auto slot = std::make_shared<AcquireSlot>();
  slot->options = options;
  slot->on_done = std::move(on_done);
  p.slot_ = slot;
  std::optional<Error> bad;
  if (options.kind.empty()) bad = make_error(Errc::invalid_argument, "acquire: 'kind' is required");
  if (options.count == 0) bad = make_error(Errc::invalid_argument, "acquire: 'count' must be at least 1");
  if (options.timeout && options.timeout->count() < 0)
    bad = make_error(Errc::invalid_argument, "acquire: 'timeout' must be >= 0");
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    core_->acquires.push_back(slot);
    if (options.timeout) slot->deadline = Clock::now() + to_ms(*options.timeout);
    if (bad) {
      core_->complete(slot, bad);
      return p;
    }
  }
  nlohmann::json params{{"kind", options.kind}, {"count", options.count}};
  if (!options.bitstream.empty()) params["bitstream"] = options.bitstream;
  if (options.estimate_s) params["estimate_s"] = *options.estimate_s;
  if (!options.label.empty()) params["label"] = options.label;
  auto core = core_;
  core_->call_async("acquire", std::move(params), [core, slot](Result<nlohmann::json> r) {
    if (!r) {
      std::lock_guard<std::mutex> lk(core->mu);
      core->complete(slot, r.error());
      return;
    }
    auto info = r->contains("lease")
                    ? lease_from_json((*r)["lease"])
                    : Result<LeaseInfo>(make_error(Errc::protocol, "acquire answered without a lease"));
    if (!info) {
      std::lock_guard<std::mutex> lk(core->mu);
      core->complete(slot, info.error());
      return;
    }
    auto ls = std::make_shared<LeaseSlot>();
    ls->id = info->id;
    ls->info = *info;
    ls->on_revoking = slot->options.on_revoking;
    ls->on_ended = slot->options.on_ended;
    bool abandoned;
    {
      std::lock_guard<std::mutex> lk(core->mu);
      if (info->expires_at > info->created_at && info->created_at > 0)
        core->ttl_s = info->expires_at - info->created_at;
      ls->next_heartbeat = Clock::now() + std::chrono::duration_cast<Clock::duration>(core->heartbeat_interval());
      slot->lease = ls;
      abandoned = slot->abandoned;
      if (!is_terminal(info->state)) core->leases[ls->id] = ls;
      if (!abandoned) {
        if ((info->state == LeaseState::granted || info->state == LeaseState::revoking) && info->ready) {
          core->complete(slot, std::nullopt);
        } else if (is_terminal(info->state)) {
          core->complete(slot, make_error(Errc::ended, "lease " + std::to_string(info->id) + " ended at once (" +
                                                           to_string(info->state) + ")"));
        }
      }
    }
    if (abandoned && !is_terminal(info->state)) core->give_back(ls);
  });
  return p;
}

Result<Lease> Client::acquire(const AcquireOptions& options) {
  auto p = acquire_async(options);
  return p.wait();
}

Result<LeaseInfo> Client::get(std::uint64_t lease) {
  auto r = core_->call("get", nlohmann::json{{"lease", lease}});
  if (!r) return r.error();
  if (!r->contains("lease")) return make_error(Errc::protocol, "get answered without a lease");
  auto l = lease_from_json((*r)["lease"]);
  if (l) core_->apply(*l);
  return l;
}

Result<std::vector<LeaseInfo>> Client::list() {
  auto r = core_->call("list", nlohmann::json::object());
  if (!r) return r.error();
  std::vector<LeaseInfo> out;
  auto ls = r->find("leases");
  if (ls == r->end() || !ls->is_array()) return make_error(Errc::protocol, "list answered without 'leases'");
  for (const auto& j : *ls) {
    auto l = lease_from_json(j);
    if (!l) return l.error();
    out.push_back(*l);
  }
  return out;
}

std::string Client::tenant() const {
  std::lock_guard<std::mutex> lk(core_->mu);
  return core_->tenant;
}

std::uint64_t Client::connections() const {
  std::lock_guard<std::mutex> lk(core_->mu);
  return core_->connections;
}

bool Client::connected() const {
  std::lock_guard<std::mutex> lk(core_->mu);
  return core_->connected;
}

void Client::drop_connection_for_testing() {
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    core_->drop_requested = true;
  }
  core_->wake_io();
}

}  // namespace accelpool::shim
