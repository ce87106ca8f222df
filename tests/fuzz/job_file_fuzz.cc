// libFuzzer target: any bytes given to the job file loader come back as a spec or as
// diagnostics, never a crash, hang or sanitizer report; a loaded spec must also plan and render.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "schema/canonical.h"
#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "schema/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ddprun::LoadResult result = ddprun::ParseJobText(text, "fuzz.toml");
  (void)ddprun::RenderDiagnostics(result.diagnostics, "fuzz.toml", result.source_text, true);
  if (result.spec && result.spec->WorldSize() <= 4096) {
    const ddprun::Plan plan = ddprun::MakePlan(*result.spec, std::nullopt);
    (void)ddprun::RenderPlanText(*result.spec, plan);
    (void)ddprun::RenderPlanSummary(*result.spec, plan);
    (void)ddprun::Fingerprint(*result.spec);
  }
  // The flag parser sees the same bytes too; a failure must say why.
  const auto fault = ddprun::ParseFaultFlag(text.substr(0, 512));
  if (!fault && fault.error().empty()) __builtin_trap();
  return 0;
}
