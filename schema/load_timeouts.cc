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
  return fmt::format(
      "make 3 x heartbeat shorter than rendezvous: e.g. heartbeat = \"{}\", or "
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
  } else if (t.rendezvous > Duration::zero() && 3 * t.heartbeat >= t.rendezvous &&
             reader.LocationOf("timeouts.heartbeat").line == 0) {
    // Only rendezvous is written: the heartbeat is the default, so the rendezvous is the value
    // to point at.
    diags.Error(reader.LocationOf("timeouts.rendezvous"), "timeouts.rendezvous",
                fmt::format("timeouts.rendezvous = {} is too short for the default timeouts.heartbeat = "
                            "{} (not set in this file): a node is declared lost after 3 missed "
                            "beats ({})",
                            FormatDuration(t.rendezvous), FormatDuration(t.heartbeat),
                            FormatDuration(3 * t.heartbeat)),
                HeartbeatHint(t.heartbeat, t.rendezvous));
  } else if (t.rendezvous > Duration::zero() && 3 * t.heartbeat >= t.rendezvous) {
    diags.Error(reader.LocationOf("timeouts.heartbeat"), "timeouts.heartbeat",
                fmt::format("timeouts.heartbeat = {} is too long for timeouts.rendezvous = {}: "
                            "a node is declared lost after 3 missed beats ({})",
                            FormatDuration(t.heartbeat), FormatDuration(t.rendezvous),
                            FormatDuration(3 * t.heartbeat)),
                HeartbeatHint(t.heartbeat, t.rendezvous));
  }
}

// timeouts.progress ("auto" or a positive duration) and timeouts.progress_start.
void ReadProgress(const toml::table& table, TomlReader& reader, JobSpec::Timeouts& t) {
  if (const toml::node* node = reader.Node(&table, "progress", "timeouts.progress")) {
    if (node->value_exact<std::string>() == std::optional<std::string>("auto")) {
      t.progress_auto = true;
    } else if (node->value_exact<std::string>() && !ParseDuration(*node->value_exact<std::string>())) {
      reader.diags().Error(LocOf(*node), "timeouts.progress",
                           fmt::format("timeouts.progress = \"{}\" is neither \"auto\" nor a "
                                       "duration",
                                       *node->value_exact<std::string>()),
                           "write \"auto\" to learn it from the job, or a duration such as "
                           "\"5m\"; leave it out to detect no hangs");
    } else if (auto d = reader.PositiveDuration(*node, "timeouts.progress")) {
      t.progress = *d;
    }
  }
  if (const toml::node* node = reader.Node(&table, "progress_start", "timeouts.progress_start")) {
    if (auto d = reader.PositiveDuration(*node, "timeouts.progress_start")) t.progress_start = *d;
    if (!t.DetectsHangs()) {
      reader.diags().Warning(LocOf(*node), "timeouts.progress_start",
                             "timeouts.progress_start has no effect without timeouts.progress",
                             "set timeouts.progress = \"auto\" (or a duration) to detect hung "
                             "ranks");
    }
  }
  if (t.progress && *t.progress < 2 * t.heartbeat) {
    reader.diags().Error(reader.LocationOf("timeouts.progress"), "timeouts.progress",
                         fmt::format("timeouts.progress = {} is shorter than 2 x timeouts.heartbeat "
                                     "= {}: ranks report their progress once per heartbeat",
                                     FormatDuration(*t.progress), FormatDuration(2 * t.heartbeat)),
                         "a hang is a rank silent for minutes; e.g. progress = \"5m\", or \"auto\"");
  }
}

}  // namespace

void LoadTimeouts(const toml::table& root, TomlReader& reader, JobSpec::Timeouts& timeouts) {
  if (const toml::table* table = reader.Table(root, "timeouts", "timeouts")) {
    reader.CheckKeys(*table, SectionNamed("timeouts"), "timeouts");
    reader.ReadDuration(table, "rendezvous", "timeouts", timeouts.rendezvous);
    reader.ReadDuration(table, "heartbeat", "timeouts", timeouts.heartbeat);
    reader.ReadDuration(table, "stop_grace", "timeouts", timeouts.stop_grace);
    if (const toml::node* node = reader.Node(table, "replace", "timeouts.replace")) {
      if (auto d = reader.PositiveDuration(*node, "timeouts.replace")) timeouts.replace = *d;
    }
    ReadProgress(*table, reader, timeouts);
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
void TimeoutOrderWarning(TomlReader& reader, const JobSpec::Timeouts& timeouts, const std::string& key,
                         Duration value, std::string_view relation, std::string_view why) {
  const SourceLoc key_loc = reader.LocationOf(key);
  if (key_loc.line != 0) {
    reader.diags().Warning(key_loc, key,
                           fmt::format("{} = {} {} timeouts.rendezvous = {}", key, FormatDuration(value),
                                       relation, FormatDuration(timeouts.rendezvous)),
                           std::string(why));
    return;
  }
  reader.diags().Warning(reader.LocationOf("timeouts.rendezvous"), "timeouts.rendezvous",
                         fmt::format("the default {} = {} {} timeouts.rendezvous = {}", key,
                                     FormatDuration(value), relation, FormatDuration(timeouts.rendezvous)),
                         fmt::format("{}; set {} shorter, or rendezvous longer", why, key));
}

}  // namespace ddprun

namespace ddprun {

void LoadStragglers(const toml::table& root, TomlReader& reader, JobSpec::Stragglers& stragglers) {
  const toml::table* table = reader.Table(root, "stragglers", "stragglers");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("stragglers"), "stragglers");
  if (const toml::node* node = reader.Node(table, "slower_percent", "stragglers.slower_percent")) {
    if (auto n =
            reader.Integer(*node, "stragglers.slower_percent", *Key("stragglers.slower_percent").range)) {
      stragglers.slower_percent = static_cast<int>(*n);
    }
  }
  if (const toml::node* node = reader.Node(table, "window", "stragglers.window")) {
    if (auto d = reader.PositiveDuration(*node, "stragglers.window")) stragglers.window = *d;
  }
}

void LoadQuarantine(const toml::table& root, TomlReader& reader, JobSpec::Quarantine& quarantine) {
  const toml::table* table = reader.Table(root, "quarantine", "quarantine");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("quarantine"), "quarantine");
  if (const toml::node* node = reader.Node(table, "failures", "quarantine.failures")) {
    if (auto n = reader.Integer(*node, "quarantine.failures", *Key("quarantine.failures").range)) {
      quarantine.failures = static_cast<int>(*n);
    }
  }
  if (const toml::node* node = reader.Node(table, "window", "quarantine.window")) {
    if (auto d = reader.PositiveDuration(*node, "quarantine.window")) quarantine.window = *d;
  }
  if (const toml::node* node = reader.Node(table, "cooldown", "quarantine.cooldown")) {
    if (auto d = reader.PositiveDuration(*node, "quarantine.cooldown")) quarantine.cooldown = *d;
  }
}

}  // namespace ddprun
