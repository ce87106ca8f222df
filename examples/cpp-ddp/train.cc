// Data-parallel linear regression with an NCCL all-reduce of the gradients: the smallest C++
// program that trains the way DDP does, launched by ddprun with the same environment a PyTorch
// worker gets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
//
// Rank 0 creates the ncclUniqueId and hands it to the other ranks over MASTER_ADDR:MASTER_PORT
// (through ddprun's store relay from other nodes), with preflight's record exchange. Each rank
// computes the gradient of its own shard on the host, the gradients are summed on the GPUs with
// ncclAllReduce and divided by the world size, and every rank applies the same SGD step.

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "preflight/exchange.h"

namespace {

using ddprun::preflight::Clock;
namespace pf = ddprun::preflight;

constexpr int kFeatures = 4;
constexpr float kTrueWeights[kFeatures] = {2.0f, -3.0f, 0.5f, 1.0f};
constexpr float kTrueBias = 0.7f;
constexpr int kSamplesPerRank = 1024;
constexpr auto kExchangeTimeout = std::chrono::seconds(60);

int EnvInt(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  return std::atoi(text);
}

/// splitmix64: the same numbers on every platform, unlike std distributions.
struct Random {
  uint64_t state;
  double Uniform() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) / 9007199254740992.0;  // [0, 1)
  }
};

/// Rank 0: waits for every other rank's hello and sends it the id. Returns "" or the error.
std::string ServeUniqueId(pf::Fd listener, int world, const ncclUniqueId& id) {
  const auto deadline = Clock::now() + kExchangeTimeout;
  const std::string reply = pf::EncodeRecord('I', std::string_view(id.internal, sizeof id.internal));
  int served = 0;
  while (served < world - 1) {
    if (Clock::now() >= deadline) {
      return fmt::format("only {} of {} ranks fetched the NCCL id within {} s", served, world - 1,
                         kExchangeTimeout.count());
    }
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    pf::Fd peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer.valid()) continue;
    pf::RecordDecoder decoder;
    auto hello = pf::ReadRecord(peer.get(), decoder, Clock::now() + std::chrono::seconds(10));
    if (!hello || hello->type != 'H') continue;  // a stray connection: not a rank
    if (!pf::SendAll(peer.get(), reply, Clock::now() + std::chrono::seconds(10))) continue;
    ++served;
  }
  return "";
}

/// Other ranks: fetch the id from rank 0. Returns "" or the error.
std::string FetchUniqueId(const std::string& addr, uint16_t port, int rank, ncclUniqueId& id) {
  auto connected = pf::ConnectWithRetries(addr, port, Clock::now() + kExchangeTimeout);
  if (!connected) {
    return fmt::format("cannot reach rank 0 at {}:{}: {}", addr, port, connected.error());
  }
  const pf::Fd fd = std::move(*connected);
  pf::RecordDecoder decoder;
  if (auto sent = pf::SendAll(fd.get(), pf::EncodeRecord('H', std::to_string(rank)),
                              Clock::now() + std::chrono::seconds(10));
      !sent) {
    return sent.error();
  }
  auto record = pf::ReadRecord(fd.get(), decoder, Clock::now() + kExchangeTimeout);
  if (!record) return "waiting for the NCCL id: " + record.error();
  if (record->type != 'I' || record->payload.size() != sizeof id.internal) return "malformed NCCL id";
  std::memcpy(id.internal, record->payload.data(), sizeof id.internal);
  return "";
}

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    const cudaError_t rc_ = (call);                                                    \
    if (rc_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(rc_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)
#define CHECK_NCCL(call)                                                               \
  do {                                                                                 \
    const ncclResult_t rc_ = (call);                                                   \
    if (rc_ != ncclSuccess) {                                                          \
      std::fprintf(stderr, "rank %d: %s: %s\n", rank, #call, ncclGetErrorString(rc_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  int steps = 200;
  float learning_rate = 0.1f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    if (flag == "--lr") learning_rate = std::strtof(argv[i + 1], nullptr);
  }
  const int rank = EnvInt("RANK", -1);
  const int world = EnvInt("WORLD_SIZE", -1);
  const int local_rank = EnvInt("LOCAL_RANK", -1);
  const int master_port = EnvInt("MASTER_PORT", -1);
  const char* master_addr = std::getenv("MASTER_ADDR");
  if (rank < 0 || world < 1 || local_rank < 0 || master_port < 1 || master_port > 65535 || !master_addr ||
      steps < 1 || steps > 1'000'000) {
    std::fprintf(stderr,
                 "run me with ddprun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                 "MASTER_PORT must be set), e.g. ddprun examples/cpp-ddp/job.toml\n");
    return 2;
  }

  // Rank 0 listens before it does anything slow, so the others' connects find it soon.
  ncclUniqueId id{};
  std::string error;
  if (rank == 0) {
    auto listener = pf::ListenWildcard(static_cast<uint16_t>(master_port));
    if (!listener) {
      std::fprintf(stderr, "rank 0: %s\n", listener.error().c_str());
      return 1;
    }
    CHECK_NCCL(ncclGetUniqueId(&id));
    error = ServeUniqueId(std::move(listener->fd), world, id);
  } else {
    error = FetchUniqueId(master_addr, static_cast<uint16_t>(master_port), rank, id);
  }
  if (!error.empty()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.c_str());
    return 1;
  }

  CHECK_CUDA(cudaSetDevice(local_rank));
  ncclComm_t comm = nullptr;
  CHECK_NCCL(ncclCommInitRank(&comm, world, id, rank));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  // Gradient of the weights, of the bias, and the loss: one all-reduce per step.
  constexpr size_t kSlots = kFeatures + 2;
  float* device = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&device), kSlots * sizeof(float)));

  // This rank's shard: y = x . w + b + noise, different samples on every rank.
  Random random{uint64_t{0x5eed0000} + static_cast<uint64_t>(rank)};
  std::vector<float> x(kSamplesPerRank * kFeatures), y(kSamplesPerRank);
  for (int n = 0; n < kSamplesPerRank; ++n) {
    float target = kTrueBias;
    for (int f = 0; f < kFeatures; ++f) {
      const float value = static_cast<float>(random.Uniform() * 2.0 - 1.0);
      x[static_cast<size_t>(n * kFeatures + f)] = value;
      target += kTrueWeights[f] * value;
    }
    y[static_cast<size_t>(n)] = target + static_cast<float>((random.Uniform() - 0.5) * 0.01);
  }

  std::vector<float> weights(kFeatures, 0.0f);
  float bias = 0.0f;
  for (int step = 0; step < steps; ++step) {
    float host[kSlots] = {};
    for (int n = 0; n < kSamplesPerRank; ++n) {
      float prediction = bias;
      for (int f = 0; f < kFeatures; ++f)
        prediction += weights[static_cast<size_t>(f)] * x[static_cast<size_t>(n * kFeatures + f)];
      const float residual = prediction - y[static_cast<size_t>(n)];
      for (int f = 0; f < kFeatures; ++f)
        host[f] += 2.0f * residual * x[static_cast<size_t>(n * kFeatures + f)];
      host[kFeatures] += 2.0f * residual;
      host[kFeatures + 1] += residual * residual;
    }
    for (float& value : host) value /= static_cast<float>(kSamplesPerRank);
    CHECK_CUDA(cudaMemcpyAsync(device, host, sizeof host, cudaMemcpyHostToDevice, stream));
    CHECK_NCCL(ncclAllReduce(device, device, kSlots, ncclFloat32, ncclSum, comm, stream));
    CHECK_CUDA(cudaMemcpyAsync(host, device, sizeof host, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    // The mean over ranks, as DDP averages gradients; every rank takes the same step.
    for (float& value : host) value /= static_cast<float>(world);
    for (int f = 0; f < kFeatures; ++f) weights[static_cast<size_t>(f)] -= learning_rate * host[f];
    bias -= learning_rate * host[kFeatures];
    if (rank == 0 && (step % 20 == 0 || step == steps - 1)) {
      std::printf("step %4d  loss %.6f\n", step, static_cast<double>(host[kFeatures + 1]));
      std::fflush(stdout);
    }
  }

  CHECK_CUDA(cudaFree(device));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_NCCL(ncclCommDestroy(comm));

  float worst = std::fabs(bias - kTrueBias);
  for (int f = 0; f < kFeatures; ++f) {
    worst = std::fmax(worst, std::fabs(weights[static_cast<size_t>(f)] - kTrueWeights[f]));
  }
  if (rank == 0) {
    std::printf(
        "learned w = [%.3f, %.3f, %.3f, %.3f], b = %.3f (true [2, -3, 0.5, 1], 0.7); "
        "largest error %.4f over %d ranks\n",
        static_cast<double>(weights[0]), static_cast<double>(weights[1]), static_cast<double>(weights[2]),
        static_cast<double>(weights[3]), static_cast<double>(bias), static_cast<double>(worst), world);
  }
  if (worst > 0.05f) {
    std::fprintf(stderr, "rank %d: did not converge (largest error %.4f)\n", rank,
                 static_cast<double>(worst));
    return 1;
  }
  return 0;
}
