// The coordinator of a decentralized run (server.mode = decentralized; private to server/).
//
// No parameter server: it only handles rendezvous, membership and the topology. Peers register
// (role peer, listen_url = their own ROUTER); once decentralized.peers have registered, every
// peer gets a Welcome: its rank (client_index), the model spec, the member list (shards[r] =
// {rank, url, node id}; an empty url marks a rank that is gone), the training settings
// (training_toml: the [decentralized] section) and the step to start at (current_round). Peers
// heartbeat with their step; a peer silent for server.client_timeout_ms (or that says Bye) is
// marked gone and everyone gets the new member list; one that registers again under the same
// node id gets its rank back and starts at the current step. The run ends when every live peer
// has sent its final report: the coordinator sends RoundClose, prints one JSON summary line to
// stdout and returns 0.
#pragma once

#include <atomic>

#include "server_options.h"

namespace cohort::transport {
class Context;
}

namespace cohort::server {

// Checks options.decentralized and the model first (a ConfigError before binding).
int run_rendezvous(const RendezvousOptions& options, const std::atomic<bool>& stop,
                   transport::Context& ctx);

}  // namespace cohort::server
