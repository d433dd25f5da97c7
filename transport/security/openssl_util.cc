#include "openssl_util.h"

#include <openssl/err.h>
#include <openssl/pem.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "cohort/core/error.h"

namespace cohort::transport::security::detail {

std::string take_openssl_errors(std::string_view fallback) {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    if (!text.empty()) text += "; ";
    text += buf;
  }
  return text.empty() ? std::string(fallback) : text;
}

std::string printable(std::string_view text) {
  constexpr std::size_t kMax = 80;
  std::string out;
  for (char c : text.substr(0, kMax)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > kMax) out += "...";
  return out;
}

std::optional<std::string> common_name(const X509* cert) {
  const X509_NAME* subject = X509_get_subject_name(cert);
  if (subject == nullptr) return std::nullopt;
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index < 0 || X509_NAME_get_index_by_NID(subject, NID_commonName, index) >= 0) {
    return std::nullopt;  // none, or ambiguous
  }
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  unsigned char* utf8 = nullptr;
  const int len = ASN1_STRING_to_UTF8(&utf8, data);
  if (len < 0) {
    ERR_clear_error();
    return std::nullopt;
  }
  std::string cn(reinterpret_cast<const char*>(utf8), static_cast<std::size_t>(len));
  OPENSSL_free(utf8);
  if (cn.find('\0') != std::string::npos) return std::nullopt;
  return cn;
}

BioPtr open_pem_file(const std::filesystem::path& path, std::string_view what) {
  const std::string where = std::string(what) + " '" + path.string() + "'";
  std::error_code ec;
  if (path.empty()) throw ConfigError(std::string(what) + " is not set");
  if (!std::filesystem::exists(path, ec)) throw ConfigError(where + " does not exist");
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(where + " is a directory");
  errno = 0;
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) {
    const int err = errno;
    ERR_clear_error();
    throw ConfigError("cannot read " + where + ": " +
                      (err != 0 ? std::strerror(err) : "open failed"));
  }
  return bio;
}

X509Ptr read_certificate(const std::filesystem::path& path, std::string_view what) {
  BioPtr bio = open_pem_file(path, what);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    const std::string reason = take_openssl_errors();
    throw ConfigError(std::string(what) + " '" + path.string() + "' holds no PEM certificate (" +
                      reason + ")");
  }
  return cert;
}

namespace {
// Refuses to prompt for a passphrase: keys are read by servers, not humans.
int no_passphrase(char*, int, int, void*) noexcept { return -1; }
}  // namespace

EvpPkeyPtr read_private_key(const std::filesystem::path& path, std::string_view what) {
  BioPtr bio = open_pem_file(path, what);
  EvpPkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!key) {
    const std::string reason = take_openssl_errors();
    throw ConfigError(std::string(what) + " '" + path.string() +
                      "' holds no unencrypted PEM private key (" + reason + ")");
  }
  return key;
}

}  // namespace cohort::transport::security::detail
