// The data of one secure-aggregation stage (SecAgg bodies, messages.h): what travels in the bulk
// payload beside the envelope, as a SecAggData Cap'n Proto message (schema/cohort.capnp). Plain
// types: the server and the client turn them into aggregation/secure_aggregation.h's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/ids.h"

namespace cohort::transport {

using SecAggKey = std::array<std::uint8_t, 32>;

struct SecAggMember {
  std::uint32_t id = 0;  // the protocol's client id (the coordinator's client index)
  NodeId node;
  SecAggKey channel_key{};
  SecAggKey mask_key{};
  double weight = 0;  // keys: what the member scales its update by
  bool operator==(const SecAggMember&) const = default;
};
struct SecAggSealed {
  std::uint32_t from = 0;
  std::uint32_t to = 0;
  std::vector<std::uint8_t> ciphertext;
  bool operator==(const SecAggSealed&) const = default;
};
struct SecAggShare {
  std::uint32_t owner = 0;
  std::uint64_t x = 0;
  std::vector<std::uint64_t> y;
  bool operator==(const SecAggShare&) const = default;
};
struct SecAggSeed {
  std::uint32_t survivor = 0;
  std::uint32_t dropped = 0;  // == survivor: the survivor's self mask
  std::int8_t sign = 1;
  SecAggKey seed{};
  bool operator==(const SecAggSeed&) const = default;
};
// Each stage fills what schema/cohort.capnp's SecAggData says it does; the rest stays empty.
struct SecAggData {
  std::vector<SecAggMember> members;
  std::uint32_t threshold = 0;
  std::uint32_t degree = 0;
  SecAggKey graph_seed{};
  std::vector<SecAggSealed> sealed;
  std::vector<std::uint32_t> survivors;
  std::vector<SecAggShare> self_mask;
  std::vector<SecAggShare> mask_key;
  std::vector<SecAggSeed> seeds;
  std::uint64_t vector_size = 0;
  double clip = 0;
  std::uint32_t levels = 0;
  double total_weight = 0;
  bool operator==(const SecAggData&) const = default;
};

// The largest SecAggData accepted (a cohort of a few thousand clients' keys or shares fits).
inline constexpr std::size_t kMaxSecAggBytes = 64u << 20;
// The most entries of any one list.
inline constexpr std::size_t kMaxSecAggEntries = 1u << 20;

std::vector<std::byte> encode_secagg(const SecAggData& data);
// ProtocolError for a malformed message: bad sizes (keys and seeds of 32 bytes, at most
// kMaxSecAggEntries per list, a share's limbs at most 64), or more than kMaxSecAggBytes.
SecAggData decode_secagg(std::span<const std::byte> bytes);

}  // namespace cohort::transport
