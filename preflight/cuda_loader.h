#pragma once
// The CUDA runtime and NCCL, loaded with dlopen so ddprun runs (and builds) without them
// (deps.md section 3). Only the few entry points preflight calls are declared here, with the
// types of their C ABI; tests/gpu/abi_check.cc compares them with the real headers when the
// toolkit is installed.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::preflight {

// ncclUniqueId is a 128-byte struct passed by value (nccl.h, NCCL_UNIQUE_ID_BYTES).
struct NcclUniqueId {
  char internal[128];
};
inline constexpr int kNcclSuccess = 0;
inline constexpr int kNcclFloat32 = 7;  // ncclFloat32
inline constexpr int kNcclSum = 0;      // ncclSum
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr int kCudaMemcpyDeviceToHost = 2;

/// libcudart, or why it is missing. Load() tries DDPRUN_CUDART_PATH, then libcudart.so.13,
/// .12, .11, then libcudart.so.
struct CudaRuntime {
  using GetInt = int (*)(int*);
  GetInt get_device_count = nullptr;
  GetInt driver_get_version = nullptr;
  GetInt runtime_get_version = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  int (*get_device_properties)(void*, int) = nullptr;  // fills cudaDeviceProp; name is first
  int (*set_device)(int) = nullptr;
  int (*mem_get_info)(size_t*, size_t*) = nullptr;
  int (*cuda_malloc)(void**, size_t) = nullptr;
  int (*cuda_free)(void*) = nullptr;
  int (*cuda_memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*stream_create)(void**) = nullptr;
  int (*stream_synchronize)(void*) = nullptr;
  int (*stream_destroy)(void*) = nullptr;
  std::string error;  // why it could not be loaded ("" when loaded)

  bool Loaded() const { return error.empty(); }
  /// "CUDA driver version is insufficient for CUDA runtime version, error 35".
  std::string Describe(int code) const;
};

/// libnccl.so.2 (or DDPRUN_NCCL_PATH), or why it is missing.
struct Nccl {
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  int (*comm_init_rank)(void** comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, void*, void*) = nullptr;
  int (*comm_destroy)(void*) = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  std::string error;

  bool Loaded() const { return error.empty(); }
  std::string Describe(int code) const;
};

/// Loads the CUDA runtime once per process (the handle is never closed).
const CudaRuntime& LoadCudaRuntime();
/// Loads NCCL once per process (the handle is never closed).
const Nccl& LoadNccl();

/// The kernel driver's version from /proc/driver/nvidia/version ("" without the driver).
std::string KernelDriverVersion();

}  // namespace ddprun::preflight
