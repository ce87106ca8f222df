// The event log's reader and the timeline rebuilt from it (report/event_log.h, rebuild.h), and
// the page at scale (report/render.h): errors word for word, packed fields, files read in
// pieces and within a memory bound, runs told apart, a lost node, a hang, beacons, and 2,048
// nodes drawn in bands with the faulted ones on rows of their own.

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/event_log.h"
#include "report/rebuild.h"
#include "report/render.h"

namespace ddprun::report {
namespace {

using ::testing::HasSubstr;

// One record line; `extra` is more JSON members, e.g. R"("round":0)".
std::string Line(const std::string& type, int64_t ms, int node, const std::string& extra = "") {
  return fmt::format(R"({{"v":1,"event":"{}","unix_ms":{},"mono_ms":{},"node":{},"host":"h{}"{}{}}})", type,
                     1'700'000'000'000 + ms, 5'000 + ms, node, node, extra.empty() ? "" : ",", extra) +
         "\n";
}

std::string Start(int64_t ms, int node, int nnodes = 2) {
  return Line("agent-start", ms, node,
              fmt::format(R"("job":"j","fingerprint":"abc","nnodes":{},"spares":0,"nproc":2)", nnodes));
}

EventFile Parsed(const std::string& path, const std::string& text) {
  auto file = ParseEventFile(path, text);
  EXPECT_TRUE(file) << file.error();
  return file ? *file : EventFile{};
}

TEST(EventLogTest, FileNames) {
  EXPECT_EQ(EventFileName(12), "events-node12.jsonl");
  EXPECT_TRUE(IsEventFileName("events-node0.jsonl"));
  EXPECT_FALSE(IsEventFileName("events-node.jsonl"));
  EXPECT_FALSE(IsEventFileName("events-nodeX.jsonl"));
  EXPECT_FALSE(IsEventFileName("events-node1.jsonl.bak"));
}

TEST(EventLogTest, EveryMalformedLineIsNamedWithItsFileAndLine) {
  const std::string ok = Start(0, 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{oops\n", "f:2: not JSON"},
      {"[1,2]\n", "f:2: a JSON array, not an object"},
      {R"({"event":"x","unix_ms":1,"mono_ms":1,"node":0,"host":"h"})"
       "\n",
       "f:2: no \"v\""},
      {R"({"v":2,"event":"x","unix_ms":1,"mono_ms":1,"node":0,"host":"h"})"
       "\n",
       "f:2: format version 2; this ddprun reads version 1 (a newer ddprun wrote it?)"},
      {R"({"v":1,"unix_ms":1,"mono_ms":1,"node":0,"host":"h"})"
       "\n",
       "f:2: no \"event\""},
      {R"({"v":1,"event":"x","unix_ms":"1","mono_ms":1,"node":0,"host":"h"})"
       "\n",
       "f:2: \"unix_ms\" is not an integer"},
      {R"({"v":1,"event":"x","unix_ms":1,"mono_ms":1,"node":-1,"host":"h"})"
       "\n",
       "f:2: \"node\" -1 is out of range"},
      {R"({"v":1,"event":"x","unix_ms":1,"mono_ms":1,"node":0})"
       "\n",
       "f:2: \"host\" is missing or not a string"},
      {R"({"v":1,"event":"x","unix_ms":1,"mono_ms":1,"node":0,"host":"h","a":{"b":1}})"
       "\n",
       "f:2: \"a\" is a object, not an integer, boolean, string or array"},
      {R"({"v":1,"event":"x","unix_ms":1,"mono_ms":1,"node":0,"host":"h","a":[1,"b"]})"
       "\n",
       "f:2: \"a\" is an array that is neither all integers nor all strings"},
  };
  for (const auto& [line, error] : cases) {
    auto file = ParseEventFile("f", ok + line + ok);
    ASSERT_FALSE(file) << line;
    EXPECT_EQ(file.error(), error);
  }
  EXPECT_EQ(ParseEventFile("f", "").error(), "f: no records");
  EXPECT_EQ(ParseEventFile("f", "\n\n").error(), "f: no records");
}

TEST(EventLogTest, ALastLineCutByACrashIsSkippedAndSaid) {
  const EventFile file = Parsed("f", Start(0, 0) + Line("joined", 5, 0) + R"({"v":1,"event":"wor)");
  EXPECT_EQ(file.records.size(), 2u);
  EXPECT_EQ(file.torn, "f:3: the last line is incomplete (not JSON); skipped");
  EXPECT_EQ(file.records[1].line, 2);
  EXPECT_EQ(file.records[1].type, "joined");
}

TEST(EventLogTest, FieldsReadByType) {
  const EventFile file =
      Parsed("f", Line("x", 0, 3, R"("n":4,"b":true,"s":"t","ns":[1,2],"ss":["a"],"e":[])"));
  const EventRecord& r = file.records.front();
  EXPECT_EQ(r.node, 3);
  EXPECT_EQ(file.host, "h3");
  EXPECT_EQ(r.unix_ms, 1'700'000'000'000);
  EXPECT_EQ(r.mono_ms, 5'000);
  EXPECT_EQ(r.Int("n"), 4);
  EXPECT_EQ(r.Int("s", -7), -7) << "another type reads as the fallback";
  EXPECT_TRUE(r.Flag("b"));
  EXPECT_EQ(r.Text("s"), "t");
  EXPECT_EQ(r.Ints("ns"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.Texts("ss"), std::vector<std::string>{"a"});
  EXPECT_TRUE(r.Ints("e").empty());
}

TEST(EventLogTest, PackedFieldsKeepEveryValueExactly) {
  // The literal's own length, its \0 included (it was read as 31 bytes of a 29-byte literal,
  // past its end: ASan found it in CI's sanitizer stage).
  constexpr char kText[] = "with \"quotes\", a \0 byte and \xff";
  const std::string text(kText, sizeof kText - 1);
  EventRecord r;
  r.Set("min", std::numeric_limits<int64_t>::min());
  r.Set("max", std::numeric_limits<int64_t>::max());
  r.Set("none", int64_t{-1});
  r.Set("no", false);
  r.Set("text", text);
  r.Set("many", std::vector<int64_t>{0, -300, 1'700'000'000'000});
  r.Set("words", std::vector<std::string>{"", std::string(300, 'x')});
  EXPECT_EQ(r.Int("min"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(r.Int("max"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(r.Int("none", 5), -1);
  EXPECT_FALSE(r.Flag("no"));
  EXPECT_EQ(r.Int("no", 5), 5);
  EXPECT_EQ(r.Text("text"), text);
  EXPECT_EQ(r.Ints("many"), (std::vector<int64_t>{0, -300, 1'700'000'000'000}));
  EXPECT_EQ(r.Texts("words"), (std::vector<std::string>{"", std::string(300, 'x')}));
  EXPECT_EQ(r.Int("missing", 9), 9);
  EXPECT_EQ(r.Text("many"), "");
}

TEST(EventLogTest, AFileFedInPiecesReadsAsAWholeOne) {
  const std::string text =
      Start(0, 0) + Line("joined", 5, 0) + Line("x", 6, 0, R"("s":"a\nb")") + R"({"v":1,"ev)";
  const EventFile whole = Parsed("f", text);
  EventFileParser parser("f", 1 << 20);
  for (char c : text) ASSERT_TRUE(parser.Feed(std::string_view(&c, 1)));
  auto pieces = std::move(parser).Finish();
  ASSERT_TRUE(pieces) << pieces.error();
  ASSERT_EQ(pieces->records.size(), whole.records.size());
  EXPECT_EQ(pieces->records[2].Text("s"), "a\nb");
  EXPECT_EQ(pieces->torn, whole.torn);
  EXPECT_EQ(pieces->held_bytes, whole.held_bytes);
}

// Hostile environments, part 2: what a folder's event files take in memory is bounded; past the
// bound the reader stops, and says where and what to do.
TEST(EventLogTest, RecordsPastTheMemoryBoundAndOverlongLinesAreRefused) {
  std::string text = Start(0, 0);
  for (int i = 0; i < 1000; ++i) text += Line("joined", i, 0);
  EventFileParser parser("logs/j/events-node0.jsonl", 64 * 1024);
  const Status fed = parser.Feed(text);
  ASSERT_FALSE(fed);
  EXPECT_THAT(fed.error(),
              ::testing::MatchesRegex(
                  "logs/j/events-node0.jsonl:[0-9]+: the event files read so far take more than 64 "
                  "KiB in memory, the most ddprun holds; pass a folder with fewer of them \\(one "
                  "job's, or one run's\\)"));
  EventFileParser long_lines("f", 1 << 30);
  ASSERT_TRUE(long_lines.Feed(Start(0, 0)));
  const std::string huge(EventFileParser::kMaxLineBytes, 'x');
  EXPECT_TRUE(long_lines.Feed(huge.substr(0, 1000)));
  EXPECT_EQ(long_lines.Feed(huge).error(), "f:2: a line longer than 4 MiB");
}

TEST(EventLogTest, FilesAreGroupedIntoRunsByTime) {
  std::vector<EventFile> files = {
      Parsed("b0", Start(100'000, 0) + Line("agent-exit", 160'000, 0)),
      Parsed("a0", Start(0, 0) + Line("agent-exit", 60'000, 0)),
      Parsed("a1", Start(30'000, 1) + Line("agent-exit", 61'000, 1)),
      Parsed("b1", Start(150'000, 1) + Line("agent-exit", 160'000, 1)),
  };
  auto runs = GroupRuns(files);
  ASSERT_TRUE(runs) << runs.error();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].files.size(), 2u);
  EXPECT_EQ((*runs)[0].files[0]->path, "a0");
  EXPECT_EQ((*runs)[0].files[1]->path, "a1");
  EXPECT_EQ((*runs)[1].files[0]->path, "b0");
  EXPECT_EQ((*runs)[1].last_unix_ms, 1'700'000'160'000);
  files.push_back(Parsed("c", Line("joined", 0, 0)));
  EXPECT_EQ(GroupRuns(files).error(),
            "c:1: the first record is \"joined\", not \"agent-start\" (not the start of an agent's log)");
}

std::vector<NodePhase> Phases(const Timeline& t, size_t row) {
  std::vector<NodePhase> out;
  for (const Segment& s : t.segments[row]) out.push_back(s.phase);
  return out;
}

// Node 1's agent is killed while training (its file just stops); node 0's coordinator notices
// 3 s later; node 1's agent comes back, round 1 trains with beacons, a rank hangs.
TEST(RebuildTest, ALostNodeIsDownFromWhenItWasNoticedAndBeaconsMarkTraining) {
  const std::string zero =
      Start(0, 0) + Line("node-joined", 100, 0, R"("peer":0)") + Line("joined", 110, 0) +
      Line("node-joined", 200, 0, R"("peer":1)") + Line("round-begin", 300, 0, R"("round":0)") +
      Line("workers-start", 310, 0, R"("round":0,"plays":0,"ranks":[0,1])") +
      Line("training", 2'000, 0, R"("round":0,"rank":0)") +
      Line("node-lost", 8'000, 0, R"("peer":1,"reason":"silent for 3 heartbeats")") +
      Line("round-failed", 8'000, 0,
           R"("round":0,"peer":1,"rank":-1,"kinds":["lost-node"],"cause":"node 1 was lost")") +
      Line("signal-workers", 8'001, 0, R"("round":0,"signal":"SIGTERM")") +
      Line("round-end", 8'100, 0, R"("round":0,"outcome":"stopped","stopped":2)") +
      Line("restart", 8'100, 0, R"("restart":1,"round":1)") + Line("round-begin", 20'000, 0, R"("round":1)") +
      Line("workers-start", 20'010, 0, R"("round":1,"ranks":[0,1])") +
      Line("hang", 40'000, 0, R"("round":1,"rank":1,"silent_ms":15000)") +
      Line(
          "round-failed", 41'000, 0,
          R"("round":1,"peer":0,"rank":1,"kinds":["hang"],"cause":"rank 1 (node 0 (h0), local rank 1) hung: no progress for 15s")") +
      Line("job-result", 50'000, 0, R"("exit_code":1,"summary":"job \"j\" FAILED")") +
      Line("agent-exit", 50'100, 0, R"("exit_code":1)");
  const std::string one_first = Start(150, 1) + Line("joined", 210, 1) +
                                Line("workers-start", 320, 1, R"("round":0,"ranks":[2,3])") +
                                Line("training", 2'100, 1, R"("round":0,"rank":2)");
  const std::string one_again = Start(15'000, 1) + Line("joined", 16'000, 1) +
                                Line("workers-start", 20'020, 1, R"("round":1,"ranks":[2,3])") +
                                Line("stop-round", 45'000, 1, R"("round":1,"cause":"rank 1 hung")") +
                                Line("round-end", 45'100, 1, R"("round":1,"outcome":"stopped")") +
                                Line("agent-exit", 50'050, 1, R"("exit_code":1)");
  const std::vector<EventFile> files = {Parsed("z", zero), Parsed("o1", one_first), Parsed("o2", one_again)};
  auto runs = GroupRuns(files);
  ASSERT_TRUE(runs);
  ASSERT_EQ(runs->size(), 1u);
  const RebuiltRun run = RebuildTimeline(runs->front());
  const Timeline& t = run.timeline;
  using P = NodePhase;
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.rounds, 2);
  EXPECT_EQ(run.restarts, 1);
  EXPECT_EQ(t.labels, (std::vector<std::string>{"node 0 (h0)", "node 1 (h1)"}));
  EXPECT_EQ(t.title, "j: 2 nodes x 2 workers, started 2023-11-14 22:13:20 UTC");
  EXPECT_EQ(t.kind, "ddprun run");
  EXPECT_EQ(Phases(t, 0), (std::vector<P>{P::kRendezvous, P::kWaiting, P::kStarting, P::kTraining,
                                          P::kStopping, P::kWaiting, P::kStarting, P::kStalled, P::kDone}));
  EXPECT_EQ(Phases(t, 1),
            (std::vector<P>{P::kRendezvous, P::kWaiting, P::kStarting, P::kTraining, P::kDown, P::kRendezvous,
                            P::kWaiting, P::kStarting, P::kStopping, P::kWaiting, P::kDone}));
  // Node 1 trains until node 0 noticed its loss (8 s), not just until its last record (2.1 s).
  const Segment& down = t.segments[1][4];
  EXPECT_EQ(down.start_ns, 8'000'000'000);
  EXPECT_EQ(down.end_ns, 15'000'000'000);
  EXPECT_TRUE(t.focus[0]) << "the hang";
  EXPECT_TRUE(t.focus[1]) << "the loss";
  std::vector<std::string> marks;
  for (const Mark& m : t.marks)
    marks.push_back(fmt::format("{} {} {}", m.at_ns / 1'000'000,
                                m.node == Mark::kJob ? -1 : static_cast<int>(m.node), m.text));
  EXPECT_EQ(marks,
            (std::vector<std::string>{
                "300 -1 round 0",
                "8000 1 lost: silent for 3 heartbeats",
                "8000 -1 round 0 failed: node 1 was lost",
                "8000 1 agent gone: no exit record",
                "20000 -1 round 1",
                "40000 0 rank 1 silent for 15s",
                "41000 -1 round 1 failed: rank 1 (node 0 (h0), local rank 1) hung: no progress for 15s",
                "41000 0 rank 1 (node 0 (h0), local rank 1) hung: no progress for 15s",
                "50050 1 exit 1",
                "50100 0 exit 1",
            }));
  // The gang trained in round 0 from the later node's first step to the failure; round 1 never.
  EXPECT_EQ(t.training, (std::vector<std::pair<int64_t, int64_t>>{{2'100'000'000, 8'000'000'000}}));
  EXPECT_THAT(run.summary, HasSubstr("job \"j\" FAILED\n\nfrom 3 event files"));
  EXPECT_TRUE(run.notes.empty());
}

// Issue 40: a gang stalled in a collective; node 0's ranks, waiting for rank 3, are the first
// to be noticed silent, and node 0 judged rank 3 (on node 1) hung. The hang is drawn on node 1's
// row, the node that held the hung rank; node 0's own record says only that its rank was silent.
TEST(RebuildTest, AHangIsDrawnOnTheHungRanksNodeNotOnTheNodeThatNoticedFirst) {
  const std::string zero =
      Start(0, 0) + Line("node-joined", 100, 0, R"("peer":0)") + Line("joined", 110, 0) +
      Line("node-joined", 200, 0, R"("peer":1)") + Line("round-begin", 300, 0, R"("round":0)") +
      Line("workers-start", 310, 0, R"("round":0,"plays":0,"ranks":[0,1])") +
      Line("training", 2'000, 0, R"("round":0,"rank":0)") +
      Line("hang", 30'000, 0, R"("round":0,"rank":0,"silent_ms":20000)") +
      Line(
          "round-failed", 31'000, 0,
          R"("round":0,"peer":1,"rank":3,"kinds":["hang"],"cause":"rank 3 (node 1 (h1), local rank 1) hung: no progress for 21s")") +
      Line("job-result", 40'000, 0, R"("exit_code":1,"summary":"job \"j\" FAILED")") +
      Line("agent-exit", 40'100, 0, R"("exit_code":1)");
  const std::string one =
      Start(150, 1) + Line("joined", 210, 1) + Line("workers-start", 320, 1, R"("round":0,"ranks":[2,3])") +
      Line("training", 2'100, 1, R"("round":0,"rank":2)") + Line("agent-exit", 40'050, 1, R"("exit_code":1)");
  const std::vector<EventFile> files = {Parsed("z", zero), Parsed("o", one)};
  auto runs = GroupRuns(files);
  ASSERT_TRUE(runs);
  const Timeline t = RebuildTimeline(runs->front()).timeline;
  std::vector<std::string> on_node_1, on_node_0;
  for (const Mark& m : t.marks) {
    if (m.node == 1) on_node_1.push_back(m.text);
    if (m.node == 0) on_node_0.push_back(m.text);
  }
  EXPECT_THAT(on_node_1, ::testing::Contains("rank 3 (node 1 (h1), local rank 1) hung: no progress for 21s"));
  EXPECT_THAT(on_node_0, ::testing::Contains("rank 0 silent for 20s"));
  EXPECT_THAT(on_node_0, ::testing::Not(::testing::Contains(::testing::HasSubstr("hung"))));
  EXPECT_TRUE(t.focus[1]) << "the hung rank's node";
}

TEST(RebuildTest, ANodeWithoutAFileAndATruncatedLogAreNoted) {
  const std::string zero = Start(0, 0, 3) + Line("truncated", 10, 0, R"("limit_bytes":1000)");
  const std::vector<EventFile> files = {Parsed("z", zero)};
  auto runs = GroupRuns(files);
  ASSERT_TRUE(runs);
  const RebuiltRun run = RebuildTimeline(runs->front());
  EXPECT_EQ(run.timeline.labels[2], "node 2 (no events file)");
  EXPECT_EQ(
      run.notes,
      (std::vector<std::string>{
          "z reached its size bound: it ends with a \"truncated\" record, and this node's row ends there",
          "no events file of node 1 was found: its row is empty",
          "no events file of node 2 was found: its row is empty"}));
  EXPECT_THAT(run.summary, HasSubstr("(no record of the job's end"));
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// 2,048 nodes that live the same life but for three faulted ones: one band row and the
// faulted nodes (and node 0) on rows of their own; every history drawn once.
TEST(RenderTest, ManyNodesAreDrawnInBandsAndFaultedOnesAlone) {
  Timeline t;
  const int64_t s = 1'000'000'000;
  for (uint32_t i = 0; i < 2048; ++i) {
    t.labels.push_back(fmt::format("node {} (host-{})", i, i));
    t.segments.push_back({Segment{0, 10 * s, NodePhase::kRendezvous, -1},
                          Segment{10 * s, 100 * s, NodePhase::kTraining, 0},
                          Segment{100 * s, 110 * s, NodePhase::kDone, -1}});
    t.focus.push_back(false);
  }
  for (uint32_t i : {7u, 700u, 1500u}) {
    t.focus[i] = true;
    t.marks.push_back(
        Mark{50 * s, 50 * s, i, MarkKind::kFault, fmt::format("rank {} exited with code 1", i * 2)});
  }
  t.segments[1500][1].end_ns = 60 * s;  // a node that went down
  t.segments[1500].insert(t.segments[1500].begin() + 2, Segment{60 * s, 100 * s, NodePhase::kDown, -1});
  t.end_ns = 110 * s;
  t.title = "big";
  std::ostringstream out;
  WriteHtmlReport(t, "summary", out);
  const std::string page = out.str();
  EXPECT_THAT(page, HasSubstr("2048 nodes in 5 rows (1 band of nodes that lived the same phases)"));
  EXPECT_THAT(page, HasSubstr(">2044 nodes: 1-6, 8-699, 701-1499 and 1 more</text>"));
  EXPECT_THAT(page, HasSubstr(">node 700 (host-700)<"));
  EXPECT_THAT(page, HasSubstr("<title>rank 3000 exited with code 1 at 50s</title>"));
  EXPECT_EQ(Count(page, "<g id=\"h"), 1u) << "one drawing, used by every row";
  // Node 1500 is the band's drawing plus its time down (60 s to 100 s of 110 s, at 16 columns
  // per pixel of 1,100).
  EXPECT_EQ(Count(page, "<g transform=\"translate(0,"), 1u);
  EXPECT_THAT(
      page,
      HasSubstr("scale(0.0625,1)\"><rect x=\"9600\" width=\"6400\" height=\"12\" fill=\"#252525\"/></g>"));
  EXPECT_EQ(Count(page, "<use "), 5u);
  EXPECT_THAT(page, HasSubstr("data-ready"));
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg")) << "no fetches";
}

// A stop shorter than a pixel of the whole-run view is drawn at its width and as a line one
// screen pixel wide; a longer one only at its width.
TEST(RenderTest, APhaseNarrowerThanAPixelAlsoGetsALine) {
  Timeline t;
  const int64_t ms = 1'000'000;
  t.labels = {"node 0 (a)"};
  t.segments = {{Segment{0, 500'000 * ms, NodePhase::kTraining, 0},
                 Segment{500'000 * ms, 500'500 * ms, NodePhase::kStopping, 0},
                 Segment{500'500 * ms, 600'000 * ms, NodePhase::kWaiting, -1},
                 Segment{600'000 * ms, 1'000'000 * ms, NodePhase::kTraining, 1}}};
  t.focus = {false};
  t.end_ns = 1'000'000 * ms;
  std::ostringstream out;
  WriteHtmlReport(t, "", out);
  // 16 columns a pixel, 1,100 pixels for 1,000 s: the 0.5 s stop is columns 8800 to 8809.
  EXPECT_THAT(out.str(),
              HasSubstr("<rect x=\"8800\" width=\"9\" height=\"12\" fill=\"#d94801\"/><line x1=\"8804.5\" "
                        "x2=\"8804.5\" y2=\"12\" stroke=\"#d94801\" vector-effect=\"non-scaling-stroke\"/>"));
  EXPECT_EQ(Count(out.str(), "<line x1=\"88"), 1u) << "the 100 s wait is wide enough";
}

// The page's bounds: beyond 2,048 rows of their own, faulted nodes join the bands (and the page
// says how many); beyond about 60,000 shapes, rows are drawn coarser or share a band's drawing.
TEST(RenderTest, ThePageStaysBoundedWhenEveryNodeFaultedDifferently) {
  Timeline t;
  const int64_t ms = 1'000'000;
  const uint32_t nodes = 2100;
  for (uint32_t i = 0; i < nodes; ++i) {
    t.labels.push_back(fmt::format("node {} (h)", i));
    // 400 short rounds each, shifted per node: every history differs, and densely.
    std::vector<Segment> segments;
    for (int r = 0; r < 400; ++r) {
      const int64_t at = (int64_t{r} * 1000 + int64_t{i % 97}) * ms;
      segments.push_back(Segment{at, at + 700 * ms, NodePhase::kTraining, r});
      segments.push_back(Segment{at + 700 * ms, at + 1000 * ms, NodePhase::kWaiting, -1});
    }
    t.segments.push_back(std::move(segments));
    t.focus.push_back(true);
  }
  t.end_ns = 400'000 * ms;
  std::ostringstream out;
  WriteHtmlReport(t, "", out);
  const std::string page = out.str();
  EXPECT_THAT(page,
              HasSubstr("2100 nodes in 2049 rows (1 band of nodes that lived the same phases); 52 faulted "
                        "nodes beyond the first 2048 are in the bands"));
  EXPECT_LE(Count(page, "<rect"), 60'000u + 10);
  EXPECT_EQ(Count(page, "<use "), 2049u);
}

}  // namespace
}  // namespace ddprun::report
