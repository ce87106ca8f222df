#pragma once
// Changes to a job file's text for `--set`, `--sweep` and the shape swarm: `cluster.spares=2`
// rewrites (or adds) that key in the file's text, and the result goes through the real loader,
// so a changed job is checked exactly like one a user wrote (a bad value is the loader's
// diagnostic, not ours).

#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace ddprun::sim {

/// One change: `key` is a dotted path of a [section] key ("timeouts.heartbeat"); `value` is
/// written as the user wrote it ("30s", "2") and quoted as the key's type needs. `remove`
/// deletes the key instead (the shape swarm drops a host list when it changes the node count).
struct JobOverride {
  std::string key;
  std::string value;
  bool remove = false;
};

/// "section.key" as given, or a bare key that names exactly one section's key ("spares" ->
/// "cluster.spares"); an error names the sections to choose from or says it is unknown.
Result<std::string> ResolveJobKey(std::string_view key);

/// `key=value` (the --set spelling); `key=` removes the key.
Result<JobOverride> ParseJobOverride(std::string_view text);

/// `key=value` as --set writes it (for repro lines).
std::string FormatJobOverride(const JobOverride& change);

/// `text` with each change applied in order: a key's line (with a value that spans lines, such
/// as an array) is replaced or removed, a missing key is added under its section's header, a
/// missing section is added at the end.
std::string ApplyJobOverrides(std::string_view text, const std::vector<JobOverride>& changes);

}  // namespace ddprun::sim
