#pragma once
// Command lines written as for torchrun or python (`ddprun train.py`, `ddprun
// --nproc_per_node=2 train.py`): ddprun takes a job file, and `ddprun init --script` writes one.

#include <optional>
#include <string>
#include <vector>

namespace ddprun::cli {

/// The error and hint for such a command line (argv, program name first), or nullopt when it
/// is not one: its job argument is a Python script (*.py), or it uses torchrun's options
/// (--nproc_per_node, --nnodes, --node_rank, --master_addr, --master_port, --standalone,
/// --rdzv_*, --max_restarts, also spelt with '-').
std::optional<std::string> TorchrunHabitPointer(const std::vector<std::string>& args);

}  // namespace ddprun::cli
