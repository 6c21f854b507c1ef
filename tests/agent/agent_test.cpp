// Host agents on loopback: real accelpool-agent processes against the manager-side AgentListener + RemoteHost.
#include <accelpool/agent/wire.hpp>
#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/sha256.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>
#include <accelpool/manager/agent_listener.hpp>

#ifdef ACCELPOOL_AGENT_TEST_LIBVIRT
#include <libvirt_harness.hpp>
#endif

#include <catch2/catch.hpp>

#include "child_exit.hpp"
#include "hung_after.hpp"
#include "sim_image.hpp"
#include "skip.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

namespace fs = std::filesystem;
using namespace accelpool;
using namespace std::chrono_literals;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

// A device.prepare request.
host::PrepareRequest prepare_request(std::string device, std::string bitstream, bool reprogram, std::string vm,
                                     std::string sha256 = "", std::string lease = "") {
  host::PrepareRequest r;
  r.device = std::move(device);
  r.bitstream = std::move(bitstream);
  r.reprogram = reprogram;
  r.vm = std::move(vm);
  r.sha256 = std::move(sha256);
  r.lease = std::move(lease);
  return r;
}

// The pool's owner thread: runs posted functions in order; records what the listener reports.
class Owner {
 public:
  Owner() : thread_([this] { run(); }) {}
  ~Owner() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  manager::Poster poster() {
    return [this](std::function<void()> f) {
      if (std::this_thread::get_id() == thread_.get_id()) {  // posted from a posted function: the lock is ours
        queue_.push_back(std::move(f));
        return;
      }
      {
        std::lock_guard lock(mu_);
        queue_.push_back(std::move(f));
      }
      cv_.notify_all();
    };
  }

  agent::ListenerEvents events() {
    agent::ListenerEvents ev;
    ev.host_joined = [this](std::unique_ptr<agent::RemoteHost> h) -> Status {
      std::string name = h->name();
      joined.push_back(name);
      hosts[name] = std::shared_ptr<agent::RemoteHost>(std::move(h));
      return Status::ok();
    };
    ev.host_lost = [this](const std::string& host, const Error& why) { lost.emplace_back(host, why); };
    ev.vm_stopped = [this](const std::string& host, const agent::VmStopped& vm) { stopped.emplace_back(host, vm); };
    ev.device_health = [this](const std::string& host, const std::string& dev, const std::string& h,
                              const std::string& detail) {
      health.push_back({host, dev, h, detail});
    };
    return ev;
  }

  // Waits until `pred` holds; `pred` runs on the owner thread's data under the owner's lock.
  bool wait(const std::function<bool()>& pred, std::chrono::milliseconds timeout = testing::kHungAfter) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, pred);
  }

  // Runs `f` on the owner thread (as the manager would) and waits for it.
  void sync(const std::function<void()>& f) {
    bool done = false;
    poster()([&] {
      f();
      done = true;
    });
    wait([&] { return done; });
  }

  struct Outcome {
    bool done = false;
    Status status;
    std::string loaded;
    host::PrepareResult result;  // a prepare's
  };
  // A Done that records into `out` (on the owner thread).
  manager::HostDriver::Done record(Outcome& out) {
    return [&out](Status s, std::string loaded) {
      out.status = std::move(s);
      out.loaded = std::move(loaded);
      out.done = true;
    };
  }
  Outcome call(const std::function<void(manager::HostDriver::Done)>& op) {
    Outcome out;
    poster()([&] { op(record(out)); });
    REQUIRE(wait([&] { return out.done; }));
    return out;
  }
  // A PrepareDone that records into `out` (on the owner thread).
  manager::HostDriver::PrepareDone record_prepare(Outcome& out) {
    return [&out](Status s, host::PrepareResult result) {
      out.status = std::move(s);
      out.loaded = result.loaded;
      out.result = std::move(result);
      out.done = true;
    };
  }
  // Asks `host` to prepare (on the owner thread) and waits for the outcome.
  Outcome prepare(manager::HostDriver& host, const host::PrepareRequest& request) {
    Outcome out;
    poster()([&] { host.prepare(request, record_prepare(out)); });
    REQUIRE(wait([&] { return out.done; }));
    return out;
  }

  // Owner-thread data (read it under wait()/sync()).
  std::vector<std::string> joined;
  std::map<std::string, std::shared_ptr<agent::RemoteHost>> hosts;
  std::vector<std::pair<std::string, Error>> lost;
  std::vector<std::pair<std::string, agent::VmStopped>> stopped;
  struct HealthEvent {
    std::string host, device, health, detail;
  };
  std::vector<HealthEvent> health;

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      auto f = std::move(queue_.front());
      queue_.pop_front();
      f();  // under the lock: the owner's data is only touched here and in wait()'s predicates
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Agent configs, logs and state files of this test process; removed at exit.
fs::path temp_dir() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("accelpool-agent-test-" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

const std::string kToken = "agent-secret-1";

// One accelpool-agent process.
class AgentProcess {
 public:
  AgentProcess(std::string host, std::uint16_t port, std::string extra, std::string token = kToken)
      : host_(std::move(host)) {
    auto dir = temp_dir();
    config_ = dir / (host_ + ".toml");
    log_ = dir / (host_ + ".log");
    std::ofstream(config_) << "[agent]\nmanager = \"127.0.0.1:" << port << "\"\ntoken = \"" << token << "\"\nhost = \""
                           << host_
                           << "\"\nheartbeat_interval_ms = 100\nreconnect_min_ms = 50\nreconnect_max_ms = 400\n"
                           << extra;
    start();
  }
  ~AgentProcess() { stop(SIGKILL); }

  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test process
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 2);
      ::execl(ACCELPOOL_AGENT_BIN, ACCELPOOL_AGENT_BIN, "--config", config_.c_str(), nullptr);
      ::_exit(127);
    }
  }
  // Sends `sig` and reaps the process; returns its exit status (or -signal).
  int stop(int sig) {
    if (pid_ <= 0) return exit_code_;
    ::kill(pid_, sig);
    return reap();
  }
  int reap() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    exit_code_ = testing::exit_status(st);
    return exit_code_;
  }
  // Waits up to `timeout` for the process to exit by itself.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    auto code = testing::wait_child_exit(pid_, timeout);
    if (code) {
      pid_ = -1;
      exit_code_ = *code;
    }
    return code;
  }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string host_;
  fs::path config_, log_;
  pid_t pid_ = -1;
  int exit_code_ = 0;
};

// A raw protocol client, for what a well-behaved agent never sends.
class RawClient {
 public:
  explicit RawClient(std::uint16_t port) {
    auto fd = agent::connect_to("127.0.0.1:" + std::to_string(port));
    REQUIRE(fd);
    fd_ = *fd;
  }
  // Adopts a connected non-blocking socket (e.g. one a test accepted, playing the manager).
  static RawClient adopt(int fd) { return RawClient(fd, 0); }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  agent::Message call(const std::string& line) {
    send(line + "\n");
    return next();
  }
  void send(std::string out) { REQUIRE(agent::write_some(fd_, out)); }
  // The next message the peer sends.
  agent::Message next() {
    auto until = Clock::now() + testing::kHungAfter;
    while (Clock::now() < until) {
      if (auto l = in_.next_line()) {
        auto m = agent::parse_message(*l);
        REQUIRE(m);
        return *m;
      }
      pollfd p{fd_, POLLIN, 0};
      ::poll(&p, 1, 100);
      agent::read_some(fd_, in_);
    }
    FAIL("nothing came from the peer");
    return {};
  }

 private:
  RawClient(int fd, int) : fd_(fd) {}
  int fd_ = -1;
  agent::LineBuffer in_{agent::kMaxLine};
};

std::string sim_pool(const std::string& devices, const std::string& more = "") {
  return "[backends.sim]\ndevices = \"" + devices + "\"\nprogram_base_ms = 5\n" + more;
}

struct Fixture {
  Owner owner;
  std::unique_ptr<agent::AgentListener> listener;
  std::atomic<int> deferred_wakes{0};  // wake-ups of the listener the owner thread ran at the end of a turn
  explicit Fixture(std::chrono::milliseconds hb_timeout = 1500ms,
                   std::shared_ptr<bitstreams::SharedRegistry> images = nullptr) {
    agent::ListenerOptions o;
    o.listen = {"127.0.0.1:0"};
    o.token = kToken;
    o.heartbeat_timeout = hb_timeout;
    o.images = std::move(images);
    // As the daemon: the owner thread's requests wake the listener once its current turn ends (what it posts from
    // a posted function runs after it).
    auto after_turn = [this, post = owner.poster()](std::function<void()> wake) {
      post([this, wake = std::move(wake)] {
        ++deferred_wakes;
        wake();
      });
    };
    auto l = agent::AgentListener::create(o, owner.events(), owner.poster(), after_turn);
    REQUIRE(l);
    listener = std::move(*l);
    REQUIRE(listener->tcp_port() != 0);
  }
  std::uint16_t port() const { return listener->tcp_port(); }
  bool wait_joined(std::size_t n) {
    return owner.wait([&] { return owner.joined.size() >= n; });
  }
  std::shared_ptr<agent::RemoteHost> host(const std::string& name) {
    std::shared_ptr<agent::RemoteHost> h;
    owner.sync([&] { h = owner.hosts.at(name); });
    return h;
  }
};

}  // namespace

TEST_CASE("three agents with separate simulated pools register and prepare/release program their devices") {
  Fixture f;
  AgentProcess a1("host-a", f.port(), sim_pool("fpga:sim-u250:2"));
  AgentProcess a2("host-b", f.port(), sim_pool("fpga:sim-u280:3"));
  AgentProcess a3("host-c", f.port(), sim_pool("gpu:sim-gpu:1", "attach = \"network\"\n"));
  REQUIRE(f.wait_joined(3));
  auto names = f.listener->hosts();
  CHECK(names == std::vector<std::string>{"host-a", "host-b", "host-c"});

  auto a = f.host("host-a");
  auto b = f.host("host-b");
  auto c = f.host("host-c");
  REQUIRE(a->devices()->size() == 2);
  REQUIRE(b->devices()->size() == 3);
  REQUIRE(c->devices()->size() == 1);
  CHECK(b->devices()->at(2).model == "sim-u280");
  CHECK(b->devices()->at(2).local_id == "sim:2");
  CHECK(a->devices()->at(0).passthrough);
  CHECK_FALSE(c->devices()->at(0).passthrough);
  CHECK(a->devices()->at(0).loaded.empty());

  auto r = f.owner.prepare(*a, prepare_request("sim:1", "vadd", false, ""));
  REQUIRE(r.status);
  CHECK(r.loaded == "vadd");
  // The result tells what the device is; without a VM nothing is attached.
  CHECK(r.result.loaded == "vadd");
  CHECK(r.result.attach == host::AttachMode::none);
  CHECK(r.result.details.kind == "fpga");
  CHECK(r.result.details.model == "sim-u250");
  CHECK(r.result.details.vendor == "accelpool simulator");
  r = f.owner.prepare(*b, prepare_request("sim:0", "mmul", false, ""));
  REQUIRE(r.status);
  CHECK(r.loaded == "mmul");
  // The same bitstream again without reprogram keeps it; reprogram loads it again; release keeps it (sim default).
  r = f.owner.prepare(*b, prepare_request("sim:0", "mmul", true, ""));
  REQUIRE(r.status);
  CHECK(r.loaded == "mmul");
  r = f.owner.call([&](auto done) { b->release("sim:0", done); });
  REQUIRE(r.status);
  CHECK(r.loaded == "mmul");
  r = f.owner.prepare(*c, prepare_request("sim:0", "gemm", false, ""));
  REQUIRE(r.status);
  CHECK(r.loaded == "gemm");
  CHECK(r.result.attach == host::AttachMode::network);  // reached over the network from any host
  CHECK(r.result.details.kind == "gpu");

  // Several operations in flight on one host complete in order, each with its own outcome. Queued in one turn of
  // the owner thread, they wake the listener when the turn ends, and only when it sleeps: at most once for the
  // batch, or again for a request queued after the listener, awake for a heartbeat, took the ones before.
  const int wakes_before = f.deferred_wakes;
  std::vector<Owner::Outcome> outs(4);
  f.owner.sync([&] {
    a->prepare(prepare_request("sim:0", "k1", false, ""), f.owner.record_prepare(outs[0]));
    a->prepare(prepare_request("sim:0", "k2", false, ""), f.owner.record_prepare(outs[1]));
    a->reset("sim:1", f.owner.record(outs[2]));
    a->prepare(prepare_request("sim:0", "k3", false, ""), f.owner.record_prepare(outs[3]));
  });
  REQUIRE(f.owner.wait([&] { return outs[3].done && outs[2].done && outs[1].done && outs[0].done; }));
  CHECK(outs[0].loaded == "k1");
  CHECK(outs[1].loaded == "k2");
  CHECK(outs[2].status);
  CHECK(outs[3].loaded == "k3");
  CHECK(f.deferred_wakes - wakes_before <= 4);

  // A clean stop (SIGTERM) ends the connection: the host is lost at once.
  CHECK(a3.stop(SIGTERM) == 0);
  REQUIRE(f.owner.wait([&] { return f.owner.lost.size() == 1; }));
}

TEST_CASE("a SIGKILLed agent is lost and its pending operations fail and it registers again on restart") {
  Fixture f(1500ms);
  AgentProcess a1("host-a", f.port(), sim_pool("fpga:sim-u250:2", "hanging_devices = \"sim:1\"\nhang_ms = 20000\n"));
  AgentProcess a2("host-b", f.port(), sim_pool("fpga:sim-u250:2"));
  AgentProcess a3("host-c", f.port(), sim_pool("fpga:sim-u250:2"));
  REQUIRE(f.wait_joined(3));
  auto a = f.host("host-a");

  // Pending when the agent dies: sent to it, and sim:1 hangs for 20 s in programming once it gets there.
  Owner::Outcome hung;
  f.owner.sync([&] { a->prepare(prepare_request("sim:1", "vadd", false, ""), f.owner.record_prepare(hung)); });
  f.owner.sync([&] { CHECK_FALSE(hung.done); });

  a1.stop(SIGKILL);
  REQUIRE(f.owner.wait([&] { return !f.owner.lost.empty(); }));
  f.owner.sync([&] {
    CHECK(std::get<0>(f.owner.lost[0]) == "host-a");
    CHECK(std::get<1>(f.owner.lost[0]).code == Errc::host_lost);
    // Lost because its connection closed, not later by the heartbeat timeout.
    CHECK(std::get<1>(f.owner.lost[0]).message.find("no heartbeat") == std::string::npos);
    REQUIRE(hung.done);
    CHECK(hung.status.error().code == Errc::host_lost);
  });
  CHECK_FALSE(a->connected());
  CHECK(f.listener->hosts() == std::vector<std::string>{"host-b", "host-c"});
  // Operations on the lost host fail at once; the other hosts are unaffected.
  auto r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, ""));
  CHECK(r.status.error().code == Errc::host_lost);
  auto b = f.host("host-b");
  r = f.owner.prepare(*b, prepare_request("sim:0", "vadd", false, ""));
  CHECK(r.status);

  // Restart: it registers again under the same name, with fresh devices.
  a1.start();
  REQUIRE(f.wait_joined(4));
  auto a_again = f.host("host-a");
  CHECK(a_again != a);
  CHECK(a_again->connected());
  CHECK(a_again->devices()->size() == 2);
  r = f.owner.prepare(*a_again, prepare_request("sim:0", "vadd", false, ""));
  CHECK(r.status);
  CHECK(r.loaded == "vadd");
}

TEST_CASE("a listener that stops fails the requests pending on its links, and later ones at once") {
  Fixture f;
  AgentProcess a1("host-a", f.port(), sim_pool("fpga:sim-u250:2", "hanging_devices = \"sim:1\"\nhang_ms = 20000\n"));
  REQUIRE(f.wait_joined(1));
  auto a = f.host("host-a");
  Owner::Outcome hung;
  f.owner.sync([&] { a->prepare(prepare_request("sim:1", "vadd", false, ""), f.owner.record_prepare(hung)); });

  f.listener.reset();  // the manager shutting down its agent side while the pool still holds the host
  REQUIRE(f.owner.wait([&] { return hung.done; }));
  f.owner.sync([&] {
    CHECK(hung.status.error().code == Errc::host_lost);
    REQUIRE(f.owner.lost.size() == 1);
    CHECK(std::get<1>(f.owner.lost[0]).message.find("listener stopped") != std::string::npos);
  });
  CHECK_FALSE(a->connected());
  // The link outlives its listener: a request on it now fails at once, from the owner thread, without it.
  auto r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, ""));
  CHECK(r.status.error().code == Errc::host_lost);
  r = f.owner.call([&](auto done) { a->release("sim:0", done); });
  CHECK(r.status.error().code == Errc::host_lost);
}

TEST_CASE("a stopped agent (no heartbeat) is lost after the heartbeat timeout and comes back by itself") {
  Fixture f(1000ms);
  AgentProcess a1("host-a", f.port(), sim_pool("fpga:sim-u250:1"));
  REQUIRE(f.wait_joined(1));
  ::kill(a1.pid(), SIGSTOP);
  REQUIRE(f.owner.wait([&] { return !f.owner.lost.empty(); }));
  f.owner.sync([&] { CHECK(std::get<1>(f.owner.lost[0]).message.find("no heartbeat") != std::string::npos); });
  ::kill(a1.pid(), SIGCONT);  // its old connection is closed: it reconnects and registers again
  REQUIRE(f.wait_joined(2));
  CHECK(f.listener->hosts() == std::vector<std::string>{"host-a"});
}

TEST_CASE("wrong token - duplicate registration - unknown devices: clear errors that change nothing") {
  Fixture f;
  AgentProcess a1("host-a", f.port(), sim_pool("fpga:sim-u250:2"));
  REQUIRE(f.wait_joined(1));
  auto a = f.host("host-a");

  SECTION("an agent with a wrong token is refused and exits") {
    AgentProcess bad("host-z", f.port(), sim_pool("fpga:sim-u250:1"), "not-the-token");
    auto rc = bad.wait_exit(testing::kHungAfter);
    REQUIRE(rc);
    CHECK(*rc == 2);
    CHECK(bad.log().find("wrong agent token") != std::string::npos);
    CHECK(f.listener->hosts() == std::vector<std::string>{"host-a"});
  }
  SECTION("raw messages") {
    RawClient raw(f.port());
    auto m = raw.call(R"({"jsonrpc":"2.0","id":1,"method":"agent.heartbeat","params":{}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::unauthorized);
    m = raw.call(
        R"({"jsonrpc":"2.0","id":2,"method":"agent.register","params":{"token":"x","host":"host-y","protocol":1,"devices":[]}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::unauthorized);
    CHECK(m.error->message == "agent.register: wrong agent token");
    m = raw.call(R"({"jsonrpc":"2.0","id":3,"method":"agent.register","params":{"token":")" + kToken +
                 R"(","host":"host-a","protocol":1,"devices":[]}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::already_registered);
    CHECK(m.error->message.find("host 'host-a' is already registered") != std::string::npos);
    m = raw.call(R"({"jsonrpc":"2.0","id":4,"method":"agent.register","params":{"token":")" + kToken +
                 R"(","host":"host-y","protocol":2,"devices":[]}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::unsupported_version);
    m = raw.call(R"({"jsonrpc":"2.0","id":5,"method":"agent.register","params":{"token":")" + kToken +
                 R"(","host":"host-y","protocol":1,"devices":[{"id":"d0","kind":"fpga","model":"m","bogus":1}]}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::invalid_argument);
    CHECK(m.error->message.find("devices[0]: unknown field 'bogus'") != std::string::npos);
    m = raw.call("not json");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::parse_error);
    CHECK(f.listener->hosts() == std::vector<std::string>{"host-a"});

    // Now registered: an unknown device in a heartbeat is refused and no health changes.
    m = raw.call(R"({"jsonrpc":"2.0","id":6,"method":"agent.register","params":{"token":")" + kToken +
                 R"(","host":"host-y","protocol":1,"devices":[{"id":"d0","kind":"fpga","model":"m"}]}})");
    REQUIRE(m.result);
    CHECK(m.result->at("heartbeat_timeout_ms").as_int64() == 1500);
    m = raw.call(
        R"({"jsonrpc":"2.0","id":7,"method":"agent.heartbeat","params":{"devices":[{"id":"d0","health":"failed"},{"id":"d9","health":"ok"}]}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::not_found);
    CHECK(m.error->message.find("no device 'd9'") != std::string::npos);
    m = raw.call(
        R"({"jsonrpc":"2.0","id":8,"method":"agent.heartbeat","params":{"devices":[{"id":"d0","health":"ok"}]}})");
    REQUIRE(m.result);
    f.owner.sync([&] { CHECK(f.owner.health.empty()); });
    // Heartbeat deltas: an empty heartbeat is a sign of life; a change is reported once; a full list that repeats
    // the known health reports nothing; a `full` that is not a boolean is refused.
    m = raw.call(R"({"jsonrpc":"2.0","id":10,"method":"agent.heartbeat","params":{"devices":[]}})");
    REQUIRE(m.result);
    m = raw.call(
        R"({"jsonrpc":"2.0","id":11,"method":"agent.heartbeat","params":{"devices":[{"id":"d0","health":"degraded","detail":"hot"}]}})");
    REQUIRE(m.result);
    m = raw.call(
        R"({"jsonrpc":"2.0","id":12,"method":"agent.heartbeat","params":{"devices":[{"id":"d0","health":"degraded","detail":"hot"}],"full":true}})");
    REQUIRE(m.result);
    m = raw.call(R"({"jsonrpc":"2.0","id":13,"method":"agent.heartbeat","params":{"devices":[],"full":"yes"}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::invalid_argument);
    CHECK(m.error->message.find("'full'") != std::string::npos);
    f.owner.sync([&] {
      REQUIRE(f.owner.health.size() == 1);
      CHECK(f.owner.health[0].health == "degraded");
    });
    m = raw.call(R"({"jsonrpc":"2.0","id":9,"method":"agent.frobnicate","params":{}})");
    REQUIRE(m.error);
    CHECK(m.error->code == Errc::method_not_found);
  }
  SECTION("unknown device ids through RemoteHost") {
    auto r = f.owner.prepare(*a, prepare_request("sim:99", "vadd", false, ""));
    REQUIRE_FALSE(r.status);
    CHECK(r.status.error().code == Errc::not_found);
    CHECK(r.status.error().message.find("host 'host-a' has no device 'sim:99'") != std::string::npos);
    r = f.owner.call([&](auto done) { a->release("sim:99", done); });
    CHECK(r.status.error().code == Errc::not_found);
    r = f.owner.call([&](auto done) { a->reset("nope", done); });
    CHECK(r.status.error().code == Errc::not_found);
    // The real devices are untouched.
    r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, ""));
    CHECK(r.status);
  }
  SECTION("a bad config is refused with the key named") {
    AgentProcess bad("host-q", f.port(), "[backends.sim]\ndevices = \"fpga:m:1\"\nbogus_key = 1\n");
    auto rc = bad.wait_exit(testing::kHungAfter);
    REQUIRE(rc);
    CHECK(*rc != 0);
    CHECK(bad.log().find("bogus_key") != std::string::npos);
  }
  SECTION("a backend key's array of integers reaches the backend as a list, any other array is refused") {
    AgentProcess words("host-s1", f.port(), "[backends.sim]\ndevices = \"fpga:m:1\"\nprogram_base_ms = [\"5\"]\n");
    AgentProcess counts("host-s2", f.port(), "[backends.sim]\ndevices = \"fpga:m:1\"\nprogram_base_ms = [5]\n");
    for (auto* bad : {&words, &counts}) {
      auto rc = bad->wait_exit(testing::kHungAfter);
      REQUIRE(rc);
      CHECK(*rc != 0);
    }
    CHECK(words.log().find(
              "key 'backends.sim.program_base_ms': must be a string, number, boolean or array of integers") !=
          std::string::npos);
    // The sim backend reads the key as a number, so the list reaches it and is refused there.
    CHECK(counts.log().find("config key 'program_base_ms': '[5]' is not") != std::string::npos);
  }
  SECTION("a relay without a manager's address is refused with the key named") {
    const std::string relay = "[backends.sim]\ndevices = \"fpga:m:1\"\n[libvirt]\nuri = \"test:///default\"\n[relay]\n";
    AgentProcess none("host-r1", f.port(), relay + "manager = []\n");
    AgentProcess empty("host-r2", f.port(), relay + "manager = \"\"\n");
    for (auto* bad : {&none, &empty}) {
      auto rc = bad->wait_exit(testing::kHungAfter);
      REQUIRE(rc);
      CHECK(*rc == 2);
    }
    CHECK(none.log().find("key 'relay.manager': must be a string or a non-empty array of strings") !=
          std::string::npos);
    CHECK(empty.log().find("key 'relay.manager': must not be empty") != std::string::npos);
  }
}

TEST_CASE("a failed device reports failed health and failed programming is an error", "[health]") {
  Fixture f;
  AgentProcess a1("host-a", f.port(),
                  sim_pool("fpga:sim-u250:3", "failed_devices = \"sim:2\"\nprogram_failures = \"sim:1=1\"\n"));
  REQUIRE(f.wait_joined(1));
  auto a = f.host("host-a");
  CHECK(a->registered_devices().at(2).device.local_id == "sim:2");
  REQUIRE(f.owner.wait([&] {
    for (auto& h : f.owner.health)
      if (h.device == "sim:2" && h.health == "failed") return true;
    return a->registered_devices().at(2).health == "failed";
  }));
  auto r = f.owner.prepare(*a, prepare_request("sim:1", "vadd", false, ""));
  REQUIRE_FALSE(r.status);
  CHECK(r.status.error().message.find("sim:1") != std::string::npos);
  r = f.owner.prepare(*a, prepare_request("sim:1", "vadd", false, ""));
  CHECK(r.status);
  CHECK(r.loaded == "vadd");
}

TEST_CASE("RemoteHost sends every field of a prepare and reads the whole result, and a malformed one is an error") {
  Fixture f;
  RawClient raw(f.port());
  auto m = raw.call(R"({"jsonrpc":"2.0","id":1,"method":"agent.register","params":{"token":")" + kToken +
                    R"(","host":"host-r","protocol":1,"devices":[{"id":"d0","kind":"fpga","model":"m"}]}})");
  REQUIRE(m.result);
  REQUIRE(f.wait_joined(1));
  auto r = f.host("host-r");

  // Asks for a prepare and answers it with `result` (the JSON text of the agent's result).
  auto prepare_answered = [&](const std::string& result) {
    Owner::Outcome out;
    f.owner.sync([&] {
      r->prepare(prepare_request("d0", "vadd", true, "web-1", std::string(64, 'c'), "42"), f.owner.record_prepare(out));
    });
    auto request = raw.next();
    CHECK(request.method == "device.prepare");
    CHECK(json::serialize(request.params) == R"({"device":"d0","bitstream":"vadd","reprogram":true,"sha256":")" +
                                                 std::string(64, 'c') + R"(","vm":"web-1","lease":"42"})");
    raw.send(R"({"jsonrpc":"2.0","id":)" + json::serialize(request.id) + R"(,"result":)" + result + "}\n");
    REQUIRE(f.owner.wait([&] { return out.done; }));
    return out;
  };
  auto out = prepare_answered(
      R"({"loaded":"vadd","attach":"pci_hostdev","guest_pci":"0000:00:0a.0","endpoint":"","details":{"kind":"fpga",)"
      R"("model":"m","vendor":"Xilinx","pci_vendor_id":4334,"pci_device_id":20485,"memory_bytes":1024,)"
      R"("host_pci":"0000:65:00.1"}})");
  REQUIRE(out.status);
  CHECK(out.result.loaded == "vadd");
  CHECK(out.result.attach == host::AttachMode::pci_hostdev);
  CHECK(out.result.guest_pci == "0000:00:0a.0");
  CHECK(out.result.details.vendor == "Xilinx");
  CHECK(out.result.details.pci_vendor_id == 0x10ee);
  CHECK(out.result.details.pci_device_id == 0x5005);
  CHECK(out.result.details.memory_bytes == 1024);
  CHECK(out.result.details.host_pci == "0000:65:00.1");

  out = prepare_answered(R"({"loaded":"vadd","attach":"teleport"})");
  REQUIRE_FALSE(out.status);
  CHECK(out.status.error().code == Errc::invalid_argument);
  CHECK(out.status.error().message == "device.prepare result: field 'attach' has unknown mode 'teleport'");
  out = prepare_answered(R"({"loaded":"vadd","details":{"memory_bytes":"1 GiB"}})");
  REQUIRE_FALSE(out.status);
  CHECK(out.status.error().message.find("field 'memory_bytes' must be a non-negative integer") != std::string::npos);
  // The link stays up: the next answer is read as usual.
  out = prepare_answered(R"({"loaded":"vadd"})");
  CHECK(out.status);
}

TEST_CASE("with a bitstream registry prepare programs verified images and refuses wrong ones") {
  Fixture f;
  AgentProcess a1("host-a", f.port(),
                  std::string("bitstreams = \"") + ACCELPOOL_OPENCL_SAMPLES + "\"\n" +
                      sim_pool("fpga:sim-u250:1,fpga:xilinx_u250_gen3x16_xdma_4_1_202210_1:1"));
  REQUIRE(f.wait_joined(1));
  auto a = f.host("host-a");
  const std::string vadd_sha = "3b0bba1b1bb9b5be2a4bcc4be2fa56a8fd0d12f4d7d3f3f4d0d0e0b7f1e1c5a0";  // not an image
  auto r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, ""));
  INFO(a1.log());
  REQUIRE(r.status);
  CHECK(r.loaded == "vadd");
  // A model the image does not list.
  r = f.owner.prepare(*a, prepare_request("sim:1", "vadd", false, ""));
  REQUIRE_FALSE(r.status);
  CHECK(r.status.error().code == Errc::incompatible);
  // No such bitstream, an unknown sha256, and the sha256 of another image.
  r = f.owner.prepare(*a, prepare_request("sim:0", "nope", false, ""));
  CHECK(r.status.error().code == Errc::not_found);
  r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, "", vadd_sha, ""));
  CHECK(r.status.error().code == Errc::not_found);  // the manager it asked has no such image
  r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, "",
                                          "bc20985d6b6af06d041bd1bfbe07f11deb31b3a9f951b425234d930d7bae350a"));
  CHECK(r.status.error().code == Errc::invalid_argument);
  CHECK(r.status.error().message.find("is image 'matmul'") != std::string::npos);
  // Nothing was changed by the refusals: the device still holds vadd.
  r = f.owner.prepare(*a, prepare_request("sim:0", "", false, ""));
  REQUIRE(r.status);
  CHECK(r.loaded == "vadd");
}

TEST_CASE("after a manager restart the agent registers again and reports what its devices hold and serve") {
  Owner owner;
  agent::ListenerOptions o;
  o.listen = {"127.0.0.1:0"};
  o.token = kToken;
  o.heartbeat_timeout = 1500ms;
  auto l = agent::AgentListener::create(o, owner.events(), owner.poster());
  REQUIRE(l);
  auto port = (*l)->tcp_port();
  AgentProcess a1("host-a", port, sim_pool("fpga:sim-u250:2"));
  REQUIRE(owner.wait([&] { return owner.joined.size() == 1; }));
  std::shared_ptr<agent::RemoteHost> a;
  owner.sync([&] { a = owner.hosts.at("host-a"); });
  auto r = owner.prepare(*a, prepare_request("sim:1", "vadd", false, "vm-x", "", "lease-1"));
  REQUIRE(r.status);

  l->reset();  // the manager goes away
  o.listen = {"127.0.0.1:" + std::to_string(port)};
  auto l2 = agent::AgentListener::create(o, owner.events(), owner.poster());
  REQUIRE(l2);
  REQUIRE(owner.wait([&] { return owner.joined.size() == 2; }));
  owner.sync([&] { a = owner.hosts.at("host-a"); });
  const auto& devs = a->registered_devices();
  REQUIRE(devs.size() == 2);
  CHECK(devs[1].device.local_id == "sim:1");
  CHECK(devs[1].device.loaded == "vadd");
  CHECK(devs[1].vm == "vm-x");
  CHECK(devs[1].lease == "lease-1");
  CHECK(devs[1].attach_state == "recorded");
  CHECK(devs[0].vm.empty());
  // Serving a VM, the device is not reset behind the lease's back; released, it is free again.
  r = owner.call([&](auto done) { a->reset("sim:1", done); });
  CHECK(r.status.error().code == Errc::invalid_state);
  r = owner.call([&](auto done) { a->release("sim:1", done); });
  CHECK(r.status);
  r = owner.call([&](auto done) { a->reset("sim:1", done); });
  CHECK(r.status);
}

#ifdef ACCELPOOL_AGENT_TEST_LIBVIRT
TEST_CASE("prepare hot-plugs a sim device into a running VM and an unacknowledged release ends in quarantine",
          "[libvirtd]") {
  std::string why;
  auto* daemon = hypervisor::testing::LibvirtDaemon::shared(&why);
  if (!daemon) {
    ACCELPOOL_SKIP("no private libvirtd here: " << why);
  }
  std::string vm = "agent-vm-" + std::to_string(::getpid());
  hypervisor::testing::VmOptions vo;
  vo.name = vm;
  auto uuid = daemon->create_vm(vo);
  REQUIRE(uuid);

  Fixture f(3s);
  auto state = temp_dir() / "host-v.state";
  fs::remove(state);
  AgentProcess a1("host-v", f.port(),
                  "state_file = \"" + state.string() + "\"\n" + sim_pool("fpga:sim-u250:1") + "[libvirt]\nuri = \"" +
                      daemon->uri() + "\"\ndetach_timeout_ms = 1500\n");
  REQUIRE(f.wait_joined(1));
  auto a = f.host("host-v");

  auto r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, vm, "", "lease-7"));
  INFO(a1.log());
  REQUIRE(r.status);
  CHECK(r.loaded == "vadd");
  CHECK(r.result.attach == host::AttachMode::emulated);  // the simulated device's memory as an ivshmem device
  auto xml = daemon->live_xml(vm);
  REQUIRE(xml);
  CHECK(xml->find("<shmem") != std::string::npos);
  CHECK(xml->find("ivshmem-plain") != std::string::npos);

  // A restarted agent learns from the VM's metadata what it attached, and registers the device as serving the VM.
  a1.stop(SIGKILL);
  REQUIRE(f.owner.wait([&] { return !f.owner.lost.empty(); }));
  a1.start();
  REQUIRE(f.wait_joined(2));
  a = f.host("host-v");
  REQUIRE(a->registered_devices().size() == 1);
  CHECK(a->registered_devices()[0].vm == vm);
  CHECK(a->registered_devices()[0].lease == "lease-7");
  CHECK(a->registered_devices()[0].attach_state == "attached");

  // A VM with no OS never acknowledges the eject: quarantine, reported unhealthy; no second grant.
  r = f.owner.call([&](auto done) { a->release("sim:0", done); });
  REQUIRE_FALSE(r.status);
  CHECK(r.status.error().code == Errc::quarantined);
  REQUIRE(f.owner.wait([&] {
    for (auto& h : f.owner.health)
      if (h.device == "sim:0" && h.health == "failed" && h.detail.find("quarantined") != std::string::npos) return true;
    return false;
  }));
  r = f.owner.prepare(*a, prepare_request("sim:0", "vadd", false, "other-vm"));
  CHECK(r.status.error().code == Errc::invalid_state);

  // The VM's end frees the device and is reported as vm.stopped with the device.
  REQUIRE(daemon->destroy_vm(vm));
  REQUIRE(f.owner.wait([&] { return !f.owner.stopped.empty(); }));
  f.owner.sync([&] {
    CHECK(f.owner.stopped[0].first == "host-v");
    CHECK(f.owner.stopped[0].second.vm_name == vm);
    CHECK(f.owner.stopped[0].second.devices == std::vector<std::string>{"sim:0"});
  });
  REQUIRE(f.owner.wait([&] { return !f.owner.health.empty() && f.owner.health.back().health == "ok"; }));
  a1.stop(SIGTERM);
  // QEMU leaves the simulated device's shared-memory file behind (named after the device id, sim:0).
  fs::remove("/dev/shm/accelpool-sim_3a0");
}
#endif

TEST_CASE("device.prepare's params and result go through the wire codec", "[agent][wire]") {
  namespace json = boost::json;
  auto r = agent::parse_prepare_request(
      json::parse(R"({"device":"sim:1","bitstream":"vadd","sha256":"ab","reprogram":true,"vm":"web-1","lease":"42"})")
          .as_object(),
      "device.prepare");
  REQUIRE(r.is_ok());
  CHECK(r->device == "sim:1");
  CHECK(r->bitstream == "vadd");
  CHECK(r->sha256 == "ab");
  CHECK(r->reprogram);
  CHECK(r->vm == "web-1");
  CHECK(r->lease == "42");
  auto unknown = agent::parse_prepare_request(json::parse(R"({"device":"sim:1","colour":"red"})").as_object(), "w");
  REQUIRE_FALSE(unknown.is_ok());
  CHECK(unknown.error().message.find("colour") != std::string::npos);
  CHECK_FALSE(agent::parse_prepare_request(json::parse(R"({"bitstream":"vadd"})").as_object(), "w").is_ok());

  host::PrepareResult result;
  result.loaded = "vadd";
  result.attach = host::AttachMode::pci_hostdev;
  result.guest_pci = "0000:00:07.0";
  result.details.kind = "fpga";
  result.details.pci_vendor_id = 0x10ee;
  result.details.memory_bytes = 1ull << 34;
  result.details.host_pci = "0000:65:00.1";
  auto o = agent::prepare_result_json(result);
  CHECK(o.at("loaded") == "vadd");
  CHECK(o.at("attach") == "pci_hostdev");
  CHECK(o.at("guest_pci") == "0000:00:07.0");
  CHECK(o.at("details").at("kind") == "fpga");
  CHECK(o.at("details").at("pci_vendor_id").to_number<std::uint64_t>() == 0x10ee);
  CHECK(o.at("details").at("memory_bytes").to_number<std::uint64_t>() == (1ull << 34));
  CHECK(o.at("details").at("host_pci") == "0000:65:00.1");
}

TEST_CASE("the agent's heartbeats carry only changes, and every 10th lists every device") {
  // A manager of the test's own: it reads what the real agent sends on the wire.
  auto lfd = agent::listen_on("127.0.0.1:0");
  REQUIRE(lfd);
  AgentProcess a("host-d", agent::bound_port(*lfd), sim_pool("fpga:sim-u250:3"));
  pollfd lp{*lfd, POLLIN, 0};
  REQUIRE(::poll(&lp, 1, static_cast<int>(testing::kHungAfter.count())) == 1);
  int fd = ::accept4(*lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  REQUIRE(fd >= 0);
  RawClient manager = RawClient::adopt(fd);
  auto next = [&] { return manager.next(); };
  auto answer = [&](const agent::Message& m, boost::json::value result) {
    manager.send(agent::result_line(m.id, std::move(result)));
  };
  auto reg = next();
  REQUIRE(reg.method == "agent.register");
  CHECK(reg.params.at("devices").as_array().size() == 3);  // registration lists every device
  answer(reg, boost::json::object{{"protocol", 1}, {"host", "host-d"}, {"heartbeat_timeout_ms", 15000}});
  std::vector<agent::Message> beats;
  while (beats.size() < 12) {
    auto m = next();
    if (m.method != "agent.heartbeat") continue;  // e.g. device.health notifications
    answer(m, boost::json::object{});
    beats.push_back(std::move(m));
  }
  for (std::size_t i = 0; i < beats.size(); ++i) {
    INFO("heartbeat " << i + 1);
    const bool full = i + 1 == 10;
    CHECK(beats[i].params.at("devices").as_array().size() == (full ? 3u : 0u));
    CHECK(beats[i].params.contains("full") == full);
  }
  ::close(*lfd);
}

namespace {

// `bytes` pseudo-random bytes (seeded: the same for every run).
std::string random_bytes(std::size_t bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(bytes, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

// A manager-side registry (a folder of this test process) holding opaque images for the simulated devices.
struct ManagerImages {
  fs::path dir;
  std::shared_ptr<bitstreams::SharedRegistry> registry;
  explicit ManagerImages(const std::string& name) : dir(temp_dir() / name) {
    fs::remove_all(dir);
    auto r = bitstreams::SharedRegistry::open(dir / "registry");
    REQUIRE(r);
    registry = *r;
  }
  // Registers `content` as bitstream `name`; returns its sha256.
  std::string add(const std::string& name, const std::string& content) {
    fs::create_directories(dir / "upload");
    auto source = dir / "upload" / (name + ".bin");
    std::ofstream(source, std::ios::binary) << content;
    auto added = registry->add(testing::sim_image_manifest(name, name + ".bin", content), source);
    REQUIRE(added);
    return added->manifest.sha256;
  }
};

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// An agent with an image folder of its own (`cache`, which does not exist yet: the agent creates it), joined to the
// fixture's listener as its only host.
struct CachingAgent {
  fs::path cache;
  AgentProcess process;
  std::shared_ptr<agent::RemoteHost> host;
  CachingAgent(Fixture& f, const std::string& name, const std::string& pool)
      : cache(temp_dir() / (name + "-cache")),
        process(name, f.port(), "bitstreams = \"" + cache.string() + "\"\n" + pool) {
    REQUIRE(f.wait_joined(1));
    host = f.host(name);
  }
};

}  // namespace

TEST_CASE("an agent fetches an image it lacks over its link in pieces, verifies it and keeps it", "[images]") {
  ManagerImages images("images-fetch");
  // Several pieces: three whole ones and a short last one.
  const std::string big = random_bytes(3 * agent::kImageChunk + 1000, 1);
  const std::string big_sha = images.add("big", big);
  Fixture f(1500ms, images.registry);
  CachingAgent h(f, "host-i", sim_pool("fpga:sim-u250:2"));
  auto& a = h.host;

  auto r = f.owner.prepare(*a, prepare_request("sim:0", "big", false, "", big_sha));
  INFO(h.process.log());
  REQUIRE(r.status);
  CHECK(r.loaded == "big");
  auto held = bitstreams::Registry::open(h.cache);
  REQUIRE(held);
  auto kept = held->find_by_sha256(big_sha);
  REQUIRE(kept);
  CHECK(file_text(kept->file_path) == big);

  // Kept: with the manager's copy gone, another device is programmed from the agent's folder.
  REQUIRE(images.registry->remove("big", "1"));
  r = f.owner.prepare(*a, prepare_request("sim:1", "big", false, "", big_sha));
  REQUIRE(r.status);
  CHECK(r.loaded == "big");
}

TEST_CASE("two devices fetch two images at once over one link, sharing its window of image requests", "[images]") {
  ManagerImages images("images-two");
  // Each fetch reads pieces ahead, in the one window of kImageRequestsAhead unanswered image requests the link
  // allows: each must get its own pieces, in order, while the other's are in flight.
  const std::string one = random_bytes(6 * agent::kImageChunk + 11, 11);
  const std::string two = random_bytes(5 * agent::kImageChunk + 22, 12);
  const std::string one_sha = images.add("one", one);
  const std::string two_sha = images.add("two", two);
  Fixture f(1500ms, images.registry);
  CachingAgent h(f, "host-t", sim_pool("fpga:sim-u250:2"));
  auto& a = h.host;
  INFO(h.process.log());

  std::vector<Owner::Outcome> outs(2);
  f.owner.sync([&] {
    a->prepare(prepare_request("sim:0", "one", false, "", one_sha), f.owner.record_prepare(outs[0]));
    a->prepare(prepare_request("sim:1", "two", false, "", two_sha), f.owner.record_prepare(outs[1]));
  });
  REQUIRE(f.owner.wait([&] { return outs[0].done && outs[1].done; }));
  REQUIRE(outs[0].status);
  REQUIRE(outs[1].status);
  CHECK(outs[0].loaded == "one");
  CHECK(outs[1].loaded == "two");
  auto held = bitstreams::Registry::open(h.cache);
  REQUIRE(held);
  auto kept_one = held->find_by_sha256(one_sha);
  auto kept_two = held->find_by_sha256(two_sha);
  REQUIRE(kept_one);
  REQUIRE(kept_two);
  CHECK(file_text(kept_one->file_path) == one);
  CHECK(file_text(kept_two->file_path) == two);
}

TEST_CASE("an image that is unknown to the manager or corrupt there is not kept and programs nothing", "[images]") {
  ManagerImages images("images-bad");
  const std::string good = random_bytes(agent::kImageChunk + 7, 2);
  const std::string good_sha = images.add("good", good);
  const std::string bad_sha = images.add("bad", random_bytes(2 * agent::kImageChunk, 3));
  // The manager's file changes after registration: what it serves no longer hashes to the sha256.
  std::ofstream(images.dir / "registry" / "bad.bin", std::ios::binary) << random_bytes(2 * agent::kImageChunk, 4);
  Fixture f(1500ms, images.registry);
  CachingAgent h(f, "host-j", sim_pool("fpga:sim-u250:1"));
  auto& a = h.host;
  INFO(h.process.log());

  auto r = f.owner.prepare(*a, prepare_request("sim:0", "good", false, "", good_sha));
  REQUIRE(r.status);
  r = f.owner.prepare(*a, prepare_request("sim:0", "bad", false, "", bad_sha));
  REQUIRE_FALSE(r.status);
  CHECK(r.status.error().code == Errc::checksum_mismatch);
  CHECK(r.status.error().message.find("fetch image " + bad_sha) != std::string::npos);
  r = f.owner.prepare(*a, prepare_request("sim:0", "good", false, "", std::string(64, 'e')));
  REQUIRE_FALSE(r.status);
  CHECK(r.status.error().code == Errc::not_found);
  CHECK(r.status.error().message.find("no image with sha256 " + std::string(64, 'e')) != std::string::npos);
  // The device still holds what it held, and the folder only the good image: no piece of the others is left.
  r = f.owner.prepare(*a, prepare_request("sim:0", "", false, ""));
  REQUIRE(r.status);
  CHECK(r.loaded == "good");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(h.cache)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{"good-1.toml", "good.bin"});
}

TEST_CASE("image requests need a registered agent, are answered in bounded pieces and name what is wrong", "[images]") {
  ManagerImages images("images-raw");
  const std::string content = random_bytes(agent::kImageChunk + 100, 5);
  const std::string sha = images.add("raw", content);
  Fixture f(5000ms, images.registry);
  RawClient raw(f.port());
  auto read_line = [&](int id, std::uint64_t offset, std::uint64_t length, const std::string& more = "") {
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"method":"image.read","params":{"sha256":")" + sha +
           R"(","offset":)" + std::to_string(offset) + R"(,"length":)" + std::to_string(length) + more + "}}";
  };
  // Before agent.register (which needs the agent token) nothing is served.
  auto m = raw.call(read_line(2, 0, 10));
  REQUIRE(m.error);
  CHECK(m.error->code == Errc::unauthorized);
  m = raw.call(R"({"jsonrpc":"2.0","id":1,"method":"agent.register","params":{"token":")" + kToken +
               R"(","host":"host-raw","protocol":1,"devices":[]}})");
  REQUIRE(m.result);

  m = raw.call(R"({"jsonrpc":"2.0","id":3,"method":"image.manifest","params":{"sha256":")" + sha + R"("}})");
  REQUIRE(m.result);
  CHECK(m.result->at("size").to_number<std::uint64_t>() == content.size());
  auto manifest = bitstreams::parse_manifest(m.result->at("manifest").as_string(), "answer");
  REQUIRE(manifest);
  CHECK(manifest->sha256 == sha);
  // A whole piece, the tail, and nothing past the end.
  auto piece = [&](const agent::Message& answer) {
    REQUIRE(answer.result);
    auto bytes = bitstreams::base64_decode(answer.result->at("data").as_string());
    REQUIRE(bytes);
    return *bytes;
  };
  CHECK(piece(raw.call(read_line(4, 0, agent::kImageChunk))) == content.substr(0, agent::kImageChunk));
  CHECK(piece(raw.call(read_line(5, content.size() - 10, 100))) == content.substr(content.size() - 10));
  CHECK(piece(raw.call(read_line(6, content.size(), 100))).empty());
  // What is wrong is named, and changes nothing.
  auto refused = [&](const std::string& line) {
    auto answer = raw.call(line);
    REQUIRE(answer.error);
    return *answer.error;
  };
  auto e = refused(read_line(7, 0, 0));
  CHECK(e.code == Errc::invalid_argument);
  CHECK(e.message.find("field 'length'") != std::string::npos);
  e = refused(read_line(8, 0, agent::kImageChunk + 1));
  CHECK(e.code == Errc::invalid_argument);
  CHECK(e.message.find("field 'length'") != std::string::npos);
  e = refused(read_line(9, 0, 10, R"(,"extra":1)"));
  CHECK(e.code == Errc::invalid_argument);
  CHECK(e.message.find("'extra'") != std::string::npos);
  e = refused(R"({"jsonrpc":"2.0","id":10,"method":"image.manifest","params":{"sha256":")" + std::string(64, 'f') +
              R"("}})");
  CHECK(e.code == Errc::not_found);
  e = refused(R"({"jsonrpc":"2.0","id":11,"method":"image.write","params":{}})");
  CHECK(e.code == Errc::method_not_found);
  // The link serves on.
  m = raw.call(R"({"jsonrpc":"2.0","id":12,"method":"agent.heartbeat","params":{"devices":[]}})");
  CHECK(m.result);
}

TEST_CASE("the retired agent.images_url is refused, naming what replaced it", "[images]") {
  AgentProcess a("host-old", 1,
                 "bitstreams = \"" + (temp_dir() / "host-old-cache").string() +
                     "\"\nimages_url = \"http://127.0.0.1:7080\"\n" + sim_pool("fpga:sim-u250:1"));
  auto code = a.wait_exit(testing::kHungAfter);
  REQUIRE(code);
  CHECK(*code == 2);  // a bad config file
  CHECK_THAT(a.log(), Catch::Contains("agent.images_url") && Catch::Contains("no longer supported") &&
                          Catch::Contains("agent connection"));
}
