#include "preflight/report.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/plural.h"
namespace ddprun::preflight {

namespace {

using nlohmann::json;

bool WantsGpu(const std::string& accelerator) { return accelerator == "gpu" || accelerator == "cuda"; }

/// The rank that speaks for a node: its local rank 0, else its lowest rank that joined.
const RankInfo* NodeInfo(const Findings& findings, int node) {
  const RankInfo* best = nullptr;
  for (const RankInfo& info : findings.ranks) {
    if (info.node_rank != node) continue;
    if (!best || info.local_rank < best->local_rank) best = &info;
  }
  return best;
}

std::string NodeName(const Expectations& expect, const Findings& findings, int node) {
  if (static_cast<size_t>(node) < expect.nodes.size()) {
    return fmt::format("node {} ({})", node, expect.nodes[static_cast<size_t>(node)]);
  }
  if (const RankInfo* info = NodeInfo(findings, node); info && !info->host.empty()) {
    return fmt::format("node {} ({})", node, info->host);
  }
  return fmt::format("node {}", node);
}

/// "8 x NVIDIA H200" or "1 x A, 1 x B", in device order.
std::string GpuSummary(const RankInfo& info) {
  std::vector<std::pair<std::string, int>> groups;
  for (const std::string& name : info.gpu_names) {
    if (!groups.empty() && groups.back().first == name) {
      ++groups.back().second;
    } else {
      groups.emplace_back(name, 1);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [name, count] : groups) parts.push_back(fmt::format("{} x {}", count, name));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string SizeText(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30) && bytes % (uint64_t{1} << 30) == 0) {
    return fmt::format("{} GiB", bytes >> 30);
  }
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) {
    return fmt::format("{} MiB", bytes >> 20);
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

/// A column of values that should agree across nodes: "" when they do, else the difference.
template <typename Value, typename Format>
std::string Disagreement(const Expectations& expect, const Findings& findings, const char* what,
                         Value RankInfo::*field, Format format) {
  std::map<Value, std::vector<int>> by_value;
  for (int node = 0; node < expect.nnodes; ++node) {
    if (const RankInfo* info = NodeInfo(findings, node)) by_value[info->*field].push_back(node);
  }
  if (by_value.size() <= 1) return "";
  std::vector<std::string> parts;
  for (const auto& [value, nodes] : by_value) {
    parts.push_back(
        fmt::format("{} on node{} {}", format(value), nodes.size() == 1 ? "" : "s", fmt::join(nodes, ", ")));
  }
  return fmt::format("{} differs: {}", what, fmt::join(parts, "; "));
}

std::string Or(const std::string& text, const char* fallback) { return text.empty() ? fallback : text; }

}  // namespace

double AllReduceBusBandwidth(double algbw, int nranks) {
  if (nranks <= 1) return algbw;  // nccl-tests prints busbw = algbw for one rank
  return algbw * 2.0 * static_cast<double>(nranks - 1) / static_cast<double>(nranks);
}

std::string CudaVersionText(int version) {
  if (version <= 0) return "-";
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string NcclVersionText(int version) {
  if (version <= 0) return "-";
  // NCCL_VERSION(X,Y,Z) is X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before.
  if (version >= 10000) {
    return fmt::format("{}.{}.{}", version / 10000, (version % 10000) / 100, version % 100);
  }
  return fmt::format("{}.{}.{}", version / 1000, (version % 1000) / 100, version % 100);
}

const char* ReachName(Reach reach) {
  switch (reach) {
    case Reach::kReachable:
      return "reachable";
    case Reach::kRefused:
      return "refused";
    case Reach::kTimedOut:
      return "timed out";
    case Reach::kUnreachable:
      return "unreachable";
    case Reach::kError:
      return "error";
  }
  return "error";
}

std::string VerdictHeader(const Expectations& expect) {
  const int world = expect.nnodes * expect.nproc_per_node;
  return fmt::format("ddprun preflight: job \"{}\", {} node{} x {} rank{} (world {}), accelerator {}\n",
                     expect.job_name, expect.nnodes, expect.nnodes == 1 ? "" : "s", expect.nproc_per_node,
                     expect.nproc_per_node == 1 ? "" : "s", world, Or(expect.accelerator, "unset"));
}

namespace {

constexpr const char* kNodeRow = "  {:<5} {:<20} {:<16} {:>4} {:>5}  {:<12} {:<8} {:<8} {:<8}\n";

// One node's GPUs against nproc_per_node: its problems, and notes for the lines under the table.
void CheckNodeGpus(const Expectations& expect, const Findings& findings, int node, const RankInfo& info,
                   VerdictPart& part, std::vector<std::string>& notes) {
  const std::string name = NodeName(expect, findings, node);
  if (info.gpu_count == 0) {
    const std::string line = fmt::format("no GPU on node {} ({}): skipped the NCCL all-reduce", node,
                                         Or(info.gpu_error, "the CUDA runtime found none"));
    if (WantsGpu(expect.accelerator)) {
      part.problems.push_back(fmt::format(
          "{}; trainer.accelerator = \"{}\" needs {} GPU{} there; fix: install the NVIDIA "
          "driver or check CUDA_VISIBLE_DEVICES",
          line, expect.accelerator, expect.nproc_per_node, expect.nproc_per_node == 1 ? "" : "s"));
    } else {
      notes.push_back(line);
    }
    if (!info.nccl_error.empty()) notes.push_back(fmt::format("{}: {}", name, info.nccl_error));
    return;
  }
  if (info.gpu_count < expect.nproc_per_node) {
    part.problems.push_back(fmt::format(
        "{} has {} GPU{} but runs {} ranks (nproc_per_node); fix: set cluster.nproc_per_node/"
        "trainer.devices = {} or check CUDA_VISIBLE_DEVICES",
        name, info.gpu_count, info.gpu_count == 1 ? "" : "s", expect.nproc_per_node, info.gpu_count));
  } else if (info.gpu_count > expect.nproc_per_node) {
    notes.push_back(
        fmt::format("{} has {} GPUs and runs {}: {} GPU{} stay idle (set cluster.nproc_per_node/"
                    "trainer.devices = {} to use them all)",
                    name, info.gpu_count, Counted(static_cast<size_t>(expect.nproc_per_node), "rank"),
                    info.gpu_count - expect.nproc_per_node,
                    info.gpu_count - expect.nproc_per_node == 1 ? "" : "s", info.gpu_count));
  }
  if (info.nccl_version == 0) {
    part.problems.push_back(
        fmt::format("{} has GPUs but NCCL cannot be loaded ({}); fix: install NCCL (libnccl.so.2) or set "
                    "DDPRUN_NCCL_PATH",
                    name, Or(info.nccl_error, "unknown reason")));
  }
}

}  // namespace

VerdictPart NodesPart(const Expectations& expect, const Findings& findings) {
  VerdictPart part;
  std::vector<std::string> notes;
  part.text += "\nnodes\n";
  part.text += fmt::format(kNodeRow, "node", "host", "address", "GPUs", "nproc", "driver", "drv CUDA",
                           "CUDA rt", "NCCL");
  for (int node = 0; node < expect.nnodes; ++node) {
    const RankInfo* info = NodeInfo(findings, node);
    if (!info) {
      part.text += fmt::format("  {:<5} (no rank of this node joined)\n", node);
      continue;
    }
    part.text +=
        fmt::format(kNodeRow, node, info->host, info->address, info->gpu_count, expect.nproc_per_node,
                    Or(info->driver, "-"), CudaVersionText(info->driver_cuda_version),
                    CudaVersionText(info->runtime_version), NcclVersionText(info->nccl_version));
    part.text += fmt::format("        Python {}, torch {}, Lightning {}\n", Or(info->python_version, "-"),
                             Or(info->torch_version, "-"), Or(info->lightning_version, "-"));
    if (info->gpu_count > 0) part.text += fmt::format("        GPUs: {}\n", GpuSummary(*info));
    CheckNodeGpus(expect, findings, node, *info, part, notes);
  }
  for (const std::string& line : notes) part.text += "  note: " + line + "\n";
  return part;
}

VerdictPart VersionsPart(const Expectations& expect, const Findings& findings) {
  VerdictPart part;
  // NCCL must agree across nodes.
  const std::string nccl_diff =
      Disagreement(expect, findings, "NCCL version", &RankInfo::nccl_version, NcclVersionText);
  if (!nccl_diff.empty()) {
    part.problems.push_back(nccl_diff + "; fix: install the same NCCL on every node");
  }
  // Different torch or Lightning versions train silently differently or hang in a collective,
  // as different NCCL versions do; a different Python alone is only worth a note.
  const auto none = [](const std::string& v) { return Or(v, "none"); };
  std::vector<std::string> library_diffs;
  for (const std::string& diff :
       {Disagreement(expect, findings, "torch version", &RankInfo::torch_version, none),
        Disagreement(expect, findings, "Lightning version", &RankInfo::lightning_version, none)}) {
    if (diff.empty()) continue;
    library_diffs.push_back(diff);
    part.problems.push_back(diff + "; fix: install the same version on every node");
  }
  std::vector<std::string> version_notes;
  for (const std::string& diff :
       {Disagreement(expect, findings, "driver", &RankInfo::driver, none),
        Disagreement(expect, findings, "CUDA runtime", &RankInfo::runtime_version, CudaVersionText),
        Disagreement(expect, findings, "Python version", &RankInfo::python_version, none)}) {
    if (!diff.empty()) version_notes.push_back(diff);
  }
  if (nccl_diff.empty() && version_notes.empty() && library_diffs.empty()) {
    part.text += "  versions agree across nodes\n";
    return part;
  }
  for (const std::string& line : version_notes) part.text += "  note: " + line + "\n";
  if (!nccl_diff.empty()) part.text += "  " + nccl_diff + "\n";
  for (const std::string& line : library_diffs) part.text += "  " + line + "\n";
  return part;
}

VerdictPart ReachabilityPart(const Expectations& expect, const Findings& findings) {
  VerdictPart part;
  if (expect.nnodes <= 1) return part;
  std::map<std::pair<int, int>, const ReachResult*> reach;
  for (const RankReport& report : findings.reports) {
    for (const ReachResult& r : report.reach) reach[{r.from, r.to}] = &r;
  }
  std::string& out = part.text;
  out += "\nreachability (TCP from the row's node to the column's node test port)\n";
  out += fmt::format("  {:<8}", "from\\to");
  for (int to = 0; to < expect.nnodes; ++to) out += fmt::format(" {:<12}", fmt::format("n{}", to));
  out += "\n";
  for (int from = 0; from < expect.nnodes; ++from) {
    out += fmt::format("  {:<8}", fmt::format("n{}", from));
    for (int to = 0; to < expect.nnodes; ++to) {
      std::string cell = "-";
      if (from != to) {
        auto it = reach.find({from, to});
        cell = it == reach.end() ? "not tested" : ReachName(it->second->reach);
      }
      out += fmt::format(" {:<12}", cell);
    }
    out += "\n";
  }
  for (int from = 0; from < expect.nnodes; ++from) {
    for (int to = 0; to < expect.nnodes; ++to) {
      if (from == to) continue;
      auto it = reach.find({from, to});
      if (it == reach.end()) {
        if (NodeInfo(findings, from) && NodeInfo(findings, to)) {
          part.problems.push_back(fmt::format("{} did not test {}: see its log",
                                              NodeName(expect, findings, from),
                                              NodeName(expect, findings, to)));
        }
        continue;
      }
      if (it->second->reach == Reach::kReachable) continue;
      part.problems.push_back(
          fmt::format("{} cannot reach {} over TCP ({}: {}); fix: open TCP ports on node {} for node {}: "
                      "NCCL's socket transport connects between all nodes",
                      NodeName(expect, findings, from), NodeName(expect, findings, to),
                      ReachName(it->second->reach), it->second->detail, to, from));
    }
  }
  return part;
}

VerdictPart AllReducePart(const Expectations& expect, const Findings& findings) {
  VerdictPart part;
  const std::vector<BandwidthRow>* rows = nullptr;
  for (const RankReport& report : findings.reports) {
    if (report.rank == 0 && !report.bandwidth.empty()) rows = &report.bandwidth;
  }
  if (rows) {
    part.text += fmt::format("\nNCCL all-reduce (float, sum, {})\n",
                             Counted(static_cast<size_t>(expect.nnodes * expect.nproc_per_node), "rank"));
    part.text += fmt::format("  {:>10} {:>12} {:>12} {:>13} {:>13}\n", "size", "count", "time (us)",
                             "algbw (GB/s)", "busbw (GB/s)");
    for (const BandwidthRow& row : *rows) {
      part.text += fmt::format("  {:>10} {:>12} {:>12.1f} {:>13.2f} {:>13.2f}\n", SizeText(row.bytes),
                               row.count, row.time_us, row.algbw, row.busbw);
    }
    return part;
  }
  std::vector<int> gpu_less;
  for (int node = 0; node < expect.nnodes; ++node) {
    const RankInfo* info = NodeInfo(findings, node);
    if (info && info->gpu_count == 0) gpu_less.push_back(node);
  }
  if (!gpu_less.empty()) {
    part.text += fmt::format("\nNCCL all-reduce: skipped (no GPU on node{} {})\n",
                             gpu_less.size() == 1 ? "" : "s", fmt::join(gpu_less, ", "));
  } else if (!findings.nccl_ran) {
    part.text += "\nNCCL all-reduce: not run\n";
  }
  return part;
}

VerdictPart RanksPart(const Expectations& expect, const Findings& findings) {
  VerdictPart part;
  std::set<int> joined, reported;
  for (const RankInfo& info : findings.ranks) joined.insert(info.rank);
  for (const RankReport& report : findings.reports) {
    reported.insert(report.rank);
    if (!report.error.empty()) {
      part.problems.push_back(fmt::format("rank {}: {}", report.rank, report.error));
    }
  }
  std::vector<int> missing;
  for (int rank = 0; rank < expect.nnodes * expect.nproc_per_node; ++rank) {
    if (joined.count(rank) && !reported.count(rank)) missing.push_back(rank);
  }
  if (!missing.empty() && findings.exchange_error.empty()) {
    part.problems.push_back(fmt::format("rank{} {} never reported back", missing.size() == 1 ? "" : "s",
                                        fmt::join(missing, ", ")));
  }
  return part;
}

std::string VerdictClosing(const std::vector<std::string>& problems) {
  if (problems.empty()) return "preflight: OK\n";
  std::string out =
      fmt::format("preflight: {} problem{}\n", problems.size(), problems.size() == 1 ? "" : "s");
  for (const std::string& problem : problems) out += "  - " + problem + "\n";
  return out;
}

Verdict BuildVerdict(const Expectations& expect, const Findings& findings) {
  Verdict verdict;
  verdict.text = VerdictHeader(expect);
  if (!findings.exchange_error.empty()) verdict.problems.push_back(findings.exchange_error);
  for (const auto part_of : {NodesPart, VersionsPart, ReachabilityPart, AllReducePart, RanksPart}) {
    VerdictPart part = part_of(expect, findings);
    verdict.text += part.text;
    for (std::string& problem : part.problems) verdict.problems.push_back(std::move(problem));
  }
  verdict.text += "\n" + VerdictClosing(verdict.problems);
  return verdict;
}

// ---- JSON ----

namespace {

bool ReadInt(const json& j, const char* key, int& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return false;
  const auto value = it->get<int64_t>();
  if (value < -1'000'000'000 || value > 1'000'000'000) return false;
  out = static_cast<int>(value);
  return true;
}

bool ReadU64(const json& j, const char* key, uint64_t& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  out = it->get<uint64_t>();
  return true;
}

bool ReadDouble(const json& j, const char* key, double& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  out = it->get<double>();
  return true;
}

bool ReadString(const json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return false;
  out = it->get<std::string>();
  return true;
}

}  // namespace

json ToJson(const RankInfo& info) {
  return json{{"rank", info.rank},
              {"node_rank", info.node_rank},
              {"local_rank", info.local_rank},
              {"host", info.host},
              {"address", info.address},
              {"gpu_count", info.gpu_count},
              {"gpu_names", info.gpu_names},
              {"gpu_error", info.gpu_error},
              {"driver", info.driver},
              {"driver_cuda_version", info.driver_cuda_version},
              {"runtime_version", info.runtime_version},
              {"nccl_version", info.nccl_version},
              {"nccl_error", info.nccl_error},
              {"free_memory", info.free_memory},
              {"test_port", info.test_port},
              {"python_version", info.python_version},
              {"torch_version", info.torch_version},
              {"lightning_version", info.lightning_version}};
}

std::optional<RankInfo> RankInfoFromJson(const json& j) {
  if (!j.is_object()) return std::nullopt;
  RankInfo info;
  int port = 0;
  bool ok = ReadInt(j, "rank", info.rank) && ReadInt(j, "node_rank", info.node_rank) &&
            ReadInt(j, "local_rank", info.local_rank) && ReadString(j, "host", info.host) &&
            ReadString(j, "address", info.address) && ReadInt(j, "gpu_count", info.gpu_count) &&
            ReadString(j, "gpu_error", info.gpu_error) && ReadString(j, "driver", info.driver) &&
            ReadInt(j, "driver_cuda_version", info.driver_cuda_version) &&
            ReadInt(j, "runtime_version", info.runtime_version) &&
            ReadInt(j, "nccl_version", info.nccl_version) && ReadString(j, "nccl_error", info.nccl_error) &&
            ReadU64(j, "free_memory", info.free_memory) && ReadInt(j, "test_port", port);
  if (!ok || port < 0 || port > 65535 || info.rank < 0 || info.gpu_count < 0) return std::nullopt;
  // Optional: absent from a record, they read as unknown.
  for (auto [key, field] :
       {std::pair{"python_version", &info.python_version}, std::pair{"torch_version", &info.torch_version},
        std::pair{"lightning_version", &info.lightning_version}}) {
    if (j.contains(key) && !ReadString(j, key, *field)) return std::nullopt;
  }
  info.test_port = static_cast<uint16_t>(port);
  auto names = j.find("gpu_names");
  if (names == j.end() || !names->is_array()) return std::nullopt;
  for (const json& name : *names) {
    if (!name.is_string()) return std::nullopt;
    info.gpu_names.push_back(name.get<std::string>());
  }
  return info;
}

json ToJson(const RankReport& report) {
  json reach = json::array();
  for (const ReachResult& r : report.reach) {
    reach.push_back(
        json{{"from", r.from}, {"to", r.to}, {"reach", static_cast<int>(r.reach)}, {"detail", r.detail}});
  }
  json rows = json::array();
  for (const BandwidthRow& row : report.bandwidth) {
    rows.push_back(json{{"bytes", row.bytes},
                        {"count", row.count},
                        {"time_us", row.time_us},
                        {"algbw", row.algbw},
                        {"busbw", row.busbw}});
  }
  return json{{"rank", report.rank}, {"reach", reach}, {"bandwidth", rows}, {"error", report.error}};
}

std::optional<RankReport> RankReportFromJson(const json& j) {
  if (!j.is_object()) return std::nullopt;
  RankReport report;
  if (!ReadInt(j, "rank", report.rank) || !ReadString(j, "error", report.error)) return std::nullopt;
  auto reach = j.find("reach");
  auto rows = j.find("bandwidth");
  if (reach == j.end() || !reach->is_array() || rows == j.end() || !rows->is_array()) {
    return std::nullopt;
  }
  for (const json& item : *reach) {
    if (!item.is_object()) return std::nullopt;
    ReachResult r;
    int kind = 0;
    if (!ReadInt(item, "from", r.from) || !ReadInt(item, "to", r.to) || !ReadInt(item, "reach", kind) ||
        !ReadString(item, "detail", r.detail) || kind < 0 || kind > static_cast<int>(Reach::kError)) {
      return std::nullopt;
    }
    r.reach = static_cast<Reach>(kind);
    report.reach.push_back(std::move(r));
  }
  for (const json& item : *rows) {
    if (!item.is_object()) return std::nullopt;
    BandwidthRow row;
    if (!ReadU64(item, "bytes", row.bytes) || !ReadU64(item, "count", row.count) ||
        !ReadDouble(item, "time_us", row.time_us) || !ReadDouble(item, "algbw", row.algbw) ||
        !ReadDouble(item, "busbw", row.busbw)) {
      return std::nullopt;
    }
    report.bandwidth.push_back(row);
  }
  return report;
}

}  // namespace ddprun::preflight
