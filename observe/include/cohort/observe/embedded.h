#pragma once

#include <optional>
#include <string_view>

namespace cohort::observe {

// The files built into the binary (observe/CMakeLists.txt, cohort_embed_files): the dashboard's
// "index.html" and "dashboard.js" (observe/dashboard/) and "chart.js" (Chart.js 3.9 from Debian's
// libjs-chart.js). Returns the bytes of the file embedded under `name`, std::nullopt for a name not
// embedded. The bytes are constants: they live as long as the program, and reading them is
// thread-safe.
std::optional<std::string_view> embedded_file(std::string_view name);

}  // namespace cohort::observe
