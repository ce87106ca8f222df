// `ddprun init`: writes a commented starter job file from a few flags, valid under `check`.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "schema/loader.h"

namespace ddprun::cli {
namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string TomlString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\u{:04x}", byte);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string TomlList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += TomlString(items[i]);
  }
  return out + "]";
}

// The job name from the script: "train.py" -> "train"; characters a name may not hold
// become '-'.
std::string NameFromScript(std::string_view script) {
  std::string_view stem = script.substr(script.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find('.'));
  std::string name;
  for (char c : stem) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    name += ok ? c : '-';
  }
  return name.empty() || name.size() > 64 ? "train" : name;
}

/// job.toml -> job.sbatch, beside it.
std::string SbatchName(const std::string& job_path) {
  const size_t slash = job_path.find_last_of('/');
  const size_t dot = job_path.find_last_of('.');
  const std::string stem = dot != std::string::npos && (slash == std::string::npos || dot > slash)
                               ? job_path.substr(0, dot)
                               : job_path;
  return stem + ".sbatch";
}

/// `init --slurm`: the sbatch script that runs the job file, one ddprun agent per node.
std::string SbatchScript(const InitOptions& o, const std::string& name, int nnodes) {
  const std::string job = o.output.substr(o.output.find_last_of('/') + 1);
  std::string t = "#!/bin/bash\n";
  t += fmt::format(
      "# Runs {} with one ddprun agent per node (docs/running.md, \"Under SLURM\"); written\n"
      "# by `ddprun init --slurm`. Submit from this folder: sbatch {} [script arguments]\n",
      job, SbatchName(o.output).substr(SbatchName(o.output).find_last_of('/') + 1));
  t += fmt::format("#SBATCH --job-name={}\n", name);
  t += fmt::format("#SBATCH --nodes={}\n", nnodes);
  t += "#SBATCH --ntasks-per-node=1            # one agent per node; it starts the node's workers\n";
  if (o.gpus_per_node > 0) t += fmt::format("#SBATCH --gpus-per-node={}\n", o.gpus_per_node);
  t += "#SBATCH --exclusive                    # the node's CPUs for its workers\n";
  t += "#SBATCH --output=%x-%j.out\n";
  t += "set -euo pipefail\n";
  t += "# scancel sends SIGTERM to every agent, which stops its workers within timeouts.stop_grace\n";
  t += "# (keep it below the cluster's KillWait). --cpu-bind=none: workers are not pinned to the\n";
  t += "# agent's task. --kill-on-bad-exit=1: an agent that cannot start (exit 2 or 3) ends the\n";
  t += "# others at once; leave it out for a job with spares or shrinking.\n";
  t += fmt::format("srun --cpu-bind=none --kill-on-bad-exit=1 ddprun {} ${{1+-- \"$@\"}}\n", job);
  return t;
}

std::string StarterJobFile(const InitOptions& o) {
  const bool gpu = o.gpus_per_node > 0;
  const int procs = gpu ? o.gpus_per_node : 1;
  const int nnodes = o.nodes.empty() ? o.nnodes : static_cast<int>(o.nodes.size());
  const std::string name = o.name.empty() ? NameFromScript(o.script) : o.name;
  // A bare program name would be looked up on PATH, not in workdir (`train.sh`: exit 127, issue
  // 40): a shell script runs through bash, anything else by its path relative to workdir.
  const std::vector<std::string> command =
      o.script.ends_with(".py")                 ? std::vector<std::string>{"python3", o.script}
      : o.script.ends_with(".sh")               ? std::vector<std::string>{"bash", o.script}
      : o.script.find('/') == std::string::npos ? std::vector<std::string>{"./" + o.script}
                                                : std::vector<std::string>{o.script};
  std::string t;
  t += "# A ddprun job file, written by `ddprun init`. Every key is described in docs/job-file.md.\n";
  const std::string file = o.output.substr(o.output.find_last_of('/') + 1);
  t += fmt::format(
      "#   ddprun check {}    validate it and print ranks, environment, torchrun "
      "commands\n",
      file);
  t += o.slurm ? fmt::format("#   sbatch {}    one agent per node of the allocation (srun)\n",
                             SbatchName(o.output))
       : nnodes == 1 || !o.nodes.empty()
           ? fmt::format("#   ddprun {}          on every node: the same command everywhere\n", file)
           : fmt::format("#   ddprun {} --node-rank N    on node N (0 is the master)\n", file);
  t += "version = 1\n\n";
  t += "[job]\n";
  t += fmt::format("name = {}{}# run id prefix and log folder name\n", TomlString(name),
                   std::string(std::max<size_t>(1, 24 - TomlString(name).size()), ' '));
  t += fmt::format("command = {}   # what every worker runs, relative to workdir\n", TomlList(command));
  t += "workdir = \".\"                  # relative to this file\n";
  t += "# env = { NCCL_DEBUG = \"WARN\" }  # extra variables for every worker\n\n";
  t += "[cluster]\n";
  if (o.slurm) {
    t += "hosts_from = \"slurm\"            # the allocation's hosts (scontrol show hostnames), in "
         "SLURM's order\n";
  } else if (!o.nodes.empty()) {
    t += fmt::format("nodes = {}   # node rank = position; each node finds itself by host name\n",
                     TomlList(o.nodes));
  } else {
    t += fmt::format(
        "nnodes = {}                      # or list the hosts: nodes = "
        "[\"gpu-01\", \"gpu-02\"]\n",
        nnodes);
    if (nnodes > 1) {
      t += "master_addr = \"127.0.0.1\"       # CHANGE: the address of node 0, reachable by all\n";
    }
  }
  t += fmt::format(
      "master_port = {}              # the one port node 0 listens on (open it in "
      "the firewall); keep it below 32768\n",
      o.master_port);
  t += "\n[trainer]                        # reaches Lightning's Trainer() as PL_TRAINER_* "
       "defaults\n";
  t += fmt::format("accelerator = \"{}\"\n", gpu ? "gpu" : "cpu");
  t += fmt::format("devices = {}                      # worker processes per node\n", procs);
  t += fmt::format("num_nodes = {}\n", nnodes);
  t += "strategy = \"ddp\"\n";
  t += "# precision = \"bf16-mixed\"\n\n";
  t += "[restart]\n";
  t += "max_restarts = 3                 # job-wide: a failure anywhere restarts every worker\n";
  t += "backoff = \"10s\"                  # the first wait before a restart\n";
  t += "backoff_max = \"2m\"               # the wait doubles after each restart up to this\n\n";
  t += "[timeouts]\n";
  t += "rendezvous = \"15m\"               # every node must have joined by then\n";
  t += "heartbeat = \"2s\"                 # a node silent for 3 beats is lost\n";
  t += o.slurm
           ? "stop_grace = \"20s\"               # SIGTERM, then SIGKILL after this; below SLURM's KillWait "
             "(30 s by default), after which SLURM kills the agents\n\n"
           : "stop_grace = \"30s\"               # SIGTERM, then SIGKILL after this\n\n";
  t += "[logs]\n";
  t += "dir = \"logs\"                     # logs/<job>/... per rank, relative to this file\n";
  t += "console = \"all\"                  # or \"none\", or a list of global ranks, e.g. [0]\n";
  return t;
}

/// Writes `text` to a new file (or over one with `force`).
Status WriteNewFile(const std::string& path, const std::string& text, mode_t mode, bool force) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL), mode);
  if (fd < 0) {
    const int error = errno;
    return Fail(fmt::format("cannot write {}: {}{}", path, std::strerror(error),
                            error == EEXIST ? " (--force overwrites it)" : ""));
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      return Fail(fmt::format("cannot write {}: {}", path, std::strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return Fail(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  return {};
}

}  // namespace

int InitCommand(const InitOptions& options) {
  if (!options.nodes.empty() && options.nnodes != 1) {
    std::fputs("ddprun init: give --nodes HOST,... or --nnodes N, not both\n", stderr);
    return kExitUsage;
  }
  const std::string text = StarterJobFile(options);
  // The file must pass `check`; a bad flag (a host name with a space) is reported like a job
  // file error, against the text that would have been written.
  LoadResult result = ParseJobText(text, options.output);
  if (result.diagnostics.HasErrors()) {
    const std::string rendered =
        RenderDiagnostics(result.diagnostics, options.output, result.source_text, false);
    std::fputs(rendered.c_str(), stderr);
    std::fputs("ddprun init: nothing written; fix the flags above\n", stderr);
    return kExitUsage;
  }
  // O_EXCL: never overwrite a job file someone already wrote, unless asked to.
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.force ? O_TRUNC : O_EXCL);
  const int fd = ::open(options.output.c_str(), flags, 0644);
  if (fd < 0) {
    const int error = errno;
    fmt::print(stderr, "ddprun init: cannot write {}: {}{}\n", options.output, std::strerror(error),
               error == EEXIST ? " (--force overwrites it)" : "");
    return kExitUsage;
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fmt::print(stderr, "ddprun init: cannot write {}: {}\n", options.output, std::strerror(errno));
      ::close(fd);
      return kExitUsage;
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    fmt::print(stderr, "ddprun init: cannot write {}: {}\n", options.output, std::strerror(errno));
    return kExitUsage;
  }
  if (options.slurm) {
    const std::string path = SbatchName(options.output);
    const int nnodes = options.nodes.empty() ? options.nnodes : static_cast<int>(options.nodes.size());
    const std::string name = options.name.empty() ? NameFromScript(options.script) : options.name;
    if (const Status wrote = WriteNewFile(path, SbatchScript(options, name, nnodes), 0755, options.force);
        !wrote) {
      fmt::print(stderr, "ddprun init: {}\n", wrote.error());
      return kExitUsage;
    }
    fmt::print("wrote {} and {}; next: ddprun check {}, then sbatch {}\n", options.output, path,
               options.output, path);
    return kExitOk;
  }
  fmt::print("wrote {}; next: ddprun check {}\n", options.output, options.output);
  return kExitOk;
}

}  // namespace ddprun::cli
