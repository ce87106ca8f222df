#include "cli/torchrun_habits.h"

#include <filesystem>
#include <span>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// torchrun's options that take a value ("--nnodes=2" or "--nnodes 2"), spelt with '_'.
constexpr std::string_view kValueOptions[] = {
    "nproc_per_node",   "nnodes", "node_rank", "master_addr", "master_port", "max_restarts",
    "monitor_interval", "role",   "log_dir",   "redirects",   "tee",         "local_addr"};
// ... and those that take none.
constexpr std::string_view kFlagOptions[] = {"standalone", "no_python", "run_path", "module"};

bool IsOneOf(std::string_view name, std::span<const std::string_view> names) {
  for (std::string_view candidate : names) {
    if (name == candidate) return true;
  }
  return false;
}

bool AllDigits(const std::string& text) {
  return !text.empty() && text.size() <= 6 && text.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::optional<std::string> TorchrunHabitPointer(const std::vector<std::string>& args) {
  size_t i = 1;
  if (i < args.size() &&
      (args[i] == "run" || args[i] == "check" || args[i] == "simulate" || args[i] == "preflight")) {
    ++i;
  }
  std::string first_option;  // as written, for the message
  std::string nproc;
  std::string nnodes;
  std::string master_addr;
  std::string master_port;
  std::string script;
  size_t script_at = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!arg.starts_with("--") || arg == "--") {
      if (!arg.starts_with("-") && script.empty()) {
        script = arg;
        script_at = i;
      }
      if (!script.empty()) break;
      continue;
    }
    // ddprun's own --node-rank is also torchrun's (spelt --node_rank there).
    if (arg.starts_with("--node-rank")) continue;
    std::string name = arg.substr(2, arg.find('=') - 2);
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    const bool takes_value = IsOneOf(name, kValueOptions) || name.starts_with("rdzv_");
    if (!takes_value && !IsOneOf(name, kFlagOptions)) continue;
    if (first_option.empty()) first_option = arg;
    std::string value;
    if (takes_value) {
      if (arg.find('=') != std::string::npos) {
        value = arg.substr(arg.find('=') + 1);
      } else if (i + 1 < args.size()) {
        value = args[++i];
      }
    }
    if (name == "nproc_per_node") nproc = value;
    if (name == "nnodes") nnodes = value.substr(value.find(':') + 1);  // "2:4": up to 4
    if (name == "master_addr") master_addr = value;
    if (name == "master_port") master_port = value;
  }
  const bool python_script = script.ends_with(".py");
  // A job file given with a torchrun option is left to the option parser, which names the option.
  std::error_code ec;
  if (!python_script && (first_option.empty() || script.ends_with(".toml") ||
                         (!script.empty() && std::filesystem::is_regular_file(script, ec)))) {
    return std::nullopt;
  }

  // The init command keeps what torchrun was told (the script, nodes, processes, port); the
  // master's address becomes node 0 of the host list, and the script's arguments follow `--`.
  std::string init = "ddprun init --script " + ShellQuote(script.empty() ? "train.py" : script);
  const int count = AllDigits(nnodes) ? std::stoi(nnodes) : 0;
  const bool several = !master_addr.empty() && count > 1 && count <= 8;  // HOST1..HOST7 at most
  if (several) {
    init += " --nodes " + ShellQuote(master_addr);
    for (int n = 1; n < count; ++n) init += fmt::format(",HOST{}", n);
  } else if (AllDigits(nnodes)) {
    init += " --nnodes " + nnodes;
  }
  if (AllDigits(nproc)) init += " --gpus " + nproc;
  if (AllDigits(master_port)) init += " --master-port " + master_port;
  std::string run = "ddprun job.toml";
  if (python_script && script_at + 1 < args.size()) {
    run += " --";
    for (size_t a = script_at + 1; a < args.size(); ++a) run += " " + ShellQuote(args[a]);
  }
  std::string text = python_script
                         ? fmt::format(
                               "ddprun: error: `{}` is a Python script; ddprun runs a job file (TOML) that "
                               "names the script, the nodes and the workers per node\n",
                               script)
                         : fmt::format(
                               "ddprun: error: `{}` is a torchrun option; ddprun takes a job file (TOML) "
                               "instead of options\n",
                               first_option);
  std::vector<std::string> notes;
  if (AllDigits(nproc)) notes.push_back("--gpus is torchrun's --nproc_per_node");
  if (several) {
    notes.push_back(count == 2
                        ? "node 0 is torchrun's --master_addr; put the other machine's name for HOST1"
                        : fmt::format("node 0 is torchrun's --master_addr; put the other machines' names for "
                                      "HOST1..HOST{}",
                                      count - 1));
  } else if (!master_addr.empty()) {
    notes.push_back(
        fmt::format("list the machines with --nodes, {} (torchrun's --master_addr) first", master_addr));
  } else {
    notes.push_back("add --nodes host-a,host-b for several machines");
  }
  text += fmt::format("hint: `{}` writes job.toml for it ({}), then run `{}` on every node\n", init,
                      fmt::join(notes, "; "), run);
  return text;
}

}  // namespace ddprun::cli
