// `ddprun check` and `ddprun schema`: validate a job file and print its plan, or print the
// JSON Schema of job files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "cli/code_identity.h"
#include "cli/commands.h"
#include "cli/job_python.h"
#include "cli/library_identity.h"
#include "runner/io/node_identity.h"
#include "runner/io/node_identity_slurm.h"
#include "schema/diagnostics.h"
#include "schema/json_schema.h"
#include "schema/loader.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// The first line of a small /proc file ("" when unreadable).
std::string ReadProcLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line.size() > 4096 ? std::string() : line;
}

// A program written as a path (`./train.sh`, `build/train`, `/opt/venv/bin/python`) that is
// not there: likely missing on the nodes too (not built yet, a typo), and the run would only
// say that the worker cannot start. A bare name is looked up on each node's PATH, not here.
void WarnAboutMissingProgram(const JobSpec& spec, const std::string& workdir, Diagnostics& diags) {
  const CommandShape shape = ShapeOf(spec.job.command);
  if (shape.program >= spec.job.command.size()) return;
  const std::string& program = spec.job.command[shape.program];
  if (program.find('/') == std::string::npos || !FindProgram(program, "", workdir).empty()) return;
  const std::string key = fmt::format("job.command[{}]", shape.program);
  const std::string where =
      program.starts_with("/")
          ? std::string()
          : fmt::format(" ({})", (std::filesystem::path(workdir) / program).lexically_normal().string());
  diags.Warning(spec.LocationOf(key), key,
                fmt::format("{} = \"{}\" does not exist here{}", key, program, where),
                "the workers run it on every node; build or install it first (relative paths "
                "are relative to job.workdir), or fix the path");
}

// The script of a Python command (`python3 wrok.py`) that is not there: the run would only say
// that Python cannot open it, on every node. Relative to job.workdir, as the workers run it;
// the closest .py file there is the hint (a typo).
void WarnAboutMissingScript(const JobSpec& spec, const std::filesystem::path& workdir, Diagnostics& diags) {
  const CommandShape shape = ShapeOf(spec.job.command);
  if (!shape.python || shape.script.empty()) return;
  size_t index = shape.program + 1;
  while (index < spec.job.command.size() && spec.job.command[index] != shape.script) ++index;
  if (index >= spec.job.command.size()) return;
  const std::filesystem::path script = workdir / shape.script;
  std::error_code ec;
  if (std::filesystem::exists(script, ec)) return;
  std::vector<std::string> names;
  const std::filesystem::path folder = script.parent_path();
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end && names.size() < 1000;
       it.increment(ec)) {
    if (it->path().extension() == ".py") names.push_back(it->path().filename().string());
  }
  const std::vector<std::string_view> candidates(names.begin(), names.end());
  const std::optional<std::string_view> closest =
      ClosestName(script.filename().string(), std::span<const std::string_view>(candidates));
  const std::string key = fmt::format("job.command[{}]", index);
  diags.Warning(
      spec.LocationOf(key), key,
      fmt::format("{} = \"{}\" does not exist here ({})", key, shape.script,
                  script.lexically_normal().string()),
      closest ? fmt::format("did you mean \"{}\"? Python runs the script from job.workdir on every node",
                            (std::filesystem::path(shape.script).parent_path() / *closest).string())
              : std::string("Python runs it from job.workdir on every node; fix the path, or make sure it "
                            "exists on the nodes"));
}

}  // namespace

int CheckCommand(const CheckOptions& options) {
  LoadResult result = LoadJobFile(options.job_path, io::MachineLoadContext());
  if (result.spec) AppendScriptArgs(*result.spec, options.script_args);
  if (result.spec) {
    // The workers start in job.workdir; a folder missing here is likely missing on the nodes
    // too (a typo, a checkout not made), and the run would only say that python3 cannot start.
    const std::filesystem::path file_dir = std::filesystem::path(options.job_path).parent_path();
    const std::filesystem::path workdir =
        ((file_dir.empty() ? "." : file_dir) / result.spec->job.workdir).lexically_normal();
    std::error_code ec;
    const bool have_workdir = std::filesystem::is_directory(workdir, ec);
    if (!have_workdir) {
      result.diagnostics.Warning(
          result.spec->LocationOf("job.workdir"), "job.workdir",
          fmt::format("job.workdir = \"{}\" is not a folder here ({})", result.spec->job.workdir,
                      workdir.string()),
          "the workers start in it on every node; create it, or make sure it exists on the "
          "nodes");
    } else {
      WarnAboutMissingScript(*result.spec, workdir, result.diagnostics);
    }
    // An absolute program is checked whether or not the folder exists; a relative one only
    // where the folder is (else the folder's warning says it).
    const std::vector<std::string>& command = result.spec->job.command;
    const size_t program = ShapeOf(command).program;
    if (have_workdir || (program < command.size() && command[program].starts_with("/"))) {
      WarnAboutMissingProgram(*result.spec, workdir.string(), result.diagnostics);
    }
  }
  if (result.spec) {
    // The same code and library fields as `run` computes, so the plan's run id is the one the
    // job gets.
    const std::filesystem::path file_dir = std::filesystem::path(options.job_path).parent_path();
    const std::filesystem::path dir = file_dir.empty() ? "." : file_dir;
    const std::string workdir = (dir / result.spec->job.workdir).lexically_normal().string();
    if (result.spec->job.code_check != JobSpec::CodeCheck::kOff) {
      result.spec->job.code = FindCode(*result.spec, workdir);
    }
    if (result.spec->job.library_check != JobSpec::CodeCheck::kOff) {
      result.spec->job.libraries = FindLibraries(*result.spec, workdir);
    }
  }
  if (result.spec) {
    // Read here, not in schema/, which stays free of the machine it runs on. Linux's default
    // range stands in where /proc cannot be read (containers, other systems).
    const PortRange ephemeral =
        ParsePortRange(ReadProcLine("/proc/sys/net/ipv4/ip_local_port_range")).value_or(PortRange{});
    CheckEphemeralPorts(*result.spec, ephemeral,
                        ParseReservedPorts(ReadProcLine("/proc/sys/net/ipv4/ip_local_reserved_ports")),
                        result.diagnostics);
  }
  // --json: stdout carries the diagnostics in the JSON, and stderr stays quiet for tools.
  if (!options.json) {
    const std::string rendered =
        RenderDiagnostics(result.diagnostics, options.job_path, result.source_text, options.color);
    std::fputs(rendered.c_str(), stderr);
  }
  if (!result.spec) {
    if (options.json) {
      fmt::print("{}\n", RenderCheckJson(result.diagnostics, options.job_path, nullptr, nullptr));
    }
    return kExitUsage;
  }
  const JobSpec& spec = *result.spec;
  if (options.node_rank && (*options.node_rank < 0 || *options.node_rank >= spec.cluster.nnodes)) {
    fmt::print(stderr, "ddprun check: --node-rank {} is out of range: {} has nodes 0..{}\n",
               *options.node_rank, options.job_path, spec.cluster.nnodes - 1);
    return kExitUsage;
  }
  // Seen from this host only (its /etc/hosts): run `check` on node 0 to check node 0.
  // (With etcd the role's holder decides on its own host, at run time.)
  if (!options.json && !spec.rendezvous.Etcd()) {
    const io::ListenPlan listen = io::PlanListen(spec, 0, true);
    if (!listen.refusal.empty()) fmt::print(stderr, "warning: {}\n", listen.refusal);
    if (!listen.text.empty()) fmt::print(stderr, "note: {}\n", listen.text);
  }
  const Plan plan = MakePlan(spec, options.node_rank);
  if (options.json) {
    fmt::print("{}\n", RenderCheckJson(result.diagnostics, options.job_path, &spec, &plan));
  } else if (!options.full && !options.node_rank && spec.cluster.nnodes > kPlanSummaryAboveNodes) {
    fmt::print("{}", RenderPlanSummary(spec, plan));
  } else {
    fmt::print("{}", RenderPlanText(spec, plan));
  }
  std::fflush(stdout);
  return kExitOk;
}

int SchemaCommand() {
  fmt::print("{}\n", JobFileJsonSchema());
  return kExitOk;
}

}  // namespace ddprun::cli
