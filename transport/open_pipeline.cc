// The pipelined receive path of an Endpoint: bulk frames opened (or copied) on the pool while
// later records are read, committed in record order, rolled back when one fails.

#include "endpoint_impl.h"

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::transport {

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
bool Endpoint::Impl::defer_data(const PeerHandle& peer, const RecordHeader& h,
                                std::vector<zmq::message_t>& f) {
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

  auto p = std::make_unique<PendingOpen>();
  p->sender = env.sender;
  detail::OpenPlan plan;
  plan.bulk = &f[2];
  plan.bulk_bytes = f[2].size() - (sealed ? kTag : 0);
  plan.sealed = sealed;
  // A piece sealed, with no pool for the crypto: opened where it lies at commit time and
  // delivered as the frame itself, as a plaintext frame is; this saves writing every byte twice.
  plan.can_open_in_place = sealed && crypto_pool() == nullptr && adoptable(f[2]);
  if (auto* c = std::get_if<ChunkHeader>(&env.body)) {
    if (!plan_chunk_open(s, *c, *p, plan)) return false;
  } else if (!plan_head_open(s, env, *p, plan)) {
    return false;
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
                   : (plan.in_place ? CryptoJob::Op::kOpenInPlace : CryptoJob::Op::kOpen);
  job.cipher = s.rx.get();
  job.counter = h.counter;
  job.aad = p->plain_env;
  if (plan.in_place) {
    job.out = std::span(static_cast<std::byte*>(p->frames[2].data()), p->frames[2].size());
  } else if (!plan.adopted) {
    job.in = bytes_of(p->frames[2]);
    job.out = plan.dest;
  }
  job.streaming =
      p->kind == PendingOpen::Kind::kChunkWhole || p->kind == PendingOpen::Kind::kHeadWhole;
  start_job(p->job, sealed ? crypto_pool() : options.pool);
  opening.push_back(std::move(p));
  return true;
}

bool Endpoint::Impl::plan_chunk_open(Session& s, const ChunkHeader& c, PendingOpen& p,
                                     detail::OpenPlan& plan) {
  auto t = s.transfers.find(c.transfer_id);
  if (t == s.transfers.end()) return false;
  Transfer& tr = t->second;
  if (tr.next_index >= tr.count) return false;  // a pending record completes it
  const std::uint64_t chunk = tr.head.chunk_bytes;
  const std::uint64_t offset = std::uint64_t{c.index} * chunk;
  if (c.index != tr.next_index || c.count != tr.count || c.offset != offset) return false;
  const std::uint64_t len = std::min<std::uint64_t>(chunk, tr.head.payload_bytes - offset);
  if (plan.bulk_bytes != len) return false;
  p.transfer = c.transfer_id;
  p.offset = offset;
  p.len = len;
  if (options.deliver_chunks) {
    p.kind = PendingOpen::Kind::kChunkPiece;
    plan.in_place = plan.can_open_in_place;
    plan.adopted = (!plan.sealed && adoptable(*plan.bulk)) || plan.in_place;
    p.piece = plan.adopted ? adopt_frame(*plan.bulk, len) : buffers->acquire(len);
    plan.dest = p.piece.span();
  } else {
    p.kind = PendingOpen::Kind::kChunkWhole;
    plan.dest = tr.buffer.span().subspan(offset, len);
  }
  ++tr.next_index;
  tr.last_active = Clock::now();
  p.last = tr.next_index == tr.count;
  return true;
}

bool Endpoint::Impl::plan_head_open(Session& s, Envelope& env, PendingOpen& p,
                                    detail::OpenPlan& plan) {
  const std::uint64_t total = env.payload_bytes;
  if (total == 0 || total > options.max_payload_bytes) return false;
  if (env.chunk_bytes == 0 || env.chunk_bytes > (std::uint64_t{64} << 20)) return false;
  const std::uint64_t chunk = env.chunk_bytes;
  const std::uint64_t count64 = (total + chunk - 1) / chunk;
  if (count64 > 0xffffffffu) return false;
  const auto count = static_cast<std::uint32_t>(count64);
  const std::uint64_t first = std::min(chunk, total);
  if (plan.bulk_bytes != first) return false;
  const std::uint64_t id = env.seq;
  if (count > 1 && (s.transfers.size() >= options.max_open_transfers || s.transfers.contains(id))) {
    return false;
  }
  p.transfer = id;
  p.len = first;
  p.last = count == 1;
  if (options.deliver_chunks || count == 1) {
    p.kind = PendingOpen::Kind::kHeadPiece;
    plan.in_place = plan.can_open_in_place;
    plan.adopted = (!plan.sealed && adoptable(*plan.bulk)) || plan.in_place;
    p.piece = plan.adopted ? adopt_frame(*plan.bulk, first) : buffers->acquire(first);
    plan.dest = p.piece.span();
    if (count > 1) {
      s.transfers.emplace(id, Transfer{env, PooledBuffer{}, 1, count, Clock::now()});
      p.created_transfer = true;
    }
    p.env = std::move(env);
  } else {
    p.kind = PendingOpen::Kind::kHeadWhole;
    auto whole = buffers->acquire(total);
    plan.dest = whole.span().first(first);
    s.transfers.emplace(id, Transfer{std::move(env), std::move(whole), 1, count, Clock::now()});
    p.created_transfer = true;
  }
  return true;
}

// Commits an opened record, as deliver() does after unpack_bulk(); false if it is a replay.
bool Endpoint::Impl::commit_open(PendingOpen& p) {
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
      inbox.push_back(
          Message{p.peer, p.sender, t->second.head, p.offset, std::move(p.piece), p.last});
    } else if (p.last) {
      inbox.push_back(Message{p.peer, p.sender, std::move(t->second.head), 0,
                              std::move(t->second.buffer), true});
    }
    if (p.last) s.transfers.erase(t);
  }
  return true;
}

// Undoes what defer_data() assumed about the session state for `p`.
void Endpoint::Impl::roll_back(PendingOpen& p) {
  Session& s = *p.session;
  if (p.kind == PendingOpen::Kind::kChunkPiece || p.kind == PendingOpen::Kind::kChunkWhole) {
    auto t = s.transfers.find(p.transfer);
    if (t != s.transfers.end()) --t->second.next_index;
  } else if (p.created_transfer) {
    s.transfers.erase(p.transfer);
  }
}

// Waits until no worker touches any pending record (without running the unstarted ones).
void Endpoint::Impl::quiesce_opening() {
  for (auto& p : opening) {
    if (!p->job->claim() && p->job->done.valid()) p->job->done.wait();
  }
}

// Commits the oldest pending record, opening it here if no worker has started it.
void Endpoint::Impl::complete_front() {
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

// Inline, a TLS ROUTER still reads one record ahead of the one it opens: that frees the slot of
// its ZMQ_RCVHWM of one, so ZeroMQ reads the socket while this thread decrypts (as a queue of two
// did, for one chunk more in all rather than one more per peer; docs/PERFORMANCE.md 3.4).
std::size_t Endpoint::Impl::open_window() const {
  ThreadPool* pool = secure ? crypto_pool() : options.pool;
  if (pool == nullptr) return secure && is_router ? 2 : 1;
  return std::min(kOpenWindow, pool->size() + 1);
}

// The pool that seals and opens bulk frames, or none: where AES-GCM runs on vector AES units
// (faster than the socket), this thread does it inline, since waking a worker per chunk cost
// more than it saved (docs/PERFORMANCE.md 3.2).
ThreadPool* Endpoint::Impl::crypto_pool() const {
  return sec::FrameCipher::vector_aes(aead) ? nullptr : options.pool;
}

// Commits every pending record, in order.
void Endpoint::Impl::settle_opening() {
  while (!opening.empty()) complete_front();
}

// On an exception: drops the pending records, leaving the state as if they never arrived.
void Endpoint::Impl::abandon_opening() noexcept {
  quiesce_opening();
  for (auto p = opening.rbegin(); p != opening.rend(); ++p) roll_back(**p);
  opening.clear();
}
}  // namespace cohort::transport
