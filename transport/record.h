// Record framing (private to transport/): the 16-byte record header that opens every ZeroMQ
// multipart message an Endpoint sends, and the helpers that move bytes between ZeroMQ frames and
// our buffers. The record layout is described in cohort/transport/endpoint.h.
#pragma once

#include <zmq.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cohort/core/buffer.h"

namespace cohort::transport::detail {

constexpr std::size_t kRecordHeaderBytes = 16;
constexpr std::uint8_t kRecordVersion = 1;

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

std::array<std::byte, kRecordHeaderBytes> make_header(Kind kind, std::uint64_t counter);

// The header in frame 0, or nullopt when it is not one of ours (wrong size, magic or kind).
std::optional<RecordHeader> parse_header(const zmq::message_t& m);

inline std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

// Peer-supplied text for logs and errors: bounded, printable ASCII only.
std::string text_of(const zmq::message_t& m, std::size_t limit = 512);

inline zmq::message_t message_from(std::span<const std::byte> bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

inline zmq::message_t message_from(std::string_view s) {
  return zmq::message_t(s.data(), s.size());
}

inline bool is_inproc(const std::string& url) { return url.rfind("inproc://", 0) == 0; }

// Plaintext bulk frames at least this large are delivered in place (see adopt_frame), smaller ones
// copied: a small frame may sit inside ZeroMQ's shared 8 KiB receive buffer, and keeping it
// would pin that buffer for a copy that costs next to nothing.
constexpr std::size_t kAdoptMinBytes = 64 << 10;

// True when the frame is large enough, and aligned, to be delivered in place (adopt_frame).
bool adoptable(const zmq::message_t& m);

// Delivers a received plaintext bulk frame without copying it: the PooledBuffer shares the frame's
// memory (zmq_msg_copy counts a reference; it copies nothing) and drops that reference when it is
// dropped. The frame's memory is what ZeroMQ's I/O thread read the socket into, so this saves the
// one copy of every received byte that the receiving thread used to make.
// `size` bytes of it: all, or the plaintext of a sealed frame opened in place.
PooledBuffer adopt_frame(zmq::message_t& m, std::size_t size);
inline PooledBuffer adopt_frame(zmq::message_t& m) { return adopt_frame(m, m.size()); }

// zmq::poll that treats an interrupting signal as an early timeout instead of an error.
// Returns false when a signal interrupted the wait.
bool poll_sockets(zmq::pollitem_t* items, std::size_t count, std::chrono::milliseconds timeout);

}  // namespace cohort::transport::detail
