#include "cohort/transport/messages.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

#include "cohort/core/error.h"
#include "schema/cohort.capnp.h"

namespace cohort::transport {
namespace {

constexpr std::size_t kMaxTextBytes = 16 * 1024;
constexpr std::size_t kMaxShards = 4096;

std::string text(capnp::Text::Reader t, const char* field) {
  if (t.size() > kMaxTextBytes) {
    throw ProtocolError(std::string("field '") + field + "' is " + std::to_string(t.size()) +
                        " bytes long (limit " + std::to_string(kMaxTextBytes) + ")");
  }
  // Text is NUL-terminated on the wire and in every C API it reaches (urls, node ids, logs): an
  // embedded NUL would make the text checked here differ from the text used.
  if (std::memchr(t.cStr(), '\0', t.size()) != nullptr) {
    throw ProtocolError(std::string("field '") + field + "' contains a NUL byte");
  }
  return std::string(t.cStr(), t.size());
}

template <typename E>
E checked_enum(std::uint16_t raw, std::uint16_t count, const char* field) {
  if (raw >= count) {
    throw ProtocolError(std::string("field '") + field + "' has unknown value " +
                        std::to_string(raw));
  }
  return static_cast<E>(raw);
}

Encoding enc(wire::Encoding e) {
  return checked_enum<Encoding>(static_cast<std::uint16_t>(e), 10, "encoding");
}
wire::Encoding enc(Encoding e) { return static_cast<wire::Encoding>(e); }

struct Writer {
  wire::Envelope::Body::Builder b;
  void operator()(const Register& m) {
    auto r = b.initRegister();
    r.setRole(static_cast<wire::Role>(m.role));
    r.setDatasetSize(m.dataset_size);
    r.setDevice(m.device);
    r.setListenUrl(m.listen_url);
    r.setResumeToken(m.resume_token);
    r.setShardIndex(m.shard_index);
    r.setPartition(m.partition);
    r.setNoEvaluation(m.no_evaluation);
  }
  void operator()(const Welcome& m) {
    auto w = b.initWelcome();
    w.setClientIndex(m.client_index);
    w.setModelSize(m.model_size);
    w.setModelSpec(m.model_spec);
    w.setCurrentRound(m.current_round);
    w.setHeartbeatMs(m.heartbeat_ms);
    w.setTrainingToml(m.training_toml);
    w.setCoordinatorEpoch(m.coordinator_epoch);
    auto list = w.initShards(static_cast<unsigned>(m.shards.size()));
    for (unsigned i = 0; i < m.shards.size(); ++i) {
      const auto& s = m.shards[i];
      list[i].setIndex(s.index);
      list[i].setUrl(s.url);
      list[i].setNodeId(s.node_id);
      list[i].setBegin(s.begin);
      list[i].setEnd(s.end);
    }
  }
  void operator()(const Heartbeat& m) {
    auto h = b.initHeartbeat();
    h.setClock(m.clock);
    h.setLoad(m.load);
  }
  void operator()(const RoundStart& m) {
    auto r = b.initRoundStart();
    r.setRound(m.round);
    r.setDeadlineMs(m.deadline_ms);
    r.setLocalEpochs(m.local_epochs);
    r.setLocalSteps(m.local_steps);
    r.setLearningRate(m.learning_rate);
    r.setModelVersion(m.model_version);
    r.setEvaluateOnly(m.evaluate_only);
    r.setMode(static_cast<wire::TrainingMode>(m.mode));
    r.setBatchSize(m.batch_size);
    r.setCohortSize(m.cohort_size);
    r.setSecureAggregation(m.secure_aggregation);
  }
  void operator()(const Pull& m) {
    auto p = b.initPull();
    p.setShard(m.shard);
    p.setBegin(m.begin);
    p.setEnd(m.end);
    p.setMinVersion(m.min_version);
  }
  void operator()(const PullReply& m) {
    auto p = b.initPullReply();
    p.setShard(m.shard);
    p.setBegin(m.begin);
    p.setEnd(m.end);
    p.setVersion(m.version);
    p.setEncoding(enc(m.encoding));
    p.setBatchSize(m.batch_size);
  }
  void operator()(const Push& m) {
    auto p = b.initPush();
    p.setShard(m.shard);
    p.setBegin(m.begin);
    p.setEnd(m.end);
    p.setNumSamples(m.num_samples);
    p.setBaseVersion(m.base_version);
    p.setEncoding(enc(m.encoding));
    p.setKind(static_cast<wire::PushKind>(m.kind));
    p.setTrainLoss(m.train_loss);
    p.setClock(m.clock);
    p.setElements(m.elements);
    p.setLocalWork(m.local_work);
  }
  void operator()(const PushAck& m) {
    auto a = b.initPushAck();
    a.setAccepted(m.accepted);
    a.setReason(m.reason);
    a.setVersion(m.version);
    a.setPrepared(m.prepared);
  }
  void operator()(const ChunkHeader& m) {
    auto c = b.initChunk();
    c.setTransferId(m.transfer_id);
    c.setIndex(m.index);
    c.setCount(m.count);
    c.setOffset(m.offset);
  }
  void operator()(const ErrorBody& m) {
    auto e = b.initError();
    e.setCode(static_cast<wire::ErrorCode>(m.code));
    e.setMessage(m.message);
    e.setRefSeq(m.ref_seq);
  }
  void operator()(const GossipExchange& m) {
    auto g = b.initGossip();
    g.setStep(m.step);
    g.setFromRank(m.from_rank);
    g.setWeight(m.weight);
    g.setEncoding(enc(m.encoding));
    g.setElements(m.elements);
  }
  void operator()(const AllreduceChunk& m) {
    auto a = b.initAllreduce();
    a.setOpId(m.op_id);
    a.setStep(m.step);
    a.setPhase(m.phase);
    a.setSegment(m.segment);
    a.setOffset(m.offset);
    a.setElements(m.elements);
  }
  void operator()(const Bye& m) { b.initBye().setReason(m.reason); }
  void operator()(const Telemetry& m) { b.initTelemetry().setShard(m.shard); }
  void operator()(const RoundOpen& m) {
    auto r = b.initRoundOpen();
    r.setRound(m.round);
    auto list = r.initClients(static_cast<unsigned>(m.clients.size()));
    for (unsigned i = 0; i < m.clients.size(); ++i) list.set(i, m.clients[i]);
  }
  void operator()(const SecAgg& m) {
    auto r = b.initSecAgg();
    r.setRound(m.round);
    r.setStage(static_cast<wire::SecAggStage>(m.stage));
  }
  void operator()(const RoundClose& m) {
    auto r = b.initRoundClose();
    r.setRound(m.round);
    r.setCommit(m.commit);
    r.setClients(m.clients);
    r.setPrepare(m.prepare);
  }
  void operator()(const ClientReport& m) {
    auto r = b.initReport();
    r.setRound(m.round);
    r.setTrained(m.trained);
    r.setNumSamples(m.num_samples);
    r.setTrainLoss(m.train_loss);
    r.setTrainSeconds(m.train_seconds);
    r.setCommSeconds(m.comm_seconds);
    r.setBytesSent(m.bytes_sent);
    r.setBytesReceived(m.bytes_received);
    r.setEvaluated(m.evaluated);
    r.setEvalLoss(m.eval_loss);
    r.setEvalAccuracy(m.eval_accuracy);
    r.setEvalCount(m.eval_count);
    r.setModelVersion(m.model_version);
    r.setMessage(m.message);
    r.setFatal(m.fatal);
    r.setLocalSteps(m.local_steps);
    r.setSamplesPerSecond(m.samples_per_second);
    r.setPeakTrainingBytes(m.peak_training_bytes);
    r.setMicroBatch(m.micro_batch);
    r.setAccumulation(m.accumulation);
    r.setRecompute(m.recompute);
    r.setRoundSeconds(m.round_seconds);
    auto links = r.initLinks(static_cast<unsigned>(m.links.size()));
    for (unsigned i = 0; i < m.links.size(); ++i) {
      const auto& l = m.links[i];
      links[i].setShard(l.shard);
      links[i].setDownBytes(l.down_bytes);
      links[i].setDownSeconds(l.down_seconds);
      links[i].setUpBytes(l.up_bytes);
      links[i].setUpSeconds(l.up_seconds);
    }
  }
};

Welcome read_welcome(wire::Welcome::Reader w) {
  Welcome out{.client_index = w.getClientIndex(),
              .model_size = w.getModelSize(),
              .model_spec = text(w.getModelSpec(), "modelSpec"),
              .shards = {},
              .current_round = w.getCurrentRound(),
              .heartbeat_ms = w.getHeartbeatMs(),
              .training_toml = text(w.getTrainingToml(), "trainingToml"),
              .coordinator_epoch = w.getCoordinatorEpoch()};
  auto shards = w.getShards();
  if (shards.size() > kMaxShards) {
    throw ProtocolError("welcome lists " + std::to_string(shards.size()) + " shards (limit " +
                        std::to_string(kMaxShards) + ")");
  }
  for (auto s : shards) {
    if (s.getBegin() > s.getEnd()) throw ProtocolError("welcome: shard range begins after it ends");
    out.shards.push_back({.index = s.getIndex(),
                          .url = text(s.getUrl(), "url"),
                          .node_id = text(s.getNodeId(), "nodeId"),
                          .begin = s.getBegin(),
                          .end = s.getEnd()});
  }
  return out;
}

Push read_push(wire::Push::Reader p) {
  if (p.getBegin() > p.getEnd()) throw ProtocolError("push: range begins after it ends");
  return Push{.shard = p.getShard(),
              .begin = p.getBegin(),
              .end = p.getEnd(),
              .num_samples = p.getNumSamples(),
              .base_version = p.getBaseVersion(),
              .encoding = enc(p.getEncoding()),
              .kind = checked_enum<PushKind>(static_cast<std::uint16_t>(p.getKind()), 2, "kind"),
              .train_loss = p.getTrainLoss(),
              .clock = p.getClock(),
              .elements = p.getElements(),
              .local_work = p.getLocalWork()};
}

RoundOpen read_round_open(wire::RoundOpen::Reader r) {
  auto list = r.getClients();
  if (list.size() > kRoundOpenBatch) {
    throw ProtocolError("roundOpen lists " + std::to_string(list.size()) + " clients (limit " +
                        std::to_string(kRoundOpenBatch) + ")");
  }
  RoundOpen out{.round = r.getRound(), .clients = {}};
  out.clients.reserve(list.size());
  for (auto c : list) {
    std::string id = text(c, "client");
    if (!is_valid_node_id(id)) throw ProtocolError("roundOpen: a client id is not a valid node id");
    out.clients.push_back(std::move(id));
  }
  return out;
}

ClientReport read_report(wire::ClientReport::Reader r) {
  auto links = r.getLinks();
  if (links.size() > kMaxShards) {
    throw ProtocolError("report lists " + std::to_string(links.size()) + " links (limit " +
                        std::to_string(kMaxShards) + ")");
  }
  ClientReport out{.round = r.getRound(),
                   .trained = r.getTrained(),
                   .num_samples = r.getNumSamples(),
                   .train_loss = r.getTrainLoss(),
                   .train_seconds = r.getTrainSeconds(),
                   .comm_seconds = r.getCommSeconds(),
                   .bytes_sent = r.getBytesSent(),
                   .bytes_received = r.getBytesReceived(),
                   .evaluated = r.getEvaluated(),
                   .eval_loss = r.getEvalLoss(),
                   .eval_accuracy = r.getEvalAccuracy(),
                   .eval_count = r.getEvalCount(),
                   .model_version = r.getModelVersion(),
                   .message = text(r.getMessage(), "message"),
                   .fatal = r.getFatal(),
                   .local_steps = r.getLocalSteps(),
                   .samples_per_second = r.getSamplesPerSecond(),
                   .links = {},
                   .peak_training_bytes = r.getPeakTrainingBytes(),
                   .micro_batch = r.getMicroBatch(),
                   .accumulation = r.getAccumulation(),
                   .recompute = r.getRecompute(),
                   .round_seconds = r.getRoundSeconds()};
  out.links.reserve(links.size());
  for (auto l : links) {
    out.links.push_back({.shard = l.getShard(),
                         .down_bytes = l.getDownBytes(),
                         .down_seconds = l.getDownSeconds(),
                         .up_bytes = l.getUpBytes(),
                         .up_seconds = l.getUpSeconds()});
  }
  return out;
}

Body read_body(wire::Envelope::Body::Reader b) {
  switch (b.which()) {
    case wire::Envelope::Body::REGISTER: {
      auto r = b.getRegister();
      return Register{checked_enum<Role>(static_cast<std::uint16_t>(r.getRole()), 4, "role"),
                      r.getDatasetSize(),
                      text(r.getDevice(), "device"),
                      text(r.getListenUrl(), "listenUrl"),
                      r.getResumeToken(),
                      r.getShardIndex(),
                      text(r.getPartition(), "partition"),
                      r.getNoEvaluation()};
    }
    case wire::Envelope::Body::WELCOME: return read_welcome(b.getWelcome());
    case wire::Envelope::Body::HEARTBEAT: {
      auto h = b.getHeartbeat();
      return Heartbeat{h.getClock(), h.getLoad()};
    }
    case wire::Envelope::Body::ROUND_START: {
      auto r = b.getRoundStart();
      return RoundStart{
          r.getRound(),
          r.getDeadlineMs(),
          r.getLocalEpochs(),
          r.getLocalSteps(),
          r.getLearningRate(),
          r.getModelVersion(),
          r.getEvaluateOnly(),
          checked_enum<TrainingMode>(static_cast<std::uint16_t>(r.getMode()), 3, "mode"),
          r.getBatchSize(),
          r.getCohortSize(),
          r.getSecureAggregation()};
    }
    case wire::Envelope::Body::PULL: {
      auto p = b.getPull();
      if (p.getBegin() > p.getEnd()) throw ProtocolError("pull: range begins after it ends");
      return Pull{p.getShard(), p.getBegin(), p.getEnd(), p.getMinVersion()};
    }
    case wire::Envelope::Body::PULL_REPLY: {
      auto p = b.getPullReply();
      if (p.getBegin() > p.getEnd()) throw ProtocolError("pullReply: range begins after it ends");
      return PullReply{p.getShard(),   p.getBegin(),         p.getEnd(),
                       p.getVersion(), enc(p.getEncoding()), p.getBatchSize()};
    }
    case wire::Envelope::Body::PUSH: return read_push(b.getPush());
    case wire::Envelope::Body::PUSH_ACK: {
      auto a = b.getPushAck();
      return PushAck{a.getAccepted(), text(a.getReason(), "reason"), a.getVersion(),
                     a.getPrepared()};
    }
    case wire::Envelope::Body::CHUNK: {
      auto c = b.getChunk();
      return ChunkHeader{c.getTransferId(), c.getIndex(), c.getCount(), c.getOffset()};
    }
    case wire::Envelope::Body::ERROR: {
      auto e = b.getError();
      return ErrorBody{checked_enum<ErrorCode>(static_cast<std::uint16_t>(e.getCode()), 9, "code"),
                       text(e.getMessage(), "message"), e.getRefSeq()};
    }
    case wire::Envelope::Body::GOSSIP: {
      auto g = b.getGossip();
      return GossipExchange{g.getStep(), g.getFromRank(), g.getWeight(), enc(g.getEncoding()),
                            g.getElements()};
    }
    case wire::Envelope::Body::ALLREDUCE: {
      auto a = b.getAllreduce();
      return AllreduceChunk{a.getOpId(),    a.getStep(),   a.getPhase(),
                            a.getSegment(), a.getOffset(), a.getElements()};
    }
    case wire::Envelope::Body::BYE: return Bye{text(b.getBye().getReason(), "reason")};
    case wire::Envelope::Body::ROUND_OPEN: return read_round_open(b.getRoundOpen());
    case wire::Envelope::Body::ROUND_CLOSE: {
      auto r = b.getRoundClose();
      return RoundClose{r.getRound(), r.getCommit(), r.getClients(), r.getPrepare()};
    }
    case wire::Envelope::Body::REPORT: return read_report(b.getReport());
    case wire::Envelope::Body::SEC_AGG: {
      auto r = b.getSecAgg();
      return SecAgg{r.getRound(),
                    checked_enum<SecAggStage>(static_cast<std::uint16_t>(r.getStage()),
                                              kSecAggStages, "stage")};
    }
    case wire::Envelope::Body::TELEMETRY: return Telemetry{b.getTelemetry().getShard()};
  }
  throw ProtocolError("envelope has an unknown body (newer protocol?)");
}

}  // namespace

std::string_view body_name(const Body& body) {
  static constexpr std::string_view kNames[] = {
      "register", "welcome",    "heartbeat", "roundStart", "pull",   "pullReply",
      "push",     "pushAck",    "chunk",     "error",      "gossip", "allreduce",
      "bye",      "roundClose", "report",    "roundOpen",  "secAgg", "telemetry"};
  return kNames[body.index()];
}

std::vector<std::byte> encode(const Envelope& envelope) {
  capnp::MallocMessageBuilder builder(256);
  auto e = builder.initRoot<wire::Envelope>();
  e.setProtocolVersion(envelope.protocol_version);
  e.setSender(envelope.sender);
  e.setSeq(envelope.seq);
  e.setRound(envelope.round);
  e.setPayloadBytes(envelope.payload_bytes);
  e.setChunkBytes(envelope.chunk_bytes);
  if (!envelope.recipient.empty()) e.setRecipient(envelope.recipient);
  std::visit(Writer{e.initBody()}, envelope.body);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

Envelope decode(std::span<const std::byte> bytes) {
  if (bytes.size() > kMaxEnvelopeBytes) {
    throw ProtocolError("envelope of " + std::to_string(bytes.size()) +
                        " bytes exceeds the limit of " + std::to_string(kMaxEnvelopeBytes));
  }
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    throw ProtocolError("envelope of " + std::to_string(bytes.size()) +
                        " bytes is not a whole number of 8-byte words");
  }
  // Cap'n Proto reads words in place; copy when ZeroMQ handed us unaligned bytes.
  // (kj::Array, not std::vector: capnp::word is not copyable, which clang's library rejects.)
  kj::Array<capnp::word> aligned;
  const capnp::word* words = reinterpret_cast<const capnp::word*>(bytes.data());
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(capnp::word) != 0) {
    aligned = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
    std::memcpy(aligned.begin(), bytes.data(), bytes.size());
    words = aligned.begin();
  }
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kMaxEnvelopeBytes / sizeof(capnp::word);
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words, bytes.size() / sizeof(capnp::word)), options);
    auto e = reader.getRoot<wire::Envelope>();
    Envelope out;
    out.protocol_version = e.getProtocolVersion();
    if (out.protocol_version != kProtocolVersion) {
      throw ProtocolError("protocol version " + std::to_string(out.protocol_version) +
                          " is not supported (this build speaks " +
                          std::to_string(kProtocolVersion) + ")");
    }
    out.sender = text(e.getSender(), "sender");
    if (!is_valid_node_id(out.sender))
      throw ProtocolError("envelope sender is not a valid node id");
    out.seq = e.getSeq();
    out.round = e.getRound();
    out.payload_bytes = e.getPayloadBytes();
    out.chunk_bytes = e.getChunkBytes();
    out.recipient = text(e.getRecipient(), "recipient");
    if (!out.recipient.empty() && !is_valid_node_id(out.recipient)) {
      throw ProtocolError("envelope recipient is not a valid node id");
    }
    if (out.payload_bytes > 0 && out.chunk_bytes == 0) {
      throw ProtocolError("envelope announces a payload but no chunk size");
    }
    out.body = read_body(e.getBody());
    return out;
  } catch (const kj::Exception& e) {
    throw ProtocolError("malformed envelope: " + std::string(e.getDescription().cStr()));
  }
}

}  // namespace cohort::transport
