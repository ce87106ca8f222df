// GPU checks: preflight's hand-declared CUDA/NCCL ABI against the real headers (at compile
// time), and `ddprun preflight` with its NCCL all-reduce on this machine's GPUs (skips without,
// unless DDPRUN_REQUIRE names gpu, as tests/gpu/run.sh sets it).

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "preflight/cuda_loader.h"
#include "tests/support/require.h"

namespace ddprun::preflight {
namespace {

// preflight declares these itself so ddprun builds without CUDA; they must match the headers.
static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId));
static_assert(kNcclSuccess == ncclSuccess);
static_assert(kNcclFloat32 == ncclFloat32);
static_assert(kNcclSum == ncclSum);
static_assert(kCudaSuccess == cudaSuccess);
static_assert(kCudaMemcpyHostToDevice == cudaMemcpyHostToDevice);
static_assert(kCudaMemcpyDeviceToHost == cudaMemcpyDeviceToHost);
static_assert(sizeof(cudaError_t) == sizeof(int) && sizeof(ncclResult_t) == sizeof(int));

int GpuCount() {
  const CudaRuntime& cuda = LoadCudaRuntime();
  if (!cuda.Loaded()) return 0;
  int count = 0;
  if (cuda.get_device_count(&count) != kCudaSuccess) return 0;
  return count;
}

TEST(Gpu, RuntimeAndNcclLoadByDlopen) {
  DDPRUN_REQUIRE_OR_SKIP("gpu", GpuCount() > 0, "no GPU here (or no driver)");
  EXPECT_TRUE(LoadCudaRuntime().Loaded()) << LoadCudaRuntime().error;
  const Nccl& nccl = LoadNccl();
  ASSERT_TRUE(nccl.Loaded()) << nccl.error;
  int version = 0;
  EXPECT_EQ(nccl.get_version(&version), kNcclSuccess);
  EXPECT_GT(version, 0);
}

TEST(Gpu, PreflightAllReduceOnEveryGpu) {
  const int gpus = GpuCount();
  DDPRUN_REQUIRE_OR_SKIP("gpu", gpus > 0, "no GPU here (or no driver): nothing to all-reduce");
  char dir_template[] = "/tmp/ddprun-gpu-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::ofstream(dir + "/job.toml")
      << "version = 1\n[job]\nname = \"gpu\"\ncommand = [\"false\"]\n"
      << "[cluster]\nnnodes = 1\nmaster_addr = \"127.0.0.1\"\nmaster_port = 29571\n"
      << "[trainer]\naccelerator = \"gpu\"\ndevices = " << gpus << "\nnum_nodes = 1\n";
  const std::string command =
      std::string(DDPRUN_BINARY) + " preflight " + dir + "/job.toml --node-rank 0 > " + dir + "/out.txt 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(dir + "/out.txt");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fputs(out.c_str(), stdout);  // the bandwidth table, for the record
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("NCCL all-reduce (float, sum, "));
  EXPECT_THAT(out, ::testing::HasSubstr("preflight: OK"));
}

}  // namespace
}  // namespace ddprun::preflight
