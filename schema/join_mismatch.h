#pragma once
// What node 0 says when a joining node's canonical form differs from its own: the difference
// named as what it is (the job file, the code, the arguments after `--`, the libraries), one
// line per field, and the hint that fits.

#include <string>
#include <string_view>

namespace ddprun {

struct JoinRefusal {
  std::string message;  // "node 1 (host gpu-02) runs different code than node 0 ...:\n  ...\nhint: ..."
  std::string why;      // the short form for the rendezvous summary: "it runs different code"
};

/// A join whose fingerprint differs from the coordinator's (`ours`: its canonical form), from
/// `who` ("node 1", "spare 0": the agent as it was started). `us` names the coordinator in the
/// text: node 0, or under etcd whichever agent holds the role.
JoinRefusal DescribeRefusedJoin(const std::string& ours, const std::string& theirs, std::string_view who,
                                const std::string& host, std::string_view us = "node 0");

/// A join with the same fingerprint whose advisory lines differ (job.code_check or
/// job.library_check = "warn"): the warning node 0 logs, "" when nothing differs.
std::string DescribeAdvisoryDifference(const std::string& ours, const std::string& theirs,
                                       std::string_view who, const std::string& host,
                                       std::string_view us = "node 0");

}  // namespace ddprun
