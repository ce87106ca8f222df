#include "report/render.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "schema/duration.h"

namespace ddprun::report {
namespace {

constexpr size_t kPhases = 9;
// Colours per NodePhase, in enum order.
constexpr std::array<const char*, kPhases> kColours = {
    "#ffffff",  // off
    "#9ecae1",  // rendezvous
    "#fdd49e",  // starting
    "#41ab5d",  // training
    "#fd8d3c",  // stalled
    "#d94801",  // stopping
    "#bdbdbd",  // waiting
    "#252525",  // down
    "#f0f0f0",  // done
};
// When phases share a pixel column, the one that matters most to a reader wins.
constexpr std::array<int, kPhases> kPriority = {0, 3, 4, 2, 6, 7, 5, 8, 1};

}  // namespace

std::string HtmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const char* NodePhaseName(NodePhase phase) {
  switch (phase) {
    case NodePhase::kOff:
      return "not started";
    case NodePhase::kRendezvous:
      return "rendezvous";
    case NodePhase::kStarting:
      return "starting workers";
    case NodePhase::kTraining:
      return "training";
    case NodePhase::kStalled:
      return "stalled";
    case NodePhase::kStopping:
      return "stopping workers";
    case NodePhase::kWaiting:
      return "waiting for the next round";
    case NodePhase::kDown:
      return "down";
    case NodePhase::kDone:
      return "exited";
  }
  return "?";
}

namespace {

// The page's geometry, in CSS pixels.
constexpr int kLabelWidth = 260;
constexpr int kPlotWidth = 1100;
constexpr int kRowHeight = 16;
constexpr int kTop = 40;
// Histories are drawn with up to this many columns per pixel of the unzoomed page, so that
// zooming in (up to kMaxZoom) shows detail a pixel hid; a column keeps the phase that matters
// most. A dense history (thousands of rounds) is drawn with fewer columns per pixel, so that
// one history stays under kMaxRunsPerHistory shapes and the page under kMaxShapes.
constexpr int kMaxDetail = 16;
constexpr size_t kMaxRunsPerHistory = 2000;
constexpr size_t kMaxShapes = 60'000;
constexpr int kMaxZoom = 256;
// Beyond this many rows of their own, faulted nodes are drawn in bands like the others (the
// page says how many): a run where every node faulted stays a page, not a poster.
constexpr size_t kMaxOwnRows = 2048;
// Nodes whose phases change at most this far apart (in pixels of the unzoomed page) share a
// band; a node's own row is drawn exactly.
constexpr int64_t kBandTolerancePx = 8;
// A node is compared column by column with at most this many bands (bounded work at 10,000
// nodes that all differ).
constexpr size_t kMaxBandsCompared = 256;

// One node's phases, one column (`detail` per pixel) at a time, as runs: (first column, past
// the last column, phase). Equal vectors at detail 1 mean rows that look the same.
using History = std::vector<std::array<int32_t, 3>>;

History HistoryOf(const std::vector<Segment>& segments, int64_t end, int detail) {
  const int columns = kPlotWidth * detail;
  std::vector<int8_t> column(static_cast<size_t>(columns), -1);
  const double scale = static_cast<double>(columns) / static_cast<double>(end);
  for (const Segment& s : segments) {
    const int64_t stop = s.end_ns < 0 ? end : s.end_ns;
    const auto c0 = static_cast<int>(std::floor(static_cast<double>(s.start_ns) * scale));
    const auto c1 = std::max(c0 + 1, static_cast<int>(std::ceil(static_cast<double>(stop) * scale)));
    const auto phase = static_cast<int8_t>(s.phase);
    for (int c = std::max(0, c0); c < std::min(columns, c1); ++c) {
      int8_t& slot = column[static_cast<size_t>(c)];
      if (slot < 0 || kPriority[static_cast<size_t>(phase)] > kPriority[static_cast<size_t>(slot)])
        slot = phase;
    }
  }
  History runs;
  for (int c = 0; c < columns;) {
    const int8_t phase = column[static_cast<size_t>(c)];
    int d = c + 1;
    while (d < columns && column[static_cast<size_t>(d)] == phase) ++d;
    if (phase > 0) runs.push_back({c, d, phase});
    c = d;
  }
  return runs;
}

std::vector<int8_t> ColumnsOf(const History& history, int detail) {
  std::vector<int8_t> columns(static_cast<size_t>(kPlotWidth * detail), 0);
  for (const auto& [c0, c1, phase] : history) {
    std::fill(columns.begin() + c0, columns.begin() + c1, static_cast<int8_t>(phase));
  }
  return columns;
}

// The runs of `row` where it differs from `base` (both at `detail`); where `row` has nothing
// and `base` has a phase, a run of phase 0 (drawn in the page's background colour).
History Difference(const History& row, const History& base, int detail) {
  const std::vector<int8_t> a = ColumnsOf(row, detail);
  const std::vector<int8_t> b = ColumnsOf(base, detail);
  History out;
  const int columns = kPlotWidth * detail;
  for (int c = 0; c < columns;) {
    if (a[static_cast<size_t>(c)] == b[static_cast<size_t>(c)]) {
      ++c;
      continue;
    }
    int d = c + 1;
    while (d < columns && a[static_cast<size_t>(d)] == a[static_cast<size_t>(c)] &&
           a[static_cast<size_t>(d)] != b[static_cast<size_t>(d)]) {
      ++d;
    }
    out.push_back({c, d, a[static_cast<size_t>(c)]});
    c = d;
  }
  return out;
}

// Runs as rectangles. A run of a phase that matters more than training (a stop, a wait, a
// node down) narrower than a pixel of the unzoomed page also gets a line one screen pixel wide
// at its middle, so that the whole-run view shows it (as a pixel column showed it) and a
// zoomed view shows its true width around the line.
void WriteRuns(const History& runs, int detail, std::ostream& out) {
  for (const auto& [c0, c1, phase] : runs) {
    out << "<rect x=\"" << c0 << "\" width=\"" << c1 - c0 << "\" height=\"" << kRowHeight - 4 << "\" fill=\""
        << kColours[static_cast<size_t>(phase)] << "\"/>";
    if (c1 - c0 < detail &&
        kPriority[static_cast<size_t>(phase)] > kPriority[static_cast<size_t>(NodePhase::kTraining)]) {
      const double mid = (c0 + c1) / 2.0;
      out << fmt::format(
          "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"{}\" vector-effect=\"non-scaling-stroke\"/>",
          mid, mid, kRowHeight - 4, kColours[static_cast<size_t>(phase)]);
    }
  }
}

struct HistoryHash {
  size_t operator()(const History& h) const {
    uint64_t x = 1469598103934665603ull;
    for (const auto& run : h) {
      for (int32_t v : run) x = (x ^ static_cast<uint32_t>(v)) * 1099511628211ull;
    }
    return static_cast<size_t>(x);
  }
};

// "1-4, 6, 9-2047" for sorted node numbers, the first `limit` ranges and a count of the rest.
std::string Ranges(const std::vector<uint32_t>& nodes, size_t limit) {
  std::vector<std::string> parts;
  size_t total = 0;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    ++total;
    if (parts.size() < limit) {
      parts.push_back(i == j ? fmt::format("{}", nodes[i]) : fmt::format("{}-{}", nodes[i], nodes[j]));
    }
    i = j + 1;
  }
  std::string text = fmt::format("{}", fmt::join(parts, ", "));
  if (total > parts.size()) text += fmt::format(" and {} more", total - parts.size());
  return text;
}

// Zoom and pan for the plot: the wheel zooms around the pointer, a drag pans, the buttons and
// the keys + - 0 do the same. Time ticks are redrawn for what is shown. Sets
// data-ready on <body> once wired (the browser test looks for it).
constexpr const char* kZoomScript = R"JS(
(function(){
var svg=document.getElementById('tl'),plot=document.getElementById('plot'),ticks=document.getElementById('ticks');
var L=+svg.dataset.left,W=+svg.dataset.width,END=+svg.dataset.end,TOP=+svg.dataset.top,BOTTOM=+svg.dataset.bottom,MAX=+svg.dataset.maxzoom;
var k=1,tx=0,NS='http://www.w3.org/2000/svg';
function human(ns){var ms=Math.round(ns/1e6);if(ms<1000)return ms+'ms';if(ms<10000)return (ms/1000).toFixed(1)+'s';
var s=Math.floor(ms/1000);function p(n){return (n<10?'0':'')+n;}
if(s<60)return s+'s';if(s<3600)return Math.floor(s/60)+'m'+p(s%60)+'s';if(s<86400)return Math.floor(s/3600)+'h'+p(Math.floor(s%3600/60))+'m';
return Math.floor(s/86400)+'d'+p(Math.floor(s%86400/3600))+'h';}
var steps=[1e-3,2e-3,5e-3,1e-2,2e-2,5e-2,.1,.2,.5,1,2,5,10,15,30,60,120,300,600,900,1800,3600,7200,21600,43200,86400,172800,604800];
function draw(){
 tx=Math.min(0,Math.max(W-W*k,tx));
 plot.setAttribute('transform','translate('+tx+',0) scale('+k+',1)');
 while(ticks.firstChild)ticks.removeChild(ticks.firstChild);
 var t0=-tx/(W*k)*END,t1=(W-tx)/(W*k)*END,span=t1-t0,step=steps[steps.length-1]*1e9;
 for(var i=0;i<steps.length;i++){if(span/(steps[i]*1e9)<=10){step=steps[i]*1e9;break;}}
 for(var t=Math.ceil(t0/step)*step;t<=t1+1;t+=step){
  var x=L+tx+t/END*W*k,l=document.createElementNS(NS,'line'),tx2=document.createElementNS(NS,'text');
  l.setAttribute('x1',x);l.setAttribute('x2',x);l.setAttribute('y1',TOP-8);l.setAttribute('y2',BOTTOM);l.setAttribute('stroke','#ddd');
  tx2.setAttribute('x',x);tx2.setAttribute('y',TOP-12);tx2.setAttribute('text-anchor','middle');tx2.setAttribute('fill','#555');
  tx2.textContent=human(t);ticks.appendChild(l);ticks.appendChild(tx2);}
 document.getElementById('zoomlevel').textContent=k>1?('zoom '+(k<10?k.toFixed(1):Math.round(k))+'x'):'';
}
function zoomAt(f,px){var nk=Math.min(MAX,Math.max(1,k*f));tx=px-(px-tx)*nk/k;k=nk;draw();}
svg.addEventListener('wheel',function(e){var r=svg.getBoundingClientRect(),px=e.clientX-r.left-L;
 if(px<0)return;e.preventDefault();zoomAt(e.deltaY<0?1.25:0.8,px);},{passive:false});
var drag=null;
svg.addEventListener('mousedown',function(e){drag={x:e.clientX,tx:tx};});
window.addEventListener('mousemove',function(e){if(drag){tx=drag.tx+e.clientX-drag.x;draw();}});
window.addEventListener('mouseup',function(){drag=null;});
function btn(id,f){document.getElementById(id).addEventListener('click',f);}
btn('zin',function(){zoomAt(2,W/2);});btn('zout',function(){zoomAt(0.5,W/2);});btn('zreset',function(){k=1;tx=0;draw();});
window.addEventListener('keydown',function(e){if(e.key=='+'||e.key=='=')zoomAt(2,W/2);else if(e.key=='-')zoomAt(0.5,W/2);else if(e.key=='0'){k=1;tx=0;draw();}});
draw();
document.body.setAttribute('data-ready','1');
})();
)JS";

}  // namespace

namespace {

/// Each node's look: the band of nodes that went through the same phases (and rounds) at times
/// no further apart than kBandTolerancePx of the unzoomed page, or whose unzoomed row differs
/// from its own in at most kBandTolerancePx columns (a long run where one of hundreds of rounds
/// went a little differently). A band is drawn from its first node.
std::vector<size_t> LookOfEachNode(const Timeline& timeline, int64_t end) {
  const size_t n = timeline.labels.size();
  const int64_t tolerance = end * kBandTolerancePx / kPlotWidth;
  std::map<std::vector<std::pair<int, int32_t>>, std::vector<size_t>> bands_by_phases;
  std::vector<size_t> band_leader;  // node
  std::vector<std::vector<int8_t>> band_look;
  std::vector<size_t> history_of(n);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<Segment>& segments = timeline.segments[i];
    std::vector<std::pair<int, int32_t>> phases;
    for (const Segment& seg : segments) phases.emplace_back(static_cast<int>(seg.phase), seg.round);
    std::vector<size_t>& same_phases = bands_by_phases[phases];
    std::optional<size_t> band;
    for (size_t candidate : same_phases) {
      const std::vector<Segment>& leader = timeline.segments[band_leader[candidate]];
      bool close = true;
      for (size_t k = 0; k < segments.size() && close; ++k) {
        close = std::abs(segments[k].start_ns - leader[k].start_ns) <= tolerance;
      }
      if (close) {
        band = candidate;
        break;
      }
    }
    std::vector<int8_t> look = ColumnsOf(HistoryOf(segments, end, 1), 1);
    for (size_t candidate = 0; !band && candidate < std::min<size_t>(band_look.size(), kMaxBandsCompared);
         ++candidate) {
      int differ = 0;
      const std::vector<int8_t>& other = band_look[candidate];
      for (size_t c = 0; c < look.size() && differ <= kBandTolerancePx; ++c)
        differ += look[c] != other[c] ? 1 : 0;
      if (differ <= kBandTolerancePx) band = candidate;
    }
    if (!band) {
      band = band_leader.size();
      band_leader.push_back(i);
      band_look.push_back(std::move(look));
      same_phases.push_back(*band);
    }
    history_of[i] = *band;
  }
  return history_of;
}

// Rows: node 0 and every node a fault touched on their own; the others in bands of nodes with
// the same history (DDP is a gang: most nodes live the same life), placed at their first node.
struct Row {
  std::string label;
  std::string tooltip;
  size_t history = 0;            // its look (what it looks like unzoomed)
  std::optional<uint32_t> node;  // a row of its own: whose marks are drawn
  uint32_t first = 0;            // whose segments are drawn
};
struct RowsOfPage {
  std::vector<Row> rows;
  std::map<size_t, std::vector<uint32_t>> bands;  // history -> its nodes
  size_t folded = 0;                              // faulted nodes beyond kMaxOwnRows, in bands
};
RowsOfPage PlanRows(const Timeline& timeline, const std::vector<bool>& marked,
                    const std::vector<size_t>& history_of) {
  const size_t n = timeline.labels.size();
  RowsOfPage page;
  std::vector<Row>& rows = page.rows;
  std::map<size_t, std::vector<uint32_t>>& bands = page.bands;
  std::map<uint32_t, size_t> band_at;              // first node -> history, for the order
  std::vector<std::pair<uint32_t, size_t>> order;  // (node, row index) for own rows
  size_t own = 0;
  size_t& folded = page.folded;
  for (size_t i = 0; i < n; ++i) {
    const bool alone = n <= 48 || i == 0 || timeline.focus[i] || marked[i];
    if (alone && own < kMaxOwnRows) {
      ++own;
      continue;
    }
    if (alone) ++folded;
    auto& members = bands[history_of[i]];
    if (members.empty()) band_at[static_cast<uint32_t>(i)] = history_of[i];
    members.push_back(static_cast<uint32_t>(i));
  }
  {
    own = 0;
    auto band = band_at.begin();
    for (size_t i = 0; i < n; ++i) {
      while (band != band_at.end() && band->first <= i) {
        const std::vector<uint32_t>& members = bands[band->second];
        if (members.size() == 1) {
          rows.push_back(Row{timeline.labels[members[0]], timeline.labels[members[0]], band->second,
                             members[0], members[0]});
        } else {
          rows.push_back(Row{fmt::format("{} nodes: {}", members.size(), Ranges(members, 3)),
                             fmt::format("{} nodes that lived the same phases, drawn from node {}: {}",
                                         members.size(), members[0], Ranges(members, 200)),
                             band->second, std::nullopt, members[0]});
        }
        ++band;
      }
      const bool alone = n <= 48 || i == 0 || timeline.focus[i] || marked[i];
      if (alone && own < kMaxOwnRows) {
        ++own;
        rows.push_back(Row{timeline.labels[i], timeline.labels[i], history_of[i], static_cast<uint32_t>(i),
                           static_cast<uint32_t>(i)});
      }
    }
  }
  return page;
}

// Each row's history in as much detail as the bounds allow, every distinct one drawn once:
// bands first (from their first node), then the rows of their own. A row of its own that
// differs from a band's drawing in a few columns (a gang lives one life) is drawn as that
// band plus what differs. Once the page's shapes are spent, a row uses the drawing of the
// band it looks like unzoomed.
struct Drawing {
  History runs;
  int detail = 1;
};
struct RowDrawing {
  size_t base = 0;
  History overlay;  // columns (at the base's detail) where the row differs from it
};
struct PageDrawings {
  std::vector<Drawing> drawings;
  std::vector<RowDrawing> of_row;  // per row of the page
};
PageDrawings DrawRows(const Timeline& timeline, int64_t end, const RowsOfPage& page) {
  const std::vector<Row>& rows = page.rows;
  PageDrawings page_drawings;
  std::vector<Drawing>& drawings = page_drawings.drawings;
  std::map<std::pair<int, History>, size_t> drawing_ids;
  std::map<size_t, size_t> drawing_of_look;  // look id -> its first drawing
  std::vector<RowDrawing>& drawing_of_row = page_drawings.of_row;
  drawing_of_row.resize(rows.size());
  size_t shapes = 0;
  const auto add = [&](History runs, int detail, size_t look) {
    shapes += runs.size();
    const size_t id = drawings.size();
    drawing_ids.emplace(std::make_pair(detail, runs), id);
    drawings.push_back(Drawing{std::move(runs), detail});
    drawing_of_look.emplace(look, id);
    return id;
  };
  std::optional<size_t> main_band;  // the drawing of the band with the most nodes
  size_t main_members = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    if (row.node) continue;
    for (int detail = kMaxDetail; detail >= 1; detail /= 2) {
      History runs = HistoryOf(timeline.segments[row.first], end, detail);
      if (runs.size() > kMaxRunsPerHistory && detail > 1) continue;
      auto found = drawing_ids.find({detail, runs});
      drawing_of_row[r].base =
          found != drawing_ids.end() ? found->second : add(std::move(runs), detail, row.history);
      drawing_of_look.emplace(row.history, drawing_of_row[r].base);
      break;
    }
    if (page.bands.at(row.history).size() > main_members) {
      main_members = page.bands.at(row.history).size();
      main_band = drawing_of_row[r].base;
    }
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    if (!row.node) continue;
    bool done = false;
    for (int detail = kMaxDetail; detail >= 1 && !done; detail /= 2) {
      History runs = HistoryOf(timeline.segments[*row.node], end, detail);
      if (runs.size() > kMaxRunsPerHistory && detail > 1) continue;
      if (auto found = drawing_ids.find({detail, runs}); found != drawing_ids.end()) {
        drawing_of_row[r].base = found->second;
        done = true;
        break;
      }
      // The cheapest of: the band it looks like plus the differences, the main band plus the
      // differences, a drawing of its own.
      std::optional<size_t> best_base;
      History best_overlay;
      for (std::optional<size_t> base :
           {drawing_of_look.count(row.history) ? std::optional<size_t>(drawing_of_look[row.history])
                                               : std::nullopt,
            main_band}) {
        if (!base || drawings[*base].detail != detail) continue;
        History overlay = Difference(runs, drawings[*base].runs, detail);
        if (overlay.size() < runs.size() && (!best_base || overlay.size() < best_overlay.size())) {
          best_base = base;
          best_overlay = std::move(overlay);
        }
      }
      if (best_base && shapes + best_overlay.size() <= kMaxShapes) {
        shapes += best_overlay.size();
        drawing_of_row[r] = RowDrawing{*best_base, std::move(best_overlay)};
        done = true;
      } else if (shapes + runs.size() <= kMaxShapes) {
        drawing_of_row[r].base = add(std::move(runs), detail, row.history);
        done = true;
      } else if (detail == 1) {
        // Out of shapes: the band it looks like, else a drawing of its own regardless.
        drawing_of_row[r].base = drawing_of_look.count(row.history)
                                     ? drawing_of_look[row.history]
                                     : add(std::move(runs), detail, row.history);
        done = true;
      }
    }
  }
  return page_drawings;
}

/// The time axis at the whole run; the script redraws it when zoomed.
void WriteAxis(int64_t end, double px_per_ns, int plot_bottom, std::ostream& out) {
  const auto x_of = [&](int64_t ns) { return static_cast<double>(ns) * px_per_ns; };
  // Milliseconds per tick: about ten ticks at a round step (the script has the same table).
  static constexpr std::array<int64_t, 28> kStepsMs = {
      1,         2,         5,          10,         20,         50,          100,
      200,       500,       1'000,      2'000,      5'000,      10'000,      15'000,
      30'000,    60'000,    120'000,    300'000,    600'000,    900'000,     1'800'000,
      3'600'000, 7'200'000, 21'600'000, 43'200'000, 86'400'000, 172'800'000, 604'800'000};
  int64_t step_ns = kStepsMs.back() * 1'000'000;
  for (int64_t ms : kStepsMs) {
    if (end / (ms * 1'000'000) <= 10) {
      step_ns = ms * 1'000'000;
      break;
    }
  }
  out << "<g id=\"ticks\">";
  for (int64_t t = 0; t <= end; t += step_ns) {
    const double x = kLabelWidth + x_of(t);
    out << fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/>", x, kTop - 8,
                       x, plot_bottom)
        << fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}</text>", x,
                       kTop - 12, HumanDuration(Duration(t)));
  }
  out << "</g>\n";
}

/// The page up to the plot: its style, title, legend, zoom buttons and the <svg> element.
void WritePageHead(const Timeline& timeline, int width, int height, int64_t end, int plot_bottom,
                   std::ostream& out) {
  out << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << HtmlEscape(timeline.kind) << ": "
      << HtmlEscape(timeline.title) << "</title>\n<style>body{font-family:sans-serif;margin:16px;"
      << "color:#222}pre{background:#f7f7f7;padding:10px;font-size:12px;white-space:pre-wrap}"
      << ".legend span{display:inline-block;margin-right:14px;font-size:12px}"
      << ".legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;"
      << "border:1px solid #999}.zoom{font-size:12px;margin:6px 0}.zoom button{margin-right:4px}"
      << "svg{user-select:none}</style></head><body>\n";
  out << "<h2>" << HtmlEscape(timeline.kind) << ": " << HtmlEscape(timeline.title)
      << "</h2>\n<div class=\"legend\">";
  for (size_t p = 1; p < kPhases; ++p) {
    out << "<span><i style=\"background:" << kColours[p] << "\"></i>"
        << NodePhaseName(static_cast<NodePhase>(p)) << "</span>";
  }
  out << "<span><i style=\"background:#cb181d\"></i>fault / failure</span>"
      << "<span><i style=\"background:#2171b5\"></i>round start</span></div>\n"
      << "<div class=\"zoom\"><button id=\"zin\">zoom in</button><button id=\"zout\">zoom out</button>"
      << "<button id=\"zreset\">whole run</button> wheel: zoom at the pointer; drag: pan; keys + - 0 "
      << "<b id=\"zoomlevel\"></b></div>\n";
  out << fmt::format(
      "<svg id=\"tl\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-size=\"11\" font-family=\"sans-serif\" data-left=\"{}\" data-width=\"{}\" "
      "data-end=\"{}\" data-top=\"{}\" data-bottom=\"{}\" data-maxzoom=\"{}\">\n",
      width, height, kLabelWidth, kPlotWidth, end, kTop, plot_bottom, kMaxZoom);
}

/// Job-wide marks: failures and round starts, across all rows (down to `bottom`).
void WriteJobMarks(const Timeline& timeline, double px_per_ns, int bottom, std::ostream& out) {
  const auto x_of = [&](int64_t ns) { return static_cast<double>(ns) * px_per_ns; };
  const int y = bottom;
  int64_t last_px = -10;
  for (const Mark& m : timeline.marks) {
    if (m.node != Mark::kJob) continue;
    const double x = x_of(m.at_ns);
    const auto px = static_cast<int64_t>(x * kMaxDetail);
    if (m.kind == MarkKind::kRestart && px == last_px) continue;
    last_px = px;
    const char* colour = m.kind == MarkKind::kRestart ? "#2171b5" : "#cb181d";
    out << fmt::format(
        "<line x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"1\" "
        "stroke-dasharray=\"{}\" opacity=\"0.7\" vector-effect=\"non-scaling-stroke\">"
        "<title>{} at {}</title></line>\n",
        x, kTop, x, y, colour, m.kind == MarkKind::kRestart ? "3,2" : "none", HtmlEscape(m.text),
        HumanDuration(Duration(m.at_ns)));
  }
}

/// One node's marks on its row at `y`: a mark is a line that stays one line wide however far
/// the plot is zoomed, with a bar under it for as long as it lasted.
void WriteNodeMarks(const std::vector<const Mark*>& marks, double px_per_ns, int y, std::ostream& out) {
  const auto x_of = [&](int64_t ns) { return static_cast<double>(ns) * px_per_ns; };
  for (const Mark* m : marks) {
    const double x = x_of(m->at_ns);
    if (m->end_ns > m->at_ns) {
      out << fmt::format(
          "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"3\" fill=\"#cb181d\">"
          "<title>{}</title></rect>",
          x, y + kRowHeight - 4, std::max(0.2, x_of(m->end_ns) - x), HtmlEscape(m->text));
    }
    out << fmt::format(
        "<line x1=\"{:.2f}\" x2=\"{:.2f}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\" "
        "vector-effect=\"non-scaling-stroke\"><title>{} at {}</title></line>",
        x, x, y, y + kRowHeight, m->kind == MarkKind::kHeal ? "#2171b5" : "#cb181d", HtmlEscape(m->text),
        HumanDuration(Duration(m->at_ns)));
  }
}

}  // namespace

void WriteHtmlReport(const Timeline& timeline, const std::string& summary, std::ostream& out) {
  const int64_t end = std::max<int64_t>(timeline.end_ns, 1);
  const double px_per_ns = static_cast<double>(kPlotWidth) / static_cast<double>(end);
  const auto x_of = [&](int64_t ns) { return static_cast<double>(ns) * px_per_ns; };
  const size_t n = timeline.labels.size();

  // Which nodes a mark (other than an exit) names: they keep a row of their own.
  std::vector<bool> marked(n, false);
  for (const Mark& m : timeline.marks) {
    if (m.node != Mark::kJob && m.node < n && m.kind != MarkKind::kExit) marked[m.node] = true;
  }
  const std::vector<size_t> history_of = LookOfEachNode(timeline, end);
  const RowsOfPage page = PlanRows(timeline, marked, history_of);
  const std::vector<Row>& rows = page.rows;
  std::vector<std::vector<const Mark*>> marks_of(n);
  for (const Mark& m : timeline.marks) {
    if (m.node != Mark::kJob && m.node < n && m.kind != MarkKind::kExit) marks_of[m.node].push_back(&m);
  }

  const int plot_bottom = kTop + static_cast<int>(rows.size() + 1) * kRowHeight;
  const int height = plot_bottom + 40;
  const int width = kLabelWidth + kPlotWidth + 20;
  WritePageHead(timeline, width, height, end, plot_bottom, out);

  const PageDrawings page_drawings = DrawRows(timeline, end, page);
  const std::vector<Drawing>& drawings = page_drawings.drawings;
  const std::vector<RowDrawing>& drawing_of_row = page_drawings.of_row;
  out << "<defs>\n";
  for (size_t h = 0; h < drawings.size(); ++h) {
    out << "<g id=\"h" << h << "\"";
    if (drawings[h].detail > 1) out << " transform=\"scale(" << 1.0 / drawings[h].detail << ",1)\"";
    out << ">";
    WriteRuns(drawings[h].runs, drawings[h].detail, out);
    out << "</g>\n";
  }
  out << "</defs>\n";

  WriteAxis(end, px_per_ns, plot_bottom, out);

  // Labels stay put; the plot zooms and pans inside its own viewport.
  int y = kTop;
  out << fmt::format("<text x=\"4\" y=\"{}\" font-weight=\"bold\">job: training</text>\n", y + 12);
  y += kRowHeight;
  for (const Row& row : rows) {
    out << fmt::format("<text x=\"4\" y=\"{}\"><title>{}</title>{}</text>\n", y + 12, HtmlEscape(row.tooltip),
                       HtmlEscape(row.label));
    y += kRowHeight;
  }
  out << fmt::format("<svg x=\"{}\" y=\"0\" width=\"{}\" height=\"{}\"><g id=\"plot\">\n", kLabelWidth,
                     kPlotWidth, height);
  y = kTop;
  for (const auto& [start, stop] : timeline.training) {
    const double x0 = x_of(start);
    const double w = std::max(0.5, x_of(stop < 0 ? end : stop) - x0);
    out << fmt::format("<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"/>", x0, y + 2,
                       w, kRowHeight - 4, kColours[3]);
  }
  out << "\n";
  y += kRowHeight;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const RowDrawing& drawing = drawing_of_row[r];
    out << "<use href=\"#h" << drawing.base << "\" y=\"" << y + 2 << "\"/>";
    if (!drawing.overlay.empty()) {
      out << "<g transform=\"translate(0," << y + 2 << ") scale(" << 1.0 / drawings[drawing.base].detail
          << ",1)\">";
      WriteRuns(drawing.overlay, drawings[drawing.base].detail, out);
      out << "</g>";
    }
    if (row.node) WriteNodeMarks(marks_of[*row.node], px_per_ns, y, out);
    out << "\n";
    y += kRowHeight;
  }
  WriteJobMarks(timeline, px_per_ns, y, out);
  out << "</g></svg>\n";
  const size_t band_rows =
      static_cast<size_t>(std::count_if(rows.begin(), rows.end(), [](const Row& r) { return !r.node; }));
  out << fmt::format(
      "<text x=\"{}\" y=\"{}\" fill=\"#555\">{}; {} node{} in {} row{}{}{}</text>\n", kLabelWidth, y + 20,
      HtmlEscape(timeline.clock), n, n == 1 ? "" : "s", rows.size(), rows.size() == 1 ? "" : "s",
      band_rows == 0 ? ""
                     : fmt::format(" ({} band{} of nodes that lived the same phases)", band_rows,
                                   band_rows == 1 ? "" : "s"),
      page.folded == 0
          ? ""
          : fmt::format("; {} faulted nodes beyond the first {} are in the bands", page.folded, kMaxOwnRows));
  out << "</svg>\n<pre>" << HtmlEscape(summary) << "</pre>\n<script>" << kZoomScript
      << "</script>\n</body></html>\n";
}

}  // namespace ddprun::report
