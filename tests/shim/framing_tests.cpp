// Unit tests (URIs, virtio-serial port lookup, lease descriptions) and the failure cases the real manager cannot
// produce on demand (a stream that drops in the middle of a call, a call never answered), against a tiny
// JSON-lines server in the test.
#include "client_options.hpp"
#include "manager_fixture.hpp"

#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

using namespace accelpool::shim;
using accelpool::Errc;
using json = nlohmann::json;

TEST_CASE("pool URIs are parsed, bad ones refused with the reason", "[shim]") {
  auto t = parse_pool_uri("tcp://127.0.0.1:7070");
  REQUIRE(t);
  CHECK(t->kind == PoolUri::Kind::tcp);
  CHECK(t->host == "127.0.0.1");
  CHECK(t->port == "7070");
  auto v6 = parse_pool_uri("tcp://[::1]:9");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
  auto u = parse_pool_uri("unix:///run/accelpool/guest.sock");
  REQUIRE(u);
  CHECK(u->kind == PoolUri::Kind::unix_socket);
  CHECK(u->path == "/run/accelpool/guest.sock");
  auto s = parse_pool_uri("serial://org.accelpool.guest");
  REQUIRE(s);
  CHECK(s->kind == PoolUri::Kind::serial);
  CHECK(s->name == "org.accelpool.guest");
  for (const char* bad : {"tcp://host", "tcp://host:0", "tcp://host:99999", "tcp://:80", "http://x:1", "unix://",
                          "serial://", "serial://a/b", ""}) {
    auto r = parse_pool_uri(bad);
    INFO(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::invalid_argument);
    CHECK(r.error().message.find("pool URI") != std::string::npos);
  }
}

TEST_CASE("a virtio-serial port is found by its name", "[shim]") {
  std::string root = test::make_temp_dir("accelpool-vport-");
  test::make_virtio_ports(root + "/sys", {{"vport0p1", "org.qemu.guest_agent.0"},
                                          {"vport0p2", "org.accelpool.guest"},
                                          {"vport1p1", ""}});  // a port without a name
  auto p = find_virtio_port("org.accelpool.guest", root + "/sys", "/dev");
  REQUIRE(p);
  CHECK(*p == "/dev/vport0p2");
  auto missing = find_virtio_port("other", root + "/sys", "/dev");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == Errc::unreachable);
  CHECK(missing.error().message.find("org.accelpool.guest (vport0p2)") != std::string::npos);
  auto nodir = find_virtio_port("x", root + "/nothing", "/dev");
  REQUIRE_FALSE(nodir);
  CHECK(nodir.error().code == Errc::unreachable);
  test::remove_tree(root);
}

TEST_CASE("lease objects and device names become descriptions", "[shim]") {
  auto l = parse_lease(R"({"id":12,"state":"granted","ready":true,"tenant":"default","guest":"vm-7","kind":"gpu",
    "bitstream":"vadd","count":3,"devices":["local/opencl:0:1.1","h2/xrt:0000:65:00.1","local/sim:3"],
    "created_at":10.5,"granted_at":11.0,"ended_at":null,"expires_at":40.0,"revoke_deadline":null,"end_reason":"",
    "device_info":[{"name":"local/sim:3","model":"u250","pci":"0000:00:05.0","xrt_index":2}]})");
  REQUIRE(l);
  CHECK(l->id == 12);
  CHECK(l->state == LeaseState::granted);
  CHECK(l->ready);
  CHECK(l->bitstream == "vadd");
  CHECK_FALSE(l->revoke_deadline);
  REQUIRE(l->devices.size() == 3);
  CHECK(l->devices[0].backend == "opencl");
  CHECK(l->devices[0].opencl_platform == 0);
  CHECK(l->devices[0].opencl_device == 1);
  CHECK(l->devices[0].opencl_subdevice == 1);
  CHECK(l->devices[1].host == "h2");
  CHECK(l->devices[1].pci_address == "0000:65:00.1");
  CHECK(l->devices[2].model == "u250");
  CHECK(l->devices[2].pci_address == "0000:00:05.0");
  CHECK(l->devices[2].xrt_index == 2);
  CHECK_FALSE(l->devices[2].opencl_platform);
  auto bad = parse_lease(R"({"state":"granted"})");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == Errc::protocol);
}

TEST_CASE("what the server says of a device replaces what its name suggests", "[shim]") {
  auto l = parse_lease(R"({"id":7,"state":"granted","ready":true,"kind":"fpga","count":2,
    "devices":["hv-01/xrt:0000:65:00.1","hv-01/sim:0"],
    "device_info":[{"name":"hv-01/xrt:0000:65:00.1","kind":"fpga","model":"xilinx_u250_gen3x16_xdma_4_1_202210_1",
      "vendor":"Xilinx","pci_vendor_id":4334,"pci_device_id":20485,"memory_bytes":68719476736,
      "attach":"pci_hostdev","pci":"0000:00:0a.0","endpoint":"","loaded":"vadd"},
     {"name":"hv-01/sim:0","kind":"fpga","model":"sim-u250","attach":"network","pci":"","endpoint":"10.0.0.7:5000",
      "pci_vendor_id":-1,"memory_bytes":"lots"}]})");
  REQUIRE(l);
  REQUIRE(l->devices.size() == 2);
  const auto& x = l->devices[0];
  CHECK(x.pci_address == "0000:00:0a.0");  // where the guest sees it, not the host's BDF in the name
  CHECK(x.attach == "pci_hostdev");
  CHECK(x.kind == "fpga");
  CHECK(x.model == "xilinx_u250_gen3x16_xdma_4_1_202210_1");
  CHECK(x.vendor == "Xilinx");
  CHECK(x.pci_vendor_id == 0x10ee);
  CHECK(x.pci_device_id == 0x5005);
  CHECK(x.memory_bytes == 68719476736ull);
  CHECK(x.loaded == "vadd");
  const auto& s = l->devices[1];
  CHECK(s.attach == "network");
  CHECK(s.endpoint == "10.0.0.7:5000");
  CHECK(s.pci_vendor_id == 0);  // not a valid id: unknown
  CHECK(s.memory_bytes == 0);
}

namespace {

// A JSON-lines server on 127.0.0.1 that answers hello and hands every other request to `on_request`, which returns
// the reply line ("" for none) or "DROP" to close the connection without answering.
class LineServer {
 public:
  explicit LineServer(std::function<std::string(const json&)> on_request) : on_request_(std::move(on_request)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(fd_, 8);
    thread_ = std::thread([this] { run(); });
  }
  ~LineServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  int hellos() const { return hellos_; }

 private:
  void run() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      serve(c);
      ::close(c);
    }
  }
  void serve(int c) {
    std::string buf;
    char tmp[4096];
    for (;;) {
      ssize_t n = ::read(c, tmp, sizeof tmp);
      if (n <= 0) return;
      buf.append(tmp, static_cast<std::size_t>(n));
      std::size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        json req = json::parse(buf.substr(0, nl));
        buf.erase(0, nl + 1);
        std::string reply;
        if (req["method"] == "hello") {
          ++hellos_;
          reply =
              json{{"jsonrpc", "2.0"},
                   {"id", req["id"]},
                   {"result",
                    {{"protocol", 1}, {"server", "test"}, {"tenant", "t"}, {"guest", "g"}, {"leases", json::array()}}}}
                  .dump();
        } else {
          reply = on_request_(req);
          if (reply == "DROP") return;
        }
        if (!reply.empty()) {
          // Split the line in two writes: the client must reassemble it.
          reply += "\n";
          std::size_t half = reply.size() / 2;
          (void)::send(c, reply.data(), half, MSG_NOSIGNAL);
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          (void)::send(c, reply.data() + half, reply.size() - half, MSG_NOSIGNAL);
        }
      }
    }
  }
  std::function<std::string(const json&)> on_request_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> hellos_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a stream that drops during a call fails that call as disconnected, then reconnects", "[shim]") {
  std::atomic<int> acquires{0};
  LineServer server([&](const json& req) -> std::string {
    if (req["method"] == "acquire" && acquires++ == 0) return "DROP";
    if (req["method"] == "list") {
      return json{{"jsonrpc", "2.0"}, {"id", req["id"]}, {"result", {{"leases", json::array()}}}}.dump();
    }
    return json{{"jsonrpc", "2.0"},
                {"id", req["id"]},
                {"error", {{"code", -32022}, {"message", "no such kind"}, {"data", {{"code", "infeasible"}}}}}}
        .dump();
  });
  auto c = Client::connect(test::connect_options(server.uri(), "t", "g"));
  REQUIRE(c);
  AcquireOptions a;
  a.kind = "fpga";
  auto r = (*c)->acquire(a);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::disconnected);
  // The next call goes over a new connection, with a new hello.
  auto l = (*c)->list();
  REQUIRE(l);
  CHECK(l->empty());
  CHECK(server.hellos() == 2);
  CHECK((*c)->connections() == 2);
  // Errors carry the protocol's data.code.
  auto r2 = (*c)->acquire(a);
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code == Errc::infeasible);
  CHECK(r2.error().message.find("no such kind") != std::string::npos);
}

TEST_CASE("a call the server never answers fails with timeout", "[shim]") {
  LineServer server([](const json&) { return std::string(); });
  ClientOptions o = test::connect_options(server.uri(), "t", "g");
  o.call_timeout = Seconds(0.3);
  auto c = Client::connect(o);
  REQUIRE(c);
  auto t0 = std::chrono::steady_clock::now();
  auto l = (*c)->list();
  REQUIRE_FALSE(l);
  CHECK(l.error().code == Errc::timeout);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 0.25);  // not before the call timeout
}
