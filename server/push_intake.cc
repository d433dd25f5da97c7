#include "push_intake.h"

#include "cohort/core/error.h"

namespace cohort::server {

std::string check_push_shape(const transport::Push& p, std::uint64_t payload_bytes,
                             const ShardRange& range, const PushRules& rules) {
  const bool compressed = p.encoding != transport::Encoding::kDenseF32;
  const std::size_t size = range.size();
  if (p.kind != rules.kind) return std::string(rules.wrong_kind);
  if (rules.dense_only ? compressed : !wire_format(p.encoding)) return "unsupported encoding";
  if (p.shard != range.index || p.begin != range.begin || p.end != range.end)
    return "wrong shard range";
  if (!compressed) {
    if (payload_bytes != size * sizeof(float)) return std::string(rules.wrong_length);
    return {};
  }
  if (p.elements != size) return std::string(rules.wrong_length);
  if (payload_bytes == 0 || payload_bytes > aggregation::max_push_bytes(size)) {
    if (!rules.name_compressed_size) return std::string(rules.wrong_length);
    return "compressed update of " + std::to_string(payload_bytes) + " bytes for " +
           std::to_string(size) + " elements";
  }
  return {};
}

bool decode_chunk(const transport::Message& m, std::size_t skip, aggregation::PushDecoder* decoder,
                  std::vector<float>& scratch, const ValueSink& sink, std::string& why) {
  const auto bytes = m.payload.span().subspan(skip);
  const std::uint64_t offset = m.offset + skip;
  try {
    if (decoder != nullptr) {
      const bool ok = decoder->feed(bytes, scratch, sink);
      if (ok && m.complete) decoder->finish();
      return ok;
    }
    if (offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0) {
      why = "misaligned chunk";
      return false;
    }
    return sink(static_cast<std::size_t>(offset / sizeof(float)),
                {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)});
  } catch (const ProtocolError& e) {
    why = std::string("malformed compressed update: ") + e.what();
    return false;
  }
}

ChunkPlace place_chunk(std::uint64_t received, const transport::Message& m) {
  const std::uint64_t end = m.offset + m.payload.size();
  if (m.offset > received) return {ChunkPlace::kGap};
  if (m.offset < received && end <= received) return {ChunkPlace::kTaken};
  return {ChunkPlace::kNext, static_cast<std::size_t>(received - m.offset)};
}

bool chunk_fits(std::size_t offset, std::size_t n, std::size_t size, std::string& why) {
  if (offset > size || n > size - offset) {
    why = "chunk past the end of the range";
    return false;
  }
  return true;
}

}  // namespace cohort::server
