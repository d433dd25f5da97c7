// Crash-safe checkpoints of one parameter-server shard.
//
// A shard saves its parameters, optimizer state and round number every R rounds and when asked to
// stop (SIGTERM). Restarting with the same flags calls load_latest() and resumes. A save is
// atomic: the file is written under a temporary name in the same folder, fsync'ed, renamed into
// place and the folder fsync'ed, so a crash or a full disk at any point leaves either the old set
// of checkpoints or the old set plus the new one, never a half-written file under a final name.
// A checkpoint that fails to verify on load (bit rot, truncation by hand, a foreign file) is
// skipped with a warning and the previous one is used.
//
// File format, version 1 (all integers little-endian; floats IEEE-754 binary32, little-endian):
//
//   header   char[8] magic "COHORTCK"  u32 format_version (1)  u32 header_bytes (24)
//            u64 payload_bytes
//            (a reader skips header bytes beyond the 24 it knows; they are covered by the digest)
//   payload  u32 shard  u32 shards  u64 begin  u64 end  u64 round  u64 version
//            bytes model_spec                      bytes  = u64 length, then the bytes
//            floats params                         floats = u64 count, then count * 4 bytes
//            u32 slot_count, then slot_count x { bytes name, floats values }
//            bytes extra
//   trailer  u8[32] SHA-256 of every byte before it
//
// The file is exactly header_bytes + payload_bytes + 32 bytes long. A reader checks the sizes
// against the file's real size, then the digest, then every length field against the bytes left,
// so neither truncation nor a corrupt length can trigger an allocation larger than the file.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/buffer.h"

namespace cohort::server {

// Everything a shard needs to resume. Plain data; move-only because FloatBuffer is.
struct ShardState {
  std::uint32_t shard = 0;   // this shard's index, < shards
  std::uint32_t shards = 1;  // number of shards the model is split into
  std::uint64_t begin = 0;   // [begin, end): the range of the flat parameter vector it owns
  std::uint64_t end = 0;
  std::uint64_t round = 0;    // last completed round
  std::uint64_t version = 0;  // model version
  std::string model_spec;     // e.g. "mlp:784-256-128-10"; the caller checks it on resume
  FloatBuffer params;         // end - begin floats
  // Named optimizer slots, e.g. {"m", ...}, {"v", ...}; sizes are the optimizer's business.
  std::vector<std::pair<std::string, FloatBuffer>> optimizer_state;
  std::string extra;  // opaque text (JSON) the shard may store: RNG state, client table
};

// The checkpoints of one shard: files <dir>/<prefix>-<round, 12+ digits>.ckpt.
//
// A store assumes it is the only writer of its prefix in `dir` (one store per shard process);
// the constructor removes temporary files that an earlier, crashed writer of the prefix left.
// Not thread-safe: drive one store from one thread. save() is not async-signal-safe: on SIGTERM,
// set a flag in the handler and save from the shard's loop.
//
// Throws DataError on I/O failure (naming the path, the step and the errno text) and on a
// checkpoint that does not verify; InternalError (COHORT_CHECK) if a ShardState is inconsistent.
class CheckpointStore {
 public:
  // Creates `dir` if missing, so an unusable path fails at startup rather than at the first save.
  // REQUIRES: keep >= 2 (one to fall back on if the newest turns out corrupt); prefix non-empty,
  // without '/'.
  CheckpointStore(std::filesystem::path dir, std::string prefix, int keep = 3);

  // Writes the checkpoint of state.round atomically (temp file, fsync, rename, fsync of dir) and
  // returns its path; a checkpoint of the same round is replaced. The new file becomes the latest:
  // files of later rounds (skipped as corrupt, or left by an abandoned run) are removed, then
  // all but the `keep` newest. On failure throws DataError with the temporary file removed and
  // every earlier checkpoint untouched. Failures while pruning are only logged.
  // REQUIRES: shard < shards, begin <= end, params.size() == end - begin.
  std::filesystem::path save(const ShardState& state);

  // Loads the newest checkpoint that verifies. Each one that does not is skipped with one Warn log
  // line naming the file and the reason, and "<file>: <reason>" is appended to *skipped when
  // given. A file whose content names another round than its file name is skipped too.
  // nullopt if the folder is missing or holds no loadable checkpoint of this prefix.
  [[nodiscard]] std::optional<ShardState> load_latest(
      std::vector<std::string>* skipped = nullptr) const;

  // The checkpoint files of this prefix, oldest round first (whether or not they verify).
  [[nodiscard]] std::vector<std::filesystem::path> list() const;

  // Loads and verifies one file. Thread-safe. Throws DataError naming the file and the reason:
  // cannot open, truncated, bad magic, unsupported format version, checksum mismatch, a length
  // field that exceeds the file, or sizes that do not add up.
  static ShardState load(const std::filesystem::path& file);

  [[nodiscard]] const std::filesystem::path& dir() const { return dir_; }
  [[nodiscard]] const std::string& prefix() const { return prefix_; }

  // Test seam: makes later save() calls misbehave as a full or slow disk would. The defaults
  // inject nothing.
  struct FaultForTesting {
    // write() writes up to this many bytes of the file in total, then fails with `error`.
    std::uint64_t fail_after_bytes = std::numeric_limits<std::uint64_t>::max();
    int error = ENOSPC;
    bool fail_fsync = false;  // fsync() of the temporary file fails with `error`
    // Each write() call writes at most this many bytes (a short write), and when
    // interrupt_writes is set every other call fails with EINTR first.
    std::size_t max_bytes_per_write = std::numeric_limits<std::size_t>::max();
    bool interrupt_writes = false;
  };
  void set_fault_for_testing(const FaultForTesting& fault) { fault_ = fault; }

 private:
  std::filesystem::path dir_;
  std::string prefix_;
  int keep_;
  FaultForTesting fault_;
};

}  // namespace cohort::server
