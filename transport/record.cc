#include "record.h"

#include <algorithm>
#include <cerrno>

namespace cohort::transport::detail {

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

std::string text_of(const zmq::message_t& m, std::size_t limit) {
  std::string s(static_cast<const char*>(m.data()), std::min(m.size(), limit));
  for (char& c : s) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return s;
}

bool adoptable(const zmq::message_t& m) {
  return m.size() >= kAdoptMinBytes && reinterpret_cast<std::uintptr_t>(m.data()) % 8 == 0;
}

PooledBuffer adopt_frame(zmq::message_t& m, std::size_t size) {
  auto* owner = new zmq::message_t();
  owner->copy(m);
  auto* data = static_cast<std::byte*>(owner->data());
  return PooledBuffer::wrap(
      data, size, [](void* o) noexcept { delete static_cast<zmq::message_t*>(o); }, owner);
}

bool poll_sockets(zmq::pollitem_t* items, std::size_t count, std::chrono::milliseconds timeout) {
  try {
    zmq::poll(items, count, timeout);
    return true;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
}

}  // namespace cohort::transport::detail
