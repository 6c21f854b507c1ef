#include "remote.hpp"

#include <accelpool/common/cl_socket.hpp>
#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

namespace accelpool::clicd {
namespace {

bool read_all(const shim::Stream& s, char* p, std::size_t n) {
  return clwire::move_all([&s](char* at, std::size_t left) { return shim::stream_read(s, at, left); }, p, n);
}

// Reads one reply frame; returns its status and leaves the fields after it in `fields`. kLinkLost on failure.
std::int32_t read_reply(const shim::Stream& s, std::string& fields) {
  char head[12];  // frame length, op, flags, status
  if (!read_all(s, head, sizeof head)) return kLinkLost;
  clwire::Reader r(std::string_view(head, sizeof head));
  const std::uint32_t size = r.u32();
  const auto op = static_cast<clwire::Op>(r.u16());
  r.u16();
  const std::int32_t status = r.i32();
  if (size < 8 || size > clwire::kMaxFrame || op != clwire::Op::reply) return kLinkLost;
  fields.resize(size - 8);
  if (!read_all(s, fields.data(), fields.size())) return kLinkLost;
  return status;
}

constexpr std::size_t kQueueLimit = 1 << 20;

}  // namespace

std::shared_ptr<Link> Link::connect(const std::string& endpoint, const std::string& ca_file, std::string& error) {
  clwire::Endpoint e;
  if (!clwire::parse_endpoint(endpoint, e)) {
    error = "'" + endpoint + "' is not an ocl+tcp:// or ocl+tls://HOST:PORT/CAPABILITY endpoint";
    return nullptr;
  }
  const std::string host = e.host.find(':') != std::string::npos ? "[" + e.host + "]" : e.host;
  auto uri = shim::parse_pool_uri(std::string(e.tls ? "tls://" : "tcp://") + host + ":" + e.port);
  if (!uri) {
    error = uri.error().message;
    return nullptr;
  }
  shim::TlsOptions tls;
  tls.ca_file = ca_file;
  auto stream = shim::open_stream(*uri, std::chrono::seconds(10), {}, tls);
  if (!stream) {
    error = stream.error().message;
    return nullptr;
  }
  const int fd = stream->fd;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // one request at a time: the link blocks
  clwire::tune_socket(fd);
  std::shared_ptr<Link> link(new Link(*stream));
  clwire::Writer hello(clwire::Op::hello, clwire::kWantsReply);
  hello.u32(clwire::kVersion).str(e.capability);
  std::string reply;
  const std::int32_t status = link->call(hello, reply);
  if (status != 0) {
    error = status == kLinkLost
                ? "the device's host closed the connection"
                : "the device's host refused the lease's capability (OpenCL status " + std::to_string(status) + ")";
    return nullptr;
  }
  return link;
}

Link::~Link() { shim::close_stream(stream_); }

void Link::lose_locked() {
  lost_ = true;
  queued_.clear();
  ::shutdown(stream_.fd, SHUT_RDWR);
}

bool Link::send_locked(const char* data, std::size_t size) {
  if (lost_) return false;
  if (!clwire::move_all([this](const char* at, std::size_t left) { return shim::stream_write(stream_, at, left); },
                        data, size)) {
    lose_locked();
    return false;
  }
  return true;
}

bool Link::flush_locked() {
  if (queued_.empty()) return !lost_;
  bool ok = send_locked(queued_.data(), queued_.size());
  queued_.clear();
  return ok;
}

bool Link::send_request_locked(clwire::Writer& request, const std::string_view* tail) {
  const std::string& frame = request.frame(tail != nullptr ? tail->size() : 0);
  if (tail != nullptr || frame.size() >= kQueueLimit) {
    return flush_locked() && send_locked(frame.data(), frame.size()) &&
           (tail == nullptr || send_locked(tail->data(), tail->size()));
  }
  queued_ += frame;
  return queued_.size() < kQueueLimit || flush_locked();
}

bool Link::post(clwire::Writer& request, const std::string_view* tail) {
  std::lock_guard lock(mu_);
  return !lost_ && send_request_locked(request, tail);
}

std::int32_t Link::call(clwire::Writer& request, std::string& reply, const std::string_view* tail) {
  std::lock_guard lock(mu_);
  if (lost_ || !send_request_locked(request, tail) || !flush_locked()) return kLinkLost;
  const std::int32_t status = read_reply(stream_, reply);
  if (status == kLinkLost) lose_locked();
  return status;
}

std::int32_t Link::call_into(clwire::Writer& request, void* out, std::size_t size) {
  std::lock_guard lock(mu_);
  if (lost_ || !send_request_locked(request, nullptr) || !flush_locked()) return kLinkLost;
  char head[20];  // frame length, op, flags, status, the data's length
  if (!read_all(stream_, head, 12)) {
    lose_locked();
    return kLinkLost;
  }
  clwire::Reader r(std::string_view(head, 12));
  const std::uint32_t frame = r.u32();
  const auto op = static_cast<clwire::Op>(r.u16());
  r.u16();
  const std::int32_t status = r.i32();
  const bool whole = frame == 16 + size;  // op, flags, status, length, data
  std::uint64_t length = 0;
  bool ok = op == clwire::Op::reply && frame >= 8 && frame <= clwire::kMaxFrame;
  if (ok && status == 0 && whole) {
    ok = read_all(stream_, head + 12, 8) && (std::memcpy(&length, head + 12, 8), length == size) &&
         read_all(stream_, static_cast<char*>(out), size);
  } else if (ok) {
    std::string rest(frame - 8, '\0');  // an error's (empty) data, or a reply of another size: not the data asked
    ok = read_all(stream_, rest.data(), rest.size()) && status != 0;
  }
  if (!ok) {
    lose_locked();
    return kLinkLost;
  }
  return status;
}

bool Link::flush() {
  std::lock_guard lock(mu_);
  return flush_locked();
}

// --- the lease ------------------------------------------------------------------------------------------------

namespace {

// The settings: ACCELPOOL_* variables, else the config file ($ACCELPOOL_OPENCL_CONFIG, default
// /etc/accelpool/opencl.conf: "key = value" lines, '#' comments), else the defaults (docs/remote-opencl.md).
struct Settings {
  std::map<std::string, std::string> file;

  static Settings load() {
    Settings s;
    const char* path = std::getenv("ACCELPOOL_OPENCL_CONFIG");
    std::ifstream in(path != nullptr && *path != '\0' ? path : "/etc/accelpool/opencl.conf");
    std::string line;
    auto trim = [](std::string t) {
      const auto b = t.find_first_not_of(" \t\r");
      const auto e = t.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
    };
    while (std::getline(in, line)) {
      line = trim(line.substr(0, line.find('#')));
      const auto eq = line.find('=');
      if (eq != std::string::npos) s.file[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
    }
    return s;
  }
  std::string get(const char* env, const std::string& key, const std::string& fallback) const {
    if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return v;
    auto it = file.find(key);
    return it != file.end() ? it->second : fallback;
  }
  double seconds(const char* env, const std::string& key, double fallback) const {
    const std::string text = get(env, key, "");
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    return text.empty() || *end != '\0' || v < 0 ? fallback : v;
  }
};

// The program's name as a lease label: [A-Za-z0-9._:-], at most 64 characters.
std::string program_label() {
  char path[4096];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  std::string name = n > 0 ? std::string(path, static_cast<std::size_t>(n)) : "opencl";
  name = name.substr(name.find_last_of('/') + 1);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' && c != '-') c = '_';
  }
  return name.empty() ? "opencl" : name.substr(0, 64);
}

}  // namespace

struct Pool::State {
  Settings settings = Settings::load();
  std::unique_ptr<shim::Client> client;
  shim::Lease lease;
  std::shared_ptr<Granted> granted;
  int contexts = 0;
  bool had_context = false;  // the lease's idle time starts when its last context is released, not before
  std::chrono::steady_clock::time_point idle_since;
  bool stopping = false;
  std::condition_variable idle_cv;
  std::thread idle_thread;
  std::string last_error;
};

Pool& Pool::instance() {
  static Pool pool;
  return pool;
}

Pool::State& Pool::state() {
  if (!state_) state_ = std::make_unique<State>();
  return *state_;
}

std::shared_ptr<Granted> Pool::device(std::string& error) {
  std::unique_lock lock(mu_);
  State& s = state();
  if (s.granted && !s.granted->link->lost()) return s.granted;
  s.granted.reset();
  s.lease = shim::Lease();
  auto fail = [&](const std::string& why) -> std::shared_ptr<Granted> {
    error = "accelpool OpenCL: " + why;
    if (error != s.last_error) std::fprintf(stderr, "%s\n", error.c_str());
    s.last_error = error;
    return nullptr;
  };
  const Settings& cfg = s.settings;
  if (!s.client) {
    shim::ClientOptions o;
    o.uri = cfg.get("ACCELPOOL_POOL", "pool", shim::default_pool_uri());
    o.token = cfg.get("ACCELPOOL_TOKEN", "token", "");
    o.tls_ca_file = cfg.get("ACCELPOOL_POOL_CA", "pool_ca", "");
    char host[256] = "guest";
    ::gethostname(host, sizeof host - 1);
    o.guest = cfg.get("ACCELPOOL_GUEST", "guest", std::string(host) + "-opencl-" + std::to_string(::getpid()));
    auto client = shim::Client::connect(o);
    if (!client) return fail("cannot reach the pool at " + o.uri + ": " + client.error().message);
    s.client = std::move(*client);
  }
  shim::AcquireOptions a;
  a.kind = cfg.get("ACCELPOOL_OPENCL_KIND", "kind", "gpu");
  a.bitstream = cfg.get("ACCELPOOL_OPENCL_BITSTREAM", "bitstream", "");
  a.label = cfg.get("ACCELPOOL_OPENCL_LABEL", "label", program_label());
  if (double t = cfg.seconds("ACCELPOOL_OPENCL_TIMEOUT_S", "timeout_s", 0); t > 0) a.timeout = shim::Seconds(t);
  a.on_revoking = [](const shim::LeaseInfo& l) {
    std::fprintf(stderr, "accelpool OpenCL: lease %llu is being revoked; its device goes away at the deadline\n",
                 static_cast<unsigned long long>(l.id));
  };
  a.on_ended = [](const shim::LeaseInfo& l) {
    std::fprintf(stderr, "accelpool OpenCL: lease %llu ended (%s); OpenCL calls on its device fail from now on\n",
                 static_cast<unsigned long long>(l.id), l.end_reason.c_str());
  };
  lock.unlock();  // the acquire may wait in the queue: other threads still reach the pool's state
  auto lease = s.client->acquire(a);
  lock.lock();
  if (!lease) return fail("no " + a.kind + " device granted: " + lease.error().message);
  if (s.granted && !s.granted->link->lost()) return s.granted;  // another thread was granted one meanwhile
  const shim::LeaseInfo info = lease->info();
  const shim::DeviceInfo* served = nullptr;
  for (const auto& d : info.devices) {
    clwire::Endpoint e;
    if (served == nullptr && clwire::parse_endpoint(d.endpoint, e)) served = &d;
  }
  if (served == nullptr)
    return fail("lease " + std::to_string(info.id) + " (" + a.kind +
                ") was granted a device no host serves over the "
                "network (attach '" +
                (info.devices.empty() ? std::string() : info.devices[0].attach) +
                "'): use accelpool-run for hot-plugged devices");
  std::string why;
  const std::string ca = cfg.get("ACCELPOOL_OPENCL_CA", "opencl_ca", cfg.get("ACCELPOOL_POOL_CA", "pool_ca", ""));
  auto link = Link::connect(served->endpoint, ca, why);
  if (!link) return fail("lease " + std::to_string(info.id) + ": device " + served->name + ": " + why);
  s.lease = std::move(*lease);
  s.granted = std::make_shared<Granted>(Granted{link, served->name});
  s.had_context = s.contexts > 0;
  if (!s.idle_thread.joinable()) {
    s.idle_thread = std::thread([this] {
      std::unique_lock l(mu_);
      State& st = *state_;
      const auto idle = std::chrono::duration<double>(st.settings.seconds("ACCELPOOL_OPENCL_IDLE_S", "idle_s", 2.0));
      while (!st.stopping) {
        if (st.granted && st.contexts == 0 && st.had_context) {
          const auto end = st.idle_since + std::chrono::duration_cast<std::chrono::steady_clock::duration>(idle);
          if (std::chrono::steady_clock::now() >= end) {
            st.granted.reset();
            shim::Lease done = std::move(st.lease);
            l.unlock();
            (void)done.release();
            l.lock();
            continue;
          }
          st.idle_cv.wait_until(l, end);
        } else {
          st.idle_cv.wait(l);
        }
      }
    });
  }
  return s.granted;
}

void Pool::context_created() {
  std::lock_guard lock(mu_);
  State& s = state();
  ++s.contexts;
  s.had_context = true;
  s.idle_cv.notify_all();
}

void Pool::context_released() {
  std::lock_guard lock(mu_);
  State& s = state();
  if (s.contexts > 0 && --s.contexts == 0) s.idle_since = std::chrono::steady_clock::now();
  s.idle_cv.notify_all();
}

Pool::~Pool() {
  if (!state_) return;
  {
    std::lock_guard lock(mu_);
    state_->stopping = true;
    state_->idle_cv.notify_all();
  }
  if (state_->idle_thread.joinable()) state_->idle_thread.join();
  state_->granted.reset();
  (void)state_->lease.release();
  state_->client.reset();
}

}  // namespace accelpool::clicd
