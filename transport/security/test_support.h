// Private to the transport/security tests: temporary directories and in-memory handshakes.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cohort/transport/security/tls.h"

namespace cohort::transport::security::test {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cohort-sec-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Runs both sides to completion (or until one throws), passing each output to the other side.
inline void run_handshake(Handshake& client, Handshake& server) {
  std::vector<std::byte> to_server = client.step({});
  for (int round = 0; round < 8 && !(client.done() && server.done()); ++round) {
    const std::vector<std::byte> to_client = server.step(to_server);
    to_server.clear();
    if (!to_client.empty() || !client.done()) to_server = client.step(to_client);
  }
}

}  // namespace cohort::transport::security::test
