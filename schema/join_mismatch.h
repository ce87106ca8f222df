#pragma once
// What node 0 says when a joining node's canonical form differs from its own: the difference
// named as what it is (the job file, the code, the arguments after `--`, the libraries), one
// line per field, and the hint that fits.

#include <string>

namespace ddprun {

struct JoinRefusal {
  std::string message;  // "node 1 (host gpu-02) runs different code than node 0 ...:\n  ...\nhint: ..."
  std::string why;      // the short form for the rendezvous summary: "it runs different code"
};

/// A join whose fingerprint differs from node 0's (`ours`: node 0's canonical form).
JoinRefusal DescribeRefusedJoin(const std::string& ours, const std::string& theirs, int node_rank,
                                const std::string& host);

/// A join with the same fingerprint whose advisory lines differ (job.code_check or
/// job.library_check = "warn"): the warning node 0 logs, "" when nothing differs.
std::string DescribeAdvisoryDifference(const std::string& ours, const std::string& theirs,
                                       int node_rank, const std::string& host);

}  // namespace ddprun
