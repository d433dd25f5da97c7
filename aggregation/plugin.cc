#include "cohort/aggregation/plugin.h"

#include <dlfcn.h>

#include <exception>
#include <string>
#include <system_error>

#include "cohort/core/error.h"

namespace cohort {
namespace {

using AbiFn = int (*)();
using RegisterFn = void (*)(Registries&);

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& reason) {
  throw ConfigError("plug-in " + file.string() + ": " + reason);
}

std::string last_dlerror() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dynamic loader error";
}

}  // namespace

void* plugin_entry(const std::filesystem::path& file, const char* entry, const char* how) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    fail(file, std::filesystem::exists(file, ec) ? "not a regular file" : "no such file");
  }
  // A name without a slash would make dlopen search the library path instead of this file.
  const std::string path = file.has_parent_path() ? file.string() : "./" + file.string();
  // RTLD_NOW: an unresolved symbol is an error here, naming it, not a crash in the first round.
  // RTLD_LOCAL: two plug-ins may define the same internal helpers without clashing.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) fail(file, "cannot load: " + last_dlerror());

  // From here on the handle is never closed: a failure ends the process, and on success the
  // registries hold factories whose code lives in the library.
  auto* abi = reinterpret_cast<AbiFn>(dlsym(handle, "cohort_plugin_abi"));
  if (abi == nullptr) {
    fail(file,
         "no entry symbol cohort_plugin_abi (a plug-in defines extern \"C\" int "
         "cohort_plugin_abi() returning cohort::kPluginAbi; see cohort/aggregation/plugin.h)");
  }
  const int version = abi();
  if (version != kPluginAbi) {
    fail(file, "built for plug-in ABI " + std::to_string(version) + ", this program has ABI " +
                   std::to_string(kPluginAbi) + "; rebuild the plug-in against this Cohort");
  }
  void* fn = dlsym(handle, entry);
  if (fn == nullptr) fail(file, std::string("no entry symbol ") + entry + " (" + how + ")");
  return fn;
}

void load_plugin(const std::filesystem::path& file, Registries& registries) {
  auto* register_fn = reinterpret_cast<RegisterFn>(
      plugin_entry(file, "cohort_register",
                   "a plug-in defines extern \"C\" void cohort_register(cohort::Registries&); see "
                   "cohort/aggregation/plugin.h"));
  try {
    register_fn(registries);
  } catch (const std::exception& e) {
    fail(file, e.what());
  }
}

}  // namespace cohort
