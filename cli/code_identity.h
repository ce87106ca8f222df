#pragma once
// job.code_check: what code this node would run (the script's digest, the workdir's git commit),
// computed by the CLI before the agent starts so it travels in the canonical form.

#include <string>

#include "schema/job_spec.h"

namespace ddprun::cli {

/// The script job.command runs (its first argument after the program that names a regular file
/// under `workdir`, or the program itself when it is a path), its SHA-256, and the git commit
/// and dirty state of `workdir` when it is inside a git work tree. Unknown parts stay empty.
JobSpec::Code FindCode(const JobSpec& spec, const std::string& workdir);

/// One line for the agent's start-up log: "code: train.py sha256 1a2b3c4d5e6f, git 0a1b2c3d4e5f
/// (dirty)".
std::string DescribeCode(const JobSpec::Code& code);

}  // namespace ddprun::cli
