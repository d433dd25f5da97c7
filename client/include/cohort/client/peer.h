// A decentralized peer (cohort-client --mode decentralized): no parameter server.
//
// The peer binds its own ZeroMQ ROUTER (peer.listen), registers with the coordinator (a
// cohort-server started with server.mode = decentralized, which only does rendezvous, membership
// and the topology) and waits for its Welcome: its rank, the member list, the model and the
// [decentralized] training settings. It then loads its part of the data (the partition in those
// settings, split over the members), and for every step trains one minibatch and mixes with its
// neighbours directly, over the same mutual-TLS + AES-GCM transport (plaintext only with
// tls.insecure). It heartbeats its step to the coordinator and applies membership updates: a
// neighbour that is gone is dropped from mixing (weights renormalized), one that comes back
// rejoins at the step the coordinator names. At the end it evaluates on the test set, reports,
// prints one JSON line and waits for the coordinator's close.
// Not thread-safe: run_peer() drives everything from the calling thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/client/data_source.h"
#include "cohort/core/config.h"
#include "cohort/transport/endpoint.h"

namespace cohort::client {

// Adds the keys of decentralized mode (client.mode, peer.*) to cohort-client's schema.
void add_peer_config(ConfigSchema& schema);

// What a decentralized peer runs with: filled from the Config (and checked) only by
// peer_options_from(); the peer never reads the Config.
struct PeerOptions {
  std::string name;              // client.name
  std::string server;            // client.server: the coordinator (rendezvous)
  std::string coordinator_name;  // tls.coordinator_name (named when its handshake fails)
  std::string listen;            // peer.listen
  std::string advertise;         // peer.advertise; empty: the bound url
  // Neighbours' connections (expected_peer empty: ZmqComm pins each one's name), with
  // peer.handshake_timeout_ms; the coordinator's (expected_peer = coordinator_name) likewise.
  transport::EndpointOptions neighbours;
  transport::EndpointOptions coordinator;
  std::chrono::milliseconds connect_timeout{120000};
  std::chrono::milliseconds step_delay{0};
  std::uint64_t data_seed = 1;
  std::string partition = "iid";  // data.partition, checked; the coordinator's setting wins
  DataOptions data;            // data.* (data_source.h); data.scale = auto standardizes IDX pixels
  std::string device = "cpu";  // client.device; made (and so checked) by the peer
  std::size_t threads = 1;     // client.threads
};

// Reads and checks every key the peer uses, refusing the federated-only ones (ConfigError), so a
// bad option never takes a rank in the run.
PeerOptions peer_options_from(const Config& config);

// Runs one peer until its steps are done and the coordinator closes the run (returns 0), or
// `stop` becomes true (says Bye, returns 0). Throws ConfigError / DataError for a bad device or
// data, TransportError when the coordinator refuses it or cannot be reached.
int run_peer(const PeerOptions& options, const std::atomic<bool>& stop);

}  // namespace cohort::client
