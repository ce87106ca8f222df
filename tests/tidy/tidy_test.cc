// The tidy check: runner/core, runner/host, report and sim stay free of clocks, threads, randomness,
// the environment, sockets, processes and files (DESIGN.md section 3); and the check itself
// catches each banned use.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/tidy/tidy.h"

namespace ddprun::testing {
namespace {

// One finding per line: "rule: code".
std::vector<std::string> Describe(std::string_view source) {
  std::vector<std::string> out;
  for (const TidyFinding& f : ScanForBannedUses(source)) out.push_back(f.rule + ": " + f.text);
  return out;
}

TEST(TidyTest, EachBannedUseIsFound) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"auto t = std::chrono::steady_clock::now();", "a clock"},
      {"time_t t = time(nullptr);", "a clock"},
      {"gettimeofday(&tv, nullptr);", "a clock"},
      {"clock_gettime(CLOCK_MONOTONIC, &ts);", "a clock"},
      {"std::thread worker([] {});", "a thread"},
      {"auto f = std::async(run);", "a thread"},
      {"pthread_create(&t, nullptr, f, nullptr);", "a thread"},
      {"int r = rand();", "a random generator outside sim/prng.h"},
      {"srand(7);", "a random generator outside sim/prng.h"},
      {"std::random_device device;", "a random generator outside sim/prng.h"},
      {"std::uniform_int_distribution<int> d(0, 9);", "a random generator outside sim/prng.h"},
      {"const char* home = getenv(\"HOME\");", "the environment"},
      {"int fd = socket(AF_INET, SOCK_STREAM, 0);", "a socket"},
      {"::connect(fd, addr, len);", "a socket"},
      {"pid_t pid = fork();", "process spawning"},
      {"execvp(argv[0], argv);", "process spawning"},
      {"FILE* p = popen(\"ls\", \"r\");", "process spawning"},
      {"system(\"rm -rf x\");", "process spawning"},
      {"FILE* f = fopen(path, \"w\");", "file I/O"},
      {"std::ofstream out(path);", "file I/O"},
      {"std::ifstream in(path);", "file I/O"},
      {"int fd = open(path, O_RDONLY);", "file I/O"},
      {"#include <boost/asio.hpp>", "Asio"},
      {"#include <asio/io_context.hpp>", "Asio"},
      {"#include <boost/process/v2.hpp>", "Boost.Process"},
      {"#include <thread>", "a thread"},
      {"#include <fstream>", "file I/O"},
  };
  for (const auto& [code, rule] : cases) {
    EXPECT_EQ(Describe(code), std::vector<std::string>{rule + ": " + code}) << code;
  }
}

TEST(TidyTest, OurPortsCommentsAndStringsAreAllowed) {
  const std::string source = R"x(// no clock, socket or thread here: time(nullptr) would be one
/* std::thread and fork() in a block comment */
const TimePoint now = clock_->Now();
transport.Connect(addr, port);
ports_.transport->Listen(addr, port);
Log("cannot open the file; run `system(1)` or getenv(HOME)");
const int64_t n = 1'000'000;
const auto t = spec.simulate.train_time();
std::string s = R"(socket())";
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;
)x";
  EXPECT_EQ(Describe(source), std::vector<std::string>{});
}

TEST(TidyTest, FindingsNameTheLine) {
  const std::vector<TidyFinding> findings = ScanForBannedUses("int a;\n\nint r = rand();\n");
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].line, 3);
}

// Files allowed one banned use, and why. Empty today: the trace and page writers (report/) take
// an std::ostream and the event log's reader takes text; the CLI (cli/cmd_simulate.cc,
// cli/cmd_report.cc) opens the files.
const std::vector<std::pair<std::string, std::string>> kAllowed = {};

TEST(TidyTest, CoreHostReportAndSimUseNoClockThreadRandomEnvSocketProcessOrFile) {
  namespace fs = std::filesystem;
  const fs::path root = DDPRUN_SOURCE_DIR;
  std::vector<std::string> found;
  int files = 0;
  for (const char* dir : {"runner/core", "runner/host", "report", "sim"}) {
    std::vector<fs::path> paths;
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = entry.path().extension();
      if (entry.is_regular_file() && (ext == ".h" || ext == ".cc")) paths.push_back(entry.path());
    }
    std::sort(paths.begin(), paths.end());
    for (const fs::path& path : paths) {
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      ++files;
      const std::string relative = fs::relative(path, root).generic_string();
      for (const TidyFinding& f : ScanForBannedUses(text.str())) {
        const bool allowed = std::any_of(kAllowed.begin(), kAllowed.end(), [&](const auto& entry) {
          return entry.first == relative && entry.second == f.rule;
        });
        if (!allowed)
          found.push_back(relative + ":" + std::to_string(f.line) + ": " + f.rule + ": " + f.text);
      }
    }
  }
  EXPECT_GT(files, 20) << "the scan found the source tree";
  EXPECT_EQ(found, std::vector<std::string>{});
}

}  // namespace
}  // namespace ddprun::testing
