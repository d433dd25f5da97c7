# The Cohort wire protocol. This schema is the only definition of the wire.
#
# Every ZeroMQ message carries one Envelope (this schema, a flat Cap'n Proto message) and, when the
# envelope announces payload bytes, one bulk frame beside it: tensor bytes never pass through a
# Cap'n Proto builder. A payload larger than `chunkBytes` travels as a head message (the envelope
# with the real body, plus the first chunk) followed by ChunkHeader messages, each with the next
# chunk in its bulk frame, so that receiving, decrypting and aggregating overlap.
#
# Compatibility: fields are only ever added (never renumbered or retyped); a peer with another
# protocolVersion is refused with Error(versionMismatch).

@0xc8e7a4f1d2b3a596;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("cohort::wire");

const protocolVersion :UInt16 = 1;

struct Envelope {
  protocolVersion @0 :UInt16;
  sender @1 :Text;          # node id of the sender; must equal its certificate's CN under TLS
  seq @2 :UInt64;           # per-sender sequence number, strictly increasing
  round @3 :UInt64;         # federated round (or data-parallel clock) this message belongs to
  payloadBytes @4 :UInt64;  # total bytes of the bulk payload of this logical message (0: none)
  chunkBytes @5 :UInt32;    # chunk size the payload is cut into (0 when payloadBytes is 0)

  body :union {
    register @6 :Register;
    welcome @7 :Welcome;
    heartbeat @8 :Heartbeat;
    roundStart @9 :RoundStart;
    pull @10 :Pull;
    pullReply @11 :PullReply;
    push @12 :Push;
    pushAck @13 :PushAck;
    chunk @14 :ChunkHeader;
    error @15 :Error;
    gossip @16 :GossipExchange;
    allreduce @17 :AllreduceChunk;
    bye @18 :Bye;
    roundClose @19 :RoundClose;
    report @20 :ClientReport;
    roundOpen @22 :RoundOpen;
    secAgg @23 :SecAgg;
    telemetry @24 :Telemetry;
  }

  # A reply through a multiplexed connection (one in-process socket speaking for many virtual
  # nodes, as cohort-sim's fleet does) names the virtual node it is for; empty otherwise.
  recipient @21 :Text;
}

# What a node is in a federation.
enum Role {
  client @0;    # trains on local data, pushes updates
  shard @1;     # parameter-server shard (shard 0 also coordinates)
  peer @2;      # decentralized peer
  observer @3;  # tools and monitors: may pull, never push
}

# How the bulk payload of a Pull reply, Push or gossip message is encoded. denseF32 is raw
# float32. A Push in any other encoding carries the update in pieces of at most 2^18 elements, each
# a u32 little-endian byte length followed by the compressor's self-describing encoding (8-byte
# header: format, version, parameter, element count; see aggregation/compressor.h and
# aggregation/push_codec.h); Push.elements gives the decoded length.
enum Encoding {
  denseF32 @0;  # little-endian float32, one per coordinate
  denseF16 @1;
  denseBf16 @2;
  int8 @3;      # per-chunk scale + int8 values
  qsgd @4;      # norm + packed signs and levels
  topK @5;      # uint32 indices + float32 values
  randomK @6;   # seed + float32 values
  sign @7;      # scale + packed sign bits
  powerSgd @8;  # low-rank factors P and Q
  maskedU32 @9; # secure aggregation: a masked fixed-point input, little-endian uint32 words mod
                # 2^32, one per coordinate (docs/ALGORITHMS.md 8.1)
}

# Client -> coordinator: join the federation.
struct Register {
  role @0 :Role;
  datasetSize @1 :UInt64;   # local training samples (weights FedAvg and weighted selection)
  device @2 :Text;          # "cpu" or "cuda:0"
  listenUrl @3 :Text;       # decentralized peers: where neighbours reach this node
  resumeToken @4 :UInt64;   # non-zero when re-registering after a reconnect
  shardIndex @5 :UInt32;    # role shard: which shard this is
  partition @6 :Text;       # role client: the data partition it holds, e.g. "dirichlet:0.5 3/10"
  noEvaluation @7 :Bool;    # role client: it has no test set; the coordinator asks others
}

# Where one shard lives and which range of the flat parameter vector it owns.
struct ShardInfo {
  index @0 :UInt32;
  url @1 :Text;
  nodeId @2 :Text;
  begin @3 :UInt64;         # first coordinate owned (inclusive)
  end @4 :UInt64;           # one past the last coordinate owned
}

# Coordinator -> client: accepted; how the model is laid out and where its shards are.
struct Welcome {
  clientIndex @0 :UInt32;
  modelSize @1 :UInt64;     # coordinates in the flat parameter vector
  modelSpec @2 :Text;       # e.g. "mlp:784-256-128-10"
  shards @3 :List(ShardInfo);
  currentRound @4 :UInt64;
  heartbeatMs @5 :UInt32;   # how often the client must send a Heartbeat
  trainingToml @6 :Text;    # client-side training options (epochs, batch, optimizer) as TOML
  coordinatorEpoch @7 :UInt64;  # random per coordinator process: a change means it restarted
}

# Liveness, both ways. `clock` is the sender's data-parallel step (SSP bookkeeping).
struct Heartbeat {
  clock @0 :UInt64;
  load @1 :Float32;
}

# Coordinator -> selected client: train for this round and push before the deadline.
struct RoundStart {
  round @0 :UInt64;
  deadlineMs @1 :UInt64;    # milliseconds from receipt until the round closes
  localEpochs @2 :UInt32;
  localSteps @3 :UInt32;    # if non-zero, overrides localEpochs
  learningRate @4 :Float32;   # unused (the lr travels in Welcome.trainingToml); kept for the wire
  modelVersion @5 :UInt64;  # pull at least this version
  evaluateOnly @6 :Bool;    # evaluate the current model, do not train
  mode @7 :TrainingMode;
  batchSize @8 :UInt32;     # data-parallel: examples per step
  cohortSize @9 :UInt32;    # federated: how many clients this round selected (0: not said)
  secureAggregation @10 :Bool;  # federated: the round runs secure aggregation (SecAgg stages)
}

enum TrainingMode {
  federated @0;     # train E epochs, push the delta, report
  dataParallel @1;  # push a gradient per step, pull weights per step (BSP/ASP/SSP)
  buffered @2;      # FedBuff: as federated, but the server steps every K updates
}

# Client -> shard: send me parameters [begin, end) at version >= minVersion.
struct Pull {
  shard @0 :UInt32;
  begin @1 :UInt64;
  end @2 :UInt64;
  minVersion @3 :UInt64;
}

# Shard -> client: the requested range in the bulk payload.
struct PullReply {
  shard @0 :UInt32;
  begin @1 :UInt64;
  end @2 :UInt64;
  version @3 :UInt64;
  encoding @4 :Encoding;
  batchSize @5 :UInt32;     # data-parallel, server.batch_policy = speed, shard 0 only: the
                            # worker's batch for the step this pull is answered for (0: none)
}

enum PushKind {
  delta @0;      # federated: x_k - x_t after local training
  gradient @1;   # data-parallel: one step's gradient
}

# Client -> shard: an update for [begin, end) in the bulk payload.
struct Push {
  shard @0 :UInt32;
  begin @1 :UInt64;
  end @2 :UInt64;
  numSamples @3 :UInt64;    # FedAvg weight
  baseVersion @4 :UInt64;   # model version the update was computed from (staleness)
  encoding @5 :Encoding;
  kind @6 :PushKind;
  trainLoss @7 :Float32;
  clock @8 :UInt64;         # data-parallel step of the client
  elements @9 :UInt64;      # coordinates after decoding (end - begin for dense)
  localWork @10 :Float32;   # FedNova's a_i: the client's local work (ALGORITHMS.md 1.7); 0: not given
}

# Shard -> client: what became of a Push.
struct PushAck {
  accepted @0 :Bool;
  reason @1 :Text;          # why it was refused (late, duplicate, wrong round, non-finite, ...)
  version @2 :UInt64;       # shard's model version after the push
  prepared @3 :Bool;        # answers RoundClose.prepare (accepted: the rule could aggregate)
}

# One further chunk of the payload announced by an earlier head message from the same sender.
struct ChunkHeader {
  transferId @0 :UInt64;    # the seq of the head message
  index @1 :UInt32;         # 1-based: the head message carries chunk 0
  count @2 :UInt32;         # total chunks of the transfer, including chunk 0
  offset @3 :UInt64;        # byte offset of this chunk in the payload
}

enum ErrorCode {
  malformed @0;
  versionMismatch @1;
  unauthorized @2;
  unknownNode @3;
  badRange @4;
  tooLarge @5;
  lateOrStale @6;
  internal @7;
  shuttingDown @8;
}

# A refusal, with a human-readable reason. `refSeq` names the message it answers.
struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
  refSeq @2 :UInt64;
}

# Decentralized: a neighbour's (possibly compressed) model or difference for one gossip step.
struct GossipExchange {
  step @0 :UInt64;
  fromRank @1 :UInt32;
  weight @2 :Float64;       # push-sum weight or mixing weight
  encoding @3 :Encoding;
  elements @4 :UInt64;
}

# Decentralized: one segment of an AllReduce (reduce-scatter or all-gather phase).
struct AllreduceChunk {
  opId @0 :UInt64;
  step @1 :UInt32;
  phase @2 :UInt8;          # 0 reduce-scatter, 1 all-gather, 2 tree/recursive doubling
  segment @3 :UInt32;
  offset @4 :UInt64;        # first element of the segment
  elements @5 :UInt64;
}

# Orderly leave.
# A shard's figures for shard 0's HTTP endpoint (shard -> coordinator, about every 2 s): the
# payload is JSON, {"samples": [[name, labels, value], ...], "row": {...}} (server/telemetry.h).
struct Telemetry {
  shard @0 :UInt32;
}

struct Bye {
  reason @0 :Text;
}

# Coordinator -> shards, before the RoundStarts: who was selected for federated round `round`.
# A shard accepts that round's pushes only from these clients. A large cohort comes as several
# messages (each at most kRoundOpenBatch ids); the first for a newer round replaces the list.
struct RoundOpen {
  round @0 :UInt64;
  clients @1 :List(Text);
}

# Coordinator -> shards: round `round` is over. commit: fold in what arrived and step the model;
# otherwise discard it (too few clients by the deadline) and keep the model as it was.
struct RoundClose {
  round @0 :UInt64;
  commit @1 :Bool;
  clients @2 :UInt32;       # how many clients the coordinator counted as complete
  prepare @3 :Bool;         # phase one: compute the aggregate, answer whether the rule could
}

# Client -> coordinator: what one round (or one evaluation) did.
struct ClientReport {
  round @0 :UInt64;
  trained @1 :Bool;         # pushed a complete update to every shard
  numSamples @2 :UInt64;
  trainLoss @3 :Float32;
  trainSeconds @4 :Float32; # local computation
  commSeconds @5 :Float32;  # pulling and pushing
  bytesSent @6 :UInt64;
  bytesReceived @7 :UInt64;
  evaluated @8 :Bool;       # carries a test-set evaluation of the pulled model
  evalLoss @9 :Float32;
  evalAccuracy @10 :Float32;
  evalCount @11 :UInt64;
  modelVersion @12 :UInt64; # version that was trained on or evaluated
  message @13 :Text;        # why training failed, if it did
  fatal @14 :Bool;          # the client stops for good; message says why
  localSteps @15 :UInt32;   # SGD steps the client ran this round
  samplesPerSecond @16 :Float32;  # training throughput this round (samples over compute time)
  links @17 :List(LinkSample);    # what the client measured to each shard this round
  peakTrainingBytes @18 :UInt64;  # training memory high-water mark this round (0: not tracked)
  microBatch @19 :UInt32;         # samples per forward/backward (0: not said)
  accumulation @20 :UInt32;       # micro-batches per step (train.memory_budget's plan)
  recompute @21 :Bool;            # activations recomputed by segment (the plan, as above)
  roundSeconds @22 :Float32;      # the client's wall time from the RoundStart to this report
}

# A client's measurement of its link to one shard in one round: payload bytes and the time from
# request to answer (which includes the latency), each way.
struct LinkSample {
  shard @0 :UInt32;
  downBytes @1 :UInt64;
  downSeconds @2 :Float32;
  upBytes @3 :UInt64;
  upSeconds @4 :Float32;
}

# Secure aggregation (server.secure_aggregation; docs/ALGORITHMS.md 8.1 and 8.2): one stage of the
# protocol for federated round `round`, between a client and the coordinator, or the coordinator
# and a shard. The stage's data travels in the bulk payload as a SecAggData message (its own Cap'n
# Proto message), so that a cohort's keys and shares are not bounded by the envelope's size.
struct SecAgg {
  round @0 :UInt64;
  stage @1 :SecAggStage;
}

enum SecAggStage {
  advertise @0;     # client -> coordinator: its two public keys (R0)
  keys @1;          # coordinator -> client: U1's keys, the graph, the threshold, the weights (R0)
  shares @2;        # client -> coordinator: its sealed shares for its neighbours (R1)
  forwarded @3;     # coordinator -> client: the shares the rest of U2 sealed for it (R1)
  unmask @4;        # coordinator -> client: U3, whose masked inputs arrived (R4)
  unmaskShares @5;  # client -> coordinator: its shares of U3's self masks and dropped keys (R4)
  seeds @6;         # coordinator -> shard: the seeds that remove the masks (R4)
  held @7;          # coordinator -> shard: take no more masked inputs for the round and say
                    # whose you hold; shard -> coordinator: the answer (members' node ids)
}

# One member of U1: its protocol id (the coordinator's client index), node id and public keys.
struct SecAggMember {
  id @0 :UInt32;
  node @1 :Text;
  channelKey @2 :Data;      # X25519, 32 bytes: seals the shares between two members
  maskKey @3 :Data;         # X25519, 32 bytes: agrees the pairwise mask seeds
  weight @4 :Float64;       # keys: the factor this member scales its update by
}

# Shares from one member for another, sealed so that only the addressee opens them.
struct SecAggSealed {
  from @0 :UInt32;
  to @1 :UInt32;
  ciphertext @2 :Data;
}

# A Shamir share of `owner`'s secret: the point x and one field element per 32-bit limb.
struct SecAggShare {
  owner @0 :UInt32;
  x @1 :UInt64;
  y @2 :List(UInt64);
}

# A mask seed the shards remove: a survivor's self mask (dropped = survivor, sign +1), or the
# pairwise mask a survivor added with sign `sign` for a member that dropped.
struct SecAggSeed {
  survivor @0 :UInt32;
  dropped @1 :UInt32;
  sign @2 :Int8;
  seed @3 :Data;            # 32 bytes
}

# The stage's data; each stage fills the fields its comment names.
struct SecAggData {
  members @0 :List(SecAggMember);   # advertise (the sender alone), keys (U1, or SecAgg+: the
                                    # addressee and its neighbours)
  threshold @1 :UInt32;             # keys
  degree @2 :UInt32;                # keys: 0 = every member neighbours every other (SecAgg)
  graphSeed @3 :Data;               # keys: the SecAgg+ ring's public seed (32 bytes)
  sealed @4 :List(SecAggSealed);    # shares, forwarded
  survivors @5 :List(UInt32);       # keys: U1's ids (SecAgg+ sends each member only its
                                    # neighbours' keys); unmask, seeds: U3
  selfMask @6 :List(SecAggShare);   # unmaskShares: shares of survivors' self-mask seeds
  maskKey @7 :List(SecAggShare);    # unmaskShares: shares of dropped members' mask keys
  seeds @8 :List(SecAggSeed);       # seeds
  vectorSize @9 :UInt64;            # keys, seeds: the model's coordinates
  clip @10 :Float64;                # keys, seeds: the fixed-point clipping range c
  levels @11 :UInt32;               # keys, seeds: the fixed-point levels Q
  totalWeight @12 :Float64;         # seeds: the survivors' weights summed
}
