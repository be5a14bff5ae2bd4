// ExecContext: where and how an operation touches data.
//
// Every interface that reads or writes tensor data takes one. On the host the
// stream is null and host kernels may use the thread pool. On the device path
// the stream is the cudaStream_t that kernels and NCCL calls are ordered on,
// so adding devices changes no signature.
#pragma once

#include <cstdint>

#include "relaxcc/dtype.h"

namespace relaxcc {

class ThreadPool;

// Counter-based random numbers: (seed, offset) picks a stream position so
// that every rank and every device reproduces the same values.
struct RngCounter {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

struct ExecContext {
  Device device = Device::host();
  void* stream = nullptr;        // cudaStream_t on cuda devices; null on the host
  ThreadPool* pool = nullptr;    // optional; null runs host kernels on the caller's thread
  RngCounter rng;

  static ExecContext host(ThreadPool* pool = nullptr) noexcept {
    ExecContext ctx;
    ctx.pool = pool;
    return ctx;
  }
};

}  // namespace relaxcc
