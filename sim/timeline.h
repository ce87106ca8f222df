#pragma once
// The simulator records into the report library's Timeline (report/timeline.h); these names
// keep its code as it was.

#include "report/timeline.h"

namespace ddprun::sim {

using report::Mark;
using report::MarkKind;
using report::NodePhase;
using report::NodePhaseName;
using report::Segment;
using report::Timeline;

}  // namespace ddprun::sim
