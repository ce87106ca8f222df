#include "schema/canonical.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <openssl/evp.h>

#include "base/hex.h"
#include "schema/worker_env.h"

namespace ddprun {
namespace {

// JSON string quoting, so a value with spaces, quotes or newlines stays on one line and two
// different strings never print the same.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          out += fmt::format("\\u{:04x}", byte);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string QuoteList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += Quote(items[i]);
  }
  return out + "]";
}

}  // namespace

// Typed spelling: `8` and `"8"` and `8.0` are different jobs to Lightning, so they differ here.
std::string TrainerCanonical(const TrainerValue& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return fmt::format("{}", i); }
    std::string operator()(double d) const { return fmt::format("{}f", d); }
    std::string operator()(const std::string& s) const { return Quote(s); }
    std::string operator()(const std::vector<int64_t>& v) const {
      return fmt::format("[{}]", fmt::join(v, ", "));
    }
    std::string operator()(const TrainerLiteral& literal) const { return literal.canonical; }
  };
  return std::visit(Visitor{}, value.value);
}

std::string CanonicalQuote(std::string_view text) { return Quote(text); }

namespace {

// "key = value" lines back into a map; lines without " = " are ignored.
std::map<std::string, std::string> ParseCanonical(const std::string& canonical) {
  std::map<std::string, std::string> fields;
  size_t start = 0;
  while (start < canonical.size()) {
    size_t end = canonical.find('\n', start);
    if (end == std::string::npos) end = canonical.size();
    std::string_view line(canonical.data() + start, end - start);
    size_t eq = line.find(" = ");
    if (eq != std::string_view::npos) {
      fields[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 3));
    }
    start = end + 1;
  }
  return fields;
}

}  // namespace

namespace {

/// The [job] section's canonical lines (with what the code and library checks found) into
/// `fields`.
void AddJobFields(const JobSpec& spec, std::map<std::string, std::string>& fields) {
  fields["version"] = fmt::format("{}", spec.version);
  fields["job.name"] = Quote(spec.job.name);
  // The arguments after `--` apart (only when given, so that other jobs keep their
  // fingerprint): a node started with other ones is told so.
  const size_t extra = std::min(spec.script_args.size(), spec.job.command.size());
  fields["job.command"] = QuoteList(std::vector<std::string>(
      spec.job.command.begin(), spec.job.command.end() - static_cast<std::ptrdiff_t>(extra)));
  if (!spec.script_args.empty()) fields["job.script_args"] = QuoteList(spec.script_args);
  fields["job.workdir"] = Quote(spec.job.workdir);
  for (const auto& [name, value] : spec.job.env) fields["job.env." + name] = Quote(value);
  // Only when on, so that files without it keep their fingerprint. The code fields then make
  // nodes with another script or commit disagree, and the join refusal names them.
  // With "warn" they are advisory: compared and named at join, left out of the fingerprint.
  if (spec.job.code_check != JobSpec::CodeCheck::kOff) {
    const bool refuse = spec.job.code_check == JobSpec::CodeCheck::kRefuse;
    const std::string prefix = refuse ? "code." : std::string(kAdvisoryPrefix) + "code.";
    fields["job.code_check"] = Quote(refuse ? "refuse" : "warn");
    fields[prefix + "script"] = Quote(spec.job.code.script);
    fields[prefix + "script_sha256"] = Quote(spec.job.code.script_sha256);
    fields[prefix + "git_commit"] = Quote(spec.job.code.git_commit);
    fields[prefix + "git_dirty"] = spec.job.code.git_dirty ? "true" : "false";
  }
  // The same for job.library_check, whose lines name what was found ("" where nothing was).
  if (spec.job.library_check != JobSpec::CodeCheck::kOff) {
    const bool refuse = spec.job.library_check == JobSpec::CodeCheck::kRefuse;
    const std::string prefix = refuse ? "libraries." : std::string(kAdvisoryPrefix) + "libraries.";
    const auto& libraries = spec.job.libraries;
    fields["job.library_check"] = Quote(refuse ? "refuse" : "warn");
    fields[prefix + "python"] = Quote(libraries.python);
    fields[prefix + "torch"] = Quote(libraries.torch);
    fields[prefix + "lightning"] = Quote(libraries.lightning);
    fields[prefix + "pytorch_lightning"] = Quote(libraries.pytorch_lightning);
    fields[prefix + "nccl"] = Quote(libraries.nccl);
    fields[prefix + "cuda"] = Quote(libraries.cuda);
  }
}

}  // namespace

std::string CanonicalForm(const JobSpec& spec) {
  std::map<std::string, std::string> fields;
  AddJobFields(spec, fields);
  // Both spellings of the cluster size (a host list or a count) mean something different for
  // rank assignment, so the list is kept when given; nnodes is always there.
  if (!spec.cluster.nodes.empty()) fields["cluster.nodes"] = QuoteList(spec.cluster.nodes);
  fields["cluster.nnodes"] = fmt::format("{}", spec.cluster.nnodes);
  fields["cluster.master_addr"] = Quote(spec.cluster.master_addr);
  fields["cluster.master_port"] = fmt::format("{}", spec.cluster.master_port);
  fields["cluster.nproc_per_node"] = fmt::format("{}", spec.cluster.nproc_per_node);
  if (spec.cluster.store_port) {
    fields["cluster.store_port"] = fmt::format("{}", *spec.cluster.store_port);
  }
  if (!spec.cluster.spare_hosts.empty()) {
    fields["cluster.spares"] = QuoteList(spec.cluster.spare_hosts);
  } else if (spec.cluster.spares > 0) {
    fields["cluster.spares"] = fmt::format("{}", spec.cluster.spares);
  }
  if (spec.cluster.min_nodes != spec.cluster.nnodes) {
    fields["cluster.min_nodes"] = fmt::format("{}", spec.cluster.min_nodes);
  }
  for (const auto& [key, value] : spec.trainer.settings) {
    fields["trainer." + key] = TrainerCanonical(value);
  }
  fields["restart.max_restarts"] = fmt::format("{}", spec.restart.max_restarts);
  fields["restart.backoff"] = FormatDuration(spec.restart.backoff);
  // Only when set, so that files without it keep their fingerprint.
  if (spec.restart.backoff_max) {
    fields["restart.backoff_max"] = FormatDuration(*spec.restart.backoff_max);
  }
  if (!spec.restart.never_on.empty()) fields["restart.never_on"] = QuoteList(spec.restart.never_on);
  fields["timeouts.rendezvous"] = FormatDuration(spec.timeouts.rendezvous);
  fields["timeouts.heartbeat"] = FormatDuration(spec.timeouts.heartbeat);
  fields["timeouts.stop_grace"] = FormatDuration(spec.timeouts.stop_grace);
  // Only when set or changed, so that files without them keep their fingerprint.
  if (spec.cluster.CanReplace()) fields["timeouts.replace"] = FormatDuration(spec.timeouts.replace);
  if (spec.timeouts.progress_auto) fields["timeouts.progress"] = Quote("auto");
  if (spec.timeouts.progress) fields["timeouts.progress"] = FormatDuration(*spec.timeouts.progress);
  if (spec.timeouts.progress_start != JobSpec::Timeouts{}.progress_start) {
    fields["timeouts.progress_start"] = FormatDuration(spec.timeouts.progress_start);
  }
  // Only where it can act (a spare or shrinking), so that other files keep their fingerprint.
  if (spec.cluster.CanReplace()) {
    fields["quarantine.failures"] = fmt::format("{}", spec.quarantine.failures);
    fields["quarantine.window"] = FormatDuration(spec.quarantine.window);
    fields["quarantine.cooldown"] = FormatDuration(spec.quarantine.cooldown);
  }
  // Only when not the default, so that the fingerprints of existing job files stay as they were.
  if (spec.rendezvous.probe != JobSpec::Rendezvous::Probe::kRefuse) {
    fields["rendezvous.probe"] =
        Quote(spec.rendezvous.probe == JobSpec::Rendezvous::Probe::kWarn ? "warn" : "off");
  }
  // Only with etcd, so that other files keep their fingerprint. The TLS files and the user
  // may differ between hosts; where the state lives may not.
  if (spec.rendezvous.Etcd()) {
    fields["rendezvous.backend"] = Quote("etcd");
    fields["rendezvous.endpoints"] = QuoteList(spec.rendezvous.endpoints);
    fields["rendezvous.prefix"] = Quote(spec.rendezvous.prefix);
    fields["rendezvous.lease"] = FormatDuration(spec.rendezvous.lease);
  }
  if (spec.stragglers.slower_percent != JobSpec::Stragglers{}.slower_percent) {
    fields["stragglers.slower_percent"] = fmt::format("{}", spec.stragglers.slower_percent);
  }
  if (spec.stragglers.window != JobSpec::Stragglers{}.window) {
    fields["stragglers.window"] = FormatDuration(spec.stragglers.window);
  }
  fields["logs.dir"] = Quote(spec.logs.dir);
  // Only when set, so that files without it keep their fingerprint.
  if (spec.metrics.Served()) fields["metrics.listen"] = Quote(spec.metrics.Listen());
  if (spec.metrics.port_per_node) fields["metrics.ports"] = Quote("per-node");

  std::string out;
  for (const auto& [key, value] : fields) out += fmt::format("{} = {}\n", key, value);
  return out;
}

std::string FingerprintOfCanonical(const std::string& canonical) {
  // Advisory lines are compared at join but do not make the jobs different.
  std::string kept;
  kept.reserve(canonical.size());
  size_t begin = 0;
  while (begin < canonical.size()) {
    size_t end = canonical.find('\n', begin);
    end = end == std::string::npos ? canonical.size() : end + 1;
    const std::string_view line(canonical.data() + begin, end - begin);
    if (line.substr(0, kAdvisoryPrefix.size()) != kAdvisoryPrefix) kept += line;
    begin = end;
  }
  return Sha256Hex(kept);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // EVP_Digest fails only when OpenSSL cannot allocate; an empty fingerprint then never
  // matches a peer's, which is the safe outcome.
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    return {};
  }
  return HexEncode(std::string_view(reinterpret_cast<const char*>(digest), length));
}

std::string Fingerprint(const JobSpec& spec) { return FingerprintOfCanonical(CanonicalForm(spec)); }

namespace {

// Values of job.env entries whose names look secret are hidden: the difference is printed on
// both nodes and kept in logs. "(not set)" stays, since it gives nothing away.
std::map<std::string, std::string> Printable(std::map<std::string, std::string> fields) {
  constexpr std::string_view kEnvPrefix = "job.env.";
  for (auto& [key, value] : fields) {
    if (key.starts_with(kEnvPrefix) && LooksSecret(std::string_view(key).substr(kEnvPrefix.size()))) {
      value = std::string(kHiddenValue);
    }
  }
  return fields;
}

}  // namespace

std::vector<FieldDifference> DiffCanonical(const std::string& ours, const std::string& theirs) {
  const auto raw_a = ParseCanonical(ours);
  const auto raw_b = ParseCanonical(theirs);
  const auto a = Printable(raw_a);
  const auto b = Printable(raw_b);
  std::vector<FieldDifference> diffs;
  auto ia = a.begin();
  auto ib = b.begin();
  constexpr std::string_view kNotSet = "(not set)";
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      diffs.push_back({ia->first, ia->second, std::string(kNotSet)});
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      diffs.push_back({ib->first, std::string(kNotSet), ib->second});
      ++ib;
    } else {
      if (raw_a.at(ia->first) != raw_b.at(ib->first)) {
        diffs.push_back({ia->first, ia->second, ib->second});
      }
      ++ia;
      ++ib;
    }
  }
  return diffs;
}

}  // namespace ddprun
