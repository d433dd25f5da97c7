#include "cohort/server/checkpoint.h"

#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace {
namespace fs = std::filesystem;
using cohort::DataError;
using cohort::server::CheckpointStore;
using cohort::server::ShardState;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cohort-ckpt-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

ShardState make_state(std::uint64_t round, std::size_t n = 10) {
  ShardState s;
  s.shard = 1;
  s.shards = 4;
  s.begin = 100;
  s.end = 100 + n;
  s.round = round;
  s.version = round * 2 + 1;
  s.model_spec = "mlp:784-256-128-10";
  s.params = cohort::FloatBuffer(n);
  cohort::FloatBuffer m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    s.params[i] = static_cast<float>(i) * 0.5f + static_cast<float>(round);
    m[i] = -static_cast<float>(i);
    v[i] = 1e-3f * static_cast<float>(i);
  }
  s.optimizer_state.emplace_back("m", std::move(m));
  s.optimizer_state.emplace_back("v", std::move(v));
  s.extra = R"({"rng":"12345","clients":[1,2,3]})";
  return s;
}

void check_equal(const ShardState& a, const ShardState& b) {
  CHECK(a.shard == b.shard);
  CHECK(a.shards == b.shards);
  CHECK(a.begin == b.begin);
  CHECK(a.end == b.end);
  CHECK(a.round == b.round);
  CHECK(a.version == b.version);
  CHECK(a.model_spec == b.model_spec);
  REQUIRE(a.params.size() == b.params.size());
  CHECK(std::equal(a.params.begin(), a.params.end(), b.params.begin()));
  REQUIRE(a.optimizer_state.size() == b.optimizer_state.size());
  for (std::size_t i = 0; i < a.optimizer_state.size(); ++i) {
    CHECK(a.optimizer_state[i].first == b.optimizer_state[i].first);
    const auto& x = a.optimizer_state[i].second;
    const auto& y = b.optimizer_state[i].second;
    REQUIRE(x.size() == y.size());
    CHECK(std::equal(x.begin(), x.end(), y.begin()));
  }
  CHECK(a.extra == b.extra);
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Recomputes the SHA-256 trailer so a hand-made corruption reaches the checks behind it.
void reseal(std::string& bytes) {
  REQUIRE(bytes.size() >= 32);
  unsigned char digest[32];
  unsigned int len = 0;
  REQUIRE(EVP_Digest(bytes.data(), bytes.size() - 32, digest, &len, EVP_sha256(), nullptr) == 1);
  bytes.replace(bytes.size() - 32, 32, reinterpret_cast<const char*>(digest), 32);
}

void put_u64(std::string& bytes, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes[at + i] = static_cast<char>(v >> (8 * i));
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string load_error(const fs::path& file) {
  try {
    CheckpointStore::load(file);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// Offsets in a format-version-1 file (see checkpoint.h).
constexpr std::size_t kSpecLengthAt = 24 + 40;
constexpr std::size_t kParamsCountAt = kSpecLengthAt + 8 + 18;  // "mlp:784-256-128-10"

}  // namespace

TEST_CASE("a shard state with params and two optimizer slots round-trips") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  const ShardState state = make_state(7);
  const fs::path file = store.save(state);
  CHECK(file == dir.path() / "shard-1-000000000007.ckpt");
  CHECK(names_in(dir.path()) == std::vector<std::string>{"shard-1-000000000007.ckpt"});
  check_equal(CheckpointStore::load(file), state);

  std::vector<std::string> skipped;
  auto latest = store.load_latest(&skipped);
  REQUIRE(latest);
  check_equal(*latest, state);
  CHECK(skipped.empty());

  SUBCASE("empty strings, params and slots") {
    ShardState empty;
    empty.round = 8;
    store.save(empty);
    auto back = store.load_latest();
    REQUIRE(back);
    check_equal(*back, empty);
  }
}

TEST_CASE("save survives short writes and EINTR") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-0");
  // Large enough that the parameter array bypasses the 64 KiB stage.
  const ShardState state = make_state(3, 100'000);
  store.set_fault_for_testing({.max_bytes_per_write = 4093, .interrupt_writes = true});
  check_equal(CheckpointStore::load(store.save(state)), state);
  store.set_fault_for_testing({.max_bytes_per_write = 7, .interrupt_writes = true});
  check_equal(CheckpointStore::load(store.save(make_state(4))), make_state(4));
}

TEST_CASE("save replaces a checkpoint atomically and prunes beyond keep") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1", /*keep=*/3);
  for (std::uint64_t r = 1; r <= 5; ++r) store.save(make_state(r));
  CHECK(names_in(dir.path()) == std::vector<std::string>{"shard-1-000000000003.ckpt",
                                                         "shard-1-000000000004.ckpt",
                                                         "shard-1-000000000005.ckpt"});
  CHECK(store.list().size() == 3);

  ShardState again = make_state(5);
  again.params.fill(42.0f);
  store.save(again);  // the same round: renamed over the old file
  CHECK(names_in(dir.path()).size() == 3);
  auto latest = store.load_latest();
  REQUIRE(latest);
  CHECK(latest->params[0] == 42.0f);

  SUBCASE("saving an earlier round makes it the latest") {
    store.save(make_state(4));
    CHECK(names_in(dir.path()) ==
          std::vector<std::string>{"shard-1-000000000003.ckpt", "shard-1-000000000004.ckpt"});
    CHECK(store.load_latest()->round == 4);
  }
  SUBCASE("other prefixes and foreign files are left alone") {
    CheckpointStore other(dir.path(), "shard-10", 2);
    other.save(make_state(9));
    write_bytes(dir.path() / "notes.txt", "hello");
    store.save(make_state(6));
    CHECK(store.list().size() == 3);
    CHECK(fs::exists(dir.path() / "shard-10-000000000009.ckpt"));
    CHECK(fs::exists(dir.path() / "notes.txt"));
    CHECK(store.load_latest()->round == 6);
    CHECK(other.load_latest()->round == 9);
  }
}

TEST_CASE("a truncated checkpoint is refused and load_latest falls back to the previous one") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  store.save(make_state(1));
  const fs::path newest = store.save(make_state(2, 1000));
  const std::string full = read_bytes(newest);
  for (int k = 0; k < 7; ++k) {
    CAPTURE(k);
    write_bytes(newest, full.substr(0, full.size() * k / 7));
    const std::string error = load_error(newest);
    CHECK(error.find(newest.string()) != std::string::npos);
    CHECK(error.find("truncated") != std::string::npos);

    std::vector<std::string> skipped;
    auto latest = store.load_latest(&skipped);
    REQUIRE(latest);
    check_equal(*latest, make_state(1));
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("shard-1-000000000002.ckpt") != std::string::npos);
    CHECK(skipped[0].find("truncated") != std::string::npos);
  }
  write_bytes(newest, full.substr(0, full.size() - 1));
  CHECK(load_error(newest).find("truncated") != std::string::npos);
  write_bytes(newest, full + "x");
  CHECK(load_error(newest).find("size mismatch") != std::string::npos);
}

TEST_CASE("a flipped byte anywhere is refused, in the payload by the checksum") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  store.save(make_state(1));
  const fs::path newest = store.save(make_state(2));
  const std::string good = read_bytes(newest);

  std::string bad = good;
  bad[kParamsCountAt + 8 + 5] ^= 0x01;  // one bit of the second parameter
  write_bytes(newest, bad);
  CHECK(load_error(newest).find("checksum mismatch") != std::string::npos);

  for (std::size_t i = 0; i < good.size(); ++i) {
    CAPTURE(i);
    bad = good;
    bad[i] ^= 0x20;
    write_bytes(newest, bad);
    CHECK_THROWS_AS(CheckpointStore::load(newest), DataError);
    if (i >= 24) CHECK(load_error(newest).find("checksum mismatch") != std::string::npos);
  }
  std::vector<std::string> skipped;
  CHECK(store.load_latest(&skipped)->round == 1);
  CHECK(skipped.size() == 1);
}

TEST_CASE("bad magic and an unknown format version are refused by name") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  const fs::path file = store.save(make_state(1));
  std::string bytes = read_bytes(file);

  std::string bad = bytes;
  bad.replace(0, 8, "NOTACKPT");
  write_bytes(file, bad);
  CHECK(load_error(file).find("bad magic") != std::string::npos);

  write_bytes(file, "{\"a text file\": \"named like a checkpoint\"}\n");
  CHECK(load_error(file).find("bad magic") != std::string::npos);

  bad = bytes;
  bad[8] = 2;
  write_bytes(file, bad);
  CHECK(load_error(file).find("unsupported format version 2") != std::string::npos);
  CHECK_FALSE(store.load_latest());
}

TEST_CASE("a corrupt length field is refused without a huge allocation") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  const fs::path file = store.save(make_state(1));
  const std::string good = read_bytes(file);

  // Re-sealed, so the length checks behind the digest are what refuses them. An allocation of
  // the declared size would throw std::bad_alloc, not DataError.
  struct Case {
    const char* name;
    std::size_t at;
    std::uint64_t value;
    const char* reason;
  };
  for (const Case& c : {
           Case{"model_spec", kSpecLengthAt, std::uint64_t{1} << 62, "length field of model_spec"},
           Case{"params", kParamsCountAt, std::uint64_t{1} << 61, "length field of params"},
           Case{"range end", 24 + 16, 111, "size mismatch: 10 parameters for the range [100, 111)"},
           Case{"payload", 16, ~std::uint64_t{0}, "truncated"},
       }) {
    CAPTURE(c.name);
    std::string bad = good;
    put_u64(bad, c.at, c.value);
    if (c.at != 16) reseal(bad);
    write_bytes(file, bad);
    const std::string error = load_error(file);
    CHECK(error.find(c.reason) != std::string::npos);
    CHECK(error.find("checksum") == std::string::npos);
  }
  SUBCASE("slot count") {
    std::string bad = good;
    const std::size_t slots_at = kParamsCountAt + 8 + 10 * 4;
    for (int i = 0; i < 4; ++i) bad[slots_at + i] = static_cast<char>(0xff);
    reseal(bad);
    write_bytes(file, bad);
    CHECK(load_error(file).find("slot count 4294967295") != std::string::npos);
  }
  SUBCASE("without re-sealing the digest catches it first") {
    std::string bad = good;
    put_u64(bad, kParamsCountAt, std::uint64_t{1} << 61);
    write_bytes(file, bad);
    CHECK(load_error(file).find("checksum mismatch") != std::string::npos);
  }
}

TEST_CASE("a disk that fills while saving leaves the previous checkpoint intact, no temp file") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  const fs::path first = store.save(make_state(1));
  const std::string first_bytes = read_bytes(first);
  const std::uint64_t size = first_bytes.size();

  for (std::uint64_t after : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{24},
                              std::uint64_t{100}, size - 32, size - 1}) {
    CAPTURE(after);
    store.set_fault_for_testing({.fail_after_bytes = after});
    std::string error;
    try {
      store.save(make_state(2));
    } catch (const DataError& e) {
      error = e.what();
    }
    CHECK(error.find(".shard-1-000000000002.ckpt.tmp") != std::string::npos);
    CHECK(error.find("No space left on device") != std::string::npos);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"shard-1-000000000001.ckpt"});
    CHECK(read_bytes(first) == first_bytes);
    auto latest = store.load_latest();
    REQUIRE(latest);
    check_equal(*latest, make_state(1));
  }

  store.set_fault_for_testing({.error = EIO, .fail_fsync = true});
  try {
    store.save(make_state(2));
    FAIL("save should have thrown");
  } catch (const DataError& e) {
    CHECK(std::string(e.what()).find("fsync") != std::string::npos);
    CHECK(std::string(e.what()).find("Input/output error") != std::string::npos);
  }
  CHECK(names_in(dir.path()) == std::vector<std::string>{"shard-1-000000000001.ckpt"});

  store.set_fault_for_testing({});
  store.save(make_state(2));
  CHECK(store.load_latest()->round == 2);
}

TEST_CASE("a real short write (RLIMIT_FSIZE) fails cleanly") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  store.save(make_state(1));
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;  // the kernel writes up to here, then fails with EFBIG
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string error;
  try {
    store.save(make_state(2, 10'000));
  } catch (const DataError& e) {
    error = e.what();
  }
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, old_handler);
  CHECK(error.find("File too large") != std::string::npos);
  CHECK(error.find("after 4096 bytes") != std::string::npos);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"shard-1-000000000001.ckpt"});
  CHECK(store.load_latest()->round == 1);
}

TEST_CASE("load_latest on a missing or empty folder returns nullopt") {
  TempDir dir;
  CheckpointStore store(dir.path() / "a" / "b", "shard-1");
  CHECK(fs::is_directory(dir.path() / "a" / "b"));
  std::vector<std::string> skipped;
  CHECK_FALSE(store.load_latest(&skipped));
  CHECK(skipped.empty());
  fs::remove_all(dir.path() / "a");
  CHECK_FALSE(store.load_latest(&skipped));
  CHECK(skipped.empty());
  CHECK_THROWS_AS(CheckpointStore::load(dir.path() / "nope.ckpt"), DataError);
}

TEST_CASE("a new store removes its prefix's stale temp files, and only those") {
  TempDir dir;
  write_bytes(dir.path() / ".shard-1-000000000004.ckpt.tmp", "half a checkpoint");
  write_bytes(dir.path() / ".shard-10-000000000004.ckpt.tmp", "another shard's");
  CheckpointStore store(dir.path(), "shard-1");
  CHECK(names_in(dir.path()) == std::vector<std::string>{".shard-10-000000000004.ckpt.tmp"});
}

TEST_CASE("load_latest skips a file whose content names another round") {
  TempDir dir;
  CheckpointStore store(dir.path(), "shard-1");
  store.save(make_state(1));
  const fs::path two = store.save(make_state(2));
  fs::rename(two, dir.path() / "shard-1-000000000009.ckpt");
  std::vector<std::string> skipped;
  CHECK(store.load_latest(&skipped)->round == 1);
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].find("holds round 2") != std::string::npos);
}
