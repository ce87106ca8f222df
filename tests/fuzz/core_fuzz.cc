// libFuzzer target, stateful: two nodes (node 0 with the real coordinator, node 1) run the real
// host::NodeHost, core::Agent and core::Coordinator over in-memory ports. The input is a
// sequence of actions: deliver some of the bytes in flight on a connection (split anywhere),
// fire a node's timer, let time pass, finish or fail a connect, close a connection, end a
// worker (any code or signal), signal an agent, or inject a forged frame or raw bytes (a lying
// or broken peer). After every action the per-node invariants must hold, whatever the peer
// said: a node never runs two rounds' workers at once, never starts a rank twice while it
// runs, gives every worker the job's WORLD_SIZE and a RANK of its own, never exits with
// workers running (a SIGKILLed worker counts as gone), exits only with a documented code, and
// a state machine that just handled an input at `now` never asks to be woken before `now`
// (the house contract; a timer armed for a past time fires at once, so the host may arm one
// when the other machine's deadline is overdue: timers fire late, as real ones do), and the
// metrics text of the state it ends in renders, the job's part on node 0 only. Any
// violation aborts (a crash for libFuzzer); so do sanitizer reports and DDPRUN_ASSERT.
//   cmake --preset fuzz && cmake --build --preset fuzz --target core_fuzz
//   build/fuzz/tests/fuzz/core_fuzz -max_total_time=600 tests/fuzz/corpus/core
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <csignal>

#include "ddprun_version.h"
#include "runner/host/node_host.h"
#include "schema/canonical.h"
#include "schema/loader.h"

namespace {

using namespace ddprun;  // NOLINT: a fuzz driver, one file

[[noreturn]] void Violated(const char* what) {
  std::fprintf(stderr, "core_fuzz: invariant violated: %s\n", what);
  std::abort();
}

/// The fuzz input, read front to back; zeros once it runs out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : Byte() % n; }
  int32_t Int() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | Byte();
    return static_cast<int32_t>(v);
  }
  std::string Text() {
    const uint32_t n = Below(24);
    std::string s;
    for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(Byte()));
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct World;

/// One in-memory connection between the agent of node 1 (or node 0) and node 0's listener.
struct Link {
  int client = 0;              // node of the connecting side
  core::ConnId client_id = 0;  // the id each side knows it by
  core::ConnId server_id = 0;
  bool connected = false;  // the connect finished
  bool accepted = false;
  bool client_open = true;
  bool server_open = true;
  std::vector<uint8_t> toward_server;
  std::vector<uint8_t> toward_client;
  wire::Decoder tap;  // reads what the client's agent reads (for JobEnd codes)
};

struct Spawned {
  int round = 0;
  int local_rank = 0;
  int global_rank = 0;
  bool running = true;
  bool killed = false;  // SIGKILL sent: gone, even if its exit is never reported (stuck in the kernel)
};

class FuzzNode final : public host::Clock,
                       public host::Timer,
                       public host::Transport,
                       public host::ProcessLauncher,
                       public host::Console {
 public:
  FuzzNode(World& world, int rank) : world_(world), rank_(rank) {}
  // Clock
  TimePoint Now() const override;
  // Timer
  void ArmAt(TimePoint when) override { armed_ = when; }
  void Disarm() override { armed_.reset(); }
  // Transport
  void SetEvents(host::TransportEvents* events) override { tevents_ = events; }
  Status Listen(const std::string&, uint16_t) override {
    listening_ = true;
    return {};
  }
  core::ConnId Connect(const std::string&, uint16_t) override;
  void Send(core::ConnId conn, std::vector<uint8_t> bytes) override;
  void Close(core::ConnId conn) override;
  uint16_t ReserveStorePort() override { return 40000; }
  // ProcessLauncher
  void SetEvents(host::ProcessEvents* events) override { pevents_ = events; }
  void Spawn(int round, const core::WorkerLaunch& launch) override;
  void SignalAll(int round, int signal) override {
    for (Spawned& w : workers_) {
      if (w.round == round && signal == SIGKILL) w.killed = true;
    }
  }
  void SignalForStacks(int, const std::vector<std::pair<int, int>>&) override {}
  void RenewLease(TimePoint) override {}
  std::vector<std::string> ReadStacks(int) override {
    return {
        "Current thread 0x1 (most recent call first):\n  File \"/t.py\", line 57 in load\n"
        "  File \"/t.py\", line 9 in <module>\n",
        ""};
  }
  // Console
  void Log(core::LogLevel, std::string_view, std::string_view) override {}
  void Summary(std::string_view) override {}

  int running() const {
    int n = 0;
    for (const Spawned& w : workers_) n += w.running && !w.killed ? 1 : 0;
    return n;
  }

  World& world_;
  int rank_;
  std::optional<TimePoint> armed_;
  host::TransportEvents* tevents_ = nullptr;
  host::ProcessEvents* pevents_ = nullptr;
  bool listening_ = false;
  std::vector<Spawned> workers_;
  std::unique_ptr<host::NodeHost> host;
  std::optional<int> exit_code;
  // Which state machine handled an input in this step (checked, then cleared, after it).
  bool agent_ran = false;
  bool coordinator_ran = false;
};

struct World {
  const JobSpec* spec = nullptr;
  // Exit codes a JobEnd delivered to an agent carried. Known finding: the agent exits with
  // whatever code JobEnd names (runner/core/agent.cc), so a lying coordinator can pick any
  // code; tolerated here so the fuzzer keeps exploring, reported to the core's owner.
  std::vector<int32_t> told_exit_codes;
  TimePoint now{};
  core::ConnId next_id = 1;
  std::vector<Link> links;
  std::unique_ptr<FuzzNode> nodes[2];

  Link* ByClient(core::ConnId id) {
    for (Link& l : links)
      if (l.client_id == id) return &l;
    return nullptr;
  }
  Link* ByServer(core::ConnId id) {
    for (Link& l : links)
      if (l.server_id == id) return &l;
    return nullptr;
  }
};

TimePoint FuzzNode::Now() const { return world_.now; }

core::ConnId FuzzNode::Connect(const std::string&, uint16_t) {
  if (world_.links.size() >= 64) {
    // A limit on the state the fuzzer builds; a connect beyond it never finishes.
    return world_.next_id++;
  }
  Link link;
  link.client = rank_;
  link.client_id = world_.next_id++;
  world_.links.push_back(link);
  return link.client_id;
}

void FuzzNode::Send(core::ConnId conn, std::vector<uint8_t> bytes) {
  if (Link* l = world_.ByClient(conn); l && l->client == rank_ && l->client_open) {
    if (l->toward_server.size() < (1u << 20))
      l->toward_server.insert(l->toward_server.end(), bytes.begin(), bytes.end());
  } else if (Link* s = world_.ByServer(conn); s && rank_ == 0 && s->server_open) {
    if (s->toward_client.size() < (1u << 20))
      s->toward_client.insert(s->toward_client.end(), bytes.begin(), bytes.end());
  }
}

void FuzzNode::Close(core::ConnId conn) {
  if (Link* l = world_.ByClient(conn); l && l->client == rank_) l->client_open = false;
  if (Link* s = world_.ByServer(conn); s && rank_ == 0) s->server_open = false;
}

int EnvInt(const EnvList& env, std::string_view name) {
  for (const auto& [key, value] : env) {
    if (key == name) return std::atoi(value.c_str());
  }
  return -1;
}

void FuzzNode::Spawn(int round, const core::WorkerLaunch& launch) {
  const int nproc = world_.spec->cluster.nproc_per_node;
  for (const Spawned& w : workers_) {
    if (!w.running || w.killed) continue;
    if (w.round != round) Violated("a node starts a round while an older round's workers run");
    if (w.local_rank == launch.local_rank) Violated("a local rank starts twice while it runs");
  }
  if (EnvInt(launch.env, "WORLD_SIZE") != world_.spec->WorldSize())
    Violated("WORLD_SIZE differs from the job");
  if (EnvInt(launch.env, "RANK") != launch.global_rank ||
      launch.global_rank != rank_ * nproc + launch.local_rank || launch.local_rank < 0 ||
      launch.local_rank >= nproc) {
    Violated("RANK is not this node's rank for the local rank");
  }
  if (workers_.size() < 4096)
    workers_.push_back(Spawned{round, launch.local_rank, launch.global_rank, true, false});
}

const JobSpec& TheJob() {
  static const JobSpec spec = [] {
    LoadResult loaded = ParseJobText(R"(version = 1
[job]
name = "fuzz"
command = ["python", "train.py"]
[cluster]
nnodes = 2
spares = 1
master_addr = "127.0.0.1"
nproc_per_node = 2
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
[restart]
max_restarts = 2
backoff = "1s"
[timeouts]
rendezvous = "1m"
heartbeat = "1s"
stop_grace = "2s"
progress = "auto"
progress_start = "5s"
replace = "2s"
[stragglers]
window = "4s"
)",
                                     "fuzz.toml");
    if (!loaded.spec) std::abort();
    return *loaded.spec;
  }();
  return spec;
}

wire::Message Forge(Input& in) {
  switch (in.Below(19)) {
    case 0:
      return wire::Join{static_cast<int32_t>(in.Below(3)),
                        in.Text(),
                        static_cast<int32_t>(in.Below(4)),
                        DDPRUN_VERSION,
                        in.Text(),
                        in.Text(),
                        in.Byte(),
                        "",
                        in.Text(),
                        in.Text()};
    case 1:
      return wire::JoinAck{static_cast<int32_t>(in.Below(4))};
    case 2:
      return wire::Reject{in.Text(), in.Below(2) == 1};
    case 3:
      return wire::Progress{static_cast<int32_t>(in.Below(3)), 2, {1}, in.Int(), in.Int(), {"gpu-02"}};
    case 4:
      return wire::StartRound{static_cast<int32_t>(in.Below(4)) - 1, static_cast<uint16_t>(in.Int())};
    case 5:
      return wire::WorkerFailed{
          static_cast<int32_t>(in.Below(4)), in.Int(), in.Int(), in.Int(), in.Int(), in.Text(), in.Text()};
    case 6:
      return wire::NodeDone{static_cast<int32_t>(in.Below(4))};
    case 7:
      return wire::StopRound{static_cast<int32_t>(in.Below(4)), in.Text(), in.Below(2) == 1};
    case 8:
      return wire::RoundStopped{static_cast<int32_t>(in.Below(4)), in.Int()};
    case 9:
      return wire::Interrupted{in.Int()};
    case 10:
      return wire::JobEnd{in.Int(), in.Text()};
    case 11:
      return wire::JobEndAck{};
    case 12:
      return wire::Heartbeat{};
    case 13:
      return wire::RankHung{static_cast<int32_t>(in.Below(4)),
                            in.Int(),
                            in.Int(),
                            in.Int(),
                            in.Int(),
                            in.Int(),
                            in.Below(2) == 1};
    case 14:
      return wire::DumpStacks{static_cast<int32_t>(in.Below(4))};
    case 15:
      return wire::RankStacks{
          static_cast<int32_t>(in.Below(4)),
          {wire::RankState{static_cast<int32_t>(in.Below(5)), in.Int(), in.Int(), in.Text()},
           wire::RankState{static_cast<int32_t>(in.Below(5)), in.Int(), in.Int(), in.Text()}}};
    case 16:
      return wire::RankProgress{
          static_cast<int32_t>(in.Below(4)),
          {wire::RankRate{static_cast<int32_t>(in.Below(5)), in.Int(), in.Int(), in.Int(), in.Int()}}};
    case 17:
      return wire::HangCleared{static_cast<int32_t>(in.Below(4))};
    default:
      return wire::Challenge{in.Text(), in.Text()};
  }
}

void CheckNode(FuzzNode& node) {
  const TimePoint now = node.world_.now;
  if (node.host && !node.host->finished()) {
    const auto agent = node.host->agent().NextDeadline();
    if (node.agent_ran && agent && *agent < now)
      Violated("the agent's next deadline is before the input it handled");
    const core::Coordinator* coordinator = node.host->coordinator();
    const auto mine = coordinator ? coordinator->NextDeadline() : std::nullopt;
    if (node.coordinator_ran && mine && *mine < now) {
      Violated("the coordinator's next deadline is before the input it handled");
    }
  }
  node.agent_ran = false;
  node.coordinator_ran = false;
  if (node.exit_code) {
    const int code = *node.exit_code;
    const auto& forged = node.world_.told_exit_codes;
    const bool told = std::find(forged.begin(), forged.end(), code) != forged.end();
    if (!told && code != 0 && code != 1 && code != 2 && code != 3 && code != 70 && code != 130 &&
        code != 143) {
      std::fprintf(stderr, "core_fuzz: exit code %d\n", code);
      Violated("an agent exits with an undocumented code");
    }
    if (node.running() > 0) Violated("an agent exits with workers running");
  }
}

// What a scrape of the state the input ended in gets. Taking it after every action would cost
// half of the fuzzer's speed (a snapshot) or more than nine tenths (the text).
// Whether `text` holds a sample of `name` (every series carries labels: `name{job_name=...}`).
bool HasSeries(const std::string& text, const std::string& name) {
  return text.find("\n" + name + "{") != std::string::npos ||
         text.find("\n" + name + " ") != std::string::npos;
}

void CheckScrape(const FuzzNode& node) {
  if (!node.host) return;
  const std::string text = host::RenderMetricsText(node.host->Metrics());
  if (!HasSeries(text, "ddprun_node_round")) Violated("the metrics lack the node's round");
  if ((node.host->coordinator() != nullptr) != HasSeries(text, "ddprun_job_round")) {
    Violated("the job's metrics are served by node 0, and only there");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  World world;
  world.spec = &TheJob();
  for (int rank = 0; rank < 2; ++rank) {
    world.nodes[rank] = std::make_unique<FuzzNode>(world, rank);
    FuzzNode& n = *world.nodes[rank];
    core::Agent::Config config;
    config.node_rank = rank;
    config.host = rank == 0 ? "n0" : "n1";
    config.canonical = CanonicalForm(*world.spec);
    config.fingerprint = FingerprintOfCanonical(config.canonical);
    config.instance = 17 + static_cast<uint64_t>(rank);
    config.ddprun_version = DDPRUN_VERSION;
    host::Ports ports{&n, &n, &n, &n, &n};
    n.host =
        std::make_unique<host::NodeHost>(*world.spec, config, ports, [&n](int code) { n.exit_code = code; });
    if (!n.host->Start()) std::abort();
  }
  // At most this many actions per input: a limit on the work of one execution.
  for (int step = 0; step < 2000 && !in.empty(); ++step) {
    const uint32_t action = in.Below(11);
    FuzzNode& node = *world.nodes[in.Below(2)];
    Link* link =
        world.links.empty() ? nullptr : &world.links[in.Below(static_cast<uint32_t>(world.links.size()))];
    FuzzNode& server = *world.nodes[0];
    switch (action) {
      case 0:  // deliver a prefix of the bytes in flight, toward the server or the client
        if (link && link->connected) {
          const bool up = in.Below(2) == 0;
          auto& buffer = up ? link->toward_server : link->toward_client;
          if (buffer.empty()) break;
          const size_t n = 1 + in.Below(static_cast<uint32_t>(std::min<size_t>(buffer.size(), 4096)));
          std::vector<uint8_t> chunk(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(n));
          buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(n));
          // (Bytes reach a state machine only once a frame is complete: no deadline check.)
          if (up && link->accepted && link->server_open && server.tevents_)
            server.tevents_->OnData(link->server_id, chunk);
          FuzzNode& client = *world.nodes[link->client];
          if (!up && link->client_open && client.tevents_) {
            link->tap.Feed(chunk);
            for (wire::Message m; link->tap.Next(m) == wire::Decoder::Status::kMessage;) {
              if (const auto* end = std::get_if<wire::JobEnd>(&m))
                world.told_exit_codes.push_back(end->exit_code);
            }
            client.tevents_->OnData(link->client_id, chunk);
          }
        }
        break;
      case 1:  // the node's timer fires at its time
        if (node.armed_ && node.host && !node.host->finished()) {
          if (*node.armed_ > world.now) world.now = *node.armed_;
          node.armed_.reset();
          node.agent_ran = node.coordinator_ran = true;
          node.host->OnTimer();
        }
        break;
      case 2:  // time passes
        world.now += Millis(in.Byte()) * 37;
        break;
      case 3:  // a connect finishes: accepted, or failed in one of the ways TCP fails
        if (link && !link->connected && link->client_open) {
          FuzzNode& client = *world.nodes[link->client];
          client.agent_ran = true;
          if (in.Below(3) != 0 && server.listening_ && !server.host->finished()) {
            link->connected = true;
            link->accepted = true;
            link->server_id = world.next_id++;
            server.coordinator_ran = true;
            if (server.tevents_) server.tevents_->OnAccepted(link->server_id, "10.0.0.2:40000");
            if (client.tevents_) client.tevents_->OnConnected(link->client_id);
          } else {
            link->client_open = false;
            link->connected = true;
            if (client.tevents_) {
              client.tevents_->OnConnectFailed(link->client_id, static_cast<core::ConnectError>(in.Below(5)),
                                               "fuzz");
            }
          }
        }
        break;
      case 4:  // one side of a connection closes or resets
        if (link && link->connected) {
          if (in.Below(2) == 0 && link->accepted && link->server_open) {
            link->server_open = false;
            server.coordinator_ran = true;
            if (server.tevents_) server.tevents_->OnClosed(link->server_id, "fuzz: closed by the peer");
          } else if (link->client_open) {
            link->client_open = false;
            FuzzNode& client = *world.nodes[link->client];
            client.agent_ran = true;
            if (client.tevents_) client.tevents_->OnClosed(link->client_id, "fuzz: reset by the peer");
          }
        }
        break;
      case 5:  // a worker ends: exit code or signal
        if (!node.workers_.empty()) {
          Spawned& w = node.workers_[in.Below(static_cast<uint32_t>(node.workers_.size()))];
          if (w.running && node.pevents_) {
            w.running = false;
            core::WorkerExited exited;
            exited.round = w.round;
            exited.local_rank = w.local_rank;
            if (in.Below(4) == 0) {
              exited.signal = in.Below(2) == 0 ? SIGKILL : SIGTERM;
            } else {
              exited.exit_code = in.Below(3) == 0 ? 0 : static_cast<int>(in.Byte());
            }
            exited.stderr_tail = in.Text();
            node.agent_ran = true;
            node.pevents_->OnWorkerExited(exited);
          }
        }
        break;
      case 6:  // SIGTERM or SIGINT reaches an agent
        if (node.host && !node.host->finished() && in.Below(8) == 0) {
          node.agent_ran = true;
          node.host->OnSignal(in.Below(2) ? SIGTERM : SIGINT);
        }
        break;
      case 7:  // a forged frame, toward the server or the client (a lying peer)
      case 8:  // raw bytes (a broken peer, or not ddprun at all)
        if (link && link->connected) {
          std::vector<uint8_t> bytes;
          if (action == 7) {
            bytes = wire::Encode(Forge(in));
          } else {
            const uint32_t n = in.Below(64);
            for (uint32_t i = 0; i < n; ++i) bytes.push_back(in.Byte());
          }
          auto& buffer = in.Below(2) == 0 ? link->toward_server : link->toward_client;
          if (buffer.size() < (1u << 20)) buffer.insert(buffer.end(), bytes.begin(), bytes.end());
        }
        break;
      case 9:  // a worker sends a progress beacon (any round, rank, kind, step)
        if (node.pevents_) {
          core::Beacon beacon;
          beacon.round = static_cast<int>(in.Below(4));
          beacon.local_rank = static_cast<int>(in.Below(3));
          beacon.kind = static_cast<core::BeaconKind>(in.Below(3));
          beacon.step = in.Int() & 0xffff;
          beacon.busy_us = in.Below(4) == 0 ? -1 : in.Int() & 0xfffff;
          beacon.stack_signal = in.Below(2) == 0 ? 0 : 12;
          node.agent_ran = true;
          node.pevents_->OnBeacon(beacon);
        }
        break;
      default:  // a spawn fails
        if (!node.workers_.empty() && node.pevents_) {
          Spawned& w = node.workers_.back();
          if (w.running) {
            w.running = false;
            node.agent_ran = true;
            node.pevents_->OnWorkerSpawnFailed(
                core::WorkerSpawnFailed{w.round, w.local_rank, "fuzz: spawn failed"});
          }
        }
        break;
    }
    for (auto& n : world.nodes) CheckNode(*n);
  }
  for (auto& n : world.nodes) CheckScrape(*n);
  return 0;
}
