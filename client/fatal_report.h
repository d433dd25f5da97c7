// A client or peer that stops for good tells its coordinator why (ClientReport.fatal) before it
// exits, so the server names it at once instead of waiting out deadlines. Internal to the client
// library.
#pragma once

#include <cstdint>
#include <string>

namespace cohort::transport {
class Endpoint;
}

namespace cohort::client {

// Sends ClientReport{round, fatal = true, message = why} to `coordinator` and gives the I/O thread
// a moment to put it on the wire (the socket closes without lingering). A send that fails is
// logged as `who`'s warning, never thrown.
void send_fatal_report(transport::Endpoint& coordinator, std::uint64_t round,
                       const std::string& why, const std::string& who);

}  // namespace cohort::client
