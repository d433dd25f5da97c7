// A read-only mapping of a whole data file: its pages belong to the page cache, which the kernel
// can drop again, so reading a large file costs no copy in our heap. Private to client/ (the CSV
// and NumPy loaders).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "cohort/core/error.h"

namespace cohort::client::detail {

class MappedFile {
 public:
  // DataError "PATH: no such file (EXPECTED)" when it is missing, or naming what failed.
  MappedFile(const std::filesystem::path& path, const std::string& expected) {
    const std::string origin = path.string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw DataError(origin + ": no such file (" + expected + ")");
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError(origin + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw DataError(origin + ": cannot stat");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw DataError(origin + ": cannot map: " + std::strerror(errno));
      }
      base_ = static_cast<const unsigned char*>(p);
      ::madvise(p, size_, MADV_SEQUENTIAL);
    }
    ::close(fd);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (base_ != nullptr) ::munmap(const_cast<unsigned char*>(base_), size_);
  }

  [[nodiscard]] const unsigned char* data() const { return base_; }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::string_view text() const {
    return {reinterpret_cast<const char*>(base_), size_};
  }

 private:
  const unsigned char* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cohort::client::detail
