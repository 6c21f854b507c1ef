#include "relay.hpp"
#include "manager_list.hpp"

#include <accelpool/agent/wire.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <thread>

namespace accelpool::agent {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kMaxBuffered = 4 * 1024 * 1024;  // per direction: a side that stops reading is not read for

// Reads what is available, at most up to `limit` bytes in `out`. Returns false at end of stream or on an error.
bool read_into(int fd, std::string& out, std::size_t limit) {
  char buf[65536];
  while (out.size() < limit) {
    ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), limit - out.size()), 0);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == EINTR) continue;
    return false;
  }
  return true;
}

// The relay's address of the guest listener a standby names as the leader's (`tcp://HOST:PORT`): "HOST:PORT";
// "" for any other (a `tls://` listener, which the relay's plain connection cannot speak).
std::string plain_address(const std::string& leader) {
  const std::string tcp = "tcp://";
  return leader.rfind(tcp, 0) == 0 ? leader.substr(tcp.size()) : "";
}

// One VM's port and its manager connection.
struct Link {
  enum class State { idle, handshake, relaying };
  RelayTarget target;
  ManagerList managers;  // which manager this link connects to (next)
  Link(RelayTarget t, ManagerList m) : target(std::move(t)), managers(std::move(m)) {}
  State state = State::idle;
  int guest_fd = -1;
  int manager_fd = -1;
  std::string to_guest, to_manager;
  std::string handshake_in;  // the manager's answer to `relay`, until its newline
  Clock::time_point next_attempt{};
  Clock::time_point handshake_deadline{};
  std::chrono::milliseconds backoff{0};
  bool refused_logged = false;
  bool connect_logged = false;
};

class RelayImpl final : public Relay {
 public:
  RelayImpl(RelayOptions o, RelayTargets t, RelayLog l)
      : opt_(std::move(o)), targets_(std::move(t)), log_(std::move(l)) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }

  ~RelayImpl() override {
    stop_ = true;
    rescan();
    if (thread_.joinable()) thread_.join();
    for (auto& [vm, link] : links_) close_link(link);
    ::close(wake_fd_);
  }

  void begin() {
    thread_ = std::thread([this] { loop(); });
  }

  void rescan() override {
    rescan_ = true;
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

 private:
  void loop() {
    auto next_scan = Clock::now();
    while (!stop_) {
      auto now = Clock::now();
      if (rescan_.exchange(false) || now >= next_scan) {
        scan();
        next_scan = Clock::now() + opt_.scan_interval;
      }
      for (auto& [vm, link] : links_) advance(link);

      std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
      std::vector<std::pair<Link*, bool>> owners{{nullptr, false}};  // (link, is the guest side)
      // A side is read while the other side's buffer has room, and written while its own buffer holds bytes.
      auto watch = [&](Link& link, int fd, const std::string& read_into, const std::string& write_from, bool guest) {
        if (fd < 0) return;
        short ev =
            static_cast<short>((read_into.size() < kMaxBuffered ? POLLIN : 0) | (write_from.empty() ? 0 : POLLOUT));
        fds.push_back({fd, ev, 0});
        owners.emplace_back(&link, guest);
      };
      for (auto& [vm, link] : links_) {
        watch(link, link.manager_fd, link.to_guest, link.to_manager, false);
        watch(link, link.guest_fd, link.to_manager, link.to_guest, true);
      }
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_scan - Clock::now()).count();
      ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<std::int64_t>(wait, 1, 100)));
      if (fds[0].revents & POLLIN) {
        std::uint64_t n;
        [[maybe_unused]] auto r = ::read(wake_fd_, &n, sizeof(n));
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        Link& link = *owners[i].first;
        if (fds[i].revents == 0) continue;
        if (owners[i].second ? link.guest_fd != fds[i].fd : link.manager_fd != fds[i].fd) continue;  // closed meanwhile
        pump(link, owners[i].second);
      }
    }
  }

  void log(const std::string& m) {
    if (log_) log_(m);
  }

  void scan() {
    auto found = targets_();
    if (!found) {
      log("relay: cannot list VMs: " + found.error().message);
      return;
    }
    std::map<std::string, RelayTarget> now;
    for (auto& t : *found) now[t.vm] = t;
    for (auto it = links_.begin(); it != links_.end();) {
      auto n = now.find(it->first);
      if (n == now.end() || n->second.socket != it->second.target.socket) {
        if (it->second.state != Link::State::idle) log("relay: VM '" + it->first + "' is gone; link closed");
        close_link(it->second);
        it = links_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [vm, t] : now) {
      if (links_.count(vm)) continue;
      Link l(t, ManagerList(opt_.managers));
      l.backoff = opt_.reconnect_min;
      l.next_attempt = Clock::now();
      links_.emplace(vm, std::move(l));
      log("relay: VM '" + vm + "' has the guest channel at " + t.socket);
    }
  }

  void close_link(Link& l) {
    if (l.guest_fd >= 0) ::close(l.guest_fd);
    if (l.manager_fd >= 0) ::close(l.manager_fd);
    l.guest_fd = l.manager_fd = -1;
    l.to_guest.clear();
    l.to_manager.clear();
    l.handshake_in.clear();
    l.state = Link::State::idle;
  }

  // Closes both sides and tries again after the backoff, which doubles each time.
  void drop(Link& l, const std::string& why, std::chrono::milliseconds at_least = std::chrono::milliseconds(0)) {
    if (!why.empty()) log("relay: VM '" + l.target.vm + "': " + why);
    close_link(l);
    auto wait = std::max(l.backoff, at_least);
    l.next_attempt = Clock::now() + wait;
    l.backoff = std::min(l.backoff * 2, opt_.reconnect_max);
  }

  // As drop(), for a manager connection that failed, ended or was refused: the next attempt goes to `leader` (the
  // leader's address a standby named, at once) or to the next manager of the list (after the backoff).
  void drop_manager(Link& l, const std::string& why, const std::string& leader = "",
                    std::chrono::milliseconds at_least = std::chrono::milliseconds(0)) {
    if (!l.managers.advance(leader)) return drop(l, why, at_least);
    if (!why.empty()) log("relay: VM '" + l.target.vm + "': " + why);
    close_link(l);
    l.next_attempt = Clock::now();
  }

  void advance(Link& l) {
    auto now = Clock::now();
    if (l.state == Link::State::idle && now >= l.next_attempt) {
      // The manager first: the guest sees its host side connected only once the manager has accepted the relay.
      auto fd = connect_to(l.managers.current());
      if (!fd) {
        if (!l.connect_logged) log("relay: VM '" + l.target.vm + "': manager: " + fd.error().message);
        l.connect_logged = true;
        drop_manager(l, "");
        return;
      }
      l.connect_logged = false;
      l.manager_fd = *fd;
      l.to_manager = announcement(l);
      l.state = Link::State::handshake;
      l.handshake_deadline = now + opt_.handshake_timeout;
      return;
    }
    if (l.state == Link::State::handshake && now >= l.handshake_deadline) {
      drop_manager(l, "the manager at " + l.managers.current() + " did not answer the relay announcement within " +
                          std::to_string(opt_.handshake_timeout.count()) + " ms");
    }
  }

  // The announcement that pins the manager connection to the VM (the first line on it).
  std::string announcement(const Link& l) const {
    return request_line(1, "relay", json::object{{"token", opt_.token}, {"host", opt_.host}, {"vm", l.target.vm}});
  }

  void pump(Link& l, bool guest_side) {
    int fd = guest_side ? l.guest_fd : l.manager_fd;
    std::string& in = guest_side ? l.to_manager : (l.state == Link::State::handshake ? l.handshake_in : l.to_guest);
    std::string& out = guest_side ? l.to_guest : l.to_manager;
    if (!out.empty()) {
      if (auto s = write_some(fd, out); !s) {
        if (guest_side) return drop(l, "guest side: " + s.error().message);
        return drop_manager(l, "manager side: " + s.error().message);
      }
    }
    bool open = read_into(fd, in, kMaxBuffered);
    if (!guest_side && l.state == Link::State::handshake) {
      if (!finish_handshake(l)) return;
    }
    if (open) return;
    if (guest_side) return drop(l, "the VM's port closed the connection; reconnecting");
    drop_manager(l, "the manager at " + l.managers.current() + " closed the connection; reconnecting");
  }

  // Returns false when the link was dropped.
  bool finish_handshake(Link& l) {
    auto nl = l.handshake_in.find('\n');
    if (nl == std::string::npos) {
      if (l.handshake_in.size() > 64 * 1024) {
        drop_manager(l, "the manager's answer to the relay announcement is too long");
        return false;
      }
      return true;
    }
    std::string line = l.handshake_in.substr(0, nl);
    std::string rest = l.handshake_in.substr(nl + 1);
    l.handshake_in.clear();
    auto m = parse_message(line);
    if (!m) {
      drop_manager(l, "the manager's answer to the relay announcement: " + m.error().message);
      return false;
    }
    if (m->error && m->error->code == Errc::not_leader) {
      // A standby of a shared store: it names the leader's guest listener (none while nobody leads).
      const std::string named = standby_names_leader(line);
      const std::string leader = plain_address(named);
      std::string why = "the manager at " + l.managers.current() + " is a standby; ";
      if (named.empty())
        why += "no manager leads yet";
      else if (leader.empty())
        why += "the leader at " + named + " is not a plain guest listener; trying the list";
      else
        why += "the leader is at " + leader;
      drop_manager(l, why, leader);
      return false;
    }
    if (m->error) {
      bool refused = m->error->code == Errc::unauthorized;
      const bool say = !refused || !l.refused_logged;
      drop_manager(l, say ? "relay refused by the manager: " + m->error->message : "", "", opt_.reconnect_max);
      l.refused_logged = refused;
      return false;
    }
    auto g = connect_to("unix:" + l.target.socket);
    if (!g) {
      drop(l, "the VM's port: " + g.error().message);
      return false;
    }
    l.guest_fd = *g;
    l.to_guest = std::move(rest);
    l.state = Link::State::relaying;
    l.backoff = opt_.reconnect_min;
    l.refused_logged = false;
    log("relay: VM '" + l.target.vm + "' connected to the manager at " + l.managers.current());
    return true;
  }

  RelayOptions opt_;
  RelayTargets targets_;
  RelayLog log_;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> rescan_{false};
  std::map<std::string, Link> links_;  // relay thread only
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Relay>> Relay::start(RelayOptions options, RelayTargets targets, RelayLog log) {
  if (options.managers.empty()) return make_error(Errc::invalid_argument, "relay: no manager's guest address");
  for (std::size_t i = 0; i < options.managers.size(); ++i)
    if (options.managers[i].empty())
      return make_error(Errc::invalid_argument, "relay: manager address " + std::to_string(i + 1) + " is empty");
  if (options.token.empty()) return make_error(Errc::invalid_argument, "relay: the agent token is empty");
  if (options.host.empty()) return make_error(Errc::invalid_argument, "relay: the host name is empty");
  if (!targets) return make_error(Errc::invalid_argument, "relay: no way to list VMs");
  auto r = std::make_unique<RelayImpl>(std::move(options), std::move(targets), std::move(log));
  r->begin();
  return std::unique_ptr<Relay>(std::move(r));
}

}  // namespace accelpool::agent
