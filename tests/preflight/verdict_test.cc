// Unit tests of preflight's verdict text, its record codec and its JSON readers.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/hex.h"
#include "base/parse_int.h"
#include "preflight/exchange.h"
#include "preflight/report.h"

namespace ddprun::preflight {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RankInfo Rank(int rank, int node, int local, int gpus) {
  RankInfo info;
  info.rank = rank;
  info.node_rank = node;
  info.local_rank = local;
  info.host = "host" + std::to_string(node);
  info.address = "10.0.0." + std::to_string(node + 1);
  info.gpu_count = gpus;
  for (int i = 0; i < gpus; ++i) info.gpu_names.push_back("NVIDIA H100");
  if (gpus == 0) info.gpu_error = "CUDA driver version is insufficient for CUDA runtime version, error 35";
  info.runtime_version = 13000;
  info.nccl_version = 22809;
  info.test_port = local == 0 ? static_cast<uint16_t>(40000 + node) : 0;
  return info;
}

/// Two nodes x `nproc` ranks, every node with `gpus` GPUs, all reachable, every rank reported.
Findings TwoNodes(int nproc, int gpus) {
  Findings f;
  for (int node = 0; node < 2; ++node) {
    for (int local = 0; local < nproc; ++local) {
      const int rank = node * nproc + local;
      f.ranks.push_back(Rank(rank, node, local, gpus));
      RankReport report;
      report.rank = rank;
      if (local == 0) report.reach.push_back({node, 1 - node, Reach::kReachable, "ok"});
      f.reports.push_back(report);
    }
  }
  return f;
}

Expectations Expect(const std::string& accelerator, int nproc) {
  Expectations e;
  e.job_name = "job";
  e.nnodes = 2;
  e.nproc_per_node = nproc;
  e.accelerator = accelerator;
  return e;
}

TEST(Verdict, CpuJobWithoutGpusIsOk) {
  const Verdict v = BuildVerdict(Expect("cpu", 2), TwoNodes(2, 0));
  EXPECT_TRUE(v.problems.empty()) << v.text;
  EXPECT_THAT(v.text, HasSubstr("no GPU on node 0 (CUDA driver version is insufficient for CUDA "
                                "runtime version, error 35): skipped the NCCL all-reduce"));
  EXPECT_THAT(v.text, HasSubstr("NCCL all-reduce: skipped (no GPU on nodes 0, 1)"));
  EXPECT_THAT(v.text, HasSubstr("  n0       -            reachable   \n"));
  EXPECT_THAT(v.text, HasSubstr("versions agree across nodes"));
  EXPECT_THAT(v.text, HasSubstr("\npreflight: OK\n"));
}

TEST(Verdict, GpuJobWithoutGpusNamesEveryNode) {
  const Verdict v = BuildVerdict(Expect("gpu", 2), TwoNodes(2, 0));
  ASSERT_EQ(v.problems.size(), 2u) << v.text;
  EXPECT_THAT(v.problems[1], HasSubstr("no GPU on node 1"));
  EXPECT_THAT(v.problems[1], HasSubstr("trainer.accelerator = \"gpu\" needs 2 GPUs there"));
  EXPECT_THAT(v.text, HasSubstr("preflight: 2 problems\n  - no GPU on node 0"));
}

TEST(Verdict, FewerGpusThanRanksIsAProblemWithTheFix) {
  const Verdict v = BuildVerdict(Expect("gpu", 8), TwoNodes(8, 4));
  ASSERT_EQ(v.problems.size(), 2u) << v.text;
  EXPECT_EQ(v.problems[0],
            "node 0 (host0) has 4 GPUs but runs 8 ranks (nproc_per_node); fix: set "
            "cluster.nproc_per_node/trainer.devices = 4 or check CUDA_VISIBLE_DEVICES");
  EXPECT_THAT(v.text, HasSubstr("GPUs: 4 x NVIDIA H100"));
}

TEST(Verdict, MoreGpusThanRanksIsANote) {
  const Verdict v = BuildVerdict(Expect("gpu", 2), TwoNodes(2, 8));
  EXPECT_TRUE(v.problems.empty()) << v.text;
  EXPECT_THAT(v.text, HasSubstr("6 GPUs stay idle"));
}

TEST(Verdict, UnreachableNodeSaysWhichPortsToOpen) {
  Expectations e = Expect("cpu", 1);
  e.nodes = {"gpu-01", "gpu-02"};
  Findings f = TwoNodes(1, 0);
  f.reports[0].reach[0] = {0, 1, Reach::kRefused, "10.0.0.2:40001: Connection refused"};
  const Verdict v = BuildVerdict(e, f);
  ASSERT_EQ(v.problems.size(), 1u) << v.text;
  EXPECT_EQ(v.problems[0],
            "node 0 (gpu-01) cannot reach node 1 (gpu-02) over TCP (refused: 10.0.0.2:40001: "
            "Connection refused); fix: open TCP ports on node 1 for node 0: NCCL's socket "
            "transport connects between all nodes");
  EXPECT_THAT(v.text, HasSubstr("  n0       -            refused     \n"));
}

TEST(Verdict, NcclVersionsMustAgree) {
  Findings f = TwoNodes(1, 1);
  f.ranks[1].nccl_version = 22005;
  const Verdict v = BuildVerdict(Expect("gpu", 1), f);
  ASSERT_EQ(v.problems.size(), 1u) << v.text;
  EXPECT_EQ(v.problems[0],
            "NCCL version differs: 2.20.5 on node 1; 2.28.9 on node 0; fix: install the same NCCL "
            "on every node");
}

TEST(Verdict, BandwidthTableAndFailedRanks) {
  Findings f = TwoNodes(1, 1);
  f.nccl_ran = true;
  f.reports[0].bandwidth.push_back({uint64_t{1} << 30, (uint64_t{1} << 30) / 4, 10000.0, 107.37, 107.37});
  f.reports[1].error = "ncclCommInitRank: unhandled system error";
  const Verdict v = BuildVerdict(Expect("gpu", 1), f);
  EXPECT_THAT(v.text, HasSubstr("NCCL all-reduce (float, sum, 2 ranks)"));
  EXPECT_THAT(v.text, HasSubstr("      1 GiB    268435456      10000.0        107.37        107.37\n"));
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_EQ(v.problems[0], "rank 1: ncclCommInitRank: unhandled system error");
}

TEST(Verdict, MissingRanksAndExchangeErrors) {
  Findings f = TwoNodes(2, 0);
  f.reports.pop_back();
  Verdict v = BuildVerdict(Expect("cpu", 2), f);
  ASSERT_EQ(v.problems.size(), 1u) << v.text;
  EXPECT_EQ(v.problems[0], "rank 3 never reported back");

  f.exchange_error = "rank 3 never joined the preflight exchange within 60 s (see their logs)";
  v = BuildVerdict(Expect("cpu", 2), f);
  EXPECT_EQ(v.problems, std::vector<std::string>{f.exchange_error});
}

TEST(Verdict, SingleNodeHasNoReachabilityMatrix) {
  Expectations e = Expect("cpu", 1);
  e.nnodes = 1;
  Findings f;
  f.ranks.push_back(Rank(0, 0, 0, 0));
  f.reports.push_back(RankReport{});
  const Verdict v = BuildVerdict(e, f);
  EXPECT_TRUE(v.problems.empty()) << v.text;
  EXPECT_THAT(v.text, Not(HasSubstr("reachability")));
}

TEST(Versions, Formatting) {
  EXPECT_EQ(CudaVersionText(12040), "12.4");
  EXPECT_EQ(CudaVersionText(13000), "13.0");
  EXPECT_EQ(CudaVersionText(0), "-");
  EXPECT_EQ(NcclVersionText(22809), "2.28.9");
  EXPECT_EQ(NcclVersionText(2708), "2.7.8");
  EXPECT_DOUBLE_EQ(AllReduceBusBandwidth(100.0, 8), 175.0);
  EXPECT_DOUBLE_EQ(AllReduceBusBandwidth(100.0, 1), 100.0);
}

TEST(Json, RoundTripsAndRejectsWrongTypes) {
  const RankInfo info = Rank(5, 1, 1, 2);
  auto back = RankInfoFromJson(ToJson(info));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->gpu_names, info.gpu_names);
  EXPECT_EQ(back->rank, 5);
  nlohmann::json bad = ToJson(info);
  bad["rank"] = "five";
  EXPECT_FALSE(RankInfoFromJson(bad));
  bad = ToJson(info);
  bad["test_port"] = 70000;
  EXPECT_FALSE(RankInfoFromJson(bad));
  EXPECT_FALSE(RankInfoFromJson(nlohmann::json::array()));

  RankReport report;
  report.rank = 2;
  report.reach.push_back({1, 0, Reach::kTimedOut, "x"});
  auto report_back = RankReportFromJson(ToJson(report));
  ASSERT_TRUE(report_back);
  EXPECT_EQ(report_back->reach[0].reach, Reach::kTimedOut);
  nlohmann::json bad_report = ToJson(report);
  bad_report["reach"][0]["reach"] = 99;
  EXPECT_FALSE(RankReportFromJson(bad_report));
}

TEST(Records, DecodeInPiecesAndRejectForeignBytes) {
  const std::string bytes = EncodeRecord('H', "hello") + EncodeRecord('R', "");
  EXPECT_EQ(bytes.substr(0, 4), "PFL1");  // never ddprun's own magic: the relay must pass it on
  RecordDecoder decoder;
  decoder.Feed(bytes.data(), 3);
  auto next = decoder.Next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());  // needs more
  decoder.Feed(bytes.data() + 3, bytes.size() - 3);
  next = decoder.Next();
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->type, 'H');
  EXPECT_EQ((*next)->payload, "hello");
  next = decoder.Next();
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->type, 'R');
  next = decoder.Next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());

  RecordDecoder foreign;
  foreign.Feed("GET /", 5);
  next = foreign.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error(), "not a preflight record (bad magic)");

  RecordDecoder huge;
  const std::string header = std::string("PFL1T") + "\xff\xff\xff\xff";
  huge.Feed(header.data(), header.size());
  next = huge.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error(), "record of 4294967295 bytes is over the 16777216 byte limit");
}

// Nodes with other torch or Lightning versions are problems; another Python is a note.
TEST(Verdict, PythonLibrariesPerNodeAndTheirDifferences) {
  Findings f = TwoNodes(1, 0);
  for (RankInfo& info : f.ranks) {
    info.python_version = "3.11.2";
    info.torch_version = "2.3.0";
    info.lightning_version = "2.2.1";
  }
  const Verdict same = BuildVerdict(Expect("cpu", 1), f);
  EXPECT_TRUE(same.problems.empty()) << same.text;
  EXPECT_THAT(same.text, HasSubstr("        Python 3.11.2, torch 2.3.0, Lightning 2.2.1\n"));
  EXPECT_THAT(same.text, HasSubstr("  versions agree across nodes\n"));
  f.ranks[1].python_version = "3.12.1";
  f.ranks[1].torch_version = "2.4.0";
  f.ranks[1].lightning_version = "";
  const Verdict differ = BuildVerdict(Expect("cpu", 1), f);
  EXPECT_EQ(differ.problems,
            (std::vector<std::string>{
                "torch version differs: 2.3.0 on node 0; 2.4.0 on node 1; fix: install the same "
                "version on every node",
                "Lightning version differs: none on node 1; 2.2.1 on node 0; fix: install the "
                "same version on every node"}));
  EXPECT_THAT(differ.text, HasSubstr("  note: Python version differs: 3.11.2 on node 0; 3.12.1 on "
                                     "node 1\n"));
  EXPECT_THAT(differ.text, HasSubstr("        Python 3.12.1, torch 2.4.0, Lightning -\n"));
}

// The parts of the verdict, each on its own.

TEST(VerdictParts, HeaderAndClosing) {
  EXPECT_EQ(VerdictHeader(Expect("", 1)),
            "ddprun preflight: job \"job\", 2 nodes x 1 rank (world 2), accelerator unset\n");
  EXPECT_EQ(VerdictClosing({}), "preflight: OK\n");
  EXPECT_EQ(VerdictClosing({"a", "b"}), "preflight: 2 problems\n  - a\n  - b\n");
}

TEST(VerdictParts, NodesComparesGpusWithRanks) {
  Findings f = TwoNodes(2, 2);
  f.ranks[2].gpu_count = 1;  // node 1's local rank 0 speaks for it
  f.ranks[2].gpu_names = {"NVIDIA H100"};
  const VerdictPart part = NodesPart(Expect("gpu", 2), f);
  EXPECT_THAT(part.text, HasSubstr("\nnodes\n  node  host "));
  EXPECT_THAT(part.text, HasSubstr("        GPUs: 2 x NVIDIA H100\n"));
  EXPECT_EQ(part.problems,
            (std::vector<std::string>{"node 1 (host1) has 1 GPU but runs 2 ranks (nproc_per_node); fix: "
                                      "set cluster.nproc_per_node/trainer.devices = 1 or check "
                                      "CUDA_VISIBLE_DEVICES"}));
  EXPECT_THAT(NodesPart(Expect("cpu", 2), TwoNodes(2, 0)).text,
              HasSubstr("  note: no GPU on node 1 (CUDA driver version is insufficient"));
}

TEST(VerdictParts, VersionsAgreeOrDiffer) {
  Findings f = TwoNodes(1, 1);
  EXPECT_EQ(VersionsPart(Expect("gpu", 1), f).text, "  versions agree across nodes\n");
  EXPECT_TRUE(VersionsPart(Expect("gpu", 1), f).problems.empty());
  f.ranks[1].runtime_version = 12040;
  const VerdictPart part = VersionsPart(Expect("gpu", 1), f);
  EXPECT_EQ(part.text, "  note: CUDA runtime differs: 12.4 on node 1; 13.0 on node 0\n");
  EXPECT_TRUE(part.problems.empty());
}

TEST(VerdictParts, ReachabilityNamesEveryFailedPair) {
  Findings f = TwoNodes(1, 0);
  f.reports[1].reach = {{1, 0, Reach::kTimedOut, "10.0.0.1:40000: timed out"}};
  const VerdictPart part = ReachabilityPart(Expect("cpu", 1), f);
  EXPECT_THAT(part.text, HasSubstr("  n1       timed out    -           \n"));
  ASSERT_EQ(part.problems.size(), 1u);
  EXPECT_EQ(part.problems[0],
            "node 1 (host1) cannot reach node 0 (host0) over TCP (timed out: 10.0.0.1:40000: "
            "timed out); fix: open TCP ports on node 0 for node 1: NCCL's socket transport "
            "connects between all nodes");
  Expectations one = Expect("cpu", 1);
  one.nnodes = 1;
  EXPECT_EQ(ReachabilityPart(one, f).text, "");
}

TEST(VerdictParts, AllReduceTableOrWhyNot) {
  Findings f = TwoNodes(1, 1);
  EXPECT_EQ(AllReducePart(Expect("gpu", 1), f).text, "\nNCCL all-reduce: not run\n");
  f.nccl_ran = true;
  EXPECT_EQ(AllReducePart(Expect("gpu", 1), f).text, "");
  f.reports[0].bandwidth.push_back({1024, 256, 10.0, 0.1, 0.1});
  EXPECT_THAT(AllReducePart(Expect("gpu", 1), f).text,
              HasSubstr("\nNCCL all-reduce (float, sum, 2 ranks)\n"));
  EXPECT_EQ(AllReducePart(Expect("cpu", 1), TwoNodes(1, 0)).text,
            "\nNCCL all-reduce: skipped (no GPU on nodes 0, 1)\n");
}

TEST(VerdictParts, RanksThatFailedOrNeverReported) {
  Findings f = TwoNodes(1, 0);
  f.reports[0].error = "cudaSetDevice(0): no device";
  f.reports.pop_back();
  EXPECT_EQ(RanksPart(Expect("cpu", 1), f).problems,
            (std::vector<std::string>{"rank 0: cudaSetDevice(0): no device", "rank 1 never reported back"}));
  f.exchange_error = "rank 1 never joined";
  EXPECT_EQ(RanksPart(Expect("cpu", 1), f).problems,
            (std::vector<std::string>{"rank 0: cudaSetDevice(0): no device"}));
}

// The helpers preflight shares with the rest of ddprun.

TEST(SharedHelpers, HexRoundTripsAndRejectsOtherText) {
  EXPECT_EQ(HexEncode(std::string("\x00\x7f\xff", 3)), "007fff");
  EXPECT_EQ(HexDecode("007fff"), std::string("\x00\x7f\xff", 3));
  EXPECT_EQ(HexDecode("0"), std::nullopt);
  EXPECT_EQ(HexDecode("0G"), std::nullopt);
  EXPECT_EQ(HexDecode("AB"), std::nullopt);  // lower case only, as we write it
}

TEST(SharedHelpers, ParseNonNegative) {
  EXPECT_EQ(ParseNonNegative("42", 100), 42);
  EXPECT_EQ(ParseNonNegative("0", 100), 0);
  EXPECT_EQ(ParseNonNegative("101", 100), std::nullopt);
  EXPECT_EQ(ParseNonNegative("-1", 100), std::nullopt);
  EXPECT_EQ(ParseNonNegative("4x", 100), std::nullopt);
  EXPECT_EQ(ParseNonNegative("", 100), std::nullopt);
  EXPECT_EQ(ParseNonNegative("99999999999999999999", 100), std::nullopt);
}

}  // namespace
}  // namespace ddprun::preflight
