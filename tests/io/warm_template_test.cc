// WarmTemplate (runner/io/warm_template.h) against templates that lie: a fake template.py that
// answers with a pid that is not our worker, with the wrong number of workers, before it was
// asked, or not at all. Each is taken for broken or hung, killed and replaced, and the workers
// of the request start cold with the reason; nothing of the job runs in the meantime and the
// loop never waits for the template.

#include "runner/io/warm_template.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Speaks the template's protocol (worker/warm/template.py) and misbehaves as FAKE_MODE says.
constexpr const char* kFakeTemplate = R"py(import json, os, socket, time
ctrl = socket.socket(fileno=3)
json.loads(ctrl.recv(1 << 20))
mode = os.environ["FAKE_MODE"]
ctrl.send(json.dumps({"ready": True, "import_s": 0.0}).encode())
if mode == "unasked":
    ctrl.send(json.dumps({"id": 99, "started": []}).encode())  # no request has that id
while True:
    data, _, _, _ = ctrl.recvmsg(1 << 20, socket.CMSG_SPACE(256 * 4))
    if not data:
        os._exit(0)
    request = json.loads(data)
    n = len(request["workers"])
    if mode == "silent":
        time.sleep(3600)
    if mode == "twice":  # one real fork (our child, leading its group), reported for both workers
        r, w = os.pipe()
        if os.fork() == 0:
            if os.fork() == 0:
                os.setpgid(0, 0)
                os.write(w, b"%d" % os.getpid())
                time.sleep(30)
            os._exit(0)
        os.wait()
        pid = int(os.read(r, 32))
        while True:  # until it belongs to the agent, a child subreaper
            with open("/proc/%d/stat" % pid) as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) != os.getpid():
                    break
            time.sleep(0.01)
        ctrl.send(json.dumps({"id": request["id"], "started": [{"pid": pid}] * n}).encode())
        continue
    answers = {"lie": [{"pid": 1}] * n, "own-pid": [{"pid": os.getpid()}] * n, "wrong-count": [],
               "cold": [{"cold": "m read RANK"}] * n, "unasked": [{"error": "x"}] * n}[mode]
    ctrl.send(json.dumps({"id": request["id"], "started": answers}).encode())
)py";

class WarmTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddprun-warm-template-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ + "/fake_template.py") << kFakeTemplate;
    std::ofstream(dir_ + "/job.py") << "print('job code ran')\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts a fake template in `mode`, asks it for two workers, and returns what became of them
  // and of the template.
  struct Outcome {
    std::vector<Result<pid_t>> results;
    std::vector<std::string> said;
    int loop_turns_while_waiting = 0;
  };
  Outcome Run(const std::string& mode) {
    boost::asio::io_context io;
    Outcome outcome;
    WarmTemplate::Options options;
    options.command = *ParsePythonCommand({"/usr/bin/python3", "job.py"});
    options.executable = "/usr/bin/python3";
    options.preload = {"json"};
    options.template_script = dir_ + "/fake_template.py";
    options.workdir = dir_;
    options.env = {"FAKE_MODE=" + mode, "PATH=/usr/bin:/bin"};
    options.say = [&outcome](bool, const std::string& text) { outcome.said.push_back(text); };
    bool settled = false;
    options.settled = [&settled] { settled = true; };
    options.answer_limit = 300ms;
    WarmTemplate warm(io, options);
    warm.Start();
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!settled && std::chrono::steady_clock::now() < deadline) io.run_one_for(100ms);
    EXPECT_EQ(warm.state(), WarmTemplate::State::kReady) << mode;
    const pid_t first_template = warm.pid();

    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    UniqueFd out_read(fds[0]), out_write(fds[1]);
    std::vector<WarmTemplate::ForkStart> starts;
    std::vector<UniqueFd> go_ends;
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
      go_ends.emplace_back(fds[0]);
      go_ends.emplace_back(fds[1]);
      WarmTemplate::Request request;
      request.argv = {"job.py"};
      request.env = {"RANK=" + std::to_string(rank)};
      request.cwd = dir_;
      starts.push_back(WarmTemplate::ForkStart{request, out_write.get(), out_write.get(), fds[0]});
    }
    std::optional<std::vector<Result<pid_t>>> answered;
    warm.Fork(std::move(starts), -1,
              [&answered](std::vector<Result<pid_t>> results) { answered = std::move(results); });
    EXPECT_FALSE(answered.has_value());  // never within the call
    while (!answered && std::chrono::steady_clock::now() < deadline) {
      if (io.run_one_for(100ms) > 0) ++outcome.loop_turns_while_waiting;
    }
    EXPECT_TRUE(answered.has_value()) << mode;
    if (answered) outcome.results = std::move(*answered);
    if (mode != "cold") {
      // Replaced: the first template is gone (killed and reaped), a second one started.
      EXPECT_NE(warm.pid(), first_template) << mode;
      EXPECT_NE(::kill(first_template, 0), 0) << mode;
    }
    return outcome;
  }

  std::string dir_;
};

std::string Joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

TEST_F(WarmTemplateTest, APidThatIsNotOurWorkerIsRefusedAndTheTemplateReplaced) {
  for (const std::string mode : {"lie", "own-pid"}) {
    const Outcome outcome = Run(mode);
    ASSERT_EQ(outcome.results.size(), 2u) << mode;
    for (const auto& result : outcome.results) {
      ASSERT_FALSE(result) << mode;
      EXPECT_NE(result.error().find("as a forked worker, which"), std::string::npos) << result.error();
      EXPECT_NE(result.error().find("taken for broken and killed"), std::string::npos) << result.error();
    }
    EXPECT_NE(
        Joined(outcome.said).find("a new template is starting, and workers start cold until it is ready"),
        std::string::npos)
        << Joined(outcome.said);
  }
}

TEST_F(WarmTemplateTest, OneForkReportedForTwoRanksIsBroken) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);  // as the agent is
  const Outcome outcome = Run("twice");
  ::prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
  ASSERT_EQ(outcome.results.size(), 2u);
  ASSERT_TRUE(outcome.results[0]) << outcome.results[0].error();  // the first is ours, checked
  EXPECT_NE(outcome.results[1].error().find(
                fmt::format("reported pid {} as a forked worker, which is already another "
                            "rank's worker",
                            *outcome.results[0])),
            std::string::npos)
      << outcome.results[1].error();
  ::kill(*outcome.results[0], SIGKILL);
  ::waitpid(*outcome.results[0], nullptr, 0);
}

TEST_F(WarmTemplateTest, AnAnswerForOtherWorkersOrOneNotAskedForIsBroken) {
  const Outcome wrong = Run("wrong-count");
  ASSERT_EQ(wrong.results.size(), 2u);
  EXPECT_NE(wrong.results[0].error().find("the template answered 0 workers for a request of 2"),
            std::string::npos)
      << wrong.results[0].error();
  const Outcome unasked = Run("unasked");
  ASSERT_EQ(unasked.results.size(), 2u);
  EXPECT_NE(Joined(unasked.said).find("the template answered a request that was not made: taken for broken"),
            std::string::npos)
      << Joined(unasked.said);
}

TEST_F(WarmTemplateTest, ATemplateThatDoesNotAnswerIsTakenForHungWhileTheLoopRuns) {
  const Outcome outcome = Run("silent");
  ASSERT_EQ(outcome.results.size(), 2u);
  EXPECT_NE(outcome.results[1].error().find("did not answer within 0.3 s: taken for hung and killed"),
            std::string::npos)
      << outcome.results[1].error();
}

TEST_F(WarmTemplateTest, AWorkerThatWouldDifferIsToldColdWithTheReasonAndTheTemplateKept) {
  const Outcome outcome = Run("cold");
  ASSERT_EQ(outcome.results.size(), 2u);
  EXPECT_EQ(outcome.results[0].error(), "a fork would differ from a cold start: m read RANK");
}

}  // namespace
}  // namespace ddprun::io
