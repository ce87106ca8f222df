#include "schema/faults.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "schema/diagnostics.h"

namespace ddprun {
namespace {

constexpr std::string_view kFaultSection = "simulate.faults";

// Every kind takes these; the others are listed per kind in the table.
bool TakenByEveryKind(std::string_view key) { return key == "at" || key == "kind" || key == "node"; }

const KeySpec& FaultKey(std::string_view key) { return *FindKey(SectionNamed(kFaultSection), key); }

// A decimal integer of at most 9 digits in `range`, as the flag writes numbers (no sign). The
// sentences match the job file's, so one value outside the table's range reads the same in
// both places.
Result<int> ParseFlagInt(std::string_view key, std::string_view s, IntRange range) {
  bool digits = !s.empty() && s.size() <= 9;
  int value = 0;
  for (char c : s) {
    if (c < '0' || c > '9') {
      digits = false;
      break;
    }
    value = value * 10 + (c - '0');
  }
  if (!digits) return Fail(fmt::format("{}={} is not a valid number", key, s));
  if (!range.Contains(value)) {
    return Fail(fmt::format("{} = {} is out of range ({}..{})", key, value, range.min, range.max));
  }
  return value;
}

// `value` of the flag's key=value read as the table's type of `key`, or an error sentence.
Result<FaultValue> ParseFlagValue(std::string_view key, std::string_view value) {
  const IntRange range = FaultKeyRange(key, FaultBounds{});
  switch (FaultKey(key).type) {
    case KeyType::kInteger: {
      auto n = ParseFlagInt(key, value, range);
      if (!n) return Fail(n.error());
      return FaultValue{int64_t{*n}};
    }
    case KeyType::kDuration:
      if (auto d = ParseDuration(value)) return FaultValue{*d};
      return Fail(fmt::format("{}={} is not a duration (e.g. 30s, 5m)", key, value));
    case KeyType::kIntegerArray: {
      std::vector<int> ranks;
      std::string_view list = value;
      while (true) {
        const size_t plus = list.find('+');
        auto n = ParseFlagInt(key, list.substr(0, plus), range);
        if (!n) return Fail(fmt::format("{}={} is not a list of node ranks (e.g. 0+2)", key, value));
        ranks.push_back(*n);
        if (plus == std::string_view::npos) break;
        list = list.substr(plus + 1);
      }
      return FaultValue{std::move(ranks)};
    }
    default:
      break;
  }
  return Fail(fmt::format("`{}` cannot be given as key=value", key));
}

}  // namespace

const FaultKindSpec& FaultKindSpecOf(FaultKind kind) {
  for (const FaultKindSpec& spec : FaultKinds()) {
    if (spec.kind == kind) return spec;
  }
  return FaultKinds().front();
}

FaultKeyUse UseOfFaultKey(const FaultKindSpec* kind, std::string_view key) {
  if (!FindKey(SectionNamed(kFaultSection), key)) return FaultKeyUse::kUnknown;
  if (!kind || TakenByEveryKind(key)) return FaultKeyUse::kTaken;
  const auto& keys = kind->optional_keys;
  return std::find(keys.begin(), keys.end(), key) != keys.end() ? FaultKeyUse::kTaken
                                                                : FaultKeyUse::kNotForKind;
}

IntRange FaultKeyRange(std::string_view key, FaultBounds bounds) {
  const KeySpec& spec = FaultKey(key);
  const IntRange range = spec.range ? *spec.range : spec.item_range.value_or(IntRange{});
  // Node ranks (node, peers) end at the job's last node, local ranks at its last worker.
  // Node indexes (node, peers) end at the job's last spare (nnodes + i is spare i), local
  // ranks at its last worker.
  if ((key == "node" || key == "peers") && bounds.nnodes > 0) {
    return range.Below(bounds.nnodes + bounds.spares - 1);
  }
  if (key == "local_rank" && bounds.nproc_per_node > 0) {
    return range.Below(bounds.nproc_per_node - 1);
  }
  return range;
}

void SetFaultKey(FaultSpec& fault, std::string_view key, FaultValue value) {
  if (auto* n = std::get_if<int64_t>(&value)) {
    if (key == "node") fault.node = static_cast<int>(*n);
    if (key == "local_rank") fault.local_rank = static_cast<int>(*n);
    if (key == "exit_code") fault.exit_code = static_cast<int>(*n);
    if (key == "percent") fault.percent = static_cast<int>(*n);
  } else if (auto* d = std::get_if<Duration>(&value)) {
    if (key == "at") fault.at = *d;
    if (key == "duration") fault.duration = *d;
    if (key == "reboot_after") fault.reboot_after = *d;
  } else if (auto* ranks = std::get_if<std::vector<int>>(&value)) {
    if (key == "peers") fault.peers.insert(fault.peers.end(), ranks->begin(), ranks->end());
  }
}

std::string FaultKeysHint(const FaultKindSpec& kind) {
  std::string keys;
  for (const KeySpec& key : SectionNamed(kFaultSection).keys) {
    if (UseOfFaultKey(&kind, key.name) != FaultKeyUse::kTaken) continue;
    if (!keys.empty()) keys += ", ";
    keys += key.name;
  }
  return fmt::format("a {} fault takes: {}", kind.name, keys);
}

std::string KnownFaultKinds() {
  std::string out;
  for (const FaultKindSpec& kind : FaultKinds()) {
    if (!out.empty()) out += ", ";
    out += kind.name;
  }
  return out;
}

Status FaultFitsJob(const FaultSpec& fault, const JobSpec& spec) {
  const int nnodes = spec.cluster.nnodes;
  const int agents = spec.cluster.Agents();
  const std::string have = spec.cluster.spares == 0
                               ? fmt::format("nodes 0..{}", nnodes - 1)
                               : fmt::format("nodes 0..{} and spares {}..{}", nnodes - 1, nnodes, agents - 1);
  if (fault.kind == FaultKind::kEtcdMemberDown) {
    // A member of the modelled 3-member etcd cluster, whatever the job's size.
    if (fault.node < 0 || fault.node >= kSimulatedEtcdMembers) {
      return Fail(
          fmt::format("{} fault: etcd member {} is out of range (the modelled etcd cluster has members "
                      "0..{})",
                      FaultKindName(fault.kind), fault.node, kSimulatedEtcdMembers - 1));
    }
  } else if (fault.node < 0 || fault.node >= agents) {
    return Fail(fmt::format("{} fault: node {} is out of range (the job has {})", FaultKindName(fault.kind),
                            fault.node, have));
  }
  if (fault.local_rank && (*fault.local_rank < 0 || *fault.local_rank >= spec.cluster.nproc_per_node)) {
    return Fail(fmt::format("{} fault: local_rank {} is out of range (0..{})", FaultKindName(fault.kind),
                            *fault.local_rank, spec.cluster.nproc_per_node - 1));
  }
  const bool etcd_fault = fault.kind == FaultKind::kEtcdMemberDown ||
                          fault.kind == FaultKind::kEtcdLeaderLost || fault.kind == FaultKind::kEtcdPartition;
  if (etcd_fault && !spec.rendezvous.Etcd()) {
    return Fail(
        fmt::format("{} fault: the job keeps no state in etcd (rendezvous.backend = \"etcd\" models "
                    "an etcd cluster)",
                    FaultKindName(fault.kind)));
  }
  for (int peer : fault.peers) {
    if (peer < 0 || peer >= agents || peer == fault.node) {
      return Fail(fmt::format("{} fault: peer {} is not another node of the job (0..{})",
                              FaultKindName(fault.kind), peer, agents - 1));
    }
  }
  return {};
}

Result<FaultSpec> ParseFaultFlag(std::string_view text) {
  const std::string usage = "write kind@time[:key=value,...], e.g. node-crash@40m:node=1";
  if (text.size() > 512) return Fail("--fault value is too long");
  const size_t at_sign = text.find('@');
  if (at_sign == std::string_view::npos) {
    return Fail(fmt::format("--fault `{}` has no time: {}", text, usage));
  }
  const std::string_view kind_name = text.substr(0, at_sign);
  auto kind = ParseFaultKind(kind_name);
  if (!kind) {
    return Fail(fmt::format("unknown fault kind `{}` (known: {})", kind_name, KnownFaultKinds()));
  }
  const FaultKindSpec& kind_spec = FaultKindSpecOf(*kind);
  std::string_view rest = text.substr(at_sign + 1);
  const size_t colon = rest.find(':');
  const std::string_view time = rest.substr(0, colon);
  FaultSpec fault;
  fault.kind = *kind;
  auto at = ParseDuration(time);
  if (!at) return Fail(fmt::format("`{}` is not a duration (e.g. 90s, 40m, 1h30m)", time));
  fault.at = *at;
  if (colon == std::string_view::npos) return fault;

  std::string_view pairs = rest.substr(colon + 1);
  std::set<std::string, std::less<>> seen;
  while (!pairs.empty()) {
    const size_t comma = pairs.find(',');
    const std::string_view pair = pairs.substr(0, comma);
    pairs = comma == std::string_view::npos ? std::string_view{} : pairs.substr(comma + 1);
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      return Fail(fmt::format("`{}` is not key=value: {}", pair, usage));
    }
    const std::string_view key = pair.substr(0, eq);
    const std::string_view value = pair.substr(eq + 1);
    // `at` and `kind` are written before the colon, never as key=value.
    const FaultKeyUse use =
        key == "at" || key == "kind" ? FaultKeyUse::kUnknown : UseOfFaultKey(&kind_spec, key);
    if (use == FaultKeyUse::kUnknown) {
      std::string hint;
      if (auto close = ClosestName(key, SectionNamed(kFaultSection).known_names)) {
        hint = fmt::format("; did you mean `{}`?", *close);
      }
      return Fail(fmt::format("unknown fault key `{}`{}", key, hint));
    }
    if (use == FaultKeyUse::kNotForKind) {
      return Fail(fmt::format("`{}` does not apply to a {} fault ({})", key, kind_spec.name,
                              FaultKeysHint(kind_spec)));
    }
    if (!seen.insert(std::string(key)).second) {
      return Fail(fmt::format("`{}` is given twice", key));
    }
    auto parsed = ParseFlagValue(key, value);
    if (!parsed) return Fail(parsed.error());
    SetFaultKey(fault, key, *std::move(parsed));
  }
  return fault;
}

}  // namespace ddprun
