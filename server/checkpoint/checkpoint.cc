#include "cohort/server/checkpoint.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <system_error>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::server {
namespace fs = std::filesystem;

namespace {

// Floats go to and from disk by memcpy; a big-endian port would byte-swap them here.
static_assert(std::endian::native == std::endian::little,
              "checkpoint I/O assumes a little-endian host");

constexpr std::array<char, 8> kMagic = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
constexpr std::uint32_t kFormatVersion = 1;
constexpr std::uint32_t kHeaderBytes = 24;           // magic, version, header_bytes, payload_bytes
constexpr std::uint32_t kMaxHeaderBytes = 64 << 10;  // bound on a future version's header
constexpr std::size_t kDigestBytes = 32;             // SHA-256
constexpr std::size_t kMinSlotBytes = 16;            // a slot's two length fields
constexpr int kRoundDigits = 12;
constexpr std::string_view kSuffix = ".ckpt";
constexpr std::string_view kTempSuffix = ".ckpt.tmp";
// Writes of small fields are staged; 64 KiB keeps syscalls few without a large copy. Parameter
// and slot arrays bypass the stage and go to write() straight from their buffers.
constexpr std::size_t kStageBytes = 64 << 10;
// pread/write move at most ~2 GiB per call on Linux; stay well below.
constexpr std::size_t kMaxIoBytes = std::size_t{1} << 30;

std::string errno_text(int err) {
  return std::system_category().message(err) + " (errno " + std::to_string(err) + ")";
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    COHORT_CHECK(ctx_ && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1)
        << "SHA-256 init";
  }
  void update(const void* data, std::size_t n) {
    COHORT_CHECK(EVP_DigestUpdate(ctx_.get(), data, n) == 1) << "SHA-256 update";
  }
  std::array<unsigned char, kDigestBytes> finish() {
    std::array<unsigned char, kDigestBytes> out{};
    unsigned int len = 0;
    COHORT_CHECK(EVP_DigestFinal_ex(ctx_.get(), out.data(), &len) == 1 && len == kDigestBytes)
        << "SHA-256 final";
    return out;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  // Closes now and returns close()'s errno, 0 on success. EINTR counts as success: Linux has
  // closed the descriptor anyway, and the data's fate was settled by the preceding fsync.
  int reset() {
    if (fd_ < 0) return 0;
    const int rc = ::close(std::exchange(fd_, -1));
    return rc == 0 || errno == EINTR ? 0 : errno;
  }

 private:
  int fd_;
};

std::string round_digits(std::uint64_t round) {
  std::string s = std::to_string(round);
  if (s.size() < kRoundDigits) s.insert(0, kRoundDigits - s.size(), '0');
  return s;
}

// Parses "<prefix>-<digits><suffix>" and returns the round; nullopt for any other name.
std::optional<std::uint64_t> parse_name(std::string_view name, std::string_view prefix,
                                        std::string_view suffix) {
  if (name.size() <= prefix.size() + 1 + suffix.size()) return std::nullopt;
  if (!name.starts_with(prefix) || name[prefix.size()] != '-' || !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string_view digits =
      name.substr(prefix.size() + 1, name.size() - prefix.size() - 1 - suffix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::uint64_t round = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), round);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return round;
}

void fsync_dir(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw DataError("checkpoint: cannot open folder " + quoted(dir) +
                    " to fsync it: " + errno_text(errno));
  }
  if (::fsync(fd.get()) != 0) {
    throw DataError("checkpoint: fsync of folder " + quoted(dir) + " failed: " + errno_text(errno));
  }
}

std::uint64_t payload_bytes(const ShardState& s) {
  std::uint64_t n = 4 + 4 + 8 * 4;
  n += 8 + s.model_spec.size();
  n += 8 + std::uint64_t{s.params.size()} * sizeof(float);
  n += 4;
  for (const auto& [name, values] : s.optimizer_state) {
    n += 8 + name.size() + 8 + std::uint64_t{values.size()} * sizeof(float);
  }
  n += 8 + s.extra.size();
  return n;
}

// Streams a checkpoint into a file descriptor, hashing every byte. Throws DataError naming the
// temporary file on any failure; the caller's TempFile guard removes it.
class Writer {
 public:
  Writer(int fd, const fs::path& path, const CheckpointStore::FaultForTesting& fault)
      : fd_(fd), path_(path), fault_(fault) {
    stage_.reserve(kStageBytes);
  }

  void u32(std::uint32_t v) { little_endian(v, 4); }
  void u64(std::uint64_t v) { little_endian(v, 8); }
  void bytes(std::string_view s) {
    u64(s.size());
    put(s.data(), s.size());
  }
  void floats(std::span<const float> v) {
    u64(v.size());
    put(v.data(), v.size_bytes());
  }
  void raw(const void* p, std::size_t n) { put(p, n); }

  // Flushes the stage, appends the digest of everything written so far and returns the file size.
  std::uint64_t finish() {
    flush();
    const auto digest = sha_.finish();
    write_all(reinterpret_cast<const std::byte*>(digest.data()), digest.size());
    return written_;
  }

 private:
  void little_endian(std::uint64_t v, int n) {
    std::array<unsigned char, 8> b{};
    for (int i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    put(b.data(), static_cast<std::size_t>(n));
  }

  void put(const void* p, std::size_t n) {
    sha_.update(p, n);
    const auto* bytes = static_cast<const std::byte*>(p);
    if (stage_.size() + n <= kStageBytes) {
      stage_.insert(stage_.end(), bytes, bytes + n);
      return;
    }
    flush();
    write_all(bytes, n);
  }

  void flush() {
    write_all(stage_.data(), stage_.size());
    stage_.clear();
  }

  void write_all(const std::byte* p, std::size_t n) {
    while (n > 0) {
      const ssize_t r = write_some(p, std::min(n, kMaxIoBytes));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(errno);
      if (r == 0) fail(EIO);  // write() of a regular file never returns 0 for n > 0
      p += r;
      n -= static_cast<std::size_t>(r);
      written_ += static_cast<std::uint64_t>(r);
    }
  }

  // write(), or the injected fault: a short write up to fail_after_bytes, then `error`.
  ssize_t write_some(const std::byte* p, std::size_t n) {
    n = std::min(n, fault_.max_bytes_per_write);
    if (fault_.interrupt_writes && (calls_++ % 2 == 0)) {
      errno = EINTR;
      return -1;
    }
    if (written_ >= fault_.fail_after_bytes) {
      errno = fault_.error;
      return -1;
    }
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, fault_.fail_after_bytes - written_));
    return ::write(fd_, p, n);
  }

  [[noreturn]] void fail(int err) const {
    throw DataError("checkpoint: write to " + quoted(path_) + " failed after " +
                    std::to_string(written_) + " bytes: " + errno_text(err));
  }

  int fd_;
  const fs::path& path_;
  const CheckpointStore::FaultForTesting& fault_;
  Sha256 sha_;
  std::vector<std::byte> stage_;
  std::uint64_t written_ = 0;
  std::uint64_t calls_ = 0;
};

// Removes the temporary file unless committed (renamed into place).
class TempFile {
 public:
  explicit TempFile(fs::path path) : path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!committed_) ::unlink(path_.c_str());
  }
  void commit() { committed_ = true; }

 private:
  fs::path path_;
  bool committed_ = false;
};

// Reads a checkpoint sequentially, hashing every byte it hands out; length fields are checked
// against the payload bytes left before anything is allocated.
class Reader {
 public:
  Reader(int fd, std::uint64_t payload_end, Sha256& sha) : fd_(fd), end_(payload_end), sha_(sha) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return end_ - pos_; }

  std::uint32_t u32(const char* what) { return static_cast<std::uint32_t>(little_endian(4, what)); }
  std::uint64_t u64(const char* what) { return little_endian(8, what); }

  std::string bytes(const char* what) {
    const std::uint64_t n = u64(what);
    need(n, what);
    std::string s(static_cast<std::size_t>(n), '\0');
    read(s.data(), s.size());
    return s;
  }

  FloatBuffer floats(const char* what) {
    const std::uint64_t n = u64(what);
    if (n > left() / sizeof(float)) {
      throw_length(what, n, " floats");
    }
    FloatBuffer out(static_cast<std::size_t>(n));
    read(out.data(), out.bytes());
    return out;
  }

  void skip(std::uint64_t n, const char* what) {
    need(n, what);
    std::array<std::byte, 4096> sink;
    while (n > 0) {
      const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, sink.size()));
      read(sink.data(), k);
      n -= k;
    }
  }

  // Reads and hashes the rest of the payload, after a field failed to parse.
  void hash_rest() { skip(left(), "remainder"); }

  void raw(void* p, std::size_t n) {
    need(n, "raw bytes");
    read(p, n);
  }
  void read_unhashed(void* p, std::size_t n) { pread_all(p, n); }
  void set_end(std::uint64_t end) { end_ = end; }

  // Throws the reason, without the file name: load() adds it.
  [[noreturn]] static void throw_reason(const std::string& reason) { throw DataError(reason); }

 private:
  std::uint64_t little_endian(int n, const char* what) {
    need(static_cast<std::uint64_t>(n), what);
    std::array<unsigned char, 8> b{};
    read(b.data(), static_cast<std::size_t>(n));
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }

  void need(std::uint64_t n, const char* what) const {
    if (n > left()) throw_length(what, n, " bytes");
  }

  [[noreturn]] void throw_length(const char* what, std::uint64_t n, const char* unit) const {
    throw_reason(std::string("length field of ") + what + " (" + std::to_string(n) + unit +
                 ") exceeds the " + std::to_string(left()) + " payload bytes left at offset " +
                 std::to_string(pos_));
  }

  void read(void* p, std::size_t n) {
    pread_all(p, n);
    sha_.update(p, n);
  }

  void pread_all(void* p, std::size_t n) {
    auto* dst = static_cast<std::byte*>(p);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, dst, std::min(n, kMaxIoBytes), static_cast<off_t>(pos_));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        throw_reason("read failed at offset " + std::to_string(pos_) + ": " + errno_text(errno));
      }
      if (r == 0) throw_reason("file shrank while reading, at offset " + std::to_string(pos_));
      dst += r;
      n -= static_cast<std::size_t>(r);
      pos_ += static_cast<std::uint64_t>(r);
    }
  }

  int fd_;
  std::uint64_t end_;
  Sha256& sha_;
  std::uint64_t pos_ = 0;
};

ShardState load_verified(const fs::path& file) {
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) Reader::throw_reason("cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) Reader::throw_reason("cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) Reader::throw_reason("not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);

  // The header is checked against the file's real size before the payload is touched.
  Sha256 sha;
  Reader in(fd.get(), std::min<std::uint64_t>(size, kHeaderBytes), sha);
  if (size >= kMagic.size()) {
    std::array<char, kMagic.size()> magic{};
    in.raw(magic.data(), magic.size());
    if (magic != kMagic) Reader::throw_reason("bad magic (not a Cohort checkpoint)");
  }
  if (size < kHeaderBytes) {
    Reader::throw_reason("truncated: " + std::to_string(size) + " bytes, shorter than the " +
                         std::to_string(kHeaderBytes) + "-byte header");
  }
  const std::uint32_t format = in.u32("format version");
  if (format != kFormatVersion) {
    Reader::throw_reason("unsupported format version " + std::to_string(format) +
                         " (this build reads version " + std::to_string(kFormatVersion) + ")");
  }
  const std::uint32_t header_bytes = in.u32("header length");
  const std::uint64_t payload = in.u64("payload length");
  if (header_bytes < kHeaderBytes || header_bytes > kMaxHeaderBytes) {
    Reader::throw_reason("bad header length " + std::to_string(header_bytes));
  }
  const std::uint64_t overhead = header_bytes + kDigestBytes;
  if (size < overhead || payload > size - overhead) {
    Reader::throw_reason("truncated: file has " + std::to_string(size) +
                         " bytes, its header declares a payload of " + std::to_string(payload) +
                         " bytes plus " + std::to_string(overhead) +
                         " bytes of header and trailer");
  }
  if (size != payload + overhead) {
    Reader::throw_reason("size mismatch: file has " + std::to_string(size) +
                         " bytes, its header declares " + std::to_string(payload + overhead));
  }
  const std::uint64_t digest_at = header_bytes + payload;
  in.set_end(digest_at);

  ShardState s;
  std::string parse_error;
  try {
    in.skip(header_bytes - kHeaderBytes, "header extension");
    s.shard = in.u32("shard");
    s.shards = in.u32("shards");
    s.begin = in.u64("begin");
    s.end = in.u64("end");
    s.round = in.u64("round");
    s.version = in.u64("version");
    s.model_spec = in.bytes("model_spec");
    s.params = in.floats("params");
    const std::uint32_t slots = in.u32("slot count");
    if (slots > in.left() / kMinSlotBytes) {
      Reader::throw_reason("slot count " + std::to_string(slots) + " exceeds what the " +
                           std::to_string(in.left()) + " payload bytes left can hold");
    }
    s.optimizer_state.reserve(slots);
    for (std::uint32_t i = 0; i < slots; ++i) {
      std::string name = in.bytes("slot name");
      s.optimizer_state.emplace_back(std::move(name), in.floats("slot values"));
    }
    s.extra = in.bytes("extra");
    if (in.pos() != digest_at) {
      Reader::throw_reason("size mismatch: fields end at byte " + std::to_string(in.pos()) +
                           " but the payload ends at byte " + std::to_string(digest_at));
    }
  } catch (const DataError& e) {
    // A corrupt file usually breaks a field first; the digest names the real cause.
    parse_error = e.what();
    in.hash_rest();
  }
  std::array<unsigned char, kDigestBytes> stored{};
  in.read_unhashed(stored.data(), stored.size());
  if (sha.finish() != stored) {
    Reader::throw_reason("checksum mismatch (SHA-256 of the first " + std::to_string(digest_at) +
                         " bytes differs from the trailer): the file is corrupt");
  }
  if (!parse_error.empty()) Reader::throw_reason(parse_error);

  if (s.shards == 0 || s.shard >= s.shards) {
    Reader::throw_reason("bad shard index " + std::to_string(s.shard) + " of " +
                         std::to_string(s.shards));
  }
  if (s.begin > s.end || s.params.size() != s.end - s.begin) {
    Reader::throw_reason("size mismatch: " + std::to_string(s.params.size()) +
                         " parameters for the range [" + std::to_string(s.begin) + ", " +
                         std::to_string(s.end) + ")");
  }
  return s;
}

}  // namespace

CheckpointStore::CheckpointStore(fs::path dir, std::string prefix, int keep)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), keep_(keep) {
  COHORT_CHECK(keep_ >= 2) << "keep=" << keep_ << " leaves nothing to fall back on";
  COHORT_CHECK(!prefix_.empty() && prefix_.find('/') == std::string::npos)
      << "bad checkpoint prefix '" << prefix_ << "'";
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    throw DataError("checkpoint: cannot create folder " + quoted(dir_) + ": " + ec.message());
  }
  // Temporary files of a writer that crashed mid-save: incomplete by construction.
  const std::string temp_prefix = "." + prefix_;
  for (fs::directory_iterator it(dir_, ec), last; !ec && it != last; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (parse_name(name, temp_prefix, kTempSuffix)) {
      COHORT_LOG(Info) << "removing stale checkpoint temp file=" << it->path().string();
      fs::remove(it->path(), ec);
      ec.clear();
    }
  }
}

std::vector<fs::path> CheckpointStore::list() const {
  std::vector<std::pair<std::uint64_t, fs::path>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), last; !ec && it != last; it.increment(ec)) {
    if (auto round = parse_name(it->path().filename().string(), prefix_, kSuffix)) {
      found.emplace_back(*round, it->path());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

fs::path CheckpointStore::save(const ShardState& state) {
  COHORT_CHECK(state.shards > 0 && state.shard < state.shards)
      << "shard " << state.shard << " of " << state.shards;
  COHORT_CHECK(state.begin <= state.end && state.params.size() == state.end - state.begin)
      << state.params.size() << " params for range [" << state.begin << ", " << state.end << ")";
  COHORT_CHECK(state.optimizer_state.size() <= std::numeric_limits<std::uint32_t>::max());

  const std::string stem = prefix_ + "-" + round_digits(state.round);
  const fs::path final_path = dir_ / (stem + std::string(kSuffix));
  const fs::path temp_path = dir_ / ("." + stem + std::string(kTempSuffix));
  {
    // O_TRUNC, not O_EXCL: a leftover of this store's own failed attempt is ours to overwrite.
    Fd fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      throw DataError("checkpoint: cannot create " + quoted(temp_path) + ": " + errno_text(errno));
    }
    TempFile guard(temp_path);
    const std::uint64_t payload = payload_bytes(state);
    Writer w(fd.get(), temp_path, fault_);
    w.raw(kMagic.data(), kMagic.size());
    w.u32(kFormatVersion);
    w.u32(kHeaderBytes);
    w.u64(payload);
    w.u32(state.shard);
    w.u32(state.shards);
    w.u64(state.begin);
    w.u64(state.end);
    w.u64(state.round);
    w.u64(state.version);
    w.bytes(state.model_spec);
    w.floats(state.params);
    w.u32(static_cast<std::uint32_t>(state.optimizer_state.size()));
    for (const auto& [name, values] : state.optimizer_state) {
      w.bytes(name);
      w.floats(values);
    }
    w.bytes(state.extra);
    const std::uint64_t file_bytes = w.finish();
    COHORT_CHECK(file_bytes == kHeaderBytes + payload + kDigestBytes)
        << "wrote " << file_bytes << " bytes, expected " << kHeaderBytes + payload + kDigestBytes;

    const bool fsync_ok = !fault_.fail_fsync && ::fsync(fd.get()) == 0;
    if (!fsync_ok) {
      const int err = fault_.fail_fsync ? fault_.error : errno;
      throw DataError("checkpoint: fsync of " + quoted(temp_path) + " failed: " + errno_text(err));
    }
    if (const int err = fd.reset(); err != 0) {
      throw DataError("checkpoint: close of " + quoted(temp_path) + " failed: " + errno_text(err));
    }
    if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
      throw DataError("checkpoint: rename of " + quoted(temp_path) + " to " + quoted(final_path) +
                      " failed: " + errno_text(errno));
    }
    guard.commit();
    COHORT_LOG(Info) << "checkpoint saved file=" << final_path.string() << " round=" << state.round
                     << " bytes=" << file_bytes;
  }
  // Makes the rename durable. If this throws, the new file is complete but may vanish in a crash;
  // the earlier checkpoints are untouched either way.
  fsync_dir(dir_);

  // Prune: later rounds first (they would shadow this save on the next load_latest()), then all
  // but the keep_ newest. This file is never a candidate.
  std::vector<fs::path> older;
  bool removed_newer = false;
  for (const fs::path& p : list()) {
    const auto round = parse_name(p.filename().string(), prefix_, kSuffix);
    std::error_code ec;
    if (*round > state.round) {
      COHORT_LOG(Warn) << "removing checkpoint of a later round than the one just saved file="
                       << p.string() << " saved_round=" << state.round;
      removed_newer |= fs::remove(p, ec);
      if (ec) {
        COHORT_LOG(Warn) << "cannot remove file=" << p.string() << " reason=\"" << ec.message()
                         << '"';
      }
    } else if (*round < state.round) {
      older.push_back(p);
    }
  }
  const std::size_t keep_older = static_cast<std::size_t>(keep_ - 1);
  for (std::size_t i = 0; i + keep_older < older.size(); ++i) {
    std::error_code ec;
    fs::remove(older[i], ec);
    if (ec) {
      COHORT_LOG(Warn) << "cannot prune checkpoint file=" << older[i].string() << " reason=\""
                       << ec.message() << '"';
    }
  }
  if (removed_newer) {
    try {
      fsync_dir(dir_);
    } catch (const DataError& e) {
      COHORT_LOG(Warn) << e.what();
    }
  }
  return final_path;
}

ShardState CheckpointStore::load(const fs::path& file) {
  try {
    return load_verified(file);
  } catch (const DataError& e) {
    throw DataError("checkpoint " + quoted(file) + " refused: " + e.what());
  }
}

std::optional<ShardState> CheckpointStore::load_latest(std::vector<std::string>* skipped) const {
  const std::vector<fs::path> files = list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::string reason;
    try {
      ShardState s = load_verified(*it);
      const auto named = parse_name(it->filename().string(), prefix_, kSuffix);
      if (named && *named == s.round) return s;
      reason = "holds round " + std::to_string(s.round) + ", its name says " +
               std::to_string(named.value_or(0));
    } catch (const DataError& e) {
      reason = e.what();
    }
    COHORT_LOG(Warn) << "skipping checkpoint file=" << it->string() << " reason=\"" << reason
                     << '"';
    if (skipped != nullptr) skipped->push_back(it->string() + ": " + reason);
  }
  return std::nullopt;
}

}  // namespace cohort::server
