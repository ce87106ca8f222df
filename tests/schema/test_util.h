#pragma once
// Helpers shared by the schema tests: parse a job text and print its diagnostics compactly.

#include <string>
#include <string_view>

#include "schema/loader.h"

namespace ddprun::testing {

/// A minimal valid job: 2 listed nodes x 2 devices. Lines 1-11.
inline constexpr std::string_view kBaseJob = R"(version = 1
[job]
name = "t"
command = ["python", "train.py"]
[cluster]
nodes = ["a", "b"]
master_port = 29500
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
)";

LoadResult Parse(std::string_view text);

/// One line per diagnostic, sorted: "7:18: error: message" and "  hint: ..." / "  note 6:8: ...".
std::string Diags(const LoadResult& result);

/// kBaseJob with `extra` appended.
std::string WithBase(std::string_view extra);

}  // namespace ddprun::testing
