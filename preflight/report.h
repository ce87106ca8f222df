#pragma once
// What preflight learns (one record per rank, reachability between nodes, all-reduce timings)
// and the verdict rank 0 prints. Pure: no sockets, no CUDA, so the verdict is unit-tested.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ddprun::preflight {

/// What one worker reports about itself and its node when it joins the exchange.
struct RankInfo {
  int rank = 0;
  int node_rank = 0;
  int local_rank = 0;
  std::string host;                    // gethostname()
  std::string address;                 // this rank's address towards MASTER_ADDR
  int gpu_count = 0;                   // devices the CUDA runtime sees (after CUDA_VISIBLE_DEVICES)
  std::vector<std::string> gpu_names;  // one per device
  std::string gpu_error;               // why gpu_count is 0 ("" when the runtime answered)
  std::string driver;                  // kernel driver version, e.g. "550.54.15" ("" if none)
  int driver_cuda_version = 0;         // cudaDriverGetVersion, e.g. 12040 (0: no driver)
  int runtime_version = 0;             // cudaRuntimeGetVersion, e.g. 13000 (0: no runtime)
  int nccl_version = 0;                // ncclGetVersion, e.g. 22809 (0: not loaded)
  std::string nccl_error;              // why NCCL could not be loaded
  uint64_t free_memory = 0;            // bytes free on this rank's GPU (LOCAL_RANK)
  uint16_t test_port = 0;              // local rank 0 only: the TCP port it listens on
  // Local rank 0 only, from the job's Python: "3.11.2", "2.3.0+cu121"; "" when not installed
  // (or, for python, not runnable).
  std::string python_version;
  std::string torch_version;
  std::string lightning_version;
};

enum class Reach { kReachable, kRefused, kTimedOut, kUnreachable, kError };

/// One TCP connect from node `from` to node `to`'s test port.
struct ReachResult {
  int from = 0;
  int to = 0;
  Reach reach = Reach::kError;
  std::string detail;  // the address:port tried and the system's words on failure
};

/// One line of the all-reduce table, as nccl-tests' all_reduce_perf prints it.
struct BandwidthRow {
  uint64_t bytes = 0;
  uint64_t count = 0;  // floats
  double time_us = 0;  // per all-reduce, averaged over the timed iterations
  double algbw = 0;    // GB/s: bytes / time
  double busbw = 0;    // GB/s: algbw * 2 (n-1) / n
};

/// What each rank sends back after its checks.
struct RankReport {
  int rank = 0;
  std::vector<ReachResult> reach;       // local rank 0 only
  std::vector<BandwidthRow> bandwidth;  // rank 0 only (every rank measures the same collective)
  std::string error;                    // this rank's own step failed ("" when fine)
};

/// Everything rank 0 knows when it decides.
struct Findings {
  std::vector<RankInfo> ranks;      // by rank; missing ranks are absent
  std::vector<RankReport> reports;  // by rank; missing ranks are absent
  bool nccl_ran = false;
  std::string exchange_error;  // e.g. "ranks 3, 5 never joined within 60 s"
};

/// What the job expects, from the job file.
struct Expectations {
  std::string job_name;
  int nnodes = 1;
  int nproc_per_node = 1;
  std::string accelerator;         // trainer.accelerator ("" when unset)
  std::vector<std::string> nodes;  // cluster.nodes (empty when only nnodes was given)
  int master_port = 0;             // cluster.master_port, for messages (0: unknown)
  std::string python = "python3";  // the interpreter job.command runs, for its versions
};

struct Verdict {
  std::string text;                   // the whole report, ending with "preflight: ..."
  std::vector<std::string> problems;  // one line each; empty means OK
};

/// Builds the one-screen report from what preflight found. Deterministic. The header, then the
/// parts below in order, then the closing; the problems in the same order.
Verdict BuildVerdict(const Expectations& expect, const Findings& findings);

/// One part of the report: its lines and the problems it found.
struct VerdictPart {
  std::string text;
  std::vector<std::string> problems;
};

/// "ddprun preflight: job ..., accelerator ...": the first line.
std::string VerdictHeader(const Expectations& expect);
/// The node table (GPUs, driver, CUDA and NCCL versions, Python libraries) and its notes; GPUs
/// against nproc_per_node and accelerator, NCCL present where there are GPUs.
VerdictPart NodesPart(const Expectations& expect, const Findings& findings);
/// Versions across nodes: NCCL, torch and Lightning must agree; driver, CUDA runtime and
/// Python differences are notes.
VerdictPart VersionsPart(const Expectations& expect, const Findings& findings);
/// The TCP matrix between nodes (none for one node) and every pair that failed or went untested.
VerdictPart ReachabilityPart(const Expectations& expect, const Findings& findings);
/// Rank 0's all-reduce table, or why there is none. Never a problem by itself.
VerdictPart AllReducePart(const Expectations& expect, const Findings& findings);
/// Ranks whose own step failed, and ranks that joined but never reported.
VerdictPart RanksPart(const Expectations& expect, const Findings& findings);
/// "preflight: OK", or the count and one line per problem.
std::string VerdictClosing(const std::vector<std::string>& problems);

/// busbw of an all-reduce over `nranks` from its algbw (nccl-tests' factor 2 (n-1) / n).
double AllReduceBusBandwidth(double algbw, int nranks);

/// "12.4" from 12040; "-" for 0.
std::string CudaVersionText(int version);
/// "2.28.9" from 22809 (and the old 2.x.y encoding below 2.9, e.g. 2708); "-" for 0.
std::string NcclVersionText(int version);
/// "reachable", "refused", ...
const char* ReachName(Reach reach);

// JSON forms for the exchange. The readers check every type: a malformed record gives
// nullopt, never an exception.
nlohmann::json ToJson(const RankInfo& info);
nlohmann::json ToJson(const RankReport& report);
std::optional<RankInfo> RankInfoFromJson(const nlohmann::json& json);
std::optional<RankReport> RankReportFromJson(const nlohmann::json& json);

}  // namespace ddprun::preflight
