#include "rendezvous.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/aggregation/decentralized.h"
#include "cohort/client/partition.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/transport/endpoint.h"
#include "options.h"

namespace cohort::server {

namespace {

using Clock = std::chrono::steady_clock;
using transport::Envelope;

struct Member {
  NodeId node_id;
  std::string url;
  transport::PeerHandle handle;
  Clock::time_point last_seen;
  bool alive = false;
  bool reported = false;
  std::uint64_t clock = 0;
  transport::ClientReport report;
};

// One value of a free-form section as TOML text. ConfigSection does not expose the type, so try
// the getters from the strictest: each throws ConfigError on another type.
std::string toml_value(const ConfigSection& s, const std::string& name) {
  try {
    return s.get_bool(name, false) ? "true" : "false";
  } catch (const ConfigError&) {
  }
  try {
    return std::to_string(s.get_int(name, 0));
  } catch (const ConfigError&) {
  }
  try {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", s.get_double(name, 0));
    std::string text = buf;
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
    return text;
  } catch (const ConfigError&) {
  }
  std::string escaped = "\"";
  for (char c : s.get_string(name, "")) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return escaped + "\"";
}

// The [decentralized] section as TOML, so that every peer trains with the same settings.
std::string section_toml(const ConfigSection& s) {
  std::ostringstream out;
  for (const auto& name : s.names()) {
    out << name << " = " << toml_value(s, name) << '\n';
  }
  return out.str();
}

class Rendezvous {
 public:
  Rendezvous(const RendezvousOptions& options, transport::Endpoint& ep)
      : ep_(ep), section_(options.decentralized) {
    expected_ = aggregation::decentralized_settings_from(section_).peers;  // checked already
    model_spec_ = options.model_spec;
    (void)kernels::make_network_spec(model_spec_);  // validates early
    training_toml_ = section_toml(section_);
    heartbeat_ms_ = options.heartbeat_ms;
    timeout_ = options.client_timeout;
  }

  // Returns the exit code once every live peer has reported, or nullopt to go on.
  std::optional<int> poll(std::chrono::milliseconds wait) {
    if (auto m = ep_.receive(wait)) on_message(std::move(*m));
    check_timeouts();
    if (started_ && !members_.empty()) {
      bool all = true, any = false;
      for (const auto& m : members_) {
        if (m.alive) {
          any = true;
          all = all && m.reported;
        }
      }
      if (!any) {
        COHORT_LOG(Error) << "every peer is gone";
        return 1;
      }
      if (all) return finish();
    }
    return std::nullopt;
  }

 private:
  void on_message(transport::Message m) {
    const NodeId who = m.sender;
    if (const auto* r = std::get_if<transport::Register>(&m.envelope.body)) {
      on_register(m.peer, who, *r);
      return;
    }
    Member* mem = find(who);
    if (mem == nullptr) return;
    mem->last_seen = Clock::now();
    mem->handle = m.peer;
    if (const auto* h = std::get_if<transport::Heartbeat>(&m.envelope.body)) {
      mem->clock = h->clock;
      max_clock_ = std::max(max_clock_, h->clock);
      if (!mem->alive && started_ && !mem->url.empty()) {
        // Dropped for silence but still there (a long stall): take it back in.
        mem->alive = true;
        start_step_ = max_clock_ + 2;
        COHORT_LOG(Info) << "peer " << who << " is heartbeating again: back in the topology";
        broadcast_members();
      }
    } else if (const auto* rep = std::get_if<transport::ClientReport>(&m.envelope.body);
               rep && rep->fatal) {
      // The peer stopped for good: out of the topology now, not after client_timeout_ms.
      COHORT_LOG(Error) << "peer " << who << " stopped: " << rep->message;
      if (mem->alive) {
        mem->alive = false;
        if (started_) broadcast_members();
      }
    } else if (const auto* rep = std::get_if<transport::ClientReport>(&m.envelope.body)) {
      mem->reported = true;
      mem->report = *rep;
      COHORT_LOG(Info) << "peer " << who << " finished: test accuracy " << rep->eval_accuracy;
    } else if (std::get_if<transport::Bye>(&m.envelope.body)) {
      if (mem->alive && !mem->reported) {
        mem->alive = false;
        COHORT_LOG(Info) << "peer " << who << " left";
        broadcast_members();
      }
    }
  }

  Member* find(const NodeId& id) {
    for (auto& m : members_) {
      if (m.node_id == id) return &m;
    }
    return nullptr;
  }

  void on_register(const transport::PeerHandle& handle, const NodeId& who,
                   const transport::Register& r) {
    if (r.role != transport::Role::kPeer) {
      refuse(handle,
             "this coordinator runs a decentralized job: register as a peer "
             "(cohort-client --mode decentralized)");
      return;
    }
    if (r.listen_url.empty()) {
      refuse(handle, "a peer must announce its listen url");
      return;
    }
    Member* mem = find(who);
    const bool rejoin = mem != nullptr;
    if (!mem) {
      if (started_ || static_cast<std::int64_t>(members_.size()) >= expected_) {
        refuse(handle, "the decentralized job is full (" + std::to_string(expected_) + " peers)");
        return;
      }
      members_.push_back({});
      mem = &members_.back();
      mem->node_id = who;
    }
    const bool changed = !mem->alive || mem->url != r.listen_url;
    mem->url = r.listen_url;
    mem->handle = handle;
    mem->alive = true;
    mem->reported = false;
    mem->last_seen = Clock::now();
    COHORT_LOG(Info) << "peer " << who << (rejoin ? " rejoined" : " registered") << " at "
                     << r.listen_url << " (" << members_.size() << "/" << expected_ << ")";
    if (!started_ && static_cast<std::int64_t>(members_.size()) == expected_) {
      started_ = true;
      COHORT_LOG(Info) << "all " << expected_ << " peers here: starting";
      broadcast_members();
    } else if (started_) {
      if (changed) {
        start_step_ = max_clock_ + 2;  // ahead of everyone: they take it back from there
        broadcast_members();
      } else {
        welcome(*mem);  // a repeated Register: answer it alone
      }
    }
  }

  void refuse(const transport::PeerHandle& handle, const std::string& why) {
    Envelope e;
    e.body = transport::ErrorBody{transport::ErrorCode::kUnauthorized, why, 0};
    (void)ep_.send(handle, std::move(e));
    COHORT_LOG(Warn) << "refused a peer: " << why;
  }

  void welcome(const Member& m) {
    transport::Welcome w;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (&members_[i] == &m) w.client_index = static_cast<std::uint32_t>(i);
      transport::ShardInfo s;
      s.index = static_cast<std::uint32_t>(i);
      s.url = members_[i].alive ? members_[i].url : "";
      s.node_id = members_[i].node_id;
      w.shards.push_back(std::move(s));
    }
    w.model_spec = model_spec_;
    w.model_size = kernels::make_network_spec(model_spec_).parameter_count();
    w.current_round = start_step_;
    w.heartbeat_ms = heartbeat_ms_;
    w.training_toml = training_toml_;
    Envelope e;
    e.round = ++epoch_;
    e.body = std::move(w);
    (void)ep_.send(m.handle, std::move(e));
  }

  void broadcast_members() {
    for (const auto& m : members_) {
      if (m.alive) welcome(m);
    }
  }

  void check_timeouts() {
    const auto now = Clock::now();
    bool changed = false;
    for (auto& m : members_) {
      if (m.alive && !m.reported && now - m.last_seen > timeout_) {
        m.alive = false;
        changed = true;
        COHORT_LOG(Warn) << "peer " << m.node_id << " silent for " << timeout_.count()
                         << " ms: dropped from the topology";
      }
    }
    if (changed && started_) broadcast_members();
  }

  int finish() {
    std::size_t reported = 0, gone = 0;
    double acc = 0;
    for (const auto& m : members_) {
      if (m.alive && m.reported) {
        ++reported;
        acc += m.report.eval_accuracy;
      } else {
        ++gone;
      }
    }
    for (const auto& m : members_) {
      if (!m.alive) continue;
      Envelope e;
      e.body = transport::RoundClose{max_clock_, true, static_cast<std::uint32_t>(reported)};
      (void)ep_.send(m.handle, std::move(e));
    }
    std::printf(
        "{\"decentralized\":\"done\",\"peers\":%zu,\"finished\":%zu,\"gone\":%zu,"
        "\"mean_test_accuracy\":%.6f}\n",
        members_.size(), reported, gone, reported ? acc / static_cast<double>(reported) : 0.0);
    std::fflush(stdout);
    return 0;
  }

  transport::Endpoint& ep_;
  ConfigSection section_;
  std::int64_t expected_ = 0;
  std::string model_spec_, training_toml_;
  std::uint32_t heartbeat_ms_ = 1000;
  std::chrono::milliseconds timeout_{10000};
  std::vector<Member> members_;  // index = rank
  bool started_ = false;
  std::uint64_t max_clock_ = 0, start_step_ = 0, epoch_ = 0;
};

}  // namespace

int run_rendezvous(const RendezvousOptions& options, const std::atomic<bool>& stop,
                   transport::Context& ctx) {
  // Every key and value, at start-up, before binding: an unknown key or a bad option stops the
  // server before any peer registers, instead of every peer failing after its Welcome.
  (void)aggregation::decentralized_settings_from(
      options.decentralized,
      [](const std::string& spec) { (void)client::parse_partition_spec(spec); });
  (void)kernels::make_network_spec(options.model_spec);
  auto ep = transport::Endpoint::bind(ctx, options.listen, options.endpoint);
  if (const auto& path = options.port_file; !path.empty()) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      if (!out) throw ConfigError("cannot write server.port_file " + path);
      out << ep.url().substr(ep.url().rfind(':') + 1) << '\n';
    }
    std::filesystem::rename(tmp, path);
  }
  COHORT_LOG(Info) << "decentralized rendezvous listening on " << ep.url()
                   << (ep.is_secure() ? " (TLS)" : " (plaintext)");
  Rendezvous r(options, ep);
  while (!stop.load()) {
    if (auto rc = r.poll(std::chrono::milliseconds(200))) {
      // Give the RoundClose messages a moment to leave before the socket closes.
      const auto until = Clock::now() + std::chrono::milliseconds(500);
      while (Clock::now() < until) (void)ep.receive(std::chrono::milliseconds(50));
      return *rc;
    }
  }
  return 0;
}

}  // namespace cohort::server
