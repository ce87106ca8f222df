// [rendezvous]: where the job's coordination state lives. "etcd" needs the endpoints, every
// agent's host (each may come to hold the coordinator and rank 0), and a lease the agents can
// wait out within timeouts.rendezvous.
#include <algorithm>

#include <fmt/format.h>

#include "base/parse_int.h"
#include "schema/sections.h"

namespace ddprun {
namespace {

constexpr std::string_view kEndpointHint =
    "write the client URL of an etcd member, e.g. \"http://10.0.0.1:2379\" (etcd's "
    "--advertise-client-urls)";

// Why `url` is not "http(s)://HOST:PORT"; nullopt when it is.
std::optional<std::string> EndpointProblem(std::string_view url) {
  std::string_view rest;
  if (url.starts_with("http://")) {
    rest = url.substr(7);
  } else if (url.starts_with("https://")) {
    rest = url.substr(8);
  } else {
    return "it must begin with http:// or https://";
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) return "it must not have a path";
  size_t colon = rest.rfind(':');
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || colon < close) return "it needs a port: [ADDR]:PORT";
  }
  if (colon == std::string_view::npos || colon == 0) return "it needs a host and a port";
  const std::string_view port = rest.substr(colon + 1);
  const auto number = ParseNonNegative(port, 65535);
  if (port.empty() || !number || *number == 0) return fmt::format("\"{}\" is not a port (1..65535)", port);
  return std::nullopt;
}

void LoadEndpoints(const toml::node& node, TomlReader& reader, std::vector<std::string>& out) {
  const toml::array* array = node.as_array();
  if (!array) {
    reader.TypeError(node, "rendezvous.endpoints", "an array of URLs",
                     "e.g. endpoints = [\"http://10.0.0.1:2379\", \"http://10.0.0.2:2379\"]");
    return;
  }
  if (array->empty()) {
    reader.diags().Error(LocOf(node), "rendezvous.endpoints",
                         "rendezvous.endpoints must list at least one etcd member",
                         std::string(kEndpointHint));
    return;
  }
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = fmt::format("rendezvous.endpoints[{}]", i);
    const toml::node& item = *array->get(i);
    reader.Record(path, item);
    const auto url = reader.String(item, path);
    if (!url) continue;
    if (auto problem = EndpointProblem(*url)) {
      reader.diags().Error(LocOf(item), "rendezvous.endpoints",
                           fmt::format("rendezvous.endpoints: \"{}\" is not an etcd URL: {}", *url, *problem),
                           std::string(kEndpointHint));
      continue;
    }
    if (std::find(out.begin(), out.end(), *url) != out.end()) {
      reader.diags().Error(LocOf(item), "rendezvous.endpoints",
                           fmt::format("rendezvous.endpoints lists \"{}\" twice", *url));
      continue;
    }
    out.push_back(*url);
  }
}

void ReadString(const toml::table* table, TomlReader& reader, std::string_view key, std::string& out) {
  const std::string path = Dotted("rendezvous", key);
  if (const toml::node* node = reader.Node(table, key, path)) {
    if (auto text = reader.String(*node, path)) out = *text;
  }
}

/// rendezvous.prefix: the etcd keys' prefix, "/" then letters, digits, '.', '_', '-', '/'.
void LoadPrefix(const toml::table* table, TomlReader& reader, std::string& prefix_out) {
  const toml::node* node = reader.Node(table, "prefix", "rendezvous.prefix");
  if (!node) return;
  const auto prefix = reader.String(*node, "rendezvous.prefix");
  if (!prefix) return;
  if (!prefix->starts_with('/') ||
      prefix->find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789._/-") != std::string::npos) {
    reader.diags().Error(
        LocOf(*node), "rendezvous.prefix",
        fmt::format("rendezvous.prefix = \"{}\" is not a key prefix", *prefix),
        "it begins with / and holds letters, digits, '.', '_', '-' and '/', e.g. \"/ddprun\"");
    return;
  }
  prefix_out = *prefix;
}

}  // namespace

void LoadRendezvous(const toml::table& root, TomlReader& reader, const JobSpec::Cluster& cluster,
                    const JobSpec::Timeouts& timeouts, JobSpec::Rendezvous& rendezvous) {
  const toml::table* table = reader.Table(root, "rendezvous", "rendezvous");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("rendezvous"), "rendezvous");
  Diagnostics& diags = reader.diags();
  const toml::node* backend_node = reader.Node(table, "backend", "rendezvous.backend");
  if (backend_node) {
    if (auto backend = reader.String(*backend_node, "rendezvous.backend")) {
      if (*backend == "etcd") {
        rendezvous.backend = JobSpec::Rendezvous::Backend::kEtcd;
      } else if (*backend != "agent") {
        diags.Error(LocOf(*backend_node), "rendezvous.backend",
                    fmt::format("rendezvous.backend = \"{}\" is not a backend", *backend),
                    "write \"agent\" (node 0's agent keeps the state; the default) or \"etcd\"");
      }
    }
  }
  const toml::node* endpoints_node = reader.Node(table, "endpoints", "rendezvous.endpoints");
  if (endpoints_node) LoadEndpoints(*endpoints_node, reader, rendezvous.endpoints);
  LoadPrefix(table, reader, rendezvous.prefix);
  const toml::node* lease_node = reader.Node(table, "lease", "rendezvous.lease");
  if (lease_node) {
    if (auto d = reader.PositiveDuration(*lease_node, "rendezvous.lease")) rendezvous.lease = *d;
  }
  ReadString(table, reader, "ca_file", rendezvous.ca_file);
  ReadString(table, reader, "cert_file", rendezvous.cert_file);
  ReadString(table, reader, "key_file", rendezvous.key_file);
  ReadString(table, reader, "user", rendezvous.user);
  if (const toml::node* node = reader.Node(table, "probe", "rendezvous.probe")) {
    using Probe = JobSpec::Rendezvous::Probe;
    reader.ReadChoice(*node, "rendezvous.probe",
                      std::array{std::pair{std::string_view("refuse"), Probe::kRefuse},
                                 std::pair{std::string_view("warn"), Probe::kWarn},
                                 std::pair{std::string_view("off"), Probe::kOff}},
                      "\"refuse\" (the default) ends the job before the first round when two nodes cannot "
                      "connect on a port other than master_port; \"warn\" says so and starts it",
                      rendezvous.probe);
  }

  if (!rendezvous.Etcd()) {
    if (endpoints_node) {
      diags.Warning(LocOf(*endpoints_node), "rendezvous.endpoints",
                    "rendezvous.endpoints is unused: rendezvous.backend is \"agent\"",
                    "add backend = \"etcd\" under [rendezvous] to keep the job's state in etcd");
    }
    return;
  }
  const SourceLoc at = LocOf(backend_node ? *backend_node : static_cast<const toml::node&>(*table));
  if (!endpoints_node) {
    diags.Error(at, "rendezvous.endpoints", "rendezvous.backend = \"etcd\" needs rendezvous.endpoints",
                "e.g. endpoints = [\"http://10.0.0.1:2379\", \"http://10.0.0.2:2379\", "
                "\"http://10.0.0.3:2379\"]");
  }
  if (cluster.nnodes > 0 && (cluster.nodes.empty() || (cluster.spares > 0 && cluster.spare_hosts.empty()))) {
    diags.Error(at, "rendezvous.backend",
                fmt::format("rendezvous.backend = \"etcd\" needs every agent's host: {}",
                            cluster.nodes.empty() ? "cluster.nodes is not listed"
                                                  : "cluster.spares is a count, not a list of hosts"),
                "any agent may come to hold the coordinator and rank 0, and the others reach it at "
                "its host's address: list the hosts in cluster.nodes (and cluster.spares)");
  }
  if (!rendezvous.cert_file.empty() != !rendezvous.key_file.empty()) {
    diags.Error(
        reader.LocationOf(rendezvous.cert_file.empty() ? "rendezvous.key_file" : "rendezvous.cert_file"),
        rendezvous.cert_file.empty() ? "rendezvous.key_file" : "rendezvous.cert_file",
        "rendezvous.cert_file and rendezvous.key_file go together",
        "give both (a client certificate and its key), or neither");
  }
  const bool any_https = std::any_of(rendezvous.endpoints.begin(), rendezvous.endpoints.end(),
                                     [](const std::string& url) { return url.starts_with("https://"); });
  if (!any_https && (!rendezvous.ca_file.empty() || !rendezvous.cert_file.empty())) {
    diags.Warning(
        reader.LocationOf(rendezvous.ca_file.empty() ? "rendezvous.cert_file" : "rendezvous.ca_file"),
        rendezvous.ca_file.empty() ? "rendezvous.cert_file" : "rendezvous.ca_file",
        "TLS files are unused: no endpoint is https://",
        "write the endpoints as https://HOST:PORT to talk to etcd over TLS");
  }
  const SourceLoc lease_at = lease_node ? LocOf(*lease_node) : at;
  if (rendezvous.lease < Seconds(5)) {
    diags.Error(lease_at, "rendezvous.lease",
                fmt::format("rendezvous.lease = \"{}\" is too short", FormatDuration(rendezvous.lease)),
                "the coordinator renews it every third of it and steps down a fifth of it before it "
                "ends; a renewal must outlast an etcd leader election and a call's 3s bound: give "
                "at least 5s (\"10s\" is the default)");
  } else if (rendezvous.lease >= timeouts.rendezvous) {
    diags.Error(lease_at, "rendezvous.lease",
                fmt::format("rendezvous.lease = \"{}\" is not shorter than timeouts.rendezvous = \"{}\"",
                            FormatDuration(rendezvous.lease), FormatDuration(timeouts.rendezvous)),
                "when the coordinator's host is lost, the agents wait timeouts.rendezvous for a new "
                "one, which can take over only once the lease has ended: shorten the lease or "
                "lengthen timeouts.rendezvous");
  }
}

}  // namespace ddprun
