// The opencl backend's remote server, spoken to in the remote OpenCL wire format over a real TCP connection, on
// PoCL's real device (docs/remote-opencl.md). The end-to-end tests (tests/remote-opencl) run unmodified programs
// through libaccelpool-opencl.so; these check the server's own promises, and run in the sanitizer builds too.
#include <accelpool/backends/opencl_backend.hpp>
#include <accelpool/common/cl_wire.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "skip.hpp"

using namespace accelpool::backends;
namespace clwire = accelpool::clwire;
using clwire::Op;

namespace {

constexpr std::int32_t kSuccess = 0, kInvalidDevice = -33, kInvalidMemObject = -38;

// One connection to an endpoint, speaking frames.
class Peer {
 public:
  explicit Peer(const std::string& endpoint) {
    REQUIRE(clwire::parse_endpoint(endpoint, e_));
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    REQUIRE(::getaddrinfo(e_.host.c_str(), e_.port.c_str(), &hints, &found) == 0);
    fd_ = ::socket(found->ai_family, SOCK_STREAM, 0);
    const int rc = ::connect(fd_, found->ai_addr, found->ai_addrlen);
    ::freeaddrinfo(found);
    REQUIRE(rc == 0);
  }
  ~Peer() { ::close(fd_); }
  const std::string& capability() const { return e_.capability; }

  void send(clwire::Writer& w) {
    const std::string& f = w.frame();
    REQUIRE(::send(fd_, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
  }
  void send_raw(const std::string& bytes) { (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  // The next reply: its status and fields; nullopt-like status 1 when the connection ended.
  std::int32_t reply(std::string& fields) {
    std::uint32_t size = 0;
    if (!read(reinterpret_cast<char*>(&size), 4)) return 1;
    std::string payload(size, '\0');
    if (!read(payload.data(), size)) return 1;
    clwire::Reader r(payload);
    REQUIRE(static_cast<Op>(r.u16()) == Op::reply);
    r.u16();
    const std::int32_t status = r.i32();
    fields = payload.substr(8);
    return status;
  }
  std::int32_t call(clwire::Writer& w, std::string* fields = nullptr) {
    send(w);
    std::string ignored;
    return reply(fields != nullptr ? *fields : ignored);
  }
  std::int32_t hello(const std::string& capability) {
    clwire::Writer w(Op::hello, clwire::kWantsReply);
    w.u32(clwire::kVersion).str(capability);
    return call(w);
  }
  // True when the server closed the connection (a read returns end of file).
  bool closed_by_server() {
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  bool read(char* p, std::size_t n) {
    while (n > 0) {
      ssize_t got = ::recv(fd_, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }
  clwire::Endpoint e_;
  int fd_ = -1;
};

// The backend serving on loopback and its first device, or a null backend (the test is then skipped).
std::pair<std::unique_ptr<OpenClBackend>, std::string> serving_backend() {
  auto b = OpenClBackend::create({{"cache_dir", ACCELPOOL_POCL_CACHE_DIR}, {"remote_listen", "127.0.0.1:0"}});
  REQUIRE(b.is_ok());
  auto devices = (*b)->enumerate();
  REQUIRE(devices.is_ok());
  if (devices->empty()) {
    accelpool::testing::skip("the OpenCL ICD loader reports no device (install pocl-opencl-icd)");
    return {};
  }
  return {std::move(*b), devices->front().local_id};
}

// Creates context 1, queue 2 and a 16-byte buffer 3 holding `data`; returns the buffer's bytes read back.
std::string round_trip(Peer& p, const std::string& data) {
  clwire::Writer context(Op::create_context, clwire::kWantsReply);
  context.u64(1);
  REQUIRE(p.call(context) == kSuccess);
  clwire::Writer queue(Op::create_queue, clwire::kWantsReply);
  queue.u64(2).u64(1).u64(0);
  REQUIRE(p.call(queue) == kSuccess);
  clwire::Writer buffer(Op::create_buffer, clwire::kWantsReply);
  buffer.u64(3).u64(1).u64(0).u64(data.size()).str(data);
  REQUIRE(p.call(buffer) == kSuccess);
  clwire::Writer read(Op::read_buffer, clwire::kWantsReply);
  read.u64(2).u64(3).u64(0).u64(data.size()).ids({}).u64(0);
  std::string fields;
  REQUIRE(p.call(read, &fields) == kSuccess);
  clwire::Reader r(fields);
  return std::string(r.bytes());
}

}  // namespace

TEST_CASE("remote opencl: a device is served only to the capability of its open lease", "[opencl][remote]") {
  auto [b, device] = serving_backend();
  if (!b) return;
  CHECK(b->open_remote("opencl:no-such-device").error().code == accelpool::Errc::not_found);
  auto endpoint = b->open_remote(device);
  REQUIRE(endpoint.is_ok());
  CHECK(endpoint->rfind("ocl+tcp://127.0.0.1:", 0) == 0);

  Peer stranger(*endpoint);
  CHECK(stranger.hello("not-the-capability") == kInvalidDevice);
  CHECK(stranger.closed_by_server());

  Peer tenant(*endpoint);
  REQUIRE(tenant.hello(tenant.capability()) == kSuccess);
  CHECK(round_trip(tenant, "sixteen bytes!!!") == "sixteen bytes!!!");

  // The lease ends: the connection is cut, and the old capability opens nothing any more.
  b->close_remote(device);
  CHECK(tenant.closed_by_server());
  Peer late(*endpoint);
  CHECK(late.hello(late.capability()) == kInvalidDevice);

  // The next lease gets a capability of its own, and none of the last tenant's objects.
  auto next = b->open_remote(device);
  REQUIRE(next.is_ok());
  CHECK(*next != *endpoint);
  Peer second(*next);
  REQUIRE(second.hello(second.capability()) == kSuccess);
  clwire::Writer read(Op::read_buffer, clwire::kWantsReply);
  read.u64(2).u64(3).u64(0).u64(16).ids({}).u64(0);
  CHECK(second.call(read) == -36);  // CL_INVALID_COMMAND_QUEUE: queue 2 was the last tenant's
}

TEST_CASE("remote opencl: errors of requests without a reply come back at the next finish", "[opencl][remote]") {
  auto [b, device] = serving_backend();
  if (!b) return;
  auto endpoint = b->open_remote(device);
  REQUIRE(endpoint.is_ok());
  Peer p(*endpoint);
  REQUIRE(p.hello(p.capability()) == kSuccess);
  CHECK(round_trip(p, std::string(16, 'x')) == std::string(16, 'x'));
  // A non-blocking copy from a buffer that does not exist: no reply, its error is kept.
  clwire::Writer copy(Op::copy_buffer);
  copy.u64(2).u64(99).u64(3).u64(0).u64(0).u64(4).ids({}).u64(0);
  p.send(copy);
  clwire::Writer finish(Op::finish, clwire::kWantsReply);
  finish.u64(2);
  CHECK(p.call(finish) == kInvalidMemObject);
  clwire::Writer again(Op::finish, clwire::kWantsReply);
  again.u64(2);
  CHECK(p.call(again) == kSuccess);  // told once
}

TEST_CASE("remote opencl: a malformed frame ends its connection only", "[opencl][remote]") {
  auto [b, device] = serving_backend();
  if (!b) return;
  auto endpoint = b->open_remote(device);
  REQUIRE(endpoint.is_ok());
  Peer bad(*endpoint);
  REQUIRE(bad.hello(bad.capability()) == kSuccess);
  // A get_info whose fields stop short, then a frame that claims 2 GiB.
  clwire::Writer short_frame(Op::get_info, clwire::kWantsReply);
  short_frame.u8(1);
  bad.send(short_frame);
  CHECK(bad.closed_by_server());
  Peer huge(*endpoint);
  REQUIRE(huge.hello(huge.capability()) == kSuccess);
  huge.send_raw(std::string("\xff\xff\xff\x7f", 4));
  CHECK(huge.closed_by_server());

  Peer good(*endpoint);
  REQUIRE(good.hello(good.capability()) == kSuccess);
  CHECK(round_trip(good, "still serving...") == "still serving...");
}

TEST_CASE("remote opencl: serving settings that do not fit together are refused naming the key", "[opencl][remote]") {
  auto refused = [](BackendConfig c, accelpool::Errc code = accelpool::Errc::invalid_argument) {
    c["cache_dir"] = ACCELPOOL_POCL_CACHE_DIR;
    auto b = OpenClBackend::create(c);
    REQUIRE_FALSE(b.is_ok());
    CHECK(b.error().code == code);
    return b.error().message;
  };
  CHECK_THAT(refused({{"remote_advertise", "hv:7090"}}), Catch::Contains("'remote_advertise'"));
  CHECK_THAT(refused({{"remote_listen", "127.0.0.1:0"}, {"remote_tls_cert", "/x.pem"}}),
             Catch::Contains("'remote_tls_key'"));
  CHECK_THAT(refused({{"remote_listen", "127.0.0.1:0"},
                      {"remote_tls_cert", "/nonexistent/c.pem"},
                      {"remote_tls_key", "/nonexistent/c.key"}},
                     accelpool::Errc::invalid_config),
             Catch::Contains("remote_tls_cert") && Catch::Contains("/nonexistent/c.pem"));
  CHECK_THAT(refused({{"remote_listen", "0.0.0.0:0"}}), Catch::Contains("remote_advertise"));
  CHECK_THAT(refused({{"remote_listen", "not-an-address"}}), Catch::Contains("not-an-address"));
}
