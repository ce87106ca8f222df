#pragma once
// job.library_check: the Python and libraries this node's job.command would use, found by the
// CLI before the agent starts so they travel in the canonical form.

#include <string>

#include "schema/job_spec.h"

namespace ddprun::cli {

/// How long the interpreter may take to say its version and sys.path (it imports nothing).
inline constexpr int kInterpreterTimeoutSeconds = 5;

/// Runs the interpreter job.command names (through env too; else the python3 on the job's
/// PATH) once, in `workdir` with job.env, bounded by kInterpreterTimeoutSeconds, for its
/// version and sys.path; then reads the versions of torch, lightning, pytorch_lightning and
/// nvidia-nccl-cu* from their *.dist-info/METADATA or *.egg-info/PKG-INFO in sys.path order
/// (the first one Python would import), and the CUDA version from that torch's version.py.
/// Nothing is imported; what cannot be found stays "" and `note` says why.
JobSpec::Libraries FindLibraries(const JobSpec& spec, const std::string& workdir);

}  // namespace ddprun::cli
