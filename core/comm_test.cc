#include "cohort/core/comm.h"

#include <doctest/doctest.h>

#include <thread>

#include "cohort/core/error.h"

using namespace std::chrono_literals;

namespace cohort {
namespace {

TEST_CASE("in-memory comm delivers per sender and tag, FIFO within a key") {
  InMemoryNetwork net(3);
  std::vector<float> a{1, 2, 3}, b{4, 5};
  send_floats(net.comm(0), 2, 7, a);
  send_floats(net.comm(1), 2, 7, b);
  send_floats(net.comm(0), 2, 8, b);
  send_floats(net.comm(0), 2, 7, b);
  std::vector<float> out3(3), out2(2);
  // A later tag first: the earlier messages wait.
  REQUIRE(recv_floats(net.comm(2), 0, 8, out2, 1s));
  CHECK(out2 == b);
  REQUIRE(recv_floats(net.comm(2), 1, 7, out2, 1s));
  CHECK(out2 == b);
  REQUIRE(recv_floats(net.comm(2), 0, 7, out3, 1s));
  CHECK(out3 == a);
  REQUIRE(recv_add_floats(net.comm(2), 0, 7, out2, 1s));
  CHECK(out2 == std::vector<float>{8, 10});
  CHECK_FALSE(recv_floats(net.comm(2), 0, 7, out2, 10ms));
  CHECK(net.comm(0).bytes_sent() == 28);
  CHECK(net.comm(2).bytes_received() == 36);
}

TEST_CASE("in-memory comm: size mismatch is a ProtocolError, self-send a bug") {
  InMemoryNetwork net(2);
  std::vector<float> a{1, 2, 3}, out(2);
  send_floats(net.comm(0), 1, 1, a);
  CHECK_THROWS_AS((void)recv_floats(net.comm(1), 0, 1, out, 1s), ProtocolError);
  CHECK_THROWS_AS(send_floats(net.comm(0), 0, 1, a), InternalError);
  CHECK_THROWS_AS(send_floats(net.comm(0), 5, 1, a), TransportError);
}

TEST_CASE("in-memory comm across threads, and a killed rank drops out") {
  InMemoryNetwork net(2);
  std::thread peer([&] {
    std::vector<float> v(1000);
    for (int i = 0; i < 100; ++i) {
      if (!recv_floats(net.comm(1), 0, i, v, 10s)) return;  // the main thread's check fails
      v[0] += 1;
      send_floats(net.comm(1), 0, i, v);
    }
  });
  std::vector<float> v(1000, 0.0f);
  for (int i = 0; i < 100; ++i) {
    send_floats(net.comm(0), 1, i, v);
    REQUIRE(recv_floats(net.comm(0), 1, i, v, 10s));
  }
  peer.join();
  CHECK(v[0] == 100.0f);

  net.kill(1);
  CHECK_FALSE(net.alive(1));
  send_floats(net.comm(0), 1, 0, v);  // lost
  CHECK_FALSE(recv_floats(net.comm(0), 1, 0, v, 10ms));
  net.revive(1);
  send_floats(net.comm(0), 1, 3, v);
  CHECK(recv_floats(net.comm(1), 0, 3, v, 1s));
}

}  // namespace
}  // namespace cohort
