// Key material for Cohort's PKI: a CA and node certificates, as written by cohort-keygen and by
// tests that need a throwaway PKI in a temporary directory.
//
// All keys are EC P-256, signatures ECDSA with SHA-256, validity 10 years (notBefore backdated one
// hour for clock skew), random 127-bit serials. Private keys are written unencrypted (PKCS#8 PEM)
// with mode 0600, certificates with 0644; each file is written to a temporary name and renamed,
// so a reader never sees half a file. Throws ConfigError naming the path on any file problem.
#pragma once

#include <filesystem>
#include <string_view>

#include "cohort/transport/security/tls.h"

namespace cohort::transport::security {

enum class Overwrite { kNo, kYes };

// Writes <dir>/ca.pem and <dir>/ca.key (creating dir). The CA is CA:TRUE, pathlen 0, key usage
// keyCertSign and cRLSign. common_name: 1-64 printable ASCII characters. Throws ConfigError if
// <dir>/ca.key exists and overwrite is kNo: replacing a CA key orphans every node certificate.
void generate_ca(const std::filesystem::path& dir, std::string_view common_name = "cohort-ca",
                 Overwrite overwrite = Overwrite::kNo);

// Writes <out>/<name>.pem and <out>/<name>.key (creating out, replacing existing files), signed by
// the CA in ca_dir: CN=name and a subjectAltName DNS entry of name, usable as TLS client and
// server. Returns the files (ca_file = ca_dir/ca.pem). Throws ConfigError if the name is not a
// valid node id, the CA files are missing or do not match, or <out>/<name>.key is the CA key.
TlsFiles generate_node(const std::filesystem::path& ca_dir, std::string_view name,
                       const std::filesystem::path& out);

}  // namespace cohort::transport::security
