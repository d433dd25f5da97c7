// A CPU quota for processes on one machine: a cgroup (v2 cpu.max, else v1 cpu.cfs_quota_us),
// root only. Used by the heterogeneity test and bench/hetero to make a client or worker really
// slower than the others. Header-only: the benchmark links no test library.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace cohort::test {

namespace cpu_limit_detail {

// Writes `text` to `path` (a cgroup control file); false when the kernel refuses it.
inline bool write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

inline bool offers_cpu(const std::filesystem::path& controllers) {
  std::ifstream in(controllers);
  std::string word;
  while (in >> word) {
    if (word == "cpu") return true;
  }
  return false;
}

}  // namespace cpu_limit_detail

// A CPU quota for the processes added to it: cgroup v2's cpu.max where a cgroup2 hierarchy
// offers the cpu controller, else cgroup v1's cpu.cfs_quota_us. Removed when destroyed (after
// its processes have exited).
class CpuLimit {
 public:
  // A group held to `cpus` CPUs (0.25: a quarter of one), or null with `why`. `tag` tells apart
  // several groups of one process.
  static std::unique_ptr<CpuLimit> make(double cpus, std::string& why,
                                        const std::string& tag = "") {
    if (::geteuid() != 0) {
      why = "needs root (makes a cgroup)";
      return nullptr;
    }
    const std::string name = "cohort-hetero-" + std::to_string(::getpid()) + tag;
    const auto period = 10000, quota = static_cast<int>(cpus * period);
    for (const std::filesystem::path root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
      if (!cpu_limit_detail::offers_cpu(root / "cgroup.controllers")) continue;
      (void)cpu_limit_detail::write_file(root / "cgroup.subtree_control", "+cpu");
      auto limit = std::unique_ptr<CpuLimit>(new CpuLimit(root / name));
      if (limit->made_ &&
          cpu_limit_detail::write_file(limit->dir_ / "cpu.max",
                                       std::to_string(quota) + " " + std::to_string(period)))
        return limit;
    }
    const std::filesystem::path v1 = "/sys/fs/cgroup/cpu";
    if (std::filesystem::exists(v1 / "cpu.cfs_quota_us")) {
      auto limit = std::unique_ptr<CpuLimit>(new CpuLimit(v1 / name));
      if (limit->made_ &&
          cpu_limit_detail::write_file(limit->dir_ / "cpu.cfs_period_us", std::to_string(period)) &&
          cpu_limit_detail::write_file(limit->dir_ / "cpu.cfs_quota_us", std::to_string(quota)))
        return limit;
    }
    why = "no writable cgroup with the cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us)";
    return nullptr;
  }
  CpuLimit(const CpuLimit&) = delete;
  CpuLimit& operator=(const CpuLimit&) = delete;
  ~CpuLimit() {
    std::error_code ec;
    if (made_) std::filesystem::remove(dir_, ec);  // rmdir: the kernel drops its files
  }

  bool add(pid_t pid) {
    return cpu_limit_detail::write_file(dir_ / "cgroup.procs", std::to_string(pid));
  }

 private:
  explicit CpuLimit(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    made_ = std::filesystem::create_directory(dir_, ec);
  }
  std::filesystem::path dir_;
  bool made_ = false;
};

}  // namespace cohort::test
