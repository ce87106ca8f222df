#pragma once
// `ddprun up --install` (issue 41.4): this ddprun's own files copied over the same ssh into a
// versioned folder of the remote user's home, ~/.ddprun/<id>, and that copy run there.
//
// The copy is this binary as bin/ddprun and <exe dir>/../share/ddprun (the Python module, the
// warm template) as share/ddprun: the layout of the tarball, the .deb and a build folder alike.
// <id> is the version and the first 12 hex digits of the SHA-256 of the copy's *manifest* (one
// `sha256sum` line per file, sorted), so two builds never share a folder. A host runs a copy
// only after checking, in the same shell line, that the folder is this user's alone (owner,
// no group or world write, no symbolic link) and that every file matches the manifest: a
// folder planted, changed or left half-written is never run, and a stale one of another build
// has another name. Only POSIX sh, find, sort, xargs, sha256sum, tar and mktemp are needed
// there (every distribution ddprun runs on has them): the host may have no ddprun at all.
//
// Pure functions and file reading; no process is started here.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "base/result.h"

namespace ddprun::io {

/// This ddprun's files as a host gets them.
struct LocalCopy {
  std::string id;            // "0.1.0-1a2b3c4d5e6f": the folder's name under ~/.ddprun
  std::string manifest;      // "<sha256>  ./bin/ddprun\n...": what the host's check recomputes
  std::string manifest_sum;  // the SHA-256 of `manifest`, lower-case hex
  size_t files = 0;
  uint64_t bytes = 0;                      // the files' sizes together
  std::shared_ptr<const std::string> tar;  // a ustar stream of the files (with_tar only)
};
/// Reads `exe` (this binary) and `exe`'s ../share/ddprun (without __pycache__). An error says
/// what is missing or unreadable.
Result<LocalCopy> ReadLocalCopy(const std::filesystem::path& exe, const std::string& version, bool with_tar);

/// Shell text that defines `ddprun_copy_ok DIR` (true when DIR is a whole, unchanged copy with
/// this manifest sum, in a folder this user alone can write) and sets $b (~/.ddprun) and $c
/// (~/.ddprun/<id>).
std::string CopyCheckShell(const std::string& id, const std::string& manifest_sum);

/// The remote line that installs the copy read from its stdin (the tar stream) into
/// ~/.ddprun/<id>: unpacked into a fresh temporary folder beside it, checked file by file, run
/// once (`--version`: a binary this host cannot run is caught here, not at the job's start),
/// then renamed into place. A folder of that name that does not match is moved aside (never
/// deleted); one that another `up` installed meanwhile (a shared home) is kept.
std::string InstallLine(const LocalCopy& copy);

/// What one host's install said.
struct InstallOutcome {
  bool ok = false;
  bool installed = false;   // false: a matching copy was there already
  std::string path;         // the copy's folder there
  std::string moved_aside;  // a folder of the same name that did not match, renamed to this
  std::string what;         // why not (ok = false), one line, from the host: escape it
};
InstallOutcome ReadInstall(int exit_status, const std::string& out, const std::string& err);

}  // namespace ddprun::io
