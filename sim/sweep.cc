#include "sim/sweep.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "report/render.h"
#include "schema/diagnostics.h"
#include "schema/loader.h"

namespace ddprun::sim {
namespace {

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

// The value at quantile q of sorted `v` (nearest rank, as --swarm's goodput line has it).
double At(const std::vector<double>& v, double q) {
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// " (with --set a=1 --set b=2)" for the changes every setting has; "" when none.
std::string WithFixed(const SweepResult& sweep) {
  if (sweep.fixed.empty()) return "";
  return fmt::format(" (with --set {})", fmt::join(sweep.fixed, " --set "));
}

std::string Label(const SweepResult& sweep, const SweepRow& row) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < row.values.size(); ++i)
    parts.push_back(fmt::format("{}={}", sweep.keys[i], row.values[i]));
  return parts.empty() ? "the job as written" : fmt::format("{}", fmt::join(parts, ", "));
}

std::string OtherExits(const SweepRow& row) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : row.exit_codes) {
    if (code != 0) parts.push_back(fmt::format("exit {}: {}", code, n));
  }
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, ", "));
}

SweepRow Summarise(std::vector<std::string> values, const std::vector<SimResult>& results) {
  SweepRow row;
  row.values = std::move(values);
  std::vector<double> goodput;
  double restarts = 0;
  double lost = 0;
  double down = 0;
  double kept = 0;
  for (const SimResult& r : results) {
    const SimStats& s = r.stats;
    ++row.runs;
    ++row.exit_codes[r.exit_code];
    if (r.exit_code == 0) ++row.finished;
    if (r.violation) ++row.violations;
    goodput.push_back(s.end_ns > 0 ? static_cast<double>(s.useful_ns) / static_cast<double>(s.end_ns) : 0.0);
    restarts += s.restarts_used;
    lost += static_cast<double>(s.lost_ns);
    down += static_cast<double>(std::max<int64_t>(0, s.end_ns - s.training_ns));
    kept += s.train_target_ns > 0 ? static_cast<double>(s.useful_ns) / static_cast<double>(s.train_target_ns)
                                  : 0.0;
  }
  std::sort(goodput.begin(), goodput.end());
  const double n = std::max(1, row.runs);
  double sum = 0;
  for (double g : goodput) sum += g;
  row.goodput_mean = sum / n;
  row.goodput_p10 = At(goodput, 0.1);
  row.goodput_median = At(goodput, 0.5);
  row.goodput_p90 = At(goodput, 0.9);
  row.restarts_mean = restarts / n;
  row.lost_mean_ns = static_cast<int64_t>(std::llround(lost / n));
  row.downtime_mean_ns = static_cast<int64_t>(std::llround(down / n));
  row.kept_mean = kept / n;
  return row;
}

}  // namespace

Result<SweepAxis> ParseSweepFlag(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return Fail("expected key=v1,v2,... (for example cluster.spares=0,1,2)");
  auto key = ResolveJobKey(text.substr(0, eq));
  if (!key) return Fail(key.error());
  SweepAxis axis;
  axis.key = *key;
  // Values are split at the commas outside brackets, braces and quotes: a list value
  // (`cluster.nodes=["a","b"],["a","b","c"]`) is one value.
  const std::string_view values = text.substr(eq + 1);
  int depth = 0;
  char quote = 0;
  size_t start = 0;
  for (size_t i = 0; i <= values.size(); ++i) {
    const char c = i < values.size() ? values[i] : ',';
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') quote = c;
    if (c == '[' || c == '{') ++depth;
    if ((c == ']' || c == '}') && depth > 0) --depth;
    if (c != ',' || (depth > 0 && i < values.size())) continue;
    const std::string_view value = values.substr(start, i - start);
    if (value.empty()) return Fail(fmt::format("{}: an empty value in \"{}\"", axis.key, values));
    axis.values.emplace_back(value);
    start = i + 1;
  }
  if (quote != 0 || depth != 0) {
    return Fail(
        fmt::format("{}: \"{}\" has an unclosed {}", axis.key, values, quote != 0 ? "quote" : "bracket"));
  }
  if (axis.values.size() > 100) return Fail(fmt::format("{}: at most 100 values", axis.key));
  return axis;
}

Result<SweepResult> RunSweep(std::string_view job_text, const std::string& job_path,
                             const std::vector<JobOverride>& fixed, const std::vector<SweepAxis>& axes,
                             uint64_t first_seed, int seeds) {
  SweepResult sweep;
  sweep.job_path = job_path;
  sweep.first_seed = first_seed;
  sweep.seeds = seeds;
  for (const SweepAxis& axis : axes) sweep.keys.push_back(axis.key);
  for (const JobOverride& change : fixed) sweep.fixed.push_back(FormatJobOverride(change));
  size_t settings = 1;
  for (const SweepAxis& axis : axes) settings *= axis.values.size();
  if (settings > 1000) return Fail(fmt::format("the sweep has {} settings; at most 1000", settings));
  for (size_t index = 0; index < settings; ++index) {
    // The first axis varies slowest: setting `index` in mixed radix, last axis fastest.
    std::vector<std::string> values(axes.size());
    std::vector<JobOverride> changes = fixed;
    size_t rest = index;
    for (size_t a = axes.size(); a-- > 0;) {
      values[a] = axes[a].values[rest % axes[a].values.size()];
      rest /= axes[a].values.size();
    }
    for (size_t a = 0; a < axes.size(); ++a) changes.push_back(JobOverride{axes[a].key, values[a], false});
    const std::string text = ApplyJobOverrides(job_text, changes);
    LoadResult loaded = ParseJobText(text, job_path);
    if (!loaded.spec) {
      std::vector<std::string> what;
      for (const JobOverride& c : changes) what.push_back(FormatJobOverride(c));
      return Fail(fmt::format("with {}, the job file is not valid:\n{}", fmt::join(what, " "),
                              RenderDiagnostics(loaded.diagnostics, job_path, loaded.source_text, false)));
    }
    std::vector<SimResult> results;
    for (int i = 0; i < seeds; ++i) {
      SimOptions options;
      options.seed = first_seed + static_cast<uint64_t>(i);
      options.quiet = true;
      options.job_path = job_path;
      results.push_back(RunSimulation(*loaded.spec, options, nullptr));
      // Only what the summary needs: a long sweep keeps no per-node outcomes.
      results.back().nodes.clear();
      results.back().replacements.clear();
    }
    sweep.rows.push_back(Summarise(std::move(values), results));
    sweep.violations += sweep.rows.back().violations;
  }
  return sweep;
}

std::string FormatSweepTable(const SweepResult& sweep) {
  std::string text =
      fmt::format("sweep of {}{}: {} setting{} x {} seed{} ({}..{}), the job's own faults only\n\n",
                  sweep.job_path, WithFixed(sweep), sweep.rows.size(), sweep.rows.size() == 1 ? "" : "s",
                  sweep.seeds, sweep.seeds == 1 ? "" : "s", sweep.first_seed,
                  sweep.first_seed + static_cast<uint64_t>(std::max(sweep.seeds, 1)) - 1);
  std::vector<std::string> header = sweep.keys;
  for (const char* h : {"runs", "finished (exit 0)", "other exits", "goodput mean", "p10", "median", "p90",
                        "restarts (mean)", "work lost (mean)", "downtime (mean)", "training kept"}) {
    header.emplace_back(h);
  }
  text += fmt::format("| {} |\n|{}\n", fmt::join(header, " | "), [&] {
    std::string rule;
    for (size_t i = 0; i < header.size(); ++i) rule += "---|";
    return rule;
  }());
  for (const SweepRow& row : sweep.rows) {
    std::vector<std::string> cells = row.values;
    cells.push_back(fmt::format("{}", row.runs));
    cells.push_back(fmt::format("{}", row.finished));
    cells.push_back(OtherExits(row));
    cells.push_back(Percent(row.goodput_mean));
    cells.push_back(Percent(row.goodput_p10));
    cells.push_back(Percent(row.goodput_median));
    cells.push_back(Percent(row.goodput_p90));
    cells.push_back(fmt::format("{:.1f}", row.restarts_mean));
    cells.push_back(HumanDuration(Duration(row.lost_mean_ns)));
    cells.push_back(HumanDuration(Duration(row.downtime_mean_ns)));
    cells.push_back(Percent(row.kept_mean));
    text += fmt::format("| {} |\n", fmt::join(cells, " | "));
  }
  text +=
      "\ngoodput: useful training / wall time of each run (a run that ended early counts until it "
      "ended); training kept: the training done at the end over simulate.train_time\n";
  if (sweep.violations > 0) {
    text += fmt::format("{} run{} broke an invariant (exit 70): run that setting with --seed to see which\n",
                        sweep.violations, sweep.violations == 1 ? "" : "s");
  }
  return text;
}

std::string SweepChartSvg(const SweepResult& sweep) {
  // The labels' column fits the longest label (about 7 px a character at 13 px).
  size_t longest = 0;
  for (const SweepRow& row : sweep.rows) longest = std::max(longest, Label(sweep, row).size());
  const int kLeft = 24 + 7 * static_cast<int>(std::min<size_t>(longest, 90));
  const int kRight = kLeft + 570, kTop = 58, kRow = 38;
  const std::string title = fmt::format("Goodput per setting: {}{}", sweep.job_path, WithFixed(sweep));
  const std::string subtitle_start =
      fmt::format("{} seeds each ({}..{}); ", sweep.seeds, sweep.first_seed,
                  sweep.first_seed + static_cast<uint64_t>(std::max(sweep.seeds, 1)) - 1);
  // The axis starts at the 10% below the lowest p10, so that close settings stay apart. A
  // length that does not start at 0 would lie (90.5% drawn a tenth as long as 95.7%): bars
  // only on an axis from 0, else the mean is a dot.
  double low = 1.0;
  for (const SweepRow& row : sweep.rows) low = std::min(low, row.goodput_p10);
  low = std::max(0.0, std::floor(low * 10.0 - 1e-9) / 10.0);
  if (low > 0.9) low = 0.9;
  const bool bars = low <= 0.0;
  const std::string subtitle =
      subtitle_start +
      (bars ? "bar: mean" : fmt::format("dot: mean (the axis starts at {}%)", std::lround(low * 100))) +
      ", whisker: p10-p90, tick: median";
  // Wide enough for the title (about 9 px a character at 15 px bold) and the subtitle: never clipped.
  const int kWidth = std::max(
      {kRight + 40, 20 + 9 * static_cast<int>(title.size()), 20 + 7 * static_cast<int>(subtitle.size())});
  const int height = kTop + kRow * static_cast<int>(sweep.rows.size()) + 50;
  auto x = [&](double goodput) {
    return kLeft + static_cast<int>(std::lround((goodput - low) / (1.0 - low) * (kRight - kLeft)));
  };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"sweep-chart\" width=\"{0}\" height=\"{1}\" viewBox=\"0 "
      "0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"13\">\n"
      "<title>{2}</title>\n"
      "<text class=\"title\" x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{2}</text>\n"
      "<text x=\"10\" y=\"42\" fill=\"#555\">{3}</text>\n",
      kWidth, height, report::HtmlEscape(title), report::HtmlEscape(subtitle));
  const int axis_y = kTop + kRow * static_cast<int>(sweep.rows.size()) + 6;
  for (int tick = static_cast<int>(std::lround(low * 100)); tick <= 100; tick += low >= 0.5 ? 5 : 10) {
    const int tx = x(tick / 100.0);
    svg += fmt::format(
        "<line class=\"grid\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\" fill=\"#555\">{4}%</text>\n",
        tx, kTop - 4, axis_y, axis_y + 16, tick);
  }
  for (size_t i = 0; i < sweep.rows.size(); ++i) {
    const SweepRow& row = sweep.rows[i];
    const int y = kTop + kRow * static_cast<int>(i);
    const int mid = y + kRow / 2 - 4;
    svg += fmt::format("<g class=\"setting\" data-mean=\"{:.4f}\">\n", row.goodput_mean);
    svg += fmt::format("<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 8,
                       mid + 5, report::HtmlEscape(Label(sweep, row)));
    if (bars) {
      svg +=
          fmt::format("<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#7aa6d6\"/>\n",
                      kLeft, y + 4, std::max(0, x(row.goodput_mean) - kLeft), kRow - 16);
    }
    svg += fmt::format(
        "<line class=\"whisker\" x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"#333\" "
        "stroke-width=\"2\"/>\n",
        x(row.goodput_p10), x(row.goodput_p90), mid);
    svg += fmt::format(
        "<line class=\"median\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#c33\" "
        "stroke-width=\"3\"/>\n",
        x(row.goodput_median), y + 6, y + kRow - 14);
    if (!bars) {
      svg += fmt::format("<circle class=\"mean\" cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"#3a76b6\"/>\n",
                         x(row.goodput_mean), mid);
    }
    svg += fmt::format(
        "<text class=\"value\" x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#222\">{} mean, {}/{} "
        "finished</text>\n",
        kLeft + 4, y + kRow - 1, Percent(row.goodput_mean), row.finished, row.runs);
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

std::string SweepChartHtml(const SweepResult& sweep) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>ddprun sweep: "
      "{}</title>\n"
      "<style>body{{font-family:sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse;margin-"
      "top:16px}}"
      "td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{background:#f3f3f3}}"
      "td:first-child{{text-align:left}}</style>\n</head>\n<body>\n",
      report::HtmlEscape(sweep.job_path));
  html += SweepChartSvg(sweep);
  html += "<table id=\"sweep-table\">\n<tr>";
  for (const std::string& key : sweep.keys) html += "<th>" + report::HtmlEscape(key) + "</th>";
  for (const char* h : {"runs", "finished (exit 0)", "other exits", "goodput mean", "p10", "median", "p90",
                        "restarts (mean)", "work lost (mean)", "downtime (mean)", "training kept"}) {
    html += fmt::format("<th>{}</th>", h);
  }
  html += "</tr>\n";
  for (const SweepRow& row : sweep.rows) {
    html += "<tr>";
    for (const std::string& v : row.values) html += "<td>" + report::HtmlEscape(v) + "</td>";
    html += fmt::format(
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
        row.runs, row.finished, report::HtmlEscape(OtherExits(row)), Percent(row.goodput_mean),
        Percent(row.goodput_p10), Percent(row.goodput_median), Percent(row.goodput_p90), row.restarts_mean,
        HumanDuration(Duration(row.lost_mean_ns)), HumanDuration(Duration(row.downtime_mean_ns)),
        Percent(row.kept_mean));
  }
  html +=
      "</table>\n<p>Goodput: useful training / wall time of each run. Made by <code>ddprun --simulate "
      "--sweep</code>.</p>\n</body>\n</html>\n";
  return html;
}

}  // namespace ddprun::sim
