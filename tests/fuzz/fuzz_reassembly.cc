// Fuzzes a ROUTER endpoint's receive path (transport/reassembly.cc and endpoint.cc): record headers, envelope
// checks, the pipelined opens and the reassembly of chunked payloads, with or without
// deliver_chunks. The input drives a generator of records that a hostile peer sends over
// inproc:// (plaintext, as there): head envelopes announcing payloads, ChunkHeader continuations
// that are in or out of sequence, of right or wrong length, and raw records of any shape.
// After the records a sentinel message follows; the receiver must deliver it, and every message
// it delivers before must be consistent with what its head announced.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/transport/endpoint.h"

namespace {

using namespace cohort::transport;
using Bytes = std::vector<std::byte>;

constexpr std::uint64_t kMaxPayload = 1 << 20;
constexpr std::size_t kMaxBulkTotal = 512 << 10;  // bytes of bulk frames one input may send
constexpr const char* kSentinel = "end-of-fuzz-input";

Bytes header(std::uint8_t kind, std::uint64_t counter) {
  Bytes h(16);
  h[0] = std::byte{'C'};
  h[1] = std::byte{'H'};
  h[2] = std::byte{1};
  h[3] = std::byte{kind};
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<std::byte>((counter >> (8 * i)) & 0xff);
  return h;
}

Bytes bytes_from(FuzzedDataProvider& in, std::size_t max) {
  const auto v = in.ConsumeBytes<std::uint8_t>(in.ConsumeIntegralInRange<std::size_t>(0, max));
  Bytes out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::byte{v[i]};
  return out;
}

Body some_body(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: {
      Push p;
      p.begin = in.ConsumeIntegralInRange<std::uint64_t>(0, 1000);
      p.end = p.begin + in.ConsumeIntegralInRange<std::uint64_t>(0, 100000);
      p.elements = p.end - p.begin;
      return p;
    }
    case 1: return PullReply{0, 0, in.ConsumeIntegralInRange<std::uint64_t>(0, 100000), 1};
    case 2: return GossipExchange{1, 2, 0.5, Encoding::kDenseF32, 10};
    default: return Heartbeat{7, 0.25f};
  }
}

struct Generator {
  FuzzedDataProvider& in;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> announced;  // seq -> total, chunk
  std::size_t bulk_left = kMaxBulkTotal;
  std::uint64_t counter = 1;

  std::uint64_t length(std::uint64_t right) {
    std::uint64_t n = right;
    switch (in.ConsumeIntegralInRange(0, 7)) {
      case 0: n = in.ConsumeIntegralInRange<std::uint64_t>(0, 70000); break;
      case 1: n = right + 1; break;
      case 2: n = right > 0 ? right - 1 : 0; break;
      default: break;
    }
    return std::min<std::uint64_t>(n, bulk_left);
  }

  Bytes bulk(std::uint64_t n) {
    bulk_left -= n;
    Bytes b(n);
    if (n > 0) b[0] = std::byte{static_cast<unsigned char>(n)};
    return b;
  }

  Endpoint::Frames head() {
    Envelope e;
    e.sender = in.ConsumeBool() ? "client-1" : "client-2";
    e.seq = in.ConsumeIntegralInRange<std::uint64_t>(0, 7);
    e.round = in.ConsumeIntegralInRange<std::uint64_t>(0, 3);
    e.body = some_body(in);
    switch (in.ConsumeIntegralInRange(0, 5)) {
      case 0: e.payload_bytes = 0; break;
      case 1: e.payload_bytes = in.ConsumeIntegral<std::uint64_t>(); break;
      default: e.payload_bytes = in.ConsumeIntegralInRange<std::uint64_t>(1, 300000); break;
    }
    switch (in.ConsumeIntegralInRange(0, 5)) {
      case 0: e.chunk_bytes = in.ConsumeIntegral<std::uint32_t>(); break;
      case 1: e.chunk_bytes = in.ConsumeIntegralInRange<std::uint32_t>(0, 64); break;
      case 2: e.chunk_bytes = 4096; break;
      default: e.chunk_bytes = in.ConsumeIntegralInRange<std::uint32_t>(4096, 70000); break;
    }
    announced[e.seq] = {e.payload_bytes, e.chunk_bytes};
    Endpoint::Frames f{header(3, counter++), encode(e)};
    if (e.payload_bytes > 0 || in.ConsumeBool()) {
      const std::uint64_t first = std::min<std::uint64_t>(e.payload_bytes, e.chunk_bytes);
      f.push_back(bulk(length(first)));
    }
    return f;
  }

  Endpoint::Frames chunk() {
    Envelope e;
    e.sender = in.ConsumeBool() ? "client-1" : "client-2";
    e.seq = in.ConsumeIntegralInRange<std::uint64_t>(100, 200);
    ChunkHeader c;
    c.transfer_id = in.ConsumeIntegralInRange<std::uint64_t>(0, 8);
    c.index = in.ConsumeIntegralInRange<std::uint32_t>(0, 12);
    std::uint64_t total = 0, chunk = 0;
    if (auto it = announced.find(c.transfer_id); it != announced.end()) {
      std::tie(total, chunk) = it->second;
    }
    c.count = chunk == 0 ? in.ConsumeIntegral<std::uint32_t>()
                         : static_cast<std::uint32_t>((total + chunk - 1) / chunk);
    if (in.ConsumeIntegralInRange(0, 7) == 0) c.count = in.ConsumeIntegral<std::uint32_t>();
    c.offset = std::uint64_t{c.index} * chunk;
    if (in.ConsumeIntegralInRange(0, 7) == 0) c.offset = in.ConsumeIntegral<std::uint64_t>();
    e.body = c;
    std::uint64_t right = 0;
    if (chunk > 0 && c.offset < total) right = std::min<std::uint64_t>(chunk, total - c.offset);
    Endpoint::Frames f{header(3, counter++), encode(e)};
    if (in.ConsumeIntegralInRange(0, 15) != 0) f.push_back(bulk(length(right)));
    return f;
  }

  Endpoint::Frames raw() {
    Endpoint::Frames f;
    if (in.ConsumeBool()) {
      f.push_back(header(in.ConsumeIntegralInRange<std::uint8_t>(0, 8), in.ConsumeIntegral<std::uint64_t>()));
    } else {
      f.push_back(bytes_from(in, 20));
    }
    const int more = in.ConsumeIntegralInRange(0, 4);
    for (int i = 0; i < more; ++i) {
      Bytes b = bytes_from(in, 256);
      bulk_left -= std::min(bulk_left, b.size());
      f.push_back(std::move(b));
    }
    return f;
  }
};

struct Rig {
  Context ctx;
};

EndpointOptions options(const std::string& id, bool deliver_chunks) {
  EndpointOptions o;
  o.node_id = id;
  o.chunk_bytes = 4096;
  o.max_payload_bytes = kMaxPayload;
  o.max_open_transfers = 4;
  o.deliver_chunks = deliver_chunks;
  o.heartbeat_ms = 0;
  return o;
}

void check(const Message& m, bool deliver_chunks) {
  const std::uint64_t total = m.envelope.payload_bytes;
  if (total > kMaxPayload) std::abort();
  if (!deliver_chunks && m.complete && m.payload.size() != total) std::abort();
  if (m.offset + m.payload.size() > total) std::abort();
  if (total > 0 && m.payload.size() == 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::set_log_level(cohort::LogLevel::Off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Rig rig;
  static std::uint64_t run = 0;
  FuzzedDataProvider in(data, size);
  const bool deliver_chunks = in.ConsumeBool();
  const std::string url = "inproc://fuzz-" + std::to_string(run++);
  auto server = Endpoint::bind(rig.ctx, url, options("shard-0", deliver_chunks));
  auto client = Endpoint::connect(rig.ctx, url, options("client-1", false));

  Generator gen{in};
  for (int records = 0; records < 64 && in.remaining_bytes() > 0 && gen.bulk_left > 0; ++records) {
    Endpoint::Frames f;
    switch (in.ConsumeIntegralInRange(0, 5)) {
      case 0: case 1: f = gen.head(); break;
      case 2: case 3: case 4: f = gen.chunk(); break;
      default: f = gen.raw(); break;
    }
    client.send_raw_for_testing({}, f);
  }
  Envelope end;
  end.sender = "client-1";
  end.seq = 999;
  end.body = Bye{kSentinel};
  client.send_raw_for_testing({}, {header(3, gen.counter), encode(end)});

  for (int waits = 0;; ++waits) {
    auto m = server.receive(std::chrono::milliseconds(200));
    if (!m) {
      if (waits > 50) std::abort();  // the sentinel never came: the receiver lost its way
      continue;
    }
    if (auto* bye = std::get_if<Bye>(&m->envelope.body); bye && bye->reason == kSentinel) break;
    check(*m, deliver_chunks);
  }
  return 0;
}
