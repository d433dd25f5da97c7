// The protocol's messages as plain C++ values, and their encoding to and from the wire.
//
// schema/cohort.capnp is the only definition of the wire; these structs mirror it field for field
// so that server and client code never touch Cap'n Proto types (docs/STYLE.md: decode at the seam).
// encode() writes a flat Cap'n Proto message; decode() reads one with explicit traversal and
// nesting limits and throws ProtocolError for anything malformed, oversized or out of range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "cohort/core/ids.h"

namespace cohort::transport {

inline constexpr std::uint16_t kProtocolVersion = 1;
// Largest encoded envelope accepted; bulk bytes travel beside it, so 64 KiB is generous.
inline constexpr std::size_t kMaxEnvelopeBytes = 64 * 1024;

enum class Role : std::uint8_t { kClient, kShard, kPeer, kObserver };
enum class Encoding : std::uint8_t {
  kDenseF32,
  kDenseF16,
  kDenseBf16,
  kInt8,
  kQsgd,
  kTopK,
  kRandomK,
  kSign,
  kPowerSgd,
  kMaskedU32  // secure aggregation: a masked fixed-point input, uint32 words mod 2^32
};
enum class PushKind : std::uint8_t { kDelta, kGradient };
enum class TrainingMode : std::uint8_t { kFederated, kDataParallel, kBuffered };
enum class ErrorCode : std::uint8_t {
  kMalformed,
  kVersionMismatch,
  kUnauthorized,
  kUnknownNode,
  kBadRange,
  kTooLarge,
  kLateOrStale,
  kInternal,
  kShuttingDown
};

struct Register {
  Role role = Role::kClient;
  std::uint64_t dataset_size = 0;
  std::string device;
  std::string listen_url;
  std::uint64_t resume_token = 0;
  std::uint32_t shard_index = 0;
  std::string partition;
  // A client without a test set (a Python client given no evaluate function): the coordinator
  // asks the others to evaluate the global model.
  bool no_evaluation = false;
  bool operator==(const Register&) const = default;
};
struct ShardInfo {
  std::uint32_t index = 0;
  std::string url;
  std::string node_id;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  bool operator==(const ShardInfo&) const = default;
};
struct Welcome {
  std::uint32_t client_index = 0;
  std::uint64_t model_size = 0;
  std::string model_spec;
  std::vector<ShardInfo> shards;
  std::uint64_t current_round = 0;
  std::uint32_t heartbeat_ms = 0;
  std::string training_toml;
  // Random per coordinator process: a shard that sees it change knows the coordinator restarted
  // and drops the state of any round it had open (the new coordinator reopens it from scratch).
  std::uint64_t coordinator_epoch = 0;
  bool operator==(const Welcome&) const = default;
};
struct Heartbeat {
  std::uint64_t clock = 0;
  float load = 0;
  bool operator==(const Heartbeat&) const = default;
};
struct RoundStart {
  std::uint64_t round = 0;
  std::uint64_t deadline_ms = 0;
  std::uint32_t local_epochs = 0;
  std::uint32_t local_steps = 0;
  float learning_rate = 0;  // unused: clients take lr from Welcome.training_toml; kept for the wire
  std::uint64_t model_version = 0;
  bool evaluate_only = false;
  TrainingMode mode = TrainingMode::kFederated;
  std::uint32_t batch_size = 0;
  std::uint32_t cohort_size = 0;    // federated: clients selected for the round (0: not said)
  bool secure_aggregation = false;  // federated: the round runs the SecAgg stages
  bool operator==(const RoundStart&) const = default;
};
struct Pull {
  std::uint32_t shard = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t min_version = 0;
  bool operator==(const Pull&) const = default;
};
struct PullReply {
  std::uint32_t shard = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t version = 0;
  Encoding encoding = Encoding::kDenseF32;
  // Data-parallel with server.batch_policy = speed, from shard 0: the batch this worker takes at
  // the step the pull was answered for (0: none given, use RoundStart.batch_size).
  std::uint32_t batch_size = 0;
  bool operator==(const PullReply&) const = default;
};
struct Push {
  std::uint32_t shard = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t num_samples = 0;
  std::uint64_t base_version = 0;
  Encoding encoding = Encoding::kDenseF32;
  PushKind kind = PushKind::kDelta;
  float train_loss = 0;
  std::uint64_t clock = 0;
  std::uint64_t elements = 0;
  float local_work = 0;  // FedNova's a_i (docs/ALGORITHMS.md 1.7); 0: not given
  bool operator==(const Push&) const = default;
};
struct PushAck {
  bool accepted = false;
  std::string reason;
  std::uint64_t version = 0;
  // A shard's answer to RoundClose.prepare (accepted: its rule produced the aggregate; reason:
  // why not), as opposed to its answer to the close itself.
  bool prepared = false;
  bool operator==(const PushAck&) const = default;
};
struct ChunkHeader {
  std::uint64_t transfer_id = 0;
  std::uint32_t index = 0;
  std::uint32_t count = 0;
  std::uint64_t offset = 0;
  bool operator==(const ChunkHeader&) const = default;
};
struct ErrorBody {
  ErrorCode code = ErrorCode::kMalformed;
  std::string message;
  std::uint64_t ref_seq = 0;
  bool operator==(const ErrorBody&) const = default;
};
struct GossipExchange {
  std::uint64_t step = 0;
  std::uint32_t from_rank = 0;
  double weight = 0;
  Encoding encoding = Encoding::kDenseF32;
  std::uint64_t elements = 0;
  bool operator==(const GossipExchange&) const = default;
};
struct AllreduceChunk {
  std::uint64_t op_id = 0;
  std::uint32_t step = 0;
  std::uint8_t phase = 0;
  std::uint32_t segment = 0;
  std::uint64_t offset = 0;
  std::uint64_t elements = 0;
  bool operator==(const AllreduceChunk&) const = default;
};
struct Bye {
  std::string reason;
  bool operator==(const Bye&) const = default;
};

// At most this many client ids per RoundOpen message (an envelope stays under 64 KiB).
inline constexpr std::size_t kRoundOpenBatch = 512;
struct RoundOpen {
  std::uint64_t round = 0;
  std::vector<NodeId> clients;
  bool operator==(const RoundOpen&) const = default;
};
struct RoundClose {
  std::uint64_t round = 0;
  bool commit = false;
  std::uint32_t clients = 0;
  // Phase one of two: the shard computes the round's aggregate and answers (PushAck) whether its
  // rule could; the coordinator then commits (commit = true) only if every shard could.
  bool prepare = false;
  bool operator==(const RoundClose&) const = default;
};
// A client's measurement of its link to one shard in one round: payload bytes and the time from
// request to answer (latency included), each way. Zero seconds: not measured.
struct LinkSample {
  std::uint32_t shard = 0;
  std::uint64_t down_bytes = 0;
  float down_seconds = 0;
  std::uint64_t up_bytes = 0;
  float up_seconds = 0;
  bool operator==(const LinkSample&) const = default;
};
struct ClientReport {
  std::uint64_t round = 0;
  bool trained = false;
  std::uint64_t num_samples = 0;
  float train_loss = 0;
  float train_seconds = 0;
  float comm_seconds = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  bool evaluated = false;
  float eval_loss = 0;
  float eval_accuracy = 0;
  std::uint64_t eval_count = 0;
  std::uint64_t model_version = 0;
  std::string message;
  // The client stops for good (bad configuration, unusable device, ...): `message` says why.
  bool fatal = false;
  std::uint32_t local_steps = 0;  // SGD steps run this round
  float samples_per_second = 0;   // training throughput this round (samples / compute time)
  std::vector<LinkSample> links;  // one per shard it exchanged with (at most 4096)
  // The memory plan it trained under (client.memory_budget / train.memory_budget) and the
  // measured training-memory high-water mark of the round; 0: not said.
  std::uint64_t peak_training_bytes = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t accumulation = 0;
  bool recompute = false;
  // Its wall time from the RoundStart to this report: train_seconds, comm_seconds and whatever
  // else the client spent (making the update, converting parameters); 0: not said.
  float round_seconds = 0;
  bool operator==(const ClientReport&) const = default;
};

// Secure aggregation: one stage of round `round` (schema/cohort.capnp; the stage's data is a
// SecAggData in the payload, secagg_messages.h).
enum class SecAggStage : std::uint8_t {
  kAdvertise,
  kKeys,
  kShares,
  kForwarded,
  kUnmask,
  kUnmaskShares,
  kSeeds,
  kHeld
};
inline constexpr std::uint16_t kSecAggStages = 8;
struct SecAgg {
  std::uint64_t round = 0;
  SecAggStage stage = SecAggStage::kAdvertise;
  bool operator==(const SecAgg&) const = default;
};

// A shard's figures for shard 0's HTTP endpoint; the JSON is in the payload.
struct Telemetry {
  std::uint32_t shard = 0;
  bool operator==(const Telemetry&) const = default;
};

using Body = std::variant<Register, Welcome, Heartbeat, RoundStart, Pull, PullReply, Push, PushAck,
                          ChunkHeader, ErrorBody, GossipExchange, AllreduceChunk, Bye, RoundClose,
                          ClientReport, RoundOpen, SecAgg, Telemetry>;

// The name of a body's type as the schema spells it ("push", "pullReply", ...), for logs.
std::string_view body_name(const Body& body);

struct Envelope {
  std::uint16_t protocol_version = kProtocolVersion;
  NodeId sender;
  std::uint64_t seq = 0;
  std::uint64_t round = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t chunk_bytes = 0;
  Body body;
  NodeId recipient;  // replies through a multiplexed connection: the virtual node addressed
  bool operator==(const Envelope&) const = default;
};

// Encodes to a flat Cap'n Proto message (word-aligned bytes).
std::vector<std::byte> encode(const Envelope& envelope);
// Decodes and validates: traversal limit kMaxEnvelopeBytes, nesting limit 8, a known body, a
// matching protocol version, a valid sender id, text and list lengths within bounds.
// Throws ProtocolError naming what was wrong.
Envelope decode(std::span<const std::byte> bytes);

}  // namespace cohort::transport
