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

#include "cohort/core/config.h"

namespace cohort::client {

// Adds the keys of decentralized mode (client.mode, peer.*) to cohort-client's schema.
void add_peer_config(ConfigSchema& schema);

// Runs one peer until its steps are done and the coordinator closes the run (returns 0), or
// `stop` becomes true (says Bye, returns 0). Throws ConfigError / DataError for bad settings,
// TransportError when the coordinator refuses it or cannot be reached.
int run_peer(const Config& config, const std::atomic<bool>& stop);

}  // namespace cohort::client
