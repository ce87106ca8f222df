// [cluster]: the nodes, node 0's address and ports, and the workers per node.
#include <arpa/inet.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schema/sections.h"

namespace ddprun {
namespace {

bool IsIpAddress(const std::string& text) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, text.c_str(), buffer) == 1 || inet_pton(AF_INET6, text.c_str(), buffer) == 1;
}

// RFC 1123 host names; underscores are tolerated because some sites use them and the
// resolver accepts them. All-numeric dotted names must be real IPv4 addresses.
bool IsHostName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  bool numeric = true;
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      const std::string_view label = name.substr(label_start, i - label_start);
      if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
        return false;
      }
      label_start = i + 1;
      continue;
    }
    const char c = name[i];
    const bool digit = c >= '0' && c <= '9';
    if (!digit) numeric = false;
    if (!(digit || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_')) {
      return false;
    }
  }
  return !numeric;
}

bool IsHostOrIp(const std::string& text) { return IsIpAddress(text) || IsHostName(text); }

// cluster.nodes: host names or addresses, each once. False when any is wrong.
bool LoadNodes(const toml::node& node, TomlReader& reader, std::vector<std::string>& out) {
  const KeySpec& key = Key("cluster.nodes");
  const size_t max_nodes = static_cast<size_t>(Key("cluster.nnodes").range->max);
  Diagnostics& diags = reader.diags();
  const toml::array* array = node.as_array();
  if (!array) {
    reader.TypeError(node, "cluster.nodes", "an array of host names",
                     "e.g. nodes = [\"gpu-01\", \"gpu-02\"]");
    return false;
  }
  if (array->size() < key.min_items) {
    diags.Error(LocOf(node), "cluster.nodes", "cluster.nodes must list at least one host");
    return false;
  }
  if (array->size() > max_nodes) {
    diags.Error(LocOf(node), "cluster.nodes",
                fmt::format("cluster.nodes lists more than {} hosts", max_nodes));
    return false;
  }
  bool ok = true;
  std::map<std::string, std::pair<size_t, SourceLoc>> seen;
  std::vector<std::string> hosts;
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = fmt::format("cluster.nodes[{}]", i);
    const toml::node& item = *array->get(i);
    reader.Record(path, item);
    auto host = reader.String(item, path, /*allow_empty=*/!key.nonempty_items);
    if (!host) {
      ok = false;
      continue;
    }
    if (!IsHostOrIp(*host)) {
      diags.Error(LocOf(item), path,
                  fmt::format("{} = {} is neither an IP address nor a host name", path, Show(item)),
                  "write an address like \"10.10.10.16\" or a host name like \"gpu-01\"");
      ok = false;
      continue;
    }
    if (auto it = seen.find(*host); it != seen.end()) {
      diags.Error(LocOf(item), path,
                  fmt::format("host {} is listed twice in cluster.nodes (nodes {} and {})", Show(item),
                              it->second.first, i),
                  "each node runs one agent; list every host once");
      diags.AddNote(it->second.second, fmt::format("first listed here as node {}", it->second.first));
      ok = false;
      continue;
    }
    seen[*host] = {i, LocOf(item)};
    hosts.push_back(*host);
  }
  if (ok) out = std::move(hosts);
  return ok;
}

// cluster.hosts_from = "slurm": the allocation's hosts in place of cluster.nodes, asked of
// `slurm_hosts` (the CLI runs `scontrol show hostnames`). Outside an allocation the job keeps
// its count (nnodes, else 1) without names, and a warning says so: `check` on a login node.
// Returns whether cluster.nodes was filled.
bool LoadHostsFromSlurm(const toml::table& table, const toml::node& from_node, TomlReader& reader,
                        const std::function<Result<std::vector<std::string>>()>& slurm_hosts,
                        std::optional<int> num_nodes, JobSpec::Cluster& c) {
  Diagnostics& diags = reader.diags();
  const auto from = reader.String(from_node, "cluster.hosts_from");
  if (!from) return false;
  if (*from != "slurm") {
    diags.Error(LocOf(from_node), "cluster.hosts_from",
                fmt::format("cluster.hosts_from = {} is not a source of hosts ddprun knows", Show(from_node)),
                "the one source is \"slurm\" (the allocation the job runs in)");
    return false;
  }
  c.hosts_from_slurm = true;
  if (const toml::node* nodes_node = reader.Node(&table, "nodes", "cluster.nodes")) {
    diags.Error(LocOf(*nodes_node), "cluster.nodes",
                "cluster.nodes and cluster.hosts_from both give the hosts",
                "keep one: the listed hosts, or hosts_from = \"slurm\" for the allocation's");
    return false;
  }
  const toml::node* nnodes_node = reader.Node(&table, "nnodes", "cluster.nnodes");
  std::optional<int64_t> nnodes;
  if (nnodes_node) nnodes = reader.Integer(*nnodes_node, "cluster.nnodes", *Key("cluster.nnodes").range);
  if (!slurm_hosts) {
    c.nnodes = nnodes ? static_cast<int>(*nnodes) : num_nodes.value_or(1);
    diags.Warning(LocOf(from_node), "cluster.hosts_from",
                  fmt::format("not in a SLURM allocation (SLURM_JOB_NODELIST is not set): the hosts "
                              "are known only under srun or sbatch; shown here as {} node{} without names",
                              c.nnodes, c.nnodes == 1 ? "" : "s"),
                  "run `ddprun check` inside the allocation (salloc) to see its hosts");
    return false;
  }
  auto hosts = slurm_hosts();
  if (!hosts) {
    diags.Error(LocOf(from_node), "cluster.hosts_from",
                "cannot read the SLURM allocation's hosts: " + hosts.error());
    return false;
  }
  const size_t max_nodes = static_cast<size_t>(Key("cluster.nnodes").range->max);
  if (hosts->empty() || hosts->size() > max_nodes) {
    diags.Error(LocOf(from_node), "cluster.hosts_from",
                fmt::format("the SLURM allocation has {} hosts (1..{} allowed)", hosts->size(), max_nodes));
    return false;
  }
  for (const std::string& host : *hosts) {
    if (!IsHostOrIp(host)) {
      diags.Error(LocOf(from_node), "cluster.hosts_from",
                  fmt::format("the SLURM allocation names host \"{}\", which is not a host name", host));
      return false;
    }
  }
  c.nodes = *std::move(hosts);
  c.nnodes = static_cast<int>(c.nodes.size());
  if (nnodes && *nnodes != c.nnodes) {
    diags.Error(LocOf(*nnodes_node), "cluster.nnodes",
                fmt::format("cluster.nnodes = {} but the SLURM allocation has {} host{} ({})", *nnodes,
                            c.nnodes, c.nnodes == 1 ? "" : "s", fmt::join(c.nodes, ", ")),
                "ask SLURM for that many nodes (sbatch -N), or remove cluster.nnodes");
    return false;
  }
  return true;
}

// cluster.nodes and cluster.nnodes: one of them, and they agree when both are given.
// Returns whether cluster.nodes was read.
bool LoadNodeCount(const toml::table& table, TomlReader& reader,
                   const std::function<Result<std::vector<std::string>>()>& slurm_hosts,
                   std::optional<int> num_nodes, JobSpec::Cluster& c) {
  if (const toml::node* from_node = reader.Node(&table, "hosts_from", "cluster.hosts_from")) {
    return LoadHostsFromSlurm(table, *from_node, reader, slurm_hosts, num_nodes, c);
  }
  const toml::node* nodes_node = reader.Node(&table, "nodes", "cluster.nodes");
  const bool nodes_ok = nodes_node && LoadNodes(*nodes_node, reader, c.nodes);

  const toml::node* nnodes_node = reader.Node(&table, "nnodes", "cluster.nnodes");
  std::optional<int64_t> nnodes;
  if (nnodes_node) nnodes = reader.Integer(*nnodes_node, "cluster.nnodes", *Key("cluster.nnodes").range);

  if (!nodes_node && !nnodes_node) {
    reader.diags().Error(LocOf(table), "cluster.nodes", "[cluster] needs either `nodes` or `nnodes`",
                         "list the hosts, nodes = [\"gpu-01\", \"gpu-02\"], or give their "
                         "number, nnodes = 2");
  }
  if (nodes_ok) {
    c.nnodes = static_cast<int>(c.nodes.size());
    if (nnodes && *nnodes != c.nnodes) {
      reader.diags().Error(LocOf(*nnodes_node), "cluster.nnodes",
                           fmt::format("cluster.nnodes = {} does not match the {} hosts of "
                                       "cluster.nodes",
                                       *nnodes, c.nnodes),
                           fmt::format("remove cluster.nnodes (it is len(cluster.nodes)) or set "
                                       "it to {}",
                                       c.nnodes));
    }
  } else if (nnodes && !nodes_node) {
    c.nnodes = static_cast<int>(*nnodes);
  }
  return nodes_ok;
}

// master_addr must be node 0, which hosts the coordinator: an error when it is another node,
// a warning when it is none of them (ddprun cannot tell whether it is an address of node 0).
void CheckMasterAmongNodes(const toml::node& addr_node, const JobSpec::Cluster& c, Diagnostics& diags) {
  auto it = std::find(c.nodes.begin(), c.nodes.end(), c.master_addr);
  if (it == c.nodes.begin()) return;
  if (it != c.nodes.end()) {
    const auto index = it - c.nodes.begin();
    diags.Error(LocOf(addr_node), "cluster.master_addr",
                fmt::format("cluster.master_addr = \"{}\" is node {}, but node 0 (\"{}\") "
                            "hosts the coordinator",
                            c.master_addr, index, c.nodes.front()),
                fmt::format("list \"{}\" first in cluster.nodes, or set master_addr to an "
                            "address of \"{}\"",
                            c.master_addr, c.nodes.front()));
    return;
  }
  diags.Warning(LocOf(addr_node), "cluster.master_addr",
                fmt::format("cluster.master_addr = \"{}\" is not one of cluster.nodes", c.master_addr),
                fmt::format("it must be an address of node 0 (\"{}\"), where the coordinator "
                            "listens; ddprun cannot check that",
                            c.nodes.front()));
}

void LoadMasterAddr(const toml::table& table, TomlReader& reader, bool nodes_ok, JobSpec::Cluster& c) {
  const toml::node* node = reader.Node(&table, "master_addr", "cluster.master_addr");
  if (!node) {
    c.master_addr = nodes_ok ? c.nodes.front() : "127.0.0.1";
    return;
  }
  auto addr = reader.String(*node, "cluster.master_addr");
  if (!addr) return;
  if (!IsHostOrIp(*addr)) {
    reader.diags().Error(LocOf(*node), "cluster.master_addr",
                         fmt::format("cluster.master_addr = {} is neither an IP address nor a "
                                     "host name",
                                     Show(*node)),
                         "write an address like \"10.10.10.16\" or a host name like \"gpu-01\" "
                         "(IPv6 without brackets)");
    return;
  }
  c.master_addr = *addr;
  if (nodes_ok) CheckMasterAmongNodes(*node, c, reader.diags());
}

void LoadPorts(const toml::table& table, TomlReader& reader, JobSpec::Cluster& c) {
  if (const toml::node* node = reader.Node(&table, "master_port", "cluster.master_port")) {
    if (auto port = reader.Integer(*node, "cluster.master_port", *Key("cluster.master_port").range)) {
      c.master_port = static_cast<uint16_t>(*port);
      if (*port < 1024) {
        reader.diags().Warning(LocOf(*node), "cluster.master_port",
                               fmt::format("cluster.master_port = {} is a privileged port", *port),
                               "binding it needs root; ports 1024..65535 do not");
      }
    }
  }
  if (const toml::node* node = reader.Node(&table, "store_port", "cluster.store_port")) {
    auto port = reader.Integer(*node, "cluster.store_port", *Key("cluster.store_port").range);
    if (!port) return;
    if (*port == c.master_port) {
      reader.diags().Error(LocOf(*node), "cluster.store_port",
                           fmt::format("cluster.store_port = {} is the same as "
                                       "cluster.master_port",
                                       *port),
                           "the store needs a port of its own; remove store_port to relay the "
                           "store through master_port");
    } else {
      c.store_port = static_cast<uint16_t>(*port);
    }
  }
}

// cluster.spares: host names with `nodes` (each a host not in nodes), a count with `nnodes`.
void LoadSpares(const toml::table& table, TomlReader& reader, bool nodes_ok, JobSpec::Cluster& c) {
  const toml::node* node = reader.Node(&table, "spares", "cluster.spares");
  if (!node) return;
  const KeySpec& key = Key("cluster.spares");
  if (node->is_integer()) {
    if (!c.nodes.empty() || nodes_ok) {
      reader.diags().Error(LocOf(*node), "cluster.spares",
                           "cluster.spares is a count only with cluster.nnodes; with cluster.nodes, "
                           "list the spare hosts",
                           "e.g. spares = [\"gpu-09\"]");
      return;
    }
    if (auto n = reader.Integer(*node, "cluster.spares", *key.range)) c.spares = static_cast<int>(*n);
    return;
  }
  const toml::array* array = node->as_array();
  if (!array) {
    reader.TypeError(*node, "cluster.spares", "an array of host names (or a count with nnodes)",
                     "e.g. spares = [\"gpu-09\"]");
    return;
  }
  if (!nodes_ok) {
    reader.diags().Error(LocOf(*node), "cluster.spares",
                         "cluster.spares lists hosts, but cluster.nodes does not",
                         "with cluster.nnodes give a count, e.g. spares = 1, and start the spare's "
                         "agent with --node-rank <nnodes>");
    return;
  }
  if (array->size() > static_cast<size_t>(key.range->max)) {
    reader.diags().Error(LocOf(*node), "cluster.spares",
                         fmt::format("cluster.spares lists more than {} hosts", key.range->max));
    return;
  }
  std::vector<std::string> hosts;
  bool ok = true;
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = fmt::format("cluster.spares[{}]", i);
    const toml::node& item = *array->get(i);
    reader.Record(path, item);
    auto host = reader.String(item, path);
    if (!host) {
      ok = false;
      continue;
    }
    if (!IsHostOrIp(*host)) {
      reader.diags().Error(LocOf(item), path,
                           fmt::format("{} = {} is neither an IP address nor a host name", path, Show(item)));
      ok = false;
      continue;
    }
    const bool in_nodes = std::find(c.nodes.begin(), c.nodes.end(), *host) != c.nodes.end();
    const bool twice = std::find(hosts.begin(), hosts.end(), *host) != hosts.end();
    if (in_nodes || twice) {
      reader.diags().Error(LocOf(item), path,
                           in_nodes ? fmt::format("spare host {} is also in cluster.nodes", Show(item))
                                    : fmt::format("spare host {} is listed twice", Show(item)),
                           "each host runs one agent: a node or a spare");
      ok = false;
      continue;
    }
    hosts.push_back(*host);
  }
  if (!ok) return;
  c.spare_hosts = std::move(hosts);
  c.spares = static_cast<int>(c.spare_hosts.size());
}

// cluster.min_nodes: 1..nnodes; nnodes when not given.
void LoadMinNodes(const toml::table& table, TomlReader& reader, JobSpec::Cluster& c) {
  c.min_nodes = c.nnodes;
  const toml::node* node = reader.Node(&table, "min_nodes", "cluster.min_nodes");
  if (!node) return;
  auto n = reader.Integer(*node, "cluster.min_nodes", *Key("cluster.min_nodes").range);
  if (!n || c.nnodes <= 0) return;
  if (*n > c.nnodes) {
    reader.diags().Error(LocOf(*node), "cluster.min_nodes",
                         fmt::format("cluster.min_nodes = {} is more than the job's {} node{}", *n, c.nnodes,
                                     c.nnodes == 1 ? "" : "s"),
                         fmt::format("min_nodes is the fewest nodes a round may run with: at most "
                                     "{}; remove it to need every node in every round",
                                     c.nnodes));
    return;
  }
  c.min_nodes = static_cast<int>(*n);
}

}  // namespace

ClusterFacts LoadCluster(const toml::table& root, TomlReader& reader, const JobSpec::Trainer& trainer,
                         const TrainerFacts& trainer_facts,
                         const std::function<Result<std::vector<std::string>>()>& slurm_hosts,
                         JobSpec::Cluster& cluster) {
  ClusterFacts facts;
  const toml::table* table = reader.Table(root, "cluster", "cluster");
  if (!table) {
    if (!root.get("cluster")) {
      reader.diags().Error({}, "cluster", "missing required table [cluster]",
                           "add [cluster] with nodes = [\"host-a\", \"host-b\"] (or nnodes = 2)");
    }
    return facts;
  }
  reader.CheckKeys(*table, SectionNamed("cluster"), "cluster");
  const bool nodes_ok = LoadNodeCount(*table, reader, slurm_hosts, trainer.num_nodes, cluster);
  LoadMasterAddr(*table, reader, nodes_ok, cluster);
  LoadPorts(*table, reader, cluster);
  LoadSpares(*table, reader, nodes_ok, cluster);
  LoadMinNodes(*table, reader, cluster);

  facts.nproc_per_node = reader.Node(table, "nproc_per_node", "cluster.nproc_per_node");
  if (facts.nproc_per_node) {
    if (auto n = reader.Integer(*facts.nproc_per_node, "cluster.nproc_per_node",
                                *Key("cluster.nproc_per_node").range)) {
      cluster.nproc_per_node = static_cast<int>(*n);
    }
  } else if (!trainer_facts.devices_failed) {
    cluster.nproc_per_node = trainer.devices.value_or(1);
  }
  return facts;
}

}  // namespace ddprun
