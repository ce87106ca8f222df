#pragma once
// The canonical form of a job spec, its fingerprint, and the field-level difference of two
// specs. Agents exchange the canonical form on join so both sides can print what differs.

#include <string>
#include <string_view>
#include <vector>

#include "schema/job_spec.h"

namespace ddprun {

/// One `key = value` line per field that matters to the job, sorted by key, values in one
/// spelling (durations via FormatDuration, strings JSON-quoted). Equal for files that mean
/// the same job (key order, comments, whitespace, "60s" vs "1m"); [simulate] and logs.console
/// are left out because they do not change what the nodes run.
std::string CanonicalForm(const JobSpec& spec);

/// The canonical spelling of one [trainer] value (typed: 8, 8.0f, "8" differ).
std::string TrainerCanonical(const TrainerValue& value);
/// A string in the canonical form's quoting (JSON-style, one line).
std::string CanonicalQuote(std::string_view text);

/// Lower-case hex SHA-256 of `data` (64 characters; "" only if OpenSSL cannot allocate).
std::string Sha256Hex(std::string_view data);

/// Canonical lines whose key starts with this are advisory (job.code_check = "warn"): compared
/// and named at join, but not part of the fingerprint.
inline constexpr std::string_view kAdvisoryPrefix = "advisory.";

/// Lower-case hex SHA-256 of CanonicalForm without its advisory lines (64 characters).
std::string Fingerprint(const JobSpec& spec);
std::string FingerprintOfCanonical(const std::string& canonical);

struct FieldDifference {
  std::string key;   // "cluster.nproc_per_node"
  std::string ours;  // canonical value text, or "(not set)"
  std::string theirs;
  bool operator==(const FieldDifference&) const = default;
};

/// Field-level difference of two canonical forms, sorted by key.
std::vector<FieldDifference> DiffCanonical(const std::string& ours, const std::string& theirs);

}  // namespace ddprun
