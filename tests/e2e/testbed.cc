#include "tests/e2e/testbed.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ddprun::e2e {

namespace {

constexpr const char* kArpThresh2 = "/proc/sys/net/ipv4/neigh/default/gc_thresh2";
constexpr const char* kArpThresh3 = "/proc/sys/net/ipv4/neigh/default/gc_thresh3";

long ReadLong(const char* path) {
  std::ifstream in(path);
  long value = -1;
  in >> value;
  return in ? value : -1;
}

void WriteLong(const char* path, long value) { std::ofstream(path) << value << "\n"; }

constexpr const char* kNamePrefix = "ddprun-tb";
// Every bed uses the same subnets: each lives in namespaces of its own, which nothing routes
// into, so two beds (parallel test processes) never meet. 10.213 and 10.214 are NetnsPair's.
constexpr const char* kDataNet = "10.215.0.";
constexpr const char* kMgmtNet = "10.216.0.";
// Real hosts name their NICs differently (udev's predictable names), so a job file cannot name
// one interface for all of them.
const char* const kDataInterfaces[] = {"ens3", "eth1", "enp2s0", "eno2", "ens5", "eth3"};

}  // namespace

int ShellOutput(const std::string& command, std::string* output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::string text;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, n);
  const int status = ::pclose(pipe);
  if (output) *output = std::move(text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {

/// The pid in a bed's namespace name ("ddprun-tb<tag>-<pid>-<part>"), or -1.
pid_t PidOfNamespace(const std::string& name) {
  if (name.rfind(kNamePrefix, 0) != 0) return -1;
  const size_t first = name.find('-', std::string(kNamePrefix).size());
  if (first == std::string::npos) return -1;
  const size_t second = name.find('-', first + 1);
  if (second == std::string::npos) return -1;
  const std::string digits = name.substr(first + 1, second - first - 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return static_cast<pid_t>(std::stol(digits));
}

/// Kills what still runs in namespace `ns` (started by this test, or by the dead test process
/// whose bed this is), so that deleting it frees everything at once.
void KillProcessesIn(const std::string& ns) {
  std::string pids;
  if (ShellOutput("ip netns pids " + ns, &pids) != 0) return;
  std::istringstream in(pids);
  pid_t pid = 0;
  while (in >> pid) {
    if (pid > 1 && pid != ::getpid()) ::kill(pid, SIGKILL);
  }
}

void DeleteNamespace(const std::string& ns) {
  KillProcessesIn(ns);
  Shell("ip netns del " + ns);  // its veths go with it, and their peers in the other namespaces
}

/// Removes the beds of test processes that are gone (killed by a CTest timeout, say).
void RemoveAbandonedBeds() {
  for (const std::string& ns : Testbed::AllNamespaces()) {
    const pid_t pid = PidOfNamespace(ns);
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) DeleteNamespace(ns);
  }
}

}  // namespace

std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::vector<std::string> Testbed::AllNamespaces() {
  std::string list;
  std::vector<std::string> out;
  if (ShellOutput("ip netns list", &list) != 0) return out;
  std::istringstream in(list);
  std::string line;
  while (std::getline(in, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kNamePrefix, 0) == 0) out.push_back(name);
  }
  return out;
}

std::unique_ptr<Testbed> Testbed::Create(const TestbedOptions& options, std::string* why) {
  if (::geteuid() != 0) {
    *why =
        "the multi-host test bed needs root (network, UTS and mount namespaces); run the e2e tests as root";
    return nullptr;
  }
  for (const char* tool : {"ip", "unshare", "mount", "hostname"}) {
    if (Shell(std::string("command -v ") + tool) != 0) {
      *why = std::string("the multi-host test bed needs `") + tool + "`, which is not installed";
      return nullptr;
    }
  }
  if (options.hosts < 1 || options.hosts > 250) throw std::invalid_argument("Testbed: 1..250 hosts");
  RemoveAbandonedBeds();

  std::unique_ptr<Testbed> bed(new Testbed());
  bed->prefix_ = std::string(kNamePrefix) + options.tag + "-" + std::to_string(::getpid()) + "-";
  // Linux keeps one ARP table for every network namespace of the machine, bounded by
  // gc_thresh3 (1024 by default): a bed of 64 hosts that all talk to each other needs 4,032
  // entries, and past the bound the kernel drops packets ("neighbor table overflow"), which the
  // hosts see as connections timing out. Real hosts each have their own table. Raised for the
  // bed's life, then set back.
  const long needed = 2L * options.hosts * options.hosts + 1024;
  const long thresh3 = ReadLong(kArpThresh3);
  if (thresh3 > 0 && thresh3 < needed) {
    bed->arp_thresholds_ = {ReadLong(kArpThresh2), thresh3};
    WriteLong(kArpThresh2, needed / 2);
    WriteLong(kArpThresh3, needed);
  }
  std::string templ = (std::filesystem::temp_directory_path() / "ddprun-testbed-XXXXXX").string();
  if (!::mkdtemp(templ.data())) {
    *why = "cannot make a scratch folder for the test bed";
    return nullptr;
  }
  bed->root_ = templ;
  bed->home_ = bed->root_ + "/home";
  bed->shared_home_ = options.shared_home;
  std::filesystem::create_directories(bed->home_);
  std::filesystem::create_directories(bed->root_ + "/nfs");

  // Each step names what failed, so that a machine that cannot do it says which part.
  auto step = [&](const std::string& command) {
    std::string output;
    if (ShellOutput(command, &output) == 0) return true;
    *why = "cannot build the multi-host test bed here: `" + command + "` failed: " + output;
    return false;
  };
  auto add_namespace = [&](const std::string& ns) {
    if (!step("ip netns add " + ns)) return false;
    bed->namespaces_.push_back(ns);
    return step("ip -n " + ns + " link set lo up");
  };
  const std::string sw = bed->prefix_ + "sw";
  const std::string dead_end = bed->prefix_ + "mgmt";
  if (!add_namespace(sw) || !add_namespace(dead_end) || !step("ip -n " + sw + " link add br0 type bridge") ||
      !step("ip -n " + sw + " link set br0 up")) {
    return nullptr;
  }
  for (int i = 0; i < options.hosts; ++i) {
    TestHost host;
    host.index = i;
    host.name = (i + 1 < 10 ? "gpu-0" : "gpu-") + std::to_string(i + 1);
    host.netns = bed->prefix_ + "h" + std::to_string(i);
    host.mgmt_if = "eno1";
    host.mgmt_addr = kMgmtNet + std::to_string(i + 1);
    constexpr size_t kNames = sizeof kDataInterfaces / sizeof kDataInterfaces[0];
    host.data_if = static_cast<size_t>(i) < kNames ? kDataInterfaces[i] : "eth" + std::to_string(i + 10);
    host.data_addr = kDataNet + std::to_string(i + 1);
    const std::string& ns = host.netns;
    const std::string mgmt_peer = "m" + std::to_string(i), data_peer = "h" + std::to_string(i);
    const bool made = add_namespace(ns) &&
                      // The management NIC first: its peer sits alone in the dead-end namespace, carrier up,
                      // bridged to nothing, so its subnet looks alive and reaches no other host.
                      step("ip -n " + ns + " link add " + host.mgmt_if + " type veth peer name " + mgmt_peer +
                           " netns " + dead_end) &&
                      step("ip -n " + dead_end + " link set " + mgmt_peer + " up") &&
                      step("ip -n " + ns + " addr add " + host.mgmt_addr + "/24 dev " + host.mgmt_if) &&
                      step("ip -n " + ns + " link set " + host.mgmt_if + " up") &&
                      step("ip -n " + ns + " link add " + host.data_if + " type veth peer name " + data_peer +
                           " netns " + sw) &&
                      step("ip -n " + sw + " link set " + data_peer + " master br0") &&
                      step("ip -n " + sw + " link set " + data_peer + " up") &&
                      step("ip -n " + ns + " addr add " + host.data_addr + "/24 dev " + host.data_if) &&
                      step("ip -n " + ns + " link set " + host.data_if + " up");
    if (!made) return nullptr;
    std::filesystem::create_directories(bed->root_ + "/disk-" + std::to_string(i));
    bed->hosts_.push_back(host);
  }
  for (int i = 0; i < options.hosts; ++i) bed->SetHostsFile(i, bed->StockHostsFile(i));
  // A bed that cannot run a program on a host (no UTS or mount namespaces) says so now.
  std::string output;
  if (bed->Run(0, "hostname", &output) != 0 || output != bed->hosts_[0].name + "\n") {
    *why = "cannot run a program on a test bed host (unshare --uts --mount): " + output;
    return nullptr;
  }
  return bed;
}

Testbed::~Testbed() {
  for (const std::string& ns : namespaces_) DeleteNamespace(ns);
  if (arp_thresholds_.second > 0) {
    WriteLong(kArpThresh3, arp_thresholds_.second);
    WriteLong(kArpThresh2, arp_thresholds_.first);
  }
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

std::string Testbed::HomeOf(int i) const {
  return shared_home_ ? root_ + "/nfs" : root_ + "/disk-" + std::to_string(host(i).index);
}

std::string Testbed::Write(const std::string& name, const std::string& text) const {
  for (const TestHost& h : hosts_) {
    const auto full = std::filesystem::path(HomeOf(h.index)) / name;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream(full) << text;
    if (shared_home_) break;
  }
  return home_ + "/" + name;
}

std::string Testbed::Read(int i, const std::string& name) const {
  std::ifstream in(std::filesystem::path(HomeOf(i)) / name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Testbed::StockHostsFile(int i) const {
  std::ostringstream t;
  t << "127.0.0.1\tlocalhost\n127.0.1.1\t" << host(i).name << "\n\n"
    << "# The following lines are desirable for IPv6 capable hosts\n"
    << "::1     localhost ip6-localhost ip6-loopback\nff02::1 ip6-allnodes\nff02::2 ip6-allrouters\n\n";
  for (const TestHost& other : hosts_) {
    if (other.index != i) t << other.data_addr << "\t" << other.name << "\n";
  }
  return t.str();
}

void Testbed::SetHostsFile(int i, const std::string& text) const {
  std::ofstream(root_ + "/hosts-" + std::to_string(i)) << text;
}

std::vector<std::string> Testbed::Prefix(int i) const {
  const TestHost& h = host(i);
  // `ip netns exec` enters the network namespace; unshare gives the program a host name and
  // mounts of its own (private: nothing propagates back to this machine's /etc/hosts).
  return {"ip",
          "netns",
          "exec",
          h.netns,
          "unshare",
          "--uts",
          "--mount",
          "--propagation",
          "private",
          "sh",
          "-c",
          "hostname \"$1\" && mount --bind \"$2\" /etc/hosts && mount --bind \"$3\" \"$4\" && cd \"$4\" && "
          "shift 4 && exec \"$@\"",
          "sh",
          h.name,
          root_ + "/hosts-" + std::to_string(i),
          HomeOf(i),
          home_};
}

int Testbed::Run(int i, const std::string& command, std::string* output) const {
  std::string line;
  for (const std::string& part : Prefix(i)) line += ShellQuote(part) + " ";
  line += "sh -c " + ShellQuote(command);
  return ShellOutput(line, output);
}

bool Testbed::AddInputRule(int i, const std::string& rule) const {
  return Shell("ip netns exec " + host(i).netns + " iptables -A INPUT " + rule) == 0;
}

bool Testbed::AcceptTcpOnly(int i, const std::vector<uint16_t>& ports) const {
  bool ok = AddInputRule(i, "-i lo -j ACCEPT") &&
            AddInputRule(i, "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT");
  for (uint16_t port : ports)
    ok = ok && AddInputRule(i, "-p tcp --dport " + std::to_string(port) + " -j ACCEPT");
  return ok && AddInputRule(i, "-p tcp -j DROP");
}

}  // namespace ddprun::e2e
