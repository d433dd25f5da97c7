// cohort-test-delay-relay: a TCP relay that delays every byte it forwards by DELAY +- JITTER
// milliseconds (uniform), in both directions, keeping the byte order: the latency of a long link,
// for tests on a kernel without the netem qdisc. Bandwidth is not limited here (use tbf).
//
// Usage: cohort-test-delay-relay LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS JITTER_MS
// Runs until killed; prints "relay ready" on stdout once it listens.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Piece {
  Clock::time_point due;
  std::vector<char> bytes;  // empty: the source closed
};

// One direction of one connection: a reader stamps what it reads with a due time, a writer
// sends it when due.
struct Direction {
  int from = -1, to = -1;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Piece> queue;
  bool failed = false;
};

struct Options {
  int delay_ms = 50, jitter_ms = 10;
};

void reader(std::shared_ptr<Direction> d, Options o, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> jitter(-o.jitter_ms, o.jitter_ms);
  Clock::time_point last_due{};
  std::vector<char> buf(64 * 1024);
  for (;;) {
    const ssize_t n = ::recv(d->from, buf.data(), buf.size(), 0);
    Piece p;
    const auto due = Clock::now() + std::chrono::milliseconds(o.delay_ms + jitter(rng));
    p.due = std::max(due, last_due);  // a later byte never overtakes an earlier one
    last_due = p.due;
    if (n > 0) p.bytes.assign(buf.begin(), buf.begin() + n);
    {
      std::lock_guard lock(d->mu);
      d->queue.push_back(std::move(p));
    }
    d->cv.notify_one();
    if (n <= 0) return;
  }
}

void writer(std::shared_ptr<Direction> d) {
  for (;;) {
    Piece p;
    {
      std::unique_lock lock(d->mu);
      d->cv.wait(lock, [&] { return !d->queue.empty(); });
      p = std::move(d->queue.front());
      d->queue.pop_front();
    }
    std::this_thread::sleep_until(p.due);
    if (p.bytes.empty()) {
      ::shutdown(d->to, SHUT_WR);
      return;
    }
    std::size_t sent = 0;
    while (sent < p.bytes.size()) {
      const ssize_t n = ::send(d->to, p.bytes.data() + sent, p.bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) {
        // The far side is gone: drop both directions.
        ::shutdown(d->to, SHUT_RDWR);
        ::shutdown(d->from, SHUT_RDWR);
        return;
      }
      sent += static_cast<std::size_t>(n);
    }
  }
}

sockaddr_in address(const char* host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host, &a.sin_addr) != 1) {
    std::fprintf(stderr, "cohort-test-delay-relay: bad address %s\n", host);
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: %s LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS JITTER_MS\n",
                 argv[0]);
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  const sockaddr_in listen_at = address(argv[1], std::atoi(argv[2]));
  const sockaddr_in target = address(argv[3], std::atoi(argv[4]));
  Options o{std::atoi(argv[5]), std::atoi(argv[6])};
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(ls, reinterpret_cast<const sockaddr*>(&listen_at), sizeof listen_at) != 0 ||
      ::listen(ls, 256) != 0) {
    std::perror("cohort-test-delay-relay: bind/listen");
    return 1;
  }
  std::printf("relay ready\n");
  std::fflush(stdout);
  unsigned seed = 1;
  for (;;) {
    const int in = ::accept(ls, nullptr, nullptr);
    if (in < 0) continue;
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(out, reinterpret_cast<const sockaddr*>(&target), sizeof target) != 0) {
      ::close(in);
      ::close(out);
      continue;
    }
    for (int fd : {in, out}) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto up = std::make_shared<Direction>();
    up->from = in;
    up->to = out;
    auto down = std::make_shared<Direction>();
    down->from = out;
    down->to = in;
    // The sockets stay open for the relay's life: a test's relay carries a handful of connections.
    std::thread(reader, up, o, seed++).detach();
    std::thread(writer, up).detach();
    std::thread(reader, down, o, seed++).detach();
    std::thread(writer, down).detach();
  }
}
