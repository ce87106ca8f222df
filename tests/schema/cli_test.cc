// The real `ddprun` binary: check on every example, a broken file, --json, schema, usage errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace {

struct Output {
  int exit_code = -1;
  std::string out;  // stdout, or stdout+stderr when asked
};

Output RunDdprun(const std::string& args, bool merge_stderr = false) {
  const std::string command = std::string(DDPRUN_BINARY) + " " + args +
                              (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Output result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string SourcePath(const std::string& relative) {
  return std::string(DDPRUN_SOURCE_DIR) + "/" + relative;
}

std::string TempFile(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("ddprun-cli-test-" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(Cli, CheckEveryExample) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SourcePath("examples"))) {
    if (entry.path().extension() != ".toml") continue;
    ++checked;
    const Output o = RunDdprun("check " + entry.path().string(), /*merge_stderr=*/true);
    EXPECT_EQ(o.exit_code, 0) << entry.path() << "\n" << o.out;
    EXPECT_NE(o.out.find("torchrun: "), std::string::npos) << o.out;
    EXPECT_EQ(o.out.find("warning"), std::string::npos) << o.out;
  }
  EXPECT_GE(checked, 3);
}

TEST(Cli, BrokenFileExits2WithRenderedDiagnostic) {
  const std::string path = TempFile("broken.toml",
                                    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n"
                                    "[cluster]\nnnodes = 2\nnproc_per_node = 4\n[trainer]\n"
                                    "devices = 8\nnum_nodes = 2\n");
  const Output o = RunDdprun("check " + path, true);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out, path + ":7:18: error: cluster.nproc_per_node = 4 does not match "
                          "trainer.devices = 8\n"
                          "    7 | nproc_per_node = 4\n"
                          "      |                  ^\n"
                          "   hint: set trainer.devices = 4 or cluster.nproc_per_node = 8\n"
                          "1 error, 0 warnings\n");
}

TEST(Cli, CheckJson) {
  const Output ok = RunDdprun("check --json " + SourcePath("examples/laptop.toml"));
  EXPECT_EQ(ok.exit_code, 0);
  auto j = nlohmann::json::parse(ok.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ok.out;
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["plan"]["world_size"], 4);
  EXPECT_EQ(j["plan"]["nodes"].size(), 2u);

  const std::string path = TempFile("bad.toml", "version = 2\n");
  const Output bad = RunDdprun("check --json " + path);
  EXPECT_EQ(bad.exit_code, 2);
  auto k = nlohmann::json::parse(bad.out, nullptr, false);
  ASSERT_FALSE(k.is_discarded()) << bad.out;
  EXPECT_EQ(k["valid"], false);
  EXPECT_TRUE(k["plan"].is_null());
  EXPECT_EQ(k["diagnostics"][0]["line"], 0);  // missing [job] has no position
  EXPECT_EQ(k["diagnostics"].size(), 3u);
}

TEST(Cli, CheckNodeRank) {
  const std::string job = SourcePath("examples/laptop.toml");
  const Output one = RunDdprun("check --node-rank 1 " + job);
  EXPECT_EQ(one.exit_code, 0);
  EXPECT_NE(one.out.find("node 1 (node1):"), std::string::npos) << one.out;
  EXPECT_EQ(one.out.find("node 0 (node0):"), std::string::npos) << one.out;
  const Output out_of_range = RunDdprun("check --node-rank 2 " + job, true);
  EXPECT_EQ(out_of_range.exit_code, 2);
  EXPECT_NE(out_of_range.out.find("--node-rank 2 is out of range"), std::string::npos);
}

TEST(Cli, SchemaIsValidJsonAndMatchesTheCommittedFile) {
  const Output o = RunDdprun("schema");
  EXPECT_EQ(o.exit_code, 0);
  auto j = nlohmann::json::parse(o.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["$schema"], "https://json-schema.org/draft/2020-12/schema");
  std::ifstream committed(SourcePath("docs/job-file.schema.json"));
  std::stringstream text;
  text << committed.rdbuf();
  EXPECT_EQ(text.str(), o.out) << "regenerate: ddprun schema > docs/job-file.schema.json";
}

TEST(Cli, UsageErrorsExit2) {
  EXPECT_EQ(RunDdprun("").exit_code, 2);
  EXPECT_EQ(RunDdprun("check").exit_code, 2);
  EXPECT_EQ(RunDdprun("check --bogus x.toml").exit_code, 2);
  EXPECT_EQ(RunDdprun("check --node-rank -1 x.toml").exit_code, 2);
  EXPECT_EQ(RunDdprun("check /nonexistent.toml").exit_code, 2);
}

TEST(Cli, VersionAndHelp) {
  const Output v = RunDdprun("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.out.rfind("ddprun ", 0), 0u);
  for (const char* sub : {"run", "simulate", "check", "preflight", "schema"}) {
    const Output h = RunDdprun(std::string(sub) + " --help");
    EXPECT_EQ(h.exit_code, 0) << sub;
    EXPECT_NE(h.out.find("Examples:"), std::string::npos) << sub;
  }
  EXPECT_NE(RunDdprun("--help").out.find("ddprun --simulate job.toml"), std::string::npos);
}

TEST(Cli, ShortFormsDispatch) {
  // `ddprun job.toml` is `ddprun run job.toml`; `ddprun --simulate job.toml` is
  // `ddprun simulate job.toml`: same output, same exit code, whatever those commands do.
  const std::string job = "/nonexistent/ddprun-short-form.toml";
  const Output run_short = RunDdprun(job, true);
  const Output run_long = RunDdprun("run " + job, true);
  EXPECT_EQ(run_short.exit_code, run_long.exit_code);
  EXPECT_EQ(run_short.out, run_long.out);
  const Output sim_short = RunDdprun("--simulate " + job + " --seed 3", true);
  const Output sim_long = RunDdprun("simulate " + job + " --seed 3", true);
  EXPECT_EQ(sim_short.exit_code, sim_long.exit_code);
  EXPECT_EQ(sim_short.out, sim_long.out);
}

}  // namespace
