// `up --install`'s host side (runner/io/remote_install.h) run by /bin/sh here, as ssh would run
// it on a host, with HOME a scratch folder: the copy is installed, found again, and never run
// when its folder was changed, planted, left half-written, shared with other users or linked
// elsewhere; a copy the host cannot run is refused before any job needs it. The same lines
// through a real sshd on the namespace bed are in tests/e2e/up_test.cc.

#include "runner/io/remote_install.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/io/ssh_command.h"
#include "schema/plan.h"

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct ShellRun {
  int status = -1;
  std::string out, err;
};

class RemoteInstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddprun-install-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
    home_ = root_ + "/home";
    fs::create_directories(home_);
    ::chmod(home_.c_str(), 0755);
    // A build as ReadLocalCopy finds it: the binary, and ../share/ddprun beside its folder.
    fs::create_directories(root_ + "/build/cli");
    fs::create_directories(root_ + "/build/share/ddprun/python/ddprun/__pycache__");
    WriteExe("#!/bin/sh\necho 'ddprun 9.9.9'\necho 'commit test'\n");
    Write(root_ + "/build/share/ddprun/python/ddprun/__init__.py", "BEACON = 1\n");
    Write(root_ + "/build/share/ddprun/python/ddprun/__pycache__/__init__.cpython-311.pyc", "local bytecode");
  }
  void TearDown() override {
    std::error_code ec;
    Run("chmod -R u+w " + ShellQuote(root_), "");
    fs::remove_all(root_, ec);
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  void WriteExe(const std::string& text) {
    Write(root_ + "/build/cli/ddprun", text);
    ::chmod((root_ + "/build/cli/ddprun").c_str(), 0755);
  }
  LocalCopy Copy() {
    auto copy = ReadLocalCopy(root_ + "/build/cli/ddprun", "9.9.9", true);
    EXPECT_TRUE(copy) << copy.error();
    return copy ? *copy : LocalCopy{};
  }
  /// `line` as ssh runs it on a host: the user's shell, HOME, a PATH without ddprun.
  ShellRun Run(const std::string& line, const std::string& input) {
    const std::string in = root_ + "/stdin", out = root_ + "/stdout", err = root_ + "/stderr";
    Write(in, input);
    ShellRun run;
    const std::string command = "env -i HOME=" + ShellQuote(home_) + " PATH=/usr/bin:/bin /bin/sh -c " +
                                ShellQuote(line) + " <" + in + " >" + out + " 2>" + err;
    const int status = std::system(command.c_str());
    run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.out = Read(out);
    run.err = Read(err);
    return run;
  }
  ShellRun Install(const LocalCopy& copy) { return Run(InstallLine(copy), *copy.tar); }
  /// Which ddprun a remote line would run: the probe's `--version` through the selection.
  ShellRun Probe(const LocalCopy& copy) {
    return Run(ProbeCommand(RemoteProgram::ThisBuildOrPath(copy.id, copy.manifest_sum), "/nonexistent", true),
               "");
  }
  std::string CopyDir(const LocalCopy& copy) const { return home_ + "/.ddprun/" + copy.id; }
  std::vector<std::string> Entries(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string root_, home_;
};

TEST_F(RemoteInstallTest, TheManifestIsWhatSha256sumComputesThereWithoutBytecode) {
  const LocalCopy copy = Copy();
  EXPECT_EQ(copy.files, 2u);
  EXPECT_THAT(copy.id, StartsWith("9.9.9-"));
  EXPECT_EQ(copy.id.size(), 6u + 12u);
  EXPECT_THAT(copy.manifest, HasSubstr("  ./bin/ddprun\n"));
  EXPECT_THAT(copy.manifest, HasSubstr("  ./share/ddprun/python/ddprun/__init__.py\n"));
  EXPECT_EQ(copy.manifest.find("pycache"), std::string::npos);
  // The same files on disk give the same sum through the host's own tools.
  const ShellRun unpacked =
      Run("mkdir \"$HOME/x\" && cd \"$HOME/x\" && tar -xf - && find . -type f -print | LC_ALL=C sort | "
          "xargs -d '\\n' sha256sum -- | sha256sum",
          *copy.tar);
  ASSERT_EQ(unpacked.status, 0) << unpacked.err;
  EXPECT_EQ(unpacked.out, copy.manifest_sum + "  -\n");
  // Another build (one byte) has another folder.
  WriteExe("#!/bin/sh\necho 'ddprun 9.9.9'\necho 'commit other'\n");
  EXPECT_NE(Copy().id, copy.id);
}

TEST_F(RemoteInstallTest, InstalledOnceThenFoundAndRun) {
  const LocalCopy copy = Copy();
  const ShellRun before = Probe(copy);
  EXPECT_EQ(before.status, 127) << before.out << before.err;  // no ddprun anywhere

  const ShellRun installed = Install(copy);
  ASSERT_EQ(installed.status, 0) << installed.out << installed.err;
  const InstallOutcome read = ReadInstall(installed.status, installed.out, installed.err);
  EXPECT_TRUE(read.ok) << read.what;
  EXPECT_TRUE(read.installed);
  EXPECT_EQ(read.path, CopyDir(copy));
  EXPECT_EQ(Read(CopyDir(copy) + "/share/ddprun/python/ddprun/__init__.py"), "BEACON = 1\n");
  EXPECT_EQ(Entries(home_ + "/.ddprun"), std::vector<std::string>{copy.id});  // no temporary left

  const ShellRun after = Probe(copy);
  EXPECT_EQ(after.status, 0) << after.err;
  EXPECT_EQ(after.out, "ddprun 9.9.9\ncommit test\n");

  // Python writing bytecode beside the module (as the copy's owner) changes nothing.
  fs::create_directories(CopyDir(copy) + "/share/ddprun/python/ddprun/__pycache__");
  Write(CopyDir(copy) + "/share/ddprun/python/ddprun/__pycache__/__init__.cpython-39.pyc", "bytecode");
  EXPECT_EQ(Probe(copy).status, 0);
  const ShellRun again = Install(copy);
  EXPECT_EQ(again.out, "ddprun-install: present " + CopyDir(copy) + "\n");
}

// Changed, planted, half-written: never run, and `--install` puts a whole copy in its place,
// keeping what was there under another name.
TEST_F(RemoteInstallTest, AChangedOrPlantedCopyIsNeverRunAndIsReplaced) {
  const LocalCopy copy = Copy();
  ASSERT_EQ(Install(copy).status, 0);
  const std::string module = CopyDir(copy) + "/share/ddprun/python/ddprun/__init__.py";
  struct Change {
    const char* what;
    std::function<void()> make;
  };
  const std::vector<Change> changes = {
      {"a changed module",
       [&] { ::chmod(module.c_str(), 0644), Write(module, "import os; os.system('x')\n"); }},
      {"a planted .pth",
       [&] {
         ::chmod((CopyDir(copy) + "/share/ddprun/python").c_str(), 0755);
         Write(CopyDir(copy) + "/share/ddprun/python/evil.pth", "import os\n");
       }},
      {"a missing file (half-written)", [&] { fs::remove(module); }},
      {"a binary replaced by a link", [&] {
         fs::remove(CopyDir(copy) + "/bin/ddprun");
         fs::create_symlink(root_ + "/build/cli/ddprun", CopyDir(copy) + "/bin/ddprun");
       }}};
  for (const Change& change : changes) {
    SCOPED_TRACE(change.what);
    change.make();
    const ShellRun probe = Probe(copy);
    EXPECT_EQ(probe.status, 127)
        << probe.out;  // not run: `ddprun` on the PATH is looked for, and is not there
    const ShellRun reinstalled = Install(copy);
    ASSERT_EQ(reinstalled.status, 0) << reinstalled.out << reinstalled.err;
    const InstallOutcome read = ReadInstall(reinstalled.status, reinstalled.out, reinstalled.err);
    EXPECT_TRUE(read.installed);
    EXPECT_THAT(read.moved_aside, StartsWith(home_ + "/.ddprun/.replaced-" + copy.id + "."));
    EXPECT_TRUE(fs::exists(read.moved_aside));
    EXPECT_EQ(Probe(copy).status, 0);
    EXPECT_EQ(Read(module), "BEACON = 1\n");
  }
}

// Another local user who can write ~/.ddprun (or the copy) could put their own program there.
TEST_F(RemoteInstallTest, AFolderOthersCanWriteOrALinkIsRefused) {
  const LocalCopy copy = Copy();
  ASSERT_EQ(Install(copy).status, 0);
  const std::string base = home_ + "/.ddprun";
  ::chmod(base.c_str(), 0777);
  EXPECT_EQ(Probe(copy).status, 127);
  const ShellRun shared = Install(copy);
  EXPECT_EQ(shared.status, 1);
  EXPECT_EQ(ReadInstall(shared.status, shared.out, shared.err).what,
            base + " can be written by other users (its group or everyone): chmod go-w " + base);
  ::chmod(base.c_str(), 0755);
  EXPECT_EQ(Probe(copy).status, 0);

  ::chmod(CopyDir(copy).c_str(), 0775);  // the copy's own folder, group-writable
  EXPECT_EQ(Probe(copy).status, 127);
  ::chmod(CopyDir(copy).c_str(), 0700);
  EXPECT_EQ(Probe(copy).status, 0);

  if (::geteuid() == 0) {  // a file of another user inside (root can make one)
    const std::string module = CopyDir(copy) + "/share/ddprun/python/ddprun/__init__.py";
    ASSERT_EQ(::chown(module.c_str(), 65534, 65534), 0);
    EXPECT_EQ(Probe(copy).status, 127);
    ASSERT_EQ(::chown(module.c_str(), 0, 0), 0);
    EXPECT_EQ(Probe(copy).status, 0);
  }

  // ~/.ddprun as a link to a folder elsewhere (someone else's, or a shared one).
  fs::rename(base, root_ + "/elsewhere");
  fs::create_directory_symlink(root_ + "/elsewhere", base);
  EXPECT_EQ(Probe(copy).status, 127);
  const ShellRun linked = Install(copy);
  EXPECT_EQ(linked.status, 1);
  EXPECT_EQ(ReadInstall(linked.status, linked.out, linked.err).what,
            base + " is a symbolic link; ddprun installs only into a folder of its own");
}

// A dynamic build copied to a host without its libraries: caught at install, nothing left.
TEST_F(RemoteInstallTest, ACopyTheHostCannotRunIsRefusedAtInstall) {
  WriteExe(
      "#!/bin/sh\necho 'ddprun: error while loading shared libraries: libtomlplusplus.so.3: cannot open "
      "shared object file' >&2\nexit 127\n");
  const LocalCopy copy = Copy();
  const ShellRun run = Install(copy);
  EXPECT_EQ(run.status, 1);
  EXPECT_EQ(ReadInstall(run.status, run.out, run.err).what,
            "the copy does not run on this host: ddprun: error while loading shared libraries: "
            "libtomlplusplus.so.3: cannot open shared object file");
  EXPECT_TRUE(Entries(home_ + "/.ddprun").empty());
}

// The stream cut short (ssh lost mid-copy): no copy, no temporary folder.
TEST_F(RemoteInstallTest, ACutStreamLeavesNothing) {
  const LocalCopy copy = Copy();
  const ShellRun run = Run(InstallLine(copy), copy.tar->substr(0, 700));
  EXPECT_EQ(run.status, 1);
  const InstallOutcome read = ReadInstall(run.status, run.out, run.err);
  EXPECT_FALSE(read.ok);
  EXPECT_THAT(read.what, ::testing::AnyOf(StartsWith("tar could not unpack the copy"),
                                          StartsWith("the copy arrived changed")));
  EXPECT_TRUE(Entries(home_ + "/.ddprun").empty());
}

// Hosts that share one home (NFS) install at once: one copy, both told where.
TEST_F(RemoteInstallTest, InstallsAtOnceIntoASharedHomeAgree) {
  const LocalCopy copy = Copy();
  std::vector<ShellRun> runs(4);
  std::vector<std::thread> threads;
  const std::string line = InstallLine(copy);
  for (size_t i = 0; i < runs.size(); ++i) {
    threads.emplace_back([&, i] {
      const std::string dir = root_ + "/run" + std::to_string(i);
      fs::create_directories(dir);
      Write(dir + "/in", *copy.tar);
      const std::string command = "env -i HOME=" + ShellQuote(home_) + " PATH=/usr/bin:/bin /bin/sh -c " +
                                  ShellQuote(line) + " <" + dir + "/in >" + dir + "/out 2>&1";
      const int status = std::system(command.c_str());
      runs[i].status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      runs[i].out = Read(dir + "/out");
    });
  }
  for (std::thread& t : threads) t.join();
  for (const ShellRun& run : runs) {
    const InstallOutcome read = ReadInstall(run.status, run.out, "");
    EXPECT_TRUE(read.ok) << run.out;
    EXPECT_EQ(read.path, CopyDir(copy));
    EXPECT_TRUE(read.moved_aside.empty()) << run.out;
  }
  EXPECT_EQ(Entries(home_ + "/.ddprun"), std::vector<std::string>{copy.id});
  EXPECT_EQ(Probe(copy).status, 0);
}

TEST(ReadInstallTest, ReadsEachAnswer) {
  EXPECT_EQ(ReadInstall(0, "motd\nddprun-install: installed /h/.ddprun/1-a\n", "").path, "/h/.ddprun/1-a");
  const InstallOutcome none =
      ReadInstall(255, "", "banner\nssh: connect to host h port 22: Connection refused\n");
  EXPECT_FALSE(none.ok);
  EXPECT_EQ(none.what,
            "no answer from the host (exit 255): ssh: connect to host h port 22: Connection refused");
  EXPECT_EQ(ReadInstall(-1, "", "").what, "no answer before the deadline");
  // "installed" followed by a failing exit is not believed.
  EXPECT_FALSE(ReadInstall(1, "ddprun-install: installed /h/x\n", "").ok);
}

}  // namespace
}  // namespace ddprun::io
