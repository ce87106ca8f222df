#pragma once
// Writers for a recorded Timeline: Chrome trace JSON (--trace; Perfetto and chrome://tracing
// open it) and a self-contained HTML page with an inline SVG timeline (--report).

#include <ostream>
#include <string>
#include <string_view>

#include "report/timeline.h"

namespace ddprun::report {

/// `text` with & < > " written as HTML entities: safe in an element and in a quoted attribute.
std::string HtmlEscape(std::string_view text);

/// One track per node (its phases as complete events, faults and exits as instants), plus a
/// job track with training spans, round starts and failures. Times in microseconds.
void WriteChromeTrace(const Timeline& timeline, std::ostream& out);

/// A page a person reads at a glance: one row per node (bands of nodes when there are many),
/// coloured by phase, with faults, failures and restarts marked; `summary` printed below.
/// No scripts, no fonts, no network fetches.
void WriteHtmlReport(const Timeline& timeline, const std::string& summary, std::ostream& out);

}  // namespace ddprun::report
