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
  void* stream = nullptr;  // cudaStream_t on cuda devices; null on the host
  // Optional; null runs host kernels on the calling thread (for a
  // communicator's operations, the engine thread). Not owned: it must outlive
  // every operation given this context, until its Work completed. The engine
  // queues its reductions there behind whatever else runs on the pool, so a
  // pool shared with the application's own work can delay communication.
  ThreadPool* pool = nullptr;
  RngCounter rng;

  static ExecContext host(ThreadPool* pool = nullptr) noexcept {
    ExecContext ctx;
    ctx.pool = pool;
    return ctx;
  }
};

}  // namespace relaxcc
