// TLS with the real binaries on loopback, with certificates the real `openssl` command makes per test: the admin
// API over HTTPS (accelpoolctl and curl verifying the CA and the host name), guests over tls:// (accelpool-run
// acquiring and releasing through the shim), and what a plaintext client, an untrusted CA or a bad key file gets.
// docs/operations.md, "TLS".
#include "test_client.hpp"

#include <catch2/catch.hpp>

#include "test_pki.hpp"

#include <filesystem>
#include <string>

using namespace accelpool::manager::itest;
namespace fs = std::filesystem;
using accelpool::testing::CertFiles;
using accelpool::testing::TestCa;

namespace {

// The pool's certificate names 127.0.0.1 only: "localhost" does not match it.
struct Pki {
  fs::path dir = temp_dir("apm-pki-");
  TestCa ca{dir, "pool"};
  TestCa other{dir, "other"};
  CertFiles server = ca.server("manager", "IP:127.0.0.1");
  ~Pki() { fs::remove_all(dir); }
};

std::string tls_keys(const CertFiles& f) {
  return "tls_cert = \"" + f.cert.string() + "\"\ntls_key = \"" + f.key.string() + "\"\n";
}

// A manager whose admin API and guest TCP listener speak TLS with `server` (either may stay plain).
std::string tls_config(const CertFiles& server, bool admin_tls, bool guest_tls) {
  return "[leases]\nttl_s = 60\n[guest]\ntcp = \"127.0.0.1:0\"\nunix = \"\"\n" + (guest_tls ? tls_keys(server) : "") +
         "[admin]\nlisten = \"127.0.0.1:0\"\n" + (admin_tls ? tls_keys(server) : "") +
         "[[hosts]]\nname = \"local\"\nbackend = \"static\"\n[[hosts.devices]]\nkind = \"asic\"\ncount = 1\n"
         "[[tenants]]\nname = \"t\"\n";
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

std::pair<int, std::string> ctl(const std::string& url, const std::string& args) {
  return run_command(std::string(ACCELPOOLCTL_BIN) + " --url " + url + " " + args);
}

}  // namespace

TEST_CASE("The admin API over HTTPS: accelpoolctl and curl verify the CA and the host name, plaintext gets nothing",
          "[integration][tls]") {
  Pki pki;
  ScratchDaemon m("apm-tls-admin-", tls_config(pki.server, true, false));
  m.daemon.start();
  const std::string admin = m.daemon.token("admin token");
  const std::string port = std::to_string(m.daemon.endpoints().admin_port);
  const std::string url = "https://127.0.0.1:" + port;
  CHECK(m.daemon.output().find("admin API " + url) != std::string::npos);
  const std::string token = " --token " + admin;

  auto ok = ctl(url, "--cacert " + quoted(pki.ca.cert()) + token + " -o json tenants list");
  INFO(ok.second);
  REQUIRE(ok.first == 0);
  CHECK(ok.second.find("\"t\"") != std::string::npos);

  // A real HTTP client: curl with the CA answers; a request it cannot verify gets no answer (curl's exit 60).
  auto curl = run_command("curl -sS --cacert " + quoted(pki.ca.cert()) + " -H 'Authorization: Bearer " + admin + "' " +
                          url + "/v1/tenants -w '\\nHTTP %{http_code}'");
  INFO(curl.second);
  CHECK(curl.first == 0);
  CHECK(curl.second.find("HTTP 200") != std::string::npos);
  CHECK(run_command("curl -sS " + url + "/healthz").first == 60);

  // Refused: a CA that did not sign the certificate, a host name the certificate does not carry.
  auto other = ctl(url, "--cacert " + quoted(pki.other.cert()) + token + " tenants list");
  CHECK(other.first == 3);
  CHECK(other.second.find("TLS handshake with 127.0.0.1:" + port + " failed") != std::string::npos);
  auto wrong_name = ctl("https://localhost:" + port, "--cacert " + quoted(pki.ca.cert()) + token + " tenants list");
  CHECK(wrong_name.first == 3);
  CHECK(wrong_name.second.find("TLS handshake") != std::string::npos);

  // Plain HTTP to the HTTPS port: no HTTP answer (the handshake fails and the connection closes), from curl and
  // from accelpoolctl; the manager serves on.
  CHECK(http_raw(m.daemon.endpoints().admin_port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") == 0);
  auto plain = ctl("http://127.0.0.1:" + port, token + " tenants list");
  CHECK(plain.first == 3);
  CHECK(ctl(url, "--cacert " + quoted(pki.ca.cert()) + token + " health").first == 0);

  // The dashboard is served over HTTPS from the same origin.
  auto page = run_command("curl -sS --cacert " + quoted(pki.ca.cert()) + " " + url + "/ -w '\\nHTTP %{http_code}'");
  CHECK(page.second.find("HTTP 200") != std::string::npos);
  CHECK(page.second.find("<html") != std::string::npos);
}

TEST_CASE("A TLS guest session: accelpool-run acquires and releases over tls://, verifying the pool",
          "[integration][tls]") {
  Pki pki;
  ScratchDaemon m("apm-tls-guest-", tls_config(pki.server, false, true));
  m.daemon.start();
  const std::string admin = m.daemon.token("admin token");
  const std::string token = m.daemon.token("guest token for tenant t");
  const int guest_port = m.daemon.endpoints().guest_port;
  CHECK(m.daemon.output().find("guests on tls 127.0.0.1:" + std::to_string(guest_port)) != std::string::npos);
  const std::string run = std::string(ACCELPOOL_RUN_BIN) + " --token " + token + " --guest vm-tls --kind asic ";
  const std::string pool = "--pool tls://127.0.0.1:" + std::to_string(guest_port) + " ";

  // The command runs with the device, and the lease ends when it is done.
  auto granted =
      run_command(run + pool + "--ca-file " + quoted(pki.ca.cert()) + " -- sh -c 'echo lease=$ACCELPOOL_LEASE'");
  INFO(granted.second);
  REQUIRE(granted.first == 0);
  auto at = granted.second.find("lease=");
  REQUIRE(at != std::string::npos);
  const std::string lease = granted.second.substr(at + 6, granted.second.find('\n', at) - at - 6);
  auto ended = http(m.daemon.endpoints().admin_port, "GET", "/v1/leases/" + lease, admin);
  REQUIRE(ended.status == 200);
  CHECK(ended.json().at("state").as_string() == "released");

  // The CA file may come from the environment, as a library user would set it.
  CHECK(run_command("ACCELPOOL_POOL_CA=" + quoted(pki.ca.cert()) + " " + run + pool + "-- true").first == 0);

  // Untrusted: another CA's file, or none (the system's CAs do not know this one).
  auto untrusted = run_command(run + pool + "--ca-file " + quoted(pki.other.cert()) + " -- true");
  CHECK(untrusted.first == 3);
  CHECK(untrusted.second.find("not trusted") != std::string::npos);
  CHECK(run_command(run + pool + "-- true").first == 3);
  // Plaintext to the TLS port: the hello gets no answer; the pool serves on.
  auto plain = run_command(run + "--pool tcp://127.0.0.1:" + std::to_string(guest_port) + " -- true");
  CHECK(plain.first == 3);
  CHECK(run_command(run + pool + "--ca-file " + quoted(pki.ca.cert()) + " -- true").first == 0);
}

TEST_CASE("A certificate or key that cannot serve is a start error naming its key", "[integration][tls]") {
  Pki pki;
  auto stranger = pki.other.server("stranger", "IP:127.0.0.1");
  SECTION("a key that is not the certificate's") {
    CertFiles mixed{pki.server.cert, stranger.key};
    DaemonProcess d(temp_dir("apm-tls-bad-"), tls_config(mixed, true, false));
    REQUIRE_THROWS(d.start());
    CHECK(d.output().find("admin.tls_key '" + stranger.key.string() + "': does not match the certificate") !=
          std::string::npos);
    CHECK(d.output().find("shown once") == std::string::npos);
    fs::remove_all(d.data_dir());
  }
  SECTION("a certificate file that does not exist") {
    CertFiles missing{pki.dir / "nowhere.pem", pki.server.key};
    DaemonProcess d(temp_dir("apm-tls-bad-"), tls_config(missing, false, true));
    REQUIRE_THROWS(d.start());
    CHECK(d.output().find("guest.tls_cert '" + missing.cert.string() + "': cannot read it") != std::string::npos);
    fs::remove_all(d.data_dir());
  }
}
