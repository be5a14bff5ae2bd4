// Helpers shared by relaxcc's MPI tests: world rank/size, a communicator
// over MPI_COMM_WORLD, and test data that encodes the rank and the index of
// every element (as Gloo's assignValues), with the exact expected results.
//
// The wing. RELAXCC_TEST_TRANSPORT=ucx runs a program's communicators on the
// UCX wing: mpirun only launches the processes (and MPI_COMM_WORLD still
// serves the tests' own checks); each communicator comes from
// create_ucx_communicator, which rendezvouses over a store served by rank 0
// on 127.0.0.1 at a port picked per run (rank 0 broadcasts it), one
// generation per creation. Unset or "mpi": create_mpi_communicator. Tests
// that need the MPI wing itself (an MPI_Comm of their own, share_engine_with,
// MPI's parked creation) skip on UCX with the reason (RELAXCC_SKIP_ON_UCX).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "relaxcc/dtype.h"
#include "relaxcc/element_cast.h"
#include "relaxcc/exec_context.h"
#include "relaxcc/kernels/reduce.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/reduce_op.h"
#include "relaxcc/store.h"
#include "relaxcc/tensor.h"
#include "relaxcc/tunables.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// RELAXCC_TEST_TRANSPORT=ucx (see the top of this file).
inline bool on_ucx() {
  static const bool ucx = Tunables::from_env().test_transport == "ucx";
  return ucx;
}

// The program's rendezvous store on the UCX wing (served by rank 0); the
// test main releases it after the communicators.
inline std::shared_ptr<Store>& store_slot() {
  static std::shared_ptr<Store> store;
  return store;
}

// A new communicator over every process of the job on the program's wing
// (collective): on MPI over `comm`, on UCX over the program's store.
inline CommunicatorPtr create_communicator(
    const Tunables& tunables = Tunables::from_env(),
    std::chrono::milliseconds timeout = std::chrono::milliseconds(-1),
    MPI_Comm comm = MPI_COMM_WORLD) {
  if (!on_ucx()) {
    MpiCommunicatorOptions o;
    o.comm = comm;
    o.tunables = tunables;
    o.timeout = timeout;
    return create_mpi_communicator(o);
  }
  static uint64_t generation = 0;
  if (!store_slot()) {
    TcpStoreOptions t;
    t.is_server = world_rank() == 0;
    t.timeout = std::chrono::milliseconds(60000);
    int port = 0;
    std::unique_ptr<TcpStore> served;
    if (t.is_server) {
      served = std::make_unique<TcpStore>(t);
      port = served->port();
    }
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    t.port = static_cast<uint16_t>(port);
    store_slot() = served ? std::move(served) : std::make_unique<TcpStore>(t);
  }
  UcxCommunicatorOptions o;
  o.store = store_slot();
  o.rendezvous.rank = world_rank();
  o.rendezvous.size = world_size();
  o.rendezvous.job = "relaxcc-test";
  o.rendezvous.generation = generation++;
  o.tunables = tunables;
  o.timeout = timeout;
  o.net_devices = "lo";
  return create_ucx_communicator(o);
}

// Skips the test on the UCX wing, saying why.
#define RELAXCC_SKIP_ON_UCX(reason) \
  if (::relaxcc::test::on_ucx()) GTEST_SKIP() << "not on the UCX wing: " << reason

// One communicator over MPI_COMM_WORLD shared by the tests of a program;
// the test main releases it before MPI_Finalize.
inline CommunicatorPtr& world_slot() {
  static CommunicatorPtr comm;
  return comm;
}
inline CommunicatorPtr world() {
  if (!world_slot()) world_slot() = create_communicator();
  return world_slot();
}

// A small integer that encodes (rank, index): exact in every dtype, sums
// over 4 ranks included (at most 4 * 17 = 68 < 256, exact in bf16 and u8).
inline int64_t encode(int rank, int64_t index) {
  return (rank + 1) + (index % 7) * 2;
}

// A typed host buffer viewed as a TensorView.
// Test data whose views carry it as their owner, as the library's contract
// asks: a Work (and a request parked after a timeout) keeps it alive.
struct Buffer {
  std::shared_ptr<std::vector<unsigned char>> storage;
  DType dtype = DType::f32;
  int64_t numel = 0;
  Buffer(DType t, int64_t n)
      : storage(
            std::make_shared<std::vector<unsigned char>>(std::max<size_t>(1, n * dtype_size(t)))),
        dtype(t),
        numel(n) {}
  std::vector<unsigned char>& bytes() { return *storage; }
  TensorView view() { return TensorView(storage->data(), numel, dtype, Device::host(), storage); }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(storage->data());
  }
};

// element i = encode(rank, i + index_offset)
inline void fill(Buffer& b, int rank, int64_t index_offset = 0) {
  visit_dtype(b.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < b.numel; ++i)
      b.as<T>()[i] = from_double<T>(encode(rank, i + index_offset));
  });
}

// The exact reduction over `ranks` of encode(r, index), with avg divided the
// way the kernels do it.
template <typename T>
T expected_reduction(int64_t index, ReduceOp op, int ranks) {
  int64_t sum = 0, lo = INT64_MAX, hi = INT64_MIN;
  for (int r = 0; r < ranks; ++r) {
    const int64_t v = encode(r, index);
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (op == ReduceOp::min) return from_double<T>(lo);
  if (op == ReduceOp::max) return from_double<T>(hi);
  T out = from_double<T>(sum);
  if (op == ReduceOp::avg)
    kernels::finish_average(TensorView(&out, 1, dtype_of<T>()), ranks, ExecContext::host());
  return out;
}

// Unequal shares (relaxcc/collectives/shares.h) for `n` ranks, empty shards
// included: the weights {5,5,1,1}, {0,3,1,2}, {0,0,0,1} and {1,0,0,0}, cut to
// n ranks or padded with 1, those whose weights are all zero left out.
inline std::vector<std::vector<double>> unequal_shares(int n) {
  std::vector<std::vector<double>> out;
  for (std::vector<double> shares :
       {std::vector<double>{5, 5, 1, 1}, std::vector<double>{0, 3, 1, 2},
        std::vector<double>{0, 0, 0, 1}, std::vector<double>{1, 0, 0, 0}}) {
    shares.resize(static_cast<size_t>(n), 1.0);
    if (std::any_of(shares.begin(), shares.end(), [](double w) { return w != 0; }))
      out.push_back(std::move(shares));
  }
  return out;
}

}  // namespace relaxcc::test
