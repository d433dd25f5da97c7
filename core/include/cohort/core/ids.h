// Node identities. A node id is the name in its certificate's subject (CN): the transport refuses
// a peer whose certificate names another node than the one it claims.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cohort {

// Node ids are 1-64 characters from [A-Za-z0-9._-], e.g. "shard-0", "client-17".
using NodeId = std::string;

// Index of a client in a federation (its position in the registration order of the coordinator).
using ClientId = std::uint32_t;

[[nodiscard]] bool is_valid_node_id(std::string_view id);
// Throws ConfigError naming the id and the rule when it is not valid.
void validate_node_id(std::string_view id);

}  // namespace cohort
