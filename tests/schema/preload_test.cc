// job.preload (warm starts): the key's rules, job.command read as a Python command line, and
// what `ddprun check` says about how workers start.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "schema/plan.h"
#include "schema/python_command.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;
using ::testing::HasSubstr;
using testing::Parse;

// kBaseJob with `command` and `job_extra` in its [job] table.
std::string JobWith(const std::string& command, const std::string& job_extra) {
  return "version = 1\n[job]\nname = \"t\"\ncommand = " + command + "\n" + job_extra +
         "[cluster]\nnodes = [\"a\", \"b\"]\n[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = 2\n";
}

TEST(Preload, ModulesAreReadInOrder) {
  auto r = Parse(JobWith("[\"python\", \"train.py\"]", "preload = [\"torch\", \"lightning.pytorch\"]\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(r.spec->job.preload, (std::vector<std::string>{"torch", "lightning.pytorch"}));
}

TEST(Preload, UnsetMeansColdStarts) {
  auto r = Parse(JobWith("[\"python\", \"train.py\"]", ""));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_TRUE(r.spec->job.preload.empty());
}

TEST(Preload, BadNamesDuplicatesDdprunAndTypesAreErrors) {
  auto r = Parse(JobWith("[\"python\", \"train.py\"]",
                         "preload = [\"torch\", \"my-mod\", \"torch\", \"ddprun\", \"a..b\", \"\"]\n"));
  EXPECT_FALSE(r.spec);
  const std::string diags = Diags(r);
  EXPECT_THAT(diags, HasSubstr("job.preload: \"my-mod\" is not a Python module name"));
  EXPECT_THAT(diags, HasSubstr("job.preload: \"a..b\" is not a Python module name"));
  EXPECT_THAT(diags, HasSubstr("job.preload lists \"torch\" twice"));
  EXPECT_THAT(diags, HasSubstr("job.preload may not list \"ddprun\""));
  EXPECT_THAT(diags, HasSubstr("the worker imports it itself"));
  auto not_array = Parse(JobWith("[\"python\", \"train.py\"]", "preload = \"torch\"\n"));
  EXPECT_FALSE(not_array.spec);
  EXPECT_THAT(Diags(not_array), HasSubstr("job.preload"));
}

TEST(PythonCommand, ScriptsModulesAndInterpreterOptions) {
  auto script = ParsePythonCommand(
      {"/opt/venv/bin/python3.11", "-u", "-X", "dev", "-Wignore", "train.py", "--lr", "1"});
  ASSERT_TRUE(script) << script.error();
  EXPECT_EQ(script->interpreter, "/opt/venv/bin/python3.11");
  EXPECT_EQ(script->options, (std::vector<std::string>{"-u", "-X", "dev", "-Wignore"}));
  EXPECT_FALSE(script->module);
  EXPECT_EQ(script->target, "train.py");
  EXPECT_EQ(script->args, (std::vector<std::string>{"--lr", "1"}));

  auto module = ParsePythonCommand({"python", "-B", "-m", "pkg.train", "-m", "x"});
  ASSERT_TRUE(module) << module.error();
  EXPECT_TRUE(module->module);
  EXPECT_EQ(module->target, "pkg.train");
  EXPECT_EQ(module->args, (std::vector<std::string>{"-m", "x"}));
  auto attached = ParsePythonCommand({"python3", "-mpkg"});
  ASSERT_TRUE(attached);
  EXPECT_EQ(attached->target, "pkg");
}

TEST(PythonCommand, WhatCannotStartWarmSaysWhy) {
  EXPECT_THAT(ParsePythonCommand({"torchrun", "train.py"}).error(),
              HasSubstr("does not run a Python interpreter"));
  EXPECT_THAT(ParsePythonCommand({"bash", "run.sh"}).error(), HasSubstr("\"bash\" is not python"));
  EXPECT_THAT(ParsePythonCommand({"python", "-c", "print(1)"}).error(), HasSubstr("runs a string (-c)"));
  EXPECT_THAT(ParsePythonCommand({"python", "-uc", "print(1)"}).error(), HasSubstr("-c"));
  EXPECT_THAT(ParsePythonCommand({"python", "-"}).error(), HasSubstr("stdin"));
  EXPECT_THAT(ParsePythonCommand({"python"}).error(), HasSubstr("names no script"));
  EXPECT_THAT(ParsePythonCommand({"python", "-i", "t.py"}).error(), HasSubstr("-i is not one"));
  EXPECT_THAT(ParsePythonCommand({"python", "--check-hash-based-pycs", "always", "t.py"}).error(),
              HasSubstr("--check-hash-based-pycs"));
  EXPECT_FALSE(IsPythonInterpreter("pythonista"));
  EXPECT_FALSE(IsPythonInterpreter("python3."));
  EXPECT_TRUE(IsPythonInterpreter("python3.12"));
}

TEST(Preload, CheckSaysWhetherWorkersStartWarmAndWhy) {
  auto warm = Parse(JobWith("[\"python\", \"-m\", \"trainer\"]", "preload = [\"torch\", \"lightning\"]\n"));
  ASSERT_TRUE(warm.spec) << Diags(warm);
  const std::string warm_text = RenderPlanText(*warm.spec, MakePlan(*warm.spec, std::nullopt));
  EXPECT_THAT(warm_text, HasSubstr("worker start: warm: each agent starts a template `python` that imports "
                                   "torch, lightning while the nodes join, and forks every worker from it "
                                   "to run -m trainer as __main__"));
  auto shell = Parse(JobWith("[\"bash\", \"run.sh\"]", "preload = [\"torch\"]\n"));
  ASSERT_TRUE(shell.spec) << Diags(shell);
  EXPECT_THAT(RenderPlanText(*shell.spec, MakePlan(*shell.spec, std::nullopt)),
              HasSubstr("worker start: cold, although job.preload is set: job.command does not run a "
                        "Python interpreter (\"bash\" is not python"));
  auto cold = Parse(JobWith("[\"python\", \"train.py\"]", ""));
  ASSERT_TRUE(cold.spec);
  EXPECT_THAT(RenderPlanText(*cold.spec, MakePlan(*cold.spec, std::nullopt)),
              HasSubstr("worker start: cold (each worker starts job.command; job.preload is not set)"));
  const auto json = nlohmann::json::parse(RenderPlanJson(*shell.spec, MakePlan(*shell.spec, std::nullopt)));
  EXPECT_EQ(json["worker_start"]["warm"], false);
  EXPECT_EQ(json["worker_start"]["preload"], nlohmann::json::array({"torch"}));
  EXPECT_THAT(json["worker_start"]["cold_reason"].get<std::string>(), HasSubstr("not run a Python"));
}

}  // namespace
}  // namespace ddprun
