#include "preflight/worker.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/hex.h"
#include "base/host_name.h"
#include "base/parse_int.h"
#include "preflight/cuda_loader.h"
#include "preflight/exchange.h"

namespace ddprun::preflight {

namespace {

using nlohmann::json;

// Record types of the exchange.
constexpr char kHello = 'H';   // rank -> rank 0: RankInfo
constexpr char kTable = 'T';   // rank 0 -> rank: every RankInfo and the all-reduce plan
constexpr char kReport = 'R';  // rank -> rank 0: RankReport
constexpr char kDone = 'D';    // rank 0 -> rank: finished (or {"abort": why})

constexpr uint64_t kMaxAllReduceBytes = uint64_t{1} << 30;
constexpr size_t kParallelProbes = 32;

struct Env {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int node_rank = 0;
  std::string master_addr;
  uint16_t master_port = 0;
};

Result<int> EnvInt(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) {
    return Fail(fmt::format("{} is not set: run this through `ddprun preflight job.toml`", name));
  }
  const auto value = ParseNonNegative(text, 1'000'000);
  if (!value) return Fail(fmt::format("{}=\"{}\" is not a non-negative integer", name, text));
  return static_cast<int>(*value);
}

Result<Env> ReadEnv() {
  const auto rank = EnvInt("RANK");
  const auto world = EnvInt("WORLD_SIZE");
  const auto local = EnvInt("LOCAL_RANK");
  const auto node = EnvInt("GROUP_RANK");
  const auto port = EnvInt("MASTER_PORT");
  // The last variable that failed is the one named, as before the Result shape.
  for (const Result<int>* value : {&port, &node, &local, &world, &rank}) {
    if (!*value) return Fail(value->error());
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr) {
    return Fail("MASTER_ADDR is not set: run this through `ddprun preflight job.toml`");
  }
  if (*world < 1 || *rank >= *world || *port < 1 || *port > 65535) {
    return Fail(
        fmt::format("inconsistent environment: RANK={} WORLD_SIZE={} MASTER_PORT={}", *rank, *world, *port));
  }
  Env env;
  env.rank = *rank;
  env.world = *world;
  env.local_rank = *local;
  env.node_rank = *node;
  env.master_addr = addr;
  env.master_port = static_cast<uint16_t>(*port);
  return env;
}

/// What this rank can see: GPUs, driver, CUDA runtime and NCCL versions.
// The versions of Python, torch and Lightning that `python` (the job's interpreter) imports.
// Run once per node; bounded by `timeout` (importing torch takes seconds, a broken install must
// not stall the exchange) and by the bytes read.
void ProbePython(const std::string& python, RankInfo& info) {
  constexpr std::string_view kScript =
      "import sys\n"
      "print('%d.%d.%d' % sys.version_info[:3])\n"
      "def v(names):\n"
      "    for n in names:\n"
      "        try:\n"
      "            return __import__(n).__version__\n"
      "        except Exception:\n"
      "            pass\n"
      "    return ''\n"
      "print(v(['torch']))\n"
      "print(v(['lightning', 'pytorch_lightning']))\n";
  std::string quoted = "'";
  for (char c : python) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string command = "timeout 30 " + quoted + " -c \"" + std::string(kScript) + "\" 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return;
  std::string out;
  char buffer[256];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    if (out.size() < 1024) out.append(buffer, std::min(n, 1024 - out.size()));
  }
  ::pclose(pipe);
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < out.size() && lines.size() < 3) {
    const size_t end = out.find('\n', start);
    lines.push_back(out.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  // All three lines, or nothing: a partial answer means the interpreter failed.
  if (lines.size() != 3) return;
  info.python_version = lines[0];
  info.torch_version = lines[1];
  info.lightning_version = lines[2];
}

RankInfo ProbeLocal(const Env& env) {
  RankInfo info;
  info.rank = env.rank;
  info.node_rank = env.node_rank;
  info.local_rank = env.local_rank;
  info.host = LocalHostName();
  info.driver = KernelDriverVersion();
  const CudaRuntime& cuda = LoadCudaRuntime();
  if (!cuda.Loaded()) {
    info.gpu_error = cuda.error;
  } else {
    cuda.runtime_get_version(&info.runtime_version);
    cuda.driver_get_version(&info.driver_cuda_version);
    int count = 0;  // left untouched on error 35 (deps.md)
    if (const int rc = cuda.get_device_count(&count); rc != kCudaSuccess) {
      info.gpu_error = cuda.Describe(rc);
      count = 0;
    } else if (count == 0) {
      info.gpu_error = "the CUDA runtime sees no device (check CUDA_VISIBLE_DEVICES)";
    }
    info.gpu_count = std::max(count, 0);
    // cudaDeviceProp starts with `char name[256]` in every CUDA version; its total size grows,
    // so give it far more room than it has ever needed.
    std::vector<char> props(64 * 1024);
    for (int device = 0; device < info.gpu_count; ++device) {
      std::fill(props.begin(), props.end(), '\0');
      std::string name = "unknown GPU";
      if (cuda.get_device_properties && cuda.get_device_properties(props.data(), device) == kCudaSuccess) {
        name.assign(props.data(), strnlen(props.data(), 256));
      }
      info.gpu_names.push_back(name);
    }
    if (env.local_rank < info.gpu_count && cuda.set_device(env.local_rank) == kCudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      if (cuda.mem_get_info(&free_bytes, &total_bytes) == kCudaSuccess) info.free_memory = free_bytes;
    }
  }
  const Nccl& nccl = LoadNccl();
  if (!nccl.Loaded()) {
    info.nccl_error = nccl.error;
  } else if (const int rc = nccl.get_version(&info.nccl_version); rc != kNcclSuccess) {
    info.nccl_error = nccl.Describe(rc);
    info.nccl_version = 0;
  }
  return info;
}

// ---- the all-reduce plan ----

struct Plan {
  bool run_nccl = false;
  NcclUniqueId id{};
  std::vector<uint64_t> sizes;
};

/// The unique id from the table's hex text; false unless it is exactly one id.
bool ReadUniqueId(const std::string& text, NcclUniqueId& id) {
  const auto bytes = HexDecode(text);
  if (!bytes || bytes->size() != sizeof id.internal) return false;
  std::copy(bytes->begin(), bytes->end(), id.internal);
  return true;
}

/// Sizes from 8 B up by x8, each at most a quarter of the least free GPU memory (two buffers
/// and room for NCCL's own), and at most 1 GiB.
std::vector<uint64_t> AllReduceSizes(const std::vector<RankInfo>& ranks) {
  uint64_t least_free = kMaxAllReduceBytes * 4;
  for (const RankInfo& info : ranks) least_free = std::min(least_free, info.free_memory);
  const uint64_t limit = std::min(kMaxAllReduceBytes, least_free / 4);
  std::vector<uint64_t> sizes;
  for (uint64_t bytes = 8; bytes <= limit; bytes *= 8) sizes.push_back(bytes);
  return sizes;
}

// ---- rank 0's exchange server ----

class Server {
 public:
  Server(Fd listener, const Env& env, const WorkerOptions& options)
      : listener_(std::move(listener)), env_(env), options_(options) {}

  Findings Run() {
    Findings findings;
    const auto join_deadline = Clock::now() + options_.join_timeout;
    Pump(join_deadline, [&] { return static_cast<int>(infos_.size()) == env_.world; });
    for (const auto& [rank, info] : infos_) findings.ranks.push_back(info);
    if (static_cast<int>(infos_.size()) < env_.world) {
      std::vector<int> missing;
      for (int rank = 0; rank < env_.world; ++rank) {
        if (!infos_.count(rank)) missing.push_back(rank);
      }
      findings.exchange_error = fmt::format(
          "rank{} {} never joined the preflight exchange within {} s (see their logs)",
          missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), options_.join_timeout.count());
      Broadcast(kDone, json{{"abort", findings.exchange_error}}.dump());
      return findings;
    }

    Plan plan = MakePlan(findings.ranks);
    findings.nccl_ran = plan.run_nccl;
    json table{{"ranks", json::array()},
               {"nccl", plan.run_nccl},
               {"id", HexEncode(std::string_view(plan.id.internal, sizeof plan.id.internal))},
               {"sizes", plan.sizes}};
    for (const RankInfo& info : findings.ranks) table["ranks"].push_back(ToJson(info));
    Broadcast(kTable, table.dump());

    const auto run_deadline = Clock::now() + options_.run_timeout;
    Pump(run_deadline, [&] { return static_cast<int>(reports_.size()) == env_.world; });
    for (const auto& [rank, report] : reports_) findings.reports.push_back(report);
    if (!plan_error_.empty()) {
      RankReport& own = findings.reports.emplace_back();
      own.rank = 0;
      own.error = plan_error_;
    }
    Broadcast(kDone, "{}");
    return findings;
  }

 private:
  struct Peer {
    Fd fd;
    RecordDecoder decoder;
    int rank = -1;
  };

  Plan MakePlan(const std::vector<RankInfo>& ranks) {
    Plan plan;
    for (const RankInfo& info : ranks) {
      if (info.local_rank >= info.gpu_count || info.nccl_version == 0 ||
          info.nccl_version != ranks.front().nccl_version) {
        return plan;  // the verdict says why from the table
      }
    }
    plan.sizes = AllReduceSizes(ranks);
    if (plan.sizes.empty()) {
      plan_error_ = "too little free GPU memory for the all-reduce test";
      return plan;
    }
    const Nccl& nccl = LoadNccl();
    if (!nccl.Loaded()) {
      plan_error_ = nccl.error;
      return plan;
    }
    if (const int rc = nccl.get_unique_id(&plan.id); rc != kNcclSuccess) {
      plan_error_ = "ncclGetUniqueId failed: " + nccl.Describe(rc);
      return plan;
    }
    plan.run_nccl = true;
    return plan;
  }

  void Broadcast(char type, const std::string& payload) {
    const std::string bytes = EncodeRecord(type, payload);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (auto& peer : peers_) {
      if (peer->rank < 0) continue;
      if (auto sent = SendAll(peer->fd.get(), bytes, deadline); !sent) {
        std::fprintf(stderr, "preflight: cannot send to rank %d: %s\n", peer->rank, sent.error().c_str());
      }
    }
  }

  /// Accepts and reads until `done()` or `deadline`.
  template <typename Done>
  void Pump(Clock::time_point deadline, Done done) {
    const size_t max_peers = static_cast<size_t>(env_.world) * 2 + 16;
    while (!done() && Clock::now() < deadline) {
      std::vector<pollfd> fds;
      fds.push_back({listener_.get(), POLLIN, 0});
      for (auto& peer : peers_) fds.push_back({peer->fd.get(), POLLIN, 0});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const int ready =
          ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000)));
      if (ready <= 0) continue;
      if (fds[0].revents & POLLIN) {
        Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (fd.valid() && peers_.size() < max_peers) {
          auto peer = std::make_unique<Peer>();
          peer->fd = std::move(fd);
          peers_.push_back(std::move(peer));
        }
      }
      std::vector<size_t> drop;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!ReadFrom(*peers_[i - 1])) drop.push_back(i - 1);
      }
      for (auto it = drop.rbegin(); it != drop.rend(); ++it) {
        Peer& peer = *peers_[*it];
        if (peer.rank >= 0 && !reports_.count(peer.rank)) {
          RankReport lost;
          lost.rank = peer.rank;
          lost.error = "left the preflight exchange before reporting (see its log)";
          reports_[peer.rank] = lost;
        }
        peers_.erase(peers_.begin() + static_cast<std::ptrdiff_t>(*it));
      }
    }
  }

  /// Reads what is there; false when the peer is gone or broke the protocol.
  bool ReadFrom(Peer& peer) {
    char buffer[64 * 1024];
    const ssize_t n = ::recv(peer.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK;
    peer.decoder.Feed(buffer, static_cast<size_t>(n));
    for (;;) {
      auto next = peer.decoder.Next();
      if (!next) {
        std::fprintf(stderr, "preflight: dropped a connection: %s\n", next.error().c_str());
        return false;
      }
      if (!*next) return true;
      const Record& record = **next;
      const json body = json::parse(record.payload, nullptr, /*allow_exceptions=*/false);
      if (record.type == kHello && peer.rank < 0) {
        auto info = RankInfoFromJson(body);
        if (!info || info->rank >= env_.world || infos_.count(info->rank)) {
          std::fprintf(stderr, "preflight: dropped a malformed or duplicate hello\n");
          return false;
        }
        peer.rank = info->rank;
        infos_[info->rank] = *info;
      } else if (record.type == kReport && peer.rank >= 0) {
        auto report = RankReportFromJson(body);
        if (!report || report->rank != peer.rank) return false;
        reports_[peer.rank] = *report;
      } else {
        return false;
      }
    }
  }

  Fd listener_;
  Env env_;
  const WorkerOptions& options_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<int, RankInfo> infos_;
  std::map<int, RankReport> reports_;
  std::string plan_error_;
};

// ---- every rank's client ----

Reach ReachOf(ConnectOutcome outcome) {
  switch (outcome) {
    case ConnectOutcome::kConnected:
      return Reach::kReachable;
    case ConnectOutcome::kRefused:
      return Reach::kRefused;
    case ConnectOutcome::kTimedOut:
      return Reach::kTimedOut;
    case ConnectOutcome::kUnreachable:
      return Reach::kUnreachable;
    case ConnectOutcome::kResolveFailed:
    case ConnectOutcome::kError:
      return Reach::kError;
  }
  return Reach::kError;
}

/// Local rank 0: one TCP connect to every other node's test port, up to kParallelProbes at once.
std::vector<ReachResult> ProbeOtherNodes(const Env& env, const WorkerOptions& options,
                                         const std::vector<RankInfo>& ranks) {
  std::vector<ReachResult> results;
  std::vector<ConnectTarget> targets;
  std::vector<size_t> probed;  // index in `results` of each target
  for (const RankInfo& info : ranks) {
    if (info.local_rank != 0 || info.node_rank == env.node_rank) continue;
    const auto listed = static_cast<size_t>(info.node_rank);
    const std::string address =
        listed < options.expect.nodes.size() ? options.expect.nodes[listed] : info.address;
    ReachResult& result = results.emplace_back();
    result.from = env.node_rank;
    result.to = info.node_rank;
    if (info.test_port == 0) {
      result.reach = Reach::kError;
      result.detail = fmt::format("node {} advertised no test port (see its log)", info.node_rank);
      continue;
    }
    targets.push_back({address, info.test_port});
    probed.push_back(results.size() - 1);
  }
  std::vector<ConnectResult> connects = ConnectAll(targets, options.connect_timeout, kParallelProbes);
  for (size_t i = 0; i < connects.size(); ++i) {
    ReachResult& result = results[probed[i]];
    result.reach = ReachOf(connects[i].outcome);
    result.detail =
        connects[i].fd ? fmt::format("{}:{}", targets[i].host, targets[i].port) : connects[i].fd.error();
  }
  return results;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// Every rank with a GPU: NCCL all-reduce (float, sum, out of place) at each size; fills
/// `rows` with the timings. Only rank 0's rows are reported (the collective is the same everywhere).
Status RunAllReduce(const Env& env, const NcclUniqueId& id, const std::vector<uint64_t>& sizes,
                    std::vector<BandwidthRow>& rows) {
  const CudaRuntime& cuda = LoadCudaRuntime();
  const Nccl& nccl = LoadNccl();
  if (!cuda.Loaded()) return Fail(cuda.error);
  if (!nccl.Loaded()) return Fail(nccl.error);
  if (sizes.empty()) return Fail("no sizes to test");
  if (int rc = cuda.set_device(env.local_rank); rc != kCudaSuccess) {
    return Fail(fmt::format("cudaSetDevice({}): {}", env.local_rank, cuda.Describe(rc)));
  }
  const uint64_t max_bytes = sizes.back();
  void* send = nullptr;
  void* recv = nullptr;
  void* stream = nullptr;
  void* comm = nullptr;
  std::string error;
  auto cleanup = [&] {
    if (comm) nccl.comm_destroy(comm);
    if (stream) cuda.stream_destroy(stream);
    if (send) cuda.cuda_free(send);
    if (recv) cuda.cuda_free(recv);
  };
  if (int rc = cuda.cuda_malloc(&send, max_bytes); rc != kCudaSuccess) {
    error = fmt::format("cudaMalloc({} bytes): {}", max_bytes, cuda.Describe(rc));
  } else if (rc = cuda.cuda_malloc(&recv, max_bytes); rc != kCudaSuccess) {
    error = fmt::format("cudaMalloc({} bytes): {}", max_bytes, cuda.Describe(rc));
  } else if (rc = cuda.stream_create(&stream); rc != kCudaSuccess) {
    error = "cudaStreamCreate: " + cuda.Describe(rc);
  }
  if (error.empty()) {
    // Every element 1.0f, so the sum over the world is exactly WORLD_SIZE.
    const std::vector<float> ones(1u << 20, 1.0f);
    const uint64_t chunk = ones.size() * sizeof(float);
    for (uint64_t offset = 0; offset < max_bytes && error.empty(); offset += chunk) {
      const uint64_t n = std::min(chunk, max_bytes - offset);
      if (int rc =
              cuda.cuda_memcpy(static_cast<char*>(send) + offset, ones.data(), n, kCudaMemcpyHostToDevice);
          rc != kCudaSuccess) {
        error = "cudaMemcpy: " + cuda.Describe(rc);
      }
    }
  }
  if (error.empty()) {
    if (int rc = nccl.comm_init_rank(&comm, env.world, id, env.rank); rc != kNcclSuccess) {
      comm = nullptr;
      error =
          "ncclCommInitRank: " + nccl.Describe(rc) + " (rerun with NCCL_DEBUG=INFO in job.env to see why)";
    }
  }
  for (const uint64_t bytes : sizes) {
    if (!error.empty()) break;
    const uint64_t count = bytes / sizeof(float);
    const int warmup = 5;
    const int iterations = bytes >= (uint64_t{64} << 20) ? 5 : 20;
    auto all_reduce = [&]() -> bool {
      const int rc = nccl.all_reduce(send, recv, count, kNcclFloat32, kNcclSum, comm, stream);
      if (rc != kNcclSuccess) {
        error = fmt::format("ncclAllReduce({} bytes): {}", bytes, nccl.Describe(rc));
        return false;
      }
      return true;
    };
    for (int i = 0; i < warmup && error.empty(); ++i) all_reduce();
    if (error.empty()) {
      if (int rc = cuda.stream_synchronize(stream); rc != kCudaSuccess) {
        error = "cudaStreamSynchronize: " + cuda.Describe(rc);
      }
    }
    if (!error.empty()) break;
    float check[2] = {0, 0};
    cuda.cuda_memcpy(check, recv, std::min<uint64_t>(sizeof check, bytes), kCudaMemcpyDeviceToHost);
    if (check[0] != static_cast<float>(env.world)) {
      error = fmt::format("all-reduce of {} bytes gave {} instead of {}", bytes, check[0], env.world);
      break;
    }
    const auto start = Clock::now();
    for (int i = 0; i < iterations && error.empty(); ++i) all_reduce();
    if (error.empty()) {
      if (int rc = cuda.stream_synchronize(stream); rc != kCudaSuccess) {
        error = "cudaStreamSynchronize: " + cuda.Describe(rc);
      }
    }
    if (!error.empty()) break;
    const double seconds = Seconds(Clock::now() - start) / iterations;
    BandwidthRow row;
    row.bytes = bytes;
    row.count = count;
    row.time_us = seconds * 1e6;
    row.algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
    row.busbw = AllReduceBusBandwidth(row.algbw, env.world);
    rows.push_back(row);
  }
  cleanup();
  if (!error.empty()) return Fail(error);
  return {};
}

/// This rank's part: hello, table, checks, report, done. Returns the exit code.
int RunClient(const Env& env, const WorkerOptions& options, RankInfo info) {
  const auto join_deadline = Clock::now() + options.join_timeout;
  auto connected = ConnectWithRetries(env.master_addr, env.master_port, join_deadline);
  if (!connected) {
    std::fprintf(stderr, "preflight: rank %d cannot reach worker rank 0 at %s:%u: %s\n", env.rank,
                 env.master_addr.c_str(), env.master_port, connected.error().c_str());
    return 1;
  }
  const Fd fd = std::move(*connected);
  // The address this node uses towards the master is the one other nodes will try.
  info.address = LocalAddressOf(fd.get());
  RecordDecoder decoder;
  if (auto sent = SendAll(fd.get(), EncodeRecord(kHello, ToJson(info).dump()), join_deadline); !sent) {
    std::fprintf(stderr, "preflight: rank %d: sending to rank 0: %s\n", env.rank, sent.error().c_str());
    return 1;
  }
  auto table_record = ReadRecord(fd.get(), decoder, join_deadline + std::chrono::seconds(15));
  if (!table_record) {
    std::fprintf(stderr, "preflight: rank %d: waiting for the table: %s\n", env.rank,
                 table_record.error().c_str());
    return 1;
  }
  const json table = json::parse(table_record->payload, nullptr, false);
  if (table_record->type == kDone) {
    const std::string why = table.is_object() && table.contains("abort") && table["abort"].is_string()
                                ? table["abort"].get<std::string>()
                                : "no reason given";
    std::fprintf(stderr, "preflight: rank 0 stopped the exchange: %s\n", why.c_str());
    return 1;
  }
  std::vector<RankInfo> ranks;
  Plan plan;
  bool table_ok = table_record->type == kTable && table.is_object() && table.contains("ranks") &&
                  table["ranks"].is_array() && table.contains("nccl") && table["nccl"].is_boolean() &&
                  table.contains("id") && table["id"].is_string() && table.contains("sizes") &&
                  table["sizes"].is_array();
  if (table_ok) {
    for (const json& item : table["ranks"]) {
      auto rank_info = RankInfoFromJson(item);
      if (!rank_info) table_ok = false;
      if (rank_info) ranks.push_back(*rank_info);
    }
    plan.run_nccl = table["nccl"].get<bool>();
    table_ok = table_ok && ReadUniqueId(table["id"].get<std::string>(), plan.id);
    for (const json& size : table["sizes"]) {
      if (!size.is_number_unsigned() || size.get<uint64_t>() > kMaxAllReduceBytes) table_ok = false;
      if (table_ok) plan.sizes.push_back(size.get<uint64_t>());
    }
  }
  if (!table_ok) {
    std::fprintf(stderr, "preflight: rank %d: malformed table from rank 0\n", env.rank);
    return 1;
  }

  RankReport report;
  report.rank = env.rank;
  if (env.local_rank == 0) report.reach = ProbeOtherNodes(env, options, ranks);
  if (plan.run_nccl) {
    std::vector<BandwidthRow> rows;
    if (auto ran = RunAllReduce(env, plan.id, plan.sizes, rows); !ran) report.error = ran.error();
    if (env.rank == 0) report.bandwidth = std::move(rows);
  }
  const auto run_deadline = Clock::now() + options.run_timeout;
  if (auto sent = SendAll(fd.get(), EncodeRecord(kReport, ToJson(report).dump()), run_deadline); !sent) {
    std::fprintf(stderr, "preflight: rank %d: sending the report: %s\n", env.rank, sent.error().c_str());
    return 1;
  }
  if (!report.error.empty()) std::fprintf(stderr, "preflight: rank %d: %s\n", env.rank, report.error.c_str());
  // Stay (and keep the test port open) until rank 0 has every report.
  auto done = ReadRecord(fd.get(), decoder, run_deadline + std::chrono::seconds(15));
  if (!done) {
    std::fprintf(stderr, "preflight: rank %d: waiting for rank 0 to finish: %s\n", env.rank,
                 done.error().c_str());
    return 1;
  }
  return report.error.empty() ? 0 : 1;
}

}  // namespace

int RunPreflightWorker(const WorkerOptions& options) {
  const auto env = ReadEnv();
  if (!env) {
    std::fprintf(stderr, "preflight: %s\n", env.error().c_str());
    return 2;
  }
  RankInfo info = ProbeLocal(*env);
  if (env->local_rank == 0) ProbePython(options.expect.python, info);

  // Local rank 0 holds this node's test port open until the end.
  Fd test_listener;
  if (env->local_rank == 0) {
    if (auto listening = ListenWildcard(0); listening) {
      test_listener = std::move(listening->fd);
      info.test_port = listening->port;
    } else {
      std::fprintf(stderr, "preflight: cannot open a test port: %s\n", listening.error().c_str());
    }
  }

  if (env->rank != 0) return RunClient(*env, options, info);

  // Rank 0: the exchange server on MASTER_PORT, and this rank's own client beside it.
  auto listener = ListenWildcard(env->master_port);
  if (!listener) {
    std::fprintf(stderr, "preflight: rank 0 cannot listen on MASTER_PORT: %s\n", listener.error().c_str());
    return 1;
  }
  // The port users know: under the store relay this rank's MASTER_PORT is a private one that
  // node 0's agent picked for the round, and the others reach it through master_port.
  const unsigned shown_port =
      options.expect.master_port > 0 ? static_cast<unsigned>(options.expect.master_port) : env->master_port;
  std::fprintf(stdout, "preflight: %d rank%s joining on %s:%u...\n", env->world, env->world == 1 ? "" : "s",
               env->master_addr.c_str(), shown_port);
  std::fflush(stdout);
  // The client blocks in its own reads and in NCCL, so it gets a thread; the server runs here.
  std::packaged_task<int()> client([&] { return RunClient(*env, options, info); });
  auto client_future = client.get_future();
  std::thread client_thread(std::move(client));
  Server server(std::move(listener->fd), *env, options);
  const Findings findings = server.Run();
  const Verdict verdict = BuildVerdict(options.expect, findings);
  // The report goes to stdout; its closing list of problems goes to stderr instead, once: the
  // agents quote a failed rank's stderr in the summary on every node, so that is how the other
  // nodes learn the problems, and printing the list on both streams showed it twice more here.
  const size_t problems_at =
      verdict.problems.empty() ? std::string::npos : verdict.text.rfind("\npreflight: ");
  const std::string report =
      verdict.text.substr(0, problems_at == std::string::npos ? std::string::npos : problems_at + 1);
  std::fputs("\n", stdout);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  if (problems_at != std::string::npos) {
    const std::string problems = verdict.text.substr(problems_at + 1);
    std::fwrite(problems.data(), 1, problems.size(), stderr);
  }
  std::fflush(stderr);
  const int code = verdict.problems.empty() ? 0 : 1;
  if (client_future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // This rank's own client is stuck (in ncclCommInitRank or a collective whose peers are
    // gone, say), and NCCL offers no way to interrupt a blocked call: joining would hang and
    // returning would run destructors under a thread still inside NCCL. The verdict is out;
    // _Exit ends the process with it, without joining that thread or unwinding.
    std::_Exit(code);
  }
  client_thread.join();
  return code;
}

}  // namespace ddprun::preflight
