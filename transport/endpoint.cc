#include "cohort/transport/endpoint.h"

#include <sched.h>

#include <zmq.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <unordered_map>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/scheduling.h"
#include "cohort/transport/security/security.h"

namespace cohort::transport {
namespace {

using Clock = std::chrono::steady_clock;
using Frames = Endpoint::Frames;
namespace sec = security;

constexpr std::size_t kRecordHeaderBytes = 16;
constexpr std::uint8_t kRecordVersion = 1;
// Chunks sealed ahead of the socket: enough to keep both cores busy, small enough to bound memory.
constexpr std::size_t kSealWindow = 8;
// Received bulk frames being opened at once (on the pool) before the oldest must be committed:
// at most one per worker plus one for the socket thread, and never more than this. Each holds its
// frame and, streaming, its chunk (2 MiB at 1 MiB chunks): a shard's peak RSS counts them.
constexpr std::size_t kOpenWindow = 8;
// Smaller bulk frames are opened on the socket thread: a pool round trip costs ~10 us, an open of
// 64 KiB ~25 us.
constexpr std::size_t kMinPoolCryptoBytes = 64 << 10;
// Bulk frames of one message allowed inside ZeroMQ (queued, not yet written to the socket) before
// the sender waits: measured on 2 cores, 16 MiB pushes ran at 6.1 GB/s in every plaintext run
// (3.8-6.3 unpaced) and 4.3 under TLS (3.4-3.9), the buffers recycling while warm in cache.
constexpr std::uint32_t kSendAhead = 4;
// A sender that saw no frame leave for this long stops pacing that message (a stalled peer must
// not stall it; its frames queue in ZeroMQ as before).
constexpr auto kSendPatience = std::chrono::milliseconds(50);
// A ready session that has not been heard from for this long is forgotten (clients heartbeat).
constexpr auto kSessionIdleTimeout = std::chrono::minutes(30);

enum class Kind : std::uint8_t {
  kHello = 1,      // client -> server: claimed node id, first TLS flight
  kHandshake = 2,  // TLS bytes, either way
  kPlain = 3,      // envelope (+ bulk) in clear
  kSealed = 4,     // envelope (+ bulk) under AES-256-GCM
  kRefuse = 5,     // the peer refused us; frame 1 says why
  kReset = 6,      // the peer has no session for us: handshake again
  kAccept = 7,     // server -> client: your certificate checked out; the session is open
};

struct RecordHeader {
  Kind kind;
  std::uint64_t counter;
};

std::array<std::byte, kRecordHeaderBytes> make_header(Kind kind, std::uint64_t counter) {
  std::array<std::byte, kRecordHeaderBytes> h{};
  h[0] = std::byte{'C'};
  h[1] = std::byte{'H'};
  h[2] = std::byte{kRecordVersion};
  h[3] = static_cast<std::byte>(kind);
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<std::byte>((counter >> (8 * i)) & 0xff);
  return h;
}

std::optional<RecordHeader> parse_header(const zmq::message_t& m) {
  if (m.size() != kRecordHeaderBytes) return std::nullopt;
  const auto* p = static_cast<const unsigned char*>(m.data());
  if (p[0] != 'C' || p[1] != 'H' || p[2] != kRecordVersion) return std::nullopt;
  if (p[3] < 1 || p[3] > 7) return std::nullopt;
  std::uint64_t counter = 0;
  for (int i = 0; i < 8; ++i) counter |= static_cast<std::uint64_t>(p[8 + i]) << (8 * i);
  return RecordHeader{static_cast<Kind>(p[3]), counter};
}

std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

// Peer-supplied text for logs and errors: bounded, printable ASCII only.
std::string text_of(const zmq::message_t& m, std::size_t limit = 512) {
  std::string s(static_cast<const char*>(m.data()), std::min(m.size(), limit));
  for (char& c : s) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return s;
}

zmq::message_t message_from(std::span<const std::byte> bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t message_from(std::string_view s) { return zmq::message_t(s.data(), s.size()); }

bool is_inproc(const std::string& url) { return url.rfind("inproc://", 0) == 0; }

// Plaintext bulk frames at least this large are delivered in place (see adopt_frame), smaller ones
// copied: a small frame may sit inside ZeroMQ's shared 8 KiB receive buffer, and keeping it
// would pin that buffer for a copy that costs next to nothing.
constexpr std::size_t kAdoptMinBytes = 64 << 10;

bool adoptable(const zmq::message_t& m) {
  return m.size() >= kAdoptMinBytes &&
         reinterpret_cast<std::uintptr_t>(m.data()) % 8 == 0;
}

// Delivers a received plaintext bulk frame without copying it: the PooledBuffer shares the frame's
// memory (zmq_msg_copy counts a reference; it copies nothing) and drops that reference when it is
// dropped. The frame's memory is what ZeroMQ's I/O thread read the socket into, so this saves the
// one copy of every received byte that the receiving thread used to make.
// `size` bytes of it: all, or the plaintext of a sealed frame opened in place.
PooledBuffer adopt_frame(zmq::message_t& m, std::size_t size) {
  auto* owner = new zmq::message_t();
  owner->copy(m);
  auto* data = static_cast<std::byte*>(owner->data());
  return PooledBuffer::wrap(data, size,
                            [](void* o) noexcept { delete static_cast<zmq::message_t*>(o); }, owner);
}
PooledBuffer adopt_frame(zmq::message_t& m) { return adopt_frame(m, m.size()); }

struct Transfer {
  Envelope head;
  PooledBuffer buffer;  // whole payload, when reassembling
  std::uint32_t next_index = 1;
  std::uint32_t count = 0;
  Clock::time_point started;
};

struct Session {
  enum class State { kHandshaking, kAwaitAccept, kReady, kFailed };
  State state = State::kHandshaking;
  std::unique_ptr<sec::Handshake> handshake;
  std::unique_ptr<sec::FrameCipher> tx;
  std::unique_ptr<sec::FrameCipher> rx;
  sec::ReplayWindow window;
  NodeId peer_id;
  std::uint64_t tx_counter = 0;
  // Handshake attempt: carried in the counter field of handshake records, so that answers to an
  // abandoned attempt (after a reconnect) are ignored instead of failing the new one.
  std::uint64_t attempt = 0;
  Clock::time_point started = Clock::now();
  Clock::time_point last_seen = Clock::now();
  std::unordered_map<std::uint64_t, Transfer> transfers;
  std::string failure;
};

// zmq::poll that treats an interrupting signal as an early timeout instead of an error.
// Returns false when a signal interrupted the wait.
bool poll_sockets(zmq::pollitem_t* items, std::size_t count, std::chrono::milliseconds timeout) {
  try {
    zmq::poll(items, count, timeout);
    return true;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
}

// Copies into memory that will not be read again soon (a reassembly buffer far larger than the
// caches) with non-temporal stores, which skip reading each destination line first: 2x memcpy's
// speed here (9.2 vs 4.6 GB/s into a cold 64 MiB buffer), and memcpy was a fifth of all CPU time
// of a plaintext 64 MiB transfer.
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__SSE2__)
  const std::size_t head =
      std::min(n, (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & std::size_t{15});
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the stores are weakly ordered: make them visible before the commit
#else
  std::memcpy(dst, src, n);
#endif
}

// One seal, open or plaintext copy of a bulk frame, run by a pool worker or, if none has started
// it by the time its result is needed, by the socket thread: whoever claims it first runs it. So
// the socket thread never waits behind other work queued on a busy pool (training, aggregation),
// and cannot deadlock when it is itself a pool worker. The pool task may run (and find it claimed,
// or gone) after the record is done with; the spans are only touched by the claimant.
struct CryptoJob {
  // kOpenInPlace opens `out` (the whole sealed frame) where it lies; it runs only when its record
  // is the oldest pending one (finish_job), so a failed record before it can still send it down
  // the serial path with its ciphertext intact.
  enum class Op { kSeal, kOpen, kOpenInPlace, kCopy };
  Op op = Op::kCopy;
  const security::FrameCipher* cipher = nullptr;
  std::uint64_t counter = 0;
  std::span<const std::byte> aad;
  std::span<const std::byte> in;
  std::span<std::byte> out;
  bool streaming = false;    // kCopy into a reassembly buffer: see copy_streaming()
  std::atomic<bool> claimed{false};
  bool ok = false;           // written by the claimant; read after finish()
  std::future<void> done;    // valid when submitted to the pool

  void run() noexcept {
    try {
      switch (op) {
        case Op::kSeal: cipher->seal(counter, 1, aad, in, out); ok = true; break;
        case Op::kOpen: ok = cipher->open(counter, 1, aad, in, out); break;
        case Op::kOpenInPlace: ok = cipher->open_in_place(counter, 1, aad, out); break;
        case Op::kCopy:
          if (streaming) {
            copy_streaming(out.data(), in.data(), in.size());
          } else if (!in.empty()) {
            std::memcpy(out.data(), in.data(), in.size());
          }
          ok = true;
          break;
      }
    } catch (...) {
      ok = false;
    }
  }
  bool claim() { return !claimed.exchange(true, std::memory_order_acq_rel); }
};

// Runs `job` now, or hands it to the pool if there is one and it is worth it. Plaintext copies
// run here: at memcpy speed, a hand-off costs more than it saves (measured).
void start_job(const std::shared_ptr<CryptoJob>& job, ThreadPool* pool) {
  if (job->op == CryptoJob::Op::kOpenInPlace) return;  // left for finish_job, see above
  if (pool == nullptr || job->op == CryptoJob::Op::kCopy || job->in.size() < kMinPoolCryptoBytes) {
    job->claimed.store(true, std::memory_order_relaxed);
    job->run();
    return;
  }
  // A weak reference: the job owns the task's future, so a strong one would be a cycle. A job
  // gone before a worker got to it was claimed and run by its owner.
  job->done = pool->submit([weak = std::weak_ptr<CryptoJob>(job)] {
    if (auto j = weak.lock(); j && j->claim()) j->run();
  });
}

// Waits for `job`, running it here if no worker has claimed it yet. Returns its result.
bool finish_job(CryptoJob& job) {
  if (job.claim()) {
    job.run();
  } else if (job.done.valid()) {
    job.done.wait();
  }
  return job.ok;
}

// How many bulk frames of one message ZeroMQ has let go of (written to the socket, or dropped):
// counted by the frames' free callbacks, on ZeroMQ's I/O thread.
class SendProgress {
 public:
  void release() noexcept {
    {
      std::lock_guard lock(mu_);
      ++released_;
    }
    cv_.notify_one();
  }
  // Waits until at least `n` frames were let go of; false after `patience` without that.
  bool wait_released(std::uint32_t n, std::chrono::milliseconds patience) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, patience, [&] { return released_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint32_t released_ = 0;
};

// What a bulk frame's free callback releases: a pooled buffer or the caller's memory, then counts.
struct BulkHint {
  void* pooled = nullptr;                  // a detached PooledBuffer
  std::shared_ptr<const void> owner;       // or the caller's payload
  std::shared_ptr<SendProgress> progress;  // may be null
};

void free_bulk(void* /*data*/, void* hint) noexcept {
  auto* h = static_cast<BulkHint*>(hint);
  if (h->pooled != nullptr) PooledBuffer::release_detached(h->pooled);
  auto progress = std::move(h->progress);
  delete h;
  if (progress) progress->release();
}

// Keeps a message's sender at most kSendAhead bulk frames ahead of the socket.
class SendPacer {
 public:
  explicit SendPacer(bool on) : progress_(on ? std::make_shared<SendProgress>() : nullptr) {}
  const std::shared_ptr<SendProgress>& progress() const { return progress_; }
  // Before handing bulk frame `i` (0-based) to ZeroMQ.
  void before(std::uint32_t i) {
    if (!progress_ || i < kSendAhead) return;
    if (!progress_->wait_released(i - kSendAhead + 1, kSendPatience)) progress_.reset();
  }

 private:
  std::shared_ptr<SendProgress> progress_;
};

// One record being sealed on the pool while earlier ones go out.
struct PendingRecord {
  std::array<std::byte, kRecordHeaderBytes> header{};
  std::vector<std::byte> envelope;        // plaintext: the bulk frame's AAD
  std::vector<std::byte> sealed_envelope;
  PooledBuffer bulk;
  std::shared_ptr<CryptoJob> seal;        // null without a bulk frame
};

// A received data record whose bulk frame is being opened (on the pool) while later records are
// read. Everything before the open (header, envelope, validation, destination) is done, against
// the session state as it will be if every earlier pending record commits; the commit (replay
// window, stats, inbox) happens in record order. See Endpoint::Impl::defer_data().
struct PendingOpen {
  enum class Kind { kHeadPiece, kHeadWhole, kChunkPiece, kChunkWhole };
  Kind kind = Kind::kHeadPiece;
  PeerHandle peer;
  Session* session = nullptr;  // sessions are not erased while records are pending
  RecordHeader header{};
  std::vector<zmq::message_t> frames;  // kept for the open, and for a serial retry
  std::vector<std::byte> plain_env;    // sealed: the opened envelope, the bulk frame's AAD
  Envelope env;                        // kHeadPiece: the message's envelope
  NodeId sender;
  std::uint64_t transfer = 0;    // id of the transfer this record created or continues
  bool created_transfer = false;  // a head that opened a multi-chunk transfer
  std::uint64_t offset = 0;
  std::uint64_t len = 0;
  bool last = false;             // chunks: completes the transfer
  PooledBuffer piece;            // k*Piece: the destination
  std::shared_ptr<CryptoJob> job;
};

}  // namespace

struct Context::Impl {
  zmq::context_t ctx;
  explicit Impl(int io_threads) : ctx(io_threads) {
    // Before the first socket: ZeroMQ starts its I/O threads then (see cohort/core/scheduling.h).
    if (const int policy = io_thread_policy(io_scheduling()); policy != sched_getscheduler(0)) {
      ctx.set(zmq::ctxopt::thread_sched_policy, policy);
    }
  }
};

namespace {

// ZeroMQ mallocs each received frame larger than its 8 KiB batch (every bulk chunk) on its I/O
// thread, and we free it on ours. With glibc's defaults the arena's free top goes back to the
// kernel (MADV_DONTNEED) as soon as it exceeds twice the largest recent block, so later frames
// fault their pages in again (~16 us per 4 KiB). Measured on 64 MiB TLS transfers: ~2,000 faults
// per transfer on the receiver's I/O thread, half of its receive time; fixing it gained ~25% for
// plain and TLS. So, once per process: keep up to kRetainedFreeBytes of free top per arena, and
// serve blocks up to 32 MiB (glibc's maximum) from the arenas instead of fresh mmaps. Setting
// either turns off glibc's dynamic thresholds, hence both. Process-wide, like the Context.
constexpr int kRetainedFreeBytes = 64 << 20;
constexpr int kMmapThresholdBytes = 32 << 20;

void keep_frame_memory_mapped() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    (void)mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
    (void)mallopt(M_TRIM_THRESHOLD, kRetainedFreeBytes);
  });
#endif
}

}  // namespace

Context::Context(int io_threads) : impl_(std::make_unique<Impl>(io_threads)) {
  keep_frame_memory_mapped();
}
Context::~Context() = default;

struct Endpoint::Impl {
  zmq::socket_t socket;
  zmq::socket_t monitor;  // DEALER only: connect/disconnect events trigger a new handshake
  bool is_router = false;
  bool secure = true;
  std::string url;
  EndpointOptions options;
  std::unique_ptr<sec::TlsContext> tls;
  std::shared_ptr<BufferPool> buffers;
  std::unordered_map<PeerHandle, Session> sessions;  // ROUTER: by routing id; DEALER: key ""
  std::deque<Message> inbox;
  std::uint64_t seq = 0;
  EndpointStats stats;
  Clock::time_point last_sweep = Clock::now();
  std::function<std::vector<Frames>(Frames)> hook;
  std::deque<std::unique_ptr<PendingOpen>> opening;  // bulk records being opened, in order
  std::vector<std::vector<zmq::message_t>> spare_frames;  // receive frame vectors, reused
  std::uint64_t warn_budget_reset = 0;
  int warnings_this_second = 0;

  // ---- sending ------------------------------------------------------------------------------

  // Sends one record; returns false if a ROUTER's peer is unreachable.
  bool send_frames(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
                   std::optional<zmq::message_t> bulk) {
    if (hook) return send_hooked(peer, std::move(header), std::move(body), std::move(bulk));
    try {
      if (is_router) {
        if (!socket.send(message_from(std::string_view(peer)), zmq::send_flags::sndmore)) {
          throw TimeoutError("send to peer timed out after " +
                             std::to_string(options.send_timeout.count()) + " ms");
        }
      }
      auto more = zmq::send_flags::sndmore;
      if (!socket.send(header, more)) throw TimeoutError("send timed out");
      if (!socket.send(body, bulk ? more : zmq::send_flags::none)) throw TimeoutError("send timed out");
      if (bulk && !socket.send(*bulk, zmq::send_flags::none)) throw TimeoutError("send timed out");
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return false;
      throw TransportError(std::string("send on ") + url + " failed: " + e.what());
    }
    ++stats.records_sent;
    return true;
  }

  bool send_hooked(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
                   std::optional<zmq::message_t> bulk) {
    Frames record;
    for (zmq::message_t* m : {&header, &body}) {
      auto b = bytes_of(*m);
      record.emplace_back(b.begin(), b.end());
    }
    if (bulk) {
      auto b = bytes_of(*bulk);
      record.emplace_back(b.begin(), b.end());
    }
    auto h = std::move(hook);  // the hook sees each record once, not its own re-sends
    bool ok = true;
    try {
      for (auto& r : h(std::move(record))) raw_send(peer, r);
    } catch (...) {
      hook = std::move(h);
      throw;
    }
    hook = std::move(h);
    return ok;
  }

  void raw_send(const PeerHandle& peer, const Frames& record) {
    if (is_router) socket.send(message_from(std::string_view(peer)), zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < record.size(); ++i) {
      socket.send(message_from(std::span<const std::byte>(record[i])),
                  i + 1 < record.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    ++stats.records_sent;
  }

  void send_control(const PeerHandle& peer, Kind kind, std::span<const std::byte> a,
                    std::optional<std::span<const std::byte>> b = std::nullopt,
                    std::uint64_t attempt = 0) {
    auto h = make_header(kind, attempt);
    std::optional<zmq::message_t> second;
    if (b) second = message_from(*b);
    send_frames(peer, message_from(std::span<const std::byte>(h)), message_from(a), std::move(second));
  }

  void refuse(const PeerHandle& peer, const std::string& reason, std::uint64_t attempt = 0) {
    ++stats.refused_peers;
    warn_limited("refused peer: " + reason);
    send_control(peer, Kind::kRefuse, std::as_bytes(std::span(reason.data(), reason.size())),
                 std::nullopt, attempt);
  }

  void warn_limited(const std::string& text) {
    const auto now_s = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count());
    if (now_s != warn_budget_reset) {
      warn_budget_reset = now_s;
      warnings_this_second = 0;
    }
    if (++warnings_this_second <= 5) {
      COHORT_LOG(Warn) << url << ": " << text;
    }
  }

  std::optional<std::uint64_t> send_message(const PeerHandle& peer, Envelope env, Payload payload) {
    Session* session = nullptr;
    if (!is_router) {
      if (!is_ready()) wait_ready(options.handshake_timeout);
      session = &sessions.at("");
    } else {
      auto it = sessions.find(peer);
      if (it == sessions.end() || it->second.state != Session::State::kReady) return std::nullopt;
      session = &it->second;
    }
    const std::uint64_t total = payload.bytes.size();
    if (total > options.max_payload_bytes) {
      throw TransportError("payload of " + std::to_string(total) + " bytes exceeds max_payload_bytes");
    }
    const std::size_t chunk = options.chunk_bytes;
    const std::uint32_t count =
        total == 0 ? 1 : static_cast<std::uint32_t>((total + chunk - 1) / chunk);
    env.protocol_version = kProtocolVersion;
    if (!options.multiplex || is_router || env.sender.empty()) env.sender = options.node_id;
    env.seq = ++seq;
    env.payload_bytes = total;
    env.chunk_bytes = total == 0 ? 0 : static_cast<std::uint32_t>(chunk);
    const std::uint64_t head_seq = env.seq;

    auto envelope_for = [&](std::uint32_t i) {
      if (i == 0) return env;
      Envelope c;
      c.sender = env.sender;
      c.recipient = env.recipient;
      c.seq = ++seq;
      c.round = env.round;
      c.payload_bytes = total;
      c.chunk_bytes = env.chunk_bytes;
      c.body = ChunkHeader{head_seq, i, count, std::uint64_t{i} * chunk};
      return c;
    };
    auto slice = [&](std::uint32_t i) {
      if (total == 0) return std::span<const std::byte>();
      const std::size_t off = std::size_t{i} * chunk;
      return payload.bytes.subspan(off, std::min<std::size_t>(chunk, total - off));
    };

    if (!secure) {
      SendPacer pacer(paced() && count > kSendAhead);
      for (std::uint32_t i = 0; i < count; ++i) {
        auto header = make_header(Kind::kPlain, 0);
        auto body = encode(envelope_for(i));
        std::optional<zmq::message_t> bulk;
        if (total > 0) {
          pacer.before(i);
          bulk = bulk_message(slice(i), payload.owner, pacer.progress());
        }
        if (!send_frames(peer, message_from(std::span<const std::byte>(header)),
                         message_from(std::span<const std::byte>(body)), std::move(bulk))) {
          return std::nullopt;
        }
      }
      stats.bytes_sent += total;
      return head_seq;
    }

    // Sealed: counters are assigned in order here; bulk chunks are sealed on the pool, up to
    // kSealWindow ahead of the socket. The socket thread seals the oldest itself when no worker
    // has started it yet.
    std::deque<std::unique_ptr<PendingRecord>> window;
    // Whatever happens (a send timing out), no worker may still write into a record we free.
    struct SettleWindow {
      std::deque<std::unique_ptr<PendingRecord>>& w;
      ~SettleWindow() {
        for (auto& rec : w) {
          if (rec->seal && !rec->seal->claim() && rec->seal->done.valid()) rec->seal->done.wait();
        }
      }
    } settle{window};
    const sec::FrameCipher& cipher = *session->tx;
    ThreadPool* pool = count > 1 ? crypto_pool() : nullptr;
    // Sealing here (no pool): paced like plaintext, which also keeps the buffers it seals into
    // few and warm. With a pool the seal window bounds what is ahead.
    SendPacer pacer(paced() && pool == nullptr && count > kSendAhead && total > 0);
    auto flush_front = [&]() -> bool {
      PendingRecord& rec = *window.front();
      std::optional<zmq::message_t> bulk;
      if (rec.seal) {
        const bool sealed = finish_job(*rec.seal);
        rec.seal.reset();  // done: nothing left to settle
        if (!sealed) throw TransportError("AES-256-GCM seal failed");
        bulk = pooled_message(std::move(rec.bulk), pacer.progress());
      }
      const bool ok =
          send_frames(peer, message_from(std::span<const std::byte>(rec.header)),
                      message_from(std::span<const std::byte>(rec.sealed_envelope)), std::move(bulk));
      window.pop_front();
      return ok;
    };
    bool delivered = true;
    for (std::uint32_t i = 0; i < count && delivered; ++i) {
      auto rec = std::make_unique<PendingRecord>();
      const std::uint64_t counter = ++session->tx_counter;
      rec->header = make_header(Kind::kSealed, counter);
      rec->envelope = encode(envelope_for(i));
      rec->sealed_envelope.resize(rec->envelope.size() + sec::FrameCipher::kTagBytes);
      cipher.seal(counter, 0, rec->header, rec->envelope, rec->sealed_envelope);
      if (total > 0) {
        auto in = slice(i);
        pacer.before(i);
        rec->bulk = buffers->acquire(in.size() + sec::FrameCipher::kTagBytes);
        rec->seal = std::make_shared<CryptoJob>();
        CryptoJob& job = *rec->seal;
        job.op = CryptoJob::Op::kSeal;
        job.cipher = &cipher;
        job.counter = counter;
        job.aad = rec->envelope;
        job.in = in;
        job.out = rec->bulk.span();
        start_job(rec->seal, pool);
      }
      window.push_back(std::move(rec));
      // Sealed here, with no pool: out at once, so the socket starts on the first chunk while
      // this thread seals the next.
      if (window.size() >= (pool != nullptr ? kSealWindow : 1)) delivered = flush_front();
    }
    while (delivered && !window.empty()) delivered = flush_front();
    if (!delivered) return std::nullopt;
    stats.bytes_sent += total;
    return head_seq;
  }

  // A DEALER paces its messages to its one peer. A ROUTER does not: waiting on one slow peer
  // would hold up every other. Over inproc:// a frame is let go of only when the receiver drops
  // it, often on this thread.
  bool paced() const { return !is_router && url.rfind("inproc://", 0) != 0; }

  zmq::message_t pooled_message(PooledBuffer buf,
                                const std::shared_ptr<SendProgress>& progress = nullptr) {
    const std::size_t size = buf.size();
    void* data = buf.data();
    auto* hint = new BulkHint{buf.detach(), nullptr, progress};  // freed by ZeroMQ's callback
    return zmq::message_t(data, size, free_bulk, hint);
  }

  zmq::message_t bulk_message(std::span<const std::byte> bytes,
                              const std::shared_ptr<const void>& owner,
                              const std::shared_ptr<SendProgress>& progress = nullptr) {
    if (owner) {  // zero copy straight from the caller's memory
      auto* hint = new BulkHint{nullptr, owner, progress};  // freed by ZeroMQ's callback
      return zmq::message_t(const_cast<std::byte*>(bytes.data()), bytes.size(), free_bulk, hint);
    }
    auto buf = buffers->acquire(bytes.size());
    if (!bytes.empty()) std::memcpy(buf.data(), bytes.data(), bytes.size());
    return pooled_message(std::move(buf), progress);
  }

  // ---- handshakes ---------------------------------------------------------------------------

  std::uint64_t attempts = 0;

  void start_client_handshake() {
    Session& s = sessions[""];
    s = Session{};
    s.attempt = ++attempts;
    if (!secure) {
      s.state = Session::State::kReady;
      return;
    }
    s.handshake = std::make_unique<sec::Handshake>(
        *tls, sec::Role::kClient,
        options.security.expected_peer.empty() ? std::nullopt
                                               : std::optional<NodeId>(options.security.expected_peer));
    auto first = s.handshake->step({});
    send_control("", Kind::kHello,
                 std::as_bytes(std::span(options.node_id.data(), options.node_id.size())),
                 std::span<const std::byte>(first), s.attempt);
  }

  // The client is done before the server has checked its certificate, so it waits for kAccept.
  void finish_handshake(const PeerHandle& peer, Session& s) {
    const sec::SessionKeys keys = s.handshake->keys();
    s.tx = std::make_unique<sec::FrameCipher>(keys.tx);
    s.rx = std::make_unique<sec::FrameCipher>(keys.rx);
    s.peer_id = s.handshake->peer_id();
    s.handshake.reset();
    s.window = sec::ReplayWindow{};
    if (is_router) {
      s.state = Session::State::kReady;
      ++stats.handshakes;
      send_control(peer, Kind::kAccept, {}, std::nullopt, s.attempt);
      COHORT_LOG(Debug) << url << ": secure session with " << s.peer_id;
    } else {
      s.state = Session::State::kAwaitAccept;
    }
  }

  void on_accept(const RecordHeader& h) {
    if (is_router) return;
    Session& s = sessions[""];
    if (s.state != Session::State::kAwaitAccept || h.counter != s.attempt) return;
    s.state = Session::State::kReady;
    ++stats.handshakes;
    COHORT_LOG(Debug) << url << ": secure session with " << s.peer_id;
  }

  void on_hello(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    if (!is_router) return;
    if (!secure) {
      refuse(peer, "this endpoint runs without TLS (--insecure); start both sides the same way");
      return;
    }
    if (f.size() != 3) {
      ++stats.dropped_malformed;
      return;
    }
    const std::string claimed = text_of(f[1], 128);
    if (!is_valid_node_id(claimed)) {
      refuse(peer, "hello carries an invalid node id");
      return;
    }
    Session& s = sessions[peer];
    s = Session{};
    s.attempt = h.counter;
    try {
      s.handshake = std::make_unique<sec::Handshake>(*tls, sec::Role::kServer, claimed);
      auto out = s.handshake->step(bytes_of(f[2]));
      if (!out.empty()) send_control(peer, Kind::kHandshake, out, std::nullopt, s.attempt);
      if (s.handshake->done()) finish_handshake(peer, s);
    } catch (const TransportError& e) {
      sessions.erase(peer);
      refuse(peer, std::string("TLS handshake failed: ") + e.what(), h.counter);
    }
  }

  void on_handshake(const PeerHandle& peer, const RecordHeader& h,
                    std::vector<zmq::message_t>& f) {
    auto it = sessions.find(peer);
    if (it == sessions.end() || it->second.state != Session::State::kHandshaking ||
        !it->second.handshake || f.size() != 2 || h.counter != it->second.attempt) {
      return;  // an answer to an abandoned attempt, or noise
    }
    Session& s = it->second;
    try {
      auto out = s.handshake->step(bytes_of(f[1]));
      if (!out.empty()) send_control(peer, Kind::kHandshake, out, std::nullopt, s.attempt);
      if (s.handshake->done()) finish_handshake(peer, s);
    } catch (const TransportError& e) {
      const std::string reason = std::string("TLS handshake failed: ") + e.what();
      if (is_router) {
        const std::uint64_t attempt = s.attempt;
        sessions.erase(it);
        refuse(peer, reason, attempt);
      } else {
        s.state = Session::State::kFailed;
        s.failure = reason;
        ++stats.refused_peers;
        send_control(peer, Kind::kRefuse, std::as_bytes(std::span(reason.data(), reason.size())),
                     std::nullopt, s.attempt);
      }
    }
  }

  void on_refuse(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    const std::string reason = f.size() >= 2 ? text_of(f[1]) : std::string("no reason given");
    if (is_router) {
      sessions.erase(peer);
      warn_limited("peer refused us: " + reason);
      return;
    }
    Session& s = sessions[""];
    if (h.counter != 0 && h.counter != s.attempt) return;  // about an abandoned attempt
    s.state = Session::State::kFailed;
    s.failure = "peer " + url + " refused the connection: " + reason;
  }

  // ---- data records -------------------------------------------------------------------------

  void on_data(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    if (f.size() != 2 && f.size() != 3) {
      ++stats.dropped_malformed;
      return;
    }
    if (h.kind == Kind::kPlain && secure) {
      refuse(peer, "this endpoint requires TLS; the peer sent plaintext (is it running --insecure?)");
      return;
    }
    if (h.kind == Kind::kSealed && !secure) {
      refuse(peer, "this endpoint runs without TLS (--insecure); the peer sent sealed records");
      return;
    }
    auto it = sessions.find(peer);
    if (h.kind == Kind::kPlain && it == sessions.end()) {
      it = sessions.emplace(peer, Session{}).first;
      it->second.state = Session::State::kReady;
    }
    if (it == sessions.end() || it->second.state != Session::State::kReady) {
      // A sealed record for a session we do not know: the peer must handshake again.
      if (is_router) send_control(peer, Kind::kReset, {});
      ++stats.dropped_auth;
      return;
    }
    Session& s = it->second;
    Envelope env;
    std::vector<std::byte> plain_env;
    std::span<const std::byte> env_bytes;
    if (h.kind == Kind::kSealed) {
      auto sealed = bytes_of(f[1]);
      if (sealed.size() < sec::FrameCipher::kTagBytes) {
        ++stats.dropped_auth;
        return;
      }
      plain_env.resize(sealed.size() - sec::FrameCipher::kTagBytes);
      if (!s.rx->open(h.counter, 0, bytes_of(f[0]), sealed, plain_env)) {
        ++stats.dropped_auth;
        warn_limited("dropped a record that failed authentication from " + s.peer_id);
        return;
      }
      env_bytes = plain_env;
    } else {
      env_bytes = bytes_of(f[1]);
    }
    try {
      env = decode(env_bytes);
    } catch (const ProtocolError& e) {
      reject(peer, s, h, std::string("malformed envelope: ") + e.what(), 0);
      return;
    }
    if (secure && env.sender != s.peer_id) {
      reject(peer, s, h, "sender '" + env.sender + "' does not match the certificate ('" +
                             s.peer_id + "')", env.seq);
      return;
    }
    if (!secure) s.peer_id = env.sender;
    s.last_seen = Clock::now();
    try {
      deliver(peer, s, h, env, env_bytes, f.size() == 3 ? &f[2] : nullptr);
    } catch (const ProtocolError& e) {
      reject(peer, s, h, e.what(), env.seq);
    }
  }

  void reject(const PeerHandle& peer, Session& s, const RecordHeader& h, const std::string& why,
              std::uint64_t ref_seq) {
    ++stats.dropped_malformed;
    warn_limited("dropped a message from " + (s.peer_id.empty() ? std::string("?") : s.peer_id) +
                 ": " + why);
    if (h.kind == Kind::kSealed) (void)s.window.accept(h.counter);  // authentic, so consume it
    Envelope e;
    e.body = ErrorBody{ErrorCode::kMalformed, why.substr(0, 1024), ref_seq};
    try {
      send_message(peer, std::move(e), {});
    } catch (const Error&) {
      // The peer is unreachable or blocked; the drop alone is enough.
    }
  }

  // Moves (or opens) one bulk frame into `dest`; false if it failed authentication.
  bool unpack_bulk(Session& s, const RecordHeader& h, std::span<const std::byte> aad,
                   const zmq::message_t& bulk, std::span<std::byte> dest) {
    auto in = bytes_of(bulk);
    if (h.kind == Kind::kSealed) return s.rx->open(h.counter, 1, aad, in, dest);
    std::memcpy(dest.data(), in.data(), in.size());
    return true;
  }

  std::size_t bulk_plain_size(const RecordHeader& h, const zmq::message_t& bulk) {
    if (h.kind != Kind::kSealed) return bulk.size();
    if (bulk.size() < sec::FrameCipher::kTagBytes) throw ProtocolError("bulk frame too short");
    return bulk.size() - sec::FrameCipher::kTagBytes;
  }

  void deliver(const PeerHandle& peer, Session& s, const RecordHeader& h, Envelope& env,
               std::span<const std::byte> aad, zmq::message_t* bulk) {
    const bool sealed = h.kind == Kind::kSealed;
    auto commit = [&]() -> bool {
      if (sealed && !s.window.accept(h.counter)) {
        ++stats.dropped_replay;
        warn_limited("dropped a replayed record from " + s.peer_id);
        return false;
      }
      ++stats.records_received;
      return true;
    };

    if (auto* c = std::get_if<ChunkHeader>(&env.body)) {
      auto t = s.transfers.find(c->transfer_id);
      if (t == s.transfers.end()) {
        if (sealed && !s.window.accept(h.counter)) {
          ++stats.dropped_replay;
          return;
        }
        throw ProtocolError("chunk of unknown transfer " + std::to_string(c->transfer_id));
      }
      Transfer& tr = t->second;
      const std::uint64_t total = tr.head.payload_bytes;
      const std::uint64_t chunk = tr.head.chunk_bytes;
      const std::uint64_t offset = std::uint64_t{c->index} * chunk;
      if (c->index != tr.next_index || c->count != tr.count || c->offset != offset || !bulk) {
        s.transfers.erase(t);
        throw ProtocolError("chunk out of sequence: transfer dropped");
      }
      const std::uint64_t len = std::min<std::uint64_t>(chunk, total - offset);
      if (bulk_plain_size(h, *bulk) != len) {
        s.transfers.erase(t);
        throw ProtocolError("chunk has the wrong length");
      }
      if (options.deliver_chunks) {
        const bool adopt = !sealed && adoptable(*bulk);
        auto piece = adopt ? adopt_frame(*bulk) : buffers->acquire(len);
        if (!adopt && !unpack_bulk(s, h, aad, *bulk, piece.span())) {
          ++stats.dropped_auth;
          return;
        }
        if (!commit()) return;
        ++tr.next_index;
        const bool last = tr.next_index == tr.count;
        inbox.push_back(Message{peer, s.peer_id, tr.head, offset, std::move(piece), last});
      } else {
        if (!unpack_bulk(s, h, aad, *bulk, tr.buffer.span().subspan(offset, len))) {
          ++stats.dropped_auth;
          return;
        }
        if (!commit()) return;
        ++tr.next_index;
        if (tr.next_index == tr.count) {
          inbox.push_back(Message{peer, s.peer_id, std::move(tr.head), 0, std::move(tr.buffer), true});
        }
      }
      stats.bytes_received += len;
      if (tr.next_index == tr.count) s.transfers.erase(t);
      return;
    }

    // A head message (any other body).
    const std::uint64_t total = env.payload_bytes;
    if (total == 0) {
      if (bulk) throw ProtocolError("bulk frame without a payload announced");
      if (!commit()) return;
      inbox.push_back(Message{peer, s.peer_id, std::move(env), 0, PooledBuffer{}, true});
      return;
    }
    if (total > options.max_payload_bytes) {
      throw ProtocolError("payload of " + std::to_string(total) + " bytes exceeds the limit of " +
                          std::to_string(options.max_payload_bytes));
    }
    if (env.chunk_bytes == 0 || env.chunk_bytes > (std::uint64_t{64} << 20)) {
      throw ProtocolError("chunk size " + std::to_string(env.chunk_bytes) + " is out of range");
    }
    if (!bulk) throw ProtocolError("payload announced but no bulk frame");
    const std::uint64_t chunk = env.chunk_bytes;
    const std::uint64_t count64 = (total + chunk - 1) / chunk;
    if (count64 > 0xffffffffu) throw ProtocolError("too many chunks");
    const auto count = static_cast<std::uint32_t>(count64);
    const std::uint64_t first = std::min(chunk, total);
    if (bulk_plain_size(h, *bulk) != first) throw ProtocolError("first chunk has the wrong length");
    if (count > 1 && s.transfers.size() >= options.max_open_transfers) {
      throw ProtocolError("too many unfinished transfers from this peer");
    }
    if (count > 1 && s.transfers.contains(env.seq)) throw ProtocolError("duplicate transfer id");

    if (options.deliver_chunks || count == 1) {
      const bool adopt = !sealed && adoptable(*bulk);
      auto piece = adopt ? adopt_frame(*bulk) : buffers->acquire(first);
      if (!adopt && !unpack_bulk(s, h, aad, *bulk, piece.span())) {
        ++stats.dropped_auth;
        return;
      }
      if (!commit()) return;
      stats.bytes_received += first;
      if (count > 1) s.transfers.emplace(env.seq, Transfer{env, PooledBuffer{}, 1, count, Clock::now()});
      inbox.push_back(Message{peer, s.peer_id, std::move(env), 0, std::move(piece), count == 1});
      return;
    }
    auto whole = buffers->acquire(total);
    if (!unpack_bulk(s, h, aad, *bulk, whole.span().subspan(0, first))) {
      ++stats.dropped_auth;
      return;
    }
    if (!commit()) return;
    stats.bytes_received += first;
    const std::uint64_t id = env.seq;
    s.transfers.emplace(id, Transfer{std::move(env), std::move(whole), 1, count, Clock::now()});
  }

  // ---- pipelined opens of bulk frames ------------------------------------------------------
  //
  // A well-formed bulk data record continuing the state that the records already pending will
  // leave is started here: header, envelope (opened and decoded), validation and destination are
  // settled in record order, the open of its bulk frame runs on the pool, and its commit (replay
  // window, stats, inbox) runs in record order in complete_front(). Any other record returns
  // false having changed nothing, and takes the serial path (on_data and deliver) once the
  // pending records are committed, so that drops, rejections and Error replies are always decided
  // on the true state. A pending record that fails authentication or the replay check rolls back
  // the optimistic state of itself and every record behind it; those are then processed again,
  // serially, exactly as if they had arrived one by one.
  bool defer_data(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    if (f.size() != 3) return false;
    const bool sealed = h.kind == Kind::kSealed;
    if (sealed ? !secure : (h.kind != Kind::kPlain || secure)) return false;
    auto it = sessions.find(peer);
    if (it == sessions.end() || it->second.state != Session::State::kReady) return false;
    Session& s = it->second;
    constexpr std::size_t kTag = sec::FrameCipher::kTagBytes;
    std::vector<std::byte> plain_env;
    std::span<const std::byte> env_bytes = bytes_of(f[1]);
    if (sealed) {
      if (env_bytes.size() < kTag) return false;
      plain_env.resize(env_bytes.size() - kTag);
      if (!s.rx->open(h.counter, 0, bytes_of(f[0]), env_bytes, plain_env)) return false;
      env_bytes = plain_env;
    }
    Envelope env;
    try {
      env = decode(env_bytes);
    } catch (const ProtocolError&) {
      return false;
    }
    if (secure && env.sender != s.peer_id) return false;
    if (sealed && f[2].size() < kTag) return false;
    const std::uint64_t bulk_bytes = f[2].size() - (sealed ? kTag : 0);

    auto p = std::make_unique<PendingOpen>();
    p->sender = env.sender;
    std::span<std::byte> dest;
    bool adopted = false;  // the piece is the frame itself: nothing to copy
    // A piece sealed, with no pool for the crypto: opened where it lies at commit time and
    // delivered as the frame itself, as a plaintext frame is; this saves writing every byte twice.
    const bool can_open_in_place = sealed && crypto_pool() == nullptr && adoptable(f[2]);
    bool in_place = false;
    if (auto* c = std::get_if<ChunkHeader>(&env.body)) {
      auto t = s.transfers.find(c->transfer_id);
      if (t == s.transfers.end()) return false;
      Transfer& tr = t->second;
      if (tr.next_index >= tr.count) return false;  // a pending record completes it
      const std::uint64_t chunk = tr.head.chunk_bytes;
      const std::uint64_t offset = std::uint64_t{c->index} * chunk;
      if (c->index != tr.next_index || c->count != tr.count || c->offset != offset) return false;
      const std::uint64_t len = std::min<std::uint64_t>(chunk, tr.head.payload_bytes - offset);
      if (bulk_bytes != len) return false;
      p->transfer = c->transfer_id;
      p->offset = offset;
      p->len = len;
      if (options.deliver_chunks) {
        p->kind = PendingOpen::Kind::kChunkPiece;
        in_place = can_open_in_place;
        adopted = (!sealed && adoptable(f[2])) || in_place;
        p->piece = adopted ? adopt_frame(f[2], len) : buffers->acquire(len);
        dest = p->piece.span();
      } else {
        p->kind = PendingOpen::Kind::kChunkWhole;
        dest = tr.buffer.span().subspan(offset, len);
      }
      ++tr.next_index;
      p->last = tr.next_index == tr.count;
    } else {
      const std::uint64_t total = env.payload_bytes;
      if (total == 0 || total > options.max_payload_bytes) return false;
      if (env.chunk_bytes == 0 || env.chunk_bytes > (std::uint64_t{64} << 20)) return false;
      const std::uint64_t chunk = env.chunk_bytes;
      const std::uint64_t count64 = (total + chunk - 1) / chunk;
      if (count64 > 0xffffffffu) return false;
      const auto count = static_cast<std::uint32_t>(count64);
      const std::uint64_t first = std::min(chunk, total);
      if (bulk_bytes != first) return false;
      const std::uint64_t id = env.seq;
      if (count > 1 &&
          (s.transfers.size() >= options.max_open_transfers || s.transfers.contains(id))) {
        return false;
      }
      p->transfer = id;
      p->len = first;
      p->last = count == 1;
      if (options.deliver_chunks || count == 1) {
        p->kind = PendingOpen::Kind::kHeadPiece;
        in_place = can_open_in_place;
        adopted = (!sealed && adoptable(f[2])) || in_place;
        p->piece = adopted ? adopt_frame(f[2], first) : buffers->acquire(first);
        dest = p->piece.span();
        if (count > 1) {
          s.transfers.emplace(id, Transfer{env, PooledBuffer{}, 1, count, Clock::now()});
          p->created_transfer = true;
        }
        p->env = std::move(env);
      } else {
        p->kind = PendingOpen::Kind::kHeadWhole;
        auto whole = buffers->acquire(total);
        dest = whole.span().first(first);
        s.transfers.emplace(id, Transfer{std::move(env), std::move(whole), 1, count, Clock::now()});
        p->created_transfer = true;
      }
    }
    // What on_data does before deliver(), whatever deliver() then decides.
    if (!secure) s.peer_id = p->sender;
    s.last_seen = Clock::now();

    p->peer = peer;
    p->session = &s;
    p->header = h;
    p->plain_env = std::move(plain_env);
    p->frames = std::move(f);
    p->job = std::make_shared<CryptoJob>();
    CryptoJob& job = *p->job;
    job.op = !sealed ? CryptoJob::Op::kCopy
                     : (in_place ? CryptoJob::Op::kOpenInPlace : CryptoJob::Op::kOpen);
    job.cipher = s.rx.get();
    job.counter = h.counter;
    job.aad = p->plain_env;
    if (in_place) {
      job.out = std::span(static_cast<std::byte*>(p->frames[2].data()), p->frames[2].size());
    } else if (!adopted) {
      job.in = bytes_of(p->frames[2]);
      job.out = dest;
    }
    job.streaming = p->kind == PendingOpen::Kind::kChunkWhole ||
                    p->kind == PendingOpen::Kind::kHeadWhole;
    start_job(p->job, sealed ? crypto_pool() : options.pool);
    opening.push_back(std::move(p));
    return true;
  }

  // Commits an opened record, as deliver() does after unpack_bulk(); false if it is a replay.
  bool commit_open(PendingOpen& p) {
    Session& s = *p.session;
    if (p.header.kind == Kind::kSealed && !s.window.accept(p.header.counter)) {
      ++stats.dropped_replay;
      warn_limited("dropped a replayed record from " + s.peer_id);
      return false;
    }
    ++stats.records_received;
    stats.bytes_received += p.len;
    using K = PendingOpen::Kind;
    if (p.kind == K::kHeadPiece) {
      inbox.push_back(Message{p.peer, p.sender, std::move(p.env), 0, std::move(p.piece), p.last});
    } else if (p.kind == K::kChunkPiece || p.kind == K::kChunkWhole) {
      auto t = s.transfers.find(p.transfer);  // only commits, and settled paths, erase transfers
      COHORT_CHECK(t != s.transfers.end()) << "pending chunk lost its transfer";
      if (p.kind == K::kChunkPiece) {
        inbox.push_back(Message{p.peer, p.sender, t->second.head, p.offset, std::move(p.piece), p.last});
      } else if (p.last) {
        inbox.push_back(Message{p.peer, p.sender, std::move(t->second.head), 0,
                                std::move(t->second.buffer), true});
      }
      if (p.last) s.transfers.erase(t);
    }
    return true;
  }

  // Undoes what defer_data() assumed about the session state for `p`.
  void roll_back(PendingOpen& p) {
    Session& s = *p.session;
    if (p.kind == PendingOpen::Kind::kChunkPiece || p.kind == PendingOpen::Kind::kChunkWhole) {
      auto t = s.transfers.find(p.transfer);
      if (t != s.transfers.end()) --t->second.next_index;
    } else if (p.created_transfer) {
      s.transfers.erase(p.transfer);
    }
  }

  // Waits until no worker touches any pending record (without running the unstarted ones).
  void quiesce_opening() {
    for (auto& p : opening) {
      if (!p->job->claim() && p->job->done.valid()) p->job->done.wait();
    }
  }

  // Commits the oldest pending record, opening it here if no worker has started it.
  void complete_front() {
    PendingOpen& front = *opening.front();
    const bool authentic = finish_job(*front.job);
    if (!authentic) ++stats.dropped_auth;
    if (authentic && commit_open(front)) {
      recycle_frames(std::move(front.frames));
      opening.pop_front();
      return;
    }
    // The records behind it assumed it would commit: undo them all, newest first, and process
    // them again one by one.
    quiesce_opening();
    for (auto p = opening.rbegin(); p != opening.rend(); ++p) roll_back(**p);
    opening.pop_front();
    std::deque<std::unique_ptr<PendingOpen>> retry;
    retry.swap(opening);
    for (auto& p : retry) process_record(p->peer, p->header, p->frames);
  }

  std::size_t open_window() const {
    ThreadPool* pool = secure ? crypto_pool() : options.pool;
    return pool == nullptr ? 1 : std::min(kOpenWindow, pool->size() + 1);
  }

  // The pool that seals and opens bulk frames, or none: where AES-GCM runs on vector AES units
  // (about 20 GB/s a core, faster than the socket), this thread does it inline, since waking a
  // worker per chunk cost more than it saved (16 MiB pushes on 2 cores: 3.3 GB/s through the pool,
  // 4.2 inline; pulls 3.3 and 4.7).
  ThreadPool* crypto_pool() const {
    return sec::FrameCipher::vector_aes() ? nullptr : options.pool;
  }

  // Commits every pending record, in order.
  void settle_opening() {
    while (!opening.empty()) complete_front();
  }

  // On an exception: drops the pending records, leaving the state as if they never arrived.
  void abandon_opening() noexcept {
    quiesce_opening();
    for (auto p = opening.rbegin(); p != opening.rend(); ++p) roll_back(**p);
    opening.clear();
  }

  // ---- the receive loop ---------------------------------------------------------------------

  std::vector<zmq::message_t> take_frames() {
    if (spare_frames.empty()) {
      std::vector<zmq::message_t> f;
      f.reserve(3);
      return f;
    }
    auto f = std::move(spare_frames.back());
    spare_frames.pop_back();
    return f;
  }

  void recycle_frames(std::vector<zmq::message_t>&& f) {
    f.clear();
    if (f.capacity() >= 3 && spare_frames.size() < kOpenWindow + 2) {
      spare_frames.push_back(std::move(f));
    }
  }

  // Reads one multipart message from the socket (non-blocking) and processes it, or starts to
  // (defer_data); false if none was waiting.
  bool read_record() {
    zmq::message_t head;
    if (!socket.recv(head, zmq::recv_flags::dontwait)) return false;
    PeerHandle peer;
    auto f = take_frames();
    bool more = head.more();
    if (is_router) {
      peer.assign(static_cast<const char*>(head.data()), head.size());
    } else {
      f.push_back(std::move(head));
    }
    bool too_many = false;
    while (more) {
      zmq::message_t m;
      (void)socket.recv(m, zmq::recv_flags::none);  // the rest of a multipart is already here
      more = m.more();
      if (f.size() < 3) {
        f.push_back(std::move(m));
      } else {
        too_many = true;
      }
    }
    if (f.empty() || too_many) {
      ++stats.dropped_malformed;
    } else if (auto h = parse_header(f[0]); !h) {
      ++stats.dropped_malformed;
      warn_limited("dropped a record with a bad header (not a Cohort peer?)");
    } else if (!defer_data(peer, *h, f)) {
      settle_opening();
      process_record(peer, *h, f);
    }
    recycle_frames(std::move(f));
    return true;
  }

  // The serial path: every record in order, after all pending ones are committed.
  void process_record(const PeerHandle& peer, const RecordHeader& h,
                      std::vector<zmq::message_t>& f) {
    try {
      switch (h.kind) {
        case Kind::kHello: on_hello(peer, h, f); break;
        case Kind::kHandshake: on_handshake(peer, h, f); break;
        case Kind::kRefuse: on_refuse(peer, h, f); break;
        case Kind::kAccept: on_accept(h); break;
        case Kind::kReset:
          if (!is_router && secure && is_ready()) {
            COHORT_LOG(Info) << url << ": peer lost our session; handshaking again";
            start_client_handshake();
          }
          break;
        case Kind::kPlain:
        case Kind::kSealed: on_data(peer, h, f); break;
      }
    } catch (const ProtocolError& e) {
      ++stats.dropped_malformed;
      warn_limited(std::string("dropped a malformed record: ") + e.what());
    }
  }

  void read_monitor() {
    for (;;) {
      zmq::message_t event;
      if (!monitor.recv(event, zmq::recv_flags::dontwait)) return;
      zmq::message_t address;
      if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
      if (event.size() < 6) continue;
      std::uint16_t id = 0;
      std::memcpy(&id, event.data(), sizeof id);
      if (id == ZMQ_EVENT_CONNECTED) {
        COHORT_LOG(Debug) << url << ": connected";
        start_client_handshake();
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        COHORT_LOG(Debug) << url << ": disconnected";
        Session& s = sessions[""];
        if (secure && s.state != Session::State::kFailed) s.state = Session::State::kHandshaking;
        s.transfers.clear();
      }
    }
  }

  // Shares options.receive_budget out among the ROUTER's peers. A new ZMQ_RCVHWM reaches the
  // socket's existing pipes (a lowered one lets what is queued drain first), but a connection
  // that ZeroMQ accepts later gets its pipe from the listener's copy of the options, made at
  // bind: so it is set again whenever peers were added under a reduced queue.
  void share_receive_budget() {
    if (!is_router || options.receive_budget <= 0) return;
    const std::size_t peers = std::max<std::size_t>(sessions.size(), 1);
    const auto most = static_cast<std::size_t>(std::max(1, options.receive_queue));
    const int per_peer = static_cast<int>(
        std::clamp<std::size_t>(static_cast<std::size_t>(options.receive_budget) / peers, 1, most));
    const bool reduced = static_cast<std::size_t>(per_peer) < most;
    if (per_peer == stats.receive_queue && !(reduced && peers > budget_peers)) return;
    socket.set(zmq::sockopt::rcvhwm, per_peer);
    stats.receive_queue = per_peer;
    budget_peers = peers;
  }
  std::size_t budget_peers = 0;  // peers when the queue was last set

  void sweep() {
    share_receive_budget();  // each pass: a burst of new peers is seen before its data flows
    const auto now = Clock::now();
    if (now - last_sweep < std::chrono::seconds(1)) return;
    last_sweep = now;
    for (auto it = sessions.begin(); it != sessions.end();) {
      Session& s = it->second;
      for (auto t = s.transfers.begin(); t != s.transfers.end();) {
        if (now - t->second.started > options.transfer_timeout) {
          warn_limited("dropped an unfinished transfer from " + s.peer_id);
          t = s.transfers.erase(t);
        } else {
          ++t;
        }
      }
      const bool stale_handshake = s.state == Session::State::kHandshaking &&
                                   now - s.started > options.handshake_timeout;
      const bool idle = now - s.last_seen > kSessionIdleTimeout;
      if (is_router && (stale_handshake || idle)) {
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Waits up to `timeout` for socket input and processes what arrives. Returns when the inbox
  // has something, `until()` holds, or time is up.
  template <typename Pred>
  void pump(std::chrono::milliseconds timeout, Pred until) {
    const auto deadline = Clock::now() + timeout;
    struct Abandon {  // pending records never outlive a pump, even one left by an exception
      Impl& impl;
      ~Abandon() {
        if (!impl.opening.empty()) impl.abandon_opening();
      }
    } abandon{*this};
    for (;;) {
      for (;;) {
        if (read_record()) {
          while (opening.size() > open_window()) complete_front();
        } else if (!opening.empty()) {
          complete_front();  // nothing to read: wait for (or do) the oldest open
        } else {
          break;
        }
        if (!inbox.empty() || until()) break;
      }
      settle_opening();
      if (monitor) read_monitor();
      sweep();
      if (!inbox.empty() || until()) return;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return;
      zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                  {monitor ? monitor.handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      (void)poll_sockets(items, monitor ? 2 : 1, std::min(left, std::chrono::milliseconds(250)));
    }
  }

  bool is_ready() const {
    if (is_router) return true;
    auto it = sessions.find("");
    return it != sessions.end() && it->second.state == Session::State::kReady;
  }

  void wait_ready(std::chrono::milliseconds timeout) {
    if (is_router) return;
    auto failed = [&] {
      auto it = sessions.find("");
      return it != sessions.end() && it->second.state == Session::State::kFailed;
    };
    const auto deadline = Clock::now() + timeout;
    while (!is_ready() && !failed()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        throw TimeoutError("no secure session with " + url + " after " +
                           std::to_string(timeout.count()) + " ms (is the peer running?)");
      }
      pump(left, [&] { return is_ready() || failed(); });
    }
    if (failed()) {
      const std::string why = sessions[""].failure;
      throw TransportError(why);
    }
  }

  void configure_socket() {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndtimeo, static_cast<int>(options.send_timeout.count()));
    socket.set(zmq::sockopt::sndhwm, 4096);
    stats.receive_queue = std::max(1, options.receive_queue);
    socket.set(zmq::sockopt::rcvhwm, stats.receive_queue);
    // Refuse absurd frames inside ZeroMQ, before any allocation of ours.
    const std::int64_t max_frame =
        static_cast<std::int64_t>(std::max<std::size_t>(options.chunk_bytes, 64 << 20)) + 65536;
    socket.set(zmq::sockopt::maxmsgsize, max_frame);
    if (options.heartbeat_ms > 0) {
      socket.set(zmq::sockopt::heartbeat_ivl, options.heartbeat_ms);
      socket.set(zmq::sockopt::heartbeat_timeout, options.heartbeat_ms * 5);
      socket.set(zmq::sockopt::heartbeat_ttl, options.heartbeat_ms * 5);
      // ZMTP heartbeats alone did not notice a silent link: behind a link cut for 10 s, a client
      // noticed only when TCP's retransmission backoff next fired after the link was back (13 s
      // after the cut; 25 s had the cut lasted a little longer). TCP_USER_TIMEOUT aborts a
      // connection whose sent bytes stay unacknowledged for 5 heartbeats, so the DEALER starts
      // reconnecting while the link is still down (the heartbeats keep bytes in flight).
      socket.set(zmq::sockopt::tcp_maxrt, options.heartbeat_ms * 5);
    }
  }
};

namespace {

std::unique_ptr<Endpoint::Impl> make_impl(const std::string& url, EndpointOptions options,
                                          bool router) {
  validate_node_id(options.node_id);
  if (options.chunk_bytes < 4096 || options.chunk_bytes > (std::size_t{64} << 20)) {
    throw ConfigError("transport chunk size must be between 4 KiB and 64 MiB, got " +
                      std::to_string(options.chunk_bytes));
  }
  auto impl = std::make_unique<Endpoint::Impl>();
  impl->is_router = router;
  impl->url = url;
  impl->secure = !options.security.insecure && !is_inproc(url);
  impl->buffers = options.buffers ? options.buffers : BufferPool::create();
  if (impl->secure) {
    if (options.security.ca_file.empty() || options.security.cert_file.empty() ||
        options.security.key_file.empty()) {
      throw ConfigError("TLS is on by default: set tls.ca_file, tls.cert_file and tls.key_file "
                        "(make them with cohort-keygen), or pass --insecure for plaintext");
    }
    impl->tls = std::make_unique<security::TlsContext>(security::TlsFiles{
        options.security.ca_file, options.security.cert_file, options.security.key_file});
    if (impl->tls->local_id() != options.node_id) {
      throw ConfigError("node id '" + options.node_id + "' does not match the certificate " +
                        options.security.cert_file + " (CN '" + impl->tls->local_id() + "')");
    }
  }
  if (options.multiplex && (impl->secure || !is_inproc(url))) {
    throw ConfigError("multiplexed endpoints are for plaintext inproc:// urls only, not " + url);
  }
  if (!impl->secure && !is_inproc(url)) {
    COHORT_LOG(Warn) << "plaintext transport on " << url
                     << ": anyone on the network can read and forge messages (--insecure)";
  }
  impl->options = std::move(options);
  return impl;
}

std::string zmq_failure(const char* what, const std::string& url, const zmq::error_t& e) {
  return std::string(what) + " " + url + " failed: " + e.what();
}

}  // namespace

zmq::context_t& Context::zmq_context() { return impl_->ctx; }

Endpoint Endpoint::bind(Context& ctx, const std::string& url, EndpointOptions options) {
  auto impl = make_impl(url, std::move(options), /*router=*/true);
  try {
    impl->socket = zmq::socket_t(ctx.zmq_context(), zmq::socket_type::router);
    impl->configure_socket();
    impl->socket.set(zmq::sockopt::router_mandatory, 1);
    impl->socket.bind(url);
    impl->url = impl->socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    throw TransportError(zmq_failure("bind to", url, e));
  }
  return Endpoint(std::move(impl));
}

Endpoint Endpoint::connect(Context& ctx, const std::string& url, EndpointOptions options) {
  auto impl = make_impl(url, std::move(options), /*router=*/false);
  static std::atomic<std::uint64_t> monitor_ids{0};
  try {
    impl->socket = zmq::socket_t(ctx.zmq_context(), zmq::socket_type::dealer);
    impl->configure_socket();
    impl->socket.set(zmq::sockopt::reconnect_ivl, 100);
    impl->socket.set(zmq::sockopt::reconnect_ivl_max, 2000);
    if (impl->options.heartbeat_ms > 0) {
      // A connect attempt made while the link is down would wait out SYN retransmissions that
      // back off to minutes; abandoned after 2 heartbeats, it is retried every reconnect_ivl_max
      // at most, so a returning link is found within about 3 s.
      impl->socket.set(zmq::sockopt::connect_timeout, impl->options.heartbeat_ms * 2);
    }
    if (impl->secure) {
      // Connect events start each handshake, so a restarted peer is met with a new one.
      const std::string mon = "inproc://cohort-monitor-" + std::to_string(++monitor_ids);
      if (zmq_socket_monitor(impl->socket.handle(), mon.c_str(),
                             ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        throw zmq::error_t();
      }
      impl->monitor = zmq::socket_t(ctx.zmq_context(), zmq::socket_type::pair);
      impl->monitor.set(zmq::sockopt::linger, 0);
      impl->monitor.connect(mon);
      impl->sessions[""].state = Session::State::kHandshaking;
    } else {
      impl->sessions[""].state = Session::State::kReady;
    }
    impl->socket.connect(url);
  } catch (const zmq::error_t& e) {
    throw TransportError(zmq_failure("connect to", url, e));
  }
  return Endpoint(std::move(impl));
}

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::Endpoint(Endpoint&&) noexcept = default;
Endpoint& Endpoint::operator=(Endpoint&&) noexcept = default;
Endpoint::~Endpoint() {
  if (impl_ && impl_->monitor) {
    zmq_socket_monitor(impl_->socket.handle(), nullptr, 0);
  }
}

const std::string& Endpoint::url() const { return impl_->url; }
bool Endpoint::is_secure() const { return impl_->secure; }
const NodeId& Endpoint::node_id() const { return impl_->options.node_id; }

namespace {
// A multiplexing ROUTER's handle: "sender\0routing id" (node ids hold no NUL byte).
PeerHandle join_handle(const PeerHandle& routing, const NodeId& sender) {
  return sender + '\0' + routing;
}
std::pair<PeerHandle, NodeId> split_handle(const PeerHandle& handle) {
  const auto nul = handle.find('\0');
  if (nul == std::string::npos) return {handle, NodeId{}};
  return {handle.substr(nul + 1), handle.substr(0, nul)};
}
}  // namespace

std::optional<std::uint64_t> Endpoint::send(const PeerHandle& peer, Envelope envelope,
                                            Payload payload) {
  if (impl_->is_router && impl_->options.multiplex) {
    auto [routing, recipient] = split_handle(peer);
    envelope.recipient = std::move(recipient);
    return impl_->send_message(routing, std::move(envelope), std::move(payload));
  }
  return impl_->send_message(peer, std::move(envelope), std::move(payload));
}

std::optional<Message> Endpoint::receive(std::chrono::milliseconds timeout) {
  if (impl_->inbox.empty()) impl_->pump(timeout, [] { return false; });
  if (impl_->inbox.empty()) return std::nullopt;
  Message m = std::move(impl_->inbox.front());
  impl_->inbox.pop_front();
  if (impl_->is_router && impl_->options.multiplex) m.peer = join_handle(m.peer, m.sender);
  return m;
}

int Endpoint::poll(std::span<Endpoint* const> endpoints, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<zmq::pollitem_t> items;
  for (;;) {
    // Drain what the sockets already hold into the inboxes (handshakes happen here too).
    for (std::size_t i = 0; i < endpoints.size(); ++i) {
      Impl& e = *endpoints[i]->impl_;
      if (e.inbox.empty()) e.pump(std::chrono::milliseconds(0), [] { return false; });
      if (!e.inbox.empty()) return static_cast<int>(i);
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return -1;
    items.clear();
    for (Endpoint* ep : endpoints) {
      items.push_back({ep->impl_->socket.handle(), 0, ZMQ_POLLIN, 0});
      if (ep->impl_->monitor) items.push_back({ep->impl_->monitor.handle(), 0, ZMQ_POLLIN, 0});
    }
    // A signal (SIGTERM asking a shard to checkpoint and stop) interrupts the wait: report
    // "nothing ready" so that the caller sees its stop flag now, not at its next timeout.
    if (!poll_sockets(items.data(), items.size(), std::min(left, std::chrono::milliseconds(250)))) {
      return -1;
    }
  }
}

void Endpoint::wait_ready(std::chrono::milliseconds timeout) { impl_->wait_ready(timeout); }
bool Endpoint::is_ready() const { return impl_->is_ready(); }

std::optional<NodeId> Endpoint::peer_id(const PeerHandle& peer) const {
  const bool mux = impl_->is_router && impl_->options.multiplex;
  auto it = impl_->sessions.find(mux ? split_handle(peer).first : peer);
  if (it == impl_->sessions.end() || it->second.state != Session::State::kReady) return std::nullopt;
  if (mux) return split_handle(peer).second;
  return it->second.peer_id;
}

EndpointStats Endpoint::stats() const { return impl_->stats; }
const std::shared_ptr<BufferPool>& Endpoint::buffers() const { return impl_->buffers; }

void Endpoint::send_raw_for_testing(const PeerHandle& peer, const Frames& frames) {
  impl_->raw_send(peer, frames);
}

void Endpoint::set_outgoing_hook_for_testing(std::function<std::vector<Frames>(Frames)> hook) {
  impl_->hook = std::move(hook);
}

}  // namespace cohort::transport
