// TLS contexts from PEM files (OpenSSL), shared by the manager's listeners, accelpoolctl and the host agent
// (docs/operations.md, "TLS"). Loading checks everything a handshake would trip on later — readable files, a
// certificate, a key that matches it, a CA file with certificates — so a bad file is a clear error at start.
#pragma once

#include <accelpool/common/result.hpp>

#include <memory>
#include <string>

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // OpenSSL's SSL

namespace accelpool::common::tls {

using Context = std::shared_ptr<ssl_ctx_st>;  // frees the SSL_CTX with the last owner

// The PEM files of one end, and how errors name each (the config key or command-line option it came from).
struct Files {
  std::string cert;  // certificate chain (leaf first)
  std::string key;   // its private key
  std::string ca;    // CA certificates that verify the peer; "" : none (a server), the system's (a client)
  std::string cert_name = "tls_cert";
  std::string key_name = "tls_key";
  std::string ca_name = "tls_ca";
};

// Files named by the keys of a config table: "<table>.tls_cert", "<table>.tls_key", "<table>.<ca_key>".
Files table_files(const std::string& table, std::string cert, std::string key, std::string ca,
                  const std::string& ca_key);

// A server context (TLS 1.2 or newer) presenting files.cert/files.key. With files.ca, clients must present a
// certificate that it verifies (mutual TLS); without, none is asked. Errors: "invalid_config" naming the key, the file
// and what is wrong (cannot read, not a PEM certificate or key, key does not match the certificate).
Result<Context> server_context(const Files& files);

// A client context (TLS 1.2 or newer) that verifies the server's certificate against files.ca (the system's
// CAs when ""); with files.cert and files.key it presents them (mutual TLS). Host names are checked per
// connection (verify_host). Errors: as server_context.
Result<Context> client_context(const Files& files);

// Makes the handshake of the client connection `ssl` check that the server's certificate names `host` (a DNS name,
// or an IP address matched against the certificate's IP entries), and sends `host` as SNI when it is a name.
// Errors: "invalid_argument" for a host OpenSSL cannot take.
Status expect_host(ssl_st* ssl, const std::string& host);

// The last OpenSSL errors of this thread as one line (and clears them); `fallback` when there are none.
std::string last_error(const std::string& fallback);

}  // namespace accelpool::common::tls
