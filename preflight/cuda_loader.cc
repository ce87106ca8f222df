#include "preflight/cuda_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace ddprun::preflight {

namespace {

/// dlopen the first library that loads; on failure returns nullptr and the last dlerror().
void* OpenFirst(const char* override_env, const std::vector<std::string>& names, std::string& error) {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv(override_env); path && *path) {
    candidates.emplace_back(path);  // an explicit choice: no fallback to the usual names
  } else {
    candidates = names;
  }
  for (const std::string& name : candidates) {
    if (void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = ::dlerror();
    error = why ? why : ("cannot load " + name);
  }
  return nullptr;
}

/// Looks up `name` into the function pointer `out`; records the first missing symbol.
template <typename Function>
void Bind(void* handle, const char* name, Function& out, std::string& missing) {
  void* symbol = ::dlsym(handle, name);
  if (!symbol) {
    if (missing.empty()) missing = name;
    return;
  }
  // POSIX guarantees that a dlsym result converts to a function pointer.
  out = reinterpret_cast<Function>(symbol);
}

CudaRuntime LoadCudaRuntimeOnce() {
  CudaRuntime cuda;
  std::string error;
  void* handle =
      OpenFirst("DDPRUN_CUDART_PATH",
                {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}, error);
  if (!handle) {
    cuda.error = "CUDA runtime not found: " + error;
    return cuda;
  }
  std::string missing;
  Bind(handle, "cudaGetDeviceCount", cuda.get_device_count, missing);
  Bind(handle, "cudaDriverGetVersion", cuda.driver_get_version, missing);
  Bind(handle, "cudaRuntimeGetVersion", cuda.runtime_get_version, missing);
  Bind(handle, "cudaGetErrorString", cuda.get_error_string, missing);
  Bind(handle, "cudaSetDevice", cuda.set_device, missing);
  Bind(handle, "cudaMemGetInfo", cuda.mem_get_info, missing);
  Bind(handle, "cudaMalloc", cuda.cuda_malloc, missing);
  Bind(handle, "cudaFree", cuda.cuda_free, missing);
  Bind(handle, "cudaMemcpy", cuda.cuda_memcpy, missing);
  Bind(handle, "cudaStreamCreate", cuda.stream_create, missing);
  Bind(handle, "cudaStreamSynchronize", cuda.stream_synchronize, missing);
  Bind(handle, "cudaStreamDestroy", cuda.stream_destroy, missing);
  // CUDA 12 renamed the struct-filling call (cudaGetDeviceProperties_v2); 13 has the plain name.
  std::string optional_missing;
  Bind(handle, "cudaGetDeviceProperties_v2", cuda.get_device_properties, optional_missing);
  if (!cuda.get_device_properties) {
    Bind(handle, "cudaGetDeviceProperties", cuda.get_device_properties, optional_missing);
  }
  if (!missing.empty()) cuda.error = "the CUDA runtime lacks " + missing;
  return cuda;
}

Nccl LoadNcclOnce() {
  Nccl nccl;
  std::string error;
  void* handle = OpenFirst("DDPRUN_NCCL_PATH", {"libnccl.so.2", "libnccl.so"}, error);
  if (!handle) {
    nccl.error = "NCCL not found: " + error;
    return nccl;
  }
  std::string missing;
  Bind(handle, "ncclGetVersion", nccl.get_version, missing);
  Bind(handle, "ncclGetUniqueId", nccl.get_unique_id, missing);
  Bind(handle, "ncclCommInitRank", nccl.comm_init_rank, missing);
  Bind(handle, "ncclAllReduce", nccl.all_reduce, missing);
  Bind(handle, "ncclCommDestroy", nccl.comm_destroy, missing);
  Bind(handle, "ncclGetErrorString", nccl.get_error_string, missing);
  if (!missing.empty()) nccl.error = "NCCL lacks " + missing;
  return nccl;
}

}  // namespace

std::string CudaRuntime::Describe(int code) const {
  const char* text = get_error_string ? get_error_string(code) : nullptr;
  return fmt::format("{}, error {}", text ? text : "CUDA error", code);
}

std::string Nccl::Describe(int code) const {
  const char* text = get_error_string ? get_error_string(code) : nullptr;
  return fmt::format("{}, NCCL error {}", text ? text : "NCCL error", code);
}

const CudaRuntime& LoadCudaRuntime() {
  static const CudaRuntime cuda = LoadCudaRuntimeOnce();
  return cuda;
}

const Nccl& LoadNccl() {
  static const Nccl nccl = LoadNcclOnce();
  return nccl;
}

std::string KernelDriverVersion() {
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  const std::string_view marker = "Kernel Module";
  auto at = line.find(marker);
  if (at == std::string::npos) return "";
  at = line.find_first_not_of(' ', at + marker.size());
  if (at == std::string::npos) return "";
  const auto end = line.find(' ', at);
  return line.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

}  // namespace ddprun::preflight
