#pragma once
// The JSON Schema of the job file, for editors, generated from the key table (schema/keys.h).

#include <string>

namespace ddprun {

/// JSON Schema (draft 2020-12) of the job file; `ddprun schema` prints it and
/// docs/job-file.schema.json is a copy (a test keeps the two equal).
std::string JobFileJsonSchema();

}  // namespace ddprun
