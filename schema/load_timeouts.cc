// [timeouts]: rendezvous, heartbeat and stop grace, and the rules between them.
#include <algorithm>

#include <fmt/format.h>

#include "schema/sections.h"

namespace ddprun {
namespace {

// Suggestions that satisfy 3 x heartbeat < rendezvous from either side, in round numbers.
std::string HeartbeatHint(Duration heartbeat, Duration rendezvous) {
  const auto beat = std::chrono::duration_cast<std::chrono::milliseconds>(rendezvous / 10);
  const auto wait = std::chrono::duration_cast<std::chrono::seconds>(10 * heartbeat);
  if (beat <= Duration::zero()) {
    return fmt::format("make 3 x heartbeat shorter than rendezvous, e.g. rendezvous = \"{}\"",
                       FormatDuration(wait));
  }
  return fmt::format("make 3 x heartbeat shorter than rendezvous: e.g. heartbeat = \"{}\", or "
                     "rendezvous = \"{}\"",
                     FormatDuration(beat), FormatDuration(std::max<Duration>(wait, Seconds(1))));
}

// Both timeouts positive, and a node declared lost (3 missed beats) well before rendezvous.
void CheckHeartbeat(const JobSpec::Timeouts& t, TomlReader& reader) {
  Diagnostics& diags = reader.diags();
  if (t.rendezvous <= Duration::zero()) {
    diags.Error(reader.LocationOf("timeouts.rendezvous"), "timeouts.rendezvous",
                "timeouts.rendezvous must be longer than 0s");
  }
  if (t.heartbeat <= Duration::zero()) {
    diags.Error(reader.LocationOf("timeouts.heartbeat"), "timeouts.heartbeat",
                "timeouts.heartbeat must be longer than 0s", "e.g. heartbeat = \"2s\"");
  } else if (t.rendezvous > Duration::zero() && 3 * t.heartbeat >= t.rendezvous) {
    diags.Error(reader.LocationOf("timeouts.heartbeat"), "timeouts.heartbeat",
                fmt::format("timeouts.heartbeat = {} is too long for timeouts.rendezvous = {}: "
                            "a node is declared lost after 3 missed beats ({})",
                            FormatDuration(t.heartbeat), FormatDuration(t.rendezvous),
                            FormatDuration(3 * t.heartbeat)),
                HeartbeatHint(t.heartbeat, t.rendezvous));
  }
}

}  // namespace

void LoadTimeouts(const toml::table& root, TomlReader& reader, JobSpec::Timeouts& timeouts) {
  if (const toml::table* table = reader.Table(root, "timeouts", "timeouts")) {
    reader.CheckKeys(*table, SectionNamed("timeouts"), "timeouts");
    reader.ReadDuration(table, "rendezvous", "timeouts", timeouts.rendezvous);
    reader.ReadDuration(table, "heartbeat", "timeouts", timeouts.heartbeat);
    reader.ReadDuration(table, "stop_grace", "timeouts", timeouts.stop_grace);
  }
  CheckHeartbeat(timeouts, reader);
  const auto& t = timeouts;
  if (t.stop_grace > t.rendezvous && t.rendezvous > Duration::zero()) {
    TimeoutOrderWarning(reader, t, "timeouts.stop_grace", t.stop_grace, "is longer than",
                        "other nodes may give up on the next round while this one still waits "
                        "for its workers to stop");
  }
}

// The warning points at what the user wrote: at `key` when it is in the file, else at
// rendezvous, naming `key`'s default, so that nobody is warned about a setting they never
// made without being told which one to change.
void TimeoutOrderWarning(TomlReader& reader, const JobSpec::Timeouts& timeouts,
                         const std::string& key, Duration value, std::string_view relation,
                         std::string_view why) {
  const SourceLoc key_loc = reader.LocationOf(key);
  if (key_loc.line != 0) {
    reader.diags().Warning(key_loc, key,
                           fmt::format("{} = {} {} timeouts.rendezvous = {}", key,
                                       FormatDuration(value), relation,
                                       FormatDuration(timeouts.rendezvous)),
                           std::string(why));
    return;
  }
  reader.diags().Warning(reader.LocationOf("timeouts.rendezvous"), "timeouts.rendezvous",
                         fmt::format("the default {} = {} {} timeouts.rendezvous = {}", key,
                                     FormatDuration(value), relation,
                                     FormatDuration(timeouts.rendezvous)),
                         fmt::format("{}; set {} shorter, or rendezvous longer", why, key));
}

}  // namespace ddprun
