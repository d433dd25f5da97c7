// SecAggData <-> its Cap'n Proto form (secagg_messages.h).
#include "cohort/transport/secagg_messages.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

#include "cohort/core/error.h"
#include "schema/cohort.capnp.h"

namespace cohort::transport {
namespace {

constexpr std::size_t kMaxLimbs = 64;

void put_key(capnp::Data::Builder out, const SecAggKey& k) {
  std::memcpy(out.begin(), k.data(), k.size());
}
SecAggKey get_key(capnp::Data::Reader in, const char* field) {
  SecAggKey k{};
  if (in.size() != k.size()) {
    throw ProtocolError(std::string("secAgg: ") + field + " is " + std::to_string(in.size()) +
                        " bytes, not 32");
  }
  std::memcpy(k.data(), in.begin(), k.size());
  return k;
}
template <typename List>
void check_entries(const List& list, const char* field) {
  if (list.size() > kMaxSecAggEntries) {
    throw ProtocolError(std::string("secAgg: ") + field + " has " + std::to_string(list.size()) +
                        " entries (limit " + std::to_string(kMaxSecAggEntries) + ")");
  }
}

void write_shares(capnp::List<wire::SecAggShare>::Builder out, const std::vector<SecAggShare>& in) {
  for (unsigned i = 0; i < in.size(); ++i) {
    out[i].setOwner(in[i].owner);
    out[i].setX(in[i].x);
    auto y = out[i].initY(static_cast<unsigned>(in[i].y.size()));
    for (unsigned j = 0; j < in[i].y.size(); ++j) y.set(j, in[i].y[j]);
  }
}
std::vector<SecAggShare> read_shares(capnp::List<wire::SecAggShare>::Reader in, const char* field) {
  check_entries(in, field);
  std::vector<SecAggShare> out;
  out.reserve(in.size());
  for (auto s : in) {
    if (s.getY().size() > kMaxLimbs) throw ProtocolError("secAgg: a share has too many limbs");
    SecAggShare share{.owner = s.getOwner(), .x = s.getX(), .y = {}};
    for (auto y : s.getY()) share.y.push_back(y);
    out.push_back(std::move(share));
  }
  return out;
}

std::string node_text(capnp::Text::Reader t) {
  if (t.size() > 256 || std::memchr(t.cStr(), '\0', t.size()) != nullptr)
    throw ProtocolError("secAgg: a member's node id is malformed");
  std::string node(t.cStr(), t.size());
  if (!node.empty() && !is_valid_node_id(node))
    throw ProtocolError("secAgg: a member's node id is not a valid node id");
  return node;
}

SecAggData read(wire::SecAggData::Reader r) {
  SecAggData out;
  check_entries(r.getMembers(), "members");
  for (auto m : r.getMembers()) {
    out.members.push_back({.id = m.getId(),
                           .node = node_text(m.getNode()),
                           .channel_key = get_key(m.getChannelKey(), "channelKey"),
                           .mask_key = get_key(m.getMaskKey(), "maskKey"),
                           .weight = m.getWeight()});
  }
  out.threshold = r.getThreshold();
  out.degree = r.getDegree();
  if (r.hasGraphSeed()) out.graph_seed = get_key(r.getGraphSeed(), "graphSeed");
  check_entries(r.getSealed(), "sealed");
  for (auto s : r.getSealed()) {
    auto c = s.getCiphertext();
    out.sealed.push_back(
        {.from = s.getFrom(), .to = s.getTo(), .ciphertext = {c.begin(), c.end()}});
  }
  check_entries(r.getSurvivors(), "survivors");
  for (auto id : r.getSurvivors()) out.survivors.push_back(id);
  out.self_mask = read_shares(r.getSelfMask(), "selfMask");
  out.mask_key = read_shares(r.getMaskKey(), "maskKey");
  check_entries(r.getSeeds(), "seeds");
  for (auto s : r.getSeeds()) {
    if (s.getSign() != 1 && s.getSign() != -1)
      throw ProtocolError("secAgg: a seed's sign is not ±1");
    out.seeds.push_back({.survivor = s.getSurvivor(),
                         .dropped = s.getDropped(),
                         .sign = s.getSign(),
                         .seed = get_key(s.getSeed(), "seed")});
  }
  out.vector_size = r.getVectorSize();
  out.clip = r.getClip();
  out.levels = r.getLevels();
  out.total_weight = r.getTotalWeight();
  return out;
}

}  // namespace

std::vector<std::byte> encode_secagg(const SecAggData& d) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::SecAggData>();
  auto members = r.initMembers(static_cast<unsigned>(d.members.size()));
  for (unsigned i = 0; i < d.members.size(); ++i) {
    const auto& m = d.members[i];
    members[i].setId(m.id);
    members[i].setNode(m.node);
    put_key(members[i].initChannelKey(32), m.channel_key);
    put_key(members[i].initMaskKey(32), m.mask_key);
    members[i].setWeight(m.weight);
  }
  r.setThreshold(d.threshold);
  r.setDegree(d.degree);
  put_key(r.initGraphSeed(32), d.graph_seed);
  auto sealed = r.initSealed(static_cast<unsigned>(d.sealed.size()));
  for (unsigned i = 0; i < d.sealed.size(); ++i) {
    sealed[i].setFrom(d.sealed[i].from);
    sealed[i].setTo(d.sealed[i].to);
    const auto& c = d.sealed[i].ciphertext;
    sealed[i].setCiphertext(kj::arrayPtr(c.data(), c.size()));
  }
  auto survivors = r.initSurvivors(static_cast<unsigned>(d.survivors.size()));
  for (unsigned i = 0; i < d.survivors.size(); ++i) survivors.set(i, d.survivors[i]);
  write_shares(r.initSelfMask(static_cast<unsigned>(d.self_mask.size())), d.self_mask);
  write_shares(r.initMaskKey(static_cast<unsigned>(d.mask_key.size())), d.mask_key);
  auto seeds = r.initSeeds(static_cast<unsigned>(d.seeds.size()));
  for (unsigned i = 0; i < d.seeds.size(); ++i) {
    seeds[i].setSurvivor(d.seeds[i].survivor);
    seeds[i].setDropped(d.seeds[i].dropped);
    seeds[i].setSign(d.seeds[i].sign);
    put_key(seeds[i].initSeed(32), d.seeds[i].seed);
  }
  r.setVectorSize(d.vector_size);
  r.setClip(d.clip);
  r.setLevels(d.levels);
  r.setTotalWeight(d.total_weight);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

SecAggData decode_secagg(std::span<const std::byte> bytes) {
  if (bytes.size() > kMaxSecAggBytes) {
    throw ProtocolError("secAgg data of " + std::to_string(bytes.size()) +
                        " bytes exceeds the limit of " + std::to_string(kMaxSecAggBytes));
  }
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0)
    throw ProtocolError("secAgg data is not a whole number of 8-byte words");
  kj::Array<capnp::word> aligned = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(aligned.begin(), bytes.data(), bytes.size());
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * aligned.size() + 1024;
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(aligned.asPtr(), options);
    return read(reader.getRoot<wire::SecAggData>());
  } catch (const kj::Exception& e) {
    throw ProtocolError("malformed secAgg data: " + std::string(e.getDescription().cStr()));
  }
}

}  // namespace cohort::transport
