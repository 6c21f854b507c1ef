// accelpool-guestd: the guest daemon. Owns the one stream to the pool (the VM's virtio-serial port) and serves
// the guest's programs on a local Unix socket, multiplexing their guest-protocol calls over that stream. See
// docs/guest-guide.md, "The guest daemon".
//
// One thread, one poll loop. Every request a program sends gets a fresh id on the port; the reply goes back to
// that program under its own id. Lease notifications go to the program whose call returned the lease (all
// programs that said hello when nobody owns it). When the port's host side goes away, calls in flight fail with
// `disconnected`; when it comes back, each program's last hello is sent again, so its session (and the
// notifications of its leases) resume without the program noticing more than the failed calls.
#include <accelpool/common/cli.hpp>
#include <accelpool/common/errors.hpp>
#include <accelpool/common/json_lines.hpp>
#include <accelpool/shim/transport.hpp>

#include <nlohmann/json.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace accelpool::shim;
using json = nlohmann::json;
using accelpool::Errc;
using accelpool::common::LineBuffer;
using Clock = std::chrono::steady_clock;

constexpr const char* kDescription = R"(accelpool-guestd: the guest daemon of accelpool.

Owns the stream to the pool (by default the virtio-serial port org.accelpool.guest.0) and serves the
guest's programs on a Unix socket, multiplexing their calls over the one stream. Programs reach it with
ACCELPOOL_POOL=unix:///run/accelpool/guest.sock (the default of accelpool-run and the library when that
socket exists). Stops on SIGTERM or SIGINT.)";

constexpr std::size_t kMaxLine = 64 * 1024;               // as the guest protocol
constexpr std::size_t kMaxClientQueue = 4 * 1024 * 1024;  // a program that does not read is disconnected
constexpr std::size_t kMaxWaitingLines = 1024;            // calls held while the port is down, per program
constexpr std::chrono::milliseconds kRetryMin{100}, kRetryMax{1000};

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

// The JSON-RPC error of `code`, with its number and word from the table of errors.hpp.
std::string error_line(const json& id, Errc code, const std::string& message) {
  return json{{"jsonrpc", "2.0"},
              {"id", id},
              {"error", {{"code", rpc_code(code)}, {"message", message}, {"data", {{"code", to_string(code)}}}}}}
             .dump() +
         "\n";
}

// Reads what is available. Returns false at end of stream or on an error.
bool read_available(int fd, LineBuffer& into) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(std::string_view(buf, static_cast<std::size_t>(n)));
      if (n < static_cast<ssize_t>(sizeof buf)) return true;
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

// Writes what the descriptor takes now. Returns false when the peer is gone.
bool write_available(int fd, bool socket, std::string& out) {
  while (!out.empty()) {
    ssize_t n = socket ? ::send(fd, out.data(), out.size(), MSG_NOSIGNAL) : ::write(fd, out.data(), out.size());
    if (n > 0) {
      out.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

struct Program {
  int fd = -1;
  LineBuffer in{kMaxLine};
  std::string out;
  std::optional<json> hello;             // the last hello it sent (id removed): sent again when the port comes back
  std::optional<json> hello_unanswered;  // the id of its hello that a standby refused: answered after the next one
  std::deque<std::string> waiting;       // lines held while the port is down (ids already rewritten)
  bool closing = false;                  // close once `out` is written
};

// What a request on the port was.
struct Call {
  std::uint64_t program = 0;  // 0: guestd's own (a hello sent again): the answer is only logged
  json id;                    // the program's own id
  std::string method;
};

class Daemon {
 public:
  // `ports`: the pool's managers (one or more), tried in turn.
  Daemon(std::vector<PoolUri> ports, std::string listen_path, bool verbose)
      : ports_(std::move(ports)), listen_path_(std::move(listen_path)), verbose_(verbose) {}

  int run() {
    if (!listen()) return 1;
    std::string all;
    for (const auto& p : ports_) all += (all.empty() ? "" : ",") + p.text;
    std::fprintf(stderr, "accelpool-guestd: serving %s, pool stream %s\n", listen_path_.c_str(), all.c_str());
    while (!g_stop) {
      if (port_fd_ < 0 && Clock::now() >= next_open_) open_port();
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      if (port_fd_ >= 0) fds.push_back({port_fd_, static_cast<short>(POLLIN | (port_out_.empty() ? 0 : POLLOUT)), 0});
      std::vector<std::uint64_t> ids;
      for (auto& [id, p] : programs_) {
        fds.push_back({p.fd, static_cast<short>((p.closing ? 0 : POLLIN) | (p.out.empty() ? 0 : POLLOUT)), 0});
        ids.push_back(id);
      }
      ::poll(fds.data(), fds.size(), port_fd_ >= 0 ? 1000 : 50);
      if (fds[0].revents & POLLIN) accept_programs();
      std::size_t at = 1;
      if (port_fd_ >= 0) {
        short rev = fds[at++].revents;
        if (rev & (POLLIN | POLLHUP | POLLERR)) read_port(rev);
        if (port_fd_ >= 0 && !port_out_.empty() && !write_available(port_fd_, port_socket_, port_out_)) {
          port_lost("writing to the port failed");
        }
      }
      for (std::size_t i = 0; i < ids.size(); ++i) {
        auto it = programs_.find(ids[i]);
        if (it == programs_.end()) continue;
        short rev = fds[at + i].revents;
        if (rev & (POLLIN | POLLHUP | POLLERR)) read_program(it->first, it->second);
      }
      flush_programs();
    }
    ::close(listen_fd_);
    ::unlink(listen_path_.c_str());
    return 0;
  }

 private:
  bool listen() {
    std::error_code ec;
    auto dir = std::filesystem::path(listen_path_).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (listen_path_.size() >= sizeof addr.sun_path) {
      std::fprintf(stderr, "accelpool-guestd: --listen '%s': longer than %zu bytes\n", listen_path_.c_str(),
                   sizeof addr.sun_path - 1);
      return false;
    }
    std::memcpy(addr.sun_path, listen_path_.c_str(), listen_path_.size() + 1);
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ::unlink(listen_path_.c_str());  // a socket left by a crash
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 64) != 0) {
      std::fprintf(stderr, "accelpool-guestd: cannot listen on %s: %s\n", listen_path_.c_str(), std::strerror(errno));
      return false;
    }
    ::chmod(listen_path_.c_str(), 0666);  // any program of the guest; the pool checks its token
    return true;
  }

  void log(const std::string& m) const {
    if (verbose_) std::fprintf(stderr, "accelpool-guestd: %s\n", m.c_str());
  }

  // ---- the port -------------------------------------------------------------------------------------------

  void open_port() {
    auto s = open_stream(port(), std::chrono::milliseconds(2000));
    if (!s) {
      next_port();
      retry_later(s.error().message);
      return;
    }
    // A virtio-serial port whose host side is not connected reports POLLHUP (with POLLIN: reads end at once).
    pollfd p{s->fd, POLLIN, 0};
    ::poll(&p, 1, 0);
    if (p.revents & (POLLHUP | POLLERR)) {
      ::close(s->fd);
      retry_later("the host side of " + port().text + " is not connected");
      return;
    }
    port_fd_ = s->fd;
    port_socket_ = s->socket;
    retry_ = kRetryMin;
    port_in_.reset();
    port_out_.clear();
    std::fprintf(stderr, "accelpool-guestd: pool stream %s is up\n", port().text.c_str());
    // Sessions first (a hello a standby refused is answered to its program now), then what the programs asked
    // meanwhile.
    for (auto& [id, p] : programs_) {
      if (!p.hello) continue;
      if (p.hello_unanswered)
        send_port(id, *p.hello_unanswered, "hello", *p.hello);
      else
        send_port(0, json(nullptr), "hello", *p.hello);
      p.hello_unanswered.reset();
    }
    for (auto& [id, p] : programs_) {
      for (auto& l : p.waiting) port_out_ += l;
      p.waiting.clear();
    }
  }

  void retry_later(const std::string& why) {
    if (why != last_retry_reason_)
      std::fprintf(stderr, "accelpool-guestd: waiting for the pool stream: %s\n", why.c_str());
    last_retry_reason_ = why;
    next_open_ = Clock::now() + retry_;
    retry_ = std::min(retry_ * 2, kRetryMax);
  }

  void port_lost(const std::string& why) {
    ::close(port_fd_);
    port_fd_ = -1;
    port_out_.clear();
    last_retry_reason_.clear();
    std::fprintf(stderr, "accelpool-guestd: pool stream %s went away (%s)\n", port().text.c_str(), why.c_str());
    if (!leader_named_) next_port();
    leader_named_ = false;
    for (auto& [upstream, c] : calls_) {
      auto it = programs_.find(c.program);
      if (it == programs_.end()) continue;
      it->second.out += error_line(c.id, Errc::disconnected,
                                   c.method +
                                       ": the host side of the pool stream went away while the call was in "
                                       "flight; its outcome is unknown");
    }
    calls_.clear();
    retry_ = kRetryMin;
    next_open_ = Clock::now() + retry_;
  }

  // Sends one request of `program` (0: guestd's own) under a fresh id.
  void send_port(std::uint64_t program, json id, const std::string& method, json msg) {
    std::uint64_t up = next_upstream_++;
    msg["id"] = up;
    calls_[up] = Call{program, std::move(id), method};
    port_out_ += msg.dump() + "\n";
  }

  void read_port(short revents) {
    bool open = read_available(port_fd_, port_in_);
    while (port_fd_ >= 0) {
      auto line = port_in_.next_line();
      if (!line) break;
      from_pool(*line);
    }
    if (port_fd_ < 0) return;  // a standby's answer ended the stream
    if (port_in_.overflow()) return port_lost("a line from the pool is longer than 64 KiB");
    if (!open || (revents & (POLLHUP | POLLERR))) port_lost("end of stream");
  }

  void from_pool(const std::string& line) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::fprintf(stderr, "accelpool-guestd: ignoring a line from the pool that is not a JSON object\n");
      return;
    }
    auto idit = j.find("id");
    if (idit != j.end() && !idit->is_null()) {  // a reply
      auto c = idit->is_number_unsigned() ? calls_.find(idit->get<std::uint64_t>()) : calls_.end();
      if (c == calls_.end()) return;
      Call call = std::move(c->second);
      calls_.erase(c);
      if (auto leader = standby_refusal(j)) {
        // A standby of a shared store: its hello goes again to the leader it names (else to the next manager).
        if (call.program != 0 && programs_.count(call.program)) programs_[call.program].hello_unanswered = call.id;
        for (std::size_t i = 0; i < ports_.size(); ++i) {
          if (!leader->empty() && ports_[i].text == *leader) {
            at_ = i;
            leader_named_ = true;
          }
        }
        return port_lost("the manager is a standby" + (leader->empty() ? std::string() : "; the leader is " + *leader));
      }
      if (call.program == 0) {
        if (j.contains("error")) {
          std::fprintf(stderr, "accelpool-guestd: hello sent again was refused: %s\n", j["error"].dump().c_str());
        }
        return;
      }
      auto p = programs_.find(call.program);
      if (p == programs_.end()) return;  // the program left; the answer has no one to go to
      if (auto r = j.find("result"); r != j.end() && r->is_object()) own_leases(call.program, *r);
      j["id"] = call.id;
      p->second.out += j.dump() + "\n";
      return;
    }
    if (idit == j.end() || idit->is_null()) {
      auto m = j.find("method");
      if (m == j.end()) {  // an error about no call in particular (e.g. a line too long): everyone hears it
        for (auto& [id, p] : programs_) p.out += line + "\n";
        return;
      }
      // A notification: to the owner of its lease, else to every program that said hello.
      std::optional<std::uint64_t> lease_id;
      if (auto p = j.find("params"); p != j.end() && p->is_object()) {
        if (auto l = p->find("lease"); l != p->end() && l->is_object()) {
          if (auto lid = l->find("id"); lid != l->end() && lid->is_number_unsigned())
            lease_id = lid->get<std::uint64_t>();
        }
      }
      auto owner = lease_id ? owners_.find(*lease_id) : owners_.end();
      if (owner != owners_.end() && programs_.count(owner->second)) {
        programs_[owner->second].out += line + "\n";
      } else {
        for (auto& [id, p] : programs_)
          if (p.hello) p.out += line + "\n";
      }
    }
  }

  // The program a call returned a lease to owns it (acquire, get, release); lists give unowned leases only.
  void own_leases(std::uint64_t program, const json& result) {
    if (auto l = result.find("lease"); l != result.end() && l->is_object()) {
      if (auto id = l->find("id"); id != l->end() && id->is_number_unsigned())
        owners_[id->get<std::uint64_t>()] = program;
    }
    if (auto ls = result.find("leases"); ls != result.end() && ls->is_array()) {
      for (const auto& l : *ls) {
        if (!l.is_object()) continue;
        auto id = l.find("id");
        if (id == l.end() || !id->is_number_unsigned()) continue;
        auto o = owners_.find(id->get<std::uint64_t>());
        if (o == owners_.end() || !programs_.count(o->second)) owners_[id->get<std::uint64_t>()] = program;
      }
    }
  }

  // ---- the programs ---------------------------------------------------------------------------------------

  void accept_programs() {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      std::uint64_t id = next_program_++;
      programs_[id].fd = fd;
      log("program " + std::to_string(id) + " connected");
    }
  }

  void read_program(std::uint64_t pid, Program& p) {
    bool open = read_available(p.fd, p.in);
    while (auto line = p.in.next_line()) from_program(pid, p, *line);
    if (p.in.overflow()) {
      p.out += error_line(nullptr, Errc::invalid_request,
                          "message longer than " + std::to_string(kMaxLine) + " bytes; closing the connection");
      p.closing = true;
      return;
    }
    if (!open) close_program(pid);
  }

  void from_program(std::uint64_t pid, Program& p, const std::string& line) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      p.out += error_line(nullptr, Errc::parse_error, "not valid JSON");
      return;
    }
    if (!j.is_object()) {
      p.out += error_line(nullptr, Errc::invalid_request, "a message must be a JSON object");
      return;
    }
    auto idit = j.find("id");
    std::string method = j.contains("method") && j["method"].is_string() ? j["method"].get<std::string>() : "";
    if (idit == j.end()) {  // a notification to the pool: no answer to route
      forward(p, line + "\n");
      return;
    }
    json id = *idit;
    if (!(id.is_null() || id.is_number_integer() || (id.is_string() && id.get<std::string>().size() <= 128))) {
      p.out +=
          error_line(nullptr, Errc::invalid_request, "'id' must be an integer or a string of at most 128 characters");
      return;
    }
    if (method == "hello") {
      json h = j;
      h.erase("id");
      p.hello = std::move(h);
      log("program " + std::to_string(pid) + " says hello");
    }
    if (port_fd_ < 0) {
      if (p.waiting.size() >= kMaxWaitingLines) {
        p.out += error_line(id, Errc::unreachable, method + ": the pool stream is down and too many calls wait");
        return;
      }
    }
    std::uint64_t up = next_upstream_++;
    j["id"] = up;
    calls_[up] = Call{pid, id, method};
    forward(p, j.dump() + "\n");
  }

  // To the port now, or held until it is up again.
  void forward(Program& p, std::string line) {
    if (port_fd_ >= 0) {
      port_out_ += line;
    } else {
      p.waiting.push_back(std::move(line));
    }
  }

  void flush_programs() {
    std::vector<std::uint64_t> gone;
    for (auto& [id, p] : programs_) {
      if (p.out.size() > kMaxClientQueue) {
        gone.push_back(id);
        continue;
      }
      if (!p.out.empty() && !write_available(p.fd, true, p.out))
        gone.push_back(id);
      else if (p.closing && p.out.empty())
        gone.push_back(id);
    }
    for (auto id : gone) close_program(id);
  }

  void close_program(std::uint64_t pid) {
    auto it = programs_.find(pid);
    if (it == programs_.end()) return;
    ::close(it->second.fd);
    programs_.erase(it);
    log("program " + std::to_string(pid) + " disconnected");
  }

  const PoolUri& port() const { return ports_[at_]; }
  void next_port() { at_ = (at_ + 1) % ports_.size(); }
  // The leader's address a reply names when it is a standby's refusal (not_leader; "" when it names none).
  static std::optional<std::string> standby_refusal(const json& reply) {
    auto e = reply.find("error");
    if (e == reply.end() || !e->is_object()) return std::nullopt;
    auto d = e->find("data");
    if (d == e->end() || !d->is_object()) return std::nullopt;
    if (auto c = d->find("code"); c == d->end() || !c->is_string() || c->get<std::string>() != "not_leader")
      return std::nullopt;
    auto l = d->find("leader");
    return l != d->end() && l->is_string() ? l->get<std::string>() : std::string();
  }

  std::vector<PoolUri> ports_;
  std::size_t at_ = 0;         // the manager of ports_ in use or tried next
  bool leader_named_ = false;  // a standby named the one at_ points to: the next loss does not move on
  std::string listen_path_;
  bool verbose_;
  int listen_fd_ = -1;
  int port_fd_ = -1;
  bool port_socket_ = false;
  LineBuffer port_in_{kMaxLine};
  std::string port_out_;
  Clock::time_point next_open_{};
  std::chrono::milliseconds retry_{kRetryMin};
  std::string last_retry_reason_;
  std::map<std::uint64_t, Program> programs_;
  std::uint64_t next_program_ = 1;
  std::map<std::uint64_t, Call> calls_;  // by the id on the port
  std::uint64_t next_upstream_ = 1;
  std::map<std::uint64_t, std::uint64_t> owners_;  // lease id -> program
};

}  // namespace

int main(int argc, char** argv) {
  std::string port = "serial://org.accelpool.guest.0";
  std::string listen_path = "/run/accelpool/guest.sock";
  bool verbose = false;
  CLI::App app{kDescription};
  accelpool::common::init_cli(app, "accelpool-guestd");
  app.add_option("--port", port,
                 "the stream to the pool: serial://NAME, unix:///PATH or tcp://HOST:PORT; or a comma-separated list, "
                 "the managers of one pool (docs/ha.md)")
      ->type_name("URI")
      ->capture_default_str();
  app.add_option("--listen", listen_path, "the socket programs connect to")->type_name("PATH")->capture_default_str();
  app.add_flag("-v,--verbose", verbose, "log every connect, disconnect and hello on stderr");
  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  auto uris = parse_pool_uris(port);
  if (!uris) {
    std::fprintf(stderr, "accelpool-guestd: --port: %s\n", uris.error().message.c_str());
    return 2;
  }
  if (std::any_of(uris->begin(), uris->end(), [](const PoolUri& u) { return u.kind == PoolUri::Kind::tls; })) {
    std::fprintf(stderr,
                 "accelpool-guestd: --port: tls:// is for programs that reach the pool over a network "
                 "themselves; the guest daemon's stream is the VM's serial port (or a local socket)\n");
    return 2;
  }
  if (listen_path.empty() || listen_path[0] != '/') {
    std::fprintf(stderr, "accelpool-guestd: --listen '%s' must be an absolute path\n", listen_path.c_str());
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  return Daemon(std::move(*uris), std::move(listen_path), verbose).run();
}
