// The intake every mode's pushes share: the checks on a push's first chunk (kind, encoding, the
// shard's exact range, a payload length that fits), and the decoding of each chunk into float
// values at their offsets (raw fp32, or the framed pieces of a compressed encoding). What a mode
// does with the values (stream into a rule, fold into a buffer, apply a gradient) stays in the
// mode. Internal to the server library.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/aggregation/push_codec.h"
#include "cohort/client/push_encoding.h"
#include "cohort/transport/endpoint.h"

namespace cohort::server {

// The built-in wire format a push encoding carries (kDenseF32: raw fp32, no header): the client
// protocol's one table (cohort/client/push_encoding.h), which the clients encode with.
using client::wire_format;

// What a mode takes, and how its refusals are worded (clients and tests match some of them).
struct PushRules {
  transport::PushKind kind = transport::PushKind::kDelta;
  std::string_view wrong_kind;  // the refusal of another kind of push
  bool dense_only = false;      // fp32 only (data-parallel gradients)
  std::string_view wrong_length = "wrong update length";
  bool name_compressed_size = false;  // a compressed payload out of bounds names its size
};

// The range this shard owns: [begin, end) of the flat parameter vector, shard `index`.
struct ShardRange {
  std::uint32_t index = 0;
  std::uint64_t begin = 0, end = 0;
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(end - begin); }
};

// Why the first chunk of push `p` (its whole payload `payload_bytes` long) cannot be taken by a
// shard owning `range` under `rules`, or empty if it can. The checks a mode adds (round,
// staleness, clock, duplicates) come after these.
std::string check_push_shape(const transport::Push& p, std::uint64_t payload_bytes,
                             const ShardRange& range, const PushRules& rules);

// Receives decoded values at their element offset within the range; false refuses the push
// (the sink sets the reason).
using ValueSink = aggregation::PushDecoder::Sink;

// Decodes chunk `m` of a push, less its first `skip` bytes (place_chunk()), into `sink`: through
// `decoder` for a compressed push (finishing it on the last chunk), else as raw fp32 at m.offset
// + skip. False refuses the push, with the reason in `why` (or set by the sink): a misaligned raw
// chunk, a malformed compressed one.
bool decode_chunk(const transport::Message& m, std::size_t skip, aggregation::PushDecoder* decoder,
                  std::vector<float>& scratch, const ValueSink& sink, std::string& why);

// Where chunk `m` falls in a push whose payload bytes [0, received) a mode has taken. A transfer's
// chunks arrive in order; a client resends a push it heard no answer for as a new transfer from
// byte 0, and when the first transfer broke off (its link dropped, and the chunks still queued
// with it were lost) the resend continues it: its bytes below `received` were taken from the
// first and are skipped (kTaken: all of the chunk; kNext: its first `skip` bytes). Two live
// transfers of one push (the first still queued on the old connection) feed it the same way,
// whichever is ahead. kGap: a chunk that starts past `received`, which an in-order transfer of
// the same bytes never sends.
struct ChunkPlace {
  enum Kind { kNext, kTaken, kGap } kind = kNext;
  std::size_t skip = 0;  // kNext: bytes at the chunk's start that were taken
};
ChunkPlace place_chunk(std::uint64_t received, const transport::Message& m);

// True when `n` values at `offset` lie inside a range of `size` elements; else sets `why`.
bool chunk_fits(std::size_t offset, std::size_t n, std::size_t size, std::string& why);

}  // namespace cohort::server
