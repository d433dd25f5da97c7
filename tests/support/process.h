// Test helpers: child processes with timeouts, temporary directories, files that appear later.
// Every Process is killed (SIGKILL) and reaped by its destructor, so no test leaks a child.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cohort::test {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

class Process {
 public:
  // Starts `program` with `args`; stdout and stderr go to files in a private temp dir.
  static Process spawn(const std::string& program, const std::vector<std::string>& args);
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();

  // Exit code (128+signal if killed), or nullopt if still running after `timeout`.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  void kill(int signal = 9);
  [[nodiscard]] bool running();
  [[nodiscard]] pid_t pid() const { return pid_; }
  // After wait_for() saw it exit: its peak resident set (getrusage's ru_maxrss), in KiB.
  [[nodiscard]] std::optional<long> peak_rss_kib() const { return peak_rss_kib_; }
  [[nodiscard]] std::string stdout_text() const;
  [[nodiscard]] std::string stderr_text() const;

 private:
  Process() = default;
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::optional<long> peak_rss_kib_;
  std::filesystem::path out_;
  std::filesystem::path err_;
};

// Waits until `path` exists and is non-empty, returning its first line; throws on timeout.
std::string read_when_ready(const std::string& path, std::chrono::milliseconds timeout);

}  // namespace cohort::test
