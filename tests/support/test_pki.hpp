// Certificates for TLS tests, made with the real `openssl` command line in a folder of the test's: a CA, and
// certificates it signs for servers (with their subjectAltName) and clients. EC P-256 keys, valid one day.
// Header-only.
#pragma once

#include "run_command.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace accelpool::testing {

// A PEM certificate and its key.
struct CertFiles {
  std::filesystem::path cert;
  std::filesystem::path key;
};

class TestCa {
 public:
  // Makes the CA named `name` in `dir` (which must exist). Throws when openssl fails.
  TestCa(std::filesystem::path dir, std::string name) : dir_(std::move(dir)), name_(std::move(name)) {
    ca_ = {dir_ / (name_ + "-ca.pem"), dir_ / (name_ + "-ca.key")};
    openssl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj '/CN=" + name_ +
            " test CA' -keyout '" + ca_.key.string() + "' -out '" + ca_.cert.string() + "'");
  }

  // The CA certificate (what verifies the certificates it signs).
  const std::filesystem::path& cert() const { return ca_.cert; }

  // A server certificate for the names in `alt_names` (subjectAltName syntax: "IP:127.0.0.1,DNS:localhost").
  CertFiles server(const std::string& file_name, const std::string& alt_names) const {
    return sign(file_name, "subjectAltName=" + alt_names + "\nextendedKeyUsage=serverAuth\n");
  }

  // A client certificate (TLS client authentication) with the common name `common_name`.
  CertFiles client(const std::string& file_name, const std::string& common_name) const {
    return sign(file_name, "extendedKeyUsage=clientAuth\n", common_name);
  }

 private:
  CertFiles sign(const std::string& file_name, const std::string& extensions, const std::string& cn = "") const {
    CertFiles f{dir_ / (file_name + ".pem"), dir_ / (file_name + ".key")};
    const auto csr = dir_ / (file_name + ".csr"), ext = dir_ / (file_name + ".ext");
    std::ofstream(ext) << extensions;
    openssl("req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj '/CN=" + (cn.empty() ? file_name : cn) +
            "' -keyout '" + f.key.string() + "' -out '" + csr.string() + "'");
    openssl("x509 -req -days 1 -in '" + csr.string() + "' -CA '" + ca_.cert.string() + "' -CAkey '" + ca_.key.string() +
            "' -CAcreateserial -extfile '" + ext.string() + "' -out '" + f.cert.string() + "'");
    return f;
  }

  static void openssl(const std::string& args) {
    auto out = run_command("openssl " + args + " 2>&1");
    if (out.code != 0) throw std::runtime_error("openssl " + args + " failed: " + out.text);
  }

  std::filesystem::path dir_;
  std::string name_;
  CertFiles ca_;
};

}  // namespace accelpool::testing
