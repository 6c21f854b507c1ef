#include <accelpool/common/tls.hpp>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace accelpool::common::tls {

namespace {

Error bad(const std::string& name, const std::string& path, const std::string& why) {
  return make_error(Errc::invalid_config, name + " '" + path + "': " + why);
}

// A file the process can open, else the error saying why.
Status readable(const std::string& name, const std::string& path) {
  std::ifstream in(path);
  if (!in) return bad(name, path, std::string("cannot read it: ") + std::strerror(errno));
  return Status::ok();
}

// Keys with a passphrase are refused rather than asked for on a terminal.
int no_passphrase(char*, int, int, void*) { return 0; }

// Loads the certificate chain and key of `f` into `ctx`, checking they belong together.
Status load_identity(SSL_CTX* ctx, const Files& f) {
  if (f.cert.empty() != f.key.empty()) {
    return make_error(Errc::invalid_config,
                      f.cert.empty() ? f.key_name + " needs " + f.cert_name : f.cert_name + " needs " + f.key_name);
  }
  if (f.cert.empty()) return Status::ok();
  if (auto s = readable(f.cert_name, f.cert); !s) return s;
  if (auto s = readable(f.key_name, f.key); !s) return s;
  if (SSL_CTX_use_certificate_chain_file(ctx, f.cert.c_str()) != 1) {
    return bad(f.cert_name, f.cert, "not a PEM certificate: " + last_error("no certificate"));
  }
  // Read apart from the context, so that a file that is no key and a key of another certificate say so.
  BIO* bio = BIO_new_file(f.key.c_str(), "r");
  EVP_PKEY* key = bio != nullptr ? PEM_read_bio_PrivateKey(bio, nullptr, no_passphrase, nullptr) : nullptr;
  BIO_free(bio);
  if (key == nullptr) {
    return bad(f.key_name, f.key, "not a PEM private key (or one with a passphrase): " + last_error("no key"));
  }
  const bool matches = SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  if (!matches) {
    return bad(f.key_name, f.key, "does not match the certificate in " + f.cert + " (" + last_error("mismatch") + ")");
  }
  return Status::ok();
}

Status load_ca(SSL_CTX* ctx, const Files& f) {
  if (auto s = readable(f.ca_name, f.ca); !s) return s;
  if (SSL_CTX_load_verify_locations(ctx, f.ca.c_str(), nullptr) != 1) {
    return bad(f.ca_name, f.ca, "holds no PEM CA certificate: " + last_error("no certificate"));
  }
  return Status::ok();
}

// A context of `method` (TLS 1.2 or newer) with f's certificate and key when given, and f.ca's CAs when given.
Result<Context> new_context(const SSL_METHOD* method, const Files& f) {
  Context ctx(SSL_CTX_new(method), SSL_CTX_free);
  if (!ctx) return make_error(Errc::internal, last_error("SSL_CTX_new failed"));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (auto s = load_identity(ctx.get(), f); !s) return s.error();
  if (!f.ca.empty()) {
    if (auto s = load_ca(ctx.get(), f); !s) return s.error();
  }
  return ctx;
}

}  // namespace

Files table_files(const std::string& table, std::string cert, std::string key, std::string ca,
                  const std::string& ca_key) {
  return {std::move(cert),     std::move(key),     std::move(ca),
          table + ".tls_cert", table + ".tls_key", table + "." + ca_key};
}

Status expect_host(SSL* ssl, const std::string& host) {
  unsigned char addr[16];
  const bool ip = inet_pton(AF_INET, host.c_str(), addr) == 1 || inet_pton(AF_INET6, host.c_str(), addr) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                    : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size()) == 1 &&
                          SSL_set_tlsext_host_name(ssl, host.c_str()) == 1;
  if (ok != 1)
    return make_error(Errc::invalid_argument,
                      "TLS cannot check the host name '" + host + "': " + last_error("refused"));
  return Status::ok();
}

std::string last_error(const std::string& fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? fallback : out;
}

Result<Context> server_context(const Files& f) {
  if (f.cert.empty() || f.key.empty())
    return make_error(Errc::invalid_config, f.cert_name + " and " + f.key_name + " go together");
  auto ctx = new_context(TLS_server_method(), f);
  if (!ctx) return ctx;
  if (!f.ca.empty()) {
    SSL_CTX_set_verify(ctx->get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // The CAs a client may pick its certificate by.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(f.ca.c_str()))
      SSL_CTX_set_client_CA_list(ctx->get(), names);
  }
  return ctx;
}

Result<Context> client_context(const Files& f) {
  auto ctx = new_context(TLS_client_method(), f);
  if (!ctx) return ctx;
  if (f.ca.empty() && SSL_CTX_set_default_verify_paths(ctx->get()) != 1) {
    return make_error(Errc::invalid_config, "cannot load the system's CA certificates: " + last_error("unknown"));
  }
  SSL_CTX_set_verify(ctx->get(), SSL_VERIFY_PEER, nullptr);
  return ctx;
}

}  // namespace accelpool::common::tls
