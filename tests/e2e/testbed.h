#pragma once
// A cluster of N hosts on one machine for end-to-end tests: each host is a network, UTS and
// mount namespace with its own host name, its own Debian-style /etc/hosts, a data NIC on a
// shared bridge, a management NIC on a network no other host reaches, optional firewall rules
// and a home folder that is either its own or shared by all hosts (an NFS home). Agents and
// other programs run "on" a host through Prefix(). Everything the bed makes is removed by its
// destructor, and a bed left behind by a killed test process is removed by the next one.
//
// Layout (k from the test process's pid, i the host's index):
//   host i:      namespace ddprun-tb<tag>-<pid>-h<i>, host name gpu-0<i+1>
//                management NIC "eno1", 10.216.k.(i+1)/24, its peer alone in a dead-end namespace
//                data NIC (a name that differs per host: ens3, eth1, enp2s0, ...), 10.215.k.(i+1)/24
//   switch:      namespace ddprun-tb<tag>-<pid>-sw, a bridge joining the data NICs
// The management NIC is made first, so it comes first in the host's interface list, as the
// on-board NIC does on many servers: a library that picks "the first interface that is not
// loopback" picks the wrong one.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {

struct TestbedOptions {
  int hosts = 3;
  /// A short word (letters only) in the namespace names, so that a reader of `ip netns` sees
  /// which test made them.
  std::string tag;
  /// One folder seen by every host at home() (an NFS home); else each host has its own.
  bool shared_home = false;
};

struct TestHost {
  int index = 0;
  std::string name;       // host name (UTS): gpu-01, gpu-02, ...
  std::string netns;      // network namespace
  std::string data_if;    // the NIC its peers reach it at; the name differs between hosts
  std::string data_addr;  // that NIC's address
  std::string mgmt_if;    // the management NIC: no other host reaches it
  std::string mgmt_addr;
};

class Testbed {
 public:
  /// nullptr and `why` when this machine cannot host the bed (not root, no iproute2, no
  /// namespaces, no veth or bridge): for DDPRUN_REQUIRE_OR_SKIP("testbed", ...) with the reason.
  static std::unique_ptr<Testbed> Create(const TestbedOptions& options, std::string* why);
  ~Testbed();
  Testbed(const Testbed&) = delete;
  Testbed& operator=(const Testbed&) = delete;

  const std::vector<TestHost>& hosts() const { return hosts_; }
  const TestHost& host(int i) const { return hosts_.at(static_cast<size_t>(i)); }

  /// The folder every host sees as its home (the same path on each host): the place for job
  /// files, scripts and logs. Programs run on a host start there.
  const std::string& home() const { return home_; }
  /// Writes `name` (relative to home()) with `text` into every host's home; returns the path
  /// as the hosts see it.
  std::string Write(const std::string& name, const std::string& text) const;
  /// The file `name` (relative to home()) as host `i` sees it; "" when missing.
  std::string Read(int i, const std::string& name) const;
  /// Where host `i`'s home lies as this test process sees it (for directory walks).
  std::string HomeOf(int i) const;

  /// The /etc/hosts a stock Debian or Ubuntu host has: localhost, its own name on 127.0.1.1,
  /// the IPv6 lines, and the other hosts' names on their data addresses.
  std::string StockHostsFile(int i) const;
  /// Replaces host `i`'s /etc/hosts (programs started after this see it).
  void SetHostsFile(int i, const std::string& text) const;

  /// The command prefix that runs a program on host `i`: its network namespace, its host name,
  /// its /etc/hosts and home, started in home(). For AgentProcess's `prefix`.
  std::vector<std::string> Prefix(int i) const;
  /// Runs `command` with sh on host `i`; its exit status, its output (stdout and stderr) in
  /// `output` when given.
  int Run(int i, const std::string& command, std::string* output = nullptr) const;

  /// Adds a firewall rule on host `i`: the arguments of `iptables -A INPUT`, e.g.
  /// "-p tcp --dport 80 -j DROP". False when iptables refused it.
  bool AddInputRule(int i, const std::string& rule) const;
  /// Host `i` accepts new TCP connections only on `ports` (loopback, established connections
  /// and everything else but TCP stay open): "the firewall is opened for MASTER_PORT".
  bool AcceptTcpOnly(int i, const std::vector<uint16_t>& ports) const;

  /// Namespace names of every bed on this machine, this one's included (for the self-test).
  static std::vector<std::string> AllNamespaces();

 private:
  Testbed() = default;
  std::string prefix_;  // of every namespace name of this bed
  std::string root_;    // the bed's own scratch folder
  std::string home_;
  bool shared_home_ = false;
  std::vector<TestHost> hosts_;
  std::vector<std::string> namespaces_;         // made so far, for the destructor
  std::pair<long, long> arp_thresholds_{0, 0};  // gc_thresh2 and 3 as found, when the bed raised them
};

/// Runs `command` with sh on this machine; its exit status (-1 when it could not run), and its
/// output (stdout and stderr) in `output` when given.
int ShellOutput(const std::string& command, std::string* output);

/// `text` quoted for sh.
std::string ShellQuote(const std::string& text);

}  // namespace ddprun::e2e
