#pragma once
// Tests that need a part of the machine (etcd, the namespace test bed, torch, ...) skip where it
// is missing, unless DDPRUN_REQUIRE names the part: then they fail, so that CI, which installs
// every part, never passes on a skip. docs/testing.md says how to use it.
//
//   void SetUp() override {
//     DDPRUN_REQUIRE_OR_SKIP("etcd", test::CommandExists("etcd"), "etcd is not installed");
//   }
//
// Header only: every test binary already has the source tree on its include path.

#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::test {

/// Every part a test may require. A new kind of dependency (a new daemon, a new device) is
/// added here, to docs/testing.md, and to what scripts/test.sh requires on CI.
inline constexpr std::array<std::string_view, 8> kRequirableParts = {
    "etcd",        // etcd and etcdctl (Debian: etcd-server, etcd-client)
    "testbed",     // root, network and mount namespaces, iproute2, iptables
    "torch",       // /usr/bin/python3 with torch.distributed (Debian: python3-torch)
    "chromium",    // a headless Chromium (Debian: chromium)
    "sshd",        // an OpenSSH server (Debian: openssh-server)
    "slurm",       // Slurm's daemons and commands (Debian: slurmctld, slurmd, slurm-client)
    "prometheus",  // a Prometheus server (Debian: prometheus)
    "gpu",         // an NVIDIA GPU with its driver, CUDA and NCCL (tests/gpu/run.sh)
};

/// What DDPRUN_REQUIRE asks for, read from the environment's two variables.
struct Requirements {
  std::vector<std::string> parts;  // in the order written, without blanks
  std::string error;               // "" or why the variables are wrong (an unknown part)
};

inline bool KnownPart(std::string_view part) {
  for (std::string_view known : kRequirableParts) {
    if (known == part) return true;
  }
  return false;
}

/// Parses `require` (DDPRUN_REQUIRE: parts separated by commas, blanks ignored) and
/// `require_testbed` (the older DDPRUN_REQUIRE_TESTBED: "1" adds "testbed"); either may be null.
/// A name that no test knows is an error rather than ignored: a typo in CI's list would
/// otherwise turn a required part back into a skipped one.
inline Requirements ParseRequirements(const char* require, const char* require_testbed) {
  Requirements result;
  std::string_view rest = require ? require : "";
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (item.empty()) continue;
    if (!KnownPart(item)) {
      std::string known;
      for (std::string_view k : kRequirableParts) known += (known.empty() ? "" : ", ") + std::string(k);
      result.error = "DDPRUN_REQUIRE names \"" + std::string(item) + "\", which is no part a test knows (" +
                     known + "; tests/support/require.h lists them)";
      continue;
    }
    result.parts.emplace_back(item);
  }
  if (require_testbed && std::string_view(require_testbed) == "1") result.parts.emplace_back("testbed");
  return result;
}

inline Requirements RequirementsFromEnvironment() {
  return ParseRequirements(std::getenv("DDPRUN_REQUIRE"), std::getenv("DDPRUN_REQUIRE_TESTBED"));
}

inline bool Names(const Requirements& requirements, std::string_view part) {
  for (const std::string& p : requirements.parts) {
    if (p == part) return true;
  }
  return false;
}

/// Whether `program` is on PATH.
inline bool CommandExists(const std::string& program) {
  return std::system(("command -v '" + program + "' >/dev/null 2>&1").c_str()) == 0;
}

/// Whether /usr/bin/python3 (the one the e2e jobs run) imports `module`.
inline bool PythonImports(const std::string& module) {
  return std::system(("/usr/bin/python3 -c 'import " + module + "' >/dev/null 2>&1").c_str()) == 0;
}

/// Whether the e2e jobs can run PyTorch DDP.
inline bool TorchAvailable() { return PythonImports("torch.distributed"); }

inline constexpr std::string_view kTorchMissing =
    "python3-torch is not installed (DDPRUN_WITH_TORCH=1 scripts/install-deps.sh)";

}  // namespace ddprun::test

/// In a test body or SetUp: when `available` is false, fails the test if DDPRUN_REQUIRE names
/// `part` and skips it otherwise, with `why` (anything `<<` takes); returns from the function
/// either way. When `available` is true it does nothing, except failing on a DDPRUN_REQUIRE
/// that names an unknown part. `part` must be one of ddprun::test::kRequirableParts.
#define DDPRUN_REQUIRE_OR_SKIP(part, available, why)                                                    \
  do {                                                                                                  \
    static_assert(sizeof(part) > 1, "DDPRUN_REQUIRE_OR_SKIP takes the part's name as a literal");       \
    const auto ddprun_requirements = ::ddprun::test::RequirementsFromEnvironment();                     \
    if (!::ddprun::test::KnownPart(part)) {                                                             \
      GTEST_FAIL() << "DDPRUN_REQUIRE_OR_SKIP(\"" << (part) << "\"): no such part in kRequirableParts"; \
    }                                                                                                   \
    if (!ddprun_requirements.error.empty()) GTEST_FAIL() << ddprun_requirements.error;                  \
    if (!(available)) {                                                                                 \
      if (::ddprun::test::Names(ddprun_requirements, part)) {                                           \
        GTEST_FAIL() << "DDPRUN_REQUIRE names " << (part) << ", which this machine lacks: " << why;     \
      }                                                                                                 \
      GTEST_SKIP() << why << " (with DDPRUN_REQUIRE=" << (part) << " this fails instead)";              \
    }                                                                                                   \
  } while (false)
