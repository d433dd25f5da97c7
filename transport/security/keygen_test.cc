#include "cohort/transport/security/keygen.h"

#include <doctest/doctest.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "cohort/core/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
namespace sec = cohort::transport::security;
using cohort::ConfigError;
using sec::test::TempDir;

namespace {

fs::perms mode_of(const fs::path& p) { return fs::status(p).permissions() & fs::perms::all; }

std::unique_ptr<X509, void (*)(X509*)> load_cert(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  REQUIRE(f != nullptr);
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  REQUIRE(cert != nullptr);
  return {cert, X509_free};
}

}  // namespace

TEST_CASE("generate_ca and generate_node write 0600 keys, 0644 certificates and SAN=name") {
  TempDir dir;
  sec::generate_ca(dir / "ca");
  CHECK(fs::exists(dir / "ca" / "ca.pem"));
  CHECK(mode_of(dir / "ca" / "ca.key") == (fs::perms::owner_read | fs::perms::owner_write));
  CHECK(mode_of(dir / "ca" / "ca.pem") == (fs::perms::owner_read | fs::perms::owner_write |
                                           fs::perms::group_read | fs::perms::others_read));

  const sec::TlsFiles files = sec::generate_node(dir / "ca", "shard-0", dir / "out" / "nested");
  CHECK(files.ca_file == (dir / "ca" / "ca.pem").string());
  CHECK(files.cert_file == (dir / "out" / "nested" / "shard-0.pem").string());
  CHECK(files.key_file == (dir / "out" / "nested" / "shard-0.key").string());
  CHECK(mode_of(files.key_file) == (fs::perms::owner_read | fs::perms::owner_write));
  for (const auto& entry : fs::directory_iterator(dir / "out" / "nested")) {
    CHECK(entry.path().filename().string().find(".tmp-") == std::string::npos);
  }

  const auto cert = load_cert(files.cert_file);
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  REQUIRE(sans != nullptr);
  REQUIRE(sk_GENERAL_NAME_num(sans) == 1);
  const GENERAL_NAME* san = sk_GENERAL_NAME_value(sans, 0);
  REQUIRE(san->type == GEN_DNS);
  CHECK(std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(san->d.dNSName)),
                    static_cast<std::size_t>(ASN1_STRING_length(san->d.dNSName))) == "shard-0");
  GENERAL_NAMES_free(sans);
  // Valid for about ten years.
  std::time_t in_9_years = std::time(nullptr) + 9L * 365 * 86400;
  std::time_t in_11_years = std::time(nullptr) + 11L * 365 * 86400;
  CHECK(X509_cmp_time(X509_get0_notAfter(cert.get()), &in_9_years) > 0);
  CHECK(X509_cmp_time(X509_get0_notAfter(cert.get()), &in_11_years) < 0);
  CHECK(X509_get_signature_nid(cert.get()) == NID_ecdsa_with_SHA256);

  const sec::TlsContext ctx(files);
  CHECK(ctx.local_id() == "shard-0");
}

TEST_CASE("generate_ca refuses to replace a CA key unless told to") {
  TempDir dir;
  sec::generate_ca(dir.path());
  const sec::TlsFiles before = sec::generate_node(dir.path(), "n", dir / "n");
  CHECK_THROWS_WITH_AS(sec::generate_ca(dir.path()), doctest::Contains("already exists"),
                       ConfigError);
  sec::generate_ca(dir.path(), "cohort-ca", sec::Overwrite::kYes);
  CHECK(mode_of(dir / "ca.key") == (fs::perms::owner_read | fs::perms::owner_write));
  CHECK_THROWS_AS(sec::generate_ca(dir / "x", ""), ConfigError);
}

TEST_CASE("generate_node refuses bad names, missing CAs and clobbering the CA") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(sec::generate_node(dir / "none", "n1", dir / "out"),
                       doctest::Contains("no CA in"), ConfigError);
  sec::generate_ca(dir / "ca");
  CHECK_THROWS_WITH_AS(sec::generate_node(dir / "ca", "bad name", dir / "out"),
                       doctest::Contains("invalid node id"), ConfigError);
  CHECK_THROWS_AS(sec::generate_node(dir / "ca", "", dir / "out"), ConfigError);
  CHECK_THROWS_AS(sec::generate_node(dir / "ca", "../escape", dir / "out"), ConfigError);
  CHECK_THROWS_WITH_AS(sec::generate_node(dir / "ca", "ca", dir / "ca"),
                       doctest::Contains("overwrite the CA"), ConfigError);
  // A CA whose key and certificate do not belong together.
  sec::generate_ca(dir / "other");
  fs::copy_file(dir / "other" / "ca.key", dir / "ca" / "ca.key",
                fs::copy_options::overwrite_existing);
  CHECK_THROWS_WITH_AS(sec::generate_node(dir / "ca", "n1", dir / "out"),
                       doctest::Contains("do not match"), ConfigError);
}
