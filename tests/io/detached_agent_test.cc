// The host's side of `up --detach`, `status` and `down` (runner/io/detached_agent.h) against
// real processes and planted files: only the recorded agent is ever recognised as ours, nothing
// is written through a planted link, and a warm template's reported pid is adopted only when it
// is provably our worker.

#include "runner/io/detached_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "runner/io/process_tree.h"
#include "runner/io/warm_template.h"

namespace ddprun::io {
namespace {

using Verdict = Recognition::Verdict;
namespace fs = std::filesystem;

class DetachedAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddprun-detached-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (pid_t pid : started_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    fs::remove_all(dir_);
  }
  std::string Read(const fs::path& path) const {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void Write(const fs::path& path, const std::string& text) const { std::ofstream(path) << text; }
  DetachedFiles Files() const { return {dir_.string() + "/state", "up-n0.pid", "up-n0.console"}; }
  /// A `sleep` child of this test, as an unrelated process of the same user would be.
  pid_t Sleeper() {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    started_.push_back(pid);
    return pid;
  }
  Result<std::optional<AgentIdentity>> ReadBack() const {
    auto dir = OpenStateDir(Files().state_dir);
    EXPECT_TRUE(dir && *dir);
    return ReadPidFile((*dir)->get(), "up-n0.pid", "up-n0.pid");
  }

  /// Starts `path` with `argv` in a child whose environment is only a fresh launch token, looks
  /// at it with Recognise until it is gone while another thread reaps it at once (as init reaps a
  /// detached agent), and counts the looks that found it ours. Every verdict of "not ours" after
  /// the first of those is kept in `wrong`: until its exec the child carries this test's
  /// environment and is not the agent yet.
  void LookUntilGone(const char* path, std::vector<const char*> argv, int& looks_while_ours,
                     std::vector<std::string>& wrong) {
    AgentIdentity identity;
    identity.token = NewLaunchToken();
    identity.boot_id = BootId();
    std::string variable = std::string(kLaunchTokenVariable) + "=" + identity.token;
    char* env[] = {variable.data(), nullptr};
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(path, const_cast<char* const*>(argv.data()), env);
      ::_exit(127);
    }
    ASSERT_GT(pid, 0);
    ProcessEntry entry;
    const bool started = ReadProcessEntry(pid, entry);
    std::thread reaper([pid] { ::waitpid(pid, nullptr, 0); });
    if (!started) {
      reaper.join();
      return;
    }
    identity.pid = pid;
    identity.start_ticks = entry.start_time;
    bool ours = false;
    for (Recognition seen; (seen = Recognise(identity)).verdict != Verdict::kGone;) {
      if (seen.verdict == Verdict::kOurs) {
        ours = true;
        ++looks_while_ours;
      } else if (ours) {
        wrong.push_back(seen.why);
      }
    }
    reaper.join();
  }

  fs::path dir_;
  std::vector<pid_t> started_;
};

TEST_F(DetachedAgentTest, TheStartedAgentIsRecognisedUntilItExits) {
  auto started = StartDetachedAgent({"/bin/sh", "-c", "echo hello from the agent; exec sleep 60"},
                                    {"PATH=/usr/bin:/bin"}, dir_.string(), Files());
  ASSERT_TRUE(started) << started.error();
  // Not our child once we are gone, but for the test it is: reaped in TearDown.
  started_.push_back(started->pid);
  auto identity = ReadBack();
  ASSERT_TRUE(identity && *identity) << (identity ? "" : identity.error());
  EXPECT_EQ((*identity)->pid, started->pid);
  EXPECT_EQ((*identity)->token.size(), 32u);
  EXPECT_EQ(Recognise(**identity).verdict, Verdict::kOurs) << Recognise(**identity).why;
  // Its own session, its token in its environment.
  ProcessEntry entry;
  ASSERT_TRUE(ReadProcessEntry(started->pid, entry));
  EXPECT_EQ(::getsid(started->pid), started->pid);
  for (int i = 0; i < 100 && Read(dir_ / "state/up-n0.console").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Read(dir_ / "state/up-n0.console"), "hello from the agent\n");
  // The shell execs `sleep` after its echo: the environment is read once that exec is done
  // (read in the middle of one it is empty; see AnAgentThatExecsWhileItIsRecognisedIsNeverNotOurs).
  const std::string proc = "/proc/" + std::to_string(started->pid);
  for (int i = 0; i < 100 && (Read(proc + "/comm") != "sleep\n" || !ReadProcessEntry(started->pid, entry) ||
                              entry.env_end == 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(Read(proc + "/environ").find("DDPRUN_LAUNCH_TOKEN=" + (*identity)->token), std::string::npos);
  EXPECT_EQ(Recognise(**identity).verdict, Verdict::kOurs);

  ::kill(started->pid, SIGKILL);
  ::waitpid(started->pid, nullptr, 0);
  const Recognition gone = Recognise(**identity);
  EXPECT_EQ(gone.verdict, Verdict::kGone);
  EXPECT_EQ(gone.why, "pid " + std::to_string(started->pid) + " has exited");
}

// The attack of issue 36: a pid file naming someone else's process. With its true start time
// and boot (both readable by anyone in /proc) it is still not ours: it lacks the token.
TEST_F(DetachedAgentTest, APlantedPidFileNamingAnotherProcessIsNotOurs) {
  const pid_t victim = Sleeper();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // exec'd
  ProcessEntry entry;
  ASSERT_TRUE(ReadProcessEntry(victim, entry));
  AgentIdentity planted;
  planted.pid = victim;
  planted.start_ticks = entry.start_time;
  planted.boot_id = BootId();
  planted.token = std::string(32, 'a');
  const Recognition seen = Recognise(planted);
  EXPECT_EQ(seen.verdict, Verdict::kNotOurs);
  EXPECT_EQ(seen.why, "pid " + std::to_string(victim) +
                          " does not carry the launch token of the agent that was started");
  // A stale file whose pid was reused since: the start time differs.
  planted.start_ticks -= 1;
  EXPECT_EQ(Recognise(planted).verdict, Verdict::kGone);
  // Another boot: not the recorded process, whatever runs under the pid now.
  planted.start_ticks += 1;
  planted.boot_id = "00000000-0000-0000-0000-000000000000";
  EXPECT_EQ(Recognise(planted).verdict, Verdict::kGone);
}

// What failed CI once: `down` looked at node 1's agent just as it ended with the job (node 0's
// `down` had ended it) and called it not ours, since its environment could no longer be read.
// An agent that exits while it is recognised is gone, never "not ours": processes that carry
// their token exit under a tight loop of Recognise, each reaped at once by another thread (as
// init reaps a detached agent), so the loop meets every stage of an exit.
TEST_F(DetachedAgentTest, AnAgentThatExitsWhileItIsRecognisedIsGoneNeverNotOurs) {
  constexpr int kProcesses = 300;
  int looks_while_ours = 0;
  std::vector<std::string> wrong;
  for (int i = 0; i < kProcesses && wrong.size() < 5; ++i) {
    LookUntilGone("/bin/sleep", {"sleep", "0.005"}, looks_while_ours, wrong);
  }
  EXPECT_TRUE(wrong.empty()) << wrong.size()
                             << " exiting agents were called not ours; the first: " << wrong.front();
  EXPECT_GT(looks_while_ours, kProcesses);  // the loop did look at live agents
}

// What failed CI next (ASan, a loaded machine): `Recognise` just after `StartDetachedAgent` called
// the agent not ours. An exec replaces the process's memory (and closes the start's report pipe)
// before it lays out the new program's environment: in between, /proc/<pid>/environ reads empty.
// The agents here carry their token through 40 execs each (`sh -c` running itself again) under
// a tight loop of Recognise, which meets every stage of an exec; once seen ours, never not ours.
TEST_F(DetachedAgentTest, AnAgentThatExecsWhileItIsRecognisedIsNeverNotOurs) {
  constexpr int kProcesses = 25;
  const char* script = "n=$1; [ \"$n\" -lt 40 ] && exec /bin/sh -c \"$0\" \"$0\" $((n+1)); exit 0";
  int looks_while_ours = 0;
  std::vector<std::string> wrong;
  for (int i = 0; i < kProcesses && wrong.size() < 5; ++i) {
    LookUntilGone("/bin/sh", {"sh", "-c", script, script, "0"}, looks_while_ours, wrong);
  }
  EXPECT_TRUE(wrong.empty()) << wrong.size()
                             << " looks at agents in an exec called them not ours; the first: "
                             << wrong.front();
  EXPECT_GT(looks_while_ours, kProcesses);  // the loop did look at live agents between execs
}

// A kernel thread has no memory, so no environment ever: not ours at once, not waited for as if
// it were in an exec (run as root, where the owner check does not already refuse it): its
// environment cannot be read at all.
TEST_F(DetachedAgentTest, AKernelThreadIsNotOursAtOnce) {
  ProcessEntry entry;
  for (const ProcessEntry& seen : ReadProcessTable()) {
    if (seen.kernel_thread() && seen.pid > 1) {
      entry = seen;
      break;
    }
  }
  if (entry.pid == 0) GTEST_SKIP() << "no kernel thread is seen in this pid namespace";
  AgentIdentity planted;
  planted.pid = entry.pid;
  planted.start_ticks = entry.start_time;
  planted.boot_id = BootId();
  planted.token = std::string(32, 'a');
  const auto before = std::chrono::steady_clock::now();
  const Recognition seen = Recognise(planted);
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(500));
  EXPECT_EQ(seen.verdict, Verdict::kNotOurs) << seen.why;
}

TEST_F(DetachedAgentTest, PidsThatStandForAGroupInitOrEveryProcessAreRefusedWhenRead) {
  for (const char* pid : {"-1", "0", "1", "-4242", "4294967297"}) {
    const std::string text = std::string("{\"pid\": ") + pid +
                             ", \"start_ticks\": 1, \"boot_id\": \"b\", \"token\": \"" +
                             std::string(32, 'a') + "\"}";
    const auto parsed = ParseIdentity(text);
    ASSERT_FALSE(parsed) << pid;
    EXPECT_NE(parsed.error().find("which no ddprun agent has"), std::string::npos) << parsed.error();
  }
  EXPECT_FALSE(ParseIdentity("4242\n"));  // the old shell-written file: a bare pid proves nothing
  EXPECT_FALSE(ParseIdentity("{\"pid\": 4242}"));
  EXPECT_FALSE(
      ParseIdentity("{\"pid\": 4242, \"start_ticks\": 1, \"boot_id\": \"b\", \"token\": \"short\"}"));
}

// Planted links under the two names the agent writes: replaced, their targets untouched.
TEST_F(DetachedAgentTest, NothingIsWrittenThroughLinksPlantedUnderThePidAndConsoleNames) {
  fs::create_directories(dir_ / "state");
  Write(dir_ / "victim-pid", "precious\n");
  Write(dir_ / "victim-console", "precious\n");
  fs::create_symlink(dir_ / "victim-pid", dir_ / "state/up-n0.pid");
  fs::create_symlink(dir_ / "victim-console", dir_ / "state/up-n0.console");
  auto started =
      StartDetachedAgent({"/bin/sh", "-c", "echo console line; exec sleep 60"}, {}, dir_.string(), Files());
  ASSERT_TRUE(started) << started.error();
  started_.push_back(started->pid);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Read(dir_ / "victim-pid"), "precious\n");
  EXPECT_EQ(Read(dir_ / "victim-console"), "precious\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir_ / "state/up-n0.pid")));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir_ / "state/up-n0.console")));
  auto identity = ReadBack();
  ASSERT_TRUE(identity && *identity);
  EXPECT_EQ((*identity)->pid, started->pid);
}

TEST_F(DetachedAgentTest, APidFileThatIsALinkAFifoOrTooLargeIsRefusedWhenRead) {
  fs::create_directories(dir_ / "state");
  Write(dir_ / "elsewhere", "{}");
  fs::create_symlink(dir_ / "elsewhere", dir_ / "state/up-n0.pid");
  auto read = ReadBack();
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error(), "up-n0.pid is a symbolic link, not a regular file");
  fs::remove(dir_ / "state/up-n0.pid");
  ASSERT_EQ(::mkfifo((dir_ / "state/up-n0.pid").c_str(), 0600), 0);
  read = ReadBack();  // at once: a FIFO with no writer does not block the read
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error(), "up-n0.pid is a FIFO, not a regular file");
  fs::remove(dir_ / "state/up-n0.pid");
  Write(dir_ / "state/up-n0.pid", std::string(kMaxPidFile + 1, ' '));
  read = ReadBack();
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error(), "up-n0.pid is larger than 4096 bytes: not a pid file");
}

TEST_F(DetachedAgentTest, AProgramThatCannotBeExecutedIsAFailureNotAPid) {
  auto started = StartDetachedAgent({(dir_ / "no-such-ddprun").string()}, {}, dir_.string(), Files());
  ASSERT_FALSE(started);
  EXPECT_NE(started.error().find("No such file or directory"), std::string::npos) << started.error();
}

TEST_F(DetachedAgentTest, TheConsoleTailIsItsLastLines) {
  fs::create_directories(dir_ / "state");
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "line " + std::to_string(i) + "\n";
  Write(dir_ / "state/up-n0.console", text);
  auto dir = OpenStateDir(Files().state_dir);
  ASSERT_TRUE(dir && *dir);
  auto tail = ConsoleTail((*dir)->get(), "up-n0.console", "console", 3);
  ASSERT_TRUE(tail) << tail.error();
  EXPECT_EQ(*tail, (std::vector<std::string>{"line 4997", "line 4998", "line 4999"}));
}

// `up --copy`'s host side: a link planted under the job file's own name is replaced, not
// followed.
TEST_F(DetachedAgentTest, ACopyReplacesALinkPlantedUnderTheJobFilesName) {
  Write(dir_ / "victim", "precious\n");
  fs::create_directories(dir_ / "jobs");
  fs::create_symlink(dir_ / "victim", dir_ / "jobs/job.toml");
  ASSERT_TRUE(ReplaceFileAt((dir_ / "jobs/job.toml").string(), "version = 1\n"));
  EXPECT_EQ(Read(dir_ / "victim"), "precious\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir_ / "jobs/job.toml")));
  EXPECT_EQ(Read(dir_ / "jobs/job.toml"), "version = 1\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "jobs"), fs::directory_iterator()), 1);
}

// A warm template's answer names the worker the agent will signal as a group: adopted only
// when it is the agent's own child leading its own group.
TEST(WarmAdoptionTest, OnlyAChildLeadingItsOwnGroupIsAdopted) {
  EXPECT_EQ(WhyNotOurWorker(1), "which is no worker's pid");
  EXPECT_EQ(WhyNotOurWorker(-1), "which is no worker's pid");
  EXPECT_EQ(WhyNotOurWorker(0), "which is no worker's pid");
  EXPECT_NE(WhyNotOurWorker(::getppid()).find("which is not a child of this agent"), std::string::npos);
  const pid_t same_group = ::fork();
  if (same_group == 0) {
    ::pause();
    ::_exit(0);
  }
  const pid_t own_group = ::fork();
  if (own_group == 0) {
    ::setpgid(0, 0);
    ::pause();
    ::_exit(0);
  }
  ::setpgid(own_group, own_group);  // either side may win the race; both set the same
  EXPECT_NE(WhyNotOurWorker(same_group).find("which does not lead its own process group"), std::string::npos);
  EXPECT_EQ(WhyNotOurWorker(own_group), "");
  for (pid_t pid : {same_group, own_group}) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
}

}  // namespace
}  // namespace ddprun::io
