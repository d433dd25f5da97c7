// The one mapping between a Push's encoding on the wire (transport::Encoding) and the built-in
// compressed wire format it carries (aggregation::WireFormat): clients pick the encoding of what
// their compressor produced, shards the decoder for what arrives. One table, both directions.
#pragma once

#include <optional>

#include "cohort/aggregation/compressor.h"
#include "cohort/transport/messages.h"

namespace cohort::client {

// The wire format a push encoding carries (kDenseF32: raw fp32, no header); nullopt for a value
// no table row names (a newer peer's encoding).
std::optional<aggregation::WireFormat> wire_format(transport::Encoding e);

// The push encoding that carries wire format `f`. Throws InternalError for a format with no row.
transport::Encoding push_encoding(aggregation::WireFormat f);

}  // namespace cohort::client
