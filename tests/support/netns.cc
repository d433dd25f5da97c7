#include "netns.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

namespace cohort::test {

namespace {

// Namespaces of this helper are named "cohortlab-<pid>-<host>".
constexpr const char* kPrefix = "cohortlab-";

std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return {};
}

int run_status(const std::string& command, std::string* output) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 512> buf{};
  std::string out;
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  const int status = ::pclose(pipe);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> list_namespaces() {
  std::vector<std::string> out;
  std::string text;
  if (run_status("ip netns list", &text) != 0) return out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto space = line.find(' ');
    out.push_back(line.substr(0, space));
  }
  return out;
}

// Deletes namespaces of labs whose process is gone.
void remove_stale() {
  for (const auto& ns : list_namespaces()) {
    if (ns.rfind(kPrefix, 0) != 0) continue;
    const auto rest = ns.substr(std::string(kPrefix).size());
    const auto dash = rest.find('-');
    if (dash == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    if (pid > 0 && ::kill(pid, 0) != 0) run_status("ip netns del " + ns, nullptr);
  }
}

}  // namespace

std::string run_or_throw(const std::string& command) {
  std::string out;
  const int rc = run_status(command, &out);
  if (rc != 0) {
    throw std::runtime_error("'" + command + "' failed (" + std::to_string(rc) + "): " + out);
  }
  return out;
}

std::string NetLab::unavailable() {
  if (::geteuid() != 0) return "needs root (network namespaces)";
  if (ip_binary().empty()) return "no ip binary (install iproute2)";
  const std::string probe = std::string(kPrefix) + std::to_string(::getpid()) + "-probe";
  if (run_status("ip netns add " + probe, nullptr) != 0) return "`ip netns add` does not work here";
  std::string why;
  if (run_status("ip netns exec " + probe + " nft list ruleset", nullptr) != 0) {
    why = "nft does not work inside a namespace (install nftables)";
  } else if (run_status("ip netns exec " + probe + " tc qdisc show", nullptr) != 0) {
    why = "tc does not work inside a namespace (install iproute2)";
  }
  run_status("ip netns del " + probe, nullptr);
  return why;
}

NetLab::NetLab() {
  remove_stale();
  static int labs = 0;
  lab_ = (static_cast<int>(::getpid()) * 3 + labs++) % 200 + 20;
  prefix_ = std::string(kPrefix) + std::to_string(::getpid()) + "-";
  switch_ns_ = prefix_ + "sw" + std::to_string(lab_);
  try {
    run_or_throw("ip netns add " + switch_ns_);
    run_or_throw("ip -n " + switch_ns_ + " link add br0 type bridge");
    run_or_throw("ip -n " + switch_ns_ + " link set br0 up");
  } catch (...) {
    run_status("ip netns del " + switch_ns_, nullptr);
    throw;
  }
}

NetLab::~NetLab() {
  for (const auto& h : hosts_) run_status("ip netns del " + h.ns, nullptr);
  run_status("ip netns del " + switch_ns_, nullptr);
}

std::string NetLab::add_host(const std::string& name) {
  Host h;
  h.name = name;
  h.ns = prefix_ + name;
  const std::string tag = std::to_string(lab_) + "h" + std::to_string(hosts_.size());
  h.veth = "v" + tag;  // inside the host
  h.peer = "p" + tag;  // on the bridge
  h.address = "10.77." + std::to_string(lab_) + "." + std::to_string(hosts_.size() + 1);
  hosts_.push_back(h);  // from here on the destructor deletes its namespace
  run_or_throw("ip netns add " + h.ns);
  run_or_throw("ip link add " + h.veth + " netns " + h.ns + " type veth peer name " + h.peer +
               " netns " + switch_ns_);
  run_or_throw("ip -n " + switch_ns_ + " link set " + h.peer + " master br0 up");
  run_or_throw("ip -n " + h.ns + " addr add " + h.address + "/24 dev " + h.veth);
  run_or_throw("ip -n " + h.ns + " link set " + h.veth + " up");
  run_or_throw("ip -n " + h.ns + " link set lo up");
  return h.address;
}

const NetLab::Host& NetLab::host(const std::string& name) const {
  for (const auto& h : hosts_) {
    if (h.name == name) return h;
  }
  throw std::runtime_error("no host " + name + " in this lab");
}

std::string NetLab::address(const std::string& name) const { return host(name).address; }

void NetLab::cap(const std::string& name, int mbit) {
  const Host& h = host(name);
  const std::string tbf = " root tbf rate " + std::to_string(mbit) + "mbit burst 32kbit latency 400ms";
  run_or_throw("ip netns exec " + h.ns + " tc qdisc replace dev " + h.veth + tbf);
  run_or_throw("ip netns exec " + switch_ns_ + " tc qdisc replace dev " + h.peer + tbf);
}

void NetLab::lose(const std::string& name, int percent) {
  const Host& h = host(name);
  const std::string rule = "'numgen random mod 100 < " + std::to_string(percent) + " counter drop'";
  run_or_throw("ip netns exec " + h.ns + " nft add table inet cohort_loss");
  run_or_throw("ip netns exec " + h.ns +
               " nft add chain inet cohort_loss in '{ type filter hook input priority 0; }'");
  run_or_throw("ip netns exec " + h.ns +
               " nft add chain inet cohort_loss out '{ type filter hook output priority 0; }'");
  run_or_throw("ip netns exec " + h.ns + " nft add rule inet cohort_loss in " + rule);
  run_or_throw("ip netns exec " + h.ns + " nft add rule inet cohort_loss out " + rule);
}

std::uint64_t NetLab::lost(const std::string& name) const {
  const std::string text = run_or_throw("ip netns exec " + host(name).ns + " nft list table inet cohort_loss");
  std::uint64_t total = 0;
  for (auto at = text.find("packets "); at != std::string::npos; at = text.find("packets ", at + 1)) {
    total += std::stoull(text.substr(at + 8));
  }
  return total;
}

void NetLab::cut(const std::string& name) {
  const Host& h = host(name);
  // Loopback stays up: only what crosses the host's link is dropped.
  const std::string in = "iifname \"" + h.veth + "\" drop";
  const std::string out = "oifname \"" + h.veth + "\" drop";
  run_or_throw("ip netns exec " + h.ns + " nft add table inet cohort_cut");
  run_or_throw("ip netns exec " + h.ns +
               " nft add chain inet cohort_cut in '{ type filter hook input priority -10; }'");
  run_or_throw("ip netns exec " + h.ns +
               " nft add chain inet cohort_cut out '{ type filter hook output priority -10; }'");
  run_or_throw("ip netns exec " + h.ns + " nft add rule inet cohort_cut in '" + in + "'");
  run_or_throw("ip netns exec " + h.ns + " nft add rule inet cohort_cut out '" + out + "'");
}

void NetLab::restore(const std::string& name) {
  run_or_throw("ip netns exec " + host(name).ns + " nft delete table inet cohort_cut");
}

Process NetLab::spawn(const std::string& name, const std::string& program,
                      const std::vector<std::string>& args) const {
  std::vector<std::string> all{"netns", "exec", host(name).ns, program};
  all.insert(all.end(), args.begin(), args.end());
  return Process::spawn(ip_binary(), all);
}

}  // namespace cohort::test
