// Fuzzes the envelope decoder (transport/messages.cc): arbitrary bytes as a peer's frame 1.
// decode() must either throw ProtocolError or return an envelope that encodes and decodes back to
// itself (NaN floats aside); anything else (a crash, a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "cohort/core/error.h"
#include "cohort/transport/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace cohort::transport;
  Envelope env;
  try {
    env = decode(std::as_bytes(std::span(data, size)));
  } catch (const cohort::ProtocolError&) {
    return 0;
  }
  const auto again = encode(env);
  // Pointers may share data on the wire, so a re-encoding can be larger than its input; what
  // decode() read is bounded by its traversal limit all the same.
  if (again.size() > kMaxEnvelopeBytes) return 0;
  Envelope round_trip;
  try {
    round_trip = decode(again);
  } catch (const cohort::ProtocolError&) {
    std::abort();  // what decode() accepted, encode() must write decodably
  }
  // Float fields may carry NaN (a diverged client reports a NaN loss), which never compares
  // equal; such an envelope must still re-encode to the same bytes.
  if (!(round_trip == env) && encode(round_trip) != again) std::abort();
  return 0;
}
