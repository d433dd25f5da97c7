// Private to transport/security and its tests: certificate generation with chosen validity.
#pragma once

#include <chrono>
#include <filesystem>
#include <string_view>

#include "cohort/transport/security/tls.h"

namespace cohort::transport::security::detail {

// generate_node() with notBefore = now + not_before and notAfter = now + not_after, so tests can
// make expired or not-yet-valid certificates.
TlsFiles generate_node_for_testing(const std::filesystem::path& ca_dir, std::string_view name,
                                   const std::filesystem::path& out,
                                   std::chrono::seconds not_before, std::chrono::seconds not_after);

}  // namespace cohort::transport::security::detail
