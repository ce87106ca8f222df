// The report pages in a real browser: headless Chromium opens a simulated run's page and a real
// run's page (`ddprun report`), runs their script without an error, and zooms. Skipped, with
// the reason, where Chromium is not installed (scripts/install-deps.sh installs it), unless
// DDPRUN_REQUIRE names chromium.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The Chromium on PATH ("" when none).
std::string FindChromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string probe = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return name;
  }
  return "";
}

struct Loaded {
  int status = -1;
  std::string dom;     // the document after its scripts ran
  std::string errors;  // the console's uncaught errors, one per line
};

class BrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = FindChromium();
    DDPRUN_REQUIRE_OR_SKIP("chromium", !chromium_.empty(),
                           "chromium is not installed (scripts/install-deps.sh installs it)");
  }
  /// Opens `page` headless and returns its DOM after load and the console's "Uncaught" lines.
  Loaded Open(const std::string& page) {
    const std::string dom = dir_.path() + "/dom.html";
    const std::string log = dir_.path() + "/chromium.log";
    const std::string command =
        "timeout 120 " + chromium_ + " --headless --disable-gpu --no-sandbox --user-data-dir=" + dir_.path() +
        "/profile --enable-logging=stderr --v=0 --dump-dom 'file://" + page + "' > " + dom + " 2> " + log;
    Loaded loaded;
    loaded.status = std::system(command.c_str());
    loaded.dom = ReadFile(dom);
    std::istringstream lines(ReadFile(log));
    for (std::string line; std::getline(lines, line);) {
      if (line.find("Uncaught") != std::string::npos) loaded.errors += line + "\n";
    }
    return loaded;
  }
  /// `page` with a script after it that presses "zoom in" twice and writes what the plot and
  /// the time axis show into the document.
  std::string Zoomed(const std::string& page) {
    const std::string copy = dir_.path() + "/zoomed.html";
    std::ofstream(copy)
        << ReadFile(page)
        << "<script>document.getElementById('zin').click();document.getElementById('zin').click();"
           "document.body.setAttribute('data-plot',document.getElementById('plot')."
           "getAttribute('transform'));document.body.setAttribute('data-ticks',"
           "document.getElementById('ticks').textContent);</script>\n";
    return copy;
  }
  void ExpectRendersAndZooms(const std::string& page) {
    const Loaded loaded = Open(page);
    EXPECT_EQ(loaded.status, 0);
    EXPECT_EQ(loaded.errors, "") << page;
    EXPECT_THAT(loaded.dom, HasSubstr("data-ready=\"1\"")) << "the page's script ran to its end";
    EXPECT_THAT(loaded.dom, HasSubstr("<use href=\"#h0\""));
    const Loaded zoomed = Open(Zoomed(page));
    EXPECT_EQ(zoomed.errors, "");
    EXPECT_THAT(zoomed.dom, HasSubstr(" scale(4,1)\" data-ticks=")) << "two presses of zoom in: 4x";
    EXPECT_THAT(zoomed.dom, HasSubstr("zoom 4.0x"));
  }
  ScratchDir dir_;
  std::string chromium_;
};

TEST_F(BrowserTest, ABrokenScriptIsSeen) {
  const std::string page =
      dir_.Write("broken.html", "<html><body><script>no_such_function();</script></body></html>\n");
  const Loaded loaded = Open(page);
  EXPECT_THAT(loaded.errors, HasSubstr("Uncaught ReferenceError: no_such_function is not defined"));
  EXPECT_THAT(loaded.dom, Not(HasSubstr("data-ready")));
}

TEST_F(BrowserTest, ASimulatedRunsPageRendersAndZooms) {
  const std::string page = dir_.path() + "/sim.html";
  AgentProcess sim(
      {"--simulate", std::string(DDPRUN_SOURCE_DIR) + "/examples/laptop.toml", "--quiet", "--report", page},
      dir_.path() + "/sim.out");
  ASSERT_EQ(sim.Wait(60s), 0) << sim.Output();
  ExpectRendersAndZooms(page);
}

TEST_F(BrowserTest, ARealRunsPageRendersAndZooms) {
  TestJob job;
  job.name = "browser";
  job.nnodes = 1;
  job.devices = 2;
  job.master_port = FreePort();
  job.script = "sleep 0.2; [ \"$RANK\" = 1 ] && exit 3; exit 0";
  dir_.Write("job.toml", job.Toml());
  AgentProcess agent({dir_.path() + "/job.toml"}, dir_.path() + "/agent.out");
  ASSERT_EQ(agent.Wait(60s), 1) << agent.Output();
  const std::string page = dir_.path() + "/real.html";
  AgentProcess report({"report", dir_.path() + "/logs/browser", "--out", page}, dir_.path() + "/report.out");
  ASSERT_EQ(report.Wait(30s), 0) << report.Output();
  EXPECT_THAT(ReadFile(page), HasSubstr("rank 1 exited with code 3"));
  ExpectRendersAndZooms(page);
}

}  // namespace
}  // namespace ddprun::e2e
