// libFuzzer target: an agent with a shared secret against a peer that does not know it (an
// impostor on the master port, issue 25). The input is a sequence of actions: a connect
// finishes or fails, the connection closes, time passes, the agent's deadline fires, or the
// peer sends a message: any message of the protocol with fields from the input, a Challenge
// whose proof is made with another secret (for the agent's real nonce) or is raw bytes, or
// frames decoded from raw bytes. Whatever the peer does, the agent must never start a worker,
// send anything about the job (host, fingerprint, canonical form, proof), renew the workers'
// lease, print a summary other than its own rendezvous failure, exit other than with 3, log
// text the peer chose, or ask to be woken before the input it just handled. Any violation
// aborts.
//   cmake --preset fuzz && cmake --build --preset fuzz --target auth_fuzz
//   build/fuzz/tests/fuzz/auth_fuzz -runs=1000000 tests/fuzz/corpus/auth
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddprun_version.h"
#include "runner/core/agent.h"
#include "runner/core/auth.h"
#include "runner/core/wire.h"
#include "schema/canonical.h"
#include "schema/loader.h"

namespace {

using namespace ddprun;  // NOLINT: a fuzz driver, one file
using namespace std::chrono_literals;

[[noreturn]] void Violated(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "auth_fuzz: invariant violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

/// Text the peer chooses carries this mark, so that the agent's own words never match it.
constexpr std::string_view kMark = "PEER-TEXT";

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
  std::string Bytes(uint32_t most) {
    const uint32_t n = Below(most);
    std::string s;
    for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(Byte()));
    return s;
  }
  /// Text of the peer's own: marked, with any bytes after the mark (escape codes included).
  std::string Text() { return std::string(kMark) + Bytes(16); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

const JobSpec& Spec() {
  static const JobSpec spec = [] {
    LoadResult loaded = ParseJobText(R"(version = 1
[job]
name = "fuzz"
command = ["python3", "train.py"]
[cluster]
nnodes = 2
master_addr = "10.0.0.1"
master_port = 29500
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
[timeouts]
rendezvous = "1m"
heartbeat = "1s"
stop_grace = "2s"
)",
                                     "fuzz.toml");
    if (!loaded.spec) std::abort();
    return *loaded.spec;
  }();
  return spec;
}

/// A message of the protocol with fields from the input; a Challenge's proof is made with
/// another secret for the agent's nonce, or is raw bytes.
wire::Message Forge(Input& in, const std::string& agent_nonce) {
  switch (in.Below(12)) {
    case 0:
      return wire::JoinAck{in.Int(), in.Below(2) == 1};
    case 1:
      return wire::Reject{in.Text(), in.Below(2) == 1};
    case 2:
      return wire::Progress{in.Int(), in.Int(), {in.Int()}, in.Int(), in.Int(), {"h"}};
    case 3:
      return wire::StartRound{in.Int(), static_cast<uint16_t>(in.Int()), in.Int(), in.Int(), in.Int(),
                              in.Text()};
    case 4:
      return wire::StopRound{in.Int(), in.Text(), in.Below(2) == 1};
    case 5:
      return wire::JobEnd{in.Below(2) == 0 ? 0 : in.Int(), in.Text()};
    case 6:
      return wire::Heartbeat{};
    case 7:
      return wire::DumpStacks{in.Int()};
    case 8:
      return wire::Join{in.Int(),  in.Text(), in.Int(),  DDPRUN_VERSION, in.Text(),
                        in.Text(), 1,         in.Text(), in.Text()};
    case 9: {
      const std::string nonce = in.Bytes(40);
      return wire::Challenge{nonce, core::CoordinatorProof("not-" + in.Bytes(8), agent_nonce, nonce)};
    }
    case 10:
      return wire::Challenge{in.Bytes(40), in.Bytes(70)};
    default:
      return wire::Challenge{in.Bytes(40), ""};
  }
}

struct Driver {
  core::Agent agent;
  TimePoint now{};
  bool connect_pending = false;
  bool connected = false;
  bool exited = false;
  std::string nonce;  // the agent's nonce on this connection (from its hello)

  explicit Driver(core::Agent::Config config) : agent(Spec(), std::move(config)) {}

  void Check(const std::vector<core::AgentEffect>& effects) {
    for (const core::AgentEffect& effect : effects) {
      if (std::holds_alternative<core::ConnectToMaster>(effect)) connect_pending = true;
      if (std::holds_alternative<core::DisconnectFromMaster>(effect)) connected = false;
      if (std::holds_alternative<core::SpawnWorkers>(effect)) Violated("an unproven peer started a worker");
      if (std::holds_alternative<core::RenewLease>(effect))
        Violated("an unproven peer renewed the workers' lease");
      if (const auto* send = std::get_if<core::SendToMaster>(&effect)) {
        if (const auto* join = std::get_if<wire::Join>(&send->message)) {
          if (!join->host.empty() || !join->fingerprint.empty() || !join->canonical.empty() ||
              !join->proof.empty()) {
            Violated("the job was sent to an unproven peer");
          }
          nonce = join->nonce;
        }
      }
      if (const auto* summary = std::get_if<core::PrintSummary>(&effect)) {
        if (summary->text.rfind("rendezvous failed:", 0) != 0)
          Violated("a summary the agent did not write", summary->text);
        if (summary->text.find(kMark) != std::string::npos)
          Violated("the peer's text in a summary", summary->text);
      }
      if (const auto* log = std::get_if<core::LogLine>(&effect)) {
        if (log->text.find(kMark) != std::string::npos) Violated("the peer's text in a log line", log->text);
      }
      if (const auto* exit = std::get_if<core::AgentExit>(&effect)) {
        if (exit->code != 3) Violated("an unproven peer ended the agent with a code other than 3");
        exited = true;
      }
    }
    if (const auto next = agent.NextDeadline(); next && *next <= now) {
      Violated("the agent's next deadline is not after the input it handled");
    }
  }

  void Feed(const core::AgentInput& input) {
    std::vector<core::AgentEffect> effects;
    agent.Handle(now, input, effects);
    Check(effects);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  core::Agent::Config config;
  config.node_rank = 1;
  config.host = "gpu-02";
  config.canonical = CanonicalForm(Spec());
  config.fingerprint = Fingerprint(Spec());
  config.instance = 7;
  config.ddprun_version = DDPRUN_VERSION;
  config.logs_dir = "logs";
  config.secret = "the-real-secret";
  Driver d(std::move(config));
  {
    std::vector<core::AgentEffect> effects;
    d.agent.Start(d.now, effects);
    d.Check(effects);
  }
  for (int steps = 0; steps < 256 && !in.empty() && !d.exited; ++steps) {
    switch (in.Below(7)) {
      case 0:  // the connect finishes
        if (d.connect_pending) {
          d.connect_pending = false;
          d.connected = true;
          d.Feed(core::MasterConnected{});
        }
        break;
      case 1:  // the connect fails
        if (d.connect_pending) {
          d.connect_pending = false;
          d.Feed(core::MasterConnectFailed{static_cast<core::ConnectError>(in.Below(6)), "fuzz"});
        }
        break;
      case 2:  // the peer closes
        if (d.connected) {
          d.connected = false;
          d.Feed(core::MasterClosed{"fuzz"});
        }
        break;
      case 3:  // time passes
        d.now += std::chrono::milliseconds(in.Below(5000));
        d.Feed(core::Tick{});
        break;
      case 4:  // the agent's own deadline
        if (const auto next = d.agent.NextDeadline()) {
          d.now = std::max(d.now, *next);
          d.Feed(core::Tick{});
        }
        break;
      case 5:  // a message of the peer's choosing
        if (d.connected) d.Feed(core::MasterMessage{Forge(in, d.nonce)});
        break;
      default: {  // raw bytes through the real decoder
        if (!d.connected) break;
        wire::Decoder decoder;
        const std::string bytes = std::string("DDPR\x01", 5) + in.Bytes(64);
        decoder.Feed(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        wire::Message message;
        while (d.connected && decoder.Next(message) == wire::Decoder::Status::kMessage) {
          d.Feed(core::MasterMessage{message});
        }
        break;
      }
    }
  }
  return 0;
}
