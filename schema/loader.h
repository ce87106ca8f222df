#pragma once
// TOML text -> JobSpec, with every rule of DESIGN.md section 2 checked and all problems collected.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/diagnostics.h"
#include "schema/job_spec.h"

namespace ddprun {

struct LoadResult {
  std::optional<JobSpec> spec;   // set when there is no error (warnings allowed)
  Diagnostics diagnostics;
  std::string source_text;       // what was read, for rendering the diagnostics
};

/// Parses and validates job file text. Never throws, never crashes, bounded in time and memory
/// for any input (binary, truncated, deeply nested, huge numbers).
LoadResult ParseJobText(std::string_view text, std::string_view source_name);

/// Reads `path` (at most 1 MiB) and parses it; a missing or unreadable file is a diagnostic.
LoadResult LoadJobFile(const std::string& path);

/// Appends `args` (what followed `--` on the ddprun command line) to job.command. Called
/// before the fingerprint is computed, so every node must be given the same arguments.
void AppendScriptArgs(JobSpec& spec, const std::vector<std::string>& args);

/// A range of TCP ports, both ends included.
struct PortRange {
  int first = 32768;  // Linux's default net.ipv4.ip_local_port_range
  int last = 60999;
};

/// Warns when cluster.master_port or cluster.store_port lies in `ephemeral`, the range the
/// kernel picks outgoing connections' local ports from, and not in `reserved` (the caller reads
/// both from /proc/sys/net/ipv4/ip_local_port_range and ip_local_reserved_ports): any outgoing
/// connection on node 0 may hold the port when the agent wants to listen.
void CheckEphemeralPorts(const JobSpec& spec, PortRange ephemeral,
                         const std::vector<PortRange>& reserved, Diagnostics& diagnostics);

/// Parses ip_local_port_range ("32768\t60999"); nullopt when malformed.
std::optional<PortRange> ParsePortRange(std::string_view text);
/// Parses ip_local_reserved_ports ("8080,50000-50010"); malformed items are skipped.
std::vector<PortRange> ParseReservedPorts(std::string_view text);

/// The kebab-case name of a fault kind, as written in the job file ("node-crash").
std::string_view FaultKindName(FaultKind kind);

/// The fault kind named `name` ("worker-exit"), or nullopt.
std::optional<FaultKind> ParseFaultKind(std::string_view name);

/// Parses the command-line form `kind@time[:key=value,...]`, e.g. `node-crash@40m:node=1` or
/// `worker-exit@90s:node=1,local_rank=0,exit_code=3`; peers are joined with `+`
/// (`partition@5m:node=1,peers=0+2,duration=1m`). Checks syntax and the keys each kind takes,
/// not the ranges of the job (see FaultFitsJob). On failure returns nullopt and sets *error
/// to one sentence.
std::optional<FaultSpec> ParseFaultFlag(std::string_view text, std::string* error);

/// Whether `fault` addresses nodes, workers and peers that exist in `spec`; sets *error when not.
bool FaultFitsJob(const FaultSpec& fault, const JobSpec& spec, std::string* error);

}  // namespace ddprun
