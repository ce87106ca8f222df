// [restart]: the job-wide restart budget and the wait before each restart.
#include <fmt/format.h>

#include "schema/sections.h"

namespace ddprun {

void LoadRestart(const toml::table& root, TomlReader& reader, JobSpec::Restart& restart) {
  const toml::table* table = reader.Table(root, "restart", "restart");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("restart"), "restart");
  if (const toml::node* node = reader.Node(table, "max_restarts", "restart.max_restarts")) {
    if (auto n = reader.Integer(*node, "restart.max_restarts", *Key("restart.max_restarts").range)) {
      restart.max_restarts = static_cast<int>(*n);
    }
  }
  reader.ReadDuration(table, "backoff", "restart", restart.backoff);
  const toml::node* node = reader.Node(table, "backoff_max", "restart.backoff_max");
  if (!node) return;
  auto longest = reader.DurationValue(*node, "restart.backoff_max");
  if (!longest) return;
  if (*longest < restart.backoff) {
    reader.diags().Error(LocOf(*node), "restart.backoff_max",
                         fmt::format("restart.backoff_max = {} is shorter than restart.backoff "
                                     "= {}",
                                     FormatDuration(*longest), FormatDuration(restart.backoff)),
                         "backoff is the first wait and backoff_max the longest; the wait "
                         "doubles after each restart between the two");
    return;
  }
  restart.backoff_max = *longest;
}

}  // namespace ddprun
