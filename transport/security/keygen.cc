#include "cohort/transport/security/keygen.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

#include "cohort/core/error.h"
#include "keygen_internal.h"
#include "openssl_util.h"

namespace cohort::transport::security {

namespace {

namespace fs = std::filesystem;
using detail::take_openssl_errors;
using namespace std::chrono_literals;

// ~10 years (3652 days covers the leap days); notBefore backdated for clock skew between nodes.
constexpr std::chrono::seconds kValidity = std::chrono::hours(24 * 3652);
constexpr std::chrono::seconds kBackdate = -1h;

[[noreturn]] void fail(const std::string& what) {
  throw TransportError(what + ": " + take_openssl_errors());
}

void check(int rc, const char* what) {
  if (rc != 1) fail(what);
}

// Bytes that are wiped when they go out of scope (PEM-encoded private keys pass through here).
class SecretBytes {
 public:
  SecretBytes() = default;
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;
  ~SecretBytes() {
    if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
  }
  std::vector<char>& get() { return bytes_; }

 private:
  std::vector<char> bytes_;
};

void make_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError("cannot create directory '" + dir.string() + "': " + ec.message());
}

// Writes `data` to a temporary file next to `path` with `mode`, then renames it over `path`.
void write_file_atomically(const fs::path& path, const std::vector<char>& data, mode_t mode) {
  std::string tmp = path.string() + ".tmp-XXXXXX";
  const int fd = mkstemp(tmp.data());  // created 0600, so a key is never briefly world-readable
  const char* failed = nullptr;
  int err = 0;
  auto note = [&](bool ok, const char* op) {
    if (!ok && failed == nullptr) {
      failed = op;
      err = errno;
    }
  };
  if (fd < 0) {
    note(false, "create");
  } else {
    note(fchmod(fd, mode) == 0, "chmod");
    for (std::size_t done = 0; failed == nullptr && done < data.size();) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      note(n > 0, "write");
      if (n > 0) done += static_cast<std::size_t>(n);
    }
    if (failed == nullptr) note(::fsync(fd) == 0, "fsync");
    note(::close(fd) == 0, "close");
    if (failed == nullptr) note(::rename(tmp.c_str(), path.c_str()) == 0, "rename");
    if (failed != nullptr) ::unlink(tmp.c_str());
  }
  if (failed != nullptr) {
    throw ConfigError("cannot write '" + path.string() + "' (" + failed +
                      "): " + std::strerror(err));
  }
}

std::vector<char> bio_contents(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::vector<char>(data, data + (n > 0 ? n : 0));
}

void write_private_key(const fs::path& path, EVP_PKEY* key) {
  // BIO_s_secmem: the mem buffer is wiped when freed.
  detail::BioPtr bio(BIO_new(BIO_s_secmem()));
  if (!bio) fail("BIO_new");
  check(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr),
        "encoding private key");
  SecretBytes pem;
  pem.get() = bio_contents(bio.get());
  write_file_atomically(path, pem.get(), 0600);
}

void write_certificate(const fs::path& path, X509* cert) {
  detail::BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio) fail("BIO_new");
  check(PEM_write_bio_X509(bio.get(), cert), "encoding certificate");
  write_file_atomically(path, bio_contents(bio.get()), 0644);
}

detail::EvpPkeyPtr new_p256_key() {
  detail::EvpPkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) fail("generating an EC P-256 key");
  return key;
}

void set_name(X509_NAME* name, std::string_view cn) {
  check(X509_NAME_add_entry_by_NID(name, NID_commonName, MBSTRING_UTF8,
                                   reinterpret_cast<const unsigned char*>(cn.data()),
                                   static_cast<int>(cn.size()), -1, 0),
        "setting the subject name");
}

void add_extension(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value);
  if (ext == nullptr) fail(std::string("building extension ") + OBJ_nid2sn(nid));
  const int rc = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  check(rc, "adding an extension");
}

// A v3 certificate for `key` with subject CN=cn, random serial and the given validity, issued by
// `issuer` (null: self-signed). Extensions are added by the caller before signing.
detail::X509Ptr new_certificate(EVP_PKEY* key, std::string_view cn, X509* issuer,
                                std::chrono::seconds not_before, std::chrono::seconds not_after) {
  detail::X509Ptr cert(X509_new());
  if (!cert) fail("X509_new");
  check(X509_set_version(cert.get(), X509_VERSION_3), "X509_set_version");
  std::unique_ptr<BIGNUM, detail::OpenSslDeleter<BN_free>> serial(BN_new());
  // 127 random bits with the top one set: positive, non-zero, unique with overwhelming odds.
  if (!serial || BN_rand(serial.get(), 127, BN_RAND_TOP_ONE, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    fail("making a serial number");
  }
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), not_before.count()) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), not_after.count()) == nullptr) {
    fail("setting the validity");
  }
  set_name(X509_get_subject_name(cert.get()), cn);
  check(X509_set_issuer_name(
            cert.get(), issuer ? X509_get_subject_name(issuer) : X509_get_subject_name(cert.get())),
        "X509_set_issuer_name");
  check(X509_set_pubkey(cert.get(), key), "X509_set_pubkey");
  return cert;
}

void validate_ca_name(std::string_view cn) {
  bool ok = !cn.empty() && cn.size() <= 64;
  for (char c : cn) ok = ok && c >= 0x20 && c < 0x7f;
  if (!ok) {
    throw ConfigError("invalid CA common name '" + detail::printable(cn) +
                      "': use 1-64 printable ASCII characters");
  }
}

TlsFiles make_node(const fs::path& ca_dir, std::string_view name, const fs::path& out,
                   std::chrono::seconds not_before, std::chrono::seconds not_after) {
  validate_node_id(name);
  const fs::path ca_pem = ca_dir / "ca.pem";
  const fs::path ca_key_path = ca_dir / "ca.key";
  for (const fs::path& p : {ca_pem, ca_key_path}) {
    std::error_code ec;
    if (!fs::exists(p, ec)) {
      throw ConfigError("no CA in '" + ca_dir.string() + "': '" + p.string() +
                        "' does not exist (create one with: cohort-keygen ca --out " +
                        ca_dir.string() + ")");
    }
  }
  const fs::path cert_path = out / (std::string(name) + ".pem");
  const fs::path key_path = out / (std::string(name) + ".key");
  {
    std::error_code ec;
    if (fs::equivalent(key_path, ca_key_path, ec) || fs::equivalent(cert_path, ca_pem, ec)) {
      throw ConfigError("node '" + std::string(name) + "' in '" + out.string() +
                        "' would overwrite the CA's own files");
    }
  }
  ERR_clear_error();
  detail::X509Ptr ca_cert = detail::read_certificate(ca_pem, "CA certificate");
  detail::EvpPkeyPtr ca_key = detail::read_private_key(ca_key_path, "CA key");
  if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    throw ConfigError("CA certificate '" + ca_pem.string() + "' and key '" + ca_key_path.string() +
                      "' do not match");
  }

  detail::EvpPkeyPtr key = new_p256_key();
  detail::X509Ptr cert = new_certificate(key.get(), name, ca_cert.get(), not_before, not_after);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, ca_cert.get(), cert.get(), nullptr, nullptr, 0);
  add_extension(cert.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert.get(), &ctx, NID_key_usage, "critical,digitalSignature");
  add_extension(cert.get(), &ctx, NID_ext_key_usage, "serverAuth,clientAuth");
  add_extension(cert.get(), &ctx, NID_subject_key_identifier, "hash");
  add_extension(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always");
  // The name is a valid node id ([A-Za-z0-9._-]), so it cannot inject further config entries.
  add_extension(cert.get(), &ctx, NID_subject_alt_name, ("DNS:" + std::string(name)).c_str());
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) <= 0) fail("signing the certificate");

  make_directory(out);
  write_private_key(key_path, key.get());
  write_certificate(cert_path, cert.get());
  return TlsFiles{
      .ca_file = ca_pem.string(), .cert_file = cert_path.string(), .key_file = key_path.string()};
}

}  // namespace

void generate_ca(const fs::path& dir, std::string_view common_name, Overwrite overwrite) {
  validate_ca_name(common_name);
  const fs::path key_path = dir / "ca.key";
  std::error_code ec;
  if (overwrite == Overwrite::kNo && fs::exists(key_path, ec)) {
    throw ConfigError("CA key '" + key_path.string() +
                      "' already exists; refusing to overwrite it (cohort-keygen: --force)");
  }
  ERR_clear_error();
  detail::EvpPkeyPtr key = new_p256_key();
  detail::X509Ptr cert = new_certificate(key.get(), common_name, nullptr, kBackdate, kValidity);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  add_extension(cert.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_extension(cert.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert.get(), &ctx, NID_subject_key_identifier, "hash");
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) fail("signing the CA certificate");

  make_directory(dir);
  write_private_key(key_path, key.get());
  write_certificate(dir / "ca.pem", cert.get());
}

TlsFiles generate_node(const fs::path& ca_dir, std::string_view name, const fs::path& out) {
  return make_node(ca_dir, name, out, kBackdate, kValidity);
}

namespace detail {
TlsFiles generate_node_for_testing(const fs::path& ca_dir, std::string_view name,
                                   const fs::path& out, std::chrono::seconds not_before,
                                   std::chrono::seconds not_after) {
  return make_node(ca_dir, name, out, not_before, not_after);
}
}  // namespace detail

}  // namespace cohort::transport::security
