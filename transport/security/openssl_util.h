// Private to transport/security: RAII owners for OpenSSL objects and conversion of the OpenSSL
// error queue into readable text.
#pragma once

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace cohort::transport::security::detail {

template <auto Free>
struct OpenSslDeleter {
  template <typename T>
  void operator()(T* p) const noexcept {
    Free(p);
  }
};
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509_free>>;
using EvpPkeyPtr = std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY_free>>;
using X509StorePtr = std::unique_ptr<X509_STORE, OpenSslDeleter<X509_STORE_free>>;
using X509StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, OpenSslDeleter<X509_STORE_CTX_free>>;
using SslCtxPtr = std::unique_ptr<SSL_CTX, OpenSslDeleter<SSL_CTX_free>>;
using SslPtr = std::unique_ptr<SSL, OpenSslDeleter<SSL_free>>;

// Drains this thread's OpenSSL error queue into "error:...; error:..." (ERR_error_string_n), or
// `fallback` when it is empty. Leaves the queue empty.
std::string take_openssl_errors(std::string_view fallback = "no OpenSSL error recorded");

// `text` made safe to put in a message: printable ASCII only, at most 80 characters.
std::string printable(std::string_view text);

// The single subject CN of `cert` as UTF-8; nullopt if there is none, several, or it is not text.
std::optional<std::string> common_name(const X509* cert);

// Opens `path` for reading; throws ConfigError("<what> 'path' does not exist" / "cannot read").
BioPtr open_pem_file(const std::filesystem::path& path, std::string_view what);

// Reads the first certificate / private key in a PEM file; throws ConfigError naming the file.
X509Ptr read_certificate(const std::filesystem::path& path, std::string_view what);
EvpPkeyPtr read_private_key(const std::filesystem::path& path, std::string_view what);

}  // namespace cohort::transport::security::detail
