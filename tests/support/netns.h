// Network namespaces for multi-host tests (root only): a switch namespace with a bridge and one
// namespace per host, joined to the bridge by a veth pair, on 10.77.<lab>.0/24. Links can be
// shaped (tbf bandwidth cap, nftables random loss) and cut (an nftables drop-all table) and
// restored. Processes run inside a host with `ip netns exec`, which execs the program, so the
// Process is the program itself. Every namespace is deleted by the destructor, also when a test
// fails; namespaces left by a lab whose process died (kill -9) are deleted by the next lab.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "process.h"

namespace cohort::test {

class NetLab {
 public:
  // Empty when labs can run here, else why not (not root, no `ip netns`, no nft or tc).
  static std::string unavailable();

  NetLab();
  ~NetLab();
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  // Adds host `name` with address 10.77.<lab>.<n> (n = 1, 2, ... in order of addition); returns it.
  std::string add_host(const std::string& name);
  [[nodiscard]] std::string address(const std::string& host) const;
  // Caps the host's link at `mbit` Mbit/s in both directions (tbf on both ends of its veth).
  void cap(const std::string& host, int mbit);
  // Drops `percent`% of the packets the host sends and of those it receives (nftables numgen).
  void lose(const std::string& host, int percent);
  // Packets lose() has dropped so far on the host, both directions.
  [[nodiscard]] std::uint64_t lost(const std::string& host) const;
  // Cuts the host off (every packet in and out dropped), or restores what cut() took away.
  void cut(const std::string& host);
  void restore(const std::string& host);

  // Starts `program args` inside the host's namespace.
  Process spawn(const std::string& host, const std::string& program,
                const std::vector<std::string>& args) const;

 private:
  struct Host {
    std::string name, ns, veth, peer, address;
  };
  const Host& host(const std::string& name) const;
  std::string prefix_;
  int lab_ = 0;
  std::string switch_ns_;
  std::vector<Host> hosts_;
};

// Runs a shell command line; throws std::runtime_error with its output if it fails.
std::string run_or_throw(const std::string& command);

}  // namespace cohort::test
