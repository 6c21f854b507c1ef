// The C++ client against the real accelpool-manager on loopback.
#include "client_options.hpp"
#include "manager_fixture.hpp"

#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

using namespace accelpool::shim;
using accelpool::Errc;
using accelpool::shim::test::eventually;
using accelpool::shim::test::fpga_pool;
using accelpool::shim::test::ManagerProcess;
using Clock = std::chrono::steady_clock;
using accelpool::shim::test::renewed_past_ttl;

namespace {

std::unique_ptr<Client> connect(const ManagerProcess& m, const std::string& guest, bool unix_socket = false) {
  auto c = Client::connect(test::connect_options(unix_socket ? m.unix_uri() : m.tcp_uri(), m.guest_token(), guest));
  INFO((c ? std::string() : accelpool::describe(c.error())));
  REQUIRE(c);
  return std::move(*c);
}

// How long an acquire that must be granted may wait: only a hung pool takes this long.
const double kGranted = std::chrono::duration<double>(accelpool::testing::kHungAfter).count();

AcquireOptions fpga(std::optional<double> timeout_s = std::nullopt) {
  AcquireOptions a;
  a.kind = "fpga";
  if (timeout_s) a.timeout = Seconds(*timeout_s);
  return a;
}

// A lease of one fpga device, which must be granted.
Lease granted_fpga(Client& c) {
  auto lease = c.acquire(fpga(kGranted));
  INFO((lease ? std::string() : lease.error().message));
  REQUIRE(lease);
  return std::move(*lease);
}

}  // namespace

TEST_CASE("acquire returns a ready grant and release ends it", "[integration][shim]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-a");
  CHECK(c->tenant() == "default");
  Lease lease = granted_fpga(*c);
  LeaseInfo info = lease.info();
  CHECK(info.state == LeaseState::granted);
  CHECK(info.ready);
  CHECK(info.kind == "fpga");
  CHECK(info.guest == "vm-a");
  REQUIRE(info.devices.size() == 1);
  CHECK(info.devices[0].host == "local");
  CHECK(info.json.find("\"granted\"") != std::string::npos);
  auto server = c->get(info.id);
  REQUIRE(server);
  CHECK(server->state == LeaseState::granted);
  auto live = c->list();
  REQUIRE(live);
  REQUIRE(live->size() == 1);
  CHECK((*live)[0].id == info.id);

  REQUIRE(lease.release());
  CHECK(lease.release());  // idempotent
  auto after = c->get(info.id);
  REQUIRE(after);
  CHECK(after->state == LeaseState::released);
}

TEST_CASE("a Lease is released when it goes out of scope", "[integration][shim]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-raii", /*unix_socket=*/true);
  std::uint64_t id = 0;
  {
    Lease lease = granted_fpga(*c);
    id = lease.id();
    Lease moved = std::move(lease);  // move-only: the moved-from lease releases nothing
    CHECK(moved.id() == id);
    CHECK_FALSE(lease.valid());
    auto s = c->get(id);
    REQUIRE(s);
    CHECK(s->state == LeaseState::granted);
  }
  auto s = c->get(id);
  REQUIRE(s);
  CHECK(s->state == LeaseState::released);
}

TEST_CASE("a request waits in the queue while the pool is full and is granted when a device frees",
          "[integration][shim]") {
  ManagerProcess m(fpga_pool(2, /*ttl_s=*/1.0));
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-q");
  Lease a = granted_fpga(*c);
  Lease b = granted_fpga(*c);
  CHECK(a.info().devices[0].name != b.info().devices[0].name);

  std::atomic<int> callbacks{0};
  auto pending = c->acquire_async(fpga(kGranted), [&](std::uint64_t, const accelpool::Status& s) {
    if (s) ++callbacks;
  });
  REQUIRE(eventually([&] { return pending.lease_id() != 0; }));
  // Past the TTL: heartbeats keep the queued request (and the two grants) alive.
  REQUIRE(renewed_past_ttl(*c, pending.lease_id(), 1.0));
  REQUIRE(renewed_past_ttl(*c, a.id(), 1.0));
  REQUIRE(renewed_past_ttl(*c, b.id(), 1.0));
  CHECK_FALSE(pending.done());
  auto queued = c->get(pending.lease_id());
  REQUIRE(queued);
  CHECK(queued->state == LeaseState::queued);

  std::string freed = a.info().devices[0].name;
  REQUIRE(a.release());
  auto third = pending.wait();
  REQUIRE(third);
  CHECK(third->info().devices[0].name == freed);
  CHECK(eventually([&] { return callbacks.load() == 1; }));
}

TEST_CASE("an acquire that is not granted in time fails with timeout and its request is cancelled",
          "[integration][shim]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-t");
  Lease held = granted_fpga(*c);
  auto t0 = Clock::now();
  auto pending = c->acquire_async(fpga(0.5));
  auto r = pending.wait();
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::timeout);
  CHECK(took >= 0.45);  // not before its timeout
  std::uint64_t id = pending.lease_id();
  REQUIRE(id != 0);
  CHECK(eventually([&] {
    auto s = c->get(id);
    return s && s->state == LeaseState::cancelled;
  }));

  // Blocking form, and cancel of an asynchronous one.
  auto r2 = c->acquire(fpga(0.2));
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code == Errc::timeout);
  auto p3 = c->acquire_async(fpga());
  REQUIRE(eventually([&] { return p3.lease_id() != 0; }));
  REQUIRE(p3.cancel());
  auto r3 = p3.wait();
  REQUIRE_FALSE(r3);
  CHECK(r3.error().code == Errc::cancelled);
  std::uint64_t id3 = p3.lease_id();
  CHECK(eventually([&] {
    auto s = c->get(id3);
    return s && s->state == LeaseState::cancelled;
  }));
  // The held lease was untouched.
  CHECK(c->get(held.id())->state == LeaseState::granted);
}

TEST_CASE("a request no device can serve fails at once as infeasible", "[integration][shim]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-i");
  AcquireOptions gpu;
  gpu.kind = "gpu";
  auto r = c->acquire(gpu);  // no timeout: only the refusal ends it
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::infeasible);
  CHECK(r.error().message.find("gpu") != std::string::npos);
  AcquireOptions many = fpga();
  many.count = 50;
  auto r2 = c->acquire(many);
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code == Errc::infeasible);
  AcquireOptions empty;
  auto r3 = c->acquire(empty);
  REQUIRE_FALSE(r3);
  CHECK(r3.error().code == Errc::invalid_argument);
}

TEST_CASE("a wrong token is refused with unauthorized", "[integration][shim]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto c = Client::connect(test::connect_options(m.tcp_uri(), "apt_not_a_real_token", "vm-bad"));
  REQUIRE_FALSE(c);
  CHECK(c.error().code == Errc::unauthorized);
  CHECK(c.error().message.find(m.tcp_uri()) != std::string::npos);
}

TEST_CASE("an unreachable pool is a clear error, not a hang", "[integration][shim]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  std::string tcp = m.tcp_uri(), unix_uri = m.unix_uri(), token = m.guest_token();
  m.stop();  // nothing listens on these any more
  for (const auto& uri : {tcp, unix_uri, std::string("serial://no-such-accelpool-port")}) {
    ClientOptions o = test::connect_options(uri, token, "vm-u");
    o.connect_timeout = Seconds(1);
    auto c = Client::connect(o);
    REQUIRE_FALSE(c);
    CHECK(c.error().code == Errc::unreachable);
  }
  auto c = Client::connect(test::connect_options("http://127.0.0.1:7070", "x", ""));
  REQUIRE_FALSE(c);
  CHECK(c.error().code == Errc::invalid_argument);
}

TEST_CASE("the client reconnects when the stream drops and keeps its lease alive", "[integration][shim]") {
  ManagerProcess m(fpga_pool(1, 1.5));
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-r");
  Lease lease = granted_fpga(*c);
  CHECK(c->connections() == 1);
  c->drop_connection_for_testing();
  REQUIRE(eventually([&] { return c->connections() == 2 && c->connected(); }));
  // Past the TTL: only the heartbeats of the resumed lease keep it.
  REQUIRE(renewed_past_ttl(*c, lease.id(), 1.5));
  auto s = c->get(lease.id());
  REQUIRE(s);
  CHECK(s->state == LeaseState::granted);
  CHECK(lease.state() == LeaseState::granted);
  REQUIRE(lease.release());
  CHECK(c->get(lease.id())->state == LeaseState::released);
}

TEST_CASE("a lease survives a manager restart: the client reconnects and resumes it", "[integration][shim]") {
  ManagerProcess m(fpga_pool(1));
  REQUIRE_MANAGER(m);
  ClientOptions o = test::connect_options(m.unix_uri(), m.guest_token(), "vm-restart");
  // A call waits for the pool as long as a restart may take on a loaded machine.
  o.call_timeout = accelpool::testing::kHungAfter;
  auto connected = Client::connect(o);
  REQUIRE(connected);
  auto c = std::move(*connected);
  Lease lease = granted_fpga(*c);
  m.stop();
  REQUIRE(eventually([&] { return !c->connected(); }));
  // A call while the pool is away waits for it (up to the call timeout): the pool restarts once the call is
  // being made.
  std::atomic<bool> calling{false};
  std::optional<accelpool::Result<LeaseInfo>> got;
  std::thread caller([&] {
    calling = true;
    got = c->get(lease.id());
  });
  REQUIRE(eventually([&] { return calling.load(); }));
  (void)m.start();
  caller.join();
  REQUIRE(got);
  auto& s = *got;
  INFO(m.error());
  REQUIRE(m.running());
  REQUIRE(s);
  CHECK(s->state == LeaseState::granted);
  CHECK(c->connections() >= 2);
  // A second client of another guest queues behind it: the device is still ours.
  auto other = connect(m, "vm-other", true);
  auto r = other->acquire(fpga(0.3));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::timeout);
  REQUIRE(lease.release());
  auto r2 = other->acquire(fpga(kGranted));
  CHECK(r2);
}

TEST_CASE("a revoked lease runs the revocation callback with its deadline, then ends", "[integration][shim]") {
  ManagerProcess m(fpga_pool(1, 30, 1));
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-rev");
  std::mutex mu;
  std::vector<LeaseInfo> revoking, ended;
  AcquireOptions a = fpga(kGranted);
  a.on_revoking = [&](const LeaseInfo& l) {
    std::lock_guard<std::mutex> lk(mu);
    revoking.push_back(l);
  };
  a.on_ended = [&](const LeaseInfo& l) {
    std::lock_guard<std::mutex> lk(mu);
    ended.push_back(l);
  };
  auto lease = c->acquire(a);
  REQUIRE(lease);
  std::string body;
  int code = m.admin_request("POST", "/v1/leases/" + std::to_string(lease->id()) + "/revoke",
                             R"({"reason":"maintenance"})", body);
  INFO(body);
  REQUIRE(code == 200);
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lk(mu);
    return !revoking.empty();
  }));
  {
    std::lock_guard<std::mutex> lk(mu);
    CHECK(revoking[0].id == lease->id());
    CHECK(revoking[0].state == LeaseState::revoking);
    REQUIRE(revoking[0].revoke_deadline);
    CHECK(*revoking[0].revoke_deadline > revoking[0].granted_at);
  }
  CHECK(lease->revoking());
  // Not released within the grace period: the pool ends it and on_ended says so.
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lk(mu);
    return !ended.empty();
  }));
  {
    std::lock_guard<std::mutex> lk(mu);
    CHECK(ended[0].state == LeaseState::revoked);
    CHECK(revoking.size() == 1);
  }
  CHECK(lease->state() == LeaseState::revoked);
  CHECK(lease->release());  // already ended: ok

  // A callback set after the grant still sees a revocation.
  Lease l2 = granted_fpga(*c);
  std::atomic<bool> seen{false};
  l2.on_revoking([&](const LeaseInfo&) { seen = true; });
  REQUIRE(m.admin_request("POST", "/v1/leases/" + std::to_string(l2.id()) + "/revoke", "{}", body) == 200);
  REQUIRE(eventually([&] { return seen.load(); }));
  REQUIRE(l2.release());
  CHECK(c->get(l2.id())->state == LeaseState::released);
}

TEST_CASE("closing the client releases the leases it still holds", "[integration][shim]") {
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  auto c = connect(m, "vm-close");
  Lease l1 = granted_fpga(*c);
  Lease l2 = granted_fpga(*c);
  std::uint64_t id1 = l1.id(), id2 = l2.id();
  c.reset();
  CHECK(l1.release());  // the client released it already
  auto c2 = connect(m, "vm-close");
  CHECK(c2->get(id1)->state == LeaseState::released);
  CHECK(c2->get(id2)->state == LeaseState::released);
  auto live = c2->list();
  REQUIRE(live);
  CHECK(live->empty());
}

TEST_CASE("serial:// finds the port by its name and speaks the protocol over it", "[integration][shim][serial]") {
  // A pty stands in for the virtio-serial port; its other end is relayed to the pool, as the host agent does.
  ManagerProcess m;
  REQUIRE_MANAGER(m);
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  std::string slave_path = ptsname(master);
  int slave = ::open(slave_path.c_str(), O_RDWR | O_NOCTTY);  // held open so the raw settings stay
  REQUIRE(slave >= 0);
  termios t{};
  tcgetattr(slave, &t);
  cfmakeraw(&t);
  tcsetattr(slave, TCSANOW, &t);
  std::string root = test::make_temp_dir("accelpool-serial-");
  test::make_virtio_ports(root + "/sys", {{"vport0p1", "org.qemu.guest_agent.0"}, {"vport0p2", "org.accelpool.guest"}});
  std::filesystem::create_directories(root + "/dev");
  std::filesystem::create_symlink(slave_path, root + "/dev/vport0p2");

  auto ep = parse_pool_uri(m.tcp_uri());
  REQUIRE(ep);
  auto up = open_stream(*ep, std::chrono::milliseconds(2000));
  REQUIRE(up);
  std::atomic<bool> stop{false};
  std::thread relay([&] {
    pollfd fds[2] = {{master, POLLIN, 0}, {up->fd, POLLIN, 0}};
    char buf[8192];
    while (!stop) {
      if (poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n > 0) {
          int to = i == 0 ? up->fd : master;
          for (ssize_t off = 0; off < n;) {
            ssize_t w = ::write(to, buf + off, static_cast<std::size_t>(n - off));
            if (w > 0)
              off += w;
            else if (errno != EAGAIN)
              break;
          }
        }
      }
    }
  });
  {
    ClientOptions o = test::connect_options("serial://org.accelpool.guest", m.guest_token(), "vm-serial");
    o.serial_sys_dir = root + "/sys";
    o.serial_dev_dir = root + "/dev";
    auto c = Client::connect(o);
    INFO((c ? std::string() : c.error().message));
    REQUIRE(c);
    auto lease = (*c)->acquire(fpga(kGranted));
    REQUIRE(lease);
    CHECK(lease->info().guest == "vm-serial");
    std::uint64_t id = lease->id();
    REQUIRE(lease->release());
    CHECK((*c)->get(id)->state == LeaseState::released);

    ClientOptions wrong = o;
    wrong.uri = "serial://org.accelpool.other";
    auto w = Client::connect(wrong);
    REQUIRE_FALSE(w);
    CHECK(w.error().code == Errc::unreachable);
    CHECK(w.error().message.find("org.accelpool.guest (vport0p2)") != std::string::npos);
  }
  stop = true;
  relay.join();
  ::close(up->fd);
  ::close(slave);
  ::close(master);
  test::remove_tree(root);
}
