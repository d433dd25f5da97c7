#include "fatal_report.h"

#include <chrono>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/transport/endpoint.h"

namespace cohort::client {

void send_fatal_report(transport::Endpoint& coordinator, std::uint64_t round,
                       const std::string& why, const std::string& who) {
  using namespace std::chrono_literals;
  transport::ClientReport r;
  r.round = round;
  r.fatal = true;
  r.message = why;
  transport::Envelope e;
  e.round = round;
  e.body = std::move(r);
  try {
    (void)coordinator.send({}, std::move(e));
    (void)coordinator.receive(300ms);
  } catch (const Error& err) {
    COHORT_LOG(Warn) << who << ": could not tell the coordinator: " << err.what();
  }
}

}  // namespace cohort::client
